//! Per-endpoint limits, so one tenant's endpoint cannot take the whole worker: a cap on
//! concurrent attempts per endpoint, a circuit breaker that stops making attempts to an
//! endpoint that keeps failing, then probes it with one, and a ramp that brings a recovered
//! endpoint back to its cap gradually.
//!
//! An endpoint is what a subscription points at: scheme, host, port and path ([`EndpointKey`]).
//! Many endpoints share a host (hooks.slack.com, one SaaS's ingestion host for all its
//! customers), and one customer's broken path must not stop deliveries to the others, so health
//! is per endpoint. A separate cap per host (`endpoints.max_concurrent_per_host`) protects a
//! shared host from the sum of its endpoints; it never opens a breaker.
//!
//! An envelope that cannot be attempted (its endpoint or host at its cap, the breaker open, or
//! the endpoint at its recovery limit) is *deferred* at once: waiting for a slot would hold a
//! slot of the lane, shared with every other tenant, for an endpoint that is slow or down. It
//! moves to a tier without an HTTP request; a deferral is not an attempt, and the delivery
//! horizon ends an envelope that is deferred for too long.
//!
//! An attempt holds its lane slot until it ends, so on a shared lane one endpoint's attempts
//! may hold at most `endpoints.lane_share` of that lane's prefetch ([`LaneQuota`]): an endpoint
//! that hangs at its cap would otherwise leave a shard (whose prefetch is a fraction of the
//! budget) little to move the tenants behind it. Beyond it a delivery is deferred as busy.
//!
//! When a breaker closes, the envelopes held back during the outage (in the tiers, or parked)
//! come back together. Rather than meet them with its whole cap, the endpoint gets a [`Ramp`]:
//! a limit that starts at `endpoints.recovery_start`, grows by one with each success and halves
//! with each failure (AIMD, as TCP's congestion window and adaptive concurrency limiters do),
//! and ends when it reaches the cap. An envelope over that limit is deferred as busy: the
//! endpoint is up, so it is paced, not held back as during the outage.
//!
//! An endpoint may also have a rate limit (`rate = "50/s"` on its subscription, or
//! `endpoints.rate`), enforced with a [`Gcra`]: a delivery over it is deferred as busy at once,
//! like one over the cap, and never waits in the lane.
//!
//! One exception to deferring at once: an endpoint that answers fast (its attempts take at
//! most `endpoints.busy_wait`, 20 ms by default, and it made progress within that) is busy only
//! for a moment, so a delivery that finds its cap full may wait up to `busy_wait` for a slot
//! ([`Endpoints::admit_or_wait`]) when its turn should come within that (the deliveries already
//! waiting, the endpoint's latency and its cap tell). Deferring those would cost a
//! confirmed publish, an ack and a quarter of a second each, which for a fast endpoint fed by
//! a deep lane is most of the work; the wait holds a lane slot no longer than an attempt to
//! that endpoint does. [`may_wait`] decides.
//!
//! A busy deferral waits in a deferral queue of a fraction of a second, unless the endpoint is
//! stuck (its slots held by attempts that do not answer), which is told by when it last made
//! progress and how long its attempts take ([`DeferCause::Busy`]); the choice is
//! [`crate::delivery::route::defer`]'s.
//!
//! Caps and rate limits are the fleet's, not each worker's: with several workers each takes its
//! share ([`Fleet`]). A cap of `cap` permits is held in a semaphore, and one attempt weighs as
//! many permits as there are workers, so a worker makes `cap / workers` attempts at once.
//!
//! - [`breaker`]: the circuit breaker.
//! - [`ramp`]: the climb back to the cap after recovery.
//! - [`health`]: one endpoint's breaker, ramp and latency together.
//! - [`slots`]: a slot for one attempt, and an endpoint's share of a lane.
//! - [`deferral`]: why an attempt was not made, and when a delivery may wait instead.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::info;

use crate::config::EndpointConfig;
use crate::delivery::fleet::{Fleet, Gcra};
use crate::delivery::route::DeferCause;
use crate::units::Rate;

mod breaker;
mod deferral;
mod health;
mod ramp;
mod slots;

pub use breaker::{Admit, Breaker, HealthSignal};
pub use deferral::{Deferral, may_wait, wait_is_short};
use health::{Health, RampChange};
pub use ramp::Ramp;
use slots::{Held, Waiting};
pub use slots::{LaneQuota, Slot, is_endpoint_failure};

/// How far ahead busy deferrals' turns are booked unless the ladder says
/// ([`Endpoints::with_turns_ahead`]): the default ladder's longest deferral queue.
const DEFAULT_TURNS_AHEAD: Duration = Duration::from_secs(5);

struct EndpointsInner {
    config: EndpointConfig,
    limits: Mutex<HashMap<(EndpointKey, u32), Arc<Semaphore>>>,
    /// The per-host caps, by `host:port`.
    host_limits: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Each endpoint's share of each shared lane ([`LaneQuota`]), by lane, endpoint and size.
    lane_limits: Mutex<HashMap<(String, EndpointKey, u32), Arc<Semaphore>>>,
    /// The rate limiters, by endpoint and rate (the bits of its events per second): as with
    /// caps, a subscription's own rate is its own budget.
    rates: Mutex<HashMap<(EndpointKey, u64), Gcra>>,
    /// The live worker count, which sets this worker's share of every cap and rate.
    fleet: Fleet,
    health: Mutex<HashMap<EndpointKey, Health>>,
    /// Health changes not yet announced; the dispatcher takes them ([`Endpoints::take_signals`]).
    signals: Mutex<Vec<HealthSignal>>,
    /// Endpoints ramping up now ([`Endpoints::recovering`]).
    recovering: AtomicUsize,
    /// How far ahead turns are booked: the longest deferral queue's delay.
    turns_ahead: Duration,
    /// The longest a breaker stays open before a probe: the ladder's shortest scheduled wait,
    /// so an envelope's next scheduled retry always finds the probe due
    /// ([`Endpoints::with_longest_open`]).
    longest_open: Duration,
    /// The system's, or a simulation's ([`Endpoints::with_clock`]).
    clock: crate::units::Clock,
}

impl EndpointsInner {
    /// Books a delivery deferred from a busy endpoint's full cap a turn after those booked
    /// before it, one attempt's time per slot later, and says how long until that turn. Its
    /// deferral queue is chosen by it, so a backlog far above the cap comes back spread over
    /// the endpoint's pace, not all at once (when all but a cap's worth would be deferred
    /// again, a deferral queue's delay later). Bounded by `turns_ahead`: a delivery back
    /// before its turn books again, and bookings must not run away from the endpoint's pace.
    /// Zero (not booked) while no attempt has finished to tell the pace.
    fn book_turn(&self, key: &EndpointKey, slots: u32, now: Instant) -> Duration {
        let mut all = self.lock_health();
        let Some(health) = all.get_mut(key) else {
            return Duration::ZERO;
        };
        if health.latency.is_zero() {
            return Duration::ZERO;
        }
        let from = health.turns_until.filter(|t| *t > now).unwrap_or(now);
        let turn = (from + health.latency / slots.max(1)).min(now + self.turns_ahead);
        health.turns_until = Some(turn);
        turn.saturating_duration_since(now)
    }

    fn signal(&self, signal: HealthSignal) {
        self.signals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(signal);
    }

    fn lock_health(&self) -> std::sync::MutexGuard<'_, HashMap<EndpointKey, Health>> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place in `key`'s share of the lane `quota` names (none without a quota), or the size
    /// of that share when it is full.
    fn lane_permit(
        &self,
        key: &EndpointKey,
        quota: Option<LaneQuota<'_>>,
    ) -> Result<Option<OwnedSemaphorePermit>, u32> {
        let Some(semaphore) = self.lane_limit(key, quota) else {
            return Ok(None);
        };
        let most = quota.map_or(1, |q| q.most.max(1));
        semaphore.try_acquire_owned().map(Some).map_err(|_| most)
    }

    /// The semaphore of `key`'s share of the lane `quota` names.
    fn lane_limit(
        &self,
        key: &EndpointKey,
        quota: Option<LaneQuota<'_>>,
    ) -> Option<Arc<Semaphore>> {
        let LaneQuota { lane, most } = quota?;
        let most = most.max(1);
        let mut limits = self.lane_limits.lock().unwrap_or_else(|p| p.into_inner());
        Some(Arc::clone(
            limits
                .entry((lane.to_owned(), key.clone(), most))
                .or_insert_with(|| Arc::new(Semaphore::new(most as usize))),
        ))
    }

    /// The semaphore of `key`'s cap of `cap` permits.
    fn limit(&self, key: &EndpointKey, cap: u32) -> Arc<Semaphore> {
        let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            limits
                .entry((key.clone(), cap))
                .or_insert_with(|| Arc::new(Semaphore::new(cap as usize))),
        )
    }
}

/// Every endpoint's cap, breaker and ramp, shared by all deliveries.
#[derive(Clone)]
pub struct Endpoints(Arc<EndpointsInner>);

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

/// Drops the semaphores nobody holds: each has all its permits, as a new one would (a permit,
/// or a delivery waiting for one, holds a clone of its `Arc`).
fn forget_idle<K>(map: &Mutex<HashMap<K, Arc<Semaphore>>>) {
    map.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|_, s| Arc::strong_count(s) > 1);
}

/// How many entries [`Endpoints`] keeps, by map (the worker's `hookrelay_worker_cache_entries`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointEntries {
    pub health: usize,
    /// Of those, the endpoints whose breaker is open or probing.
    pub open: usize,
    pub limits: usize,
    pub host_limits: usize,
    pub lane_limits: usize,
    pub rates: usize,
}

/// The endpoint a subscription points at, as caps and breakers know it: scheme, host, port and
/// path. The query is left out (it varies per customer far less often than it carries a
/// token), and so are credentials and the fragment, which do not name another endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    /// `scheme://host:port/path`: never shown, since the path may be a secret (Slack's is).
    endpoint: String,
    /// `host:port`, the per-host cap's key.
    host: String,
}

impl EndpointKey {
    pub fn of(url: &reqwest::Url) -> Self {
        let host = format!(
            "{}:{}",
            url.host_str().unwrap_or_default(),
            crate::subscriptions::destination::port(url).unwrap_or(0)
        );
        Self {
            endpoint: format!("{}://{host}{}", url.scheme(), url.path()),
            host,
        }
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// How logs, errors and metrics name the endpoint: `host:port#` and a hash of the whole
    /// key, so two paths of one host are told apart without showing either.
    pub fn label(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.endpoint.as_bytes());
        format!(
            "{}#{:02x}{:02x}{:02x}{:02x}",
            self.host, digest[0], digest[1], digest[2], digest[3]
        )
    }
}

impl Endpoints {
    pub fn new(config: EndpointConfig) -> Self {
        Self(Arc::new(EndpointsInner {
            config,
            limits: Mutex::new(HashMap::new()),
            host_limits: Mutex::new(HashMap::new()),
            lane_limits: Mutex::new(HashMap::new()),
            rates: Mutex::new(HashMap::new()),
            fleet: Fleet::default(),
            signals: Mutex::new(Vec::new()),
            health: Mutex::new(HashMap::new()),
            recovering: AtomicUsize::new(0),
            turns_ahead: DEFAULT_TURNS_AHEAD,
            longest_open: Duration::MAX,
            clock: crate::units::Clock::system(),
        }))
    }

    /// Judges admissions and results by `clock` (a simulation's) instead of the system's.
    pub fn with_clock(mut self, clock: crate::units::Clock) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.clock = clock;
        }
        self
    }

    /// A worker's endpoints on `ladder`: turns booked at most its longest deferral queue
    /// ahead, breakers open at most its shortest scheduled wait.
    pub fn for_ladder(config: EndpointConfig, ladder: &crate::contract::ladder::Ladder) -> Self {
        Self::new(config)
            .with_turns_ahead(ladder.longest_deferral())
            .with_longest_open(ladder.shortest_wait())
    }

    /// Keeps every breaker's open period (its cool-down, and the wait for a probe that never
    /// reports) at most `most`: the ladder's shortest scheduled wait. A cool-down longer than the
    /// ladder's waits would defer every envelope past its next scheduled retry and, on a short
    /// ladder, past its horizon, so a retry schedule would be cancelled by the breaker.
    pub fn with_longest_open(mut self, most: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.longest_open = most;
        }
        self
    }

    /// Books busy deferrals' turns at most `most` ahead: the ladder's longest deferral queue.
    pub fn with_turns_ahead(mut self, most: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.turns_ahead = most.max(Duration::from_millis(1));
        }
        self
    }

    /// The live worker count this worker's shares follow; the management poll updates it.
    pub fn fleet(&self) -> Fleet {
        self.0.fleet.clone()
    }

    /// How many endpoints are ramping up after an outage now.
    pub fn recovering(&self) -> usize {
        self.0.recovering.load(Ordering::Relaxed)
    }

    /// How many entries each of its maps holds now.
    pub fn entries(&self) -> EndpointEntries {
        let inner = &self.0;
        // Counted under the health lock alone: it is released before the next is taken.
        let (health, open) = {
            let health = inner.lock_health();
            let open = health.values().filter(|h| h.breaker.open_since.is_some());
            (health.len(), open.count())
        };
        EndpointEntries {
            health,
            open,
            limits: inner.limits.lock().unwrap_or_else(|p| p.into_inner()).len(),
            host_limits: inner
                .host_limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len(),
            lane_limits: inner
                .lane_limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len(),
            rates: inner.rates.lock().unwrap_or_else(|p| p.into_inner()).len(),
        }
    }

    /// Forgets what no attempt needs: the health of endpoints `live` does not hold and nothing
    /// is out to or waiting for, and every cap, share and rate that is idle. An idle one is
    /// what a new one would be (a semaphore nobody holds has all its permits, a rate whose next
    /// conforming moment has passed admits at once), so forgetting it changes no decision,
    /// while keeping it would grow the worker with every endpoint, cap and rate ever used.
    pub fn retain_live(&self, live: &HashSet<EndpointKey>) {
        let inner = &self.0;
        let now = inner.clock.now();
        {
            let mut health = inner.lock_health();
            let mut ramps_dropped = 0;
            health.retain(|key, h| {
                let keep = live.contains(key) || h.in_flight > 0 || h.waiting > 0;
                if !keep && h.ramp.is_some() {
                    ramps_dropped += 1;
                }
                keep
            });
            inner.recovering.fetch_sub(ramps_dropped, Ordering::Relaxed);
        }
        forget_idle(&inner.limits);
        forget_idle(&inner.host_limits);
        forget_idle(&inner.lane_limits);
        inner
            .rates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, gcra| !gcra.is_idle(now));
    }

    /// The health changes since the last call, oldest first.
    pub fn take_signals(&self) -> Vec<HealthSignal> {
        std::mem::take(&mut *self.0.signals.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A slot at `url`'s endpoint and its host, now or never: unless the endpoint's breaker is
    /// open, it is recovering with its ramp's limit in flight, either cap is full, or its rate
    /// limit allows no request now, in which case the delivery is deferred at once rather than
    /// wait inside its lane. `cap` and `rate` override the configured per-endpoint ones; each
    /// is the fleet's, of which this worker takes its share.
    pub fn admit(
        &self,
        url: &reqwest::Url,
        cap: Option<u32>,
        rate: Option<Rate>,
    ) -> Result<Slot, Deferral> {
        self.admit_holding(url, cap, rate, None, Held::default())
    }

    /// [`Endpoints::admit`], except that a delivery finding the endpoint's own cap full waits
    /// up to `endpoints.busy_wait` for a slot when [`may_wait`] says the endpoint answers fast
    /// and [`wait_is_short`] says its turn should come within that. The breaker, the ramp, the
    /// host's cap and the rate are checked again after the wait.
    ///
    /// With a `quota`, the endpoint's share of the delivery's lane is a limit too, waited for
    /// on the same terms as its cap. A delivery deferred from either gets a turn booked at the
    /// endpoint's pace.
    pub async fn admit_or_wait(
        &self,
        url: &reqwest::Url,
        cap: Option<u32>,
        rate: Option<Rate>,
        quota: Option<LaneQuota<'_>>,
    ) -> Result<Slot, Deferral> {
        let mut admitted = self.admit_or_wait_unbooked(url, cap, rate, quota).await;
        if let Err(
            Deferral::OverCap {
                cap: slots,
                busy: DeferCause::Busy { turn_in, .. },
                ..
            }
            | Deferral::OverLaneShare {
                most: slots,
                busy: DeferCause::Busy { turn_in, .. },
                ..
            },
        ) = &mut admitted
        {
            *turn_in = self
                .0
                .book_turn(&EndpointKey::of(url), *slots, self.0.clock.now());
        }
        admitted
    }

    async fn admit_or_wait_unbooked(
        &self,
        url: &reqwest::Url,
        cap: Option<u32>,
        rate: Option<Rate>,
        quota: Option<LaneQuota<'_>>,
    ) -> Result<Slot, Deferral> {
        let deferral = match self.admit_holding(url, cap, rate, quota, Held::default()) {
            Err(deferral @ (Deferral::OverCap { .. } | Deferral::OverLaneShare { .. })) => deferral,
            other => return other,
        };
        let busy_wait = self.0.config.busy_wait;
        if !may_wait(busy_wait, deferral.cause()) {
            return Err(deferral);
        }
        let key = EndpointKey::of(url);
        let cap = cap.unwrap_or(self.0.config.max_concurrent).max(1);
        let fleet = &self.0.fleet;
        {
            let mut all = self.0.lock_health();
            let Some(health) = all.get_mut(&key) else {
                return Err(deferral);
            };
            let slots = match &deferral {
                Deferral::OverLaneShare { most, .. } => *most,
                _ => fleet.share(cap),
            };
            if !wait_is_short(busy_wait, health.latency, health.waiting, slots) {
                return Err(deferral);
            }
            health.waiting += 1;
        }
        let waiting = Waiting {
            endpoints: &self.0,
            key: &key,
        };
        // Wait for what was full: the endpoint's cap, or its share of the lane.
        let on_lane = matches!(deferral, Deferral::OverLaneShare { .. });
        let (semaphore, weight) = match self.0.lane_limit(&key, quota) {
            Some(lane) if on_lane => (lane, 1),
            _ => (self.0.limit(&key, cap), fleet.weight(cap)),
        };
        let acquired = tokio::time::timeout(busy_wait, semaphore.acquire_many_owned(weight)).await;
        drop(waiting);
        let Ok(Ok(permit)) = acquired else {
            return Err(deferral);
        };
        let held = if on_lane {
            Held {
                cap: None,
                lane: Some(permit),
            }
        } else {
            Held {
                cap: Some(permit),
                lane: None,
            }
        };
        self.admit_holding(url, Some(cap), rate, quota, held)
    }

    /// The admission of [`Endpoints::admit`], within `quota` if given; with what `held` holds
    /// (a permit of the endpoint's cap or of its share of the lane) already taken.
    fn admit_holding(
        &self,
        url: &reqwest::Url,
        cap: Option<u32>,
        rate: Option<Rate>,
        quota: Option<LaneQuota<'_>>,
        held: Held,
    ) -> Result<Slot, Deferral> {
        let key = EndpointKey::of(url);
        let config = &self.0.config;
        let fleet = &self.0.fleet;
        let cap = cap.unwrap_or(config.max_concurrent).max(1);
        let rate = rate.or(config.rate);
        let now = self.0.clock.now();
        let (admitted, quarantine, ramp_full, busy, disable, evidence) = {
            let mut all = self.0.lock_health();
            let health = all.entry(key.clone()).or_insert_with(|| {
                Health::new(
                    Breaker::new(
                        config.breaker_failures,
                        config.breaker_cooldown.min(self.0.longest_open),
                    )
                    .with_window(config.breaker_window),
                )
            });
            let admitted = health.breaker.admit(now);
            // Seen at the deliveries that reach it: an endpoint nobody sends to is nobody's worry.
            let quarantine = health.breaker.quarantine_due(now, config.quarantine_after);
            let disable = health.breaker.disable_due(now, config.disable_after);
            // A probe has no ramp (the ramp starts when a probe closes the breaker).
            let ramp_full = match health.ramp {
                Some(ramp)
                    if admitted == Admit::Allowed
                        && health.in_flight >= fleet.share(ramp.limit()) =>
                {
                    Some(fleet.share(ramp.limit()))
                }
                _ => None,
            };
            let busy = health.busy(now);
            // Counted in now, under the lock, so two deliveries cannot both take the last place.
            if !matches!(admitted, Admit::Refused { .. }) && ramp_full.is_none() {
                if health.in_flight == 0 {
                    health.progress = Some(now);
                }
                health.in_flight += 1;
            }
            (
                admitted,
                quarantine,
                ramp_full,
                busy,
                disable,
                (health.failed_try_ms, health.failed_in_a_row),
            )
        };
        if let Some(open_for) = disable {
            self.0.signal(HealthSignal::DisableDue {
                key: key.clone(),
                open_for,
            });
        }
        if let Some(open_for) = quarantine {
            self.0.signal(HealthSignal::Quarantined {
                endpoint: key.label(),
                open_for,
            });
        }
        if let Admit::Refused { retry_in } = admitted {
            return Err(Deferral::BreakerOpen {
                endpoint: key.label(),
                retry_in,
                failed_try_ms: evidence.0,
                failed_in_a_row: evidence.1,
            });
        }
        if let Some(limit) = ramp_full {
            return Err(Deferral::Recovering {
                endpoint: key.label(),
                limit,
                busy,
            });
        }
        let host_cap = config.max_concurrent_per_host.max(1);
        let host_semaphore = {
            let mut hosts = self.0.host_limits.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(
                hosts
                    .entry(key.host.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(host_cap as usize))),
            )
        };
        // The endpoint's slot first: an endpoint at its own cap takes no place in its lane's
        // share or host slot that its neighbours could use. The rate last: a request it counts
        // is one that goes out.
        let permit = match held.cap {
            Some(permit) => Ok(permit),
            None => self
                .0
                .limit(&key, cap)
                .try_acquire_many_owned(fleet.weight(cap)),
        };
        let acquired = permit
            .map_err(|_| Deferral::OverCap {
                endpoint: key.label(),
                cap: fleet.share(cap),
                busy,
            })
            .and_then(|permit| {
                let lane_permit =
                    match held.lane {
                        Some(permit) => Some(permit),
                        None => self.0.lane_permit(&key, quota).map_err(|most| {
                            Deferral::OverLaneShare {
                                endpoint: key.label(),
                                lane: quota.map(|q| q.lane.to_owned()).unwrap_or_default(),
                                most,
                                busy,
                            }
                        })?,
                    };
                let host_permit = host_semaphore
                    .try_acquire_many_owned(fleet.weight(host_cap))
                    .map_err(|_| Deferral::HostOverCap {
                        host: key.host.clone(),
                        cap: fleet.share(host_cap),
                    })?;
                self.pace(&key, rate, now)?;
                Ok((permit, lane_permit, host_permit))
            });
        match acquired {
            Ok((permit, lane_permit, host_permit)) => Ok(Slot {
                key,
                cap,
                _permit: permit,
                _host_permit: host_permit,
                _lane_permit: lane_permit,
                endpoints: Arc::clone(&self.0),
                finished: false,
                started: now,
                started_ms: self.0.clock.now_ms(),
            }),
            Err(deferral) => {
                if let Some(health) = self.0.lock_health().get_mut(&key) {
                    health.in_flight = health.in_flight.saturating_sub(1);
                    // A probe that could not go out must not leave the breaker waiting for it. (No
                    // request was made: it is no evidence against the endpoint.)
                    if admitted == Admit::Probe {
                        health.breaker.record(true, now, now);
                    }
                }
                Err(deferral)
            }
        }
    }
}

impl Endpoints {
    /// Counts a request against `key`'s rate limit, if it has one, or defers it.
    fn pace(&self, key: &EndpointKey, rate: Option<Rate>, now: Instant) -> Result<(), Deferral> {
        let Some(rate) = rate else {
            return Ok(());
        };
        let workers = self.0.fleet.workers();
        let mut rates = self.0.rates.lock().unwrap_or_else(|p| p.into_inner());
        rates
            .entry((key.clone(), rate.per_second().to_bits()))
            .or_insert_with(|| Gcra::new(now))
            .admit(rate, workers, now)
            .map_err(|_| Deferral::OverRate {
                endpoint: key.label(),
                rate: rate.to_string(),
                workers,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::route::AttemptResult;

    #[test]
    fn what_no_live_endpoint_uses_is_forgotten_and_what_is_held_is_kept() {
        let (clock, set) = crate::units::Clock::set(1_000);
        let endpoints = Endpoints::new(EndpointConfig::default()).with_clock(clock);
        let urls: Vec<reqwest::Url> = (0..50)
            .map(|i| format!("https://hooks.example/v{i}").parse().unwrap())
            .collect();
        let ok = AttemptResult::Response {
            status: 204,
            retry_after: None,
        };
        for (i, url) in urls.iter().enumerate() {
            let n = u32::try_from(i).unwrap();
            let rate: Rate = format!("{}/s", 10 + n).parse().unwrap();
            let slot = endpoints.admit(url, Some(5 + n), Some(rate)).unwrap();
            set.advance_to(Duration::from_millis(10 * u64::from(n + 1)));
            slot.finish(&ok);
        }
        // One attempt still out to an endpoint no subscription points at any more.
        let held = endpoints.admit(&urls[0], Some(5), None).unwrap();
        let before = endpoints.entries();
        assert_eq!((before.health, before.limits, before.rates), (50, 50, 50));

        let live: HashSet<EndpointKey> = [EndpointKey::of(&urls[49])].into();
        // The rates' next conforming moments have passed: each is as a new one would be.
        set.advance_to(Duration::from_secs(2));
        endpoints.retain_live(&live);
        let after = endpoints.entries();
        assert_eq!(
            (after.health, after.limits, after.host_limits, after.rates),
            (2, 1, 1, 0),
            "the live endpoint's health, and the held attempt's health, cap and host"
        );
        held.finish(&ok);
        endpoints.retain_live(&live);
        assert_eq!(
            endpoints.entries(),
            EndpointEntries {
                health: 1,
                ..EndpointEntries::default()
            }
        );
        // What the live endpoint learnt is kept: its latency books turns as before.
        assert!(
            !endpoints.0.lock_health()[&EndpointKey::of(&urls[49])]
                .latency
                .is_zero()
        );
    }

    #[test]
    fn a_breaker_is_open_no_longer_than_the_ladders_shortest_wait_and_says_when_it_last_failed() {
        let endpoints = Endpoints::new(EndpointConfig {
            breaker_failures: 1,
            breaker_window: Duration::ZERO,
            breaker_cooldown: Duration::from_secs(30),
            ..EndpointConfig::default()
        })
        .with_longest_open(Duration::from_secs(1));
        let url = reqwest::Url::parse("https://hooks.example/a").unwrap();
        let before = crate::units::now_ms();
        endpoints
            .admit(&url, None, None)
            .unwrap()
            .finish(&AttemptResult::Timeout);
        match endpoints.admit(&url, None, None).err().unwrap() {
            Deferral::BreakerOpen {
                retry_in,
                failed_try_ms,
                failed_in_a_row,
                ..
            } => {
                assert!(retry_in <= Duration::from_secs(1), "{retry_in:?}");
                assert_eq!(failed_in_a_row, 1);
                let tried = failed_try_ms.expect("the failed attempt is evidence");
                assert!(tried >= before && tried <= crate::units::now_ms());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            endpoints.entries().open,
            1,
            "hookrelay_endpoints_open counts it"
        );
        // A 4xx is no evidence against the endpoint; neither is a success.
        let other = reqwest::Url::parse("https://hooks.example/b").unwrap();
        endpoints
            .admit(&other, None, None)
            .unwrap()
            .finish(&AttemptResult::Response {
                status: 404,
                retry_after: None,
            });
        let key = EndpointKey::of(&other);
        assert_eq!(endpoints.0.lock_health()[&key].failed_try_ms, None);
        assert_eq!(
            (endpoints.entries().health, endpoints.entries().open),
            (2, 1)
        );
    }

    #[test]
    fn the_cap_defers_what_cannot_get_a_slot_at_once() {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: 2,
            ..EndpointConfig::default()
        });
        let url = reqwest::Url::parse("https://hooks.example/a").unwrap();
        let a = endpoints.admit(&url, None, None).unwrap();
        let _b = endpoints.admit(&url, None, None).unwrap();
        let third = endpoints.admit(&url, None, None).err().unwrap();
        assert_eq!(third.kind(), "concurrency");
        let quiet = |d: &Deferral| match d.cause() {
            DeferCause::Busy { quiet_for, .. } => quiet_for,
            other => panic!("busy, not held back: {other:?}"),
        };
        // The endpoint just started its attempts: busy, not stuck. (A second apart, so a loaded
        // machine's scheduling delays between two lines cannot blur the two states.)
        let pause = Duration::from_secs(1);
        assert!(quiet(&third) < pause, "{third:?}");
        // No answer since: the quiet grows; an answer (any) is progress again.
        std::thread::sleep(pause);
        let stuck = endpoints.admit(&url, None, None).err().unwrap();
        assert!(quiet(&stuck) >= pause, "{stuck:?}");
        assert!(
            third
                .to_string()
                .starts_with("deferred: hooks.example:443#"),
            "{third}"
        );
        assert!(third.to_string().ends_with(" had 2 attempts in flight"));
        // A subscription's own cap is its own budget.
        let _own = endpoints.admit(&url, Some(1), None).unwrap();
        a.finish(&AttemptResult::Timeout);
        let _c = endpoints.admit(&url, None, None).unwrap();
        let answered = endpoints.admit(&url, None, None).err().unwrap();
        assert!(quiet(&answered) < pause, "{answered:?}");
    }

    #[tokio::test]
    async fn an_endpoint_holds_at_most_its_share_of_a_lane_and_other_lanes_keep_theirs() {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: 10,
            ..EndpointConfig::default()
        });
        let url = reqwest::Url::parse("https://hooks.example/a").unwrap();
        let other = reqwest::Url::parse("https://hooks.example/b").unwrap();
        let shard = |most| {
            Some(LaneQuota {
                lane: "hookrelay.ready.first-s0",
                most,
            })
        };
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(
                endpoints
                    .admit_or_wait(&url, None, None, shard(3))
                    .await
                    .unwrap(),
            );
        }
        let over = endpoints
            .admit_or_wait(&url, None, None, shard(3))
            .await
            .err()
            .unwrap();
        assert_eq!(over.kind(), "lane_share");
        assert!(matches!(over.cause(), DeferCause::Busy { .. }), "{over:?}");
        assert!(
            over.to_string().ends_with(
                " had 3 attempts in flight from hookrelay.ready.first-s0, its share of that lane"
            ),
            "{over}"
        );
        // Another endpoint of the same lane, and the same endpoint in another lane or a lane
        // without a limit, each have their own room; the endpoint's cap still counts them all.
        let _b = endpoints
            .admit_or_wait(&other, None, None, shard(3))
            .await
            .unwrap();
        let another_lane = Some(LaneQuota {
            lane: "hookrelay.ready.retry-s0",
            most: 3,
        });
        held.push(
            endpoints
                .admit_or_wait(&url, None, None, another_lane)
                .await
                .unwrap(),
        );
        for _ in 0..6 {
            held.push(
                endpoints
                    .admit_or_wait(&url, None, None, None)
                    .await
                    .unwrap(),
            );
        }
        let capped = endpoints.admit(&url, None, None).err().unwrap();
        assert_eq!(
            capped.kind(),
            "concurrency",
            "the cap is still the endpoint's"
        );
        // An attempt that ends gives its place in the lane's share back, once the cap has room.
        held.remove(0).finish(&AttemptResult::Timeout);
        let _again = endpoints
            .admit_or_wait(&url, None, None, shard(3))
            .await
            .unwrap();
        assert_eq!(
            endpoints
                .admit_or_wait(&url, Some(20), None, shard(3))
                .await
                .err()
                .unwrap()
                .kind(),
            "lane_share",
            "a subscription's own cap does not lift the lane's share"
        );
    }

    #[test]
    fn each_worker_takes_its_share_of_the_cap_and_the_rate() {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: 10,
            ..EndpointConfig::default()
        });
        let url = reqwest::Url::parse("https://hooks.example/a").unwrap();
        let fleet = endpoints.fleet();
        fleet.observe(2);
        let (slots, deferral) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 5, "half of 10");
        assert_eq!(deferral.kind(), "concurrency");
        assert!(deferral.to_string().ends_with(" had 5 attempts in flight"));
        // The other worker leaves: attempts out keep the weight they were admitted with, and
        // as they finish the survivor's share is the whole cap.
        fleet.observe(1);
        assert_eq!(fill(&endpoints, &url).0.len(), 0);
        drop(slots);
        assert_eq!(fill(&endpoints, &url).0.len(), 10);

        let rate: Rate = "20/s".parse().unwrap();
        let limited = reqwest::Url::parse("https://hooks.example/limited").unwrap();
        fleet.observe(2);
        assert!(endpoints.admit(&limited, None, Some(rate)).is_ok());
        let over = endpoints.admit(&limited, None, Some(rate)).err().unwrap();
        assert_eq!(over.kind(), "rate");
        assert_eq!(
            over.cause(),
            DeferCause::OverRate,
            "ours, not the endpoint's: never stuck, never escalated"
        );
        assert!(
            over.to_string()
                .ends_with(" is over its rate limit of 20/s (shared by 2 workers)"),
            "{over}"
        );
    }

    #[test]
    fn paths_of_one_host_have_their_own_breakers_and_share_the_host_cap() {
        let endpoints = Endpoints::new(EndpointConfig {
            breaker_failures: 1,
            breaker_window: Duration::ZERO,
            max_concurrent_per_host: 2,
            ..EndpointConfig::default()
        });
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let flaky = url("https://hooks.example/flaky");
        let ok = url("https://hooks.example/ok?token=1");
        endpoints
            .admit(&flaky, None, None)
            .unwrap()
            .finish(&AttemptResult::Timeout);
        let refused = endpoints.admit(&flaky, None, None).err().unwrap();
        assert_eq!(refused.kind(), "breaker_open");
        // Another path of the same host is another endpoint.
        let a = endpoints.admit(&ok, None, None).unwrap();
        let _b = endpoints
            .admit(&url("https://hooks.example/ok"), None, None)
            .unwrap();
        // Two in flight on the host: a third path waits for the host, not for its own cap.
        let third = endpoints.admit(&url("https://hooks.example/c"), None, None);
        assert_eq!(third.err().unwrap().kind(), "host_concurrency");
        a.finish(&AttemptResult::Response {
            status: 204,
            retry_after: None,
        });
        assert!(
            endpoints
                .admit(&url("https://hooks.example/c"), None, None)
                .is_ok()
        );
        // The label tells paths apart without showing them.
        let (k1, k2) = (EndpointKey::of(&flaky), EndpointKey::of(&ok));
        assert_ne!(k1.label(), k2.label());
        assert!(!k1.label().contains("flaky"));
        assert_eq!(k1.host(), "hooks.example:443");
    }

    const OK: AttemptResult = AttemptResult::Response {
        status: 204,
        retry_after: None,
    };

    /// An endpoint whose breaker opens after 2 failures, for a cool-down of zero.
    fn endpoint(cap: u32, recovery_start: u32) -> (Endpoints, reqwest::Url) {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: cap,
            breaker_failures: 2,
            breaker_window: Duration::ZERO,
            breaker_cooldown: Duration::ZERO,
            recovery_start,
            ..EndpointConfig::default()
        });
        (
            endpoints,
            reqwest::Url::parse("https://hooks.example/a").unwrap(),
        )
    }

    /// Opens `url`'s breaker with failures.
    fn open(endpoints: &Endpoints, url: &reqwest::Url) {
        for _ in 0..2 {
            endpoints
                .admit(url, None, None)
                .unwrap()
                .finish(&AttemptResult::Timeout);
        }
    }

    /// Admits until the endpoint defers; returns the slots and the deferral.
    fn fill(endpoints: &Endpoints, url: &reqwest::Url) -> (Vec<Slot>, Deferral) {
        let mut slots = Vec::new();
        loop {
            match endpoints.admit(url, None, None) {
                Ok(slot) => slots.push(slot),
                Err(deferral) => return (slots, deferral),
            }
        }
    }

    #[test]
    fn a_recovered_endpoint_ramps_up_to_its_cap() {
        let (endpoints, url) = endpoint(6, 2);
        open(&endpoints, &url);
        assert_eq!(endpoints.recovering(), 0, "not while it is down");
        // The probe succeeds: the breaker closes and the ramp starts at 2, not at the cap.
        endpoints.admit(&url, None, None).unwrap().finish(&OK);
        assert_eq!(endpoints.recovering(), 1);
        let (slots, deferral) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 2);
        assert_eq!(deferral.kind(), "recovery");
        assert!(
            matches!(deferral.cause(), DeferCause::Busy { .. }),
            "paced, not held back"
        );
        assert!(
            deferral
                .to_string()
                .ends_with(" is allowed at most 2 attempts at once while it recovers"),
            "{deferral}"
        );
        // Each success lets one more out: 2 back, limit 4.
        for slot in slots {
            slot.finish(&OK);
        }
        let (slots, _) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 4);
        // A failure halves it; a 429 too, though the breaker does not count it.
        let mut slots = slots.into_iter();
        slots.next().unwrap().finish(&AttemptResult::Timeout);
        slots.next().unwrap().finish(&AttemptResult::Response {
            status: 429,
            retry_after: None,
        });
        assert_eq!(
            endpoints
                .admit(&url, None, None)
                .err()
                .map(|d| d.to_string()),
            Some(format!(
                "deferred: {} is allowed at most 1 attempts at once while it recovers",
                EndpointKey::of(&url).label()
            ))
        );
        // A slot dropped without a result gives its place back and teaches nothing.
        drop(slots.next());
        slots.next().unwrap().finish(&OK); // limit 2, none in flight
        let (slots, _) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 2);
        for slot in slots {
            slot.finish(&OK); // 3, then 4
        }
        let (slots, _) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 4);
        for slot in slots {
            slot.finish(&OK); // 5, then 6: the cap, where the ramp ends
        }
        assert_eq!(endpoints.recovering(), 0);
        let (slots, deferral) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 6);
        assert_eq!(deferral.kind(), "concurrency", "back to its cap");
    }

    #[test]
    fn an_endpoint_that_fails_again_starts_its_ramp_over() {
        let (endpoints, url) = endpoint(64, 1);
        open(&endpoints, &url);
        endpoints.admit(&url, None, None).unwrap().finish(&OK);
        for _ in 0..5 {
            endpoints.admit(&url, None, None).unwrap().finish(&OK);
        }
        let (slots, _) = fill(&endpoints, &url);
        assert_eq!(slots.len(), 6);
        drop(slots);
        open(&endpoints, &url);
        assert_eq!(endpoints.recovering(), 0, "down again");
        endpoints.admit(&url, None, None).unwrap().finish(&OK);
        assert_eq!(endpoints.recovering(), 1);
        assert_eq!(fill(&endpoints, &url).0.len(), 1, "from the start again");
    }

    #[test]
    fn without_a_ramp_a_recovered_endpoint_has_its_cap_at_once() {
        for (start, cap) in [(0, 4), (4, 4), (9, 4)] {
            let (endpoints, url) = endpoint(cap, start);
            open(&endpoints, &url);
            endpoints.admit(&url, None, None).unwrap().finish(&OK);
            assert_eq!(endpoints.recovering(), 0);
            assert_eq!(fill(&endpoints, &url).0.len(), cap as usize);
        }
    }

    /// Sets the moving average of `url`'s attempts, as if they had taken `ms` each.
    fn set_latency(endpoints: &Endpoints, url: &reqwest::Url, ms: u64) {
        endpoints
            .0
            .lock_health()
            .get_mut(&EndpointKey::of(url))
            .unwrap()
            .latency = Duration::from_millis(ms);
    }

    #[tokio::test]
    async fn a_fast_endpoints_full_share_of_a_lane_is_waited_for_on_the_caps_terms() {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: 10,
            busy_wait: Duration::from_millis(200),
            ..EndpointConfig::default()
        });
        let url = reqwest::Url::parse("https://fast.example/hook").unwrap();
        let lane = Some(LaneQuota {
            lane: "hookrelay.ready.first",
            most: 1,
        });
        let ok = AttemptResult::Response {
            status: 204,
            retry_after: None,
        };
        // Not yet heard from: a full share defers at once, as a full cap does.
        let first = endpoints
            .admit_or_wait(&url, None, None, lane)
            .await
            .unwrap();
        let deferred = endpoints.admit_or_wait(&url, None, None, lane).await;
        assert_eq!(deferred.err().unwrap().kind(), "lane_share");
        first.finish(&ok);
        // Fast now: the next delivery waits for the place given back, well within the cap.
        set_latency(&endpoints, &url, 50);
        let held = endpoints
            .admit_or_wait(&url, None, None, lane)
            .await
            .unwrap();
        let waiter = {
            let endpoints = endpoints.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let lane = Some(LaneQuota {
                    lane: "hookrelay.ready.first",
                    most: 1,
                });
                endpoints.admit_or_wait(&url, None, None, lane).await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.finish(&ok);
        let slot = waiter
            .await
            .unwrap()
            .expect("the waiter gets the place back");
        // Nobody gives it back: deferred at busy_wait, with a turn booked at the pace.
        let timed_out = endpoints.admit_or_wait(&url, None, None, lane).await;
        match timed_out.err().unwrap() {
            Deferral::OverLaneShare {
                busy: DeferCause::Busy { turn_in, .. },
                ..
            } => assert!(turn_in > Duration::ZERO, "a turn is booked"),
            other => panic!("a lane-share deferral: {other:?}"),
        }
        slot.finish(&ok);
    }

    #[tokio::test]
    async fn a_fast_endpoints_full_cap_is_waited_for_briefly_by_those_whose_turn_comes_within_the_wait()
     {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: 1,
            busy_wait: Duration::from_millis(200),
            ..EndpointConfig::default()
        });
        let url = reqwest::Url::parse("https://fast.example/hook").unwrap();
        let ok = AttemptResult::Response {
            status: 204,
            retry_after: None,
        };
        // Before any answer the endpoint's latency is unknown: a full cap defers at once.
        let first = endpoints.admit(&url, None, None).unwrap();
        let deferred = endpoints.admit_or_wait(&url, None, None, None).await;
        assert_eq!(deferred.err().unwrap().kind(), "concurrency");
        first.finish(&ok);
        // Now it has answered fast. One delivery holds the slot; the next waits and gets it
        // when the slot is given back. Its answers took about 150 ms here, so a third, whose
        // turn would come after about 300 ms, more than the wait allows, is deferred at once.
        set_latency(&endpoints, &url, 150);
        let held = endpoints.admit(&url, None, None).unwrap();
        let waiter = {
            let endpoints = endpoints.clone();
            let url = url.clone();
            tokio::spawn(async move { endpoints.admit_or_wait(&url, None, None, None).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let third = endpoints.admit_or_wait(&url, None, None, None).await;
        assert_eq!(third.err().unwrap().kind(), "concurrency");
        held.finish(&ok);
        let slot = waiter
            .await
            .unwrap()
            .expect("the waiter gets the slot given back");
        // Nobody gives it back this time: the wait ends at busy_wait with a deferral.
        let at = Instant::now();
        let timed_out = endpoints.admit_or_wait(&url, None, None, None).await;
        assert_eq!(timed_out.err().unwrap().kind(), "concurrency");
        assert!(at.elapsed() >= Duration::from_millis(200));
        slot.finish(&ok);
        // The waits are over: nothing is counted as waiting any more.
        let key = EndpointKey::of(&url);
        assert_eq!(endpoints.0.lock_health()[&key].waiting, 0);
    }

    #[tokio::test]
    async fn deferrals_from_a_full_cap_are_booked_turns_at_the_endpoints_pace() {
        let endpoints = Endpoints::new(EndpointConfig {
            max_concurrent: 2,
            busy_wait: Duration::ZERO,
            ..EndpointConfig::default()
        })
        .with_turns_ahead(Duration::from_millis(500));
        let url = reqwest::Url::parse("https://slow.example/hook").unwrap();
        let turn_in = |deferral: Deferral| match deferral.cause() {
            DeferCause::Busy { turn_in, .. } => turn_in,
            other => panic!("{other:?}"),
        };
        let ok = AttemptResult::Response {
            status: 204,
            retry_after: None,
        };
        // No answer yet, so no pace to book by.
        let a = endpoints.admit(&url, None, None).unwrap();
        let b = endpoints.admit(&url, None, None).unwrap();
        let unbooked = endpoints
            .admit_or_wait(&url, None, None, None)
            .await
            .err()
            .unwrap();
        assert_eq!(turn_in(unbooked), Duration::ZERO);
        a.finish(&ok);
        b.finish(&ok);
        // Answers take 100 ms and two go at once: a turn every 50 ms, each deferral the next,
        // up to the bound (a delivery back before its turn books again).
        set_latency(&endpoints, &url, 100);
        let _a = endpoints.admit(&url, None, None).unwrap();
        let _b = endpoints.admit(&url, None, None).unwrap();
        let mut turns = Vec::new();
        for _ in 0..12 {
            let deferral = endpoints
                .admit_or_wait(&url, None, None, None)
                .await
                .err()
                .unwrap();
            turns.push(turn_in(deferral).as_millis());
        }
        for (i, pair) in turns.windows(2).enumerate() {
            assert!(pair[1] >= pair[0], "turns only move on: {turns:?}");
            if pair[1] < 450 {
                assert!((40..=60).contains(&(pair[1] - pair[0])), "{i}: {turns:?}");
            }
        }
        assert!((40..=50).contains(&turns[0]), "{turns:?}");
        assert_eq!(*turns.last().unwrap(), 500, "bounded: {turns:?}");
    }
}
