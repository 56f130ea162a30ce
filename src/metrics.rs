//! The worker's vital signs as Prometheus metrics. Each worker owns its registry, so several
//! workers in one process (tests, the demo) do not mix their counts.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Finished deliveries by lane and outcome (`delivered`, `retried`, `rejected`, ...).
    pub outcomes: IntCounterVec,
    /// Retries by the tier they were sent to.
    pub retries: IntCounterVec,
    /// Rejections by HTTP status.
    pub rejections: IntCounterVec,
    /// HTTP attempt latency by lane.
    pub attempt_seconds: HistogramVec,
    /// Deliveries being worked on, by lane.
    pub in_flight: IntGaugeVec,
    /// Republishes (to a tier or the sink) the broker did not confirm; the original was
    /// returned to its lane.
    pub republish_failures: IntCounterVec,
    /// Broker sessions re-established after a drop.
    pub reconnects: IntCounter,
    /// Envelopes completed without delivery because their subscription changed, by reason.
    pub cancellations: IntCounterVec,
    /// Looks at the subscriptions file that found a change, by result (`applied`, `refused`).
    pub subscription_reloads: IntCounterVec,
    /// Notices (operational events, attempt log) dropped because the buffer was full.
    pub notices_dropped: IntCounter,
    /// Notices the broker did not confirm.
    pub notices_failed: IntCounter,
}

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

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let outcomes = IntCounterVec::new(
            Opts::new(
                "hookrelay_outcomes_total",
                "Deliveries finished, by lane and outcome",
            ),
            &["lane", "outcome"],
        )
        .expect("valid metric");
        let retries = IntCounterVec::new(
            Opts::new("hookrelay_retries_total", "Retries scheduled, by tier"),
            &["tier"],
        )
        .expect("valid metric");
        let rejections = IntCounterVec::new(
            Opts::new(
                "hookrelay_rejections_total",
                "Deliveries dead-lettered as rejected, by HTTP status",
            ),
            &["status"],
        )
        .expect("valid metric");
        let attempt_seconds = HistogramVec::new(
            HistogramOpts::new(
                "hookrelay_attempt_duration_seconds",
                "HTTP attempt latency, by lane",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["lane"],
        )
        .expect("valid metric");
        let in_flight = IntGaugeVec::new(
            Opts::new("hookrelay_in_flight", "Deliveries being worked on, by lane"),
            &["lane"],
        )
        .expect("valid metric");
        let republish_failures = IntCounterVec::new(
            Opts::new(
                "hookrelay_republish_failures_total",
                "Republishes the broker did not confirm (the original went back to its lane)",
            ),
            &["target"],
        )
        .expect("valid metric");
        let reconnects = IntCounter::new(
            "hookrelay_reconnects_total",
            "Broker sessions re-established after a drop",
        )
        .expect("valid metric");
        let cancellations = IntCounterVec::new(
            Opts::new(
                "hookrelay_cancellations_total",
                "Envelopes completed without delivery because their subscription changed, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let subscription_reloads = IntCounterVec::new(
            Opts::new(
                "hookrelay_subscription_reloads_total",
                "Changed subscriptions files looked at, by result (applied, refused)",
            ),
            &["result"],
        )
        .expect("valid metric");
        let notices_dropped = IntCounter::new(
            "hookrelay_notices_dropped_total",
            "Operational events and attempt-log entries dropped because the buffer was full",
        )
        .expect("valid metric");
        let notices_failed = IntCounter::new(
            "hookrelay_notices_failed_total",
            "Operational events and attempt-log entries the broker did not confirm",
        )
        .expect("valid metric");
        for c in [
            Box::new(outcomes.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(retries.clone()),
            Box::new(rejections.clone()),
            Box::new(attempt_seconds.clone()),
            Box::new(in_flight.clone()),
            Box::new(republish_failures.clone()),
            Box::new(reconnects.clone()),
            Box::new(cancellations.clone()),
            Box::new(subscription_reloads.clone()),
            Box::new(notices_dropped.clone()),
            Box::new(notices_failed.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Self {
            registry,
            outcomes,
            retries,
            rejections,
            attempt_seconds,
            in_flight,
            republish_failures,
            reconnects,
            cancellations,
            subscription_reloads,
            notices_dropped,
            notices_failed,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }

    /// The sum of a counter over every label set whose labels include `matching`.
    pub fn count(&self, name: &str, matching: &[(&str, &str)]) -> u64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| {
                matching.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().value() as u64)
            .sum()
    }
}
