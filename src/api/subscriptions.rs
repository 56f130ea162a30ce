//! The handlers of `/v1/subscriptions`: create (idempotent with `Idempotency-Key`), read, list,
//! update, delete; the actions on one ([`super::actions`]) share their reading and signing.
//!
//! Bodies are read as bytes and parsed by [`super::extract`], so every refusal is a problem
//! naming the field at fault. Nothing is written until all of a request is checked.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::contract::envelope::check_id;
use crate::contract::signing::{generate_key_pair, generate_secret};
use crate::store::idempotency::{
    self, REMEMBERED_SEALED_SECRET, REMEMBERED_SECRET_ROW, Remembered,
};
use crate::store::request as stored;
use crate::store::subscriptions::{self as store, NewSigning, PageFilter};
use crate::subscriptions::seal::Binding;

use super::ApiState;
use super::auth::Scope;
use super::extract::{idempotency_key, json, path_id};
use super::model::{
    CreateHeaders, CreateSubscription, CreatedSubscription, ListQuery, SignatureScheme,
    SubscriptionPage, SubscriptionView, UpdateSubscription,
};
use super::problem::documented::{
    BadFilter, Invalid, MalformedJson, NoSuchSubscription, TooLarge, Unauthorized,
};
use super::problem::{ApiError, FieldError, Problem};
use super::{quota, validate};

/// New signing secrets, one per scheme: the rows to store, and what the answer shows once.
pub(super) struct NewSecrets {
    pub(super) rows: Vec<NewSigning>,
    /// The `whsec_` secret, and which of `rows` holds it (an idempotent replay reads it there).
    pub(super) secret: Option<String>,
    secret_row: Option<usize>,
    pub(super) public_key: Option<String>,
}

pub(super) fn new_signing(
    state: &ApiState,
    tenant: &str,
    id: &str,
    schemes: &[SignatureScheme],
) -> Result<NewSecrets, ApiError> {
    let mut out = NewSecrets {
        rows: Vec::new(),
        secret: None,
        secret_row: None,
        public_key: None,
    };
    let binding = Binding::new(tenant, id, stored::SIGNING);
    // v1a first, so v1 (the higher position) is the newest: the order does not change what
    // signs, only how the list reads.
    for scheme in schemes.iter().rev() {
        match scheme {
            SignatureScheme::V1 => {
                let secret = generate_secret();
                let sealed = state
                    .keyring
                    .seal(&binding, secret.as_bytes())
                    .map_err(ApiError::internal)?;
                out.secret_row = Some(out.rows.len());
                out.rows.push(NewSigning {
                    sealed,
                    public_key: None,
                });
                out.secret = Some(secret);
            }
            SignatureScheme::V1a => {
                let (secret_key, public_key) = generate_key_pair();
                let sealed = state
                    .keyring
                    .seal(&binding, secret_key.as_bytes())
                    .map_err(ApiError::internal)?;
                out.rows.push(NewSigning {
                    sealed,
                    public_key: Some(public_key.clone()),
                });
                out.public_key = Some(public_key);
            }
        }
    }
    Ok(out)
}

/// The secrets a request gave, each sealed for its tenant, subscription and purpose.
fn seal_all(state: &ApiState, sub: &validate::Checked) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
    sub.new_secrets
        .iter()
        .map(|(purpose, plain)| {
            state
                .keyring
                .seal(
                    &Binding::new(&sub.tenant, &sub.id, purpose),
                    plain.0.as_bytes(),
                )
                .map(|sealed| (purpose.clone(), sealed))
                .map_err(ApiError::internal)
        })
        .collect()
}

/// The answer remembered for (`scope`, `key`), if any; the request must be the same. Holds
/// the key's lock until `tx` ends, so requests with one key are answered one after the other.
async fn remembered(
    state: &ApiState,
    tx: &mut sqlx::PgConnection,
    caller: &Scope,
    key: &str,
    request_hash: &[u8],
) -> Result<Option<Response>, ApiError> {
    let scope = caller.idempotency_scope();
    let Some(first) = idempotency::lookup(tx, &scope, key).await? else {
        return Ok(None);
    };
    if first.request_hash != request_hash {
        return Err(ApiError::IdempotencyMismatch);
    }
    let (body, id) = replay(state, tx, caller, first.body).await?;
    // Answered as it was, but 200: nothing was created by this request.
    Ok(Some(created(StatusCode::OK, body, &id)))
}

/// A remembered create answer, with its secret read again from the row it refers to (or, as
/// earlier versions kept it, opened from the answer). It must be of a tenant the caller sees,
/// and the row of the same subscription and tenant: moved elsewhere, it is not shown.
async fn replay(
    state: &ApiState,
    conn: &mut sqlx::PgConnection,
    caller: &Scope,
    mut body: serde_json::Value,
) -> Result<(serde_json::Value, String), ApiError> {
    let object = body
        .as_object_mut()
        .ok_or_else(|| ApiError::internal("a remembered answer is not an object"))?;
    let subscription = object.get("subscription");
    let field = |name: &str| {
        subscription
            .and_then(|s| s.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .ok_or_else(|| ApiError::internal(format!("a remembered answer has no {name}")))
    };
    let (id, tenant) = (field("id")?, field("tenant")?);
    if !caller.sees(&tenant) {
        return Err(ApiError::internal(
            "a remembered answer is of a tenant this caller does not see",
        ));
    }
    let gone = || {
        ApiError::Conflict(
            "the subscription this Idempotency-Key created was deleted, or its secret rotated \
             away, since: the first answer cannot be given again; use another key"
                .into(),
        )
    };
    // A subscription signing v1a alone has no secret to show again, only its public key.
    let sealed = if let Some(position) = object.remove(REMEMBERED_SECRET_ROW) {
        let position = position.as_i64().ok_or_else(gone)?;
        let (sealed, row_tenant) = store::signing_secret(conn, &id, position)
            .await?
            .ok_or_else(gone)?;
        if row_tenant != tenant {
            return Err(ApiError::internal(
                "a remembered answer's secret is of another tenant",
            ));
        }
        Some(sealed)
    } else if let Some(sealed) = object.remove(REMEMBERED_SEALED_SECRET) {
        let sealed = sealed
            .as_str()
            .and_then(|s| STANDARD.decode(s).ok())
            .ok_or_else(|| ApiError::internal("a remembered sealed secret is not base64"))?;
        Some(sealed)
    } else {
        None
    };
    if let Some(sealed) = sealed {
        let secret = state
            .keyring
            .open(&Binding::new(&tenant, &id, stored::SIGNING), &sealed)
            .ok()
            .and_then(|s| String::from_utf8(s).ok())
            .ok_or_else(|| ApiError::internal("a remembered secret does not open"))?;
        object.insert("secret".into(), serde_json::Value::String(secret));
    }
    Ok((body, id))
}

/// Subscription `id` as the API shows it, if `scope` sees it.
pub(super) async fn view(
    conn: &mut sqlx::PgConnection,
    id: &str,
    scope: &Scope,
) -> Result<Option<SubscriptionView>, ApiError> {
    Ok(store::get(conn, id, scope.tenant())
        .await?
        .map(|(row, secrets)| SubscriptionView::from_store(row, secrets)))
}

/// The schemes subscription `id`'s unexpired signing secrets sign with: `v1a` for a key with a
/// public key, `v1` for the rest (a reference imported from a file counts as `v1`).
pub(super) async fn signing_schemes(
    conn: &mut sqlx::PgConnection,
    id: &str,
) -> Result<Vec<SignatureScheme>, ApiError> {
    let mut schemes: Vec<SignatureScheme> = store::signing_public_keys(conn, id)
        .await?
        .into_iter()
        .map(|v1a| {
            if v1a {
                SignatureScheme::V1a
            } else {
                SignatureScheme::V1
            }
        })
        .collect();
    schemes.sort();
    schemes.dedup();
    if schemes.is_empty() {
        schemes.push(SignatureScheme::V1);
    }
    Ok(schemes)
}

pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 500;

/// The cursor of a page that ends at `id`: opaque to callers.
fn cursor_after(id: &str) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn id_of_cursor(cursor: &str) -> Result<String, ApiError> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|id| check_id(id).is_ok())
        .ok_or_else(|| {
            ApiError::Invalid(vec![FieldError::new(
                "cursor",
                "not a cursor this API gave; pass next_cursor as it came",
            )])
        })
}

/// A page of the subscriptions `scope` sees, ordered by id.
async fn list_page(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
    query: &ListQuery,
) -> Result<SubscriptionPage, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::field(
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    let after = query
        .cursor
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(id_of_cursor)
        .transpose()?;
    if let Some(tenant) = &query.tenant {
        crate::contract::envelope::check_tenant(tenant)
            .map_err(|e| ApiError::field("tenant", e.to_string()))?;
    }
    let tenant = match (scope.tenant(), query.tenant.as_deref()) {
        (Some(own), Some(asked)) if own != asked => {
            return Ok(SubscriptionPage {
                data: Vec::new(),
                next_cursor: None,
            });
        }
        (Some(own), _) => Some(own),
        (None, asked) => asked,
    };
    let mut rows = store::page(
        conn,
        &PageFilter {
            tenant,
            enabled: query.enabled,
            paused: query.paused,
            after: after.as_deref(),
            contains: None,
            // One more than asked: whether there is a next page.
            limit: limit + 1,
        },
    )
    .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let mut secrets = store::secret_dates(conn, &ids).await?;
    let next_cursor = more
        .then(|| ids.last().map(|id| cursor_after(id)))
        .flatten();
    let data = rows
        .into_iter()
        .map(|row| {
            let secrets = secrets.remove(&row.id).unwrap_or_default();
            SubscriptionView::from_store(row, secrets)
        })
        .collect();
    Ok(SubscriptionPage { data, next_cursor })
}

fn created(status: StatusCode, body: serde_json::Value, id: &str) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/subscriptions/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// Creates a subscription and its signing secret (`v1`: shown this once) or key (`v1a`: its
/// public key shown), with its own headers and endpoint authentication if given.
///
/// With an `Idempotency-Key`, a repeated request (same key, same body, within 24 hours) gets
/// the first answer again, secret included; the same key with another body is refused (422).
#[utoipa::path(
    post, path = "/v1/subscriptions", tag = "subscriptions",
    params(CreateHeaders),
    request_body = CreateSubscription,
    responses(
        (status = 201, description = "Created; the secret is shown this once", body = CreatedSubscription),
        (status = 200, description = "Created before with this Idempotency-Key: the first answer", body = CreatedSubscription),
        MalformedJson,
        Unauthorized,
        (status = 409, description = "The id is taken (an admin token names ids; a tenant token's are generated), the tenant has api.max_subscriptions_per_tenant (quota-exceeded), or the secret of the subscription this Idempotency-Key created is gone", body = Problem, content_type = "application/problem+json"),
        TooLarge,
        (status = 422, description = "Invalid input, or the Idempotency-Key was used with another body", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let request_hash = body
        .as_ref()
        .map(|b| Sha256::digest(b).to_vec())
        .unwrap_or_default();
    let req: CreateSubscription = json(body, None, state.max_body)?;
    let idempotency_scope = scope.idempotency_scope();
    // A repeated request gets its first answer without being checked again.
    if let Some(key) = &key {
        let mut tx = state.pool.begin().await?;
        if let Some(answer) = remembered(&state, &mut tx, &scope, key, &request_hash).await? {
            return Ok(answer);
        }
    }
    // Checked (its names looked up, which may take seconds) and sealed before a connection is
    // taken: the pool is every tenant's.
    let schemes = validate::schemes(req.signatures.as_deref(), "signatures")?;
    let types = req.event_types.as_ref().map(Vec::len);
    let sub = validate::create(req, &scope, &state.egress).await;
    let sub = quota::with_event_types(sub, types, state.limits.max_event_types)?;
    let signing = new_signing(&state, &sub.tenant, &sub.id, &schemes)?;
    let sealed = seal_all(&state, &sub)?;
    let mut tx = state.pool.begin().await?;
    // A retry of this request may have been answered meanwhile.
    if let Some(key) = &key
        && let Some(answer) = remembered(&state, &mut tx, &scope, key, &request_hash).await?
    {
        return Ok(answer);
    }
    // Counted under the tenant's lock, in the transaction that inserts: no connection is held
    // across a name lookup, and concurrent creates cannot both take the last place.
    quota::check_subscriptions(
        &mut tx,
        &sub.tenant,
        state.limits.max_subscriptions_per_tenant,
    )
    .await?;
    let Some(positions) = store::insert(&mut tx, &sub.to_store(), &signing.rows, &sealed).await?
    else {
        return Err(ApiError::Conflict(format!(
            "a subscription with id {:?} exists already",
            sub.id
        )));
    };
    let view = view(&mut tx, &sub.id, &Scope::Admin)
        .await?
        .ok_or_else(|| ApiError::internal("the subscription just created is not found"))?;
    let answer = CreatedSubscription {
        subscription: view,
        secret: signing.secret,
        public_key: signing.public_key,
    };
    let body = serde_json::to_value(&answer).map_err(ApiError::internal)?;
    if let Some(key) = &key {
        let mut remembered = body.clone();
        if let Some(object) = remembered.as_object_mut()
            && let Some(position) = signing.secret_row.and_then(|n| positions.get(n))
        {
            // The secret stays in its own row alone: the replay reads it there.
            object.remove("secret");
            object.insert(REMEMBERED_SECRET_ROW.into(), (*position).into());
        }
        let remembered = Remembered {
            request_hash,
            status: StatusCode::CREATED.as_u16(),
            body: remembered,
        };
        idempotency::remember(&mut tx, &idempotency_scope, key, &remembered).await?;
    }
    tx.commit().await?;
    info!(subscription = %sub.id, tenant = %sub.tenant, url = %crate::config::shown_url(&sub.url), "Created subscription");
    Ok(created(StatusCode::CREATED, body, &sub.id))
}

/// One subscription.
#[utoipa::path(
    get, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = SubscriptionView),
        Unauthorized,
        NoSuchSubscription,
    )
)]
pub async fn read(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<SubscriptionView>, ApiError> {
    path_id(&id)?;
    let mut conn = state.pool.acquire().await?;
    view(&mut conn, &id, &scope)
        .await?
        .map(axum::Json)
        .ok_or(ApiError::NotFound)
}

/// Subscriptions the caller sees, by id, a page at a time.
#[utoipa::path(
    get, path = "/v1/subscriptions", tag = "subscriptions",
    params(ListQuery),
    responses(
        (status = 200, body = SubscriptionPage),
        Unauthorized,
        BadFilter,
    )
)]
pub async fn list(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::Json<SubscriptionPage>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::Invalid(vec![FieldError::new("(query)", e.body_text())]))?;
    let mut conn = state.pool.acquire().await?;
    list_page(&mut conn, &scope, &query).await.map(axum::Json)
}

/// Changes a subscription: URL, event types, enabled, max concurrency, rate, description;
/// headers, basic auth, OAuth2 and the client certificate each replaced whole (`null` removes).
#[utoipa::path(
    patch, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body = UpdateSubscription,
    responses(
        (status = 200, body = SubscriptionView),
        MalformedJson,
        Unauthorized,
        NoSuchSubscription,
        (status = 409, description = "Changed by other requests while this change was checked, again and again", body = Problem, content_type = "application/problem+json"),
        TooLarge,
        Invalid,
    )
)]
pub async fn update(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<SubscriptionView>, ApiError> {
    path_id(&id)?;
    let change: UpdateSubscription = json(body, None, state.max_body)?;
    // Read, checked (its names looked up, which may take seconds) and sealed with no connection
    // or lock held; written only if the row is still as it was read, else done again on what
    // it is now, so a change made meanwhile is kept.
    let types = change
        .event_types
        .as_ref()
        .and_then(|t| t.as_ref().map(Vec::len));
    for _ in 0..UPDATE_TRIES {
        let (current, version) = {
            let mut conn = state.pool.acquire().await?;
            store::find_versioned(&mut conn, &id, scope.tenant())
                .await?
                .ok_or(ApiError::NotFound)?
        };
        let current = validate::Checked::from_store(current)?;
        let changed = validate::update(current, change.clone(), &state.egress).await;
        let changed = quota::with_event_types(changed, types, state.limits.max_event_types)?;
        let sealed = seal_all(&state, &changed)?;
        let mut tx = state.pool.begin().await?;
        match store::lock_version(&mut tx, &id, scope.tenant()).await? {
            None => return Err(ApiError::NotFound),
            Some(now) if now != version => continue,
            Some(_) => {}
        }
        store::save(&mut tx, &changed.to_store(), &sealed).await?;
        let view = view(&mut tx, &id, &scope)
            .await?
            .ok_or(ApiError::NotFound)?;
        tx.commit().await?;
        info!(subscription = %id, "Updated subscription");
        return Ok(axum::Json(view));
    }
    Err(ApiError::Conflict(format!(
        "the subscription was changed by other requests while this change was checked, \
         {UPDATE_TRIES} times; send it again"
    )))
}

/// How many times a change is checked again because its subscription changed meanwhile,
/// before it is answered 409.
const UPDATE_TRIES: usize = 3;

/// Deletes a subscription. What waits for it is cancelled as `deleted` when it comes up.
#[utoipa::path(
    delete, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    responses(
        (status = 204, description = "Deleted"),
        Unauthorized,
        NoSuchSubscription,
    )
)]
pub async fn remove(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    path_id(&id)?;
    if store::delete(&state.pool, &id, scope.tenant()).await? {
        info!(subscription = %id, "Deleted subscription");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound)
    }
}

/// Unknown routes.
pub async fn no_route() -> ApiError {
    ApiError::NoRoute
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Logs a failure to return parked deliveries, which `hookrelay subscriptions resume` can
/// finish.
pub(super) fn log_parked_failure(id: &str, error: &dyn std::fmt::Display) {
    warn!(subscription = %id, error = %error, "Could not return the parked deliveries of a resumed subscription; `hookrelay subscriptions resume` returns them");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_opaque_and_round_trips() {
        let c = cursor_after("sub_42");
        assert!(!c.contains("sub_42"));
        assert_eq!(id_of_cursor(&c).unwrap(), "sub_42");
        assert!(id_of_cursor("!!").is_err());
    }
}
