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

use crate::contract::headers::{
    ATTEMPTS_HEADER, BUSY_DEFERRALS_HEADER, DEFERRALS_HEADER, DUE_HEADER, ENDPOINT_HEADER,
    EVENT_ID_HEADER, FIRST_TRY_HEADER, SUBSCRIPTION_HEADER, TENANT_HEADER, WAITING_SINCE_HEADER,
    check_header_sizes, header_str, header_u64,
};
use crate::units::{now_ms, shorten};

/// Longest envelope id, tenant id and event type accepted.
pub const MAX_ID_LEN: usize = 128;
pub const MAX_TENANT_LEN: usize = 64;
pub const MAX_TYPE_LEN: usize = 128;
/// An attempts header above this is not something hookrelay wrote.
const MAX_PLAUSIBLE_ATTEMPTS: u64 = 10_000;
/// A refused id, tenant or event type is quoted up to this many bytes.
const MAX_SHOWN_LEN: usize = 80;

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
    #[error(
        "header x-hookrelay-tenant {claimed:?} disagrees with the routing key {routed:?}; \
         hookrelay sets it only beside a routing key naming the same tenant"
    )]
    TenantDisagrees { claimed: String, routed: String },
    #[error(
        "headers take {size} bytes, over the {max}-byte limit (hookrelay's copies must fit the \
         broker's frame size)"
    )]
    HeadersTooLarge { size: usize, max: usize },
    #[error("header {header} takes {size} bytes, over the {max} bytes it ever needs")]
    HeaderTooLong {
        header: &'static str,
        size: usize,
        max: usize,
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

/// An envelope id: the idempotency key, sent as `webhook-id` and `Idempotency-Key` on every
/// attempt, redrive and replay. Only [`EnvelopeId::parse`] and [`derived_id`] make one, so it is
/// always 1 to 128 ASCII letters, digits, `_` or `-`: a valid header value and AMQP short string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnvelopeId(String);

impl EnvelopeId {
    pub fn parse(id: &str) -> Result<Self, InvalidEnvelope> {
        check_id(id)?;
        Ok(Self(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as the `message_id` property. At most 128 bytes by construction, so within a
    /// short string's 255.
    pub fn to_short_string(&self) -> ShortString {
        ShortString::try_new(self.0.as_str()).unwrap_or_default()
    }
}

impl std::fmt::Display for EnvelopeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for EnvelopeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for EnvelopeId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for EnvelopeId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
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

    /// The AMQP properties the contract asks for. Call [`NewEvent::validate`] first: an id or
    /// type over a short string's 255 bytes is left out rather than panicking here, so the
    /// message would read back as invalid.
    pub fn properties(&self) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(subscription) = &self.subscription {
            headers.insert(
                SUBSCRIPTION_HEADER.into(),
                AMQPValue::LongString(subscription.as_str().into()),
            );
        }
        BasicProperties::default()
            .with_message_id(ShortString::try_new(self.id.as_str()).unwrap_or_default())
            .with_type(ShortString::try_new(self.event_type.as_str()).unwrap_or_default())
            .with_timestamp(self.timestamp.unwrap_or_else(|| now_ms() / 1000))
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers)
    }
}

/// A delivery read as an envelope. The body stays with the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub id: EnvelopeId,
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
    /// Deferrals so far (no request made); not part of the attempt budget.
    pub deferrals: u32,
    /// When it first went to a tier: the start of its delivery horizon.
    pub first_try_ms: Option<u64>,
    /// When it last went to wait (its last attempt or deferral).
    pub waiting_since_ms: Option<u64>,
    /// Deferrals in a row for a busy endpoint (at a limit, not down): which deferral queue the
    /// next one waits in.
    pub busy_deferrals: u32,
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
        check_header_sizes(properties.headers().as_ref())?;
        let id = EnvelopeId::parse(
            properties
                .message_id()
                .as_ref()
                .ok_or(InvalidEnvelope::MissingId)?
                .as_str(),
        )?;
        let headers = properties.headers().as_ref();
        let tenant = match header_str(headers, TENANT_HEADER)? {
            None => routing_key,
            Some(claimed) if claimed == routed_tenant(routing_key) => claimed,
            // Anyone can set the header; the routing key is what put the message on this
            // tenant's lane, so a header naming someone else is a forgery, not a tenant.
            Some(claimed) => {
                return Err(InvalidEnvelope::TenantDisagrees {
                    claimed: shorten(claimed, MAX_SHOWN_LEN),
                    routed: shorten(routing_key, MAX_SHOWN_LEN),
                });
            }
        };
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
        let deferrals = match header_u64(headers, DEFERRALS_HEADER)? {
            None => 0,
            Some(n) => u32::try_from(n).map_err(|_| InvalidEnvelope::BadHeader {
                header: DEFERRALS_HEADER,
                expected: "a deferral count hookrelay wrote",
                found: n.to_string(),
            })?,
        };
        let first_try_ms = header_u64(headers, FIRST_TRY_HEADER)?;
        let waiting_since_ms = header_u64(headers, WAITING_SINCE_HEADER)?;
        let busy_deferrals = match header_u64(headers, BUSY_DEFERRALS_HEADER)? {
            None => 0,
            Some(n) => u32::try_from(n).map_err(|_| InvalidEnvelope::BadHeader {
                header: BUSY_DEFERRALS_HEADER,
                expected: "a deferral count hookrelay wrote",
                found: n.to_string(),
            })?,
        };
        check_body(body, max_body)?;
        Ok(Self {
            id,
            tenant: tenant.to_owned(),
            event_type: event_type.to_owned(),
            subscription: subscription.map(str::to_owned),
            event_id: event_id.map(str::to_owned),
            attempts_made,
            due_ms,
            last_endpoint: last_endpoint.map(str::to_owned),
            deferrals,
            first_try_ms,
            waiting_since_ms,
            busy_deferrals,
        })
    }

    /// Whether the subscription was known to exist when this envelope was made or last tried,
    /// so its absence now means it was deleted rather than never existed.
    pub fn subscription_existed(&self) -> bool {
        self.attempts_made > 0 || self.event_id.is_some()
    }
}

/// The tenant a routing key names: the key itself from the ingress, the part after the tier
/// from the tiers (`retry-10s.acme`). Tenant ids have no dots, tier names neither.
fn routed_tenant(routing_key: &str) -> &str {
    routing_key
        .split_once('.')
        .map_or(routing_key, |(_, tenant)| tenant)
}

/// The id of the delivery of event `event_id` to subscription `subscription_id` made by fan-out:
/// `d_` and the first 32 hex digits of SHA-256 of `"{event_id}\n{subscription_id}"`. The same
/// event fanned out twice gives the same ids, so a consumer never sees two ids for one event and
/// subscription.
pub fn derived_id(event_id: &str, subscription_id: &str) -> EnvelopeId {
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
    // `d_` and hex digits: an id by construction.
    EnvelopeId(id)
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::contract::headers::fanout_properties;

    /// The event the contract's unit tests start from.
    pub(crate) fn event() -> NewEvent {
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
                id: EnvelopeId::parse(&e.id).unwrap(),
                tenant: "acme".into(),
                event_type: "order.paid".into(),
                subscription: Some("sub_orders".into()),
                event_id: None,
                attempts_made: 0,
                due_ms: None,
                last_endpoint: None,
                deferrals: 0,
                first_try_ms: None,
                waiting_since_ms: None,
                busy_deferrals: 0,
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
    fn a_tenant_header_must_agree_with_the_routing_key() {
        let e = event();
        let with_tenant = |tenant: &str| {
            let mut h = e.properties().headers().clone().unwrap();
            h.insert(TENANT_HEADER.into(), AMQPValue::LongString(tenant.into()));
            e.properties().with_headers(h)
        };
        let read = |props: &BasicProperties, key: &str| {
            Envelope::from_delivery(props, key, &e.body, 1024).map(|env| env.tenant)
        };
        // Straight from the ingress the routing key is the tenant; through the tiers it is
        // `<tier>.<tenant>`, with hookrelay's header beside it.
        assert_eq!(read(&with_tenant("acme"), "acme").unwrap(), "acme");
        assert_eq!(
            read(&with_tenant("acme"), "retry-10s.acme").unwrap(),
            "acme"
        );
        for (claimed, key) in [
            ("globex", "acme"),
            ("globex", "retry-10s.acme"),
            ("acme", "hookrelay.ready.first"),
            ("acme", "retry-10s.acme.x"),
        ] {
            match read(&with_tenant(claimed), key) {
                Err(err) => assert!(
                    err.to_string().starts_with("header x-hookrelay-tenant"),
                    "{claimed} on {key}: {err}"
                ),
                Ok(tenant) => panic!("{claimed:?} on {key:?} read as tenant {tenant:?}"),
            }
        }
    }

    #[test]
    fn fan_out_ids_are_stable_and_distinct() {
        let a = derived_id("evt_1", "sub_a");
        assert_eq!(a, derived_id("evt_1", "sub_a"));
        assert_ne!(a, derived_id("evt_1", "sub_b"));
        assert_ne!(derived_id("evt_1", "sub_a"), derived_id("evt_1s", "ub_a"));
        assert_eq!(a.as_str().len(), 34);
        check_id(a.as_str()).unwrap();
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
