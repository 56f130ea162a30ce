//! The worker's vital signs over HTTP: `/metrics`, `/healthz`, `/readyz`. The gauges of queue
//! depths are filled in by the worker's poll of the broker ([`crate::delivery::poll`]).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tracing::info;

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

/// The local address actually bound (for tests that listen on port 0).
pub fn local_addr(listener: &Option<tokio::net::TcpListener>) -> Option<SocketAddr> {
    listener.as_ref().and_then(|l| l.local_addr().ok())
}
