//! What every page shares: the layout, the security headers (a strict Content-Security-Policy
//! with no inline script, no caching, no referrer), and errors shown as pages.
//!
//! Every value is put in a page through maud's `html!`, which escapes it: a URL, event type or
//! header name carrying markup renders as text. Nothing here writes raw HTML from data.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::api::problem::ApiError;

use super::assets;
use super::session::Visitor;

/// Which of the two sites a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    Portal,
    Console,
}

impl Site {
    pub fn root(self) -> &'static str {
        match self {
            Site::Portal => "/portal/",
            Site::Console => "/ui/",
        }
    }
}

/// A flash message carried in a redirect's query (`?done=...`): text only, escaped when shown.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Flash {
    pub done: Option<String>,
    pub error: Option<String>,
}

impl Flash {
    pub fn render(&self) -> Markup {
        html! {
            @if let Some(done) = &self.done { p.flash role="status" { (done) } }
            @if let Some(error) = &self.error { p.flash.error role="alert" { (error) } }
        }
    }
}

/// A redirect after a form (POST, then GET): `to` with a message shown there.
pub fn done(to: &str, message: &str) -> Response {
    let sep = if to.contains('?') { '&' } else { '?' };
    let message: String = url::form_urlencoded::byte_serialize(message.as_bytes()).collect();
    Redirect::to(&format!("{to}{sep}done={message}")).into_response()
}

/// A whole page: the site's header and navigation, then `body`.
pub fn layout(site: Site, visitor: Option<&Visitor>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // htmx must not inject inline styles or evaluate code: the CSP allows neither.
                meta name="htmx-config" content=(PreEscaped(r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false}"#));
                title { (title) " · hookrelay" }
                link rel="stylesheet" href=(assets::path("app.css"));
                script src=(assets::path("htmx.min.js")) defer {}
                script src=(assets::path("app.js")) defer {}
            }
            body {
                header.top {
                    span.brand { "hookrelay " (match site { Site::Portal => "portal", Site::Console => "console" }) }
                    @if let Some(v) = visitor {
                        nav aria-label="Main" {
                            @match site {
                                Site::Portal => {
                                    a href="/portal/" { "Endpoints" }
                                    a href="/portal/attempts" { "Attempts" }
                                    a href="/portal/event-types" { "Event types" }
                                }
                                Site::Console => {
                                    a href="/ui/" { "Ladder" }
                                    a href="/ui/dead" { "Dead letters" }
                                    a href="/ui/subscriptions" { "Subscriptions" }
                                    a href="/ui/replays" { "Replays" }
                                    a href="/ui/event-types" { "Event types" }
                                }
                            }
                        }
                        span.muted {
                            @if let Some(t) = &v.tenant { "tenant " code { (t) } }
                            @else { "operator" }
                            @if v.read_only { " · read-only" }
                        }
                        form.inline method="post" action=(format!("{}logout", site.root())) {
                            (v.csrf_field())
                            button.secondary type="submit" { "Sign out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// Adds the headers every page answer carries.
pub async fn secure_headers(
    State(frame_ancestors): State<std::sync::Arc<String>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let csp = format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors {frame_ancestors}"
    );
    if let Ok(csp) = HeaderValue::from_str(&csp) {
        headers.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// A page's failure, shown as a page with the API's words.
#[derive(Debug)]
pub struct PageError {
    pub site: Site,
    pub status: StatusCode,
    pub message: String,
}

impl PageError {
    pub fn new(site: Site, status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            site,
            status,
            message: message.into(),
        }
    }

    pub fn not_found(site: Site) -> Self {
        Self::new(site, StatusCode::NOT_FOUND, "Not found.")
    }

    /// The API's error, with its status and message (field errors listed).
    pub fn from_api(site: Site, error: ApiError) -> Self {
        if let ApiError::Internal(message) = &error {
            tracing::error!(error = %message, "Page request failed");
        }
        let problem = error.to_problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(site, status, problem.detail.unwrap_or(problem.title))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let title = match self.status {
            StatusCode::NOT_FOUND => "Not found",
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => "Not allowed",
            StatusCode::TOO_MANY_REQUESTS => "Too many requests",
            s if s.is_server_error() => "Unavailable",
            _ => "Cannot do that",
        };
        let body = html! {
            p.flash.error role="alert" { (self.message) }
            p { a href=(self.site.root()) { "Back" } }
        };
        (self.status, layout(self.site, None, title, body)).into_response()
    }
}
