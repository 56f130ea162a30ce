//! A tenant's endpoints: the list.

use axum::Extension;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::api::auth::Scope;
use crate::api::model::ListQuery;

use crate::web::WebState;
use crate::web::page::{Flash, PageError, Site, layout};
use crate::web::session::Visitor;

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
