//! Calling the API's handlers from a page: the same checks, store writes and answers as a
//! request to `/v1`, with the visitor's scope.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::problem::ApiError;

/// The largest answer of a handler a page reads.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// A request body for a handler, as JSON.
pub fn body(value: &impl Serialize) -> Result<Bytes, BytesRejection> {
    Ok(Bytes::from(serde_json::to_vec(value).unwrap_or_default()))
}

/// No request body (the handler's defaults).
pub fn empty() -> Result<Bytes, BytesRejection> {
    Ok(Bytes::new())
}

/// The JSON of a handler's answer.
pub async fn read<T: DeserializeOwned>(response: Response) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER)
        .await
        .map_err(ApiError::internal)?;
    serde_json::from_slice(&bytes).map_err(ApiError::internal)
}
