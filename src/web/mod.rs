//! The pages, served by `hookrelay api` beside `/v1` from the same process, store and
//! authorization: the tenant portal under `/portal/` (opened by a one-time link a tenant's
//! backend asks `POST /v1/portal-links` for) and the operator console under `/ui/` (signed in
//! with an admin token).
//!
//! Server-rendered HTML (maud: compiled with the binary, escaping every value) with htmx for
//! the parts that refresh themselves; every page reads and every form works with scripts off.
//! The pages call the API's own handlers with the visitor's scope, so a page can do nothing the
//! API would refuse the same tenant, and is counted against the same quotas.
//!
//! - [`page`]: the layout, the security headers, errors as pages.
//! - [`session`]: sessions, their cookies, the CSRF-checked forms.
//! - [`signin`]: opening a portal link, the console's sign-in, signing out.
//! - [`assets`]: the embedded style sheet and scripts.
//! - [`call`]: calling the API's handlers from a page.
//! - [`catalog`]: the catalog of event types, as both sites show it.
//! - [`portal`]: the tenant portal's pages.
//! - [`console`]: the operator console's pages.

pub mod assets;
pub mod call;
pub mod catalog;
pub mod console;
pub mod page;
pub mod portal;
pub mod session;
pub mod signin;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

use crate::api::{ApiSetup, ApiState};

/// The pages' shared state: the API's, and how sessions are made.
#[derive(Debug, Clone)]
pub struct WebState(Arc<WebShared>);

#[derive(Debug)]
pub struct WebShared {
    pub api: ApiState,
    pub session_ttl: Duration,
    /// `api.public_url` is `https://`: cookies are `Secure`.
    pub secure_cookies: bool,
    /// The endpoints quarantined now, followed from the events exchange for the console.
    pub quarantines: console::quarantine::Watch,
}

impl Deref for WebState {
    type Target = WebShared;
    fn deref(&self) -> &WebShared {
        &self.0
    }
}

/// The API and the pages, as `hookrelay api` serves them.
pub fn app(setup: ApiSetup) -> (Router, ApiState) {
    let (api, state) = crate::api::router(setup);
    (api.merge(router(state.clone())), state)
}

/// The pages' routes over the API's state.
pub fn router(api: ApiState) -> Router {
    let pages = api.pages.clone();
    let quarantines = api
        .broker()
        .map(console::quarantine::Watch::start)
        .unwrap_or_default();
    let state = WebState(Arc::new(WebShared {
        quarantines,
        session_ttl: pages.session_ttl,
        secure_cookies: pages.public_url.starts_with("https://"),
        api,
    }));
    let frame_ancestors = Arc::new(if pages.frame_ancestors.is_empty() {
        "'none'".to_owned()
    } else {
        pages.frame_ancestors.join(" ")
    });
    // The console may never be framed, whatever the portal allows.
    let console_frames = Arc::new("'none'".to_owned());
    let portal = portal::routes()
        .route("/portal/logout", post(signin::logout_portal))
        .route_layer(from_fn_with_state(state.clone(), session::portal_gate))
        .route(
            "/portal/open/{token}",
            get(signin::open_page).post(signin::open),
        )
        .layer(from_fn_with_state(frame_ancestors, page::secure_headers));
    let console = console::routes()
        .route("/ui/logout", post(signin::logout_console))
        .route_layer(from_fn_with_state(state.clone(), session::console_gate))
        .route("/ui/login", get(signin::login_page).post(signin::login))
        .route("/ui/assets/{version}/{name}", get(assets::serve))
        .layer(from_fn_with_state(console_frames, page::secure_headers));
    portal
        .merge(console)
        .route(
            "/ui",
            get(|| async { axum::response::Redirect::to("/ui/") }),
        )
        .route(
            "/portal",
            get(|| async { axum::response::Redirect::to("/portal/") }),
        )
        .layer(DefaultBodyLimit::max(session::MAX_FORM))
        .with_state(state)
}
