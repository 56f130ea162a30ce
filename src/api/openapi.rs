//! The OpenAPI document, generated from the handlers and types: served at `/v1/openapi.json`,
//! printed by `hookrelay api openapi`, and checked in as `docs/openapi.json` (a test keeps the
//! two equal).

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::content::Content;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Ref, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::actions;
use super::event_types;
use super::history;
use super::model;
use super::portal_links;
use super::problem;
use super::replays;
use super::subscriptions;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hookrelay control plane",
        description = "Subscriptions of a hookrelay webhook dispatcher, stored in PostgreSQL and \
                       followed by every worker. Errors are RFC 9457 problem details. Every \
                       route but this document needs `Authorization: Bearer <token>`: an admin \
                       token, or a tenant's, which sees and changes only that tenant's \
                       subscriptions, history and replays (another tenant's id is answered 404), and reads \
                       the catalog of event types, which only an admin token writes (403).",
        license(name = "Apache-2.0"),
    ),
    paths(
        subscriptions::create,
        subscriptions::list,
        subscriptions::read,
        subscriptions::update,
        subscriptions::remove,
        actions::pause,
        actions::resume,
        actions::rotate,
        actions::send_test,
        history::event,
        history::attempts,
        replays::create,
        replays::read,
        replays::cancel,
        portal_links::create,
        portal_links::revoke,
        event_types::list,
        event_types::read,
        event_types::put,
        event_types::remove,
    ),
    components(schemas(
        model::CreateSubscription,
        model::UpdateSubscription,
        model::SubscriptionView,
        model::SecretInfo,
        model::CreatedSubscription,
        model::SubscriptionPage,
        model::RotateSecret,
        model::RotatedSecret,
        model::ResumeSubscription,
        model::Resumed,
        model::SendTestEvent,
        model::TestEventSent,
        history::AttemptPage,
        crate::history::trace::Story,
        crate::history::trace::Accepted,
        crate::history::trace::Attempt,
        crate::history::trace::Outcome,
        replays::CreateReplay,
        replays::ReplayJob,
        portal_links::CreatePortalLink,
        portal_links::PortalLink,
        portal_links::RevokePortalSessions,
        portal_links::PortalSessionsRevoked,
        event_types::EventTypeList,
        event_types::EventTypeView,
        event_types::SchemaVersionView,
        event_types::PutEventType,
        crate::catalog::ValidationMode,
        problem::Problem,
        problem::FieldError,
    )),
    modifiers(&Bearer, &TenantPace),
    security(("bearer" = [])),
    tags(
        (name = "subscriptions", description = "Who receives which events, where, signed with what"),
        (name = "history", description = "What happened to an event, and a subscription's attempts (filled by `hookrelay history`)"),
        (name = "replays", description = "Archived events published again by the time they were accepted"),
        (name = "event types", description = "The catalog: each event type's JSON Schema per version, its example, and what workers do with an event it refuses"),
        (name = "portal", description = "One-time links into the tenant portal, and ending its sessions"),
    ),
)]
struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every route that changes something may answer a tenant's token 429 ([`super::quota`]):
/// said here once rather than on each handler.
struct TenantPace;

impl Modify for TenantPace {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let spent = if path == "/v1/subscriptions/{id}/test" {
                "This tenant's test events a minute (api.test_events_per_minute) are spent"
            } else {
                "This tenant's writes a minute (api.writes_per_minute) are spent"
            };
            let writes = [
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in writes.into_iter().flatten() {
                let retry_after = HeaderBuilder::new()
                    .schema(
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(1)),
                    )
                    .description(Some("Seconds until one more is allowed"))
                    .build();
                let response = ResponseBuilder::new()
                    .description(format!("{spent}; try again after Retry-After seconds"))
                    .header("Retry-After", retry_after)
                    .content(
                        problem::CONTENT_TYPE,
                        Content::new(Some(Ref::from_schema_name("Problem"))),
                    )
                    .build();
                operation
                    .responses
                    .responses
                    .insert("429".into(), response.into());
            }
        }
    }
}

/// The document, as `docs/openapi.json` holds it (pretty, with a final newline). The version
/// is the crate's.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let mut text = doc
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document())
}
