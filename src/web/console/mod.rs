//! The operator console: the ladder as the broker holds it, the endpoints in trouble, the dead
//! letters, subscriptions across tenants, replays. Every route here is behind
//! [`super::session::console_gate`]: the visitor signed in with an admin token.
//!
//! - [`subscriptions`]: subscriptions across tenants.

pub mod subscriptions;

use axum::Router;
use axum::routing::get;

use super::WebState;

/// The console's pages (the gate is added by [`super::router`]).
pub fn routes() -> Router<WebState> {
    Router::new()
        .route("/ui/", get(subscriptions::list))
        .route("/ui/subscriptions", get(subscriptions::list))
}
