//! The catalog of event types, for the operator: what producers declared, with each type's
//! validation mode, newest schema and example (`/v1/event-types` writes it).

use axum::Extension;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::web::WebState;
use crate::web::page::{PageError, Site, layout};
use crate::web::session::Visitor;

/// `GET /ui/event-types`.
pub async fn page(
    State(state): State<WebState>,
    Extension(visitor): Extension<Visitor>,
) -> Result<Response, PageError> {
    let axum::Json(catalog) = crate::api::event_types::list(State(state.api.clone()))
        .await
        .map_err(|e| PageError::from_api(Site::Console, e))?;
    let body = html! {
        p.muted {
            "Written with " code { "PUT /v1/event-types/{name}" } " (an admin token) or the "
            "subscriptions file's " code { "[[event_type]]" } " section; workers validate each "
            "event where it is first routed, by its type's mode."
        }
        (crate::web::catalog::section(&catalog))
    };
    Ok(layout(Site::Console, Some(&visitor), "Event types", body).into_response())
}
