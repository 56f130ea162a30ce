//! `/v1/event-types`: the catalog of event types ([`crate::catalog`]). Every token reads it
//! (the catalog is the producer's promise to all its tenants); only an admin's writes it, and
//! a tenant's write is answered 403. A write is checked whole before it is stored: the name,
//! the schema (draft 2020-12, bounded, no reference outside itself) and the example against
//! the schema, each refusal a 422 naming the field.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tracing::info;
use utoipa::ToSchema;

use crate::catalog::{self, CatalogError, MAX_VERSIONS, ValidationMode};
use crate::store::catalog::{self as stored, EventTypeRow, EventTypeWrite};

use super::ApiState;
use super::auth::Scope;
use super::extract::json;
use super::model::rfc3339;
use super::problem::ApiError;
use super::problem::documented::{
    AdminOnly, Invalid, MalformedJson, NoSuchEventType, TooLarge, Unauthorized,
};

/// One version of a type's schema.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SchemaVersionView {
    /// 1 for the first; each new schema or example is the next.
    pub version: u32,
    /// A JSON Schema, draft 2020-12.
    pub schema: serde_json::Value,
    /// A payload the schema accepts.
    pub example: serde_json::Value,
}

/// An event type of the catalog.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventTypeView {
    #[schema(example = "order.paid")]
    pub name: String,
    pub description: String,
    /// What a worker does with an event its newest schema refuses.
    pub mode: ValidationMode,
    pub deprecated: bool,
    /// Oldest first; events are validated against the last.
    pub versions: Vec<SchemaVersionView>,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
}

/// The catalog.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventTypeList {
    /// Every type, by name.
    pub data: Vec<EventTypeView>,
}

/// A type as an admin writes it. A schema or example that differs from the newest version's
/// becomes a new version; the other fields change in place.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutEventType {
    /// At most 2,000 characters; default empty.
    #[serde(default)]
    pub description: String,
    /// Default `off`.
    #[serde(default)]
    pub mode: ValidationMode,
    /// Default false. Shown to tenants; events of the type are delivered as before.
    #[serde(default)]
    pub deprecated: bool,
    /// A JSON Schema, draft 2020-12: at most 64 KiB, 32 levels deep, 1,000 values an `enum`;
    /// `$ref` only within itself (`#...`).
    pub schema: serde_json::Value,
    /// A payload the schema must accept.
    pub example: serde_json::Value,
}

fn view(row: EventTypeRow) -> EventTypeView {
    let t = row.event_type;
    EventTypeView {
        name: t.name,
        description: t.description,
        mode: t.mode,
        deprecated: t.deprecated,
        versions: t
            .versions
            .into_iter()
            .map(|v| SchemaVersionView {
                version: v.version,
                schema: v.schema,
                example: v.example,
            })
            .collect(),
        created_at: rfc3339(row.created_ms),
        updated_at: rfc3339(row.updated_ms),
    }
}

/// A name that could never be stored is simply not found.
fn path_name(name: &str) -> Result<(), ApiError> {
    catalog::check_name(name).map_err(|_| ApiError::Absent("event type"))
}

fn admin_only(scope: &Scope) -> Result<(), ApiError> {
    match scope {
        Scope::Admin => Ok(()),
        Scope::Tenant(_) => Err(ApiError::Forbidden(
            "the catalog of event types is written with an admin token; a tenant's reads it".into(),
        )),
    }
}

fn refused(e: CatalogError) -> ApiError {
    let field = match &e {
        CatalogError::Name(_) => "name",
        CatalogError::Mode(_) => "mode",
        CatalogError::Description | CatalogError::DescriptionControl => "description",
        CatalogError::Versions | CatalogError::NoVersion => "versions",
        CatalogError::Schema(_) => "schema",
        CatalogError::Example { .. } => "example",
    };
    let text = e.to_string();
    let message = text
        .strip_prefix(&format!("{field}: "))
        .unwrap_or(&text)
        .to_owned();
    ApiError::field(field, message)
}

/// The whole catalog, by name.
#[utoipa::path(
    get, path = "/v1/event-types", tag = "event types",
    responses(
        (status = 200, body = EventTypeList),
        Unauthorized,
    )
)]
pub async fn list(State(state): State<ApiState>) -> Result<axum::Json<EventTypeList>, ApiError> {
    let rows = stored::list(&state.pool).await?;
    Ok(axum::Json(EventTypeList {
        data: rows.into_iter().map(view).collect(),
    }))
}

/// One event type, with every version of its schema.
#[utoipa::path(
    get, path = "/v1/event-types/{name}", tag = "event types",
    params(("name" = String, Path, example = "order.paid")),
    responses(
        (status = 200, body = EventTypeView),
        Unauthorized,
        NoSuchEventType,
    )
)]
pub async fn read(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<axum::Json<EventTypeView>, ApiError> {
    path_name(&name)?;
    stored::get(&state.pool, &name)
        .await?
        .map(|row| axum::Json(view(row)))
        .ok_or(ApiError::Absent("event type"))
}

/// Creates an event type (201) or changes it (200). Admin only.
#[utoipa::path(
    put, path = "/v1/event-types/{name}", tag = "event types",
    params(("name" = String, Path, example = "order.paid")),
    request_body = PutEventType,
    responses(
        (status = 200, body = EventTypeView, description = "Changed"),
        (status = 201, body = EventTypeView, description = "Created"),
        MalformedJson,
        Unauthorized,
        AdminOnly,
        TooLarge,
        Invalid,
    )
)]
pub async fn put(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<EventTypeView>), ApiError> {
    admin_only(&scope)?;
    let req: PutEventType = json(body, None, state.max_body)?;
    catalog::check_name(&name).map_err(refused)?;
    catalog::check_version(&req.description, &req.schema, &req.example).map_err(refused)?;
    if stored::versions(&state.pool, &name).await? >= MAX_VERSIONS {
        let newest = stored::get(&state.pool, &name).await?;
        let unchanged = newest
            .as_ref()
            .and_then(|r| r.event_type.newest())
            .is_some_and(|v| v.schema == req.schema && v.example == req.example);
        if !unchanged {
            return Err(refused(CatalogError::Versions));
        }
    }
    let (row, created) = stored::put(
        &state.pool,
        &EventTypeWrite {
            name: &name,
            description: &req.description,
            mode: req.mode,
            deprecated: req.deprecated,
            schema: &req.schema,
            example: &req.example,
        },
    )
    .await?;
    let version = row.event_type.newest().map_or(0, |v| v.version);
    info!(event_type = %name, mode = %req.mode, version, created, "Wrote event type");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(view(row))))
}

/// Deletes an event type and its versions: its events follow `catalog.unlisted` from then on.
/// Admin only.
#[utoipa::path(
    delete, path = "/v1/event-types/{name}", tag = "event types",
    params(("name" = String, Path, example = "order.paid")),
    responses(
        (status = 204, description = "Deleted"),
        Unauthorized,
        AdminOnly,
        NoSuchEventType,
    )
)]
pub async fn remove(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    admin_only(&scope)?;
    path_name(&name)?;
    if stored::remove(&state.pool, &name).await? {
        info!(event_type = %name, "Deleted event type");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::Absent("event type"))
    }
}
