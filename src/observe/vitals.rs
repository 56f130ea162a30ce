//! The worker's vital signs over HTTP (`/metrics`, `/healthz`, `/readyz`) and the poll of the
//! management API that fills in queue depths and the oldest-ready estimate of idle lanes, and
//! tells the worker which queues exist (so it finds lanes of tenants no longer dedicated) and
//! how many workers share the endpoint limits ([`crate::delivery::fleet`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::management::Management;
use crate::contract::ladder::Ladder;
use crate::delivery::lane::Lanes;
use crate::observe::metrics::Metrics;

/// Binds the vitals address; done at start so a taken port fails the start, not later.
pub async fn bind(listen: Option<SocketAddr>) -> std::io::Result<Option<tokio::net::TcpListener>> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {listen} (metrics.listen): {e}"),
        )
    })?;
    Ok(Some(listener))
}

/// Serves until `stop`. `/readyz` answers 200 only while the worker consumes every lane of the
/// ladder (a lane of a tenant no longer dedicated may come and go).
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics, stop: CancellationToken) {
    let addr = listener.local_addr().ok();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Metrics>| async move {
                ([("content-type", "text/plain; version=0.0.4")], m.render())
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(m): State<Metrics>| async move { readiness(&m) }),
        )
        .with_state(metrics);
    if let Some(addr) = addr {
        info!(%addr, "Serving /metrics, /healthz, /readyz");
    }
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
}

/// `/readyz`: ready while consuming every lane. A subscription store that does not answer does
/// not make the worker unready (it delivers on its last snapshot), but the detail says so.
fn readiness(m: &Metrics) -> (StatusCode, String) {
    let (status, mut text) = if m.consuming.get() == 1 {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not consuming\n".to_owned(),
        )
    };
    if m.subscription_store_up.get() == 0 {
        let synced = m.subscription_store_synced.get();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        text.push_str(&format!(
            "subscription store unreachable: delivering on the snapshot taken {:.0} s ago\n",
            (now - synced).max(0.0)
        ));
    }
    (status, text)
}

/// Reads the ladder's queues every `interval` and sets the depth gauges, the oldest-ready
/// estimate of lanes that have gone quiet, and whether the publisher is blocked; and hands the
/// list of queues to `listed`, where the worker's session looks for lanes to consume. (The
/// fleet is counted from the broker's live answers, not from here: these counts lag.)
#[allow(clippy::too_many_arguments)]
pub async fn poll_queues(
    api: Management,
    ladder: Ladder,
    lanes: Lanes,
    listed: tokio::sync::watch::Sender<Option<Vec<String>>>,
    publisher: Arc<crate::broker::publish::Publisher>,
    metrics: Metrics,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        metrics
            .publisher_blocked
            .set(i64::from(publisher.is_blocked()));
        let queues = match api.queues().await {
            Ok(list) => list,
            Err(e) => {
                if !warned {
                    warn!(error = %e, "Cannot read queue depths; depth metrics stay stale until it answers");
                    warned = true;
                }
                metrics.broker_stats_up.set(0);
                continue;
            }
        };
        warned = false;
        metrics.broker_stats_up.set(1);
        listed.send_replace(Some(queues.iter().map(|q| q.name.clone()).collect()));
        let mut ready_by_queue = HashMap::new();
        for q in &queues {
            let name = q.name.as_str();
            if !ladder.names(name) {
                continue;
            }
            // A queue under the prefix that the ladder no longer names is an old tier still
            // promoting what it holds (docs/architecture.md, Topology commands).
            let role = ladder.role_of(name).map_or("tier", |r| r.label());
            let ready = q.messages_ready;
            metrics
                .queue_ready
                .with_label_values(&[name, role])
                .set(ready);
            metrics
                .queue_unacked
                .with_label_values(&[name, role])
                .set(q.messages_unacknowledged);
            metrics
                .queue_consumers
                .with_label_values(&[name, role])
                .set(q.consumers);
            ready_by_queue.insert(name.to_owned(), ready);
        }
        for lane in &lanes.all() {
            let ready = ready_by_queue.get(&lane.queue).copied().unwrap_or(0);
            metrics
                .oldest_ready_age
                .with_label_values(&[lane.label()])
                .set(lane.oldest_ready_age(ready, interval).as_secs_f64());
        }
    }
}

/// The local address actually bound (for tests that listen on port 0).
pub fn local_addr(listener: &Option<tokio::net::TcpListener>) -> Option<SocketAddr> {
    listener.as_ref().and_then(|l| l.local_addr().ok())
}
