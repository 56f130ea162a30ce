//! The fleet: every worker consuming one ladder, and each worker's share of the limits they
//! hold together. An endpoint's cap and rate limit are fleet-wide: with N workers, each takes
//! 1/N of them, so the endpoint sees the limit it was given, not N times it.
//!
//! How a worker knows N: the management API poll (`metrics.poll_interval`) already reads every
//! queue's consumer count, and each worker holds exactly one consumer on the ladder's first
//! shared lane (`ready.first`, or shard 0 `ready.first-s0`), a lane every worker must consume.
//! That count is the number of live workers; a worker joining or leaving is seen at the next
//! poll, and the shares rebalance then. Operator tools read queues with `basic.get`, never as
//! consumers, so they are not counted. When the API cannot be read, or the lane has no consumer
//! (this worker is between sessions), the last known count stays; it starts at 1, so a worker
//! alone, or one that never reaches the API, keeps the whole limits as before.
//!
//! A worker joining counts the fleet before it consumes: the consumers of that lane when it
//! starts, plus itself. The management API's counts lag (by its statistics interval, 5 s by
//! default), so for [`JOIN_GRACE`] a poll that counts fewer than that is taken as stale and the
//! count at joining stays; after that, or once a poll agrees, polls decide. Too many workers
//! counted for a moment costs a little throughput; too few would exceed the endpoint's limit.
//!
//! Shares round down, at least 1: a cap of 10 over 3 workers is 3 each, so the fleet's sum
//! never exceeds the cap, unless there are more workers than the cap, when each still makes one
//! attempt at a time (an endpoint must not starve) and the fleet may make one per worker.
//! A change of shares does not recall attempts already out: for about one attempt after a
//! worker joins, the older workers' attempts made under their larger share are still finishing.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::units::Rate;

/// How long the count a worker made when joining outlasts polls that count fewer: more than
/// the management API's default statistics interval (5 s) twice over.
pub const JOIN_GRACE: Duration = Duration::from_secs(15);

/// The live worker count, shared by a worker's management poll and its admissions.
#[derive(Debug, Clone)]
pub struct Fleet(Arc<Count>);

#[derive(Debug)]
struct Count {
    workers: AtomicU32,
    /// The count at joining, and until when a lower poll is taken as stale.
    joined: Mutex<Option<(u32, Instant)>>,
}

impl Default for Fleet {
    fn default() -> Self {
        Self(Arc::new(Count {
            workers: AtomicU32::new(1),
            joined: Mutex::new(None),
        }))
    }
}

impl Fleet {
    /// Live workers, as last seen; 1 until a poll says otherwise.
    pub fn workers(&self) -> u32 {
        self.0.workers.load(Ordering::Relaxed).max(1)
    }

    /// Counts the fleet when this worker joins, before it consumes: `others` consume the lane
    /// already, so the fleet is `others + 1` from now, and stays at least that for `grace`
    /// unless a poll agrees sooner.
    pub fn join(&self, others: u32, now: Instant, grace: Duration) -> u32 {
        let count = others.saturating_add(1);
        self.0.workers.store(count, Ordering::Relaxed);
        *self.0.joined.lock().unwrap_or_else(|p| p.into_inner()) = Some((count, now + grace));
        count
    }

    /// Takes a consumer count of the first shared lane; 0 (nobody consuming it, this worker
    /// included) keeps the last count, and so does a lower count while the count at joining
    /// holds. Returns the count in force.
    pub fn observe(&self, consumers: u32) -> u32 {
        self.observe_at(consumers, Instant::now())
    }

    pub fn observe_at(&self, consumers: u32, now: Instant) -> u32 {
        let mut joined = self.0.joined.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((count, until)) = *joined {
            if consumers < count && now < until {
                return self.workers();
            }
            *joined = None;
        }
        if consumers > 0 {
            self.0.workers.store(consumers, Ordering::Relaxed);
        }
        self.workers()
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

    #[test]
    fn a_joining_worker_counts_itself_until_polls_catch_up() {
        let fleet = Fleet::default();
        let t0 = Instant::now();
        assert_eq!(fleet.join(1, t0, JOIN_GRACE), 2);
        assert_eq!(fleet.share(10), 5);
        // A stale poll that has not seen this worker yet does not halve the fleet back.
        assert_eq!(fleet.observe_at(1, t0 + Duration::from_secs(5)), 2);
        // A poll that agrees ends the grace; later polls decide alone.
        assert_eq!(fleet.observe_at(2, t0 + Duration::from_secs(6)), 2);
        assert_eq!(fleet.observe_at(1, t0 + Duration::from_secs(7)), 1);
        // Without agreement, the grace runs out.
        let late = Fleet::default();
        late.join(2, t0, JOIN_GRACE);
        assert_eq!(late.observe_at(1, t0 + JOIN_GRACE), 1);
        // More workers seen at once are taken at once.
        let more = Fleet::default();
        more.join(0, t0, JOIN_GRACE);
        assert_eq!(more.observe_at(3, t0), 3);
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
