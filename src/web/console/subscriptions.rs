//! Subscriptions across tenants.

use axum::Extension;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::api::auth::Scope;
use crate::api::model::ListQuery;

use crate::web::WebState;
use crate::web::page::{PageError, Site, layout};
use crate::web::session::Visitor;

#[derive(Debug, Default, serde::Deserialize)]
pub struct ListParams {
    tenant: Option<String>,
    cursor: Option<String>,
}

/// `GET /ui/subscriptions`: every tenant's subscriptions, or one tenant's, fifty a page.
pub async fn list(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
    Query(params): Query<ListParams>,
) -> Result<Response, PageError> {
    let tenant = params.tenant.filter(|t| !t.is_empty());
    let query = ListQuery {
        tenant: tenant.clone(),
        cursor: params.cursor.clone(),
        ..Default::default()
    };
    let axum::Json(page) = crate::api::subscriptions::list(
        State(state.api.clone()),
        Extension(scope),
        Ok(Query(query)),
    )
    .await
    .map_err(|e| PageError::from_api(Site::Console, e))?;
    let body = html! {
        form.filters method="get" action="/ui/subscriptions" {
            label { "Tenant " input type="text" name="tenant" value=[tenant.as_deref()]; }
            button type="submit" { "Search" }
        }
        table {
            thead { tr { th { "Subscription" } th { "Tenant" } th { "URL" } th { "State" } } }
            tbody {
                @for sub in &page.data {
                    tr {
                        td { code { (sub.id) } }
                        td { code { (sub.tenant) } }
                        td.mono { (sub.url) }
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
            p.pager {
                a href=(format!("/ui/subscriptions?tenant={}&cursor={next}", tenant.as_deref().unwrap_or(""))) { "Next page" }
            }
        }
    };
    Ok(layout(Site::Console, Some(&visitor), "Subscriptions", body).into_response())
}
