//! Standard Webhooks signatures of `"{id}.{timestamp}.{body}"`, one per secret, space separated,
//! computed at dispatch with the subscription's current secrets: `v1,<base64 HMAC-SHA256>` for a
//! symmetric secret (`whsec_`), `v1a,<base64 ed25519 signature>` for an asymmetric secret key
//! (`whsk_`), whose public key (`whpk_`) is all a receiver holds. A subscription signs with
//! either or both (during a migration from one to the other): its secrets say which.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const SECRET_PREFIX: &str = "whsec_";
/// An ed25519 secret key (its 32-byte seed, or seed and public key, 64 bytes), for `v1a`.
const SECRET_KEY_PREFIX: &str = "whsk_";
/// An ed25519 public key, what a receiver verifies `v1a` with.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "a signing secret must start with \"whsec_\" (v1, HMAC) or \"whsk_\" (v1a, ed25519) \
         followed by base64"
    )]
    MissingPrefix,
    /// Says what kind of fault, never which byte or where: either would tell part of the secret.
    #[error("the part after the prefix is not base64 ({0})")]
    NotBase64(&'static str),
    #[error("the secret is empty")]
    Empty,
    #[error(
        "a \"whsk_\" secret key is 32 bytes (an ed25519 seed) or 64 (seed and public key), \
         base64; this one is {0} bytes"
    )]
    KeyLength(usize),
    #[error("the public key in this 64-byte \"whsk_\" secret key is not the seed's")]
    KeyMismatch,
}

/// A decoded signing secret, keyed once so each signature only hashes the message.
#[derive(Clone)]
pub enum SigningKey {
    /// `whsec_`: signs `v1` (HMAC-SHA256).
    Symmetric(Hmac<Sha256>),
    /// `whsk_`: signs `v1a` (ed25519).
    Asymmetric(Box<ed25519_dalek::SigningKey>),
}

fn decode(encoded: &str) -> Result<Vec<u8>, KeyError> {
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|e| KeyError::NotBase64(base64_fault(&e)))?;
    if bytes.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(bytes)
}

impl SigningKey {
    /// Parses a `whsec_<base64>` secret or a `whsk_<base64>` secret key.
    pub fn parse(secret: &str) -> Result<Self, KeyError> {
        let secret = secret.trim();
        if let Some(encoded) = secret.strip_prefix(SECRET_PREFIX) {
            return Ok(Self::from_bytes(&decode(encoded)?));
        }
        let encoded = secret
            .strip_prefix(SECRET_KEY_PREFIX)
            .ok_or(KeyError::MissingPrefix)?;
        let bytes = decode(encoded)?;
        let seed: [u8; 32] = match bytes.len() {
            32 | 64 => bytes[..32]
                .try_into()
                .map_err(|_| KeyError::KeyLength(bytes.len()))?,
            n => return Err(KeyError::KeyLength(n)),
        };
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        if bytes.len() == 64 && key.verifying_key().as_bytes()[..] != bytes[32..] {
            return Err(KeyError::KeyMismatch);
        }
        Ok(Self::Asymmetric(Box::new(key)))
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self::Symmetric(
            Hmac::<Sha256>::new_from_slice(bytes).expect("HMAC accepts keys of any length"),
        )
    }

    /// For a `whsk_` key, its public key as `whpk_<base64>`: what receivers verify with.
    pub fn public_key(&self) -> Option<String> {
        match self {
            Self::Symmetric(_) => None,
            Self::Asymmetric(key) => Some(format!(
                "{PUBLIC_KEY_PREFIX}{}",
                STANDARD.encode(key.verifying_key().as_bytes())
            )),
        }
    }

    /// `v1,<base64 signature>` or `v1a,<base64 signature>` of one message.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        match self {
            Self::Symmetric(mac) => {
                let mut mac = mac.clone();
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
            Self::Asymmetric(key) => {
                use ed25519_dalek::Signer;
                let timestamp = timestamp.to_string();
                let mut message = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
                message.extend_from_slice(id.as_bytes());
                message.push(b'.');
                message.extend_from_slice(timestamp.as_bytes());
                message.push(b'.');
                message.extend_from_slice(body);
                let signature = key.sign(&message);
                let mut out = String::with_capacity(4 + 88);
                out.push_str("v1a,");
                STANDARD.encode_string(signature.to_bytes(), &mut out);
                out
            }
        }
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

/// The `webhook-signature` header value: one signature per key (`v1,` or `v1a,`), space
/// separated.
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

/// A fresh ed25519 key pair for `v1a`: (`whsk_` secret key, `whpk_` public key), the seed
/// 32 bytes from the operating system's random source.
pub fn generate_key_pair() -> (String, String) {
    use chacha20poly1305::aead::{OsRng, rand_core::RngCore};
    let mut seed = [0u8; 32];
    OsRng.fill_bytes(&mut seed);
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    (
        format!("{SECRET_KEY_PREFIX}{}", STANDARD.encode(seed)),
        format!(
            "{PUBLIC_KEY_PREFIX}{}",
            STANDARD.encode(key.verifying_key().as_bytes())
        ),
    )
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
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
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
            SigningKey::parse(&new).unwrap(),
            SigningKey::parse(&old).unwrap(),
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
            SigningKey::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(),
            KeyError::MissingPrefix
        );
        // The error names the fault, not the byte or its place.
        assert_eq!(
            SigningKey::parse("whsec_QUJD~RA==")
                .unwrap_err()
                .to_string(),
            "the part after the prefix is not base64 (a character that is not base64)"
        );
        assert_eq!(SigningKey::parse("whsec_").unwrap_err(), KeyError::Empty);
        assert_eq!(
            format!("{:?}", SigningKey::parse(&generate_secret()).unwrap()),
            "SigningKey(***)"
        );
    }

    /// `v1a` checked by ed25519-dalek's own verifier over the construction the specification
    /// gives (`{id}.{timestamp}.{body}`), with the public key as a receiver holds it; and a
    /// header carrying both `v1` and `v1a` (a migration) still verified by the independent
    /// `standardwebhooks` library with the symmetric secret.
    #[test]
    fn v1a_signatures_verify_with_the_public_key_alone() {
        use ed25519_dalek::{Signature, Verifier, VerifyingKey};
        let (secret_key, public_key) = generate_key_pair();
        let key = SigningKey::parse(&secret_key).unwrap();
        assert_eq!(key.public_key().as_deref(), Some(public_key.as_str()));
        let body = br#"{"test": 2432232314}"#;
        let signed = key.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body);
        let encoded = signed.strip_prefix("v1a,").expect("a v1a signature");
        let signature = Signature::from_slice(&STANDARD.decode(encoded).unwrap()).unwrap();
        let public: [u8; 32] = STANDARD
            .decode(public_key.strip_prefix(PUBLIC_KEY_PREFIX).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        let verifier = VerifyingKey::from_bytes(&public).unwrap();
        let message = br#"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}"#;
        verifier.verify(message, &signature).unwrap();
        // Another body, another timestamp: refused.
        assert!(
            verifier
                .verify(
                    br#"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265331.{"test": 2432232314}"#,
                    &signature
                )
                .is_err()
        );

        let whsec = generate_secret();
        let keys = [SigningKey::parse(&whsec).unwrap(), key];
        let ts = crate::units::now_ms() / 1000;
        let header = signature_header(&keys, "evt_1", ts, body);
        let versions: Vec<&str> = header
            .split(' ')
            .map(|s| s.split(',').next().unwrap())
            .collect();
        assert_eq!(versions, ["v1", "v1a"]);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("webhook-id", "evt_1".parse().unwrap());
        headers.insert("webhook-timestamp", ts.to_string().parse().unwrap());
        headers.insert("webhook-signature", header.parse().unwrap());
        standardwebhooks::Webhook::new(&whsec)
            .unwrap()
            .verify(body, &headers)
            .unwrap();
    }

    #[test]
    fn secret_keys_of_the_wrong_size_or_a_foreign_public_half_are_refused() {
        let (secret_key, public_key) = generate_key_pair();
        let seed = STANDARD
            .decode(secret_key.strip_prefix("whsk_").unwrap())
            .unwrap();
        let public = STANDARD
            .decode(public_key.strip_prefix("whpk_").unwrap())
            .unwrap();
        let full = format!("whsk_{}", STANDARD.encode([seed.clone(), public].concat()));
        assert_eq!(
            SigningKey::parse(&full).unwrap().public_key(),
            Some(public_key)
        );
        let (_, other) = generate_key_pair();
        let other = STANDARD
            .decode(other.strip_prefix("whpk_").unwrap())
            .unwrap();
        let foreign = format!("whsk_{}", STANDARD.encode([seed, other].concat()));
        assert_eq!(
            SigningKey::parse(&foreign).unwrap_err(),
            KeyError::KeyMismatch
        );
        assert_eq!(
            SigningKey::parse(&format!("whsk_{}", STANDARD.encode([7u8; 16]))).unwrap_err(),
            KeyError::KeyLength(16)
        );
        assert!(
            SigningKey::parse(&generate_secret())
                .unwrap()
                .public_key()
                .is_none()
        );
    }
}
