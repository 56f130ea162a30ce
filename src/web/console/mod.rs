//! The operator console: the ladder as the broker holds it, the endpoints in trouble, the dead
//! letters, subscriptions across tenants, replays. Every route here is behind
//! [`super::session::console_gate`]: the visitor signed in with an admin token.
//!
//! - [`ladder`]: the overview (`/ui/`): the workers and every queue of the ladder, refreshed
//!   live, and the tiers with their hold and release buttons.
//! - [`trouble`]: the endpoints in trouble, shown on the overview.
//! - [`quarantine`]: the endpoints quarantined now, followed from the events exchange.
//! - [`dead`]: the dead-letter sink and its redrive.
//! - [`subscriptions`]: subscriptions across tenants, searched and paged.
//! - [`replays`]: the API process's replay jobs, and cancelling one.
//! - [`event_types`]: the catalog of event types.

pub mod dead;
pub mod event_types;
pub mod ladder;
pub mod quarantine;
pub mod replays;
pub mod subscriptions;
pub mod trouble;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};

use crate::api::BrokerSetup;
use crate::broker::management::Management;

use super::WebState;
use super::page::{PageError, Site};

/// The console's pages (the gate is added by [`super::router`]).
pub fn routes() -> Router<WebState> {
    Router::new()
        .route("/ui/", get(ladder::overview))
        .route("/ui/fragments/ladder", get(ladder::fragment))
        .route("/ui/tiers/{tier}/hold", post(ladder::hold))
        .route("/ui/tiers/{tier}/release", post(ladder::release))
        .route("/ui/dead", get(dead::page))
        .route("/ui/fragments/dead", get(dead::fragment))
        .route("/ui/dead/redrive", post(dead::redrive))
        .route("/ui/subscriptions", get(subscriptions::list))
        .route("/ui/replays", get(replays::list))
        .route("/ui/fragments/replays", get(replays::fragment))
        .route("/ui/replays/{id}/cancel", post(replays::cancel))
        .route("/ui/event-types", get(event_types::page))
}

/// The broker's setup and its management API, or why the console cannot read the broker.
fn broker(state: &WebState) -> Result<(&BrokerSetup, &Management), PageError> {
    let unavailable =
        |why: &str| PageError::new(Site::Console, StatusCode::SERVICE_UNAVAILABLE, why);
    let setup = state
        .api
        .broker()
        .ok_or_else(|| unavailable("This API runs without a broker connection."))?;
    let api = setup.management.as_ref().ok_or_else(|| {
        unavailable("The management API is not configured (management.url): no broker figures.")
    })?;
    Ok((setup, api))
}
