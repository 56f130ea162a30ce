//! Getting in and out: a portal link opens a tenant's session once; the console's sign-in takes
//! an admin token (in a form, never a URL); signing out revokes the session.
//!
//! Opening a link is a POST from the page the link shows (sent by itself when scripts run), so
//! a link fetched by a preview bot or a mail scanner is not spent, and the session cookie is set
//! by a same-site request (SameSite=Strict cookies are not sent after a cross-site redirect).

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use crate::api::auth::Scope;
use crate::store::portal::{self, Holder};

use super::WebState;
use super::page::{PageError, Site, layout};
use super::session::{self, Form};

/// Whether a sign-in POST came from our own page: a browser says so in `Sec-Fetch-Site`, or
/// in an `Origin` naming the host it was sent to. Stops a page elsewhere from signing a visitor
/// into someone else's session.
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return site == "same-origin";
    }
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            url::Url::parse(origin).is_ok_and(|o| {
                let authority = match o.port() {
                    Some(port) => format!("{}:{port}", o.host_str().unwrap_or_default()),
                    None => o.host_str().unwrap_or_default().to_owned(),
                };
                authority.eq_ignore_ascii_case(host)
            })
        }
    }
}

fn with_cookie(cookie: String, to: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, to.to_owned()),
        ],
    )
        .into_response()
}

/// `GET /portal/open/{token}`: a page with the button that opens the portal (pressed by
/// itself when scripts run). Spends nothing.
pub async fn open_page(Path(token): Path<String>) -> Response {
    let body = html! {
        form method="post" action=(format!("/portal/open/{token}")) data-autosubmit {
            p { "You are opening your webhooks portal." }
            button type="submit" { "Open the portal" }
        }
    };
    layout(Site::Portal, None, "Opening the portal", body).into_response()
}

/// `POST /portal/open/{token}`: spends the link and opens a session.
pub async fn open(
    State(state): State<WebState>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    if !same_origin(&headers) {
        return Err(PageError::new(
            Site::Portal,
            StatusCode::FORBIDDEN,
            "A portal link opens only from its own page.",
        ));
    }
    let well_formed = token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit());
    let holder = if well_formed {
        portal::redeem_link(&state.api.pool, &token)
            .await
            .map_err(|e| unavailable(Site::Portal, e))?
    } else {
        None
    };
    let Some(holder) = holder else {
        return Err(PageError::new(
            Site::Portal,
            StatusCode::GONE,
            "This portal link was used already or has expired. Open the portal again from the \
             application that sent you here; it asks for a new link.",
        ));
    };
    let (session, _) = portal::create_session(&state.api.pool, &holder, state.session_ttl)
        .await
        .map_err(|e| unavailable(Site::Portal, e))?;
    Ok(with_cookie(
        session::set_cookie(&state, Site::Portal, Some(&session)),
        "/portal/",
    ))
}

fn unavailable(site: Site, e: impl std::fmt::Display) -> PageError {
    tracing::warn!(error = %e, "Page sign-in failed");
    PageError::new(
        site,
        StatusCode::SERVICE_UNAVAILABLE,
        "The store did not answer; try again in a moment.",
    )
}

/// `GET /ui/login`.
pub async fn login_page() -> Response {
    let body = html! {
        form method="post" action="/ui/login" {
            label for="token" { "Admin token" }
            input #token type="password" name="token" autocomplete="current-password" required;
            p.muted { "An admin token of " code { "api.tokens" } " (one without a tenant)." }
            button type="submit" { "Sign in" }
        }
    };
    layout(Site::Console, None, "Sign in", body).into_response()
}

#[derive(Deserialize)]
pub struct Login {
    token: String,
}

/// `POST /ui/login`: an admin token opens a console session.
pub async fn login(
    State(state): State<WebState>,
    headers: HeaderMap,
    axum::Form(login): axum::Form<Login>,
) -> Result<Response, PageError> {
    if !same_origin(&headers) {
        return Err(PageError::new(
            Site::Console,
            StatusCode::FORBIDDEN,
            "Sign in from the console's own page.",
        ));
    }
    match state.api.tokens.scope_of(login.token.trim()) {
        Some(Scope::Admin) => {}
        Some(Scope::Tenant(_)) => {
            return Err(PageError::new(
                Site::Console,
                StatusCode::FORBIDDEN,
                "A tenant's token does not open the console; a tenant's backend asks \
                 POST /v1/portal-links for a portal link.",
            ));
        }
        None => {
            return Err(PageError::new(
                Site::Console,
                StatusCode::UNAUTHORIZED,
                "That is not an admin token.",
            ));
        }
    }
    let holder = Holder {
        tenant: None,
        read_only: false,
    };
    let (session, _) = portal::create_session(&state.api.pool, &holder, state.session_ttl)
        .await
        .map_err(|e| unavailable(Site::Console, e))?;
    Ok(with_cookie(
        session::set_cookie(&state, Site::Console, Some(&session)),
        "/ui/",
    ))
}

#[derive(Deserialize)]
pub struct Nothing {}

async fn logout(state: WebState, site: Site, request: Request) -> Result<Response, PageError> {
    let token = session::cookie(request.headers(), session::cookie_name(site)).map(str::to_owned);
    Form::<Nothing>::any(request, &state).await?;
    if let Some(token) = token {
        portal::revoke_session(&state.api.pool, &token)
            .await
            .map_err(|e| unavailable(site, e))?;
    }
    let body = html! {
        p { "Signed out." }
        @if site == Site::Console { p { a href="/ui/login" { "Sign in again" } } }
    };
    let mut response = layout(site, None, "Signed out", body).into_response();
    if let Ok(cookie) = session::set_cookie(&state, site, None).parse() {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    Ok(response)
}

/// `POST /portal/logout`.
pub async fn logout_portal(State(state): State<WebState>, request: Request) -> Response {
    logout(state, Site::Portal, request).await.into_response()
}

/// `POST /ui/logout`.
pub async fn logout_console(State(state): State<WebState>, request: Request) -> Response {
    logout(state, Site::Console, request).await.into_response()
}
