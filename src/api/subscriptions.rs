//! The handlers of `/v1/subscriptions`: create (idempotent with `Idempotency-Key`), read, list,
//! update, delete, pause, resume, rotate the signing secret, send a test event.
//!
//! Bodies are read as bytes (so `api.max_body_bytes` answers 413) and parsed here, so every
//! refusal is a problem naming the field at fault. Nothing is written until all of a request is
//! checked.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::contract::envelope::{NewEvent, check_id};
use crate::contract::signing::{generate_key_pair, generate_secret};
use crate::store::postgres::{REMEMBERED_SEALED_SECRET, REMEMBERED_SECRET_ROW};
use crate::store::request as stored;
use crate::subscriptions::seal::Binding;
use crate::units::Rate;

use super::ApiState;
use super::auth::Scope;
use super::model::{
    CreateHeaders, CreateSubscription, CreatedSubscription, ListQuery, ResumeSubscription, Resumed,
    RotateSecret, RotatedSecret, SendTestEvent, SignatureScheme, SubscriptionPage,
    SubscriptionView, TestEventSent, UpdateSubscription,
};
use super::problem::{ApiError, FieldError, Problem};
use super::repo::{self, Remembered};
use super::{quota, validate};

pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// A JSON request body, or the problem with it. An empty body is `T::default()` when `empty`
/// allows one (the bodies of pause, resume, rotate and test are all optional).
pub(super) fn json<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty: Option<T>,
    max: usize,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge { max },
        _ => ApiError::BadRequest(rejection.body_text()),
    })?;
    let text = body.trim_ascii();
    // No body at all, or JSON's null: the optional body's defaults. Whitespace alone is not
    // JSON, and is answered as such.
    if (body.is_empty() || text == b"null")
        && let Some(default) = empty
    {
        return Ok(default);
    }
    // serde would read a struct from an array too (`[null, null]`): only an object is one.
    if !text.is_empty()
        && text[0] != b'{'
        && serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok()
    {
        return Err(ApiError::field("(body)", "expected a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(&body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_data() {
            let field = if path == "." {
                "(body)".to_owned()
            } else {
                path
            };
            // serde names an unknown field in its message; the path is where it was found.
            ApiError::Invalid(vec![FieldError::new(field, inner.to_string())])
        } else {
            ApiError::Malformed(inner.to_string())
        }
    })?;
    de.end().map_err(|e| ApiError::Malformed(e.to_string()))?;
    Ok(value)
}

/// An id in a path: one that could never be stored is simply not found.
fn path_id(id: &str) -> Result<(), ApiError> {
    check_id(id).map_err(|_| ApiError::NotFound)
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_HEADER) else {
        return Ok(None);
    };
    let bad = || {
        ApiError::Invalid(vec![FieldError::new(
            "Idempotency-Key",
            format!("1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"),
        )])
    };
    let key = value.to_str().map_err(|_| bad())?;
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY_LEN
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad());
    }
    Ok(Some(key.to_owned()))
}

/// New signing secrets, one per scheme: the rows to store, and what the answer shows once.
struct NewSecrets {
    rows: Vec<repo::NewSigning>,
    /// The `whsec_` secret, and which of `rows` holds it (an idempotent replay reads it there).
    secret: Option<String>,
    secret_row: Option<usize>,
    public_key: Option<String>,
}

fn new_signing(
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
                out.rows.push(repo::NewSigning {
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
                out.rows.push(repo::NewSigning {
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
    let Some(first) = repo::idempotency_lookup(tx, &scope, key).await? else {
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
        let (sealed, row_tenant) = repo::signing_secret(conn, &id, position)
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
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The id is taken (an admin token names ids; a tenant token's are generated), the tenant has api.max_subscriptions_per_tenant (quota-exceeded), or the secret of the subscription this Idempotency-Key created is gone", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
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
    let Some(positions) = repo::insert(&mut tx, &sub, &signing.rows, &sealed).await? else {
        return Err(ApiError::Conflict(format!(
            "a subscription with id {:?} exists already",
            sub.id
        )));
    };
    let view = repo::get(&mut tx, &sub.id, &Scope::Admin)
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
        repo::idempotency_remember(&mut tx, &idempotency_scope, key, &remembered).await?;
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
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such subscription, or another tenant's", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<SubscriptionView>, ApiError> {
    path_id(&id)?;
    let mut conn = state.pool.acquire().await?;
    repo::get(&mut conn, &id, &scope)
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
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad filter, limit or cursor", body = Problem, content_type = "application/problem+json"),
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
    repo::list(&mut conn, &scope, &query).await.map(axum::Json)
}

/// Changes a subscription: URL, event types, enabled, max concurrency, rate, description;
/// headers, basic auth, OAuth2 and the client certificate each replaced whole (`null` removes).
#[utoipa::path(
    patch, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body = UpdateSubscription,
    responses(
        (status = 200, body = SubscriptionView),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Changed by other requests while this change was checked, again and again", body = Problem, content_type = "application/problem+json"),
        (status = 413, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
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
            repo::find_versioned(&mut conn, &id, &scope)
                .await?
                .ok_or(ApiError::NotFound)?
        };
        let changed = validate::update(current, change.clone(), &state.egress).await;
        let changed = quota::with_event_types(changed, types, state.limits.max_event_types)?;
        let sealed = seal_all(&state, &changed)?;
        let mut tx = state.pool.begin().await?;
        match repo::lock_version(&mut tx, &id, &scope).await? {
            None => return Err(ApiError::NotFound),
            Some(now) if now != version => continue,
            Some(_) => {}
        }
        repo::save(&mut tx, &changed, &sealed).await?;
        let view = repo::get(&mut tx, &id, &scope)
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
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn remove(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    path_id(&id)?;
    if repo::delete(&state.pool, &id, &scope).await? {
        info!(subscription = %id, "Deleted subscription");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound)
    }
}

/// Sets `paused`, in one transaction; the view after, and whether this call changed it (the
/// row is locked, so of concurrent calls one alone does).
async fn set_paused(
    state: &ApiState,
    scope: &Scope,
    id: &str,
    paused: bool,
) -> Result<(SubscriptionView, bool), ApiError> {
    path_id(id)?;
    let mut tx = state.pool.begin().await?;
    let mut sub = repo::lock(&mut tx, id, scope)
        .await?
        .ok_or(ApiError::NotFound)?;
    let changed = sub.paused != paused;
    if changed {
        sub.paused = paused;
        repo::save(&mut tx, &sub, &[]).await?;
    }
    let view = repo::get(&mut tx, id, scope)
        .await?
        .ok_or(ApiError::NotFound)?;
    tx.commit().await?;
    Ok((view, changed))
}

/// Pauses a subscription: workers park its deliveries; nothing is attempted, cancelled or
/// charged until it is resumed.
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/pause", tag = "subscriptions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = SubscriptionView),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn pause(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<axum::Json<SubscriptionView>, ApiError> {
    let (view, _) = set_paused(&state, &scope, &id, true).await?;
    info!(subscription = %id, "Paused subscription");
    Ok(axum::Json(view))
}

/// Resumes a paused subscription, then returns its parked deliveries at `rate`: after
/// `api.resume_wait` (for the workers to see the change), in the background, with the mover
/// of `hookrelay subscriptions resume`. Only a resume that changes `paused` does that (one at a
/// time per subscription, on the API's one broker connection); resuming one that is not
/// paused changes nothing and answers `returning_parked: false`.
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/resume", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body(content = Option<ResumeSubscription>, description = "Optional"),
    responses(
        (status = 200, body = Resumed),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn resume(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Resumed>, ApiError> {
    let req: ResumeSubscription = json(body, Some(ResumeSubscription::default()), state.max_body)?;
    let rate = req
        .rate
        .as_deref()
        .map(str::parse::<Rate>)
        .transpose()
        .map_err(|e| ApiError::field("rate", e))?;
    let (view, changed) = set_paused(&state, &scope, &id, false).await?;
    let returning_parked = changed && state.return_parked(&id, rate);
    info!(subscription = %id, returning_parked, "Resumed subscription");
    Ok(axum::Json(Resumed {
        subscription: view,
        returning_parked,
    }))
}

/// Rotates the signing secret: a new one per scheme (those signing now, or `signatures`),
/// generated here and shown this once (a `v1a` key as its public key), signs from now on; the
/// current ones keep signing beside it until the time given (24 hours by default).
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/secrets/rotate", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body(content = Option<RotateSecret>, description = "Optional"),
    responses(
        (status = 200, description = "The new secret, shown this once", body = RotatedSecret),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn rotate(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<RotatedSecret>, ApiError> {
    path_id(&id)?;
    let req: RotateSecret = json(body, Some(RotateSecret::default()), state.max_body)?;
    let old_until = validate::overlap_end(&req, std::time::SystemTime::now())?;
    let mut tx = state.pool.begin().await?;
    let current = repo::lock(&mut tx, &id, &scope)
        .await?
        .ok_or(ApiError::NotFound)?;
    let schemes = match &req.signatures {
        Some(asked) => validate::schemes(Some(asked), "signatures")?,
        None => repo::signing_schemes(&mut tx, &id).await?,
    };
    let signing = new_signing(&state, &current.tenant, &id, &schemes)?;
    repo::rotate(&mut tx, &id, &signing.rows, old_until).await?;
    let view = repo::get(&mut tx, &id, &scope)
        .await?
        .ok_or(ApiError::NotFound)?;
    tx.commit().await?;
    let old_expires_at = humantime::format_rfc3339_millis(old_until).to_string();
    info!(subscription = %id, old_expires_at = %old_expires_at, "Rotated signing secret");
    Ok(axum::Json(RotatedSecret {
        secret: signing.secret,
        public_key: signing.public_key,
        old_expires_at,
        subscription: view,
    }))
}

/// Sends a test event to one subscription through the ingress exchange, as a producer would:
/// it is delivered, signed, retried and accounted like any other.
#[utoipa::path(
    post, path = "/v1/subscriptions/{id}/test", tag = "subscriptions",
    params(("id" = String, Path)),
    request_body(content = Option<SendTestEvent>, description = "Optional"),
    responses(
        (status = 202, description = "Published, confirmed by the broker", body = TestEventSent),
        (status = 400, body = Problem, content_type = "application/problem+json"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The subscription is disabled", body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The broker did not take it", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn send_test(
    State(state): State<ApiState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<TestEventSent>), ApiError> {
    path_id(&id)?;
    let req: SendTestEvent = json(body, Some(SendTestEvent::default()), state.max_body)?;
    let sub = {
        let mut conn = state.pool.acquire().await?;
        repo::find(&mut conn, &id, &scope)
            .await?
            .ok_or(ApiError::NotFound)?
    };
    if !sub.enabled {
        return Err(ApiError::Conflict(
            "the subscription is disabled: a test event would be cancelled; enable it first".into(),
        ));
    }
    let event_type = validate::test_event_type(req.event_type, &sub.event_types)?;
    if req
        .data
        .as_ref()
        .is_some_and(|d| !d.is_object() && !d.is_null())
    {
        return Err(ApiError::field("data", "expected a JSON object"));
    }
    let body = serde_json::json!({
        "type": event_type,
        "timestamp": crate::units::now_rfc3339(),
        "data": req.data.filter(|d| !d.is_null()).unwrap_or_else(|| serde_json::json!({})),
    });
    let event = NewEvent {
        id: format!("evt_test_{}", uuid::Uuid::new_v4().simple()),
        tenant: sub.tenant.clone(),
        event_type: event_type.clone(),
        subscription: Some(sub.id.clone()),
        timestamp: None,
        body: serde_json::to_vec(&body).map_err(ApiError::internal)?,
    };
    let envelope_id = state.publish(&event).await?;
    info!(subscription = %id, envelope = %envelope_id, "Sent test event");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(TestEventSent {
            envelope_id,
            event_type,
        }),
    ))
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
