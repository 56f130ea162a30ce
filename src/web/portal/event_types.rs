//! The event types a tenant receives (the union of its endpoints' filters), and the catalog
//! the producer declares: each type's description, mode, newest schema and example. Schemas
//! and examples are the producer's text, shown escaped like everything else on the page.

use std::collections::BTreeSet;

use axum::Extension;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::api::auth::Scope;
use crate::api::model::{ListQuery, SubscriptionView};

use crate::web::WebState;
use crate::web::page::{PageError, Site, layout};
use crate::web::session::Visitor;

/// Pages of endpoints read at most (of [`crate::api::subscriptions::MAX_PAGE`] each).
const MOST_PAGES: usize = 20;

/// `GET /portal/event-types`.
pub async fn page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
    Extension(scope): Extension<Scope>,
) -> Result<Response, PageError> {
    let mut subs: Vec<SubscriptionView> = Vec::new();
    let mut cursor = None;
    let mut cut = false;
    for n in 0..MOST_PAGES {
        let query = ListQuery {
            cursor: cursor.take(),
            limit: Some(crate::api::subscriptions::MAX_PAGE),
            ..Default::default()
        };
        let axum::Json(page) = crate::api::subscriptions::list(
            State(state.api.clone()),
            Extension(scope.clone()),
            Ok(Query(query)),
        )
        .await
        .map_err(|e| PageError::from_api(Site::Portal, e))?;
        subs.extend(page.data);
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
        cut = n + 1 == MOST_PAGES;
    }
    // An endpoint with no filter takes every type: then the union is everything.
    let all = subs.iter().any(|s| s.event_types.is_none());
    let union: BTreeSet<&str> = subs
        .iter()
        .filter_map(|s| s.event_types.as_ref())
        .flatten()
        .map(String::as_str)
        .collect();
    let axum::Json(catalog) = crate::api::event_types::list(State(state.api.clone()))
        .await
        .map_err(|e| PageError::from_api(Site::Portal, e))?;
    let body = html! {
        @if subs.is_empty() {
            p.muted { "No endpoints: nothing is received." }
        } @else if all {
            p { "Your endpoints receive " strong { "all" } " event types: at least one takes every type." }
        } @else {
            p { "Your endpoints receive these event types (" code { "prefix.*" } " takes a family):" }
            ul { @for t in &union { li { code { (t) } } } }
        }
        @if cut { p.muted { "Only your first " (subs.len()) " endpoints are counted." } }
        @if !subs.is_empty() {
            h2 { "By endpoint" }
            table {
                thead { tr { th { "Endpoint" } th { "Event types" } } }
                tbody { @for s in &subs { tr {
                    td { a href=(format!("/portal/endpoints/{}", s.id)) { code { (s.id) } } }
                    td { @match &s.event_types {
                        Some(types) => { @for t in types { code { (t) } " " } }
                        None => span.muted { "all" },
                    } }
                } } }
            }
        }
        (crate::web::catalog::section(&catalog))
    };
    Ok(layout(Site::Portal, Some(&visitor), "Event types", body).into_response())
}
