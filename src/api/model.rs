//! What the API takes and answers, as JSON. Requests refuse unknown fields; a response never
//! holds a signing secret, except the answers to a create and a rotation, once.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::store::request::StoredRequest;
use crate::store::subscriptions::{SecretDates, SubscriptionRow};

/// A new subscription.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSubscription {
    /// 1 to 128 letters, digits, `_` or `-`. Generated (`sub_<32 hex>`) when absent. Ids are
    /// unique across tenants: only an admin token names one (409 when taken); a tenant token
    /// naming one is refused (422) whatever the id, so no tenant learns another's ids.
    #[schema(example = "sub_acme_orders", pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub id: Option<String>,
    /// The tenant it belongs to. A tenant token may leave it out (its own tenant) and may name
    /// no other (422).
    #[schema(example = "acme", pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// The destination the egress policy allows: an http:// or https:// endpoint, or a
    /// partner's broker, `amqp://` or `amqps://` with the vhost as its path (`%2f` for `/`),
    /// published to at `amqp` (docs/destinations.md).
    #[schema(
        example = "https://hooks.acme.example/webhooks",
        max_length = 2048,
        pattern = "^(https?|amqps?)://[^/?#@\\s]+([/?#][^\\s]*)?$"
    )]
    pub url: String,
    /// Exact event types and `prefix.*` wildcards; absent or null: every type.
    #[schema(example = json!(["order.*", "invoice.paid"]), min_items = 1)]
    pub event_types: Option<Vec<EventType>>,
    /// Default true.
    pub enabled: Option<bool>,
    /// Default false: a subscription may be created paused.
    pub paused: Option<bool>,
    /// Attempts at once to its endpoint, instead of the worker's `endpoints.max_concurrent`.
    #[schema(minimum = 1, maximum = 2147483647)]
    pub max_concurrent: Option<u32>,
    /// Requests per unit of time to its endpoint, `"50/s"`, `"600/m"`, `"100/h"` (the document's
    /// pattern is narrower than what is accepted: `"0.5/s"` is fine too).
    #[schema(example = "50/s", pattern = "^[1-9][0-9]{0,5}/(s|m|h)$")]
    pub rate: Option<String>,
    /// Free text, at most 1024 characters, no control characters but newline and tab.
    #[schema(
        max_length = 1024,
        pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$"
    )]
    pub description: Option<String>,
    /// How deliveries are signed: `v1` (HMAC-SHA256, a `whsec_` secret), `v1a` (ed25519: the
    /// receiver holds only the public key) or both, side by side. Default `["v1"]`.
    #[schema(example = json!(["v1a"]), min_items = 1, max_items = 2)]
    pub signatures: Option<Vec<SignatureScheme>>,
    /// Headers added to every attempt, by name: a value, or `{"secret": "..."}` for one kept
    /// encrypted and never shown again. Reserved names (`webhook-*`, `content-type`, `host`,
    /// `user-agent`, `idempotency-key`, ...) are refused.
    #[schema(example = json!({"X-Team": "orders", "X-Api-Key": {"secret": "k_live_..."}}))]
    pub headers: Option<BTreeMap<String, HeaderInput>>,
    /// `Authorization: Basic` on every attempt.
    pub basic_auth: Option<BasicAuthInput>,
    /// `Authorization: Bearer` with a token from an OAuth2 token endpoint (client credentials).
    pub oauth2: Option<OAuth2Input>,
    /// A client certificate presented to the endpoint (mutual TLS); the url must be https://
    /// or amqps://.
    pub tls: Option<TlsInput>,
    /// For an `amqp://` or `amqps://` url: the exchange, and a fixed routing key (absent:
    /// each event's type). The broker's login is `basic_auth`.
    pub amqp: Option<crate::subscriptions::AmqpTarget>,
    /// A payload filter: which events of its types it is sent, by what their payload holds
    /// (docs/subscriptions.md). Absent or null: every event.
    #[schema(value_type = Option<Object>, example = json!({"data.amount": {"$gt": 100}, "data.country": {"$in": ["DE", "FR"]}}))]
    pub filter: Option<serde_json::Value>,
    /// Send each attempt's W3C `traceparent` to the endpoint, so a receiver that traces sees
    /// the delivery in its own trace. Off by default.
    pub trace_context: Option<bool>,
}

/// A signature scheme of Standard Webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
pub enum SignatureScheme {
    /// HMAC-SHA256 with a shared `whsec_` secret.
    #[serde(rename = "v1")]
    V1,
    /// ed25519: hookrelay keeps the `whsk_` secret key, the receiver the `whpk_` public key.
    #[serde(rename = "v1a")]
    V1a,
}

/// A header's value: the value itself, or a secret one.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum HeaderInput {
    Value(String),
    Secret(SecretHeader),
}

impl std::fmt::Debug for HeaderInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderInput::Value(v) => write!(f, "{v:?}"),
            HeaderInput::Secret(_) => f.write_str("(secret)"),
        }
    }
}

/// A header value kept encrypted, never shown again.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretHeader {
    pub secret: String,
}

/// Basic authentication to the endpoint.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthInput {
    /// Not empty, no `:`.
    pub username: String,
    /// Kept encrypted, never shown again.
    pub password: String,
}

/// OAuth2 client credentials (RFC 6749 section 4.4).
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuth2Input {
    /// An http(s) URL the egress policy allows.
    #[schema(example = "https://login.acme.example/oauth2/token")]
    pub token_url: String,
    pub client_id: String,
    /// Kept encrypted, never shown again.
    pub client_secret: String,
    pub scope: Option<String>,
    pub audience: Option<String>,
    /// `basic` (client_secret_basic, the default) or `post` (client_secret_post).
    pub auth_method: Option<String>,
}

/// A client certificate for mutual TLS, as PEM.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsInput {
    /// The certificate chain, PEM.
    pub cert: String,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1). Kept encrypted, never shown again.
    pub key: String,
    /// The CA the endpoint's certificate must chain to, PEM; the system's roots when absent.
    pub ca: Option<String>,
}

macro_rules! redacted_debug {
    ($($t:ty),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(concat!(stringify!($t), " { .. }"))
            }
        }
    )*};
}
redacted_debug!(SecretHeader, BasicAuthInput, OAuth2Input, TlsInput);

/// An exact event type, or a `prefix.*` wildcard.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(transparent)]
#[schema(
    value_type = String,
    pattern = "^([A-Za-z0-9._:-]{1,128}|[A-Za-z0-9._:-]{0,125}[A-Za-z0-9_:-]\\.\\*)$"
)]
pub struct EventType(pub String);

impl AsRef<str> for EventType {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A change: fields left out stay as they are; `null` clears `event_types` (every type),
/// `max_concurrent` and `rate` (the worker's defaults).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSubscription {
    #[schema(
        max_length = 2048,
        pattern = "^(https?|amqps?)://[^/?#@\\s]+([/?#][^\\s]*)?$"
    )]
    pub url: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<EventType>>, min_items = 1)]
    pub event_types: Option<Option<Vec<EventType>>>,
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 2147483647)]
    pub max_concurrent: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, pattern = "^[1-9][0-9]{0,5}/(s|m|h)$")]
    pub rate: Option<Option<String>>,
    #[schema(
        max_length = 1024,
        pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$"
    )]
    pub description: Option<String>,
    /// Replaces every header (secret ones must be given again); `null` removes them all.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<BTreeMap<String, HeaderInput>>)]
    pub headers: Option<Option<BTreeMap<String, HeaderInput>>>,
    /// Replaces basic auth; `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<BasicAuthInput>)]
    pub basic_auth: Option<Option<BasicAuthInput>>,
    /// Replaces OAuth2; `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<OAuth2Input>)]
    pub oauth2: Option<Option<OAuth2Input>>,
    /// Replaces the client certificate; `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<TlsInput>)]
    pub tls: Option<Option<TlsInput>>,
    /// Replaces the exchange and routing key of an AMQP destination; `null` removes them (for a
    /// url that becomes HTTP).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<crate::subscriptions::AmqpTarget>)]
    pub amqp: Option<Option<crate::subscriptions::AmqpTarget>>,
    /// Replaces the payload filter; `null` removes it (every event).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<Option<serde_json::Value>>,
    /// Whether each attempt's W3C `traceparent` is sent to the endpoint.
    pub trace_context: Option<bool>,
}

/// A field that is present, `null` or not: `Some(None)` for `null`, `None` when left out.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// One of a subscription's signing secrets: when it was made and when it stops signing. The
/// secret itself is never shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretInfo {
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; absent: it signs until a rotation sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// For a `v1a` key: its public key (`whpk_...`), for the receiver to verify with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

/// A subscription as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SubscriptionView {
    pub id: String,
    pub tenant: String,
    pub url: String,
    /// Absent: every event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    pub enabled: bool,
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Per second, as the store normalises it: `"600/m"` reads back `"10/s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    pub description: String,
    /// Why it was disabled, when hookrelay or an operator did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// Newest first; never the secrets themselves.
    pub secrets: Vec<SecretInfo>,
    /// Headers added to every attempt (by lower-case name; a secret one shows `secret: true`)
    /// and how it authenticates to its endpoint, without a secret value.
    #[serde(flatten)]
    pub request: StoredRequest,
    /// The payload filter, as written; absent: every event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<serde_json::Value>,
    pub created_at: String,
    pub updated_at: String,
}

impl SubscriptionView {
    /// A stored row as the API shows it, with its secrets' dates (newest first).
    pub fn from_store(row: SubscriptionRow, secrets: Vec<SecretDates>) -> Self {
        Self {
            id: row.id,
            tenant: row.tenant,
            url: row.url,
            event_types: row.event_types,
            enabled: row.enabled,
            paused: row.paused,
            max_concurrent: row.max_concurrent,
            rate: row.rate,
            description: row.description,
            disabled_reason: row.disabled_reason,
            secrets: secrets
                .into_iter()
                .map(|s| SecretInfo {
                    created_at: rfc3339(s.created_ms),
                    expires_at: s.expires_ms.map(rfc3339),
                    public_key: s.public_key,
                })
                .collect(),
            request: row.request,
            filter: row.payload_filter,
            created_at: rfc3339(row.created_ms),
            updated_at: rfc3339(row.updated_ms),
        }
    }
}

/// Milliseconds since the epoch, as RFC 3339.
pub(crate) fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0).unsigned_abs());
    humantime::format_rfc3339_millis(at).to_string()
}

/// The answer to a create: the subscription, and its signing secret, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedSubscription {
    pub subscription: SubscriptionView,
    /// `whsec_<base64>` (signing `v1`): verify deliveries with it. It is not shown again.
    #[schema(example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `whpk_<base64>` (signing `v1a`): verify deliveries with it; it is also in the
    /// subscription's `secrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

/// A page of subscriptions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SubscriptionPage {
    pub data: Vec<SubscriptionView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Filters and paging of a list, ordered by id.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this tenant's (a tenant token sees only its own anyway).
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    pub enabled: Option<bool>,
    pub paused: Option<bool>,
    /// From a previous page's `next_cursor`; empty: the first page.
    pub cursor: Option<String>,
    /// 1 to 500; default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// A rotation: when the current secrets stop signing. At most one of the two; neither: in 24
/// hours. Until then every delivery carries a signature with each, so receivers can switch.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// A duration from now, `"24h"`, `"30m"`, `"0s"` (at once).
    #[schema(example = "24h")]
    pub expire_old_after: Option<String>,
    /// An RFC 3339 time, not in the past, at most 366 days ahead.
    #[schema(example = "2027-01-31T00:00:00Z", format = DateTime)]
    pub old_expires_at: Option<String>,
    /// The schemes the new secrets sign with; default: those that sign now. `["v1a"]` on a
    /// subscription signing `v1` moves it to `v1a`, both signing until the old secret expires.
    #[schema(min_items = 1, max_items = 2)]
    pub signatures: Option<Vec<SignatureScheme>>,
}

/// The answer to a rotation: the new secret, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RotatedSecret {
    /// The new `whsec_` secret, when `v1` is among the schemes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The new `whpk_` public key, when `v1a` is among the schemes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// When the secrets it replaces stop signing (RFC 3339).
    pub old_expires_at: String,
    pub subscription: SubscriptionView,
}

/// A resume, optionally paced.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSubscription {
    /// The pace at which parked deliveries return, `"50/s"`; as fast as the broker confirms
    /// when absent.
    #[schema(example = "50/s", pattern = "^[1-9][0-9]{0,5}/(s|m|h)$")]
    pub rate: Option<String>,
}

/// The answer to a resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Resumed {
    pub subscription: SubscriptionView,
    /// Whether this resume set the API returning the parked deliveries: it changed `paused`
    /// and the API has a broker connection. False for a subscription that was not paused
    /// (nothing changed), or without a broker: then `hookrelay subscriptions resume ID` returns
    /// whatever is still parked.
    pub returning_parked: bool,
}

/// A test event for one subscription.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendTestEvent {
    /// Default `hookrelay.test`; it must be a type the subscription receives.
    #[schema(example = "hookrelay.test", pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub event_type: Option<String>,
    /// The event's `data`; default `{}`.
    #[schema(value_type = Option<Object>)]
    pub data: Option<serde_json::Value>,
}

/// The answer to a test event: its envelope id, the `webhook-id` the endpoint receives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TestEventSent {
    pub envelope_id: String,
    pub event_type: String,
}

/// The headers of a create.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct CreateHeaders {
    /// Makes a retried create safe: the first answer is given again (24 hours).
    #[param(rename = "Idempotency-Key", pattern = "^[!-~]{1,255}$")]
    pub idempotency_key: Option<String>,
}
