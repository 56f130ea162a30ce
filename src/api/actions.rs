//! The actions on one subscription beside its create, read, update and delete: pause, resume
//! (returning its parked deliveries), rotate the signing secret, send a test event.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use tracing::info;

use crate::contract::envelope::NewEvent;
use crate::store::subscriptions as store;
use crate::units::Rate;

use super::ApiState;
use super::auth::Scope;
use super::extract::{json, path_id};
use super::model::{
    ResumeSubscription, Resumed, RotateSecret, RotatedSecret, SendTestEvent, SubscriptionView,
    TestEventSent,
};
use super::problem::documented::{Invalid, MalformedJson, NoSuchSubscription, Unauthorized};
use super::problem::{ApiError, Problem};
use super::subscriptions::{new_signing, signing_schemes, view};
use super::validate;

/// Sets `paused`, in one transaction; the view after, and whether this call changed it (the
/// row is locked, so of concurrent calls one alone does).
async fn set_paused(
    state: &ApiState,
    scope: &Scope,
    id: &str,
    paused: bool,
) -> Result<(SubscriptionView, bool), ApiError> {
    path_id(id)?;
    let mut tx = state.pool.begin().await?;
    let mut sub = store::lock(&mut tx, id, scope.tenant())
        .await?
        .map(validate::Checked::from_store)
        .transpose()?
        .ok_or(ApiError::NotFound)?;
    let changed = sub.paused != paused;
    if changed {
        sub.paused = paused;
        store::save(&mut tx, &sub.to_store(), &[]).await?;
    }
    let view = view(&mut tx, id, scope).await?.ok_or(ApiError::NotFound)?;
    tx.commit().await?;
    Ok((view, changed))
}

/// Pauses a subscription: workers park its deliveries; nothing is attempted, cancelled or
/// charged until it is resumed.
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/pause", tag = "subscriptions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = SubscriptionView),
        Unauthorized,
        NoSuchSubscription,
    )
)]
pub async fn pause(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<SubscriptionView>, ApiError> {
    let (view, _) = set_paused(&state, &scope, &id, true).await?;
    info!(subscription = %id, "Paused subscription");
    Ok(axum::Json(view))
}

/// Resumes a paused subscription, then returns its parked deliveries at `rate`: after
/// `api.resume_wait` (for the workers to see the change), in the background, with the mover
/// of `hookrelay subscriptions resume`. Only a resume that changes `paused` does that (one at a
/// time per subscription, on the API's one broker connection); resuming one that is not
/// paused changes nothing and answers `returning_parked: false`.
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/resume", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body(content = Option<ResumeSubscription>, description = "Optional"),
    responses(
        (status = 200, body = Resumed),
        MalformedJson,
        Unauthorized,
        NoSuchSubscription,
        Invalid,
    )
)]
pub async fn resume(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Resumed>, ApiError> {
    let req: ResumeSubscription = json(body, Some(ResumeSubscription::default()), state.max_body)?;
    let rate = req
        .rate
        .as_deref()
        .map(str::parse::<Rate>)
        .transpose()
        .map_err(|e| ApiError::field("rate", e.to_string()))?;
    let (view, changed) = set_paused(&state, &scope, &id, false).await?;
    let returning_parked = changed && state.return_parked(&id, rate);
    info!(subscription = %id, returning_parked, "Resumed subscription");
    Ok(axum::Json(Resumed {
        subscription: view,
        returning_parked,
    }))
}

/// Rotates the signing secret: a new one per scheme (those signing now, or `signatures`),
/// generated here and shown this once (a `v1a` key as its public key), signs from now on; the
/// current ones keep signing beside it until the time given (24 hours by default).
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/secrets/rotate", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body(content = Option<RotateSecret>, description = "Optional"),
    responses(
        (status = 200, description = "The new secret, shown this once", body = RotatedSecret),
        MalformedJson,
        Unauthorized,
        NoSuchSubscription,
        Invalid,
    )
)]
pub async fn rotate(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<RotatedSecret>, ApiError> {
    path_id(&id)?;
    let req: RotateSecret = json(body, Some(RotateSecret::default()), state.max_body)?;
    let old_until = validate::overlap_end(&req, std::time::SystemTime::now())?;
    let mut tx = state.pool.begin().await?;
    let current = store::lock(&mut tx, &id, scope.tenant())
        .await?
        .map(validate::Checked::from_store)
        .transpose()?
        .ok_or(ApiError::NotFound)?;
    let schemes = match &req.signatures {
        Some(asked) => validate::schemes(Some(asked), "signatures")?,
        None => signing_schemes(&mut tx, &id).await?,
    };
    let signing = new_signing(&state, &current.tenant, &id, &schemes)?;
    store::rotate(&mut tx, &id, &signing.rows, old_until).await?;
    let view = view(&mut tx, &id, &scope)
        .await?
        .ok_or(ApiError::NotFound)?;
    tx.commit().await?;
    let old_expires_at = humantime::format_rfc3339_millis(old_until).to_string();
    info!(subscription = %id, old_expires_at = %old_expires_at, "Rotated signing secret");
    Ok(axum::Json(RotatedSecret {
        secret: signing.secret,
        public_key: signing.public_key,
        old_expires_at,
        subscription: view,
    }))
}

/// Sends a test event to one subscription through the ingress exchange, as a producer would:
/// it is delivered, signed, retried and accounted like any other.
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/test", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body(content = Option<SendTestEvent>, description = "Optional"),
    responses(
        (status = 202, description = "Published, confirmed by the broker", body = TestEventSent),
        MalformedJson,
        Unauthorized,
        NoSuchSubscription,
        (status = 409, description = "The subscription is disabled", body = Problem, content_type = "application/problem+json"),
        Invalid,
        (status = 503, description = "The broker did not take it", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn send_test(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<TestEventSent>), ApiError> {
    path_id(&id)?;
    let req: SendTestEvent = json(body, Some(SendTestEvent::default()), state.max_body)?;
    let sub = {
        let mut conn = state.pool.acquire().await?;
        store::find(&mut conn, &id, scope.tenant())
            .await?
            .map(validate::Checked::from_store)
            .transpose()?
            .ok_or(ApiError::NotFound)?
    };
    if !sub.enabled {
        return Err(ApiError::Conflict(
            "the subscription is disabled: a test event would be cancelled; enable it first".into(),
        ));
    }
    let event_type = validate::test_event_type(req.event_type, &sub.event_types)?;
    if req
        .data
        .as_ref()
        .is_some_and(|d| !d.is_object() && !d.is_null())
    {
        return Err(ApiError::field("data", "expected a JSON object"));
    }
    let body = serde_json::json!({
        "type": event_type,
        "timestamp": crate::units::now_rfc3339(),
        "data": req.data.filter(|d| !d.is_null()).unwrap_or_else(|| serde_json::json!({})),
    });
    let event = NewEvent {
        id: format!("evt_test_{}", uuid::Uuid::new_v4().simple()),
        tenant: sub.tenant.clone(),
        event_type: event_type.clone(),
        subscription: Some(sub.id.clone()),
        timestamp: None,
        body: serde_json::to_vec(&body).map_err(ApiError::internal)?,
    };
    let envelope_id = state.publish(&event).await?;
    info!(subscription = %id, envelope = %envelope_id, "Sent test event");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(TestEventSent {
            envelope_id,
            event_type,
        }),
    ))
}
