//! A tenant's endpoints: the list, and creating one (its secret shown once, on the answer).

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde_json::json;

use crate::api::auth::Scope;
use crate::api::model::{CreatedSubscription, ListQuery};
use crate::api::quota::{self, Spend};

use crate::web::page::{Flash, PageError, Site, layout};
use crate::web::session::{Form, Visitor};
use crate::web::{WebState, call};

#[derive(Debug, Default, serde::Deserialize)]
pub struct ListParams {
    cursor: Option<String>,
    #[serde(flatten)]
    flash: Flash,
}

/// `GET /portal/`: the tenant's endpoints, fifty a page.
pub async fn list(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Query(params): Query<ListParams>,
) -> Result<Response, PageError> {
    let query = ListQuery {
        cursor: params.cursor.clone(),
        ..Default::default()
    };
    let axum::Json(page) = crate::api::subscriptions::list(
        State(state.api.clone()),
        Extension(scope),
        Ok(Query(query)),
    )
    .await
    .map_err(|e| PageError::from_api(Site::Portal, e))?;
    let body = html! {
        (params.flash.render())
        @if !visitor.read_only {
            p.actions { a href="/portal/endpoints/new" { "Add an endpoint" } }
        }
        @if page.data.is_empty() {
            p.muted { "No endpoints yet." }
        } @else {
            table {
                thead { tr { th { "Endpoint" } th { "URL" } th { "Event types" } th { "State" } } }
                tbody {
                    @for sub in &page.data {
                        tr {
                            td {
                                a href=(format!("/portal/endpoints/{}", sub.id)) { code { (sub.id) } }
                                @if !sub.description.is_empty() { br; span.muted { (sub.description) } }
                            }
                            td.mono { (sub.url) }
                            td {
                                @match &sub.event_types {
                                    Some(types) => { @for t in types { code { (t) } " " } }
                                    None => span.muted { "all" },
                                }
                            }
                            td {
                                @if !sub.enabled { span.badge.bad { "disabled" } }
                                @else if sub.paused { span.badge.warn { "paused" } }
                                @else { span.badge.good { "active" } }
                            }
                        }
                    }
                }
            }
            @if let Some(next) = &page.next_cursor {
                p.pager { a href=(format!("/portal/?cursor={next}")) { "Next page" } }
            }
        }
    };
    Ok(layout(Site::Portal, Some(&visitor), "Endpoints", body).into_response())
}

/// The event types typed in a form: separated by commas or spaces; none typed: every type.
pub fn event_types_of(text: &str) -> Option<Vec<String>> {
    let types: Vec<String> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    (!types.is_empty()).then_some(types)
}

/// `None` for a field left empty (the API's default), else its trimmed text.
pub fn filled(text: &str) -> Option<&str> {
    Some(text.trim()).filter(|t| !t.is_empty())
}

/// The create form's fields (no `deny_unknown_fields`: the CSRF token is in the body too).
#[derive(Default, serde::Deserialize)]
pub struct NewEndpoint {
    #[serde(default)]
    url: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    event_types: String,
    /// `v1`, `v1a` or `both`.
    #[serde(default)]
    signatures: String,
    /// For an `amqp://` or `amqps://` URL: the partner's exchange (empty: its default one).
    #[serde(default)]
    exchange: String,
    /// For an `amqp://` or `amqps://` URL: a fixed routing key (empty: each event's type).
    #[serde(default)]
    routing_key: String,
    /// The login the endpoint asks for: `Authorization: Basic` over HTTP, the broker's user
    /// for an AMQP URL.
    #[serde(default)]
    username: String,
    /// Never written back into a form.
    #[serde(default)]
    password: String,
}

impl NewEndpoint {
    /// Whether the URL names a partner's RabbitMQ rather than an HTTP endpoint.
    fn is_amqp(&self) -> bool {
        let url = self.url.trim();
        url.get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("amqp://"))
            || url
                .get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
    }
}

/// The create form, filled with what was sent when it comes back refused.
fn new_form(visitor: &Visitor, sent: &NewEndpoint) -> Markup {
    html! {
        form method="post" action="/portal/endpoints" {
            (visitor.csrf_field())
            label for="url" { "URL" }
            input #url type="url" name="url" required value=(sent.url) placeholder="https://example.com/webhooks"
                aria-describedby="url_help";
            p #url_help .muted { "An " code { "https://" } " endpoint, or a RabbitMQ of yours to publish into: " code { "amqps://broker.example.com/vhost" } "." }
            label for="description" { "Description" }
            input #description type="text" name="description" value=(sent.description);
            label for="event_types" { "Event types" }
            input #event_types type="text" name="event_types" value=(sent.event_types)
                placeholder="order.paid, invoice.*" aria-describedby="event_types_help";
            p #event_types_help .muted { "Separated by commas or spaces; " code { "prefix.*" } " takes a family. Empty: every type." }
            label for="signatures" { "Signature scheme" }
            select #signatures name="signatures" {
                option value="v1" selected[sent.signatures != "v1a" && sent.signatures != "both"] { "v1: HMAC-SHA256, a shared secret" }
                option value="v1a" selected[sent.signatures == "v1a"] { "v1a: ed25519, you hold only the public key" }
                option value="both" selected[sent.signatures == "both"] { "both, side by side" }
            }
            fieldset {
                legend { "Into your RabbitMQ (an amqp:// or amqps:// URL only)" }
                label for="exchange" { "Exchange" }
                input #exchange type="text" name="exchange" value=(sent.exchange) placeholder="webhooks"
                    aria-describedby="exchange_help";
                p #exchange_help .muted { "Empty: the broker's default exchange, the routing key naming a queue." }
                label for="routing_key" { "Routing key" }
                input #routing_key type="text" name="routing_key" value=(sent.routing_key)
                    aria-describedby="routing_key_help";
                p #routing_key_help .muted { "Empty: each event's type, such as " code { "order.paid" } "." }
            }
            fieldset {
                legend { "Sign-in (optional)" }
                p.muted { "Sent as " code { "Authorization: Basic" } " to an HTTP endpoint; the broker's user for a RabbitMQ. The password is kept encrypted and never shown." }
                label for="username" { "Username" }
                input #username type="text" name="username" autocomplete="off" value=(sent.username);
                label for="password" { "Password" }
                input #password type="password" name="password" autocomplete="new-password";
            }
            p.actions { button type="submit" { "Create the endpoint" } }
        }
    }
}

/// `GET /portal/endpoints/new`: the create form.
pub async fn new_page(Extension(visitor): Extension<Visitor>) -> Response {
    let body = html! {
        @if visitor.read_only {
            p.flash.error { "This portal session is read-only." }
        } @else {
            (new_form(&visitor, &NewEndpoint::default()))
        }
    };
    layout(Site::Portal, Some(&visitor), "Add an endpoint", body).into_response()
}

/// `POST /portal/endpoints`: creates it; the answer shows its secret (or public key) this once,
/// in this answer only: never in a URL or a redirect. Refused: the form again, with why.
pub async fn create(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    form: Form<NewEndpoint>,
) -> Result<Response, PageError> {
    let Form { visitor, value } = form;
    let tenant = visitor.tenant.clone().unwrap_or_default();
    quota::take(&state.api, &tenant, Spend::Write)
        .map_err(|e| PageError::from_api(Site::Portal, e))?;
    let signatures: Vec<&str> = match value.signatures.as_str() {
        "v1a" => vec!["v1a"],
        "both" => vec!["v1", "v1a"],
        _ => vec!["v1"],
    };
    let mut request = json!({
        "url": value.url.trim(),
        "description": value.description,
        "signatures": signatures,
    });
    if let Some(types) = event_types_of(&value.event_types) {
        request["event_types"] = json!(types);
    }
    // Sent for an HTTP URL too when filled, so the API says why it does not apply.
    if value.is_amqp() || filled(&value.exchange).is_some() || filled(&value.routing_key).is_some()
    {
        let mut target = json!({ "exchange": value.exchange.trim() });
        if let Some(key) = filled(&value.routing_key) {
            target["routing_key"] = json!(key);
        }
        request["amqp"] = target;
    }
    if let Some(username) = filled(&value.username) {
        request["basic_auth"] = json!({ "username": username, "password": value.password });
    }
    let created = match crate::api::subscriptions::create(
        State(state.api.clone()),
        Extension(scope),
        HeaderMap::new(),
        call::body(&request),
    )
    .await
    {
        Ok(response) => call::read::<CreatedSubscription>(response)
            .await
            .map_err(|e| PageError::from_api(Site::Portal, e))?,
        Err(refused) => {
            let problem = PageError::from_api(Site::Portal, refused);
            if problem.status.is_server_error() || problem.status == StatusCode::TOO_MANY_REQUESTS {
                return Err(problem);
            }
            let body = html! {
                p.flash.error role="alert" { (problem.message) }
                (new_form(&visitor, &value))
            };
            let page = layout(Site::Portal, Some(&visitor), "Add an endpoint", body);
            return Ok((problem.status, page).into_response());
        }
    };
    let sub = &created.subscription;
    let body = html! {
        p.flash role="status" { "Endpoint created." }
        (shown_once(created.secret.as_deref(), created.public_key.as_deref()))
        p.actions { a href=(format!("/portal/endpoints/{}", sub.id)) { "Go to the endpoint" } }
    };
    Ok(layout(Site::Portal, Some(&visitor), "Endpoint created", body).into_response())
}

/// A new secret and public key, shown on the answer that made them and never again.
pub fn shown_once(secret: Option<&str>, public_key: Option<&str>) -> Markup {
    html! {
        @if let Some(secret) = secret {
            div.card {
                h2 { "Signing secret (v1)" }
                p { strong { "Copy it now: it is not shown again." } " Verify deliveries' " code { "webhook-signature" } " with it." }
                code.secret { (secret) }
            }
        }
        @if let Some(key) = public_key {
            div.card {
                h2 { "Public key (v1a)" }
                p { "Verify deliveries' ed25519 signatures with it; it stays listed on the endpoint's page." }
                code.secret { (key) }
            }
        }
    }
}
