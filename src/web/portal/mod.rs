//! The tenant portal: a tenant's endpoints (its subscriptions), their health and attempts.
//! Every route here is behind [`super::session::portal_gate`]: the visitor is a tenant, and the
//! API's handlers are called with its scope, so another tenant's anything answers 404.
//!
//! - [`endpoints`]: the list of endpoints.

pub mod endpoints;

use axum::Router;
use axum::routing::get;

use super::WebState;

/// The portal's pages (the gate is added by [`super::router`]).
pub fn routes() -> Router<WebState> {
    Router::new().route("/portal/", get(endpoints::list))
}
