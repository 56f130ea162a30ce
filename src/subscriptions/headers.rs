//! Headers a subscription adds to each request besides the signature (a static value, or a
//! secret reference read at attempt time), and the header names it may not set.

use super::secrets::SecretRef;

/// Headers a subscription cannot set: the signature's, the body's, hookrelay's own, those the
/// HTTP client owns, those of the connection rather than the request, and the proxy's
/// credentials. `webhook-*` as a prefix.
pub const RESERVED_HEADERS: [&str; 16] = [
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "host",
    "user-agent",
    "idempotency-key",
    "x-delivery-attempt",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "proxy-authorization",
];

/// Why a header name cannot be a subscription's, or `None` when it can.
pub fn reserved_header(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("webhook-") {
        return Some(format!(
            "{name:?} is reserved: the webhook-* headers carry the id, timestamp and signature"
        ));
    }
    let why = match lower.as_str() {
        // With `egress.proxy` set, the HTTP client leaves out the proxy's configured credentials
        // when a request carries this header: a subscription would replace hookrelay's.
        "proxy-authorization" => {
            "it carries the credentials of egress.proxy, which are hookrelay's"
        }
        "connection" | "keep-alive" | "proxy-connection" | "upgrade" | "te" | "trailer"
        | "expect" => "it governs the connection, which the HTTP client owns, not the request",
        other if RESERVED_HEADERS.contains(&other) => "hookrelay or the HTTP client sets it",
        _ => return None,
    };
    Some(format!("{name:?} is reserved: {why}"))
}

/// Why a subscription cannot send a header as given: the name or value is to be changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// A name hookrelay or the HTTP client owns ([`reserved_header`] says why).
    #[error("{0}")]
    Reserved(String),
    #[error("{0:?} is not a header name")]
    NotAName(String),
    /// Names the header, never the value: it may be a secret.
    #[error("the value of {0:?} is not a header value (visible ASCII and spaces)")]
    NotAValue(String),
}

/// A header name a subscription may set, lower-cased, or why not.
pub fn check_header_name(name: &str) -> Result<String, HeaderError> {
    if let Some(why) = reserved_header(name) {
        return Err(HeaderError::Reserved(why));
    }
    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(HeaderError::NotAName(name.to_owned()));
    }
    Ok(name.to_ascii_lowercase())
}

/// Whether `value` can be sent as a header value; the error names the header, not the value.
pub fn check_header_value(name: &str, value: &str) -> Result<(), HeaderError> {
    reqwest::header::HeaderValue::from_str(value)
        .map(drop)
        .map_err(|_| HeaderError::NotAValue(name.to_owned()))
}

/// A request header a subscription adds to every attempt.
#[derive(Clone, PartialEq, Eq)]
pub struct ExtraHeader {
    /// Lower case.
    pub name: String,
    pub value: HeaderValueSpec,
}

/// A header's value: written in the configuration, or read from a secret reference at attempt
/// time (never logged).
#[derive(Clone, PartialEq, Eq)]
pub enum HeaderValueSpec {
    Static(String),
    Secret(SecretRef),
}

impl std::fmt::Debug for ExtraHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            HeaderValueSpec::Static(_) => write!(f, "{} (static)", self.name),
            HeaderValueSpec::Secret(r) => write!(f, "{} (from {r})", self.name),
        }
    }
}
