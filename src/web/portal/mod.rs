//! The tenant portal: a tenant's endpoints (its subscriptions), their health and attempts.
//! Every route here is behind [`super::session::portal_gate`]: the visitor is a tenant, and the
//! API's handlers are called with its scope, so another tenant's anything answers 404.
//!
//! - [`endpoints`]: the list of endpoints, and creating one.
//! - [`endpoint`]: one endpoint's page (settings, health, latest attempts) and its edit.
//! - [`filter`]: its payload filter, and trying it against a payload.
//! - [`actions`]: pause, resume, delete, rotate the secret, send a test event, replay.
//! - [`attempts`]: an endpoint's attempts, newest first, filtered.
//! - [`events`]: one event's story, and a replay's progress.
//! - [`event_types`]: the event types the tenant receives.

pub mod actions;
pub mod attempts;
pub mod endpoint;
pub mod endpoints;
pub mod event_types;
pub mod events;
pub mod filter;

use axum::Router;
use axum::routing::{get, post};

use super::WebState;

/// The portal's pages (the gate is added by [`super::router`]).
pub fn routes() -> Router<WebState> {
    Router::new()
        .route("/portal/", get(endpoints::list))
        .route("/portal/endpoints", post(endpoints::create))
        .route("/portal/endpoints/new", get(endpoints::new_page))
        .route("/portal/endpoints/{id}", get(endpoint::show))
        .route(
            "/portal/endpoints/{id}/edit",
            get(endpoint::edit_page).post(endpoint::update),
        )
        .route("/portal/endpoints/{id}/latest", get(attempts::latest))
        .route("/portal/endpoints/{id}/filter", post(filter::try_payload))
        .route("/portal/endpoints/{id}/pause", post(actions::pause))
        .route("/portal/endpoints/{id}/resume", post(actions::resume))
        .route(
            "/portal/endpoints/{id}/delete",
            get(actions::delete_page).post(actions::delete),
        )
        .route(
            "/portal/endpoints/{id}/rotate",
            get(actions::rotate_page).post(actions::rotate),
        )
        .route("/portal/endpoints/{id}/test", post(actions::send_test))
        .route("/portal/endpoints/{id}/replay", post(actions::replay))
        .route("/portal/attempts", get(attempts::page))
        .route("/portal/events/{id}", get(events::story))
        .route("/portal/events/{id}/replay", post(events::replay_event))
        .route("/portal/replays/{id}", get(events::replay))
        .route(
            "/portal/replays/{id}/progress",
            get(events::replay_progress),
        )
        .route("/portal/event-types", get(event_types::page))
}
