//! The actions on one endpoint: pause, resume, delete (confirmed), rotate its secret (the new
//! one shown once, on the answer), send a test event, replay a window of its events.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde_json::json;

use crate::api::auth::Scope;
use crate::api::model::{RotatedSecret, TestEventSent};
use crate::api::problem::ApiError;
use crate::api::quota::{self, Spend};
use crate::api::replays::ReplayJob;

use super::endpoint::read;
use super::endpoints::{filled, shown_once};
use crate::web::page::{PageError, Site, done, layout};
use crate::web::session::{Form, Visitor};
use crate::web::{WebState, call};

pub(super) fn to_page(e: ApiError) -> PageError {
    PageError::from_api(Site::Portal, e)
}

/// A form with nothing but its CSRF token.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Bare {}

pub(super) fn spend(state: &WebState, visitor: &Visitor, spend: Spend) -> Result<(), PageError> {
    quota::take(
        &state.api,
        visitor.tenant.as_deref().unwrap_or_default(),
        spend,
    )
    .map_err(to_page)
}

/// `POST /portal/endpoints/{id}/pause`.
pub async fn pause(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<Bare>,
) -> Result<Response, PageError> {
    spend(&state, &form.visitor, Spend::Write)?;
    let _paused =
        crate::api::actions::pause(State(state.api.clone()), Extension(scope), Path(id.clone()))
            .await
            .map_err(to_page)?;
    Ok(done(
        &format!("/portal/endpoints/{id}"),
        "Paused: its deliveries wait, parked, until it is resumed.",
    ))
}

/// `POST /portal/endpoints/{id}/resume`: parked deliveries come back at the API's pace.
pub async fn resume(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<Bare>,
) -> Result<Response, PageError> {
    spend(&state, &form.visitor, Spend::Write)?;
    let axum::Json(resumed) = crate::api::actions::resume(
        State(state.api.clone()),
        Extension(scope),
        Path(id.clone()),
        call::empty(),
    )
    .await
    .map_err(to_page)?;
    let message = if resumed.returning_parked {
        "Resumed: its parked deliveries are coming back."
    } else {
        "Resumed."
    };
    Ok(done(&format!("/portal/endpoints/{id}"), message))
}

/// `GET /portal/endpoints/{id}/delete`: asks first.
pub async fn delete_page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let view = read(&state, scope, &id).await?;
    let body = html! {
        @if visitor.read_only { p.flash.error { "This portal session is read-only." } }
        @else {
            p { "Delete endpoint " code { (view.id) } " (" span.mono { (view.url) } ")? "
                "What waits for it is cancelled; its attempts stay in history." }
            form method="post" action=(format!("/portal/endpoints/{}/delete", view.id)) {
                (visitor.csrf_field())
                label { input type="checkbox" name="confirm" value="yes" required; " Yes, delete it" }
                p.actions {
                    button.danger type="submit" { "Delete" }
                    a href=(format!("/portal/endpoints/{}", view.id)) { "Keep it" }
                }
            }
        }
    };
    Ok(layout(Site::Portal, Some(&visitor), "Delete an endpoint", body).into_response())
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct Confirm {
    #[serde(default)]
    confirm: String,
}

/// `POST /portal/endpoints/{id}/delete`: only with the box ticked.
pub async fn delete(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<Confirm>,
) -> Result<Response, PageError> {
    spend(&state, &form.visitor, Spend::Write)?;
    if form.value.confirm != "yes" {
        // Whether it exists is told before whether the box was ticked: 404 stays 404.
        read(&state, scope, &id).await?;
        return Err(PageError::new(
            Site::Portal,
            StatusCode::UNPROCESSABLE_ENTITY,
            "Tick the box to confirm the deletion.",
        ));
    }
    crate::api::subscriptions::remove(State(state.api.clone()), Extension(scope), Path(id.clone()))
        .await
        .map_err(to_page)?;
    Ok(done("/portal/", &format!("Endpoint {id} deleted.")))
}

/// `GET /portal/endpoints/{id}/rotate`: the rotation's choices.
pub async fn rotate_page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let view = read(&state, scope, &id).await?;
    let body = html! {
        @if visitor.read_only { p.flash.error { "This portal session is read-only." } }
        @else {
            p { "A new secret signs from now on; the current ones keep signing beside it until they expire, so your receiver can switch." }
            form method="post" action=(format!("/portal/endpoints/{}/rotate", view.id)) {
                (visitor.csrf_field())
                label for="signatures" { "Sign with" }
                select #signatures name="signatures" {
                    option value="" selected { "the schemes it signs with now" }
                    option value="v1" { "v1: HMAC-SHA256, a shared secret" }
                    option value="v1a" { "v1a: ed25519 (move to v1a)" }
                    option value="both" { "both" }
                }
                label for="expire" { "The current secrets stop signing" }
                select #expire name="expire_old_after" {
                    option value="24h" selected { "in 24 hours" }
                    option value="1h" { "in an hour" }
                    option value="0s" { "now" }
                }
                p.actions { button type="submit" { "Rotate" } a href=(format!("/portal/endpoints/{}", view.id)) { "Cancel" } }
            }
        }
    };
    Ok(layout(Site::Portal, Some(&visitor), "Rotate the secret", body).into_response())
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct Rotate {
    #[serde(default)]
    signatures: String,
    #[serde(default)]
    expire_old_after: String,
}

/// `POST /portal/endpoints/{id}/rotate`: the new secret is in this answer alone (a 200, not a
/// redirect), so it is never in a URL and never shown again.
pub async fn rotate(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<Rotate>,
) -> Result<Response, PageError> {
    let Form { visitor, value } = form;
    spend(&state, &visitor, Spend::Write)?;
    let mut request = json!({});
    match value.signatures.as_str() {
        "v1" => request["signatures"] = json!(["v1"]),
        "v1a" => request["signatures"] = json!(["v1a"]),
        "both" => request["signatures"] = json!(["v1", "v1a"]),
        _ => {}
    }
    if let Some(after) = filled(&value.expire_old_after) {
        request["expire_old_after"] = json!(after);
    }
    let axum::Json(RotatedSecret {
        secret,
        public_key,
        old_expires_at,
        subscription,
    }) = crate::api::actions::rotate(
        State(state.api.clone()),
        Extension(scope),
        Path(id),
        call::body(&request),
    )
    .await
    .map_err(to_page)?;
    let body = html! {
        p.flash role="status" { "Rotated. The previous secrets sign until " code { (old_expires_at) } "." }
        (shown_once(secret.as_deref(), public_key.as_deref()))
        p.actions { a href=(format!("/portal/endpoints/{}", subscription.id)) { "Back to the endpoint" } }
    };
    Ok(layout(Site::Portal, Some(&visitor), "New signing secret", body).into_response())
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct TestEvent {
    #[serde(default)]
    event_type: String,
}

/// `POST /portal/endpoints/{id}/test`: back to the endpoint, whose latest attempts show it
/// arrive once history records it.
pub async fn send_test(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<TestEvent>,
) -> Result<Response, PageError> {
    spend(&state, &form.visitor, Spend::TestEvent)?;
    let mut request = json!({});
    if let Some(t) = filled(&form.value.event_type) {
        request["event_type"] = json!(t);
    }
    let (
        _,
        axum::Json(TestEventSent {
            envelope_id,
            event_type,
        }),
    ) = crate::api::actions::send_test(
        State(state.api.clone()),
        Extension(scope),
        Path(id.clone()),
        call::body(&request),
    )
    .await
    .map_err(to_page)?;
    Ok(done(
        &format!("/portal/endpoints/{id}"),
        &format!(
            "Test event {envelope_id} ({event_type}) sent; its attempt shows below once history records it."
        ),
    ))
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct Replay {
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    only_undelivered: Option<String>,
}

/// `POST /portal/endpoints/{id}/replay`: a replay of the endpoint's events in a window, then
/// its job's page.
pub async fn replay(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<Replay>,
) -> Result<Response, PageError> {
    spend(&state, &form.visitor, Spend::Write)?;
    // Another tenant's endpoint would match nothing; it is answered 404, as everywhere.
    read(&state, scope.clone(), &id).await?;
    let mut request = json!({
        "from": form.value.from.trim(),
        "subscription": id,
        "only_undelivered": form.value.only_undelivered.is_some(),
    });
    if let Some(to) = filled(&form.value.to) {
        request["to"] = json!(to);
    }
    start_replay(&state, scope, &request, "Replay started.").await
}

/// Starts the replay `request` asks for with the visitor's scope; its job's page.
pub(super) async fn start_replay(
    state: &WebState,
    scope: Scope,
    request: &serde_json::Value,
    message: &str,
) -> Result<Response, PageError> {
    let response = crate::api::replays::create(
        State(state.api.clone()),
        Extension(scope),
        call::body(request),
    )
    .await
    .map_err(to_page)?;
    let job: ReplayJob = call::read(response).await.map_err(to_page)?;
    Ok(done(&format!("/portal/replays/{}", job.id), message))
}
