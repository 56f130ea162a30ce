//! Every header hookrelay reads or writes, in one place: the names, the builders of the
//! properties it republishes with (fan-out, retry, dead letter, redrive), the typed readers, and
//! the broker's own dead-letter headers (`x-death` and friends), which hookrelay reads but never
//! trusts for its accounting.

use lapin::BasicProperties;
use lapin::protocol::basic::gen_properties;
use lapin::types::generation::gen_value;
use lapin::types::{AMQPValue, FieldTable};

use crate::contract::envelope::{EnvelopeId, InvalidEnvelope};
use crate::contract::ladder::{Ladder, QueueRole, TierId};
use crate::units::{cut, now_ms};

/// Header naming the subscription to deliver to (set by the producer). Without it the event
/// fans out to every matching subscription of its tenant.
pub const SUBSCRIPTION_HEADER: &str = "x-subscription";
/// On a delivery made by fan-out: the `message_id` of the event it came from.
pub const EVENT_ID_HEADER: &str = "x-hookrelay-event-id";
/// The endpoint the last attempt went to (`host#hash`), to notice a repointed subscription.
pub const ENDPOINT_HEADER: &str = "x-hookrelay-endpoint";
/// The tenant, carried once a message leaves the ingress (whose routing key was the tenant).
pub const TENANT_HEADER: &str = "x-hookrelay-tenant";
/// The shard (index) of the shared lane a retry, deferral or parked copy came from: a sharded
/// ladder's promote exchange routes it back to the retry shard of that index, so a tenant's
/// retries wait behind its own shard's, as its first attempts do. Not `x-`: a headers exchange
/// ignores binding arguments whose names start with `x-`, so a binding on `x-hookrelay-shard`
/// would match every message (checked on 3.10).
pub const SHARD_HEADER: &str = "hookrelay-shard";
/// Attempts already made. Ours alone: the broker's `x-death` counts are never trusted.
pub const ATTEMPTS_HEADER: &str = "x-hookrelay-attempts";
/// When the next attempt is due, in milliseconds since the epoch.
pub const DUE_HEADER: &str = "x-hookrelay-due-ms";
/// Deferrals so far: times the envelope went to a tier without a request (its endpoint's
/// breaker open, or a cap full). Counted apart from attempts, which the budget bounds.
pub const DEFERRALS_HEADER: &str = "x-hookrelay-deferrals";
/// When the envelope first went to a tier (ms since the epoch): its delivery horizon runs
/// from there.
pub const FIRST_TRY_HEADER: &str = "x-hookrelay-first-try-ms";
/// Deferrals in a row for a busy endpoint (its cap, host cap, rate or recovery limit reached):
/// the next such deferral waits in the deferral queue of that index (the longest past the
/// end). Reset by an attempt made or a deferral of another kind.
pub const BUSY_DEFERRALS_HEADER: &str = "x-hookrelay-busy-deferrals";
/// When the envelope last went to wait (its last attempt or deferral), ms since the epoch: a
/// failed request to its endpoint made after this is fresh evidence that the endpoint is down
/// (see [`crate::delivery::route::defer`]).
pub const WAITING_SINCE_HEADER: &str = "x-hookrelay-waiting-since-ms";
/// When a delivery was parked for its paused subscription (ms since the epoch): the time it is
/// held there is the operator's, not its horizon's ([`returned_properties`]).
pub const PARKED_AT_HEADER: &str = "x-hookrelay-parked-at-ms";
/// The error of the last failed attempt.
pub const LAST_ERROR_HEADER: &str = "x-hookrelay-last-error";
/// Why a message is in the dead sink: `rejected`, `exhausted`, `invalid`, ...
pub const REASON_HEADER: &str = "x-hookrelay-reason";
/// The HTTP status of the last attempt, when there was one.
pub const STATUS_HEADER: &str = "x-hookrelay-status";
/// When the message was dead-lettered, in milliseconds since the epoch.
pub const DEAD_AT_HEADER: &str = "x-hookrelay-dead-at-ms";
/// How many times the message was redriven out of the dead sink.
pub const REDRIVES_HEADER: &str = "x-hookrelay-redrives";
/// When it was last redriven, in milliseconds since the epoch.
pub const REDRIVEN_AT_HEADER: &str = "x-hookrelay-redriven-at-ms";

/// Set by [`crate::broker::publish::Publisher`] on every message it publishes: an id of that one
/// publish, which a `basic.return` carries back, so a return names the publish it belongs to.
pub const PUBLISH_ID_HEADER: &str = "x-hookrelay-publish-id";

/// Marks a replayed copy with the replay it came from (`rpl_<hex>`), for history and trace.
pub const REPLAY_HEADER: &str = "x-hookrelay-replay";

/// On a copy that left producer headers out to fit the broker's frame size: which, and how big.
pub const HEADERS_DROPPED_HEADER: &str = "x-hookrelay-headers-dropped";

/// RabbitMQ's default `frame_max` (128 KiB; `rabbitmq/rabbitmq.conf` keeps it). A message's
/// properties, headers included, travel in one content-header frame that must fit it: the
/// broker closes a connection that publishes a bigger one, and lapin closes one that receives
/// one, without checking either beforehand.
pub const FRAME_MAX: usize = 131_072;

/// The most the producer's headers (all but hookrelay's own, `x-subscription` and the broker's
/// dead-letter headers) may weigh, encoded: half of [`FRAME_MAX`]. Every copy hookrelay
/// republishes carries them with at most `SMALL_HEADERS` of [`MAX_SMALL_HEADER_BYTES`] each
/// (in practice about 1.5 KiB) and the other properties (short strings, at most about 2.3 KiB),
/// so it stays far under the frame size: under a quorum queue's `x-delivery-count` on
/// redelivery, and on a broker whose `frame_max` was lowered to about 84 KiB. A limit on the
/// producer's part alone means a copy never grows out of it: a retry, a redrive or a fan-out
/// delivery reads back as valid as the message it came from.
pub const MAX_HEADER_TABLE_BYTES: usize = 64 * 1024;

/// The most one of `SMALL_HEADERS` may weigh, encoded. hookrelay's own are short by
/// construction (an error is cut to 512 bytes, a tenant is 64, an id 128).
pub const MAX_SMALL_HEADER_BYTES: usize = 1024;

/// Headers that are short by nature, each held to [`MAX_SMALL_HEADER_BYTES`] rather than
/// counted in the producer's share: hookrelay's own and `x-subscription`, which copies add or
/// rewrite, and `traceparent`, which a worker adds to an event that came without one (so a copy
/// of an event whose own headers fill their share still fits).
const SMALL_HEADERS: [&str; 19] = [
    crate::contract::trace_context::TRACEPARENT,
    SUBSCRIPTION_HEADER,
    SHARD_HEADER,
    DEFERRALS_HEADER,
    BUSY_DEFERRALS_HEADER,
    FIRST_TRY_HEADER,
    EVENT_ID_HEADER,
    ENDPOINT_HEADER,
    TENANT_HEADER,
    ATTEMPTS_HEADER,
    DUE_HEADER,
    LAST_ERROR_HEADER,
    REASON_HEADER,
    STATUS_HEADER,
    DEAD_AT_HEADER,
    REDRIVES_HEADER,
    REDRIVEN_AT_HEADER,
    HEADERS_DROPPED_HEADER,
    PUBLISH_ID_HEADER,
];

/// Headers the broker adds while dead-lettering; dropped on every republish so they neither
/// grow without bound nor get mistaken for our own accounting.
const BROKER_HEADERS: [&str; 8] = [
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-delivery-count",
];

/// Error text kept in headers is cut to this many bytes.
const MAX_ERROR_LEN: usize = 512;

/// Bytes a header table's entries take beyond the entries: its length.
const TABLE_PREFIX: usize = 4;

/// The encoded size of one header table entry: its name and its typed value.
fn entry_len(name: &str, value: &AMQPValue) -> usize {
    // Encoding into memory fails only on a value no client could have sent; it counts as too
    // big.
    let value = encoded_len(|buf| gen_value(value)(buf.into()).map(|c| c.into_inner().0))
        .unwrap_or(usize::MAX / 4);
    1 + name.len() + value
}

thread_local! {
    /// Where sizes are measured by encoding: every delivery and republish measures its
    /// headers, and a buffer kept per thread spares an allocation (and its growth) each time.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The length `encode` writes into an empty buffer (which it hands back), or `None` if it
/// fails.
fn encoded_len<E>(encode: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, E>) -> Option<usize> {
    let mut buf = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    buf.clear();
    let written = encode(buf).ok()?;
    let len = written.len();
    // A buffer grown for an outsized table is not kept.
    if written.capacity() <= 64 * 1024 {
        SCRATCH.with(|s| *s.borrow_mut() = written);
    }
    Some(len)
}

/// The encoded size of a header table, its length included.
pub fn table_len(table: &FieldTable) -> usize {
    table
        .into_iter()
        .map(|(k, v)| entry_len(k.as_str(), v))
        .sum::<usize>()
        + TABLE_PREFIX
}

/// The size of the content-header frame `properties` travel in, which must fit the
/// connection's `frame_max`.
pub fn content_header_frame_len(properties: &BasicProperties) -> usize {
    // Frame type, channel and size; class, weight and body size; the frame-end octet.
    const FRAMING: usize = 7 + 12 + 1;
    encoded_len(|buf| gen_properties(properties)(buf.into()).map(|c| c.into_inner().0))
        .map_or(usize::MAX, |len| len + FRAMING)
}

/// Checks a delivery's headers against the limits every copy of it must keep: the producer's
/// share within [`MAX_HEADER_TABLE_BYTES`], each of [`SMALL_HEADERS`] within
/// [`MAX_SMALL_HEADER_BYTES`]. The broker's dead-letter headers are not counted: no copy keeps
/// them.
pub(crate) fn check_header_sizes(headers: Option<&FieldTable>) -> Result<(), InvalidEnvelope> {
    let Some(headers) = headers else {
        return Ok(());
    };
    let mut producers = TABLE_PREFIX;
    for (name, value) in headers {
        let name = name.as_str();
        if BROKER_HEADERS.contains(&name) {
            continue;
        }
        let len = entry_len(name, value);
        match SMALL_HEADERS.iter().find(|small| **small == name) {
            Some(small) if len > MAX_SMALL_HEADER_BYTES => {
                return Err(InvalidEnvelope::HeaderTooLong {
                    header: small,
                    size: len,
                    max: MAX_SMALL_HEADER_BYTES,
                });
            }
            Some(_) => {}
            None => producers += len,
        }
    }
    if producers > MAX_HEADER_TABLE_BYTES {
        return Err(InvalidEnvelope::HeadersTooLarge {
            size: producers,
            max: MAX_HEADER_TABLE_BYTES,
        });
    }
    Ok(())
}

fn header<'a>(headers: Option<&'a FieldTable>, name: &str) -> Option<&'a AMQPValue> {
    headers?.inner().get(name)
}

fn describe(value: &AMQPValue) -> String {
    format!("{:?}", value.get_type())
}

/// A string header; AMQP clients send strings as long or short strings.
pub(crate) fn header_str<'a>(
    headers: Option<&'a FieldTable>,
    name: &'static str,
) -> Result<Option<&'a str>, InvalidEnvelope> {
    match header(headers, name) {
        None | Some(AMQPValue::Void) => Ok(None),
        Some(AMQPValue::ShortString(s)) => Ok(Some(s.as_str())),
        Some(AMQPValue::LongString(s)) => {
            std::str::from_utf8(s.as_bytes())
                .map(Some)
                .map_err(|_| InvalidEnvelope::BadHeader {
                    header: name,
                    expected: "a UTF-8 string",
                    found: "invalid UTF-8".into(),
                })
        }
        Some(other) => Err(InvalidEnvelope::BadHeader {
            header: name,
            expected: "a string",
            found: describe(other),
        }),
    }
}

/// A non-negative integer header, whatever integer width the client chose.
pub(crate) fn header_u64(
    headers: Option<&FieldTable>,
    name: &'static str,
) -> Result<Option<u64>, InvalidEnvelope> {
    let value = match header(headers, name) {
        None | Some(AMQPValue::Void) => return Ok(None),
        Some(v) => v,
    };
    let n: Option<i128> = match value {
        AMQPValue::ShortShortInt(v) => Some((*v).into()),
        AMQPValue::ShortShortUInt(v) => Some((*v).into()),
        AMQPValue::ShortInt(v) => Some((*v).into()),
        AMQPValue::ShortUInt(v) => Some((*v).into()),
        AMQPValue::LongInt(v) => Some((*v).into()),
        AMQPValue::LongUInt(v) => Some((*v).into()),
        AMQPValue::LongLongInt(v) => Some((*v).into()),
        AMQPValue::Timestamp(v) => Some((*v).into()),
        _ => None,
    };
    match n.map(u64::try_from) {
        Some(Ok(n)) => Ok(Some(n)),
        Some(Err(_)) => Err(InvalidEnvelope::BadHeader {
            header: name,
            expected: "a non-negative integer",
            found: n.unwrap_or_default().to_string(),
        }),
        None => Err(InvalidEnvelope::BadHeader {
            header: name,
            expected: "an integer",
            found: describe(value),
        }),
    }
}

/// The original properties, persistent, ready to have hookrelay's headers added. Left behind:
/// the broker's dead-letter headers, `expiration` (a republished message must not expire
/// out of a lane) and `user_id` (the broker checks it against the publishing connection).
///
/// A copy must fit the broker's frame size whatever the original carried (an invalid message
/// is dead-lettered because its headers are too big), so headers over the limits
/// [`check_header_sizes`] reads with are left out, the biggest first, and
/// [`HEADERS_DROPPED_HEADER`] says which. A valid envelope's headers are within them and kept
/// whole.
fn carried(original: &BasicProperties) -> (BasicProperties, FieldTable) {
    let mut headers = FieldTable::default();
    let mut producers = Vec::new();
    let mut dropped: Vec<(&str, usize)> = Vec::new();
    for (k, v) in original.headers().iter().flatten() {
        let name = k.as_str();
        if BROKER_HEADERS.contains(&name) {
            continue;
        }
        let len = entry_len(name, v);
        if !SMALL_HEADERS.contains(&name) {
            producers.push((k, v, len));
        } else if len <= MAX_SMALL_HEADER_BYTES {
            headers.insert(k.clone(), v.clone());
        } else {
            dropped.push((name, len));
        }
    }
    // Smallest first, so as many as fit are kept (all of them when they do).
    producers.sort_by(|a, b| (a.2, a.0).cmp(&(b.2, b.0)));
    let mut room = MAX_HEADER_TABLE_BYTES - TABLE_PREFIX;
    for (k, v, len) in producers {
        if len <= room {
            room -= len;
            headers.insert(k.clone(), v.clone());
        } else {
            dropped.push((k.as_str(), len));
        }
    }
    if !dropped.is_empty() {
        let names: Vec<&str> = dropped.iter().map(|d| d.0).collect();
        let note = format!(
            "{} header(s) of {} bytes left out to fit the broker's frame size: {}",
            dropped.len(),
            dropped.iter().map(|d| d.1).sum::<usize>(),
            names.join(", ")
        );
        put_str(
            &mut headers,
            HEADERS_DROPPED_HEADER,
            cut(&note, MAX_ERROR_LEN),
        );
    }
    let mut props = BasicProperties::default().with_delivery_mode(2);
    if let Some(v) = original.content_type() {
        props = props.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        props = props.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        props = props.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        props = props.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        props = props.with_reply_to(v.clone());
    }
    if let Some(v) = original.message_id() {
        props = props.with_message_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        props = props.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        props = props.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        props = props.with_app_id(v.clone());
    }
    (props, headers)
}

fn put_str(headers: &mut FieldTable, name: &str, value: &str) {
    headers.insert(name.into(), AMQPValue::LongString(value.into()));
}

/// `headers` without `name` (a `FieldTable` has no removal of its own).
fn remove(headers: &mut FieldTable, name: &str) {
    if headers.inner().contains_key(name) {
        let mut kept = headers.inner().clone();
        kept.remove(name);
        *headers = kept.into();
    }
}

fn put_u64(headers: &mut FieldTable, name: &str, value: u64) {
    headers.insert(
        name.into(),
        AMQPValue::LongLongInt(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

/// `properties` with [`PUBLISH_ID_HEADER`] set to `id` (replacing the one a consumed message
/// carried from its own publish).
pub fn with_publish_id(properties: BasicProperties, id: u64) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    put_u64(&mut headers, PUBLISH_ID_HEADER, id);
    properties.with_headers(headers)
}

/// An envelope's deferral accounting as its next copy carries it: the deferrals so far, when
/// it was first tried (its horizon's start; none while it has only waited for busy endpoints),
/// and its busy deferrals in a row (the header is left out at 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferrals {
    pub count: u32,
    pub first_try_ms: Option<u64>,
    pub busy: u32,
    /// When it went to wait this time ([`WAITING_SINCE_HEADER`]); `None` leaves the header as
    /// the original carried it.
    pub waiting_since_ms: Option<u64>,
}

/// Properties for a republish into a tier: the original message with the attempt count, the
/// tenant, the due time and the last error, and the deferral accounting when given (the
/// worker's retries always give it; their header table is built once).
pub fn retry_properties(
    original: &BasicProperties,
    tenant: &str,
    attempts_made: u32,
    due_ms: u64,
    last_error: &str,
    endpoint: Option<&str>,
    deferrals: Option<Deferrals>,
) -> BasicProperties {
    let (props, mut headers) = carried(original);
    put_str(&mut headers, TENANT_HEADER, tenant);
    if let Some(endpoint) = endpoint {
        put_str(&mut headers, ENDPOINT_HEADER, endpoint);
    }
    put_u64(&mut headers, ATTEMPTS_HEADER, attempts_made.into());
    put_u64(&mut headers, DUE_HEADER, due_ms);
    put_str(
        &mut headers,
        LAST_ERROR_HEADER,
        cut(last_error, MAX_ERROR_LEN),
    );
    if let Some(deferrals) = deferrals {
        put_deferrals(&mut headers, deferrals);
    }
    props.with_headers(headers)
}

/// Adds the deferral accounting to a retry's or a dead letter's properties.
pub fn with_deferrals(properties: BasicProperties, deferrals: Deferrals) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    put_deferrals(&mut headers, deferrals);
    properties.with_headers(headers)
}

fn put_deferrals(headers: &mut FieldTable, deferrals: Deferrals) {
    put_u64(headers, DEFERRALS_HEADER, deferrals.count.into());
    match deferrals.first_try_ms {
        Some(ms) => put_u64(headers, FIRST_TRY_HEADER, ms),
        None => remove(headers, FIRST_TRY_HEADER),
    }
    if deferrals.busy > 0 {
        put_u64(headers, BUSY_DEFERRALS_HEADER, deferrals.busy.into());
    } else {
        remove(headers, BUSY_DEFERRALS_HEADER);
    }
    if let Some(ms) = deferrals.waiting_since_ms {
        put_u64(headers, WAITING_SINCE_HEADER, ms);
    }
}

/// What the dead sink records about a message beside its body and original headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter<'a> {
    pub reason: &'a str,
    pub error: &'a str,
    pub status: Option<u16>,
    pub attempts_made: u32,
    /// Known for valid envelopes; an invalid one keeps its other headers, but no tenant header.
    pub tenant: Option<&'a str>,
}

/// Properties for a message moved to the dead sink.
pub fn dead_properties(original: &BasicProperties, dead: &DeadLetter<'_>) -> BasicProperties {
    let (props, mut headers) = carried(original);
    put_str(&mut headers, REASON_HEADER, dead.reason);
    put_str(
        &mut headers,
        LAST_ERROR_HEADER,
        cut(dead.error, MAX_ERROR_LEN),
    );
    put_u64(&mut headers, ATTEMPTS_HEADER, dead.attempts_made.into());
    put_u64(&mut headers, DEAD_AT_HEADER, now_ms());
    if let Some(status) = dead.status {
        put_u64(&mut headers, STATUS_HEADER, status.into());
    }
    match dead.tenant {
        Some(tenant) => put_str(&mut headers, TENANT_HEADER, tenant),
        // Not a valid envelope: a tenant header it came with is the producer's claim, which
        // redrive must not route by.
        None => remove(&mut headers, TENANT_HEADER),
    }
    props.with_headers(headers)
}

/// What the broker recorded the last time it dead-lettered a message: the first entry of its
/// `x-death` header. Read for observation and routing only, never for accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Death {
    /// The queue it was dead-lettered from (for a promotion, the tier).
    pub queue: Option<String>,
    /// The routing keys it was published with before that.
    pub routing_keys: Vec<String>,
}

fn amqp_str(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// The latest `x-death` entry, if the message has one of the broker's shape.
pub fn last_death(properties: &BasicProperties) -> Option<Death> {
    let AMQPValue::FieldArray(deaths) = header(properties.headers().as_ref(), "x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(latest) = deaths.as_slice().first()? else {
        return None;
    };
    let fields = latest.inner();
    Some(Death {
        queue: fields.get("queue").and_then(amqp_str),
        routing_keys: match fields.get("routing-keys") {
            Some(AMQPValue::FieldArray(keys)) => {
                keys.as_slice().iter().filter_map(amqp_str).collect()
            }
            _ => Vec::new(),
        },
    })
}

/// Why the broker first dead-lettered the message (`expired`, `rejected`, ...), for messages a
/// lane dead-lettered by itself.
pub fn first_death_reason(properties: &BasicProperties) -> Option<String> {
    header(properties.headers().as_ref(), "x-first-death-reason").and_then(amqp_str)
}

/// The tier of `ladder` that promoted the message: the queue it was last dead-lettered from,
/// when that is one of the ladder's tiers. Anything else in `x-death` (which a producer can
/// write) names nothing, so it can never become a metric label of its own.
pub fn promoting_tier(ladder: &Ladder, properties: &BasicProperties) -> Option<TierId> {
    match ladder.role_of(&last_death(properties)?.queue?)? {
        QueueRole::Tier(tier) => Some(tier),
        _ => None,
    }
}

/// Properties for a message redriven out of the dead sink: the original message with a fresh
/// attempt budget (hookrelay's accounting and dead-letter headers removed) and the redrive
/// recorded.
pub fn redrive_properties(dead: &BasicProperties) -> BasicProperties {
    let (props, carried_headers) = carried(dead);
    let forget = [
        ATTEMPTS_HEADER,
        DEFERRALS_HEADER,
        BUSY_DEFERRALS_HEADER,
        FIRST_TRY_HEADER,
        WAITING_SINCE_HEADER,
        PARKED_AT_HEADER,
        DUE_HEADER,
        LAST_ERROR_HEADER,
        REASON_HEADER,
        STATUS_HEADER,
        DEAD_AT_HEADER,
        ENDPOINT_HEADER,
        REDRIVES_HEADER,
        REDRIVEN_AT_HEADER,
        SHARD_HEADER,
    ];
    let mut headers = FieldTable::default();
    for (k, v) in &carried_headers {
        if !forget.contains(&k.as_str()) {
            headers.insert(k.clone(), v.clone());
        }
    }
    let redrives = read_u64_header(dead, REDRIVES_HEADER).unwrap_or(0) + 1;
    put_u64(&mut headers, REDRIVES_HEADER, redrives);
    put_u64(&mut headers, REDRIVEN_AT_HEADER, now_ms());
    props.with_headers(headers)
}

/// The replay a copy came from ([`REPLAY_HEADER`]); `None` for an original.
pub fn replay_of(properties: &BasicProperties) -> Option<&str> {
    header_str(properties.headers().as_ref(), REPLAY_HEADER)
        .ok()
        .flatten()
}

/// Reads a string header hookrelay wrote (for tools that inspect the dead sink).
pub fn read_str_header(properties: &BasicProperties, name: &'static str) -> Option<String> {
    header_str(properties.headers().as_ref(), name)
        .ok()
        .flatten()
        .map(str::to_owned)
}

/// Reads an integer header hookrelay wrote.
pub fn read_u64_header(properties: &BasicProperties, name: &'static str) -> Option<u64> {
    header_u64(properties.headers().as_ref(), name)
        .ok()
        .flatten()
}

/// Properties of a delivery parked for a paused subscription at `now_ms`: the original's,
/// unchanged (its id, its attempt count, what the broker recorded), with its tenant written
/// down, since the routing key that carried it is not kept in the parking queue, and when it
/// was parked.
pub fn parked_properties(original: &BasicProperties, tenant: &str, now_ms: u64) -> BasicProperties {
    let mut headers = original.headers().clone().unwrap_or_default();
    put_str(&mut headers, TENANT_HEADER, tenant);
    put_u64(&mut headers, PARKED_AT_HEADER, now_ms);
    original.clone().with_headers(headers)
}

/// Properties of a parked delivery returned at `now_ms` when its subscription is resumed. The
/// time it was held does not count against its delivery horizon: its first try moves later by
/// as much. It waits afresh from now, so what its endpoint did before the resume is not fresh
/// evidence against it. Without this, an envelope parked for longer than its horizon was
/// dead-lettered `horizon_expired` at its first deferral after the resume.
pub fn returned_properties(parked: &BasicProperties, now_ms: u64) -> BasicProperties {
    let mut headers = parked.headers().clone().unwrap_or_default();
    let Some(parked_at) = header_u64(Some(&headers), PARKED_AT_HEADER).ok().flatten() else {
        return parked.clone();
    };
    let held = now_ms.saturating_sub(parked_at);
    if let Some(first) = header_u64(Some(&headers), FIRST_TRY_HEADER).ok().flatten() {
        put_u64(&mut headers, FIRST_TRY_HEADER, first.saturating_add(held));
    }
    if header_u64(Some(&headers), WAITING_SINCE_HEADER)
        .ok()
        .flatten()
        .is_some()
    {
        put_u64(&mut headers, WAITING_SINCE_HEADER, now_ms);
    }
    remove(&mut headers, PARKED_AT_HEADER);
    parked.clone().with_headers(headers)
}

/// `properties` carrying the shard of the lane its delivery came from, or no shard header for a
/// lane that is not a shard (a sharded ladder then returns the copy to retry shard 0).
pub fn with_shard(properties: BasicProperties, shard: Option<u16>) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    match shard {
        Some(i) => put_str(&mut headers, SHARD_HEADER, &i.to_string()),
        None if headers.inner().contains_key(SHARD_HEADER) => remove(&mut headers, SHARD_HEADER),
        None => return properties,
    }
    properties.with_headers(headers)
}

/// Properties for one delivery of a fan-out: the event's properties with the derived id, the
/// subscription, and the event id. An event fanned out from the retry lane (deferred while its
/// tenant's subscriptions could not be read) carries the accounting of its wait and its shard:
/// left out, since each delivery is a first attempt, on the first-attempt lane, which refuses
/// them.
pub fn fanout_properties(
    original: &BasicProperties,
    derived: &EnvelopeId,
    subscription: &str,
    event_id: &str,
) -> BasicProperties {
    let (props, mut headers) = carried(original);
    for waited in [
        ATTEMPTS_HEADER,
        DUE_HEADER,
        DEFERRALS_HEADER,
        BUSY_DEFERRALS_HEADER,
        FIRST_TRY_HEADER,
        WAITING_SINCE_HEADER,
        LAST_ERROR_HEADER,
        ENDPOINT_HEADER,
        SHARD_HEADER,
    ] {
        remove(&mut headers, waited);
    }
    put_str(&mut headers, SUBSCRIPTION_HEADER, subscription);
    put_str(&mut headers, EVENT_ID_HEADER, event_id);
    props
        .with_message_id(derived.to_short_string())
        .with_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::envelope::Envelope;
    use crate::contract::envelope::tests::event;

    #[test]
    fn a_fan_out_of_a_deferred_event_is_a_first_attempt() {
        let original = event().properties();
        let deferred = with_shard(
            retry_properties(
                &original,
                "acme",
                0,
                9,
                "the subscription store cannot be read",
                None,
                Some(Deferrals {
                    count: 2,
                    first_try_ms: Some(1),
                    busy: 0,
                    waiting_since_ms: Some(5),
                }),
            ),
            Some(3),
        );
        let derived = crate::contract::envelope::derived_id("evt_1", "sub_a");
        let copy = fanout_properties(&deferred, &derived, "sub_a", "evt_1");
        let headers = copy.headers().clone().unwrap_or_default();
        for gone in [
            ATTEMPTS_HEADER,
            DUE_HEADER,
            DEFERRALS_HEADER,
            FIRST_TRY_HEADER,
            WAITING_SINCE_HEADER,
            LAST_ERROR_HEADER,
            SHARD_HEADER,
        ] {
            assert!(!headers.inner().contains_key(gone), "{gone}");
        }
        let read = |name| header_str(Some(&headers), name).ok().flatten();
        assert_eq!(read(TENANT_HEADER), Some("acme"));
        assert_eq!(read(EVENT_ID_HEADER), Some("evt_1"));
        assert_eq!(
            copy.message_id().as_ref().map(|m| m.as_str()),
            Some(derived.to_string().as_str())
        );
    }

    #[test]
    fn every_copy_carries_the_trace_context() {
        use crate::contract::trace_context::{TRACEPARENT, TRACESTATE, parent_of};
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = FieldTable::default();
        put_str(&mut h, TRACEPARENT, parent);
        put_str(&mut h, TRACESTATE, "ven=1");
        let original = event().properties().with_headers(h);
        let dead = dead_properties(
            &original,
            &DeadLetter {
                reason: "exhausted",
                error: "HTTP 503",
                status: Some(503),
                attempts_made: 3,
                tenant: Some("acme"),
            },
        );
        let deferrals = Deferrals {
            count: 1,
            first_try_ms: None,
            busy: 1,
            waiting_since_ms: Some(1),
        };
        let retried = retry_properties(&original, "acme", 1, 9, "HTTP 503", None, None);
        let copies = [
            ("retry", retried.clone()),
            ("deferral", with_deferrals(retried, deferrals)),
            ("redrive", redrive_properties(&dead)),
            ("dead", dead),
            ("parked", parked_properties(&original, "acme", 5)),
            (
                "returned",
                returned_properties(&parked_properties(&original, "acme", 5), 9),
            ),
            (
                "fan-out",
                fanout_properties(
                    &original,
                    &crate::contract::envelope::derived_id("evt_1", "sub_a"),
                    "sub_a",
                    "evt_1",
                ),
            ),
            ("shard", with_shard(original.clone(), Some(2))),
        ];
        for (copy, props) in copies {
            let cx = parent_of(props.headers().as_ref()).unwrap_or_else(|| panic!("{copy}"));
            let span = opentelemetry::trace::TraceContextExt::span(&cx);
            let sc = span.span_context();
            assert_eq!(
                sc.trace_id().to_string(),
                "4bf92f3577b34da6a3ce929d0e0e4736",
                "{copy}"
            );
            assert_eq!(sc.trace_state().header(), "ven=1", "{copy}");
        }
    }

    #[test]
    fn a_retry_with_its_deferrals_in_one_pass_carries_what_the_two_steps_give() {
        let mut h = FieldTable::default();
        put_u64(&mut h, BUSY_DEFERRALS_HEADER, 3);
        put_u64(&mut h, FIRST_TRY_HEADER, 5);
        put_str(&mut h, "x-producer", "kept");
        let original = event().properties().with_headers(h);
        for deferrals in [
            Deferrals {
                count: 4,
                first_try_ms: Some(7),
                busy: 0,
                waiting_since_ms: Some(8),
            },
            Deferrals {
                count: 1,
                first_try_ms: None,
                busy: 2,
                waiting_since_ms: None,
            },
        ] {
            let two = with_deferrals(
                retry_properties(&original, "acme", 2, 9, "HTTP 503", Some("e#1"), None),
                deferrals,
            );
            let one = retry_properties(
                &original,
                "acme",
                2,
                9,
                "HTTP 503",
                Some("e#1"),
                Some(deferrals),
            );
            assert_eq!(one, two);
        }
    }

    #[test]
    fn sizes_measured_in_the_kept_buffer_match_a_fresh_encoding() {
        let mut h = FieldTable::default();
        put_str(&mut h, "x-a", &"a".repeat(300));
        put_u64(&mut h, "x-b", 1);
        let props = BasicProperties::default().with_headers(h.clone());
        for _ in 0..3 {
            let fresh = gen_properties(&props)(Vec::new().into())
                .map(|c| c.into_inner().0.len())
                .unwrap();
            assert_eq!(content_header_frame_len(&props), fresh + 20);
            for (k, v) in &h {
                let fresh = gen_value(v)(Vec::new().into())
                    .map(|c| c.into_inner().0.len())
                    .unwrap();
                assert_eq!(entry_len(k.as_str(), v), 1 + k.as_str().len() + fresh);
            }
        }
    }

    fn died_in(queue: &str) -> BasicProperties {
        let mut death = FieldTable::default();
        death.insert("queue".into(), AMQPValue::LongString(queue.into()));
        let mut h = FieldTable::default();
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
        );
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn a_copy_leaves_out_what_is_over_the_limits_and_says_so() {
        let e = event();
        let text = |s: String| AMQPValue::LongString(s.into());
        let mut h = e.properties().headers().clone().unwrap();
        h.insert("x-small".into(), text("s".into()));
        let valid = e.properties().with_headers(h.clone());
        h.insert("x-big".into(), text("b".repeat(100_000)));
        h.insert(LAST_ERROR_HEADER.into(), text("e".repeat(5_000)));
        let oversized = e.properties().with_headers(h);
        assert!(matches!(
            check_header_sizes(oversized.headers().as_ref()),
            Err(InvalidEnvelope::HeaderTooLong { .. } | InvalidEnvelope::HeadersTooLarge { .. })
        ));
        let dead = dead_properties(
            &oversized,
            &DeadLetter {
                reason: "invalid",
                error: "too big",
                status: None,
                attempts_made: 0,
                tenant: None,
            },
        );
        // The copy reads back within the limits and fits a frame.
        check_header_sizes(dead.headers().as_ref()).unwrap();
        assert!(content_header_frame_len(&dead) < FRAME_MAX / 2 + 4096);
        let kept = dead.headers().clone().unwrap();
        assert!(kept.contains_key("x-small") && kept.contains_key(SUBSCRIPTION_HEADER));
        assert!(!kept.contains_key("x-big"));
        assert_eq!(
            read_str_header(&dead, LAST_ERROR_HEADER).as_deref(),
            Some("too big")
        );
        assert_eq!(
            read_str_header(&dead, HEADERS_DROPPED_HEADER).as_deref(),
            Some(
                "2 header(s) of 105039 bytes left out to fit the broker's frame size: \
                 x-hookrelay-last-error, x-big"
            )
        );
        // A valid envelope's copies keep every header.
        let retry = retry_properties(&valid, "acme", 1, 0, "HTTP 503", None, None);
        assert!(retry.headers().as_ref().unwrap().contains_key("x-small"));
        assert_eq!(read_str_header(&retry, HEADERS_DROPPED_HEADER), None);
    }

    #[test]
    fn only_the_ladders_tiers_name_a_promotion() {
        let ladder =
            crate::contract::ladder::Ladder::parse(include_str!("../../topology/ladder.toml"))
                .unwrap();
        let tier = ladder.tier_at(1).unwrap();
        assert_eq!(
            promoting_tier(&ladder, &died_in(&ladder.tier_queue(tier))),
            Some(tier)
        );
        // `x-death` is the producer's to forge: random names, other roles, other prefixes.
        for forged in [
            "forged-0f3a".to_owned(),
            "retry-1m".to_owned(),
            ladder.retry_lane(),
            ladder.dead(),
            ladder.held_queue(tier),
            "other.retry-1m".to_owned(),
            "x".repeat(5000),
        ] {
            assert_eq!(promoting_tier(&ladder, &died_in(&forged)), None, "{forged}");
        }
        assert_eq!(promoting_tier(&ladder, &BasicProperties::default()), None);
    }

    #[test]
    fn retries_carry_our_accounting_and_drop_the_brokers() {
        let e = event();
        let mut original = e.properties();
        let mut headers = original.headers().clone().unwrap();
        headers.insert("x-death".into(), AMQPValue::LongString("old".into()));
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(2));
        original = original
            .with_headers(headers)
            .with_expiration("1000".into());
        let retry = retry_properties(
            &original,
            "acme",
            2,
            99,
            "HTTP 503",
            Some("h#01020304"),
            None,
        );
        assert_eq!(retry.expiration(), &None);
        assert_eq!(retry.message_id(), original.message_id());
        let envelope = Envelope::from_delivery(&retry, "retry-10s.acme", &e.body, 1024).unwrap();
        assert_eq!(envelope.tenant, "acme");
        assert_eq!(envelope.attempts_made, 2);
        assert_eq!(envelope.due_ms, Some(99));
        assert_eq!(envelope.last_endpoint.as_deref(), Some("h#01020304"));
        assert!(envelope.subscription_existed());
        let h = retry.headers().as_ref().unwrap();
        assert!(!h.inner().contains_key("x-death"));
        assert!(!h.inner().contains_key("x-delivery-count"));
        assert_eq!(
            read_str_header(&retry, LAST_ERROR_HEADER).as_deref(),
            Some("HTTP 503")
        );

        let dead = dead_properties(
            &retry,
            &DeadLetter {
                reason: "rejected",
                error: &"e".repeat(2000),
                status: Some(400),
                attempts_made: 3,
                tenant: Some("acme"),
            },
        );
        assert_eq!(
            read_str_header(&dead, REASON_HEADER).as_deref(),
            Some("rejected")
        );
        assert_eq!(read_u64_header(&dead, STATUS_HEADER), Some(400));
        assert_eq!(read_u64_header(&dead, ATTEMPTS_HEADER), Some(3));
        assert_eq!(
            read_str_header(&dead, LAST_ERROR_HEADER).unwrap().len(),
            512
        );
        assert_eq!(
            read_str_header(&dead, SUBSCRIPTION_HEADER).as_deref(),
            Some("sub_orders")
        );
    }
}
