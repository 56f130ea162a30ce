//! The replay jobs of this API process (`/v1/replays`): running ones first, with their counts
//! refreshed live, and a cancel button for each running one. Jobs live in the process that
//! runs them: another API replica's are not listed.

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::api::auth::Scope;
use crate::web::WebState;
use crate::web::page::{Flash, PageError, Site, done, layout};
use crate::web::session::{Form, Visitor};

use super::ladder::NoFields;

/// `GET /ui/replays`.
pub async fn list(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Query(flash): Query<Flash>,
) -> Response {
    let body = html! {
        (flash.render())
        (jobs(&state, Some(&visitor)))
    };
    layout(Site::Console, Some(&visitor), "Replays", body).into_response()
}

/// `GET /ui/fragments/replays`: the table alone.
pub async fn fragment(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
) -> Response {
    jobs(&state, Some(&visitor)).into_response()
}

fn jobs(state: &WebState, visitor: Option<&Visitor>) -> Markup {
    let jobs = crate::api::replays::list(&state.api, &Scope::Admin);
    let running = jobs.iter().any(|j| j.state == "running");
    html! {
        // Refreshed only while something runs: a finished list stays still (and focusable).
        div #replays hx-get=[running.then_some("/ui/fragments/replays")]
            hx-trigger=[running.then_some("every 2s")] hx-swap="outerHTML" {
            @if jobs.is_empty() {
                p.muted { "No replays in this process since it started." }
            } @else {
                table.replays {
                    thead { tr {
                        th { "Replay" } th { "State" } th { "Tenant" } th { "Window" }
                        th.num { "Read" } th.num { "Matched" } th.num { "Published" } th { "" }
                    } }
                    tbody {
                        @for j in &jobs {
                            tr data-replay=(j.id) {
                                td { code { (j.id) } @if j.dry_run { " " span.badge { "dry run" } } }
                                td {
                                    @match j.state.as_str() {
                                        "running" => span.badge.warn { "running" },
                                        "failed" => span.badge.bad { "failed" },
                                        other => span.badge { (other) },
                                    }
                                    @if let Some(e) = &j.error { " " span.muted { (e) } }
                                }
                                td { code { (j.tenant.as_deref().unwrap_or("any")) } }
                                td { (j.from) " – " (j.to.as_deref().unwrap_or("now")) }
                                td.num { (j.read) }
                                td.num { (j.matched) }
                                td.num { (j.published) }
                                td {
                                    @if let (true, Some(v)) = (j.state == "running", visitor) {
                                        form.inline method="post" action=(format!("/ui/replays/{}/cancel", j.id)) {
                                            (v.csrf_field())
                                            button.danger type="submit" { "Cancel" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `POST /ui/replays/{id}/cancel`: what `POST /v1/replays/{id}/cancel` does.
pub async fn cancel(
    State(state): State<WebState>,
    Path(id): Path<String>,
    _form: Form<NoFields>,
) -> Result<Response, PageError> {
    let axum::Json(job) =
        crate::api::replays::cancel(State(state.api.clone()), Extension(Scope::Admin), Path(id))
            .await
            .map_err(|e| PageError::from_api(Site::Console, e))?;
    Ok(done(
        "/ui/replays",
        &format!("Replay {} is {}.", job.id, job.state),
    ))
}
