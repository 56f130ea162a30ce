//! A ready queue as the worker consumes it: its kind, its prefetch, its metric handles, and
//! what it has seen at its head (for the oldest-ready estimate); and [`Lanes`], every lane the
//! worker has consumed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::delivery::endpoint::LaneQuota;
use crate::observe::metrics::Metrics;

/// Which kind of lane a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneKind {
    First,
    Retry,
}

/// A lane the worker means to consume. `required` lanes are the ladder's (shared and
/// dedicated): without them the worker is not ready. The others are lanes the ladder no longer
/// routes to (tenants no longer dedicated, shards of another count), consumed while they exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSpec {
    pub kind: LaneKind,
    pub queue: String,
    pub prefetch: u16,
    pub required: bool,
    /// The shard index its name gives it, if it is a shard of the shared lane.
    pub shard: Option<u16>,
    /// Whether its deliveries take a permit of the worker-wide budget of their kind before
    /// they are processed (the shards of a sharded ladder, whose prefetches add up to more).
    pub shares_budget: bool,
    /// The most attempts one endpoint may have out from it at once (`endpoints.lane_share` of
    /// its prefetch), on a shared lane; a dedicated tenant's lanes have none.
    pub endpoint_most: Option<u32>,
}

/// The worker-wide bound on deliveries processed at once from the shards of a sharded ladder:
/// one semaphore per kind, of the kind's share of `worker.in_flight`.
#[derive(Debug, Clone)]
pub struct SharedBudget {
    pub first: Arc<Semaphore>,
    pub retry: Arc<Semaphore>,
}

impl SharedBudget {
    pub fn new(first: u16, retry: u16) -> Self {
        Self {
            first: Arc::new(Semaphore::new(first.into())),
            retry: Arc::new(Semaphore::new(retry.into())),
        }
    }
}

/// Every lane the worker has consumed, by queue: one [`Lane`] per queue for the worker's life,
/// so its metric handles and head estimate outlive a reconnect or a lane that comes and goes.
#[derive(Debug, Clone)]
pub struct Lanes {
    by_queue: Arc<Mutex<BTreeMap<String, Arc<Lane>>>>,
    budget: SharedBudget,
}

impl Lanes {
    pub fn new(budget: SharedBudget) -> Self {
        Self {
            by_queue: Arc::default(),
            budget,
        }
    }

    /// The lane of `spec`, made on first use.
    pub fn lane(&self, spec: &LaneSpec, metrics: &Metrics) -> Arc<Lane> {
        let mut lanes = self.by_queue.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(lanes.entry(spec.queue.clone()).or_insert_with(|| {
            let mut lane = Lane::new(spec.kind, spec.queue.clone(), spec.prefetch, metrics);
            lane.shard = spec.shard;
            lane.endpoint_most = spec.endpoint_most;
            lane.permits = spec.shares_budget.then(|| match spec.kind {
                LaneKind::First => Arc::clone(&self.budget.first),
                LaneKind::Retry => Arc::clone(&self.budget.retry),
            });
            Arc::new(lane)
        }))
    }

    /// Every lane consumed so far.
    pub fn all(&self) -> Vec<Arc<Lane>> {
        let lanes = self.by_queue.lock().unwrap_or_else(|p| p.into_inner());
        lanes.values().cloned().collect()
    }
}

/// A lane's metric handles, resolved once rather than by label on every delivery.
#[derive(Debug)]
pub(crate) struct LaneMetrics {
    pub(crate) in_flight: prometheus::IntGauge,
    pub(crate) oldest_ready_age: prometheus::Gauge,
    pub(crate) attempt_seconds: prometheus::Histogram,
    pub(crate) delivered: prometheus::IntCounter,
}

/// One ready queue: what the worker consumes, and what it has seen at its head.
#[derive(Debug)]
pub struct Lane {
    pub kind: LaneKind,
    pub queue: String,
    pub prefetch: u16,
    /// The shard index of a shard of the shared lane; its retries carry it.
    pub shard: Option<u16>,
    /// The worker-wide budget its deliveries take a permit of, if it shares one.
    permits: Option<Arc<Semaphore>>,
    /// The most attempts one endpoint may have out from this lane at once.
    pub endpoint_most: Option<u32>,
    pub(crate) metrics: LaneMetrics,
    /// How long the most recently delivered message had waited, in ms.
    last_age_ms: AtomicU64,
    /// When that delivery arrived, in ms since `epoch`.
    last_delivery_ms: AtomicU64,
    epoch: Instant,
}

impl Lane {
    pub fn new(kind: LaneKind, queue: String, prefetch: u16, metrics: &Metrics) -> Self {
        let label = [queue.as_str()];
        Self {
            metrics: LaneMetrics {
                in_flight: metrics.in_flight.with_label_values(&label),
                oldest_ready_age: metrics.oldest_ready_age.with_label_values(&label),
                attempt_seconds: metrics.attempt_seconds.with_label_values(&label),
                delivered: metrics
                    .outcomes
                    .with_label_values(&[queue.as_str(), "delivered"]),
            },
            kind,
            queue,
            prefetch,
            shard: None,
            permits: None,
            endpoint_most: None,
            last_age_ms: AtomicU64::new(0),
            last_delivery_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Waits for a permit of the budget the lane shares, if any; processing holds it. The
    /// semaphore is fair, so a delivery waits for at most the deliveries handed over before it.
    pub async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        let permits = Arc::clone(self.permits.as_ref()?);
        permits.acquire_owned().await.ok()
    }

    /// The limit this lane puts on one endpoint's attempts from it, if any.
    pub fn quota(&self) -> Option<LaneQuota<'_>> {
        self.endpoint_most.map(|most| LaneQuota {
            lane: &self.queue,
            most,
        })
    }

    /// The metrics label: the queue name.
    pub fn label(&self) -> &str {
        &self.queue
    }

    pub(crate) fn saw_head(&self, age_ms: u64) {
        self.last_age_ms.store(age_ms, Ordering::Relaxed);
        self.last_delivery_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// The oldest-ready estimate given the broker's ready count: 0 for an empty lane; the wait of
    /// the last delivered message while deliveries flow; that wait plus the time since while the
    /// lane holds messages and nothing is delivered (an upper bound on the head's wait).
    pub fn oldest_ready_age(&self, ready: i64, quiet_after: Duration) -> Duration {
        if ready <= 0 {
            return Duration::ZERO;
        }
        let last_age = Duration::from_millis(self.last_age_ms.load(Ordering::Relaxed));
        let since = self.epoch.elapsed().saturating_sub(Duration::from_millis(
            self.last_delivery_ms.load(Ordering::Relaxed),
        ));
        if since < quiet_after {
            last_age
        } else {
            last_age + since
        }
    }
}
