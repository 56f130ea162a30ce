//! One endpoint: its page (settings, health, latest attempts, the actions' forms) and its edit.

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde_json::json;

use crate::api::auth::Scope;
use crate::api::model::SubscriptionView;
use crate::api::quota::{self, Spend};
use crate::history::trace::Attempt;

use super::attempts;
use super::endpoints::{event_types_of, filled};
use crate::web::WebState;
use crate::web::page::{Flash, PageError, Site, done, layout};
use crate::web::session::{Form, Visitor};

/// How many of the newest attempts the health counts failures in a row over.
const HEALTH_WINDOW: u32 = 50;

/// Endpoint `id` as the visitor's scope sees it: another tenant's answers 404.
pub async fn read(state: &WebState, scope: Scope, id: &str) -> Result<SubscriptionView, PageError> {
    crate::api::subscriptions::read(
        State(state.api.clone()),
        Extension(scope),
        Path(id.to_owned()),
    )
    .await
    .map(|axum::Json(view)| view)
    .map_err(|e| PageError::from_api(Site::Portal, e))
}

pub fn event_types_text(view: &SubscriptionView) -> String {
    view.event_types
        .as_ref()
        .map(|t| t.join(", "))
        .unwrap_or_default()
}

/// What history says of an endpoint's health, from its newest attempts.
struct Health {
    last: Option<Attempt>,
    last_success: Option<Attempt>,
    /// Attempts not delivered since the last delivered one, among the newest [`HEALTH_WINDOW`].
    failures_in_a_row: usize,
    /// All of the newest [`HEALTH_WINDOW`] failed: there may be more.
    at_least: bool,
}

async fn health(state: &WebState, scope: &Scope, id: &str) -> Result<Health, String> {
    let said = |e: crate::api::problem::ApiError| {
        let p = e.to_problem();
        p.detail.unwrap_or(p.title)
    };
    let newest = attempts::newest(state, scope.clone(), id, None, None, None, HEALTH_WINDOW)
        .await
        .map_err(said)?;
    let success = attempts::newest(
        state,
        scope.clone(),
        id,
        Some("delivered".into()),
        None,
        None,
        1,
    )
    .await
    .map_err(said)?;
    let failures = newest
        .data
        .iter()
        .take_while(|a| a.outcome != "delivered")
        .count();
    Ok(Health {
        last: newest.data.first().cloned(),
        last_success: success.data.into_iter().next(),
        failures_in_a_row: failures,
        at_least: failures == newest.data.len() && newest.next_cursor.is_some(),
    })
}

fn health_card(
    view: &SubscriptionView,
    health: &Result<Health, String>,
    workers: Markup,
) -> Markup {
    html! {
        div.card {
            h2 { "Health" }
            h3 { "What the store says" }
            p {
                @if !view.enabled { span.badge.bad { "disabled" } }
                @else if view.paused { span.badge.warn { "paused" } " deliveries wait, parked, until it is resumed" }
                @else { span.badge.good { "active" } }
                @if let Some(reason) = &view.disabled_reason { " " span.bad { (reason) } }
            }
            h3 { "What the history database says" }
            p.muted { "From the attempts " code { "hookrelay history" } " has recorded; it follows the workers by seconds." }
            @match health {
                Err(why) => p.flash.error { (why) },
                Ok(h) => dl.health {
                    dt { "Last attempt" }
                    dd { @match &h.last {
                        Some(a) => { code { (a.at) } " " (a.outcome) }
                        None => span.muted { "none recorded" },
                    } }
                    dt { "Last success" }
                    dd { @match &h.last_success {
                        Some(a) => code { (a.at) },
                        None => span.muted { "none recorded" },
                    } }
                    dt { "Failures in a row" }
                    dd.bad[h.failures_in_a_row > 0] {
                        (h.failures_in_a_row) @if h.at_least { " or more" }
                    }
                },
            }
            (workers)
        }
    }
}

/// What the workers announced of the endpoint (quarantine) and what the broker holds for it
/// (the paused backlog), each where this API process can know it.
async fn workers_say(state: &WebState, view: &SubscriptionView) -> Markup {
    let (quarantined, partial) = match reqwest::Url::parse(&view.url) {
        Ok(url) => state
            .quarantines
            .of(&crate::delivery::endpoint::EndpointKey::of(&url).label()),
        Err(_) => (None, None),
    };
    let backlog = match state.api.broker() {
        Some(setup) if view.paused => match &setup.management {
            Some(api) => Some(
                api.queue(&setup.ladder.paused_queue(&view.id))
                    .await
                    .map(|q| q.map_or(0, |q| q.messages_ready))
                    .map_err(|e| e.to_string()),
            ),
            None => None,
        },
        _ => None,
    };
    html! {
        h3 { "What the workers and the broker say" }
        dl.health {
            dt { "Quarantine" }
            dd {
                @match &quarantined {
                    Some(q) => {
                        span.badge.bad { "quarantined" } " since " code { (q.at) }
                        @if let Some(why) = &q.detail { ": " (why) }
                    },
                    None => "not quarantined",
                }
                @if let Some(why) = &partial { " " span.muted { "(may be incomplete: " (why) ")" } }
            }
            @if view.paused {
                dt { "Waiting while paused" }
                dd { @match &backlog {
                    Some(Ok(n)) => { (n) " event(s), delivered in order on resume" },
                    Some(Err(why)) => span.muted { "cannot read the broker: " (why) },
                    None => span.muted { "unknown here (no management API configured)" },
                } }
            }
        }
        p.muted {
            "A breaker open for less than the quarantine threshold, and a recovery ramp, live in \
             the workers' memory: they show here as failures in a row."
        }
    }
}

fn actions(visitor: &Visitor, view: &SubscriptionView) -> Markup {
    let base = format!("/portal/endpoints/{}", view.id);
    html! {
        div.card {
            h2 { "Actions" }
            div.actions {
                a href=(format!("{base}/edit")) { "Edit" }
                @if view.paused {
                    form.inline method="post" action=(format!("{base}/resume")) {
                        (visitor.csrf_field()) button type="submit" { "Resume" }
                    }
                } @else {
                    form.inline method="post" action=(format!("{base}/pause")) {
                        (visitor.csrf_field()) button.secondary type="submit" { "Pause" }
                    }
                }
                a href=(format!("{base}/rotate")) { "Rotate the secret" }
                a href=(format!("{base}/delete")) { "Delete" }
            }
            form method="post" action=(format!("{base}/test")) {
                (visitor.csrf_field())
                label for="test_type" { "Send a test event" }
                input #test_type type="text" name="event_type" placeholder="hookrelay.test";
                p.actions { button type="submit" { "Send a test event" } }
            }
            form method="post" action=(format!("{base}/replay")) {
                (visitor.csrf_field())
                h3 { "Replay a window of events" }
                div.filters {
                    div { label for="replay_from" { "From" }
                          input #replay_from type="text" name="from" value="1h" required; }
                    div { label for="replay_to" { "To (empty: now)" }
                          input #replay_to type="text" name="to"; }
                    div { label { input type="checkbox" name="only_undelivered" value="true"; " only those not delivered" } }
                }
                p.muted { "A time as 2026-12-07T01:00:00Z, or a duration ago such as 1h. Events keep their ids: receivers deduplicate." }
                p.actions { button type="submit" { "Replay" } }
            }
        }
    }
}

/// `GET /portal/endpoints/{id}`: the endpoint, its health and its latest attempts.
pub async fn show(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    Query(flash): Query<Flash>,
) -> Result<Response, PageError> {
    let view = read(&state, scope.clone(), &id).await?;
    let health = health(&state, &scope, &id).await;
    let workers = workers_say(&state, &view).await;
    let latest = attempts::latest_fragment(&state, scope, &id)
        .await
        .map_err(|e| PageError::from_api(Site::Portal, e))?;
    let body = html! {
        (flash.render())
        div.card {
            h2 { "Settings" }
            dl {
                dt { "URL" } dd.mono { (view.url) }
                @if let Some(amqp) = &view.request.amqp {
                    dt { "Publishes to" }
                    dd {
                        "exchange " code { @if amqp.exchange.is_empty() { "(default)" } @else { (amqp.exchange) } }
                        ", routing key "
                        @match &amqp.routing_key { Some(k) => code { (k) }, None => span.muted { "the event type" } }
                        @if let Some(b) = &view.request.basic_auth { ", as " code { (b.username) } }
                    }
                }
                dt { "Description" } dd { @if view.description.is_empty() { span.muted { "none" } } @else { (view.description) } }
                dt { "Event types" }
                dd { @match &view.event_types {
                    Some(types) => { @for t in types { code { (t) } " " } }
                    None => span.muted { "all" },
                } }
                dt { "Rate" } dd { (view.rate.as_deref().unwrap_or("the workers' default")) }
                dt { "Max concurrent" } dd { @match view.max_concurrent { Some(n) => (n), None => "the workers' default" } }
                dt { "Signing secrets" }
                dd { ul { @for s in &view.secrets {
                    li {
                        @if s.public_key.is_some() { "v1a key" } @else { "v1 secret" }
                        ", made " code { (s.created_at) }
                        @if let Some(until) = &s.expires_at { ", signs until " code { (until) } }
                        @if let Some(key) = &s.public_key { br; "public key " code { (key) } }
                    }
                } } }
            }
        }
        (super::filter::card(&visitor, &view, None))
        (health_card(&view, &health, workers))
        @if !visitor.read_only { (actions(&visitor, &view)) }
        h2 { "Latest attempts" }
        p.muted { "Newest first; refreshes itself every 2 seconds (reload the page without scripts). "
            a href=(format!("/portal/attempts?endpoint={}", view.id)) { "All attempts, filtered" } }
        div #latest hx-get=(format!("/portal/endpoints/{}/latest", view.id)) hx-trigger="every 2s" hx-swap="innerHTML" {
            (latest)
        }
    };
    let title = format!("Endpoint {}", view.id);
    Ok(layout(Site::Portal, Some(&visitor), &title, body).into_response())
}

/// The edit form's fields; empty rate or max concurrent: the workers' defaults.
#[derive(Debug, Default, serde::Deserialize)]
pub struct EditEndpoint {
    #[serde(default)]
    url: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    event_types: String,
    #[serde(default)]
    rate: String,
    #[serde(default)]
    max_concurrent: String,
    /// JSON; empty: none.
    #[serde(default)]
    filter: String,
}

fn edit_form(visitor: &Visitor, id: &str, sent: &EditEndpoint) -> Markup {
    html! {
        form method="post" action=(format!("/portal/endpoints/{id}/edit")) {
            (visitor.csrf_field())
            label for="url" { "URL" }
            input #url type="url" name="url" required value=(sent.url);
            label for="description" { "Description" }
            input #description type="text" name="description" value=(sent.description);
            label for="event_types" { "Event types" }
            input #event_types type="text" name="event_types" value=(sent.event_types) placeholder="empty: every type";
            label for="rate" { "Rate" }
            input #rate type="text" name="rate" value=(sent.rate) placeholder="50/s; empty: the workers' default";
            label for="max_concurrent" { "Max concurrent" }
            input #max_concurrent type="number" min="1" name="max_concurrent" value=(sent.max_concurrent) placeholder="empty: the workers' default";
            label for="filter" { "Payload filter (JSON; empty: every event)" }
            textarea #filter name="filter" placeholder=r#"{"data.amount": {"$gt": 100}}"# { (sent.filter) }
            p.muted { "Paths into the payload with $eq, $neq, $in, $nin, $gt, $gte, $lt, $lte, $exists, combined with $and, $or, $not." }
            p.actions { button type="submit" { "Save" } a href=(format!("/portal/endpoints/{id}")) { "Cancel" } }
        }
    }
}

/// `GET /portal/endpoints/{id}/edit`.
pub async fn edit_page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let view = read(&state, scope, &id).await?;
    let sent = EditEndpoint {
        url: view.url.clone(),
        description: view.description.clone(),
        event_types: event_types_text(&view),
        rate: view.rate.clone().unwrap_or_default(),
        max_concurrent: view
            .max_concurrent
            .map(|n| n.to_string())
            .unwrap_or_default(),
        filter: view
            .filter
            .as_ref()
            .and_then(|f| serde_json::to_string_pretty(f).ok())
            .unwrap_or_default(),
    };
    let body = html! {
        @if visitor.read_only { p.flash.error { "This portal session is read-only." } }
        @else { (edit_form(&visitor, &id, &sent)) }
    };
    Ok(layout(Site::Portal, Some(&visitor), &format!("Edit {id}"), body).into_response())
}

/// `POST /portal/endpoints/{id}/edit`: saves; refused, the form again with why.
pub async fn update(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<EditEndpoint>,
) -> Result<Response, PageError> {
    let Form { visitor, value } = form;
    quota::take(
        &state.api,
        visitor.tenant.as_deref().unwrap_or_default(),
        Spend::Write,
    )
    .map_err(|e| PageError::from_api(Site::Portal, e))?;
    let max_concurrent = match filled(&value.max_concurrent).map(str::parse::<u32>) {
        None => Ok(None),
        Some(Ok(n)) => Ok(Some(n)),
        Some(Err(_)) => Err("max concurrent: a whole number, 1 or more".to_owned()),
    };
    let refused = |status: StatusCode, message: String, value: &EditEndpoint| {
        let body = html! {
            p.flash.error role="alert" { (message) }
            (edit_form(&visitor, &id, value))
        };
        (
            status,
            layout(Site::Portal, Some(&visitor), &format!("Edit {id}"), body),
        )
            .into_response()
    };
    let max_concurrent = match max_concurrent {
        Ok(n) => n,
        Err(why) => return Ok(refused(StatusCode::UNPROCESSABLE_ENTITY, why, &value)),
    };
    let filter = match filled(&value.filter).map(serde_json::from_str::<serde_json::Value>) {
        None => serde_json::Value::Null,
        Some(Ok(f)) => f,
        Some(Err(e)) => {
            let why = format!("payload filter: not JSON: {e}");
            return Ok(refused(StatusCode::UNPROCESSABLE_ENTITY, why, &value));
        }
    };
    let change = json!({
        "url": value.url.trim(),
        "description": value.description,
        "event_types": event_types_of(&value.event_types),
        "rate": filled(&value.rate),
        "max_concurrent": max_concurrent,
        "filter": filter,
    });
    match crate::api::subscriptions::update(
        State(state.api.clone()),
        Extension(scope),
        Path(id.clone()),
        crate::web::call::body(&change),
    )
    .await
    {
        Ok(_) => Ok(done(&format!("/portal/endpoints/{id}"), "Saved.")),
        Err(e) => {
            let problem = PageError::from_api(Site::Portal, e);
            if problem.status == StatusCode::UNPROCESSABLE_ENTITY {
                Ok(refused(problem.status, problem.message, &value))
            } else {
                Err(problem)
            }
        }
    }
}
