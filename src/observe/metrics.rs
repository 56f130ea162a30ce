//! The worker's vital signs as Prometheus metrics. Each worker owns its registry, so several
//! workers in one process (tests, the demo) do not mix their counts. Lane labels are queue
//! names; tier labels are tier names (`retry-10s`).

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Every metric of a worker. docs/operating.md lists them with their meaning.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Finished deliveries by lane and outcome (`delivered`, `retried`, `rejected`, `exhausted`,
    /// `invalid`, `cancelled`, `gone`, `egress_denied`, `horizon_expired`, `schema_invalid`,
    /// `fanned_out`, `parked`).
    pub outcomes: IntCounterVec,
    /// Retries by the tier they were sent to.
    pub retries: IntCounterVec,
    /// Rejections by HTTP status.
    pub rejections: IntCounterVec,
    /// Envelopes completed without delivery because their subscription changed, by reason.
    pub cancellations: IntCounterVec,
    /// Attempts not made (breaker open, concurrency cap full, recovery limit reached), by reason.
    pub deferrals: IntCounterVec,
    /// OAuth2 token requests made for endpoints, by result (`issued`, `failed`).
    pub oauth_tokens: IntCounterVec,
    /// HTTP attempt latency by lane.
    pub attempt_seconds: HistogramVec,
    /// Deliveries being worked on, by lane.
    pub in_flight: IntGaugeVec,
    /// How long the most recently delivered message of each lane had waited; while the lane has
    /// ready messages and nothing is delivered, that value plus the time since (see docs/operating.md).
    pub oldest_ready_age: GaugeVec,
    /// Messages arriving back from each tier (read from the broker's dead-letter headers).
    pub promotions: IntCounterVec,
    /// From due time to consumption, per tier.
    pub promotion_lag: HistogramVec,
    /// Ready messages per queue of the ladder, polled from the management API.
    pub queue_ready: IntGaugeVec,
    /// Delivered but unacknowledged messages per queue, polled from the management API.
    pub queue_unacked: IntGaugeVec,
    /// Consumers per queue, polled from the management API.
    pub queue_consumers: IntGaugeVec,
    /// 1 while the last poll of the management API succeeded.
    pub broker_stats_up: IntGauge,
    /// 1 while the worker consumes every lane of the ladder (retired lanes may come and go).
    pub consuming: IntGauge,
    /// 1 while the broker blocks the worker's publishing connection (a resource alarm).
    pub publisher_blocked: IntGauge,
    /// Republish tries (to a tier, the sink, fan-out deliveries, a cancellation's records) the
    /// broker did not confirm, or could not be made because it blocks publishing. Each is tried
    /// again within the lease; the original goes back to its lane only when the lease is nearly
    /// spent.
    pub republish_failures: IntCounterVec,
    /// Republishes the broker confirmed, by the same targets: beside the failures, the share of
    /// tries that were confirmed.
    pub republishes: IntCounterVec,
    /// Broker sessions re-established after a drop.
    pub reconnects: IntCounter,
    /// Looks at the subscriptions file that found a change, by result (`applied`, `refused`).
    pub subscription_reloads: IntCounterVec,
    /// Events whose payload their type's schema refused, by mode (`enforce`: dead-lettered,
    /// `warn`: delivered) and event type: the type's name when the catalog lists it (a bounded
    /// set), else `unlisted`, so a producer's made-up types add no series.
    pub schema_invalid: IntCounterVec,
    /// 1 while the subscription store answers (always 1 for a file); 0 while the worker
    /// delivers on its last snapshot of a PostgreSQL store that does not answer.
    pub subscription_store_up: IntGauge,
    /// When the snapshot last matched the PostgreSQL store (Unix time, seconds).
    pub subscription_store_synced: prometheus::Gauge,
    /// Subscription changes read from the PostgreSQL store after a notification.
    pub subscription_store_changes: IntCounter,
    /// Lookups of a worker that holds only the subscriptions it delivers for, by key (`id`,
    /// `tenant`) and result (`hit`; `miss`: read from the store; `failed`: the store was slow
    /// or down, the delivery deferred; `refused`: a tenant above `store.cache_per_tenant`).
    pub subscription_lookups: IntCounterVec,
    /// How long a delivery waited for a miss to be read, by key (`id`, `tenant`).
    pub subscription_miss_seconds: HistogramVec,
    /// Operational events dropped because the buffer was full (attempt records wait for room).
    pub notices_dropped: IntCounter,
    /// Notices the broker returned because no queue is bound for them (nobody keeps them).
    pub notices_unroutable: IntCounter,
    /// Notices the broker did not confirm.
    pub notices_failed: IntCounter,
    /// Endpoints whose breaker has been open longer than `endpoints.quarantine_after`.
    pub endpoints_quarantined: IntGauge,
    /// 1 per quarantined endpoint, labelled `host:port#hash`; a series exists only while its
    /// endpoint is quarantined, and at most [`MAX_QUARANTINE_SERIES`] at once (the rest are in
    /// `endpoints_quarantined` alone), so the label's cardinality is bounded.
    pub endpoint_quarantined: IntGaugeVec,
    /// Endpoints whose concurrency is ramping up after their breaker closed. A count, not a
    /// series per endpoint, so its cardinality is one.
    pub endpoints_recovering: IntGauge,
    /// Endpoints whose breaker is open or probing, as the last sweep found them: the breakers
    /// open before any of them lasts long enough to be quarantined.
    pub endpoints_open: IntGauge,
    /// Live workers consuming the ladder, as the last management poll counted them: each
    /// worker's share of the fleet-wide endpoint limits is 1/this.
    pub fleet_workers: IntGauge,
    /// Entries the worker keeps in memory, by cache (`secrets`, `secret_texts`,
    /// `endpoint_health`, `endpoint_limits`, `host_limits`, `lane_limits`, `endpoint_rates`):
    /// each follows the subscriptions and endpoints in use, not every one ever seen.
    pub cache_entries: IntGaugeVec,
    /// Spans not exported, by reason; shared by every worker of the process, as the tracer
    /// provider is ([`crate::observe::traces`]).
    pub trace_spans_dropped: IntCounterVec,
    /// Spans the collector took.
    pub trace_spans_exported: IntCounter,
}

/// The most labelled series `hookrelay_endpoint_quarantined` holds at once.
pub const MAX_QUARANTINE_SERIES: usize = 100;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn register<C: Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        r,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// Every metric name a worker exports, for checking alert rules and docs against.
pub fn metric_names() -> Vec<String> {
    let m = Metrics::new();
    let collectors: [&dyn Collector; 38] = [
        &m.subscription_lookups,
        &m.subscription_miss_seconds,
        &m.trace_spans_dropped,
        &m.trace_spans_exported,
        &m.cache_entries,
        &m.subscription_store_up,
        &m.subscription_store_synced,
        &m.subscription_store_changes,
        &m.fleet_workers,
        &m.endpoints_recovering,
        &m.endpoints_open,
        &m.endpoints_quarantined,
        &m.endpoint_quarantined,
        &m.outcomes,
        &m.retries,
        &m.rejections,
        &m.cancellations,
        &m.deferrals,
        &m.oauth_tokens,
        &m.attempt_seconds,
        &m.in_flight,
        &m.oldest_ready_age,
        &m.promotions,
        &m.promotion_lag,
        &m.queue_ready,
        &m.queue_unacked,
        &m.queue_consumers,
        &m.broker_stats_up,
        &m.consuming,
        &m.publisher_blocked,
        &m.republish_failures,
        &m.republishes,
        &m.reconnects,
        &m.subscription_reloads,
        &m.schema_invalid,
        &m.notices_dropped,
        &m.notices_failed,
        &m.notices_unroutable,
    ];
    let mut names: Vec<String> = collectors
        .iter()
        .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
        .collect();
    names.sort();
    names
}

const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const LAG_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0, 1800.0,
];

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        Self {
            outcomes: counters(
                &r,
                "hookrelay_outcomes_total",
                "Deliveries finished, by lane and outcome",
                &["lane", "outcome"],
            ),
            retries: counters(
                &r,
                "hookrelay_retries_total",
                "Retries scheduled, by tier",
                &["tier"],
            ),
            rejections: counters(
                &r,
                "hookrelay_rejections_total",
                "Deliveries dead-lettered as rejected, by HTTP status",
                &["status"],
            ),
            cancellations: counters(
                &r,
                "hookrelay_cancellations_total",
                "Envelopes completed without delivery because their subscription changed, by reason",
                &["reason"],
            ),
            deferrals: counters(
                &r,
                "hookrelay_deferrals_total",
                "Attempts not made because the endpoint's breaker was open, its cap full or its recovery limit reached, by reason",
                &["reason"],
            ),
            oauth_tokens: counters(
                &r,
                "hookrelay_oauth_token_requests_total",
                "OAuth2 token requests made for endpoints that authenticate with one, by result (issued, failed)",
                &["result"],
            ),
            attempt_seconds: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hookrelay_attempt_duration_seconds",
                        "HTTP attempt latency, by lane",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["lane"],
                )
                .expect("valid metric"),
            ),
            in_flight: gauges(
                &r,
                "hookrelay_in_flight",
                "Deliveries being worked on, by lane",
                &["lane"],
            ),
            oldest_ready_age: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "hookrelay_oldest_ready_age_seconds",
                        "Wait of the most recently delivered message of the lane; grows while the lane has ready messages and none is delivered",
                    ),
                    &["lane"],
                )
                .expect("valid metric"),
            ),
            promotions: counters(
                &r,
                "hookrelay_promotions_total",
                "Messages arriving back from each tier",
                &["tier"],
            ),
            promotion_lag: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hookrelay_promotion_lag_seconds",
                        "From a retry's due time to its consumption, by tier",
                    )
                    .buckets(LAG_BUCKETS.to_vec()),
                    &["tier"],
                )
                .expect("valid metric"),
            ),
            queue_ready: gauges(
                &r,
                "hookrelay_queue_ready_messages",
                "Ready messages per queue of the ladder (from the management API)",
                &["queue", "role"],
            ),
            queue_unacked: gauges(
                &r,
                "hookrelay_queue_unacked_messages",
                "Unacknowledged messages per queue of the ladder (from the management API)",
                &["queue", "role"],
            ),
            queue_consumers: gauges(
                &r,
                "hookrelay_queue_consumers",
                "Consumers per queue of the ladder (from the management API)",
                &["queue", "role"],
            ),
            broker_stats_up: register(
                &r,
                IntGauge::new(
                    "hookrelay_broker_stats_up",
                    "1 while the last poll of the management API succeeded",
                )
                .expect("valid metric"),
            ),
            consuming: register(
                &r,
                IntGauge::new(
                    "hookrelay_consuming",
                    "1 while the worker consumes every lane of the ladder",
                )
                .expect("valid metric"),
            ),
            publisher_blocked: register(
                &r,
                IntGauge::new(
                    "hookrelay_publisher_blocked",
                    "1 while the broker blocks the worker's publishing connection (resource alarm)",
                )
                .expect("valid metric"),
            ),
            republish_failures: counters(
                &r,
                "hookrelay_republish_failures_total",
                "Republish tries the broker did not confirm (tried again within the lease)",
                &["target"],
            ),
            republishes: counters(
                &r,
                "hookrelay_republishes_total",
                "Republishes the broker confirmed, by target (a tier, the sink, fan-out, the attempt log)",
                &["target"],
            ),
            reconnects: register(
                &r,
                IntCounter::new(
                    "hookrelay_reconnects_total",
                    "Broker sessions re-established after a drop",
                )
                .expect("valid metric"),
            ),
            subscription_reloads: counters(
                &r,
                "hookrelay_subscription_reloads_total",
                "Changed subscriptions files looked at, by result (applied, refused)",
                &["result"],
            ),
            schema_invalid: counters(
                &r,
                "hookrelay_schema_invalid_total",
                "Events their type's schema refused, by event type (listed ones; else unlisted) and mode (enforce, warn)",
                &["event_type", "mode"],
            ),
            subscription_store_up: {
                let g = register(
                    &r,
                    IntGauge::new(
                        "hookrelay_subscription_store_up",
                        "1 while the subscription store answers; 0 while the worker delivers on its last snapshot",
                    )
                    .expect("valid metric"),
                );
                g.set(1);
                g
            },
            subscription_store_synced: register(
                &r,
                prometheus::Gauge::new(
                    "hookrelay_subscription_store_synced_timestamp_seconds",
                    "When the snapshot last matched the PostgreSQL subscription store (Unix time)",
                )
                .expect("valid metric"),
            ),
            subscription_store_changes: register(
                &r,
                IntCounter::new(
                    "hookrelay_subscription_store_changes_total",
                    "Subscription changes read from the PostgreSQL store after a notification",
                )
                .expect("valid metric"),
            ),
            subscription_lookups: counters(
                &r,
                "hookrelay_subscription_lookups_total",
                "Lookups of the subscriptions a worker holds of a large store, by key and result",
                &["kind", "result"],
            ),
            subscription_miss_seconds: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "hookrelay_subscription_miss_seconds",
                        "How long a delivery waited for a subscription not held, by key",
                    )
                    .buckets(vec![0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]),
                    &["kind"],
                )
                .expect("valid metric"),
            ),
            notices_dropped: register(
                &r,
                IntCounter::new(
                    "hookrelay_notices_dropped_total",
                    "Operational events dropped because the buffer was full (attempt records wait for room)",
                )
                .expect("valid metric"),
            ),
            notices_unroutable: register(
                &r,
                IntCounter::new(
                    "hookrelay_notices_unroutable_total",
                    "Notices returned by the broker because no queue is bound for them",
                )
                .expect("valid metric"),
            ),
            notices_failed: register(
                &r,
                IntCounter::new(
                    "hookrelay_notices_failed_total",
                    "Operational events and attempt-log entries the broker did not confirm",
                )
                .expect("valid metric"),
            ),
            endpoints_quarantined: register(
                &r,
                IntGauge::new(
                    "hookrelay_endpoints_quarantined",
                    "Endpoints whose breaker has been open longer than endpoints.quarantine_after",
                )
                .expect("valid metric"),
            ),
            endpoint_quarantined: gauges(
                &r,
                "hookrelay_endpoint_quarantined",
                "1 per quarantined endpoint (host:port#hash), at most 100 series",
                &["endpoint"],
            ),
            endpoints_recovering: register(
                &r,
                IntGauge::new(
                    "hookrelay_endpoints_recovering",
                    "Endpoints whose concurrency is ramping up after their breaker closed",
                )
                .expect("valid metric"),
            ),
            endpoints_open: register(
                &r,
                IntGauge::new(
                    "hookrelay_endpoints_open",
                    "Endpoints whose breaker is open or probing, as of the last sweep",
                )
                .expect("valid metric"),
            ),
            fleet_workers: register(
                &r,
                IntGauge::new(
                    "hookrelay_fleet_workers",
                    "Live workers sharing the endpoint limits (consumers of the first shared lane)",
                )
                .expect("valid metric"),
            ),
            cache_entries: gauges(
                &r,
                "hookrelay_worker_cache_entries",
                "Entries the worker keeps in memory, by cache; each follows the subscriptions and endpoints in use",
                &["cache"],
            ),
            trace_spans_dropped: register(&r, super::traces::metrics().dropped.clone()),
            trace_spans_exported: register(&r, super::traces::metrics().exported.clone()),
            registry: r,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}
