//! Standard Webhooks signatures: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per
//! secret, space separated. Computed at dispatch with the subscription's current secrets.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const SECRET_PREFIX: &str = "whsec_";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a signing secret must start with \"whsec_\" followed by base64")]
    MissingPrefix,
    /// Says what kind of fault, never which byte or where: either would tell part of the secret.
    #[error("the part after \"whsec_\" is not base64 ({0})")]
    NotBase64(&'static str),
    #[error("the secret is empty")]
    Empty,
}

/// A decoded signing secret, keyed once so each signature only hashes the message.
#[derive(Clone)]
pub struct SigningKey {
    mac: Hmac<Sha256>,
}

impl SigningKey {
    /// Parses a `whsec_<base64>` secret.
    pub fn from_whsec(secret: &str) -> Result<Self, KeyError> {
        let encoded = secret
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(KeyError::MissingPrefix)?;
        let bytes = STANDARD
            .decode(encoded)
            .map_err(|e| KeyError::NotBase64(base64_fault(&e)))?;
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Self::from_bytes(&bytes))
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self {
            mac: Hmac::<Sha256>::new_from_slice(bytes).expect("HMAC accepts keys of any length"),
        }
    }

    /// `v1,<base64 signature>` of one message.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac = self.mac.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(3 + 44);
        out.push_str("v1,");
        STANDARD.encode_string(digest, &mut out);
        out
    }
}

/// What is wrong with undecodable base64, without the byte or offset its error quotes.
fn base64_fault(e: &base64::DecodeError) -> &'static str {
    match e {
        base64::DecodeError::InvalidByte(..) => "a character that is not base64",
        base64::DecodeError::InvalidLength(_) => "a length base64 cannot have",
        base64::DecodeError::InvalidLastSymbol { .. } => "a last character that is not canonical",
        base64::DecodeError::InvalidPadding => "wrong padding",
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey(***)")
    }
}

/// The `webhook-signature` header value: one `v1,` signature per key, space separated.
pub fn signature_header<'a>(
    keys: impl IntoIterator<Item = &'a SigningKey>,
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> String {
    let mut header = String::new();
    for key in keys {
        if !header.is_empty() {
            header.push(' ');
        }
        header.push_str(&key.sign(id, timestamp, body));
    }
    header
}

/// A fresh secret in `whsec_` form: 32 bytes from the operating system's random source.
pub fn generate_secret() -> String {
    use chacha20poly1305::aead::{OsRng, rand_core::RngCore};
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example from the Standard Webhooks specification.
    #[test]
    fn matches_the_published_test_vector() {
        let key = SigningKey::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            key.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn the_independent_verifier_accepts_every_signature_of_a_rotation() {
        let old = generate_secret();
        let new = generate_secret();
        let keys = [
            SigningKey::from_whsec(&new).unwrap(),
            SigningKey::from_whsec(&old).unwrap(),
        ];
        let body = br#"{"a":1}"#;
        let ts = crate::units::now_ms() / 1000;
        let header = signature_header(&keys, "evt_1", ts, body);
        assert_eq!(header.split(' ').count(), 2);
        for secret in [&old, &new] {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert("webhook-id", "evt_1".parse().unwrap());
            headers.insert("webhook-timestamp", ts.to_string().parse().unwrap());
            headers.insert("webhook-signature", header.parse().unwrap());
            standardwebhooks::Webhook::new(secret)
                .unwrap()
                .verify(body, &headers)
                .unwrap();
        }
    }

    #[test]
    fn malformed_secrets_are_refused() {
        assert_eq!(
            SigningKey::from_whsec("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(),
            KeyError::MissingPrefix
        );
        // The error names the fault, not the byte or its place.
        assert_eq!(
            SigningKey::from_whsec("whsec_QUJD~RA==")
                .unwrap_err()
                .to_string(),
            "the part after \"whsec_\" is not base64 (a character that is not base64)"
        );
        assert_eq!(
            SigningKey::from_whsec("whsec_").unwrap_err(),
            KeyError::Empty
        );
        assert_eq!(
            format!("{:?}", SigningKey::from_whsec(&generate_secret()).unwrap()),
            "SigningKey(***)"
        );
    }
}
