//! Errors as RFC 9457 problem details (`application/problem+json`): a `type` URN per kind of
//! problem, a title, the status, a detail, and for bad input every field at fault.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tracing::error;
use utoipa::ToSchema;

use crate::store::QueryError;

pub const CONTENT_TYPE: &str = "application/problem+json";

/// One field at fault: a JSON path into the request (`url`, `event_types[1]`), or the header
/// or query parameter by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// An RFC 9457 problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URN naming the kind of problem, e.g. `urn:hookrelay:problem:invalid-input`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The fields at fault, for bad input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

impl Problem {
    fn new(status: StatusCode, slug: &str, title: &str, detail: Option<String>) -> Self {
        Self {
            kind: format!("urn:hookrelay:problem:{slug}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            errors: Vec::new(),
        }
    }

    /// No detail: a caller without a valid token learns nothing.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            None,
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(&self)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Why a request was not done. Each becomes a [`Problem`].
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the request body is not JSON: {0}")]
    Malformed(String),
    #[error("invalid input")]
    Invalid(Vec<FieldError>),
    #[error("the request body is over the {max}-byte limit")]
    TooLarge { max: usize },
    #[error("{0}")]
    BadRequest(String),
    #[error("no such subscription")]
    NotFound,
    #[error("no such {0}")]
    Absent(&'static str),
    #[error("no such route")]
    NoRoute,
    /// The token may read this but not change it (a tenant's, for an admin's write).
    #[error("{0}")]
    Forbidden(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{0}")]
    Conflict(String),
    #[error(
        "this Idempotency-Key was used with a different request body; use a new key for a new \
         request"
    )]
    IdempotencyMismatch,
    /// A tenant's quota of something kept (subscriptions) is reached.
    #[error("{0}")]
    Quota(String),
    /// A tenant's requests a minute are spent.
    #[error(
        "this tenant has made its {per_minute} {what} of the last minute ({setting}); try again \
         in {retry_after} s"
    )]
    RateLimited {
        what: &'static str,
        setting: &'static str,
        per_minute: u32,
        /// Seconds, for `Retry-After`.
        retry_after: u64,
    },
    #[error("{0}")]
    Unavailable(String),
    /// Logged, never shown: it may name internals.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldError::new(field, message)])
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        Self::Internal(e.to_string())
    }

    pub fn to_problem(&self) -> Problem {
        use StatusCode as S;
        let detail = Some(self.to_string());
        match self {
            ApiError::Malformed(_) => Problem::new(
                S::BAD_REQUEST,
                "malformed-body",
                "Malformed request body",
                detail,
            ),
            ApiError::Invalid(errors) => Problem {
                errors: errors.clone(),
                detail: Some(
                    errors
                        .iter()
                        .map(|e| format!("{}: {}", e.field, e.message))
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                ..Problem::new(
                    S::UNPROCESSABLE_ENTITY,
                    "invalid-input",
                    "Invalid input",
                    None,
                )
            },
            ApiError::TooLarge { .. } => Problem::new(
                S::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                detail,
            ),
            ApiError::BadRequest(_) => {
                Problem::new(S::BAD_REQUEST, "bad-request", "Bad request", detail)
            }
            ApiError::NotFound => Problem::new(S::NOT_FOUND, "not-found", "Not found", detail),
            ApiError::Absent(_) => Problem::new(S::NOT_FOUND, "not-found", "Not found", detail),
            ApiError::NoRoute => Problem::new(S::NOT_FOUND, "no-route", "Not found", detail),
            ApiError::Forbidden(_) => Problem::new(S::FORBIDDEN, "forbidden", "Forbidden", detail),
            ApiError::MethodNotAllowed => Problem::new(
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                detail,
            ),
            ApiError::Conflict(_) => Problem::new(S::CONFLICT, "conflict", "Conflict", detail),
            ApiError::IdempotencyMismatch => Problem {
                errors: vec![FieldError::new(
                    "Idempotency-Key",
                    "already used with a different request body",
                )],
                ..Problem::new(
                    S::UNPROCESSABLE_ENTITY,
                    "idempotency-key-reused",
                    "Idempotency-Key reused",
                    detail,
                )
            },
            ApiError::Quota(_) => {
                Problem::new(S::CONFLICT, "quota-exceeded", "Quota exceeded", detail)
            }
            ApiError::RateLimited { .. } => Problem::new(
                S::TOO_MANY_REQUESTS,
                "rate-limited",
                "Too many requests",
                detail,
            ),
            ApiError::Unavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                detail,
            ),
            ApiError::Internal(_) => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                Some("the request failed on the server; it is logged".into()),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(message) = &self {
            error!(error = %message, "API request failed");
        }
        let mut response = self.to_problem().into_response();
        if let ApiError::RateLimited { retry_after, .. } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        response
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        QueryError::Database(e).into()
    }
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        if e.is_transient() {
            error!(error = %e, "Subscription store unreachable");
            return ApiError::Unavailable(
                "the subscription store does not answer; try again".into(),
            );
        }
        ApiError::Internal(e.to_string())
    }
}

/// The problem answers the handlers document, one type per answer, named in each handler's
/// `responses(...)` beside its own rows: the same answer reads the same on every route. An
/// answer particular to one route (a 409 and why) stays a row of its own.
pub mod documented {
    use utoipa::IntoResponses;

    use super::Problem;

    /// An answer: its type, status and description.
    macro_rules! answer {
        ($name:ident, $status:literal, $description:literal) => {
            #[derive(IntoResponses)]
            #[response(status = $status, description = $description, content_type = "application/problem+json")]
            pub struct $name(pub Problem);
        };
    }

    answer!(MalformedJson, 400, "Malformed JSON");
    answer!(Unauthorized, 401, "No valid token");
    answer!(
        NoSuchSubscription,
        404,
        "No such subscription, or another tenant's"
    );
    answer!(
        NoSuchReplay,
        404,
        "No such replay (this process's last 100), or another tenant's"
    );
    answer!(
        AdminOnly,
        403,
        "A tenant's token: only an admin's changes this"
    );
    answer!(NoSuchEventType, 404, "No such event type in the catalog");
    answer!(TooLarge, 413, "Body too large");
    answer!(Invalid, 422, "Invalid input");
    answer!(BadFilter, 422, "A bad filter, limit or cursor");
    answer!(NoHistory, 503, "No history database");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_names_every_field_at_fault() {
        let problem = ApiError::Invalid(vec![
            FieldError::new("url", "not a URL"),
            FieldError::new("rate", "too fast"),
        ])
        .to_problem();
        assert_eq!(problem.status, 422);
        assert_eq!(problem.kind, "urn:hookrelay:problem:invalid-input");
        assert_eq!(
            problem.detail.as_deref(),
            Some("url: not a URL; rate: too fast")
        );
        let internal = ApiError::Internal("password=x".into()).to_problem();
        assert!(!internal.detail.unwrap_or_default().contains("password"));
    }
}
