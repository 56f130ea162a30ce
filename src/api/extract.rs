//! What the handlers take from a request beyond axum's extractors: a JSON body read from bytes
//! (so `api.max_body_bytes` answers 413 and every refusal is a problem naming the field at
//! fault), an id of a path, an `Idempotency-Key`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::contract::envelope::check_id;

use super::problem::{ApiError, FieldError};

pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// A JSON request body, or the problem with it. An empty body is `T::default()` when `empty`
/// allows one (the bodies of pause, resume, rotate and test are all optional).
pub fn json<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty: Option<T>,
    max: usize,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge { max },
        _ => ApiError::BadRequest(rejection.body_text()),
    })?;
    let text = body.trim_ascii();
    // No body at all, or JSON's null: the optional body's defaults. Whitespace alone is not
    // JSON, and is answered as such.
    if (body.is_empty() || text == b"null")
        && let Some(default) = empty
    {
        return Ok(default);
    }
    // serde would read a struct from an array too (`[null, null]`): only an object is one.
    if !text.is_empty()
        && text[0] != b'{'
        && serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok()
    {
        return Err(ApiError::field("(body)", "expected a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(&body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_data() {
            let field = if path == "." {
                "(body)".to_owned()
            } else {
                path
            };
            // serde names an unknown field in its message; the path is where it was found.
            ApiError::Invalid(vec![FieldError::new(field, inner.to_string())])
        } else {
            ApiError::Malformed(inner.to_string())
        }
    })?;
    de.end().map_err(|e| ApiError::Malformed(e.to_string()))?;
    Ok(value)
}

/// An id in a path: one that could never be stored is simply not found.
pub fn path_id(id: &str) -> Result<(), ApiError> {
    check_id(id).map_err(|_| ApiError::NotFound)
}

/// The request's `Idempotency-Key`, if it has one.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_HEADER) else {
        return Ok(None);
    };
    let bad = || {
        ApiError::Invalid(vec![FieldError::new(
            "Idempotency-Key",
            format!("1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"),
        )])
    };
    let key = value.to_str().map_err(|_| bad())?;
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY_LEN
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad());
    }
    Ok(Some(key.to_owned()))
}
