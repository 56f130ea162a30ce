//! An endpoint's attempts from the history database, newest first, filtered by outcome and
//! time; the table the endpoint's page shows (and refreshes) of its latest ones.

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::api::auth::Scope;
use crate::api::history::{AttemptPage, AttemptsQuery};
use crate::api::model::ListQuery;
use crate::api::problem::ApiError;
use crate::history::trace::Attempt;

use crate::web::WebState;
use crate::web::page::{PageError, Site, layout};
use crate::web::session::Visitor;

/// Outcomes offered in the filter (the API takes any; these are the common ones).
const OUTCOMES: [&str; 11] = [
    "delivered",
    "retried",
    "rejected",
    "exhausted",
    "invalid",
    "gone",
    "egress_denied",
    "horizon_expired",
    "cancelled",
    "parked",
    "schema_invalid",
];

/// How many of the latest attempts an endpoint's page shows.
pub const LATEST: u32 = 10;

/// A page of `id`'s attempts, newest first, as the API answers the visitor's scope (404 for
/// another tenant's endpoint).
pub async fn newest(
    state: &WebState,
    scope: Scope,
    id: &str,
    outcome: Option<String>,
    since: Option<String>,
    cursor: Option<String>,
    limit: u32,
) -> Result<AttemptPage, ApiError> {
    let query = AttemptsQuery {
        since,
        outcome,
        cursor,
        limit: Some(limit),
        order: Some("newest".into()),
    };
    crate::api::history::attempts(
        State(state.api.clone()),
        Extension(scope),
        Path(id.to_owned()),
        Ok(Query(query)),
    )
    .await
    .map(|axum::Json(page)| page)
}

/// Attempts as a table, each linking to its event's story.
pub fn table(attempts: &[Attempt]) -> Markup {
    html! {
        @if attempts.is_empty() {
            p.muted { "No attempts recorded." }
        } @else {
            table {
                thead { tr {
                    th { "At (UTC)" } th { "Event" } th.num { "Attempt" } th { "Outcome" }
                    th.num { "Status" } th.num { "Latency" } th { "Tier" } th { "Error" }
                } }
                tbody {
                    @for a in attempts {
                        tr {
                            td.mono { (a.at) }
                            td {
                                @if let Some(e) = a.event.as_ref().or(a.envelope.as_ref()) {
                                    a href=(format!("/portal/events/{e}")) { code { (e) } }
                                }
                            }
                            td.num { (a.attempt) }
                            td {
                                span.badge.good[a.outcome == "delivered"].bad[a.outcome != "delivered" && a.outcome != "retried"].warn[a.outcome == "retried"] { (a.outcome) }
                            }
                            td.num { @if let Some(s) = a.status { (s) } @else { span.muted { "-" } } }
                            td.num { @if let Some(ms) = a.latency_ms { (ms) " ms" } @else { span.muted { "-" } } }
                            td { @if let Some(t) = &a.tier { code { (t) } } }
                            td { @if let Some(e) = &a.error { (e) } }
                        }
                    }
                }
            }
        }
    }
}

/// The latest attempts of `id`, or why they cannot be read, as a fragment.
pub async fn latest_fragment(state: &WebState, scope: Scope, id: &str) -> Result<Markup, ApiError> {
    match newest(state, scope, id, None, None, None, LATEST).await {
        Ok(page) => Ok(table(&page.data)),
        // No history database, or it failed: said in place, the rest of the page stands.
        Err(ApiError::NotFound) => Err(ApiError::NotFound),
        Err(e) => {
            let problem = e.to_problem();
            Ok(html! { p.flash.error { (problem.detail.unwrap_or(problem.title)) } })
        }
    }
}

/// `GET /portal/endpoints/{id}/latest`: the latest attempts, for the endpoint page to poll.
pub async fn latest(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    latest_fragment(&state, scope, &id)
        .await
        .map(IntoResponse::into_response)
        .map_err(|e| PageError::from_api(Site::Portal, e))
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct AttemptsParams {
    endpoint: Option<String>,
    outcome: Option<String>,
    since: Option<String>,
    cursor: Option<String>,
}

/// `GET /portal/attempts`: an endpoint's attempts, newest first, filtered; with no endpoint
/// named, a choice of them.
pub async fn page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Query(params): Query<AttemptsParams>,
) -> Result<Response, PageError> {
    let to_page = |e| PageError::from_api(Site::Portal, e);
    let Some(endpoint) = params.endpoint.clone().filter(|e| !e.is_empty()) else {
        let query = ListQuery {
            limit: Some(crate::api::subscriptions::MAX_PAGE),
            ..Default::default()
        };
        let axum::Json(subs) = crate::api::subscriptions::list(
            State(state.api.clone()),
            Extension(scope),
            Ok(Query(query)),
        )
        .await
        .map_err(to_page)?;
        let body = html! {
            @if subs.data.is_empty() {
                p.muted { "No endpoints yet." }
            } @else {
                form.filters method="get" action="/portal/attempts" {
                    div {
                        label for="endpoint" { "Endpoint" }
                        select #endpoint name="endpoint" {
                            @for s in &subs.data { option value=(s.id) { (s.id) " · " (s.url) } }
                        }
                    }
                    button type="submit" { "Show its attempts" }
                }
            }
        };
        return Ok(layout(Site::Portal, Some(&visitor), "Attempts", body).into_response());
    };
    let blank = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    let (outcome, since) = (blank(&params.outcome), blank(&params.since));
    let attempts = newest(
        &state,
        scope,
        &endpoint,
        outcome.clone(),
        since.clone(),
        blank(&params.cursor),
        50,
    )
    .await
    .map_err(to_page)?;
    let next = attempts.next_cursor.as_ref().map(|cursor| {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("endpoint", &endpoint)
            .append_pair("outcome", outcome.as_deref().unwrap_or(""))
            .append_pair("since", since.as_deref().unwrap_or(""))
            .append_pair("cursor", cursor)
            .finish();
        format!("/portal/attempts?{query}")
    });
    let body = html! {
        p { "Endpoint " a href=(format!("/portal/endpoints/{endpoint}")) { code { (endpoint) } } ". "
            span.muted { "Newest first, as the history database has recorded them (it follows the workers by seconds)." } }
        form.filters method="get" action="/portal/attempts" {
            input type="hidden" name="endpoint" value=(endpoint);
            div {
                label for="outcome" { "Outcome" }
                input #outcome type="text" name="outcome" list="outcomes" value=(outcome.as_deref().unwrap_or("")) placeholder="any";
                datalist #outcomes { @for o in OUTCOMES { option value=(o) {} } }
            }
            div {
                label for="since" { "Since" }
                input #since type="text" name="since" value=(since.as_deref().unwrap_or("")) placeholder="1h, 7d or 2026-12-07T00:00:00Z";
            }
            button type="submit" { "Filter" }
        }
        (table(&attempts.data))
        @if let Some(next) = next { p.pager { a href=(next) { "Older attempts" } } }
    };
    Ok(layout(Site::Portal, Some(&visitor), "Attempts", body).into_response())
}
