//! What hookrelay tells the systems around it, as small JSON messages on topic exchanges:
//! operational events on `<prefix>.events` (`subscription.gone`, `delivery.exhausted`,
//! `delivery.cancelled`, `delivery.schema_invalid`, `subscriptions.reload_failed`) for owning
//! systems to act on, and the attempt log on `<prefix>.attempts` (one record per settled
//! delivery, routing key `<outcome>.<tenant>`) for operators to keep in a queue or stream. Publishing them never blocks
//! or fails a delivery: they pass through a bounded buffer, and what does not fit is counted as
//! dropped. Under load, attempt records that share a routing key travel together, one JSON array
//! per message ([`AttemptRecord::read_message`] reads both forms): a message into a stream costs
//! the broker far more than the bytes of one more record in it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::BasicProperties;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::broker::publish::{PublishError, Publisher};
use crate::observe::metrics::Metrics;
use crate::units::now_rfc3339;

/// How many notices may wait for the broker before new ones are dropped.
pub const BUFFER: usize = 10_000;
/// How many notices may await their confirm at once. A stream confirms in batches, tens of
/// milliseconds apart under load: with 256 in flight the attempt log kept up with only a few
/// thousand deliveries a second and the buffer overflowed (records dropped); this bound keeps
/// the attempt log at broker speed.
const IN_FLIGHT: usize = 4096;
/// Attempt-log messages awaiting their confirm at once. While this many are out, records gather
/// by routing key and leave together when one is confirmed: one record a message when the log
/// is quiet, as many as arrived in a confirm's round trip when it is busy.
const BATCHES_IN_FLIGHT: usize = 4;
/// The most records one attempt-log message carries.
const MAX_BATCH_RECORDS: usize = 128;
/// The most body bytes one attempt-log message carries (a record alone may be larger).
const MAX_BATCH_BYTES: usize = 128 * 1024;

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
    /// The records one attempt-log message holds: a single record (a JSON object), or several
    /// that share the message's routing key (a JSON array of them, in the order they settled).
    pub fn read_message(body: &[u8]) -> Result<Vec<AttemptRecord>, serde_json::Error> {
        let array = body
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b == b'[');
        if array {
            serde_json::from_slice(body)
        } else {
            serde_json::from_slice(body).map(|record| vec![record])
        }
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
    /// Whether notices with one routing key may share a message (the attempt log's records).
    batched: bool,
    unrouted: Mutex<HashMap<String, Instant>>,
}

impl Route {
    fn new(exchange: String, batched: bool) -> Arc<Self> {
        Arc::new(Self {
            exchange,
            batched,
            unrouted: Mutex::new(HashMap::new()),
        })
    }

    /// Whether a notice with `key` would reach a queue, as far as the broker last said.
    fn routed(&self, key: &str) -> bool {
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

struct Notice {
    route: Arc<Route>,
    routing_key: String,
    body: Vec<u8>,
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
    /// is dropped and what was buffered has been sent, closing the publisher.
    pub fn start(
        publisher: Arc<Publisher>,
        events_exchange: String,
        attempts_exchange: String,
        metrics: Metrics,
    ) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(BUFFER);
        let events = Route::new(events_exchange, false);
        let attempts = Route::new(attempts_exchange, true);
        let routes = vec![Arc::clone(&events), Arc::clone(&attempts)];
        let task = tokio::spawn(drain(Arc::clone(&publisher), rx, routes, metrics.clone()));
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

    /// Queues an attempt-log record; drops (and counts) it when the buffer is full.
    pub fn attempt(&self, record: &AttemptRecord) {
        let body = serde_json::to_vec(record).unwrap_or_default();
        self.enqueue(&self.attempts, record.routing_key(), body);
    }

    /// Queues an operational event; drops (and counts) it when the buffer is full.
    pub fn operational(&self, event: OperationalEvent) {
        let body = serde_json::to_vec(&event).unwrap_or_default();
        self.enqueue(&self.events, event.event, body);
    }

    /// Publishes an attempt-log record and an operational event that are the only trace of a
    /// terminal state (a cancellation), and waits for both confirms. Nobody being bound to
    /// either is fine: the broker then drops them.
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
                false,
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

    fn enqueue(&self, route: &Arc<Route>, routing_key: String, body: Vec<u8>) {
        let notice = Notice {
            route: Arc::clone(route),
            routing_key,
            body,
        };
        if self.tx.try_send(notice).is_err() {
            self.metrics.notices_dropped.inc();
        }
    }
}

/// How long notices for a routing key nobody is bound to are skipped after the broker said so.
const UNROUTED_PAUSE: Duration = Duration::from_secs(1);
/// How often unroutable notices are said in the log.
const UNROUTED_SAID_EVERY: Duration = Duration::from_secs(60);

/// Notices of one route and routing key waiting to leave in one message.
struct Batch {
    route: Arc<Route>,
    routing_key: String,
    bodies: Vec<Vec<u8>>,
    bytes: usize,
}

impl Batch {
    fn full(&self) -> bool {
        self.bodies.len() >= MAX_BATCH_RECORDS || self.bytes >= MAX_BATCH_BYTES
    }

    /// One body alone as it is; several as a JSON array of them.
    fn body(mut self) -> Vec<u8> {
        if self.bodies.len() == 1 {
            return self.bodies.pop().unwrap_or_default();
        }
        let mut out = Vec::with_capacity(self.bytes + self.bodies.len() + 1);
        out.push(b'[');
        for (i, body) in self.bodies.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(body);
        }
        out.push(b']');
        out
    }
}

/// Batches waiting for a publish slot, oldest first; a batch that is full is closed and the
/// next notice with its key starts another.
#[derive(Default)]
struct Gathering {
    order: std::collections::VecDeque<Batch>,
    /// Routing key → index in `order` of its open (not full) batch, offset by `taken`.
    open: HashMap<String, usize>,
    /// Batches taken from the front so far, so indexes in `open` stay valid.
    taken: usize,
    notices: usize,
}

impl Gathering {
    fn add(&mut self, notice: Notice) {
        self.notices += 1;
        let len = notice.body.len();
        if let Some(&at) = self.open.get(&notice.routing_key)
            && let Some(batch) = self.order.get_mut(at - self.taken)
        {
            batch.bodies.push(notice.body);
            batch.bytes += len;
            if batch.full() {
                self.open.remove(&notice.routing_key);
            }
            return;
        }
        let batch = Batch {
            route: notice.route,
            routing_key: notice.routing_key.clone(),
            bodies: vec![notice.body],
            bytes: len,
        };
        if !batch.full() {
            self.open
                .insert(notice.routing_key, self.taken + self.order.len());
        }
        self.order.push_back(batch);
    }

    fn take(&mut self) -> Option<Batch> {
        let batch = self.order.pop_front()?;
        if self.open.get(&batch.routing_key) == Some(&self.taken) {
            self.open.remove(&batch.routing_key);
        }
        self.taken += 1;
        self.notices -= batch.bodies.len();
        Some(batch)
    }
}

/// Publishes notices, pipelining confirms. A notice the broker returns as unroutable (no queue is
/// bound for its routing key) would have been dropped by the broker anyway; for a second after
/// that, notices with the same key are not made or sent at all, which saves a publish per
/// delivery when nobody keeps the attempt log. A binding made in that second misses at most that
/// second. The key skipped is the returned message's own (a return may arrive with another
/// notice's confirm). Attempt records gather by routing key while [`BATCHES_IN_FLIGHT`] of
/// their messages await confirms.
async fn drain(
    publisher: Arc<Publisher>,
    mut rx: mpsc::Receiver<Notice>,
    routes: Vec<Arc<Route>>,
    metrics: Metrics,
) {
    // Each publish's confirm, with how many notices it carries and whether it was a batch.
    let mut pending = FuturesUnordered::new();
    let mut batches_out = 0usize;
    let mut gathering = Gathering::default();
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let mut said: Option<Instant> = None;
    let mut unsaid: u64 = 0;
    let mut settle = |result: Result<(), PublishError>, notices: usize| match result {
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
            if let Some(route) = routes.iter().find(|r| r.exchange == exchange) {
                route.mark_unrouted(routing_key);
            }
        }
        Err(e) => {
            metrics.notices_failed.inc_by(notices as u64);
            warn!(error = %e, "Notice not confirmed by the broker");
        }
    };
    let mut open = true;
    while open || !pending.is_empty() || gathering.notices > 0 {
        while batches_out < BATCHES_IN_FLIGHT
            && let Some(batch) = gathering.take()
        {
            let notices = batch.bodies.len();
            let (exchange, key) = (batch.route.exchange.clone(), batch.routing_key.clone());
            match publisher
                .send(&exchange, &key, &batch.body(), props.clone(), true)
                .await
            {
                Ok(confirm) => {
                    batches_out += 1;
                    pending.push(tagged(confirm, notices, true));
                }
                Err(e) => {
                    metrics.notices_failed.inc_by(notices as u64);
                    warn!(error = %e, "Notice not published");
                }
            }
        }
        tokio::select! {
            Some((done, notices, batch)) = pending.next(), if !pending.is_empty() => {
                if batch {
                    batches_out -= 1;
                }
                settle(done, notices);
            }
            notice = rx.recv(), if open && pending.len() < IN_FLIGHT && gathering.notices < BUFFER => {
                let Some(notice) = notice else {
                    open = false;
                    continue;
                };
                if !notice.route.routed(&notice.routing_key) {
                    continue;
                }
                if notice.route.batched {
                    gathering.add(notice);
                    continue;
                }
                let Notice { route, routing_key, body } = notice;
                match publisher.send(&route.exchange, &routing_key, &body, props.clone(), true).await {
                    Ok(confirm) => pending.push(tagged(confirm, 1, false)),
                    Err(e) => {
                        metrics.notices_failed.inc();
                        warn!(error = %e, "Notice not published");
                    }
                }
            }
            else => {}
        }
    }
    publisher.close().await;
}

/// A publish's confirm with how many notices it carries and whether it was an attempt-log batch.
async fn tagged<F: std::future::Future>(
    confirm: F,
    notices: usize,
    batch: bool,
) -> (F::Output, usize, bool) {
    (confirm.await, notices, batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(route: &Arc<Route>, key: &str, body: &str) -> Notice {
        Notice {
            route: Arc::clone(route),
            routing_key: key.to_owned(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn taken(g: &mut Gathering) -> Vec<(String, String)> {
        std::iter::from_fn(|| g.take())
            .map(|b| {
                let key = b.routing_key.clone();
                (key, String::from_utf8(b.body()).unwrap())
            })
            .collect()
    }

    #[test]
    fn records_gather_by_routing_key_in_arrival_order_and_a_lone_record_stays_an_object() {
        let route = Route::new("x.attempts".into(), true);
        let mut g = Gathering::default();
        g.add(notice(&route, "retried.a", r#"{"n":1}"#));
        g.add(notice(&route, "delivered.b", r#"{"n":2}"#));
        g.add(notice(&route, "retried.a", r#"{"n":3}"#));
        assert_eq!(g.notices, 3);
        assert_eq!(
            taken(&mut g),
            [
                ("retried.a".to_owned(), r#"[{"n":1},{"n":3}]"#.to_owned()),
                ("delivered.b".to_owned(), r#"{"n":2}"#.to_owned()),
            ]
        );
        assert_eq!(g.notices, 0);
        // A key taken out starts a new batch, behind what was already waiting.
        g.add(notice(&route, "delivered.b", r#"{"n":4}"#));
        g.add(notice(&route, "retried.a", r#"{"n":5}"#));
        g.add(notice(&route, "delivered.b", r#"{"n":6}"#));
        let first = g.take().unwrap();
        assert_eq!(first.bodies.len(), 2);
        g.add(notice(&route, "delivered.b", r#"{"n":7}"#));
        assert_eq!(
            taken(&mut g),
            [
                ("retried.a".to_owned(), r#"{"n":5}"#.to_owned()),
                ("delivered.b".to_owned(), r#"{"n":7}"#.to_owned()),
            ]
        );
    }

    #[test]
    fn a_full_batch_is_closed_and_the_next_record_starts_another() {
        let route = Route::new("x.attempts".into(), true);
        let mut g = Gathering::default();
        for i in 0..MAX_BATCH_RECORDS + 1 {
            g.add(notice(&route, "retried.a", &format!("{i}")));
        }
        let sizes: Vec<usize> = std::iter::from_fn(|| g.take())
            .map(|b| b.bodies.len())
            .collect();
        assert_eq!(sizes, [MAX_BATCH_RECORDS, 1]);
        let big = "x".repeat(MAX_BATCH_BYTES);
        g.add(notice(&route, "retried.a", &big));
        g.add(notice(&route, "retried.a", "1"));
        let sizes: Vec<usize> = std::iter::from_fn(|| g.take())
            .map(|b| b.bodies.len())
            .collect();
        assert_eq!(sizes, [1, 1]);
    }

    #[test]
    fn a_message_reads_back_as_the_records_it_carries() {
        let record = AttemptRecord {
            envelope: Some("evt_1".into()),
            event: None,
            tenant: Some("acme".into()),
            subscription: Some("sub_a".into()),
            attempt: 1,
            status: Some(204),
            error: None,
            latency_ms: Some(3),
            outcome: "delivered".into(),
            tier: None,
            lane: "x.ready.first".into(),
            redrives: 0,
            replay: None,
            at: "2026-12-05T10:00:00Z".into(),
        };
        let mut second = record.clone();
        second.envelope = Some("evt_2".into());
        let route = Route::new("x.attempts".into(), true);
        let mut g = Gathering::default();
        for r in [&record, &second] {
            g.add(Notice {
                route: Arc::clone(&route),
                routing_key: r.routing_key(),
                body: serde_json::to_vec(r).unwrap(),
            });
        }
        let body = g.take().unwrap().body();
        assert_eq!(
            AttemptRecord::read_message(&body).unwrap(),
            [record.clone(), second]
        );
        let alone = serde_json::to_vec(&record).unwrap();
        assert_eq!(AttemptRecord::read_message(&alone).unwrap(), [record]);
        assert!(AttemptRecord::read_message(b"[1]").is_err());
    }
}
