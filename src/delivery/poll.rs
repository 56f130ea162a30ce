//! The worker's poll of the management API: queue depths, the oldest-ready estimate of idle
//! lanes, whether the publisher is blocked, and which queues exist (so the worker finds lanes
//! of tenants no longer dedicated).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::broker::management::Management;
use crate::broker::publish::Publisher;
use crate::contract::ladder::Ladder;
use crate::delivery::lane::Lanes;
use crate::observe::metrics::Metrics;

/// Reads the ladder's queues every `interval` and sets the depth gauges, the oldest-ready
/// estimate of lanes that have gone quiet, and whether the publisher is blocked; and hands the
/// list of queues to `listed`, where the worker's session looks for lanes to consume. (The
/// fleet is counted from the broker's live answers, not from here: these counts lag.)
pub struct QueuePoll {
    pub api: Management,
    pub ladder: Ladder,
    pub lanes: Lanes,
    pub listed: tokio::sync::watch::Sender<Option<Vec<String>>>,
    pub publisher: Arc<Publisher>,
    pub metrics: Metrics,
    pub interval: Duration,
}

impl QueuePoll {
    /// Polls until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let QueuePoll {
            api,
            ladder,
            lanes,
            listed,
            publisher,
            metrics,
            interval,
        } = self;
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
}
