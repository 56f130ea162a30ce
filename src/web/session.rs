//! Who is looking at a page: a session opened by a one-time portal link (a tenant's) or by an
//! admin token at the console's sign-in (an operator's), carried in an HttpOnly, SameSite=Strict
//! cookie (Secure when `api.public_url` is `https://`). Every POST carries the session's CSRF
//! token in a hidden field, checked before anything is done; a read-only session may not POST.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

use crate::api::auth::Scope;
use crate::store::portal;

use super::WebState;
use super::page::{PageError, Site};

pub const PORTAL_COOKIE: &str = "hookrelay_portal";
pub const CONSOLE_COOKIE: &str = "hookrelay_console";
/// The hidden field of every form.
pub const CSRF_FIELD: &str = "csrf";
/// The largest form body a page takes.
pub const MAX_FORM: usize = 64 * 1024;

/// The signed-in visitor of a page, in the request's extensions.
#[derive(Debug, Clone)]
pub struct Visitor {
    /// `None`: an operator.
    pub tenant: Option<String>,
    pub read_only: bool,
    pub csrf: String,
}

impl Visitor {
    /// What the API's handlers are called with.
    pub fn scope(&self) -> Scope {
        match &self.tenant {
            Some(t) => Scope::Tenant(t.clone()),
            None => Scope::Admin,
        }
    }

    /// The hidden CSRF field every form carries.
    pub fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name=(CSRF_FIELD) value=(self.csrf); }
    }
}

pub fn cookie_name(site: Site) -> &'static str {
    match site {
        Site::Portal => PORTAL_COOKIE,
        Site::Console => CONSOLE_COOKIE,
    }
}

/// The value of cookie `name` in `headers`.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The `Set-Cookie` of a new session on `site`, or of its end (`token` `None`).
pub fn set_cookie(state: &WebState, site: Site, token: Option<&str>) -> String {
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let path = site.root().trim_end_matches('/');
    match token {
        Some(token) => format!(
            "{}={token}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            cookie_name(site),
            state.session_ttl.as_secs()
        ),
        None => format!(
            "{}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0{secure}",
            cookie_name(site)
        ),
    }
}

async fn visitor_of(state: &WebState, site: Site, headers: &HeaderMap) -> Option<Visitor> {
    let token = cookie(headers, cookie_name(site))?;
    let session = match portal::find_session(&state.api.pool, token).await {
        Ok(session) => session?,
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read a page session");
            return None;
        }
    };
    let visitor = Visitor {
        tenant: session.holder.tenant,
        read_only: session.holder.read_only,
        csrf: session.csrf,
    };
    // A portal session is a tenant's, a console session an operator's; never the other.
    let fits = match site {
        Site::Portal => visitor.tenant.is_some(),
        Site::Console => visitor.tenant.is_none(),
    };
    fits.then_some(visitor)
}

/// Lets a portal page through with its [`Visitor`]; else a page saying to ask for a new link.
pub async fn portal_gate(State(state): State<WebState>, request: Request, next: Next) -> Response {
    gate(state, Site::Portal, request, next).await
}

/// Lets a console page through with its [`Visitor`]; else to the sign-in.
pub async fn console_gate(State(state): State<WebState>, request: Request, next: Next) -> Response {
    gate(state, Site::Console, request, next).await
}

async fn gate(state: WebState, site: Site, mut request: Request, next: Next) -> Response {
    let Some(visitor) = visitor_of(&state, site, request.headers()).await else {
        return match site {
            Site::Console if request.method() == Method::GET => {
                Redirect::to("/ui/login").into_response()
            }
            Site::Console => PageError::new(
                site,
                StatusCode::UNAUTHORIZED,
                "Your session has ended: sign in again.",
            )
            .into_response(),
            Site::Portal => PageError::new(
                site,
                StatusCode::UNAUTHORIZED,
                "This portal session has ended or was revoked. Open the portal again from the \
                 application that sent you here; it asks for a new link.",
            )
            .into_response(),
        };
    };
    request.extensions_mut().insert(visitor.scope());
    request.extensions_mut().insert(visitor);
    next.run(request).await
}

/// A form body, taken only with the session's CSRF token, and only from a session that may
/// change things (signing out is allowed to read-only sessions too, see [`Form::any`]).
#[derive(Debug)]
pub struct Form<T> {
    pub visitor: Visitor,
    pub value: T,
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Form<T> {
    type Rejection = PageError;

    async fn from_request(request: Request, state: &S) -> Result<Self, PageError> {
        let (visitor, value) = checked_form::<T, S>(request, state).await?;
        if visitor.read_only {
            return Err(PageError::new(
                site_of(&visitor),
                StatusCode::FORBIDDEN,
                "This portal session is read-only.",
            ));
        }
        Ok(Self { visitor, value })
    }
}

impl<T> Form<T> {
    /// A form a read-only session may send too.
    pub async fn any<S: Send + Sync>(request: Request, state: &S) -> Result<Self, PageError>
    where
        T: DeserializeOwned,
    {
        let (visitor, value) = checked_form::<T, S>(request, state).await?;
        Ok(Self { visitor, value })
    }
}

fn site_of(visitor: &Visitor) -> Site {
    if visitor.tenant.is_some() {
        Site::Portal
    } else {
        Site::Console
    }
}

async fn checked_form<T: DeserializeOwned, S: Send + Sync>(
    request: Request,
    state: &S,
) -> Result<(Visitor, T), PageError> {
    let visitor = request
        .extensions()
        .get::<Visitor>()
        .cloned()
        .ok_or_else(|| PageError::new(Site::Portal, StatusCode::UNAUTHORIZED, "Not signed in."))?;
    let site = site_of(&visitor);
    let body = Bytes::from_request(request, state)
        .await
        .map_err(|e| PageError::new(site, e.status(), "The form could not be read.".to_owned()))?;
    if body.len() > MAX_FORM {
        return Err(PageError::new(
            site,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("The form is over {MAX_FORM} bytes."),
        ));
    }
    let sent = url::form_urlencoded::parse(&body)
        .find(|(k, _)| k == CSRF_FIELD)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !bool::from(sent.as_bytes().ct_eq(visitor.csrf.as_bytes())) {
        return Err(PageError::new(
            site,
            StatusCode::FORBIDDEN,
            "The form's security token does not match this session: reload the page and try again.",
        ));
    }
    let value = serde_urlencoded::from_bytes(&body)
        .map_err(|e| PageError::new(site, StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
    Ok((visitor, value))
}
