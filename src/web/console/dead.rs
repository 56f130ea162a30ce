//! The dead-letter sink: its depth (management API, refreshed live), what was dead-lettered
//! over the last day by reason (the history database: the sink itself cannot be counted by
//! reason without taking its messages off it), and a redrive of a selection, as `hookrelay
//! redrive` does it.

use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::ops::redrive::{Filter, SinkReason};
use crate::web::WebState;
use crate::web::page::{Flash, PageError, Site, done, layout};
use crate::web::session::{Form, Visitor};

use super::broker;

/// The most messages one redrive from the page moves: the request waits for them.
pub const MOST: usize = 10_000;
/// How far back the reasons are counted.
const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// `GET /ui/dead`.
pub async fn page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Query(flash): Query<Flash>,
) -> Response {
    let depth = depth(&state).await;
    let reasons: Vec<&str> = SinkReason::all().map(SinkReason::as_str).collect();
    let recent = match state.api.history_pool() {
        Some(pool) => Some(crate::history::health::dead_by_reason(pool, WINDOW, &reasons).await),
        None => None,
    };
    let body = html! {
        (flash.render())
        (depth)
        h2 { "Dead-lettered in the last 24 hours, by reason" }
        @match &recent {
            None => p.muted { "No history database: reasons are not shown." },
            Some(Err(e)) => p.flash.error role="alert" { "Cannot read history: " (e) },
            Some(Ok(rows)) if rows.is_empty() => p.muted { "None recorded." },
            Some(Ok(rows)) => table.reasons {
                thead { tr { th { "Reason" } th.num { "Dead-lettered" } } }
                tbody { @for (reason, n) in rows { tr { td { code { (reason) } } td.num { (n) } } } }
            },
        }
        p.muted {
            "From the attempt log (hookrelay history): what went to the sink, including what has \
             been redriven since. Messages a lane dead-lettered by itself (expired, maxlen, \
             delivery_limit) are counted only by the broker."
        }
        h2 { "Redrive" }
        form.card method="post" action="/ui/dead/redrive" {
            (visitor.csrf_field())
            label for="reason" { "Reason" }
            select #reason name="reason" {
                option value="" { "any" }
                @for r in &reasons { option value=(r) { (r) } }
            }
            label for="tenant" { "Tenant (empty: any)" }
            input #tenant type="text" name="tenant" pattern="[A-Za-z0-9_-]{1,64}";
            label for="limit" { "At most this many" }
            input #limit type="number" name="limit" min="1" max=(MOST) value="100" required;
            div.actions { button type="submit" { "Redrive" } }
            p.muted {
                "Moves matching messages back through the ingress with a fresh attempt budget; \
                 the rest stay in the sink, in their order."
            }
        }
    };
    layout(Site::Console, Some(&visitor), "Dead letters", body).into_response()
}

/// `GET /ui/fragments/dead`: the sink's depth, alone.
pub async fn fragment(State(state): State<WebState>) -> Response {
    depth(&state).await.into_response()
}

async fn depth(state: &WebState) -> Markup {
    let read = match broker(state) {
        Err(e) => Err(e.message),
        Ok((setup, api)) => {
            let dead = setup.ladder.dead();
            api.queue(&dead)
                .await
                .map(|q| (dead, q))
                .map_err(|e| e.to_string())
        }
    };
    html! {
        div #dead-depth hx-get="/ui/fragments/dead" hx-trigger="every 2s" hx-swap="outerHTML" {
            @match &read {
                Err(why) => p.flash.error role="alert" { "Cannot read the broker: " (why) },
                Ok((name, None)) => p.flash.error role="alert" { "The sink " code { (name) } " does not exist: run hookrelay topology apply." },
                Ok((name, Some(q))) => div.grid {
                    div.card {
                        div.muted { "In the sink " code { (name) } }
                        div.figure data-figure="dead" { (q.messages_ready) }
                    }
                    div.card {
                        div.muted { "Being redriven (unacknowledged)" }
                        div.figure { (q.messages_unacknowledged) }
                    }
                },
            }
        }
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct RedriveForm {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    tenant: String,
    limit: usize,
}

fn refused(message: impl Into<String>) -> PageError {
    PageError::new(Site::Console, StatusCode::UNPROCESSABLE_ENTITY, message)
}

fn failed(e: impl std::fmt::Display) -> PageError {
    PageError::new(
        Site::Console,
        StatusCode::BAD_GATEWAY,
        format!("The redrive failed: {e}"),
    )
}

/// `POST /ui/dead/redrive`: moves at most `limit` matching dead messages back to the ingress.
pub async fn redrive(
    State(state): State<WebState>,
    form: Form<RedriveForm>,
) -> Result<Response, PageError> {
    let form = form.value;
    let reason = match form.reason.trim() {
        "" => None,
        r => Some(r.parse::<SinkReason>().map_err(refused)?),
    };
    let tenant = match form.tenant.trim() {
        "" => None,
        t => {
            crate::contract::envelope::check_tenant(t).map_err(|e| refused(e.to_string()))?;
            Some(t.to_owned())
        }
    };
    if form.limit == 0 || form.limit > MOST {
        return Err(refused(format!("The limit is 1 to {MOST}.")));
    }
    let (setup, _) = broker(&state)?;
    let ladder = &setup.ladder;
    let filter = Filter {
        tenant,
        reason,
        ..Filter::default()
    };
    let (publisher, _) = state
        .api
        .publisher()
        .await
        .map_err(|e| PageError::from_api(Site::Console, e))?;
    let conn = publisher.connection().await.map_err(failed)?;
    let channel = conn.create_channel().await.map_err(failed)?;
    let options = crate::ops::mover::MoveOptions {
        limit: Some(form.limit),
        ..Default::default()
    };
    let report = crate::ops::mover::move_messages(
        &channel,
        &publisher,
        &ladder.dead(),
        &options,
        None,
        |props, _| crate::ops::redrive::plan(ladder, &filter, props),
    )
    .await;
    let _ = channel.close(200, "done".into()).await;
    let report = report.map_err(failed)?;
    tracing::info!(
        moved = report.moved,
        examined = report.examined,
        "Redrove dead messages from the console"
    );
    Ok(done(
        "/ui/dead",
        &format!(
            "Examined {} dead message(s): moved {} to {}; {} stayed in the sink.",
            report.examined,
            report.moved,
            ladder.ingress(),
            report.kept_total()
        ),
    ))
}
