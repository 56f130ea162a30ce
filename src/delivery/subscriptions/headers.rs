//! Headers a subscription adds to each request besides the signature (a static value, or a
//! secret reference read at attempt time), and the header names it may not set.

use super::secrets::SecretRef;

/// Headers a subscription cannot set: the signature's, the body's, hookrelay's own, and those
/// the HTTP client owns. `webhook-*` as a prefix.
pub const RESERVED_HEADERS: [&str; 10] = [
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "host",
    "connection",
    "user-agent",
    "idempotency-key",
    "x-delivery-attempt",
    "te",
];

/// Why a header name cannot be a subscription's, or `None` when it can.
pub fn reserved_header(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("webhook-") {
        return Some(format!(
            "{name:?} is reserved: the webhook-* headers carry the id, timestamp and signature"
        ));
    }
    RESERVED_HEADERS
        .contains(&lower.as_str())
        .then(|| format!("{name:?} is reserved: hookrelay or the HTTP client sets it"))
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
