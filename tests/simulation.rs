//! A deterministic simulation of a fleet of workers delivering through the ladder, on simulated
//! time: the pure parts of the worker driven together, as the worker drives them, with
//! generated ladders, breaker and cap settings, worker counts, endpoints and arrivals.
//!
//! What runs is hookrelay's own code: reading an envelope from its message
//! (`Envelope::from_delivery`), the routing decision (`route`), the fleet's count and its
//! settling (`Fleet`), admission with caps, rates, breakers and ramps (`Endpoints`, on a clock
//! the simulation sets), deferrals and the horizon (`defer`), the decision after an attempt
//! (`decide`) and what replaces a delivery in the broker (`settle::replacement`), whose copies
//! are read back as the worker reads them. What is simulated: the broker (lanes, tiers that
//! promote after their delay and a little jitter, parking queues), the worker's prefetch, its
//! joining the fleet (a live count at start, again once registered, then every `RECOUNT`), and
//! endpoints that fail the first k attempts of each event, fail at random, hang, answer 429 with
//! `Retry-After`, answer 410, or are healthy; events arrive in a burst or steadily; a
//! subscription may be paused and resumed.
//!
//! Checked on every generated case:
//! - nothing is lost: every event ends delivered or dead-lettered, none twice;
//! - the budget counts requests: a dead letter's attempts are the requests its endpoint saw;
//! - `exhausted` has the schedule's attempts; `horizon_expired` has fewer only on fresh
//!   evidence (a failed request to its endpoint that started after the envelope last went to
//!   wait), after its endpoint failed at least the schedule's attempts, and not before its
//!   horizon; `gone` follows a 410;
//! - an endpoint that fails each event's first k attempts, k no more than the schedule's retries
//!   (or answers 429 so), a healthy endpoint, and a paused then resumed subscription get every
//!   event delivered;
//! - a fleet started together never has more attempts out at an endpoint than its cap, nor
//!   more requests in any second than its rate allows the fleet.
//!
//! `PROPTEST_CASES` runs more cases; failing ones are kept in `simulation.proptest-regressions`
//! and run first next time. `SIM_TRACE=1` prints what each delivery met.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use lapin::BasicProperties;
use proptest::prelude::*;

use hookrelay::config::EndpointConfig;
use hookrelay::contract::envelope::{Envelope, NewEvent, endpoint_fingerprint};
use hookrelay::contract::headers;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::delivery::endpoint::{Endpoints, Slot, is_endpoint_failure};
use hookrelay::delivery::fleet::{JOIN_SETTLE, RECOUNT};
use hookrelay::delivery::lane::LaneKind;
use hookrelay::delivery::route::{AttemptResult, Outcome, Route, decide, defer, route};
use hookrelay::delivery::settle::{Replacement, replacement};
use hookrelay::ops::mover::Plan;
use hookrelay::subscriptions::{SecretRef, Subscription, Subscriptions};
use hookrelay::units::{Clock, Rate, SetClock};

const TENANT: &str = "acme";
const MAX_BODY: usize = 256 * 1024;

/// How an endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behavior {
    /// 503 to the first `k` requests it receives (an outage of k requests), 204 after.
    FailFirst(u32),
    /// 503 to the first `k` attempts of each event, 204 after.
    FailFirstOfEach(u32),
    /// 503 with this chance in a thousand, else 204.
    Random(u32),
    /// Never answers: each attempt ends at the request timeout.
    Hang,
    /// 429 with `Retry-After` to the first `k` attempts of each event, 204 after.
    TooMany {
        k: u32,
        retry_after_s: u64,
    },
    /// 410 Gone.
    Gone,
    Healthy,
}

#[derive(Debug, Clone)]
enum Arrival {
    Burst,
    Steady { every_ms: u64 },
}

#[derive(Debug, Clone)]
struct SubSpec {
    behavior: Behavior,
    /// Each answer takes from `latency_ms.0` to `latency_ms.1`.
    latency_ms: (u64, u64),
    events: usize,
    arrival: Arrival,
    max_concurrent: Option<u32>,
    rate_per_s: Option<u32>,
    /// Paused at the first, resumed at the second (ms).
    pause: Option<(u64, u64)>,
}

#[derive(Debug, Clone)]
struct Scenario {
    tiers_ms: Vec<u64>,
    /// Indexes into `tiers_ms`.
    schedule: Vec<usize>,
    deferral_queues: bool,
    endpoints: EndpointConfig,
    request_timeout_ms: u64,
    workers: usize,
    /// Workers join within this of each other (started together).
    skew_ms: u64,
    prefetch: usize,
    subs: Vec<SubSpec>,
    seed: u64,
}

/// A message as the broker holds it.
#[derive(Debug, Clone)]
struct Msg {
    props: BasicProperties,
    key: String,
    body: Bytes,
}

/// One request an endpoint received.
#[derive(Debug, Clone)]
struct Request {
    id: String,
    start_ms: u64,
    failed: bool,
    status: Option<u16>,
}

enum Ev {
    Arrive { sub: usize, n: usize },
    Promote(Box<Msg>),
    Finish(Box<Finish>),
    Join(usize),
    Count(usize),
    Pause(usize),
    Resume(usize),
}

struct Finish {
    worker: usize,
    msg: Msg,
    envelope: Envelope,
    slot: Slot,
    result: AttemptResult,
    sub: usize,
}

struct Worker {
    endpoints: Endpoints,
    joins_at: u64,
    registered: bool,
    /// Deliveries it holds (its prefetch).
    load: usize,
    /// Deliveries waiting for its count of the fleet to settle.
    held: Vec<(Msg, LaneKind)>,
}

struct Sim {
    s: Scenario,
    ladder: Ladder,
    horizon: Duration,
    set: Arc<SetClock>,
    base_ms: u64,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Ev>,
    subs: Vec<Subscription>,
    current: Subscriptions,
    urls: Vec<reqwest::Url>,
    workers: Vec<Worker>,
    next_worker: usize,
    first: VecDeque<Msg>,
    retry: VecDeque<Msg>,
    parked: Vec<Vec<Msg>>,
    rng: u64,
    /// Requests per endpoint (subscription index), and attempts out now.
    requests: Vec<Vec<Request>>,
    in_flight: Vec<u32>,
    seen: HashMap<(usize, String), u32>,
    delivered: BTreeMap<String, u32>,
    /// Dead letters: the event, the copy's properties, when (ms since the epoch, simulated).
    dead: Vec<(String, BasicProperties, u64)>,
    published: Vec<(usize, String)>,
    violations: Vec<String>,
}

impl Sim {
    fn new(s: Scenario) -> Self {
        let tiers: Vec<String> = s.tiers_ms.iter().map(|ms| format!("{ms}ms")).collect();
        let tiers: Vec<&str> = tiers.iter().map(String::as_str).collect();
        let schedule: Vec<&str> = s.schedule.iter().map(|i| tiers[*i]).collect();
        let mut ladder = Ladder::build("sim", QueueType::Quorum, &tiers, &schedule).unwrap();
        if !s.deferral_queues {
            ladder = ladder.with_deferrals(&[]).unwrap();
        }
        let horizon = ladder.horizon(s.endpoints.horizon);
        let base_ms = 1_800_000_000_000;
        let (clock, set) = Clock::set(base_ms);
        let urls: Vec<reqwest::Url> = (0..s.subs.len())
            .map(|i| format!("https://hooks.example/s{i}").parse().unwrap())
            .collect();
        let subs: Vec<Subscription> = s
            .subs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let mut sub = Subscription::new(
                    &format!("sub_{i}"),
                    TENANT,
                    urls[i].clone(),
                    SecretRef::Env("UNUSED".into()),
                );
                sub.max_concurrent = spec.max_concurrent;
                sub.rate = spec
                    .rate_per_s
                    .map(|r| format!("{r}/s").parse::<Rate>().unwrap());
                sub
            })
            .collect();
        let workers = (0..s.workers)
            .map(|i| Worker {
                endpoints: Endpoints::for_ladder(s.endpoints.clone(), &ladder)
                    .with_clock(clock.clone()),
                joins_at: (s.skew_ms * i as u64) / s.workers.max(1) as u64,
                registered: false,
                load: 0,
                held: Vec::new(),
            })
            .collect();
        let n = s.subs.len();
        Self {
            rng: s.seed | 1,
            current: Subscriptions::from_list(subs.clone()),
            subs,
            urls,
            ladder,
            horizon,
            set,
            base_ms,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            workers,
            next_worker: 0,
            first: VecDeque::new(),
            retry: VecDeque::new(),
            parked: vec![Vec::new(); n],
            requests: vec![Vec::new(); n],
            in_flight: vec![0; n],
            seen: HashMap::new(),
            delivered: BTreeMap::new(),
            dead: Vec::new(),
            published: Vec::new(),
            violations: Vec::new(),
            s,
        }
    }

    fn at(&mut self, ms: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((ms, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: deterministic from the case's seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.random() % (hi.saturating_sub(lo) + 1)
    }

    fn now_ms(&self) -> u64 {
        self.base_ms + self.now
    }

    fn run(mut self) -> Self {
        for (i, spec) in self.s.subs.clone().iter().enumerate() {
            for n in 0..spec.events {
                let at = match spec.arrival {
                    Arrival::Burst => 0,
                    Arrival::Steady { every_ms } => n as u64 * every_ms,
                };
                self.at(at, Ev::Arrive { sub: i, n });
            }
            if let Some((pause, resume)) = spec.pause {
                self.at(pause, Ev::Pause(i));
                self.at(resume, Ev::Resume(i));
            }
        }
        for w in 0..self.workers.len() {
            let at = self.workers[w].joins_at;
            self.at(at, Ev::Join(w));
        }
        let longest = self.s.tiers_ms.iter().max().copied().unwrap_or(0);
        let limit = 4 * (self.ladder.span().as_millis() as u64 + self.horizon.as_millis() as u64)
            + 40 * longest
            + 3_600_000;
        while let Some(Reverse((at, seq))) = self.queue.pop() {
            if at > limit {
                self.violations.push(format!(
                    "still going at {at} ms, past {limit} ms: something cycles without end"
                ));
                break;
            }
            self.now = at;
            self.set.advance_to(Duration::from_millis(at));
            let ev = self.events.remove(&seq).expect("each event once");
            self.handle(ev);
            self.pump();
        }
        self
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive { sub, n } => {
                let id = format!("evt_{sub}_{n}");
                let event = NewEvent {
                    id: id.clone(),
                    tenant: TENANT.into(),
                    event_type: "order.paid".into(),
                    subscription: Some(format!("sub_{sub}")),
                    timestamp: None,
                    body: format!(r#"{{"n":{n}}}"#).into_bytes(),
                };
                self.published.push((sub, id));
                self.first.push_back(Msg {
                    props: event.properties(),
                    key: TENANT.into(),
                    body: Bytes::from(event.body),
                });
            }
            Ev::Promote(msg) => self.retry.push_back(*msg),
            Ev::Finish(finish) => self.finish(*finish),
            Ev::Join(w) => {
                let others = self.workers.iter().filter(|w| w.registered).count() as u32;
                let worker = &mut self.workers[w];
                worker.endpoints.fleet().join(others);
                worker.registered = true;
                self.at(self.now, Ev::Count(w));
            }
            Ev::Count(w) => {
                let live = self.workers.iter().filter(|w| w.registered).count() as u32;
                let worker = &mut self.workers[w];
                let fleet = worker.endpoints.fleet();
                let since = Duration::from_millis(self.now - worker.joins_at);
                fleet.counted(Some(live), since);
                if fleet.is_settled() {
                    let held = std::mem::take(&mut worker.held);
                    for (msg, lane) in held {
                        self.process(w, msg, lane);
                    }
                }
                // Counts change nothing once every worker has joined and this one settled.
                let all_joined = self.workers.iter().all(|w| w.registered);
                if !(all_joined && fleet.is_settled()) {
                    self.at(self.now + RECOUNT.as_millis() as u64, Ev::Count(w));
                }
            }
            Ev::Pause(i) => {
                self.subs[i].paused = true;
                self.current = Subscriptions::from_list(self.subs.clone());
            }
            Ev::Resume(i) => {
                self.subs[i].paused = false;
                self.current = Subscriptions::from_list(self.subs.clone());
                for msg in std::mem::take(&mut self.parked[i]) {
                    match hookrelay::ops::pause::return_route(
                        &self.ladder,
                        &msg.props,
                        self.now_ms(),
                    ) {
                        Plan::Move {
                            exchange,
                            routing_key,
                            properties,
                        } => {
                            let back = Msg {
                                props: properties,
                                key: routing_key,
                                body: msg.body,
                            };
                            if exchange == self.ladder.ingress() {
                                self.first.push_back(back);
                            } else {
                                self.retry.push_back(back);
                            }
                        }
                        Plan::Keep(why) => self
                            .violations
                            .push(format!("a parked delivery was kept on resume: {why}")),
                    }
                }
            }
        }
    }

    /// Hands what waits in the lanes to workers with room in their prefetch, the retry lane and
    /// the first-attempt lane in turn.
    fn pump(&mut self) {
        loop {
            let Some(w) = (0..self.workers.len())
                .map(|i| (self.next_worker + i) % self.workers.len())
                .find(|&i| {
                    let w = &self.workers[i];
                    w.registered && w.load < self.s.prefetch
                })
            else {
                return;
            };
            let (msg, lane) = if self.seq.is_multiple_of(2) {
                match self.retry.pop_front() {
                    Some(m) => (m, LaneKind::Retry),
                    None => match self.first.pop_front() {
                        Some(m) => (m, LaneKind::First),
                        None => return,
                    },
                }
            } else {
                match self.first.pop_front() {
                    Some(m) => (m, LaneKind::First),
                    None => match self.retry.pop_front() {
                        Some(m) => (m, LaneKind::Retry),
                        None => return,
                    },
                }
            };
            self.seq += 1;
            self.next_worker = (w + 1) % self.workers.len();
            self.workers[w].load += 1;
            self.process(w, msg, lane);
        }
    }

    /// One delivery in a worker's hands, as `Dispatcher::attempt` takes it.
    fn process(&mut self, w: usize, msg: Msg, lane: LaneKind) {
        let envelope = match Envelope::from_delivery(&msg.props, &msg.key, &msg.body, MAX_BODY) {
            Ok(e) => {
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!(
                        "{:>6} w{w} {:?} {} attempts {} deferrals {} first {:?} since {:?}",
                        self.now,
                        lane,
                        e.id.as_str(),
                        e.attempts_made,
                        e.deferrals,
                        e.first_try_ms.map(|m| m - self.base_ms),
                        e.waiting_since_ms.map(|m| m - self.base_ms)
                    );
                }
                e
            }
            Err(e) => {
                self.violations
                    .push(format!("a message of hookrelay's own is invalid: {e}"));
                self.workers[w].load -= 1;
                return;
            }
        };
        let sub = match route(&envelope, &msg.body, lane, &self.current, &self.ladder) {
            Route::Settle(outcome) => return self.settle(w, &msg, &envelope, outcome, None),
            Route::Attempt(sub) => sub,
        };
        let worker = &mut self.workers[w];
        if !worker.endpoints.fleet().is_settled() {
            worker.held.push((msg, lane));
            return;
        }
        let admitted = worker
            .endpoints
            .admit_or_wait(&sub.url, sub.max_concurrent, sub.rate, None)
            .now_or_never()
            .expect("admission never waits with endpoints.busy_wait 0");
        let i = self.urls.iter().position(|u| *u == sub.url).unwrap();
        let slot = match admitted {
            Ok(slot) => slot,
            Err(deferral) => {
                let outcome = defer(
                    &self.ladder,
                    &envelope,
                    &deferral.to_string(),
                    deferral.cause(),
                    self.horizon,
                    self.now_ms(),
                );
                if std::env::var_os("SIM_TRACE").is_some() {
                    eprintln!(
                        "{:>6} defer {} {:?} -> {:?}",
                        self.now,
                        envelope.id.as_str(),
                        deferral.cause(),
                        outcome
                    );
                }
                return self.settle(w, &msg, &envelope, outcome, None);
            }
        };
        self.in_flight[i] += 1;
        let cap = sub
            .max_concurrent
            .unwrap_or(self.s.endpoints.max_concurrent);
        if self.workers.len() as u32 <= cap && self.in_flight[i] > cap {
            self.violations.push(format!(
                "endpoint {i} had {} attempts out at {} ms, over its fleet-wide cap of {cap}",
                self.in_flight[i], self.now
            ));
        }
        let spec = self.s.subs[i].clone();
        let seen = self.seen.entry((i, envelope.id.to_string())).or_insert(0);
        *seen += 1;
        let nth_of_event = *seen;
        let nth = self.requests[i].len() as u32 + 1;
        let (result, latency) = match spec.behavior {
            Behavior::Hang => (AttemptResult::Timeout, self.s.request_timeout_ms),
            behavior => {
                let status = match behavior {
                    Behavior::FailFirst(k) if nth <= k => 503,
                    Behavior::FailFirstOfEach(k) if nth_of_event <= k => 503,
                    Behavior::Random(permille) if self.random() % 1000 < u64::from(permille) => 503,
                    Behavior::TooMany { k, .. } if nth_of_event <= k => 429,
                    Behavior::Gone => 410,
                    _ => 204,
                };
                let retry_after = match behavior {
                    Behavior::TooMany { retry_after_s, .. } if status == 429 => {
                        Some(Duration::from_secs(retry_after_s))
                    }
                    _ => None,
                };
                let latency = self.between(spec.latency_ms.0, spec.latency_ms.1);
                (
                    AttemptResult::Response {
                        status,
                        retry_after,
                    },
                    latency.min(self.s.request_timeout_ms),
                )
            }
        };
        let start_ms = self.now_ms();
        self.requests[i].push(Request {
            id: envelope.id.to_string(),
            start_ms,
            failed: is_endpoint_failure(&result),
            status: match result {
                AttemptResult::Response { status, .. } => Some(status),
                _ => None,
            },
        });
        let at = self.now + latency.max(1);
        self.at(
            at,
            Ev::Finish(Box::new(Finish {
                worker: w,
                msg,
                envelope,
                slot,
                result,
                sub: i,
            })),
        );
    }

    fn finish(&mut self, f: Finish) {
        self.in_flight[f.sub] -= 1;
        f.slot.finish(&f.result);
        let outcome = decide(&self.ladder, f.envelope.attempts_made, &f.result);
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!(
                "{:>6} finish {} {:?} -> {}",
                self.now,
                f.envelope.id.as_str(),
                f.result,
                outcome.kind()
            );
        }
        let endpoint = endpoint_fingerprint(&self.urls[f.sub]);
        self.settle(f.worker, &f.msg, &f.envelope, outcome, Some(&endpoint));
    }

    /// What `settle` does with a decision: the replacement, stored, then the ack.
    fn settle(
        &mut self,
        w: usize,
        msg: &Msg,
        envelope: &Envelope,
        outcome: Outcome,
        endpoint: Option<&str>,
    ) {
        self.workers[w].load -= 1;
        let id = envelope.id.to_string();
        let made = match replacement(
            &self.ladder,
            &outcome,
            &msg.props,
            Some(envelope),
            endpoint,
            self.now_ms(),
        ) {
            Ok(made) => made,
            Err(e) => {
                self.violations
                    .push(format!("{id}: {outcome:?} cannot be carried out: {e:?}"));
                return;
            }
        };
        let messages = match made {
            Replacement::Nothing => {
                *self.delivered.entry(id).or_default() += 1;
                return;
            }
            Replacement::Records => {
                self.violations
                    .push(format!("{id} was cancelled: {outcome:?}"));
                return;
            }
            Replacement::Publish { messages, .. } => messages,
        };
        for m in messages {
            let copy = Msg {
                props: m.properties,
                key: m.routing_key,
                body: msg.body.clone(),
            };
            match &outcome {
                Outcome::Retry { tier, .. } => {
                    let delay = self.ladder.tier(*tier).delay.as_millis() as u64;
                    // Quorum tiers dead-letter a little after the TTL.
                    let jitter = self.between(0, 50);
                    self.at(self.now + delay + jitter, Ev::Promote(Box::new(copy)));
                }
                Outcome::Dead { .. } => {
                    let at = self.now_ms();
                    self.dead.push((id.clone(), copy.props, at));
                }
                Outcome::Parked { subscription } => {
                    let i = self
                        .subs
                        .iter()
                        .position(|s| s.id == *subscription)
                        .unwrap();
                    self.parked[i].push(copy);
                }
                other => self
                    .violations
                    .push(format!("{id}: unexpected outcome {other:?}")),
            }
        }
    }

    /// The invariants, once the simulation has run out of events.
    fn check(mut self) -> Vec<String> {
        let max = self.ladder.max_attempts();
        let retries = max - 1;
        let mut dead_ids = BTreeMap::new();
        for (id, props, dead_at) in &self.dead {
            *dead_ids.entry(id.clone()).or_insert(0) += 1;
            let sub: usize = id.split('_').nth(1).unwrap().parse().unwrap();
            let reason =
                headers::read_str_header(props, headers::REASON_HEADER).unwrap_or_default();
            let attempts = headers::read_u64_header(props, headers::ATTEMPTS_HEADER).unwrap_or(0);
            let requests = self.requests[sub].iter().filter(|r| r.id == *id).count() as u64;
            if attempts != requests {
                self.violations.push(format!(
                    "{id}: dead ({reason}) counting {attempts} attempts; its endpoint saw {requests}"
                ));
            }
            match reason.as_str() {
                "exhausted" if attempts != u64::from(max) => self
                    .violations
                    .push(format!("{id}: exhausted with {attempts} attempts of {max}")),
                "exhausted" => {}
                "horizon_expired" => {
                    let since = headers::read_u64_header(props, headers::WAITING_SINCE_HEADER);
                    let fresh = since.is_some_and(|since| {
                        self.requests[sub]
                            .iter()
                            .any(|r| r.failed && r.start_ms >= since)
                    });
                    if !fresh {
                        self.violations.push(format!(
                            "{id}: horizon_expired with {attempts} attempts and no failed request \
                             to its endpoint since it last waited ({since:?})"
                        ));
                    }
                    // An outage the schedule rides out ends no envelope: its endpoint failed at
                    // least as many requests as the schedule gives an envelope attempts.
                    let failed = self.requests[sub]
                        .iter()
                        .filter(|r| r.failed && r.start_ms <= *dead_at)
                        .count() as u64;
                    if failed < u64::from(max) {
                        self.violations.push(format!(
                            "{id}: horizon_expired after {failed} failed requests to its endpoint, \
                             fewer than the schedule's {max} attempts"
                        ));
                    }
                    // The dead-letter header is stamped by the system's clock; the simulation's
                    // own time says when.
                    let first = headers::read_u64_header(props, headers::FIRST_TRY_HEADER);
                    if let Some(first) = first
                        && dead_at.saturating_sub(first) < self.horizon.as_millis() as u64
                    {
                        self.violations.push(format!(
                            "{id}: horizon_expired {} ms after its first try, before its horizon",
                            dead_at.saturating_sub(first)
                        ));
                    }
                }
                "gone" => {
                    let last = self.requests[sub].iter().rev().find(|r| r.id == *id);
                    if last.and_then(|r| r.status) != Some(410) {
                        self.violations.push(format!("{id}: gone without a 410"));
                    }
                }
                other => self.violations.push(format!("{id}: dead-lettered {other}")),
            }
        }
        for (sub, id) in &self.published {
            let delivered = self.delivered.get(id).copied().unwrap_or(0);
            let dead = dead_ids.get(id).copied().unwrap_or(0);
            if delivered + dead != 1 {
                self.violations.push(format!(
                    "{id}: delivered {delivered} times, dead-lettered {dead} times"
                ));
            }
            let spec = &self.s.subs[*sub];
            // Promised: an outage of k requests at most the schedule's retries, 429s to each
            // event's first k attempts (not failures: never deferred for), health. Not promised:
            // 503 to each event's first k attempts. That is an outage to any breaker (every
            // request fails until some event's k+1-th), which defers the envelopes early in their
            // schedule, and past the horizon a probe failing on another event's early attempt
            // is fresh evidence; checked in the burst of issue 29 with the shipped settings
            // (`a_burst_on_a_short_ladder_is_delivered_on_its_third_attempt`).
            let promised = match spec.behavior {
                Behavior::FailFirst(k) | Behavior::TooMany { k, .. } => k <= retries,
                Behavior::Healthy => true,
                Behavior::FailFirstOfEach(_)
                | Behavior::Random(_)
                | Behavior::Hang
                | Behavior::Gone => false,
            };
            if promised && delivered == 0 {
                let reason = self
                    .dead
                    .iter()
                    .find(|(d, _, _)| d == id)
                    .and_then(|(_, p, _)| headers::read_str_header(p, headers::REASON_HEADER));
                self.violations.push(format!(
                    "{id}: {:?} with {retries} retries in the schedule, not delivered ({reason:?})",
                    spec.behavior
                ));
            }
        }
        for (i, spec) in self.s.subs.iter().enumerate() {
            let Some(rate) =
                spec.rate_per_s
                    .or(self.s.endpoints.rate.map(|r| r.per_second().floor() as u32))
            else {
                continue;
            };
            let mut at: Vec<u64> = self.requests[i].iter().map(|r| r.start_ms).collect();
            at.sort_unstable();
            let allowed = rate as usize + self.workers.len();
            for (j, start) in at.iter().enumerate() {
                let within = at[j..].iter().take_while(|t| **t < start + 1000).count();
                if within > allowed {
                    self.violations.push(format!(
                        "endpoint {i}: {within} requests within a second from {start}, over its \
                         rate of {rate}/s for {} workers",
                        self.workers.len()
                    ));
                    break;
                }
            }
        }
        self.violations
    }
}

fn behavior() -> impl Strategy<Value = Behavior> {
    prop_oneof![
        2 => (0u32..6).prop_map(Behavior::FailFirst),
        2 => (0u32..6).prop_map(Behavior::FailFirstOfEach),
        1 => (0u32..1000).prop_map(Behavior::Random),
        1 => Just(Behavior::Hang),
        1 => ((0u32..4), (0u64..20)).prop_map(|(k, retry_after_s)| Behavior::TooMany { k, retry_after_s }),
        1 => Just(Behavior::Gone),
        1 => Just(Behavior::Healthy),
    ]
}

fn sub_spec() -> impl Strategy<Value = SubSpec> {
    (
        behavior(),
        (1u64..50, 0u64..500),
        1usize..40,
        prop_oneof![
            Just(Arrival::Burst),
            (1u64..500).prop_map(|every_ms| Arrival::Steady { every_ms })
        ],
        proptest::option::of(1u32..12),
        proptest::option::weighted(0.2, 2u32..50),
        proptest::option::weighted(0.2, (0u64..3_000, 100u64..20_000)),
    )
        .prop_map(
            |(behavior, (lo, extra), events, arrival, max_concurrent, rate_per_s, pause)| SubSpec {
                behavior,
                latency_ms: (lo, lo + extra),
                events,
                arrival,
                max_concurrent,
                rate_per_s,
                pause: pause.map(|(at, for_ms)| (at, at + for_ms)),
            },
        )
}

const TIER_CHOICES: [u64; 7] = [100, 200, 500, 1_000, 3_000, 10_000, 60_000];

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        proptest::sample::subsequence(TIER_CHOICES.to_vec(), 1..=3),
        proptest::collection::vec(0usize..3, 0..6),
        any::<bool>(),
        (1u32..30, 1u32..25, 0u64..2_000, 50u64..60_000, 0u32..4),
        prop_oneof![Just(0u64), 500u64..30_000],
        500u64..5_000,
        (1usize..4, 0u64..1_000, 1usize..64),
        proptest::collection::vec(sub_spec(), 1..4),
        any::<u64>(),
    )
        .prop_map(
            |(
                tiers_ms,
                schedule,
                deferral_queues,
                (max_concurrent, breaker_failures, window_ms, cooldown_ms, recovery_start),
                horizon_ms,
                request_timeout_ms,
                (workers, skew_ms, prefetch),
                subs,
                seed,
            )| {
                let schedule = schedule.into_iter().map(|i| i % tiers_ms.len()).collect();
                Scenario {
                    tiers_ms,
                    schedule,
                    deferral_queues,
                    endpoints: EndpointConfig {
                        max_concurrent,
                        breaker_failures,
                        breaker_window: Duration::from_millis(window_ms),
                        breaker_cooldown: Duration::from_millis(cooldown_ms),
                        recovery_start,
                        horizon: Duration::from_millis(horizon_ms),
                        busy_wait: Duration::ZERO,
                        lane_share: 1.0,
                        ..EndpointConfig::default()
                    },
                    request_timeout_ms,
                    workers,
                    skew_ms,
                    prefetch,
                    subs,
                    seed,
                }
            },
        )
}

fn simulate(s: Scenario) -> Vec<String> {
    Sim::new(s).run().check()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_fleet_keeps_every_promise_on_generated_ladders_endpoints_and_arrivals(s in scenario()) {
        let violations = simulate(s);
        prop_assert!(violations.is_empty(), "{}", violations.join("\n"));
    }
}

/// Issue 29's first seam, replayed in the simulation: a short ladder, five subscriptions on one
/// host, twenty events at once each failing twice, default endpoint settings.
#[test]
fn a_burst_on_a_short_ladder_is_delivered_on_its_third_attempt() {
    let s = Scenario {
        tiers_ms: vec![1_000, 3_000],
        schedule: vec![0, 1, 1],
        deferral_queues: true,
        endpoints: EndpointConfig {
            busy_wait: Duration::ZERO,
            lane_share: 1.0,
            ..EndpointConfig::default()
        },
        request_timeout_ms: 15_000,
        workers: 1,
        skew_ms: 0,
        prefetch: 300,
        subs: vec![
            SubSpec {
                behavior: Behavior::FailFirstOfEach(2),
                latency_ms: (2, 10),
                events: 20,
                arrival: Arrival::Burst,
                max_concurrent: None,
                rate_per_s: None,
                pause: None,
            };
            5
        ],
        seed: 29,
    };
    let violations = simulate(s);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Found by the simulation: a delivery parked for longer than its horizon was dead-lettered
/// `horizon_expired` at its first deferral after the resume, on "evidence" from before the
/// pause. The time parked is the operator's hold, not the horizon's.
#[test]
fn a_delivery_parked_longer_than_its_horizon_is_not_expired_by_the_hold() {
    let s = Scenario {
        tiers_ms: vec![100, 1000],
        schedule: vec![1, 0],
        deferral_queues: true,
        endpoints: EndpointConfig {
            max_concurrent: 1,
            breaker_failures: 1,
            breaker_window: Duration::ZERO,
            breaker_cooldown: Duration::from_millis(50),
            recovery_start: 0,
            busy_wait: Duration::ZERO,
            lane_share: 1.0,
            ..EndpointConfig::default()
        },
        request_timeout_ms: 500,
        workers: 1,
        skew_ms: 0,
        prefetch: 2,
        subs: vec![SubSpec {
            behavior: Behavior::FailFirst(2),
            latency_ms: (1, 1),
            events: 18,
            arrival: Arrival::Burst,
            max_concurrent: None,
            rate_per_s: None,
            pause: Some((2252, 3101)),
        }],
        seed: 1589267202084985840,
    };
    let violations = simulate(s);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Found by the simulation: an outage of two requests, within a schedule of four retries,
/// dead-lettered an event that arrived during it `horizon_expired` without one attempt. The
/// horizon (here shorter than the schedule) had passed and a probe had failed since the event
/// last waited; but the endpoint had failed fewer requests in a row than the schedule promises
/// to ride out.
#[test]
fn an_outage_shorter_than_the_schedule_expires_no_event_that_waited_it_out() {
    let s = Scenario {
        tiers_ms: vec![60_000],
        schedule: vec![0, 0, 0, 0],
        deferral_queues: false,
        endpoints: EndpointConfig {
            max_concurrent: 1,
            breaker_failures: 1,
            breaker_window: Duration::ZERO,
            breaker_cooldown: Duration::from_millis(50),
            recovery_start: 0,
            horizon: Duration::from_millis(500),
            busy_wait: Duration::ZERO,
            lane_share: 1.0,
            ..EndpointConfig::default()
        },
        request_timeout_ms: 500,
        workers: 1,
        skew_ms: 0,
        prefetch: 1,
        subs: vec![SubSpec {
            behavior: Behavior::FailFirst(2),
            latency_ms: (1, 1),
            events: 2,
            arrival: Arrival::Burst,
            max_concurrent: None,
            rate_per_s: None,
            pause: None,
        }],
        seed: 0,
    };
    let violations = simulate(s);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Issue 29's second seam: three workers started together on a backlog for an endpoint whose
/// fleet-wide cap is 10.
#[test]
fn workers_started_together_keep_the_fleets_cap() {
    let s = Scenario {
        tiers_ms: vec![200],
        schedule: vec![0, 0, 0],
        deferral_queues: true,
        endpoints: EndpointConfig {
            busy_wait: Duration::ZERO,
            lane_share: 1.0,
            ..EndpointConfig::default()
        },
        request_timeout_ms: 15_000,
        workers: 3,
        skew_ms: 300,
        prefetch: 100,
        subs: vec![SubSpec {
            behavior: Behavior::Healthy,
            latency_ms: (300, 300),
            events: 150,
            arrival: Arrival::Burst,
            max_concurrent: Some(10),
            rate_per_s: None,
            pause: None,
        }],
        seed: 2,
    };
    let violations = simulate(s);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

// Keeps the join constants in the picture: the simulation's young period is the worker's.
const _: () = assert!(JOIN_SETTLE.as_millis() > RECOUNT.as_millis());
