//! `POST /v1/portal-links`: a one-time link into the tenant portal, asked for by a tenant's
//! backend (its token) or an admin naming the tenant; `POST /v1/portal-sessions/revoke`: every
//! portal session of a tenant ended and its unused links voided.

use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::contract::envelope::check_tenant;
use crate::store::portal;

use super::ApiState;
use super::auth::Scope;
use super::extract::json;
use super::problem::ApiError;
use super::problem::documented::{Invalid, MalformedJson, Unauthorized};

/// The longest a link may stay usable.
pub const MAX_LINK_TTL: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_LINK_TTL: Duration = Duration::from_secs(3600);

/// What link to make.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePortalLink {
    /// The tenant the portal shows. A tenant token may leave it out (its own) and may name no
    /// other (422); an admin token must name one.
    #[schema(example = "acme", pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// How long the link may be opened, `"15m"`, `"2h"`: at most 24 hours; default 1 hour. A
    /// link opens one session, once.
    #[schema(example = "15m")]
    pub expires_in: Option<String>,
    /// A session that shows and changes nothing (default false).
    pub read_only: Option<bool>,
}

/// A one-time link.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PortalLink {
    /// Open it in the tenant's browser (redirect there, or an `<a>`). It works once.
    #[schema(example = "https://hooks.example.com/portal/open/4f1c...")]
    pub url: String,
    pub tenant: String,
    pub read_only: bool,
    /// RFC 3339.
    pub expires_at: String,
}

/// Whose sessions to end.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokePortalSessions {
    /// A tenant token may leave it out (its own); an admin token must name one.
    pub tenant: Option<String>,
}

/// What was ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PortalSessionsRevoked {
    pub tenant: String,
    pub sessions: u64,
    pub links: u64,
}

fn tenant_of(scope: &Scope, asked: Option<String>) -> Result<String, ApiError> {
    match (scope, asked) {
        (Scope::Tenant(own), None) => Ok(own.clone()),
        (Scope::Tenant(own), Some(asked)) if &asked == own => Ok(asked),
        (Scope::Tenant(_), Some(_)) => Err(ApiError::field(
            "tenant",
            "a tenant token may name only its own tenant",
        )),
        (Scope::Admin, None) => Err(ApiError::field(
            "tenant",
            "an admin token names the tenant whose portal to open",
        )),
        (Scope::Admin, Some(asked)) => {
            check_tenant(&asked).map_err(|e| ApiError::field("tenant", e.to_string()))?;
            Ok(asked)
        }
    }
}

/// Where links point: `api.public_url`, else `http://` and the host this was asked at.
fn base_url(state: &ApiState, headers: &HeaderMap) -> Result<String, ApiError> {
    if !state.pages.public_url.is_empty() {
        return Ok(state.pages.public_url.clone());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .ok_or_else(|| {
            ApiError::BadRequest(
                "no usable Host header to make the link with; set api.public_url".into(),
            )
        })?;
    Ok(format!("http://{host}"))
}

/// Makes a one-time link into the tenant portal. Opening it in a browser starts a session
/// (an HttpOnly, SameSite=Strict cookie, `api.session_ttl` long) that sees only that tenant.
#[utoipa::path(
    post, path = "/v1/portal-links", tag = "portal",
    request_body(content = Option<CreatePortalLink>, description = "Optional for a tenant token"),
    responses(
        (status = 201, body = PortalLink),
        MalformedJson,
        Unauthorized,
        Invalid,
    )
)]
pub async fn create(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<PortalLink>), ApiError> {
    let req: CreatePortalLink = json(body, Some(CreatePortalLink::default()), state.max_body)?;
    let tenant = tenant_of(&scope, req.tenant)?;
    let ttl = match req.expires_in.as_deref() {
        None => DEFAULT_LINK_TTL,
        Some(text) => humantime::parse_duration(text)
            .map_err(|e| ApiError::field("expires_in", format!("{text:?}: {e}")))?,
    };
    if ttl.is_zero() || ttl > MAX_LINK_TTL {
        return Err(ApiError::field(
            "expires_in",
            "must be longer than zero and at most 24h",
        ));
    }
    let base = base_url(&state, &headers)?;
    let read_only = req.read_only.unwrap_or(false);
    let (token, expires_at) = portal::create_link(&state.pool, &tenant, read_only, ttl).await?;
    tracing::info!(tenant = %tenant, read_only, "Made a portal link");
    Ok((
        StatusCode::CREATED,
        axum::Json(PortalLink {
            url: format!("{base}/portal/open/{token}"),
            tenant,
            read_only,
            expires_at: humantime::format_rfc3339_seconds(expires_at).to_string(),
        }),
    ))
}

/// Ends every portal session of a tenant and voids its unused links.
#[utoipa::path(
    post, path = "/v1/portal-sessions/revoke", tag = "portal",
    request_body(content = Option<RevokePortalSessions>, description = "Optional for a tenant token"),
    responses(
        (status = 200, body = PortalSessionsRevoked),
        MalformedJson,
        Unauthorized,
        Invalid,
    )
)]
pub async fn revoke(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<PortalSessionsRevoked>, ApiError> {
    let req: RevokePortalSessions =
        json(body, Some(RevokePortalSessions::default()), state.max_body)?;
    let tenant = tenant_of(&scope, req.tenant)?;
    let (sessions, links) = portal::revoke_tenant(&state.pool, &tenant).await?;
    tracing::info!(tenant = %tenant, sessions, links, "Revoked portal sessions");
    Ok(axum::Json(PortalSessionsRevoked {
        tenant,
        sessions,
        links,
    }))
}
