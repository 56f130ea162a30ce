//! The handlers of history: `GET /v1/events/{id}` (an event's story) and
//! `GET /v1/subscriptions/{id}/attempts` (a subscription's attempts, a page at a time), read from
//! the history database `hookrelay history` fills. A tenant's token sees only its tenant's.

use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use utoipa::{IntoParams, ToSchema};

use crate::contract::envelope::check_id;
use crate::history::trace::{self, Attempt, AttemptQuery, Cursor, Story};

use super::ApiState;
use super::auth::Scope;
use super::problem::documented::{BadFilter, NoHistory, NoSuchSubscription, Unauthorized};
use super::problem::{ApiError, FieldError, Problem};

/// The most attempts one page holds.
const MAX_LIMIT: u32 = 500;
const DEFAULT_LIMIT: u32 = 50;

impl ApiState {
    fn history(&self) -> Result<&PgPool, ApiError> {
        self.history.as_ref().ok_or_else(|| {
            ApiError::Unavailable("this API has no history database (history.database)".into())
        })
    }
}

/// An event's whole story: when the ingress accepted it (and again, for replays and
/// redrives), every attempt of it or of the deliveries its fan-out made, and each delivery's
/// latest outcome. `id` is an event id or a delivery's (`d_...`).
#[utoipa::path(
    get, path = "/v1/events/{id}", tag = "history",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = Story),
        Unauthorized,
        (status = 404, description = "History holds nothing of it (or it is another tenant's)", body = Problem, content_type = "application/problem+json"),
        NoHistory,
    )
)]
pub async fn event(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<Story>, ApiError> {
    check_id(&id).map_err(|_| ApiError::Absent("event"))?;
    trace::story(state.history()?, &id, scope.tenant())
        .await?
        .map(axum::Json)
        .ok_or(ApiError::Absent("event"))
}

/// Which attempts, and which page.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AttemptsQuery {
    /// At or after this time: RFC 3339, or a duration ago (`2h`).
    #[param(example = "2026-12-04T02:10:00Z")]
    pub since: Option<String>,
    /// Only this outcome: delivered, retried, rejected, exhausted, horizon_expired, ...
    #[param(pattern = "^[a-z_]{1,32}$")]
    pub outcome: Option<String>,
    /// From a previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// 1 to 500; default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// `oldest` first (the default) or `newest` first; a cursor goes on in its page's order.
    #[param(pattern = "^(oldest|newest)$")]
    pub order: Option<String>,
}

/// A page of attempts, oldest first (or newest first, as asked).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttemptPage {
    pub data: Vec<Attempt>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

fn attempt_query(query: AttemptsQuery, scope: &Scope) -> Result<AttemptQuery, ApiError> {
    let mut errors = Vec::new();
    let since_us = match &query.since {
        None => None,
        Some(text) => match crate::units::parse_when(text) {
            Ok(t) => Some(
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
            ),
            Err(e) => {
                errors.push(FieldError::new("since", e.to_string()));
                None
            }
        },
    };
    if let Some(outcome) = &query.outcome
        && (outcome.is_empty()
            || outcome.len() > 32
            || !outcome.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
    {
        errors.push(FieldError::new(
            "outcome",
            "an outcome such as delivered, retried or exhausted",
        ));
    }
    let after = match &query.cursor {
        None => None,
        Some(text) => {
            let cursor = Cursor::decode(text);
            if cursor.is_none() {
                errors.push(FieldError::new("cursor", "not a cursor this API gave"));
            }
            cursor
        }
    };
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        errors.push(FieldError::new("limit", format!("1 to {MAX_LIMIT}")));
    }
    let newest_first = match query.order.as_deref() {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(_) => {
            errors.push(FieldError::new("order", "oldest or newest"));
            false
        }
    };
    if !errors.is_empty() {
        return Err(ApiError::Invalid(errors));
    }
    Ok(AttemptQuery {
        tenant: scope.tenant().map(str::to_owned),
        since_us,
        outcome: query.outcome,
        after,
        limit,
        newest_first,
    })
}

/// A subscription's attempts, oldest first (`order=newest`: newest first), a page at a time:
/// every settled delivery with its status, latency, error and the tier a retry waits in. Also for a subscription deleted
/// since, while history keeps its attempts.
#[utoipa::path(
    get, path = "/v1/subscriptions/{id}/attempts", tag = "history",
    params(("id" = String, Path), AttemptsQuery),
    responses(
        (status = 200, body = AttemptPage),
        Unauthorized,
        NoSuchSubscription,
        BadFilter,
        NoHistory,
    )
)]
pub async fn attempts(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    query: Result<Query<AttemptsQuery>, QueryRejection>,
) -> Result<axum::Json<AttemptPage>, ApiError> {
    check_id(&id).map_err(|_| ApiError::NotFound)?;
    let Query(query) =
        query.map_err(|e| ApiError::Invalid(vec![FieldError::new("(query)", e.body_text())]))?;
    let query = attempt_query(query, &scope)?;
    // Another tenant's subscription takes the path of a missing one, queries and all, so
    // neither the answer nor the time it takes tells one from the other. History is read for
    // the caller's tenant only, so it holds nothing of another tenant's.
    let owner = crate::store::subscriptions::tenant_of(&state.pool, &id).await?;
    let seen = owner.is_some_and(|o| scope.sees(&o));
    let history = state.history()?;
    let (data, next) = trace::attempts_of(history, &id, &query).await?;
    // Deleted, and nothing of it in history (the caller's tenant's, for a tenant): unknown.
    if !seen && data.is_empty() && !trace::has_attempts(history, &id, scope.tenant()).await? {
        return Err(ApiError::NotFound);
    }
    Ok(axum::Json(AttemptPage {
        data,
        next_cursor: next.map(Cursor::encode),
    }))
}
