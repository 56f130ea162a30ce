//! The overview: the workers and the ladder's queues as the management API reports them
//! (what `hookrelay status` prints), refreshed every 2 s by htmx, and the tiers with their hold
//! and release buttons (what `hookrelay tier` does).

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::contract::ladder::{Ladder, QueueRole, TierId};
use crate::ops::status::QueueStatus;
use crate::units::fmt_duration;
use crate::web::WebState;
use crate::web::page::{Flash, PageError, Site, done, layout};
use crate::web::session::{Form, Visitor};

use super::broker;

/// How long a hold waits to see the broker apply it, as `hookrelay tier hold` does.
const HOLD_WAIT: Duration = Duration::from_secs(10);

/// `GET /ui/`: the ladder overview.
pub async fn overview(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Query(flash): Query<Flash>,
) -> Response {
    let live = live(&state).await;
    let tiers = tiers(&state, &visitor).await;
    let trouble = super::trouble::section(&state).await;
    let body = html! {
        (flash.render())
        (live)
        (tiers)
        (trouble)
    };
    layout(Site::Console, Some(&visitor), "Ladder", body).into_response()
}

/// `GET /ui/fragments/ladder`: the live part of the overview, alone.
pub async fn fragment(State(state): State<WebState>) -> Response {
    live(&state).await.into_response()
}

fn age(seconds: Option<f64>) -> String {
    seconds.map_or_else(
        || "-".to_owned(),
        |s| fmt_duration(Duration::from_secs(s as u64)),
    )
}

/// The rows of the ladder now, or why they cannot be read.
async fn rows(state: &WebState) -> Result<(Ladder, Vec<QueueStatus>), String> {
    let (setup, api) = broker(state).map_err(|e| e.message)?;
    let rows = crate::ops::status::collect(api, &setup.ladder, None)
        .await
        .map_err(|e| e.to_string())?;
    Ok((setup.ladder.clone(), rows))
}

/// The workers and the queue table, in a region htmx replaces every 2 s.
async fn live(state: &WebState) -> Markup {
    let read = rows(state).await;
    html! {
        div #ladder hx-get="/ui/fragments/ladder" hx-trigger="every 2s" hx-swap="outerHTML" {
            @match &read {
                Err(why) => p.flash.error role="alert" { "Cannot read the broker: " (why) },
                Ok((ladder, rows)) => {
                    (workers(ladder, rows))
                    (queues(ladder, rows))
                }
            }
        }
    }
}

/// What the broker sees of the workers: each worker consumes every lane once, so the fleet
/// lane's consumers are the worker count, and the lanes' unacknowledged messages are the
/// deliveries in flight.
fn workers(ladder: &Ladder, rows: &[QueueStatus]) -> Markup {
    let fleet = ladder.fleet_lane();
    let count = rows
        .iter()
        .find(|r| r.queue == fleet && r.exists)
        .map(|r| r.consumers);
    let lanes: Vec<&QueueStatus> = rows.iter().filter(|r| r.role == "lane").collect();
    let in_flight: i64 = lanes.iter().map(|r| r.unacked).sum();
    let unserved: Vec<&str> = lanes
        .iter()
        .filter(|r| r.exists && r.consumers == 0)
        .map(|r| r.queue.as_str())
        .collect();
    html! {
        h2 { "Workers" }
        div.grid {
            div.card {
                div.muted { "Workers (consumers of " code { (fleet) } ")" }
                div.figure data-figure="workers" { (count.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
            }
            div.card {
                div.muted { "In flight (unacknowledged on the lanes)" }
                div.figure data-figure="in-flight" { (in_flight) }
            }
            div.card {
                div.muted { "Ready (every lane has a consumer)" }
                @if lanes.is_empty() || !unserved.is_empty() {
                    div.figure.bad data-figure="ready" { "no" }
                    @if !unserved.is_empty() {
                        div.muted { "Without a consumer: " @for q in &unserved { code { (q) } " " } }
                    }
                } @else {
                    div.figure.good data-figure="ready" { "yes" }
                }
            }
        }
    }
}

fn role_name(ladder: &Ladder, row: &QueueStatus) -> &'static str {
    match ladder.role_of(&row.queue) {
        Some(QueueRole::Tier(i)) if ladder.is_deferral(i) => "deferral",
        _ => row.role,
    }
}

/// How far past its delay a tier's head is (its promotion is late by that much), where the
/// broker knows the head's age.
fn overdue(ladder: &Ladder, row: &QueueStatus) -> Option<f64> {
    let Some(QueueRole::Tier(i)) = ladder.role_of(&row.queue) else {
        return None;
    };
    let age = row.oldest_age_s?;
    Some((age - ladder.tier(i).delay.as_secs_f64()).max(0.0))
}

fn queues(ladder: &Ladder, rows: &[QueueStatus]) -> Markup {
    html! {
        h2 { "Queues of ladder " code { (ladder.prefix) } }
        table.queues {
            thead { tr {
                th { "Queue" } th { "Role" } th { "Shard" } th.num { "Ready" } th.num { "Unacked" }
                th.num { "Consumers" } th.num { "In/s" } th.num { "Oldest" } th.num { "Promotion late by" }
                th { "TTL" } th { "State" }
            } }
            tbody {
                @for r in rows {
                    tr data-queue=(r.queue) {
                        td.mono { (r.queue) }
                        td { (role_name(ladder, r)) }
                        td { @if let Some(s) = r.shard { "s" (s) } @else { "-" } }
                        td.num data-depth { (r.ready) }
                        td.num { (r.unacked) }
                        td.num { (r.consumers) }
                        td.num { (format!("{:.1}", r.in_per_s)) }
                        td.num { (age(r.oldest_age_s)) }
                        td.num { (age(overdue(ladder, r))) }
                        td { (r.ttl.as_deref().unwrap_or("-")) }
                        td {
                            @if !r.exists { span.badge.bad { "missing" } " " }
                            @if r.held { span.badge.warn { "held" } " " }
                            span.muted { (r.next) }
                        }
                    }
                }
            }
        }
        p.muted {
            "From the management API. Oldest and promotion lateness are known only where the broker \
             reports a queue's head timestamp (classic queues); the workers' \
             hookrelay_promotion_lag_seconds metric covers the rest."
        }
    }
}

/// The tiers and deferral queues, each with the button that changes its state (outside the
/// refreshed region, so a focused button stays put).
async fn tiers(state: &WebState, visitor: &Visitor) -> Markup {
    let Ok((setup, api)) = broker(state) else {
        return html! {};
    };
    let ladder = &setup.ladder;
    let states = crate::ops::tier::status(api, ladder).await;
    html! {
        h2 { "Tiers" }
        @match states {
            Err(e) => p.flash.error role="alert" { "Cannot read the tiers: " (e) },
            Ok(states) => {
                table.tiers {
                    thead { tr { th { "Tier" } th { "Delay" } th.num { "Waiting" } th { "Held" } th.num { "Parked" } th { "Action" } } }
                    tbody {
                        @for s in &states {
                            tr data-tier=(s.tier) {
                                td.mono { (s.tier) }
                                td { (s.delay) }
                                td.num { (s.waiting.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
                                td data-held=(s.held) {
                                    @if s.held { span.badge.warn { "held" } } @else { "no" }
                                }
                                td.num { (s.parked.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
                                td {
                                    @let verb = if s.held { "release" } else { "hold" };
                                    form.inline method="post" action=(format!("/ui/tiers/{}/{verb}", s.tier)) {
                                        (visitor.csrf_field())
                                        @if s.held {
                                            button type="submit" { "Release " (s.tier) }
                                        } @else {
                                            button.secondary type="submit" { "Hold " (s.tier) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                p.muted {
                    "Hold stops promotion out of a tier: expired messages park, nothing is lost. \
                     Release returns what parked to the retry lanes, then resumes promotion."
                }
            }
        }
    }
}

/// Any form without fields of its own (the CSRF field is checked by [`Form`]).
#[derive(Debug, serde::Deserialize)]
pub struct NoFields {}

fn failed(what: &str, e: impl std::fmt::Display) -> PageError {
    PageError::new(
        Site::Console,
        StatusCode::BAD_GATEWAY,
        format!("{what}: {e}"),
    )
}

fn find_tier(ladder: &Ladder, name: &str) -> Result<TierId, PageError> {
    crate::ops::tier::find(ladder, name)
        .map_err(|e| PageError::new(Site::Console, StatusCode::NOT_FOUND, e.to_string()))
}

/// The API's publisher, and a channel on its connection for one tier operation (closed by the
/// caller when done).
async fn channel(
    state: &WebState,
) -> Result<
    (
        std::sync::Arc<crate::broker::publish::Publisher>,
        lapin::Channel,
    ),
    PageError,
> {
    let (publisher, _) = state
        .api
        .publisher()
        .await
        .map_err(|e| PageError::from_api(Site::Console, e))?;
    let conn = publisher
        .connection()
        .await
        .map_err(|e| failed("The broker", e))?;
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| failed("The broker", e))?;
    Ok((publisher, channel))
}

/// `POST /ui/tiers/{tier}/hold`: what `hookrelay tier hold` does, waiting to see it applied.
pub async fn hold(
    State(state): State<WebState>,
    Path(tier): Path<String>,
    _form: Form<NoFields>,
) -> Result<Response, PageError> {
    let (setup, api) = broker(&state)?;
    let ladder = &setup.ladder;
    let i = find_tier(ladder, &tier)?;
    let (_, channel) = channel(&state).await?;
    let held = crate::ops::tier::hold(api, &channel, ladder, i).await;
    let _ = channel.close(200, "done".into()).await;
    held.map_err(|e| failed("The hold failed", e))?;
    let applied = crate::ops::tier::wait_applied(api, ladder, i, true, HOLD_WAIT)
        .await
        .map_err(|e| failed("The hold was set, but", e))?;
    let name = &ladder.tier(i).name;
    let message = if applied {
        format!(
            "Held {name}: its expired messages park in {}.",
            ladder.held_queue(i)
        )
    } else {
        format!(
            "The hold of {name} is set but the broker has not applied it yet (another policy of \
             higher priority may match); look again in a moment."
        )
    };
    Ok(done("/ui/", &message))
}

/// `POST /ui/tiers/{tier}/release`: what `hookrelay tier release` does, in the request: the
/// parked messages go back to the retry lanes, then promotion resumes.
pub async fn release(
    State(state): State<WebState>,
    Path(tier): Path<String>,
    _form: Form<NoFields>,
) -> Result<Response, PageError> {
    let (setup, api) = broker(&state)?;
    let ladder = &setup.ladder;
    let i = find_tier(ladder, &tier)?;
    let (publisher, channel) = channel(&state).await?;
    let options = crate::ops::mover::MoveOptions::default();
    let released =
        crate::ops::tier::release(api, &channel, &publisher, ladder, i, &options, false).await;
    let _ = channel.close(200, "done".into()).await;
    let released = released.map_err(|e| failed("The release failed", e))?;
    Ok(done(
        "/ui/",
        &format!(
            "Released {}: {} parked message(s) returned to the retry lanes ({} more expired \
             during the release); promotion resumed.",
            ladder.tier(i).name,
            released.first_pass.moved,
            released.stragglers.moved
        ),
    ))
}
