//! What the tests, the demo and the bench share: waiting on a condition, reading a worker's
//! counters, and percentiles.

use std::time::Duration;

use hookrelay::observe::metrics::Metrics;
use serde::Serialize;

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(50);

/// Checks `done` until it holds or `timeout` passes; returns whether it held. `done` may take
/// what it finds as it goes (drain a queue, read a log) between checks.
pub async fn wait_until(timeout: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Reading a worker's counters, as the tests and the demo do.
pub trait Counters {
    /// The sum of a counter over every label set whose labels include `matching`.
    fn count(&self, name: &str, matching: &[(&str, &str)]) -> u64;
}

impl Counters for Metrics {
    fn count(&self, name: &str, matching: &[(&str, &str)]) -> u64 {
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

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// Nearest rank: the value at `(n - 1) * p`, rounded.
    pub fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
        Self {
            count: ms.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: ms[ms.len() - 1],
        }
    }
}
