//! The envelope contract: what a producer publishes, how a delivery is read back into an
//! [`Envelope`], and the headers hookrelay adds when it moves a message to a tier or the sink.
//!
//! A producer publishes to `<prefix>.ingress` with routing key = tenant id, `delivery_mode` 2,
//! `message_id` = envelope id (the idempotency key), `type` = event type, optional `timestamp`,
//! header `x-subscription` and the JSON body. The same checks run before publishing
//! ([`NewEvent::validate`]) and when a delivery is read ([`Envelope::from_delivery`]), so a
//! message that could not have been published by us is refused the same way in both places.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use crate::units::{cut, now_ms, shorten};

/// Header naming the subscription to deliver to (set by the producer). Without it the event
/// fans out to every matching subscription of its tenant.
pub const SUBSCRIPTION_HEADER: &str = "x-subscription";
/// On a delivery made by fan-out: the `message_id` of the event it came from.
pub const EVENT_ID_HEADER: &str = "x-hookrelay-event-id";
/// The endpoint the last attempt went to (`host#hash`), to notice a repointed subscription.
pub const ENDPOINT_HEADER: &str = "x-hookrelay-endpoint";
/// The tenant, carried once a message leaves the ingress (whose routing key was the tenant).
pub const TENANT_HEADER: &str = "x-hookrelay-tenant";
/// Attempts already made. Ours alone: the broker's `x-death` counts are never trusted.
pub const ATTEMPTS_HEADER: &str = "x-hookrelay-attempts";
/// When the next attempt is due, in milliseconds since the epoch.
pub const DUE_HEADER: &str = "x-hookrelay-due-ms";
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

/// Longest envelope id, tenant id and event type accepted.
pub const MAX_ID_LEN: usize = 128;
pub const MAX_TENANT_LEN: usize = 64;
pub const MAX_TYPE_LEN: usize = 128;
/// Error text kept in headers is cut to this many bytes.
const MAX_ERROR_LEN: usize = 512;
/// A refused id, tenant or type is shown up to this many bytes.
const MAX_SHOWN_LEN: usize = 80;
/// An attempts header above this is not something hookrelay wrote.
const MAX_PLAUSIBLE_ATTEMPTS: u64 = 10_000;

/// Why a message is not a valid envelope. The text is what operators read in the dead sink.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEnvelope {
    #[error("message_id is missing; it is the envelope id and the idempotency key")]
    MissingId,
    #[error(
        "message_id {0:?} is not an envelope id: use 1 to 128 letters, digits, '_' or '-' (no '.')"
    )]
    BadId(String),
    #[error("tenant {0:?} is not a tenant id: use 1 to 64 letters, digits, '_' or '-'")]
    BadTenant(String),
    #[error("type (the event type) is missing")]
    MissingType,
    #[error("type {0:?} is not an event type: use 1 to 128 letters, digits, '.', '_', '-' or ':'")]
    BadType(String),
    #[error(
        "header x-subscription is missing; only a new event on the first-attempt lane may leave \
         it out (to fan out)"
    )]
    MissingSubscription,
    #[error("header {header} must be {expected}, found {found}")]
    BadHeader {
        header: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("body is {size} bytes, over the {max}-byte limit")]
    BodyTooLarge { size: usize, max: usize },
    #[error("body is not JSON: {0}")]
    NotJson(String),
}

/// Checks an envelope id: letters, digits, `_`, `-`; 1 to 128 characters.
pub fn check_id(id: &str) -> Result<(), InvalidEnvelope> {
    if is_token(id, MAX_ID_LEN, &['_', '-']) {
        Ok(())
    } else {
        Err(InvalidEnvelope::BadId(shorten(id, MAX_SHOWN_LEN)))
    }
}

/// Checks a tenant id: it is a routing key and a routing-key word, so no dots.
pub fn check_tenant(tenant: &str) -> Result<(), InvalidEnvelope> {
    if is_token(tenant, MAX_TENANT_LEN, &['_', '-']) {
        Ok(())
    } else {
        Err(InvalidEnvelope::BadTenant(shorten(tenant, MAX_SHOWN_LEN)))
    }
}

pub fn check_event_type(kind: &str) -> Result<(), InvalidEnvelope> {
    if is_token(kind, MAX_TYPE_LEN, &['.', '_', '-', ':']) {
        Ok(())
    } else {
        Err(InvalidEnvelope::BadType(shorten(kind, MAX_SHOWN_LEN)))
    }
}

/// Checks the size cap and that the body is one JSON value (without building it).
pub fn check_body(body: &[u8], max: usize) -> Result<(), InvalidEnvelope> {
    if body.len() > max {
        return Err(InvalidEnvelope::BodyTooLarge {
            size: body.len(),
            max,
        });
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map(|_| ())
        .map_err(|e| InvalidEnvelope::NotJson(e.to_string()))
}

fn is_token(s: &str, max: usize, extra: &[char]) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

/// An event as a producer hands it to [`crate::broker::publish::Publisher::publish_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The envelope id; the producer chooses it so a retried publish is recognisably the same.
    pub id: String,
    pub tenant: String,
    pub event_type: String,
    /// The subscription to deliver to; `None` fans the event out to every enabled subscription
    /// of the tenant that receives its type.
    pub subscription: Option<String>,
    /// Seconds since the epoch; set to now when `None`.
    pub timestamp: Option<u64>,
    pub body: Vec<u8>,
}

impl NewEvent {
    pub fn validate(&self, max_body: usize) -> Result<(), InvalidEnvelope> {
        check_id(&self.id)?;
        check_tenant(&self.tenant)?;
        check_event_type(&self.event_type)?;
        if self.subscription.as_deref() == Some("") {
            return Err(InvalidEnvelope::MissingSubscription);
        }
        check_body(&self.body, max_body)
    }

    /// The AMQP properties the contract asks for. Call [`NewEvent::validate`] first.
    pub fn properties(&self) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(subscription) = &self.subscription {
            headers.insert(
                SUBSCRIPTION_HEADER.into(),
                AMQPValue::LongString(subscription.as_str().into()),
            );
        }
        BasicProperties::default()
            .with_message_id(ShortString::from(self.id.as_str()))
            .with_type(ShortString::from(self.event_type.as_str()))
            .with_timestamp(self.timestamp.unwrap_or_else(|| now_ms() / 1000))
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers)
    }
}

/// A delivery read as an envelope. The body stays with the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub id: String,
    pub tenant: String,
    pub event_type: String,
    /// `None`: an event to fan out.
    pub subscription: Option<String>,
    /// For a delivery made by fan-out, the event's own id.
    pub event_id: Option<String>,
    /// Attempts made before this one.
    pub attempts_made: u32,
    /// When this attempt became due (ms since the epoch), for a message promoted from a tier.
    pub due_ms: Option<u64>,
    /// Where the previous attempt went ([`endpoint_fingerprint`]).
    pub last_endpoint: Option<String>,
}

impl Envelope {
    /// Reads a delivery. `routing_key` is the tenant for a message straight from the ingress;
    /// messages hookrelay republished carry the tenant in a header instead.
    pub fn from_delivery(
        properties: &BasicProperties,
        routing_key: &str,
        body: &[u8],
        max_body: usize,
    ) -> Result<Self, InvalidEnvelope> {
        let id = properties
            .message_id()
            .as_ref()
            .ok_or(InvalidEnvelope::MissingId)?
            .as_str();
        check_id(id)?;
        let headers = properties.headers().as_ref();
        let tenant = header_str(headers, TENANT_HEADER)?.unwrap_or(routing_key);
        check_tenant(tenant)?;
        let event_type = properties
            .kind()
            .as_ref()
            .ok_or(InvalidEnvelope::MissingType)?
            .as_str();
        check_event_type(event_type)?;
        let subscription = header_str(headers, SUBSCRIPTION_HEADER)?.filter(|s| !s.is_empty());
        let event_id = header_str(headers, EVENT_ID_HEADER)?;
        let last_endpoint = header_str(headers, ENDPOINT_HEADER)?;
        let attempts_made = match header_u64(headers, ATTEMPTS_HEADER)? {
            None => 0,
            Some(n) if n <= MAX_PLAUSIBLE_ATTEMPTS => n as u32,
            Some(n) => {
                return Err(InvalidEnvelope::BadHeader {
                    header: ATTEMPTS_HEADER,
                    expected: "an attempt count hookrelay wrote",
                    found: n.to_string(),
                });
            }
        };
        let due_ms = header_u64(headers, DUE_HEADER)?;
        check_body(body, max_body)?;
        Ok(Self {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            event_type: event_type.to_owned(),
            subscription: subscription.map(str::to_owned),
            event_id: event_id.map(str::to_owned),
            attempts_made,
            due_ms,
            last_endpoint: last_endpoint.map(str::to_owned),
        })
    }

    /// Whether the subscription was known to exist when this envelope was made or last tried,
    /// so its absence now means it was deleted rather than never existed.
    pub fn subscription_existed(&self) -> bool {
        self.attempts_made > 0 || self.event_id.is_some()
    }
}

/// The id of the delivery of event `event_id` to subscription `subscription_id` made by fan-out:
/// `d_` and the first 32 hex digits of SHA-256 of `"{event_id}\n{subscription_id}"`. The same
/// event fanned out twice gives the same ids, so a consumer never sees two ids for one event and
/// subscription.
pub fn derived_id(event_id: &str, subscription_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(event_id.as_bytes())
        .chain_update(b"\n")
        .chain_update(subscription_id.as_bytes())
        .finalize();
    let mut id = String::with_capacity(34);
    id.push_str("d_");
    for byte in &digest[..16] {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// A short, comparable trace of an endpoint URL: its host and a hash of the whole URL (which
/// may carry a token, so it is never stored as is).
pub fn endpoint_fingerprint(url: &reqwest::Url) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(url.as_str().as_bytes());
    format!(
        "{}#{:02x}{:02x}{:02x}{:02x}",
        url.host_str().unwrap_or_default(),
        digest[0],
        digest[1],
        digest[2],
        digest[3]
    )
}

/// Properties for one delivery of a fan-out: the event's properties with the derived id, the
/// subscription, and the event id.
pub fn fanout_properties(
    original: &BasicProperties,
    derived: &str,
    subscription: &str,
    event_id: &str,
) -> BasicProperties {
    let (props, mut headers) = carried(original);
    put_str(&mut headers, SUBSCRIPTION_HEADER, subscription);
    put_str(&mut headers, EVENT_ID_HEADER, event_id);
    props
        .with_message_id(ShortString::from(derived))
        .with_headers(headers)
}

fn header<'a>(headers: Option<&'a FieldTable>, name: &str) -> Option<&'a AMQPValue> {
    headers?.inner().get(name)
}

fn describe(value: &AMQPValue) -> String {
    format!("{:?}", value.get_type())
}

/// A string header; AMQP clients send strings as long or short strings.
fn header_str<'a>(
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
fn header_u64(
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
fn carried(original: &BasicProperties) -> (BasicProperties, FieldTable) {
    let mut headers = FieldTable::default();
    if let Some(h) = original.headers() {
        for (k, v) in h {
            if !BROKER_HEADERS.contains(&k.as_str()) {
                headers.insert(k.clone(), v.clone());
            }
        }
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

fn put_u64(headers: &mut FieldTable, name: &str, value: u64) {
    headers.insert(
        name.into(),
        AMQPValue::LongLongInt(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

/// Properties for a republish into a tier: the original message with the attempt count, the
/// tenant, the due time and the last error.
pub fn retry_properties(
    original: &BasicProperties,
    tenant: &str,
    attempts_made: u32,
    due_ms: u64,
    last_error: &str,
    endpoint: Option<&str>,
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
    props.with_headers(headers)
}

/// What the dead sink records about a message beside its body and original headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter<'a> {
    pub reason: &'a str,
    pub error: &'a str,
    pub status: Option<u16>,
    pub attempts_made: u32,
    /// Known for valid envelopes; an invalid one keeps whatever headers it came with.
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
    if let Some(tenant) = dead.tenant {
        put_str(&mut headers, TENANT_HEADER, tenant);
    }
    props.with_headers(headers)
}

/// The queue a message was last dead-lettered from (the broker's `x-death` header), i.e. the
/// tier that promoted it.
pub fn promoted_from(properties: &BasicProperties) -> Option<String> {
    let AMQPValue::FieldArray(deaths) = header(properties.headers().as_ref(), "x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(latest) = deaths.as_slice().first()? else {
        return None;
    };
    match latest.inner().get("queue")? {
        AMQPValue::LongString(q) => Some(String::from_utf8_lossy(q.as_bytes()).into_owned()),
        AMQPValue::ShortString(q) => Some(q.to_string()),
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
        DUE_HEADER,
        LAST_ERROR_HEADER,
        REASON_HEADER,
        STATUS_HEADER,
        DEAD_AT_HEADER,
        ENDPOINT_HEADER,
        REDRIVES_HEADER,
        REDRIVEN_AT_HEADER,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> NewEvent {
        NewEvent {
            id: "evt_123-abc".into(),
            tenant: "acme".into(),
            event_type: "order.paid".into(),
            subscription: Some("sub_orders".into()),
            timestamp: Some(1_700_000_000),
            body: br#"{"order":1}"#.to_vec(),
        }
    }

    #[test]
    fn a_published_event_reads_back_as_the_same_envelope() {
        let e = event();
        e.validate(1024).unwrap();
        let envelope = Envelope::from_delivery(&e.properties(), "acme", &e.body, 1024).unwrap();
        assert_eq!(
            envelope,
            Envelope {
                id: e.id.clone(),
                tenant: "acme".into(),
                event_type: "order.paid".into(),
                subscription: Some("sub_orders".into()),
                event_id: None,
                attempts_made: 0,
                due_ms: None,
                last_endpoint: None,
            }
        );
    }

    #[test]
    fn every_contract_rule_has_a_readable_refusal() {
        type Mutation = Box<dyn Fn(&mut NewEvent)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|e| e.id = "a.b".into()),
                "message_id \"a.b\" is not an envelope id",
            ),
            (
                Box::new(|e| e.id = "x".repeat(129)),
                "is not an envelope id",
            ),
            (Box::new(|e| e.id = String::new()), "is not an envelope id"),
            (Box::new(|e| e.tenant = "ac.me".into()), "tenant \"ac.me\""),
            (
                Box::new(|e| e.event_type = "order paid".into()),
                "type \"order paid\"",
            ),
            (
                Box::new(|e| e.subscription = Some(String::new())),
                "x-subscription is missing",
            ),
            (Box::new(|e| e.body = b"{nope".to_vec()), "body is not JSON"),
            (
                Box::new(|e| e.body = vec![b' '; 2000]),
                "body is 2000 bytes, over the 1024-byte limit",
            ),
        ];
        for (mutate, expected) in cases {
            let mut e = event();
            mutate(&mut e);
            let err = e.validate(1024).unwrap_err().to_string();
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
    }

    #[test]
    fn deliveries_with_broken_headers_are_invalid_not_fatal() {
        let e = event();
        let no_id = e.properties().with_message_id("".into());
        assert!(matches!(
            Envelope::from_delivery(&no_id, "acme", &e.body, 1024),
            Err(InvalidEnvelope::BadId(_))
        ));
        let props = BasicProperties::default()
            .with_type("order.paid".into())
            .with_headers(e.properties().headers().clone().unwrap());
        assert_eq!(
            Envelope::from_delivery(&props, "acme", &e.body, 1024),
            Err(InvalidEnvelope::MissingId)
        );
        let mut headers = FieldTable::default();
        headers.insert(SUBSCRIPTION_HEADER.into(), AMQPValue::LongLongInt(5));
        let props = e.properties().with_headers(headers);
        let err = Envelope::from_delivery(&props, "acme", &e.body, 1024).unwrap_err();
        assert_eq!(
            err.to_string(),
            "header x-subscription must be a string, found LongLongInt"
        );
        let mut headers = FieldTable::default();
        headers.insert(
            SUBSCRIPTION_HEADER.into(),
            AMQPValue::LongString("s".into()),
        );
        headers.insert(ATTEMPTS_HEADER.into(), AMQPValue::LongLongInt(-3));
        let props = e.properties().with_headers(headers.clone());
        assert!(
            Envelope::from_delivery(&props, "acme", &e.body, 1024)
                .unwrap_err()
                .to_string()
                .contains("non-negative")
        );
        headers.insert(ATTEMPTS_HEADER.into(), AMQPValue::LongLongInt(1 << 40));
        let props = e.properties().with_headers(headers);
        assert!(Envelope::from_delivery(&props, "acme", &e.body, 1024).is_err());
        // Straight onto a lane through the default exchange: the routing key is a queue name.
        assert!(matches!(
            Envelope::from_delivery(&e.properties(), "hookrelay.ready.first", &e.body, 1024),
            Err(InvalidEnvelope::BadTenant(_))
        ));
        assert!(matches!(
            Envelope::from_delivery(&e.properties(), "acme", &[0xff, 0xfe], 1024),
            Err(InvalidEnvelope::NotJson(_))
        ));
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
        let retry = retry_properties(&original, "acme", 2, 99, "HTTP 503", Some("h#01020304"));
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

    #[test]
    fn fan_out_ids_are_stable_and_distinct() {
        let a = derived_id("evt_1", "sub_a");
        assert_eq!(a, derived_id("evt_1", "sub_a"));
        assert_ne!(a, derived_id("evt_1", "sub_b"));
        assert_ne!(derived_id("evt_1", "sub_a"), derived_id("evt_1s", "ub_a"));
        assert_eq!(a.len(), 34);
        check_id(&a).unwrap();
        // The documented rule, computed independently: sha256("evt_1\nsub_a").
        assert_eq!(a, "d_b4db08b1e96c8c46ed81d22d25ca9c0e");
        let e = event();
        let child = fanout_properties(&e.properties(), &a, "sub_a", &e.id);
        let envelope = Envelope::from_delivery(&child, "acme", &e.body, 1024).unwrap();
        assert_eq!(envelope.id, a);
        assert_eq!(envelope.subscription.as_deref(), Some("sub_a"));
        assert_eq!(envelope.event_id.as_deref(), Some("evt_123-abc"));
        assert!(envelope.subscription_existed());
    }
}
