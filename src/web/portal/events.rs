//! One event's story from the history database, and a replay job's progress (polled while it
//! runs).

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use axum::http::StatusCode;
use serde_json::json;

use crate::api::auth::Scope;
use crate::api::quota::Spend;
use crate::api::replays::ReplayJob;

use super::actions::{spend, start_replay, to_page};
use super::attempts::table;
use crate::web::WebState;
use crate::web::page::{Flash, PageError, Site, layout};
use crate::web::session::{Form, Visitor};
use crate::web::signin::Nothing;

/// `GET /portal/events/{id}`: what history holds of an event (or a delivery): its
/// acceptances, every attempt, each delivery's latest outcome.
pub async fn story(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let axum::Json(story) =
        crate::api::history::event(State(state.api.clone()), Extension(scope), Path(id))
            .await
            .map_err(|e| PageError::from_api(Site::Portal, e))?;
    let body = html! {
        p.muted { "Oldest first, as the history database has recorded it." }
        h2 { "Accepted" }
        @if story.accepted.is_empty() {
            p.muted { "Its acceptance is not recorded (the archive's reading may be behind)." }
        } @else {
            table {
                thead { tr { th { "At (UTC)" } th { "Id" } th { "Type" } th { "Endpoint" } th { "How" } } }
                tbody { @for a in &story.accepted { tr {
                    td.mono { (a.at) }
                    td { code { (a.id) } }
                    td { @if let Some(t) = &a.event_type { code { (t) } } }
                    td { @if let Some(s) = &a.subscription { a href=(format!("/portal/endpoints/{s}")) { code { (s) } } } }
                    td {
                        @if let Some(r) = &a.replay { "replayed by " code { (r) } }
                        @else if a.redrives > 0 { "redriven (" (a.redrives) ")" }
                        @else { "published" }
                    }
                } } }
            }
        }
        h2 { "Attempts" }
        (table(&story.attempts))
        @if let (Some(first), false) = (story.accepted.first(), visitor.read_only) {
            form method="post" action=(format!("/portal/events/{}/replay", first.id)) {
                (visitor.csrf_field())
                button.secondary type="submit" { "Replay this event" }
                span.muted { " publishes it again with its original id: its endpoints receive it once more." }
            }
        }
        h2 { "Outcome" }
        @if story.outcomes.is_empty() {
            p.muted { "No delivery recorded yet." }
        } @else {
            ul { @for o in &story.outcomes { li { code { (o.envelope) } ": " strong { (o.outcome) } } } }
        }
    };
    let title = format!("Event {}", story.id);
    Ok(layout(Site::Portal, Some(&visitor), &title, body).into_response())
}

/// How far around an event's acceptance its one-event replay reads the archive: the archive's
/// timestamps are the broker's, which may differ a little from history's.
const AROUND: std::time::Duration = std::time::Duration::from_secs(60);

/// `POST /portal/events/{id}/replay`: that one event published again, by a replay reading the
/// archive around when history says it was accepted.
pub async fn replay_event(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<Nothing>,
) -> Result<Response, PageError> {
    spend(&state, &form.visitor, Spend::Write)?;
    let axum::Json(story) = crate::api::history::event(
        State(state.api.clone()),
        Extension(scope.clone()),
        Path(id.clone()),
    )
    .await
    .map_err(to_page)?;
    let at = story
        .accepted
        .iter()
        .find(|a| a.id == id)
        .and_then(|a| humantime::parse_rfc3339_weak(a.at.trim_end_matches('Z')).ok())
        .ok_or_else(|| {
            PageError::new(
                Site::Portal,
                StatusCode::CONFLICT,
                "History has not recorded when this event was accepted, so it cannot be replayed \
                 alone yet; try again in a moment, or replay a window from its endpoint's page.",
            )
        })?;
    let request = json!({
        "from": humantime::format_rfc3339_seconds(at - AROUND).to_string(),
        "to": humantime::format_rfc3339_seconds(at + AROUND).to_string(),
        "event": id,
    });
    start_replay(&state, scope, &request, "Replay of the event started.").await
}

/// A replay job's figures; while it runs, the element asks for itself again every 2 seconds
/// (and stops once the answer no longer carries the trigger).
fn progress(job: &ReplayJob) -> Markup {
    let running = job.state == "running";
    let poll = running.then(|| format!("/portal/replays/{}/progress", job.id));
    html! {
        div #progress hx-get=[poll.as_deref()] hx-trigger=[running.then_some("every 2s")] hx-swap=[running.then_some("outerHTML")] {
            p { "State: " strong.warn[running].good[job.state == "finished"].bad[job.state == "failed"] { (job.state) } }
            @if let Some(e) = &job.error { p.flash.error { (e) } }
            table {
                tbody {
                    tr { th { "Events read in the window" } td.num { (job.read) } }
                    tr { th { "Matched" } td.num { (job.matched) } }
                    tr { th { "Delivered already (skipped)" } td.num { (job.delivered_already) } }
                    tr { th { "Published again" } td.num { (job.published) } }
                }
            }
            @if let Some(at) = &job.finished_at { p.muted { "Ended " code { (at) } } }
        }
    }
}

async fn job(state: &WebState, scope: Scope, id: String) -> Result<ReplayJob, PageError> {
    crate::api::replays::read(State(state.api.clone()), Extension(scope), Path(id))
        .await
        .map(|axum::Json(job)| job)
        .map_err(|e| PageError::from_api(Site::Portal, e))
}

/// `GET /portal/replays/{id}`: a replay this tenant started, and how far it is.
pub async fn replay(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    Query(flash): Query<Flash>,
) -> Result<Response, PageError> {
    let job = job(&state, scope, id).await?;
    let body = html! {
        (flash.render())
        p {
            "Events accepted from " code { (job.from) } " to " code { (job.to.as_deref().unwrap_or("when it started")) }
            @if let Some(e) = &job.event { " with the id " a href=(format!("/portal/events/{e}")) { code { (e) } } }
            @if let Some(s) = &job.subscription { " for " a href=(format!("/portal/endpoints/{s}")) { code { (s) } } }
            @if job.only_undelivered { ", only those not delivered" }
            ", published again at " (job.rate.as_deref().unwrap_or("the default pace")) " with their original ids."
        }
        (progress(&job))
        p.muted { "Started " code { (job.started_at) } ". Without scripts, reload the page to see it move." }
    };
    let title = format!("Replay {}", job.id);
    Ok(layout(Site::Portal, Some(&visitor), &title, body).into_response())
}

/// `GET /portal/replays/{id}/progress`: the figures alone, for the page to poll.
pub async fn replay_progress(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    Ok(progress(&job(&state, scope, id).await?).into_response())
}
