//! The fleet: every worker consuming one ladder, and each worker's share of the limits they
//! hold together. An endpoint's cap and rate limit are fleet-wide: with N workers, each takes
//! 1/N of them, so the endpoint sees the limit it was given, not N times it.
//!
//! How a worker knows N: each worker holds exactly one consumer on the ladder's first shared
//! lane (`ready.first`, or shard 0 `ready.first-s0`), a lane every worker must consume, and the
//! broker says how many consumers a queue has now in its answer to a passive `queue.declare`.
//! A worker counts that way before it consumes, again once its own consumer is registered, and
//! then every [`RECOUNT`] ([`count_fleet`]). Operator tools read queues with `basic.get`, never
//! as consumers, so they are not counted. The management API's counts are not used: they lag
//! by its statistics interval (5 s by default), and two workers started together each counted
//! the other's consumer as not there yet, took the whole cap, and the endpoint saw twice it.
//!
//! While its count is young, a worker makes no attempt ([`Fleet::settled`]): for [`JOIN_SETTLE`]
//! after it starts consuming, its deliveries wait before admission, and it recounts. Workers
//! started together (a deployment rolling out, a restart after an outage) register within that
//! time of each other, so each counts all of them before its first attempt; a worker joining a
//! running fleet gives the others [`RECOUNT`] to see it and take their smaller shares before it
//! takes its own. A delivery so held waits at most once per session, a fraction of its lease.
//!
//! Shares round down, at least 1: a cap of 10 over 3 workers is 3 each, so the fleet's sum
//! never exceeds the cap, unless there are more workers than the cap, when each still makes one
//! attempt at a time (an endpoint must not starve) and the fleet may make one per worker.
//! A change of shares does not recall attempts already out: when a worker joins a busy fleet,
//! the older workers' attempts made under their larger share are still finishing for about one
//! attempt's time (the joiner's settling time covers that for attempts shorter than it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::units::Rate;

/// How often a worker counts the fleet again.
pub const RECOUNT: Duration = Duration::from_millis(500);

/// How long a worker's count is young after it starts consuming: it makes no attempt until
/// then. Longer than [`RECOUNT`] three times over, so workers started together count each
/// other, and the rest of the fleet has counted a joiner, before anyone's first attempt.
pub const JOIN_SETTLE: Duration = Duration::from_secs(2);

/// The live worker count, shared by a worker's count of the fleet and its admissions.
#[derive(Debug, Clone)]
pub struct Fleet(Arc<Count>);

#[derive(Debug)]
struct Count {
    workers: AtomicU32,
    /// Whether the count is settled (attempts may be made); `false` while it is young.
    settled: tokio::sync::watch::Sender<bool>,
}

impl Default for Fleet {
    /// A fleet of one that never joined: settled, so nothing waits (a worker that cannot
    /// count keeps the whole limits).
    fn default() -> Self {
        Self(Arc::new(Count {
            workers: AtomicU32::new(1),
            settled: tokio::sync::watch::Sender::new(true),
        }))
    }
}

impl Fleet {
    /// Live workers, as last counted; 1 until counted.
    pub fn workers(&self) -> u32 {
        self.0.workers.load(Ordering::Relaxed).max(1)
    }

    /// Counts the fleet when this worker (re)joins, before it consumes: `others` consume the
    /// lane already, so the fleet is `others + 1`, and the count is young until
    /// [`Fleet::settle`].
    pub fn join(&self, others: u32) -> u32 {
        let count = others.saturating_add(1);
        self.0.workers.store(count, Ordering::Relaxed);
        self.0.settled.send_replace(false);
        count
    }

    /// Takes a live consumer count of the first shared lane, this worker's consumer included;
    /// 0 (this worker between sessions) keeps the last count. Returns the count in force.
    pub fn observe(&self, consumers: u32) -> u32 {
        if consumers > 0 {
            self.0.workers.store(consumers, Ordering::Relaxed);
        }
        self.workers()
    }

    /// Takes a count made `since_start` after this session began consuming (`None`: it could
    /// not be made, and the count in force stays), and settles the count once one made at least
    /// [`JOIN_SETTLE`] after the start has been taken. Returns the count in force. The protocol
    /// of [`count_fleet`], without its I/O.
    pub fn counted(&self, consumers: Option<u32>, since_start: Duration) -> u32 {
        let workers = match consumers {
            Some(consumers) => self.observe(consumers),
            None => self.workers(),
        };
        if !self.is_settled() && since_start >= JOIN_SETTLE {
            self.settle();
        }
        workers
    }

    /// The count is no longer young: attempts may be made.
    pub fn settle(&self) {
        self.0.settled.send_replace(true);
    }

    pub fn is_settled(&self) -> bool {
        *self.0.settled.borrow()
    }

    /// Waits until the count is settled, at most `JOIN_SETTLE` twice over (should the count
    /// of a session that ended never settle, a delivery of it is not held for good).
    pub async fn settled(&self) {
        if self.is_settled() {
            return;
        }
        let mut settled = self.0.settled.subscribe();
        let _ = tokio::time::timeout(JOIN_SETTLE * 2, settled.wait_for(|s| *s)).await;
    }

    /// This worker's share of a fleet-wide concurrency limit: rounded down, at least 1.
    pub fn share(&self, limit: u32) -> u32 {
        (limit / self.workers()).max(1)
    }

    /// How many of a cap's `cap` permits one attempt of this worker weighs: the worker count,
    /// so `cap` permits admit [`Fleet::share`] attempts at once, and attempts admitted under an
    /// older count keep the weight they were admitted with when the count changes.
    pub fn weight(&self, cap: u32) -> u32 {
        self.workers().min(cap).max(1)
    }
}

/// The consumers of `lane` now, from the broker's answer to a passive declare on `channel`
/// (which a missing queue closes).
pub async fn live_consumers(channel: &lapin::Channel, lane: &str) -> Result<u32, lapin::Error> {
    let declared = channel
        .queue_declare(
            lane.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await?;
    Ok(declared.consumer_count())
}

/// Counts the fleet for one session of a worker whose consumer of `lane` is registered, on
/// `channel` (one of the session's connection): at once, then every [`RECOUNT`]; settles the
/// count once a count made at least [`JOIN_SETTLE`] after the start has been taken (or could
/// not be: the count in force stays), and keeps counting until the session ends (the task is
/// dropped). `changed` is told every count in force.
pub async fn count_fleet(
    mut channel: Option<lapin::Channel>,
    lane: String,
    fleet: Fleet,
    changed: impl Fn(u32),
) {
    let started = tokio::time::Instant::now();
    let mut warned = false;
    loop {
        let counted = match &channel {
            Some(ch) => live_consumers(ch, &lane).await.map_err(|e| e.to_string()),
            None => Err("no channel".to_owned()),
        };
        let before = fleet.workers();
        let consumers = match counted {
            Ok(consumers) => {
                warned = false;
                Some(consumers)
            }
            Err(e) => {
                // A passive declare that fails closes its channel; the lane is gone, which ends
                // the session, and the next session counts on a channel of its own.
                channel = None;
                if !warned {
                    warn!(lane = %lane, error = %e, workers = fleet.workers(), "Cannot count the fleet; endpoint limits keep the last count");
                    warned = true;
                }
                None
            }
        };
        let workers = fleet.counted(consumers, started.elapsed());
        if workers != before {
            info!(workers, "Fleet size changed; endpoint limits rebalanced");
        }
        changed(workers);
        tokio::time::sleep(RECOUNT).await;
    }
}

/// A rate limiter: the generic cell rate algorithm (GCRA), as in the `governor` crate and in
/// ATM networks. It keeps one instant, the theoretical arrival time of the next request: a
/// request conforms if it comes no earlier than that, and each conforming request moves it on
/// by one emission interval (1 / rate). With no burst allowance, no window of length `w` holds
/// more than `1 + w x rate` conforming requests.
///
/// Hand-written rather than taken from `governor`: the interval changes with the worker count
/// at every admission, where `governor` fixes its quota when a limiter is built, and the state
/// machine is a few lines that tests can drive with their own clock.
#[derive(Debug, Clone, Copy)]
pub struct Gcra {
    /// When the next request conforms.
    next: Instant,
}

impl Gcra {
    pub fn new(now: Instant) -> Self {
        Self { next: now }
    }

    /// Whether a request at `now` would conform whatever the rate: then this limiter is what a
    /// new one would be, and may be forgotten.
    pub fn is_idle(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Whether a request at `now` conforms to `rate` shared by `workers`; a conforming one is
    /// counted. A request that does not conform learns how long until one would.
    pub fn admit(&mut self, rate: Rate, workers: u32, now: Instant) -> Result<(), Duration> {
        if now < self.next {
            return Err(self.next - now);
        }
        let interval = Duration::from_secs_f64(f64::from(workers.max(1)) / rate.per_second());
        self.next = now + interval;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_joining_worker_counts_itself_and_makes_no_attempt_while_its_count_is_young() {
        let fleet = Fleet::default();
        assert!(
            fleet.is_settled(),
            "a fleet never joined holds nothing back"
        );
        assert_eq!(fleet.join(1), 2);
        assert_eq!(fleet.share(10), 5);
        assert!(!fleet.is_settled());
        // Live counts are taken as they come, up or down: they do not lag.
        assert_eq!(fleet.observe(3), 3);
        assert_eq!(fleet.observe(1), 1);
        let waiting = tokio::spawn({
            let fleet = fleet.clone();
            async move { fleet.settled().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "held while young");
        fleet.settle();
        waiting.await.unwrap();
        // Joining again (a new session) makes it young again.
        fleet.join(0);
        assert!(!fleet.is_settled());
    }

    #[test]
    fn shares_round_down_and_never_reach_zero() {
        let fleet = Fleet::default();
        assert_eq!((fleet.workers(), fleet.share(10)), (1, 10));
        assert_eq!(fleet.observe(2), 2);
        assert_eq!((fleet.share(10), fleet.weight(10)), (5, 2));
        fleet.observe(3);
        assert_eq!(fleet.share(10), 3, "3 x 3 <= 10");
        fleet.observe(0);
        assert_eq!(fleet.workers(), 3, "nobody consuming: the last count stays");
        fleet.observe(12);
        assert_eq!((fleet.share(10), fleet.weight(10)), (1, 10), "one each");
    }

    #[test]
    fn cap_permits_weighed_by_the_worker_count_admit_the_share() {
        // The endpoint's permits are the cap; each attempt weighs the worker count.
        let fleet = Fleet::default();
        fleet.observe(2);
        let permits = tokio::sync::Semaphore::new(10);
        let mut held = Vec::new();
        while let Ok(p) = permits.try_acquire_many(fleet.weight(10)) {
            held.push(p);
        }
        assert_eq!(held.len(), fleet.share(10) as usize);
    }

    #[test]
    fn gcra_spaces_requests_by_the_fleet_interval() {
        let t0 = Instant::now();
        let rate: Rate = "20/s".parse().unwrap();
        let mut gcra = Gcra::new(t0);
        assert!(gcra.admit(rate, 1, t0).is_ok());
        assert_eq!(gcra.admit(rate, 1, t0), Err(Duration::from_millis(50)));
        assert!(gcra.admit(rate, 1, t0 + Duration::from_millis(50)).is_ok());
        // Two workers: each may send every 100 ms.
        let t1 = t0 + Duration::from_millis(100);
        assert!(gcra.admit(rate, 2, t1).is_ok());
        assert!(gcra.admit(rate, 2, t1 + Duration::from_millis(99)).is_err());
        assert!(gcra.admit(rate, 2, t1 + Duration::from_millis(100)).is_ok());
        // Over any second, at most 1 + rate requests conform, however they arrive.
        let mut gcra = Gcra::new(t0);
        let admitted = (0..1000)
            .filter(|ms| gcra.admit(rate, 1, t0 + Duration::from_millis(*ms)).is_ok())
            .count();
        assert_eq!(admitted, 20);
    }
}
