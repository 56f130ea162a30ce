//! Subscriptions across tenants: fifty a page in id order, by tenant and by a piece of the id
//! or URL. A page is one keyset query on the primary key (or the `(tenant, id)` index), so it
//! costs the same on the thousandth page as on the first.

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::store::subscriptions::{PageFilter, page};
use crate::web::WebState;
use crate::web::page::{PageError, Site, layout};
use crate::web::session::Visitor;

/// Rows a page shows.
const PAGE: u32 = 50;
/// The longest search text taken.
const MOST_SEARCH: usize = 200;

#[derive(Debug, Default, serde::Deserialize)]
pub struct ListParams {
    tenant: Option<String>,
    /// A piece of the id or URL, any case.
    q: Option<String>,
    /// The last id of the previous page.
    after: Option<String>,
}

fn link(tenant: Option<&str>, q: Option<&str>, after: Option<&str>) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Some(t) = tenant {
        query.append_pair("tenant", t);
    }
    if let Some(q) = q {
        query.append_pair("q", q);
    }
    if let Some(a) = after {
        query.append_pair("after", a);
    }
    format!("/ui/subscriptions?{}", query.finish())
}

/// `GET /ui/subscriptions`: every tenant's subscriptions, or one tenant's, or those matching a
/// search, fifty a page.
pub async fn list(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Query(params): Query<ListParams>,
) -> Result<Response, PageError> {
    let tenant = params.tenant.filter(|t| !t.trim().is_empty());
    let q = params.q.filter(|q| !q.trim().is_empty());
    if q.as_ref().is_some_and(|q| q.len() > MOST_SEARCH) {
        return Err(PageError::new(
            Site::Console,
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("The search is at most {MOST_SEARCH} bytes."),
        ));
    }
    let after = params.after.filter(|a| !a.is_empty());
    let mut conn = state.api.pool.acquire().await.map_err(|e| {
        PageError::new(
            Site::Console,
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        )
    })?;
    let mut rows = page(
        &mut conn,
        &PageFilter {
            tenant: tenant.as_deref().map(str::trim),
            after: after.as_deref(),
            contains: q.as_deref().map(str::trim),
            // One more: whether there is a next page.
            limit: PAGE + 1,
            ..PageFilter::default()
        },
    )
    .await
    .map_err(|e| {
        PageError::new(
            Site::Console,
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        )
    })?;
    let more = rows.len() > PAGE as usize;
    rows.truncate(PAGE as usize);
    let body = html! {
        form.filters method="get" action="/ui/subscriptions" {
            label { "Tenant " input type="text" name="tenant" value=[tenant.as_deref()]; }
            label { "Id or URL contains " input type="text" name="q" value=[q.as_deref()]; }
            button type="submit" { "Search" }
        }
        @if rows.is_empty() { p.muted { "No subscriptions match." } }
        @else {
            table {
                thead { tr { th { "Subscription" } th { "Tenant" } th { "URL" } th { "Receives" } th { "State" } } }
                tbody {
                    @for sub in &rows {
                        tr {
                            td { code { (sub.id) } }
                            td { code { (sub.tenant) } }
                            td.mono { (sub.url) }
                            td {
                                @match &sub.event_types {
                                    Some(types) => { @for t in types { code { (t) } " " } },
                                    None => span.muted { "every type" },
                                }
                                @if let Some(filter) = &sub.payload_filter {
                                    br; span.muted { "where " } code.filter { (crate::units::shorten(&filter.to_string(), 120)) }
                                }
                            }
                            td {
                                @if !sub.enabled { span.badge.bad { "disabled" } }
                                @else if sub.paused { span.badge.warn { "paused" } }
                                @else { span.badge.good { "active" } }
                                @if let Some(why) = &sub.disabled_reason { " " span.muted { (why) } }
                            }
                        }
                    }
                }
            }
        }
        p.pager {
            @if after.is_some() { a href=(link(tenant.as_deref(), q.as_deref(), None)) { "First page" } " " }
            @if let (true, Some(last)) = (more, rows.last()) {
                a href=(link(tenant.as_deref(), q.as_deref(), Some(&last.id))) { "Next page" }
            }
        }
    };
    Ok(layout(Site::Console, Some(&visitor), "Subscriptions", body).into_response())
}
