//! What hookrelay tells the systems around it, as small JSON messages on topic exchanges:
//! operational events on `<prefix>.events` (`subscription.gone`, `delivery.exhausted`,
//! `delivery.cancelled`, `delivery.schema_invalid`, `subscriptions.reload_failed`) for owning
//! systems to act on, and the attempt log on `<prefix>.attempts` (one record per settled
//! delivery, routing key `<outcome>.<tenant>`) for operators to keep in a queue or stream.
//! Publishing an event never blocks or fails a delivery: events pass through a bounded buffer,
//! and what does not fit is counted as dropped. A delivery waits for its attempt record instead
//! ([`Notices::log`]): it is acked once the broker confirmed the record, so no record is lost to
//! a killed worker or a broker restart. Attempt records travel together whatever their routing
//! keys, in the compact form of [`attempt_log`](crate::observe::attempt_log), flushed when a
//! batch is full or its first record has waited [`LINGER`]: a message into a stream costs the
//! broker far more than the bytes of one more record in it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::broker::publish::{PublishError, Publisher};
use crate::observe::attempt_log;
use crate::observe::metrics::Metrics;
use crate::units::now_rfc3339;

/// How many notices may wait for the broker before new ones are dropped.
pub const BUFFER: usize = 10_000;
/// How many notices may await their confirm at once. A stream confirms in batches, tens of
/// milliseconds apart under load: with 256 in flight the attempt log kept up with only a few
/// thousand deliveries a second and the buffer overflowed (records dropped); this bound keeps
/// the attempt log at broker speed.
const IN_FLIGHT: usize = 4096;
/// Attempt-log messages awaiting their confirm at once. While this many are out, full batches
/// wait their turn (and records keep gathering) rather than adding to the broker's backlog.
const BATCHES_IN_FLIGHT: usize = 4;
/// The most records one attempt-log message carries.
const MAX_BATCH_RECORDS: usize = 512;
/// About the most body bytes one attempt-log message carries (a record alone may be larger).
const MAX_BATCH_BYTES: usize = 64 * 1024;
/// How long the first record of a batch waits for others before the batch leaves anyway. A
/// batch that fills first leaves at once. Under load a batch fills by size or in this time
/// whatever the confirms do, so the records per stream message depend on the rate alone (5 ms
/// at 17,000 deliveries/s: about 85); a quiet worker's record is late by at most this much.
pub const LINGER: Duration = Duration::from_millis(5);

/// One operational event, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationalEvent {
    /// The routing key, e.g. `subscription.gone`.
    pub event: String,
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    pub envelope: Option<String>,
    /// For an endpoint's health: the endpoint, `host:port#hash` (its path may be a secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    pub reason: String,
    /// What happened, in words (the last error, the cancellation's cause).
    pub detail: Option<String>,
    /// RFC 3339, UTC.
    pub at: String,
}

impl OperationalEvent {
    pub fn new(event: &str, reason: impl Into<String>) -> Self {
        Self {
            event: event.to_owned(),
            tenant: None,
            subscription: None,
            envelope: None,
            endpoint: None,
            reason: reason.into(),
            detail: None,
            at: now_rfc3339(),
        }
    }

    pub fn detail(mut self, detail: &str) -> Self {
        self.detail = Some(detail.to_owned());
        self
    }

    pub fn endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = Some(endpoint.to_owned());
        self
    }

    pub fn about(mut self, tenant: &str, subscription: Option<&str>, envelope: &str) -> Self {
        self.tenant = Some(tenant.to_owned());
        self.subscription = subscription.map(str::to_owned);
        self.envelope = Some(envelope.to_owned());
        self
    }
}

/// One settled delivery, as the attempt log records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AttemptRecord {
    /// The envelope id (`message_id`); `null` when the message had none.
    pub envelope: Option<String>,
    /// For a delivery made by fan-out, the id of the event it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    /// 1-based; 0 when no HTTP attempt was made (invalid, cancelled, fanned out).
    pub attempt: u32,
    /// The HTTP status, when the endpoint answered.
    pub status: Option<u16>,
    /// The error, when the attempt failed or the envelope was refused.
    pub error: Option<String>,
    pub latency_ms: Option<u64>,
    /// `delivered`, `retried`, `rejected`, `exhausted`, `invalid`, `cancelled`, `gone`,
    /// `egress_denied`, `horizon_expired`, `schema_invalid`, `fanned_out`, `parked`.
    pub outcome: String,
    /// The tier a retry waits in.
    pub tier: Option<String>,
    /// The lane (queue) the delivery came from.
    pub lane: String,
    /// How many times the envelope had been redriven out of the dead sink.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub redrives: u32,
    /// The replay (`rpl_<hex>`) that published this copy, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    /// RFC 3339, UTC.
    pub at: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl AttemptRecord {
    /// The records one attempt-log message holds, in any form a log may hold
    /// ([`attempt_log::read_message`](crate::observe::attempt_log::read_message)): one record,
    /// an array of records of one routing key, or a compact batch of many keys.
    pub fn read_message(body: &[u8]) -> Result<Vec<AttemptRecord>, serde_json::Error> {
        crate::observe::attempt_log::read_message(body)
    }

    /// Whether this record has `outcome` and `tenant` where they are given: what a binding
    /// `<outcome>.<tenant>` selected when every message held one routing key, for a reader of
    /// a batch that holds many.
    pub fn matches(&self, outcome: Option<&str>, tenant: Option<&str>) -> bool {
        outcome.is_none_or(|o| o == "*" || o == self.outcome)
            && tenant.is_none_or(|t| t == "*" || t == self.tenant.as_deref().unwrap_or("unknown"))
    }

    /// `<outcome>.<tenant>`; tenants never contain dots, so the key splits cleanly.
    pub fn routing_key(&self) -> String {
        routing_key(&self.outcome, self.tenant.as_deref())
    }
}

/// The attempt log's routing key for an outcome of a tenant (`unknown` when there was none).
pub fn routing_key(outcome: &str, tenant: Option<&str>) -> String {
    format!("{outcome}.{}", tenant.unwrap_or("unknown"))
}

/// One exchange notices go to, and the routing keys it recently had no queue for.
struct Route {
    exchange: String,
    /// The ladder binds a stream to every key of the exchange (the attempt log's, when on): a
    /// return then means the broker cannot route right now (it is starting up, or the binding
    /// is gone), not that nobody keeps the notices, so they are kept and sent again.
    kept: bool,
    unrouted: Mutex<HashMap<String, Instant>>,
}

impl Route {
    fn new(exchange: String, kept: bool) -> Arc<Self> {
        Arc::new(Self {
            exchange,
            kept,
            unrouted: Mutex::new(HashMap::new()),
        })
    }

    /// Whether a notice with `key` would reach a queue, as far as the broker last said.
    fn routed(&self, key: &str) -> bool {
        if self.kept {
            return true;
        }
        let unrouted = self.unrouted.lock().unwrap_or_else(|p| p.into_inner());
        unrouted
            .get(key)
            .is_none_or(|until| Instant::now() >= *until)
    }

    fn mark_unrouted(&self, key: String) {
        self.unrouted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, Instant::now() + UNROUTED_PAUSE);
    }
}

/// What the publishing task is handed: an operational event, published alone as it is, or an
/// attempt record, which joins a batch.
enum Notice {
    Event { routing_key: String, body: Vec<u8> },
    Attempt(Box<AttemptRecord>, Waiter),
}

/// Told whether an attempt record is stored (or, when nobody keeps the log, needs not be):
/// `false` when the worker stops before the broker took it.
type Waiter = oneshot::Sender<bool>;

/// Tells each waiter of a batch what became of it.
fn tell(waiters: Vec<Waiter>, stored: bool) {
    for w in waiters {
        // The delivery may have stopped waiting (its lease ran out): nothing to tell.
        let _ = w.send(stored);
    }
}

/// The sending side, cheap to clone into every task.
#[derive(Clone)]
pub struct Notices {
    tx: mpsc::Sender<Notice>,
    /// For records that must be stored before a delivery is acked ([`Notices::store`]).
    publisher: Arc<Publisher>,
    events: Arc<Route>,
    attempts: Arc<Route>,
    metrics: Metrics,
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices")
            .field("events", &self.events.exchange)
            .field("attempts", &self.attempts.exchange)
            .finish_non_exhaustive()
    }
}

impl Notices {
    /// Starts the publishing task on a publisher of its own. It ends once every `Notices` clone
    /// is dropped and what was buffered has been sent, closing the publisher. `attempts_kept`:
    /// the ladder's attempt-log stream is on (bound to every key), so a record the broker
    /// returns is sent again rather than given up.
    pub fn start(
        publisher: Arc<Publisher>,
        events_exchange: String,
        attempts_exchange: String,
        attempts_kept: bool,
        metrics: Metrics,
    ) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(BUFFER);
        let events = Route::new(events_exchange, false);
        let attempts = Route::new(attempts_exchange, attempts_kept);
        let task = tokio::spawn(drain(
            Arc::clone(&publisher),
            rx,
            Arc::clone(&events),
            Arc::clone(&attempts),
            metrics.clone(),
        ));
        (
            Self {
                tx,
                publisher,
                events,
                attempts,
                metrics,
            },
            task,
        )
    }

    /// Whether an attempt-log record with this routing key is worth making: false for a second
    /// after the broker said no queue is bound for it.
    pub fn attempt_wanted(&self, routing_key: &str) -> bool {
        self.attempts.routed(routing_key)
    }

    /// Queues attempt-log records and resolves once the broker confirmed every batch holding
    /// them (`true`; also when nobody keeps the log), or `false` once the worker stops before
    /// the broker took one. A delivery is acked only after its records are stored, so a worker
    /// killed in between leaves the delivery unacked, never a delivery without its record. A
    /// full buffer makes this wait, rather than drop a record.
    pub async fn log(&self, records: Vec<AttemptRecord>) -> bool {
        let mut told = Vec::with_capacity(records.len());
        for record in records {
            let (waiter, outcome) = oneshot::channel();
            if self
                .tx
                .send(Notice::Attempt(Box::new(record), waiter))
                .await
                .is_err()
            {
                return false;
            }
            told.push(outcome);
        }
        for outcome in told {
            if !outcome.await.unwrap_or(false) {
                return false;
            }
        }
        true
    }

    /// Queues an operational event; drops (and counts) it when the buffer is full.
    pub fn operational(&self, event: OperationalEvent) {
        let body = serde_json::to_vec(&event).unwrap_or_default();
        self.enqueue(Notice::Event {
            routing_key: event.event,
            body,
        });
    }

    /// Publishes an attempt-log record and an operational event that are the only trace of a
    /// terminal state (a cancellation), and waits for both confirms. Nobody being bound to
    /// either is fine (the broker then drops them), except the record when the ladder's stream
    /// keeps the attempt log: a return then is an error, so the delivery tries again.
    pub async fn store(
        &self,
        record: &AttemptRecord,
        event: &OperationalEvent,
    ) -> Result<(), PublishError> {
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let record_body = serde_json::to_vec(record).unwrap_or_default();
        let event_body = serde_json::to_vec(event).unwrap_or_default();
        let logged = self
            .publisher
            .send(
                &self.attempts.exchange,
                &record.routing_key(),
                &record_body,
                props.clone(),
                self.attempts.kept,
            )
            .await?;
        let announced = self
            .publisher
            .send(
                &self.events.exchange,
                &event.event,
                &event_body,
                props,
                false,
            )
            .await?;
        logged.await?;
        announced.await
    }

    fn enqueue(&self, notice: Notice) {
        if self.tx.try_send(notice).is_err() {
            self.metrics.notices_dropped.inc();
        }
    }
}

/// How long notices for a routing key nobody is bound to are skipped after the broker said so.
const UNROUTED_PAUSE: Duration = Duration::from_secs(1);
/// How often unroutable notices are said in the log.
const UNROUTED_SAID_EVERY: Duration = Duration::from_secs(60);

/// Attempt records waiting to leave in one message, whatever their routing keys.
struct Batch {
    records: Vec<AttemptRecord>,
    /// One per record: the deliveries waiting to be acked.
    waiters: Vec<Waiter>,
    /// About the body's size ([`attempt_log::estimated_size`]).
    bytes: usize,
    /// When its first record arrived.
    opened: Instant,
}

impl Batch {
    fn full(&self) -> bool {
        self.records.len() >= MAX_BATCH_RECORDS || self.bytes >= MAX_BATCH_BYTES
    }

    /// The routing keys of its records, each once, in the order they first came: the message
    /// goes out under the first, and the others ride in its `BCC` header, which the broker
    /// routes by as it does the routing key and strips before storing the message. A queue
    /// bound to any one of them (and the attempt log's stream, bound to `#`) gets the message
    /// once.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for r in &self.records {
            let key = r.routing_key();
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }
}

/// Batches waiting for a publish slot, oldest first: those that filled, then the one still
/// open.
#[derive(Default)]
struct Gathering {
    closed: VecDeque<Batch>,
    open: Option<Batch>,
    records: usize,
}

impl Gathering {
    fn add(&mut self, record: AttemptRecord, waiter: Waiter, now: Instant) {
        self.records += 1;
        let batch = self.open.get_or_insert_with(|| Batch {
            records: Vec::new(),
            waiters: Vec::new(),
            bytes: 0,
            opened: now,
        });
        batch.bytes += attempt_log::estimated_size(&record);
        batch.records.push(record);
        batch.waiters.push(waiter);
        if batch.full()
            && let Some(full) = self.open.take()
        {
            self.closed.push_back(full);
        }
    }

    /// The next batch due at `now`: a full one, else the open one once it has lingered (or at
    /// once, when `flush`: the worker is stopping).
    fn take(&mut self, now: Instant, flush: bool) -> Option<Batch> {
        let batch = match self.closed.pop_front() {
            Some(b) => b,
            None if flush || self.due().is_some_and(|due| now >= due) => self.open.take()?,
            None => return None,
        };
        self.records -= batch.records.len();
        Some(batch)
    }

    /// When the open batch is due to leave, if one is open.
    fn due(&self) -> Option<Instant> {
        self.open.as_ref().map(|b| b.opened + LINGER)
    }

    /// A batch the broker did not take, back at the front to be sent again.
    fn again(&mut self, batch: Batch) {
        self.records += batch.records.len();
        self.closed.push_front(batch);
    }
}

/// How long the attempt log waits before sending again a batch the broker did not take.
const RESEND_AFTER: Duration = Duration::from_secs(1);

/// An attempt-log batch awaiting its confirm: its routing keys, and the batch to send again
/// should the broker not take it.
struct Sent {
    keys: Vec<String>,
    batch: Batch,
}

/// Publishes notices, pipelining confirms. A notice the broker returns as unroutable (no queue is
/// bound for its routing key) would have been dropped by the broker anyway; for a second after
/// that, notices with the same key are not made or sent at all, which saves a publish per
/// delivery when nobody keeps the attempt log. A binding made in that second misses at most that
/// second. Attempt records gather into batches of any routing keys, sent when full or after
/// [`LINGER`], at most [`BATCHES_IN_FLIGHT`] awaiting confirms; a returned batch marks every key
/// it carried.
async fn drain(
    publisher: Arc<Publisher>,
    mut rx: mpsc::Receiver<Notice>,
    events: Arc<Route>,
    attempts: Arc<Route>,
    metrics: Metrics,
) {
    // Each publish's confirm, with how many notices it carries and, for a batch, its keys.
    let mut pending = FuturesUnordered::new();
    let mut batches_out = 0usize;
    let mut gathering = Gathering::default();
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let mut said: Option<Instant> = None;
    let mut unsaid: u64 = 0;
    let mut settle = |result: Result<(), PublishError>, notices: usize, keys: Vec<String>| {
        match result {
            Ok(()) => {}
            Err(PublishError::Unroutable {
                exchange,
                routing_key,
                ..
            }) => {
                metrics.notices_unroutable.inc_by(notices as u64);
                // Said at most once a minute, without the record: the count is in the metric.
                unsaid += notices as u64;
                if said.is_none_or(|at| at.elapsed() >= UNROUTED_SAID_EVERY) {
                    warn!(
                        %exchange,
                        %routing_key,
                        returned = unsaid,
                        "Notices returned by the broker: no queue is bound to keep them; bind a \
                         queue or stream to the exchange to keep them (counted in \
                         hookrelay_notices_unroutable_total, said at most once a minute)"
                    );
                    said = Some(Instant::now());
                    unsaid = 0;
                }
                let route = if exchange == attempts.exchange {
                    &attempts
                } else {
                    &events
                };
                if keys.is_empty() {
                    route.mark_unrouted(routing_key);
                }
                for key in keys {
                    route.mark_unrouted(key);
                }
            }
            Err(e) => {
                metrics.notices_failed.inc_by(notices as u64);
                warn!(error = %e, "Notice not confirmed by the broker");
            }
        }
    };
    let mut open = true;
    // After a batch the broker did not take: none is sent before this.
    let mut resend_at: Option<Instant> = None;
    while open || !pending.is_empty() || gathering.records > 0 {
        let now = Instant::now();
        let resting = resend_at.is_some_and(|at| now < at);
        while batches_out < BATCHES_IN_FLIGHT
            && !resting
            && let Some(batch) = gathering.take(now, !open)
        {
            let notices = batch.records.len();
            let mut keys = batch.keys();
            let first = keys.first().cloned().unwrap_or_default();
            let mut batch_props = props.clone();
            if keys.len() > 1 {
                let others: Vec<AMQPValue> = keys[1..]
                    .iter()
                    .map(|k| AMQPValue::LongString(k.as_str().into()))
                    .collect();
                let mut headers = FieldTable::default();
                headers.insert("BCC".into(), AMQPValue::FieldArray(others.into()));
                batch_props = batch_props.with_headers(headers);
            }
            let body = attempt_log::encode_batch(&batch.records);
            match publisher
                .send(&attempts.exchange, &first, &body, batch_props, true)
                .await
            {
                Ok(confirm) => {
                    batches_out += 1;
                    if keys.is_empty() {
                        keys.push(first);
                    }
                    let sent = Sent { keys, batch };
                    pending.push(tagged(confirm, notices, Some(sent)));
                }
                // While the worker runs, a batch the broker did not take is sent again (a
                // record may then be stored twice, never lost); a stopping worker gives up.
                Err(e) if open => {
                    warn!(error = %e, records = notices, "Attempt records not published; sending them again shortly");
                    gathering.again(batch);
                    resend_at = Some(Instant::now() + RESEND_AFTER);
                    break;
                }
                Err(e) => {
                    metrics.notices_failed.inc_by(notices as u64);
                    warn!(error = %e, "Notice not published");
                    tell(batch.waiters, false);
                }
            }
        }
        // The open batch's linger when a slot is free to send it, or the end of a rest.
        let due = match resend_at.filter(|at| now < *at) {
            Some(at) => Some(at),
            None => gathering
                .due()
                .filter(|_| batches_out < BATCHES_IN_FLIGHT && gathering.closed.is_empty()),
        };
        tokio::select! {
            Some((done, notices, batch)) = pending.next(), if !pending.is_empty() => {
                let Some(sent) = batch else {
                    settle(done, notices, Vec::new());
                    continue;
                };
                batches_out -= 1;
                match done {
                    // A broker starting up returns messages for a stream it has not brought
                    // back yet: kept, they are sent again like those it did not confirm.
                    Err(e) if open && attempts.kept && matches!(e, PublishError::Unroutable { .. }) => {
                        warn!(error = %e, records = notices, "Attempt records returned although the ladder's stream keeps the attempt log (the broker is starting up, or the binding is gone); sending them again shortly");
                        gathering.again(sent.batch);
                        resend_at = Some(Instant::now() + RESEND_AFTER);
                    }
                    Err(e) if open && !matches!(e, PublishError::Unroutable { .. }) => {
                        warn!(error = %e, records = notices, "Attempt records not confirmed; sending them again shortly");
                        gathering.again(sent.batch);
                        resend_at = Some(Instant::now() + RESEND_AFTER);
                    }
                    done => {
                        // Returned while nobody keeps the log: nothing was there to lose.
                        let stored = match &done {
                            Ok(()) => true,
                            Err(PublishError::Unroutable { .. }) => !attempts.kept,
                            Err(_) => false,
                        };
                        settle(done, notices, sent.keys);
                        tell(sent.batch.waiters, stored);
                    }
                }
            }
            notice = rx.recv(), if open && pending.len() < IN_FLIGHT && gathering.records < BUFFER => {
                match notice {
                    None => open = false,
                    Some(Notice::Attempt(record, waiter)) => {
                        if attempts.routed(&record.routing_key()) {
                            gathering.add(*record, waiter, Instant::now());
                        } else {
                            // Nobody keeps the log: the delivery need not wait.
                            let _ = waiter.send(true);
                        }
                    }
                    Some(Notice::Event { routing_key, body }) => {
                        if !events.routed(&routing_key) {
                            continue;
                        }
                        match publisher.send(&events.exchange, &routing_key, &body, props.clone(), true).await {
                            Ok(confirm) => pending.push(tagged(confirm, 1, None)),
                            Err(e) => {
                                metrics.notices_failed.inc();
                                warn!(error = %e, "Notice not published");
                            }
                        }
                    }
                }
            }
            () = sleep_until(due), if due.is_some() => {}
            else => {}
        }
    }
    publisher.close().await;
}

/// Sleeps until `due` (never returns without one; the branch is guarded).
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
    }
}

/// A publish's confirm with how many notices it carries and, for an attempt-log batch, what
/// it carried.
async fn tagged<F: std::future::Future>(
    confirm: F,
    notices: usize,
    batch: Option<Sent>,
) -> (F::Output, usize, Option<Sent>) {
    (confirm.await, notices, batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(envelope: &str, outcome: &str, tenant: &str) -> AttemptRecord {
        AttemptRecord {
            envelope: Some(envelope.into()),
            event: None,
            tenant: Some(tenant.into()),
            subscription: Some("sub_a".into()),
            attempt: 1,
            status: Some(204),
            error: None,
            latency_ms: Some(3),
            outcome: outcome.into(),
            tier: None,
            lane: "x.ready.first".into(),
            redrives: 0,
            replay: None,
            at: "2026-12-05T10:00:00.000Z".into(),
        }
    }

    /// A waiter nobody listens to.
    fn waiter() -> Waiter {
        oneshot::channel().0
    }

    #[test]
    fn records_of_many_keys_share_a_batch_that_leaves_after_its_linger() {
        let start = Instant::now();
        let mut g = Gathering::default();
        g.add(record("evt_1", "retried", "a"), waiter(), start);
        g.add(
            record("evt_2", "delivered", "b"),
            waiter(),
            start + LINGER / 2,
        );
        g.add(
            record("evt_3", "retried", "a"),
            waiter(),
            start + LINGER / 2,
        );
        assert_eq!(g.records, 3);
        // Not yet: the first record has not waited its linger.
        assert!(g.take(start + LINGER / 2, false).is_none());
        assert_eq!(g.due(), Some(start + LINGER));
        let batch = g.take(start + LINGER, false).unwrap();
        assert_eq!(g.records, 0);
        assert_eq!(batch.keys(), ["retried.a", "delivered.b"]);
        let body = attempt_log::encode_batch(&batch.records);
        let read = AttemptRecord::read_message(&body).unwrap();
        let ids: Vec<_> = read.iter().filter_map(|r| r.envelope.as_deref()).collect();
        assert_eq!(ids, ["evt_1", "evt_2", "evt_3"]);
        // A stopping worker sends what it holds at once.
        g.add(record("evt_4", "delivered", "b"), waiter(), start);
        assert!(g.take(start, true).is_some());
        assert!(g.due().is_none());
    }

    #[test]
    fn a_full_batch_leaves_at_once_and_the_next_record_starts_another() {
        let now = Instant::now();
        let mut g = Gathering::default();
        for i in 0..MAX_BATCH_RECORDS + 1 {
            g.add(record(&format!("evt_{i}"), "delivered", "a"), waiter(), now);
        }
        let full = g.take(now, false).unwrap();
        assert_eq!(full.records.len(), MAX_BATCH_RECORDS);
        assert!(g.take(now, false).is_none());
        assert_eq!(g.take(now + LINGER, false).unwrap().records.len(), 1);
        let mut big = record("evt_big", "retried", "a");
        big.error = Some("x".repeat(MAX_BATCH_BYTES * 4));
        g.add(big, waiter(), now);
        g.add(record("evt_next", "retried", "a"), waiter(), now);
        assert_eq!(g.take(now, false).unwrap().records.len(), 1);
        assert!(g.take(now, false).is_none());
    }

    #[test]
    fn a_record_matches_what_a_binding_of_outcome_and_tenant_selected() {
        let r = record("evt_1", "retried", "acme");
        assert!(r.matches(None, None));
        assert!(r.matches(Some("retried"), Some("acme")));
        assert!(r.matches(Some("*"), Some("acme")));
        assert!(!r.matches(Some("delivered"), None));
        assert!(!r.matches(None, Some("bigco")));
        let mut none = r.clone();
        none.tenant = None;
        assert!(none.matches(None, Some("unknown")));
    }
}
