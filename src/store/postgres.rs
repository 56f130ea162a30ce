//! The PostgreSQL store: its schema (versioned migrations in `migrations/`, applied by
//! `hookrelay store migrate`, checked at worker start), loading subscriptions into the same
//! [`Subscriptions`] the file gives, the writes the importer makes, pausing and disabling, and
//! resealing secrets. The API's reads and writes are [`super::subscriptions`]'s.
//!
//! Every row is validated as a file entry is; a row that does not validate (written by hand,
//! say) is left out with its problem reported, never half-used.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};

use crate::config::ReferenceError;
use crate::contract::envelope::{check_id, check_tenant};
use crate::subscriptions::{
    PayloadFilter, SealedSecret, SecretRef, SecretSpec, Subscription, Subscriptions,
    parse::parse_destination, parse::parse_event_types,
};
use crate::units::Rate;

use super::request::{self, RequestParts, StoredRequest};
use crate::subscriptions::seal::{Binding, Keyring};

/// The schema, embedded: `migrations/NNNN_name.sql`.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The channel the triggers notify with a subscription id when it changes.
pub const CHANNEL: &str = "hookrelay_subscriptions";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot reach the subscription store at {shown}: {source}; check the URL in \
         `subscriptions` and that PostgreSQL answers"
    )]
    Unreachable { shown: String, source: sqlx::Error },
    #[error(
        "the subscription store's schema lacks migration(s) {missing}: run `hookrelay store \
         migrate` (with the same `subscriptions` URL)"
    )]
    Behind { missing: String },
    #[error(
        "the subscription store's schema has migration(s) {unknown} this hookrelay does not know: \
         a newer hookrelay migrated it; run that version"
    )]
    Ahead { unknown: String },
    #[error("subscription store: {0}")]
    Query(#[from] sqlx::Error),
    #[error("subscription store migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("reading the subscription store was interrupted: {0}")]
    Interrupted(String),
}

/// A row left out of the snapshot, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowProblem {
    pub id: String,
    pub message: String,
}

impl std::fmt::Display for RowProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "subscription {:?} in the store: {}",
            self.id, self.message
        )
    }
}

/// A connection pool to the store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    shown: String,
}

pub(super) const SUBSCRIPTION_COLUMNS: &str =
    "id, tenant, url, event_types, enabled, paused, max_concurrent, rate, request, payload_filter";
/// A secret's row with its subscription's tenant: a sealed value opens only for the tenant,
/// subscription and purpose it was sealed for.
pub(super) const SECRET_COLUMNS: &str = "x.subscription_id, x.purpose, x.reference, x.sealed, \
     (extract(epoch from x.expires_at) * 1000)::int8 AS expires_ms, s.tenant";
pub(super) const SECRETS_WITH_TENANT: &str =
    "subscription_secrets x JOIN subscriptions s ON s.id = x.subscription_id";

impl PgStore {
    /// Connects (lazily for the pool's later connections); fails if the first does not open
    /// within `timeout`.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let shown = crate::config::Source::Postgres(url.to_owned()).shown();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(timeout)
            .connect(url)
            .await
            .map_err(|source| StoreError::Unreachable {
                shown: shown.clone(),
                source,
            })?;
        Ok(Self { pool, shown })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The same store through a pool of its own, of at most `connections`, opened as they are
    /// needed: what reads through it never waits for this pool's connections (one of which a
    /// change follower's listener keeps), nor holds them.
    pub fn with_own_pool(&self, connections: u32) -> Self {
        let pool = PgPoolOptions::new()
            .max_connections(connections.max(1))
            .acquire_timeout(self.pool.options().get_acquire_timeout())
            .connect_lazy_with((*self.pool.connect_options()).clone());
        Self {
            pool,
            shown: self.shown.clone(),
        }
    }

    /// The URL without its password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Applies the migrations not applied yet; returns their versions and descriptions.
    pub async fn migrate(&self) -> Result<Vec<(i64, String)>, StoreError> {
        let before = self.applied().await?;
        MIGRATOR.run(&self.pool).await?;
        Ok(MIGRATOR
            .iter()
            .filter(|m| !before.contains(&m.version))
            .map(|m| (m.version, m.description.to_string()))
            .collect())
    }

    /// The versions applied, none when the store was never migrated.
    pub async fn applied(&self) -> Result<Vec<i64>, StoreError> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&self.pool)
            .await?;
        if !exists {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar(
            "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The schema must be exactly what this hookrelay knows: a worker refuses to start
    /// otherwise, with what to do.
    pub async fn check_schema(&self) -> Result<(), StoreError> {
        let applied = self.applied().await?;
        let known: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
        let missing: Vec<String> = known
            .iter()
            .filter(|v| !applied.contains(v))
            .map(ToString::to_string)
            .collect();
        if !missing.is_empty() {
            return Err(StoreError::Behind {
                missing: missing.join(", "),
            });
        }
        let unknown: Vec<String> = applied
            .iter()
            .filter(|v| !known.contains(v))
            .map(ToString::to_string)
            .collect();
        if !unknown.is_empty() {
            return Err(StoreError::Ahead {
                unknown: unknown.join(", "),
            });
        }
        Ok(())
    }

    /// A read-only transaction in which both tables are read at one point in time.
    pub(super) async fn snapshot(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// Every subscription, and the rows left out.
    pub async fn load_all(&self) -> Result<(Subscriptions, Vec<RowProblem>), StoreError> {
        let mut tx = self.snapshot().await?;
        let rows = sqlx::query(&format!("SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions"))
            .fetch_all(&mut *tx)
            .await?;
        let secrets = sqlx::query(&format!(
            "SELECT {SECRET_COLUMNS} FROM {SECRETS_WITH_TENANT} \
             ORDER BY x.subscription_id, x.position DESC"
        ))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        // Off the runtime's threads: a store may hold 100,000 rows to validate and index, and
        // the worker delivers meanwhile.
        tokio::task::spawn_blocking(move || {
            let (list, problems) = build(&rows, &secrets);
            (Subscriptions::from_list(list), problems)
        })
        .await
        .map_err(|e| StoreError::Interrupted(e.to_string()))
    }

    /// The subscriptions `ids` as they are now: `None` for one that no longer exists (or whose
    /// row does not validate: its problem is in the second list).
    #[allow(clippy::type_complexity)]
    pub async fn load_some(
        &self,
        ids: &[String],
    ) -> Result<(Vec<(String, Option<Subscription>)>, Vec<RowProblem>), StoreError> {
        let mut tx = self.snapshot().await?;
        let rows = sqlx::query(&format!(
            "SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE id = ANY($1)"
        ))
        .bind(ids)
        .fetch_all(&mut *tx)
        .await?;
        let secrets = sqlx::query(&format!(
            "SELECT {SECRET_COLUMNS} FROM {SECRETS_WITH_TENANT} \
             WHERE x.subscription_id = ANY($1) ORDER BY x.subscription_id, x.position DESC"
        ))
        .bind(ids)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let (list, problems) = build(&rows, &secrets);
        let mut found: HashMap<String, Subscription> =
            list.into_iter().map(|s| (s.id.clone(), s)).collect();
        let changes = ids
            .iter()
            .map(|id| (id.clone(), found.remove(id)))
            .collect();
        Ok((changes, problems))
    }

    /// Writes `subscription` as the file describes it (references, not sealed secrets),
    /// changing nothing when the store already says the same: importing a file twice is a
    /// no-op, and workers are not notified of it. Returns whether anything changed.
    pub async fn put_from_file(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        sub: &Subscription,
        existing: Option<&Subscription>,
    ) -> Result<bool, StoreError> {
        if existing.is_some_and(|e| e == sub) {
            return Ok(false);
        }
        let event_types: Option<Vec<String>> = sub
            .event_types
            .as_ref()
            .map(|f| f.iter().map(ToString::to_string).collect());
        let max_concurrent = sub
            .max_concurrent
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let (request, request_secrets) = StoredRequest::of(&RequestParts::of(sub));
        let request = serde_json::to_value(&request).map_err(|e| {
            StoreError::Interrupted(format!("the request settings of {}: {e}", sub.id))
        })?;
        sqlx::query(
            "INSERT INTO subscriptions (id, tenant, url, event_types, enabled, paused, \
             max_concurrent, rate, request, payload_filter) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (id) DO UPDATE SET tenant = $2, url = $3, event_types = $4, \
             enabled = $5, paused = $6, max_concurrent = $7, rate = $8, request = $9, \
             payload_filter = $10, updated_at = now()",
        )
        .bind(&sub.id)
        .bind(&sub.tenant)
        .bind(sub.url.as_str())
        .bind(event_types)
        .bind(sub.enabled)
        .bind(sub.paused)
        .bind(max_concurrent)
        .bind(sub.rate.map(|r| r.to_string()))
        .bind(request)
        .bind(
            sub.payload_filter
                .as_ref()
                .map(|f| sqlx::types::Json(f.as_json())),
        )
        .execute(&mut **tx)
        .await?;
        // The other purposes' references, written whole each time: they are few.
        sqlx::query(
            "DELETE FROM subscription_secrets WHERE subscription_id = $1 AND purpose <> 'signing'",
        )
        .bind(&sub.id)
        .execute(&mut **tx)
        .await?;
        for (purpose, reference) in request_secrets {
            let (reference, sealed) = match &reference {
                SecretRef::Sealed(s) => (None, Some(s.sealed.to_vec())),
                other => (Some(other.to_string()), None),
            };
            sqlx::query(
                "INSERT INTO subscription_secrets (subscription_id, purpose, reference, sealed) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(&sub.id)
            .bind(purpose)
            .bind(reference)
            .bind(sealed)
            .execute(&mut **tx)
            .await?;
        }
        if existing.is_none_or(|e| e.secrets != sub.secrets) {
            sqlx::query(
                "DELETE FROM subscription_secrets WHERE subscription_id = $1 AND purpose = 'signing'",
            )
                .bind(&sub.id)
                .execute(&mut **tx)
                .await?;
            // Oldest first, so the newest gets the highest position.
            for spec in sub.secrets.iter().rev() {
                let (reference, sealed) = match &spec.reference {
                    SecretRef::Sealed(s) => (None, Some(s.sealed.to_vec())),
                    other => (Some(other.to_string()), None),
                };
                sqlx::query(
                    "INSERT INTO subscription_secrets (subscription_id, reference, sealed, \
                     expires_at) VALUES ($1, $2, $3, to_timestamp($4::float8 / 1000))",
                )
                .bind(&sub.id)
                .bind(reference)
                .bind(sealed)
                .bind(spec.expires.map(epoch_ms))
                .execute(&mut **tx)
                .await?;
            }
        }
        Ok(true)
    }
}

pub(super) fn epoch_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Why a stored row is left out of the snapshot. The row is at fault (written by hand, say):
/// it is reported and the others are used; reading it again does not help until it is
/// corrected.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    /// A column of the subscription that does not read as the schema says.
    #[error("{name}: {error}")]
    Column {
        name: &'static str,
        error: sqlx::Error,
    },
    /// A column of a secret's row that does not read.
    #[error("{0}")]
    SecretColumn(sqlx::Error),
    /// A value that does not check as a file's entry would.
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("id {0:?}: expected 1 to 128 letters, digits, '_' or '-'")]
    Id(String),
    /// A secret's reference that does not parse.
    #[error("{0}")]
    Reference(ReferenceError),
    #[error("a secret row needs a reference or a sealed value, not both")]
    ReferenceAndSealed,
    #[error("secrets: none; at least one is needed to sign deliveries")]
    NoSigningSecret,
    /// A secret of the row, by what it is for (`secrets` for the signing ones).
    #[error("{purpose}: {error}")]
    Secret {
        purpose: String,
        error: Box<RowError>,
    },
    #[error(transparent)]
    Request(#[from] request::AssembleError),
}

impl RowError {
    fn invalid(field: &'static str, message: impl ToString) -> Self {
        Self::Invalid {
            field,
            message: message.to_string(),
        }
    }
}

/// A subscription's secrets as read: the signing ones newest first, the others by purpose.
#[derive(Default)]
struct SecretRows {
    signing: Vec<Result<SecretSpec, RowError>>,
    other: Vec<(String, Result<SecretSpec, RowError>)>,
}

/// Rows into subscriptions: secrets grouped by subscription (newest first, as queried), each
/// row validated like a file entry.
pub(super) fn build(rows: &[PgRow], secrets: &[PgRow]) -> (Vec<Subscription>, Vec<RowProblem>) {
    let mut by_sub: HashMap<String, SecretRows> = HashMap::new();
    for row in secrets {
        let Ok(sub_id) = row.try_get::<String, _>("subscription_id") else {
            continue;
        };
        let purpose: String = row
            .try_get("purpose")
            .unwrap_or_else(|_| request::SIGNING.into());
        let entry = by_sub.entry(sub_id.clone()).or_default();
        if purpose == request::SIGNING {
            entry.signing.push(secret(row, &sub_id, &purpose));
        } else {
            let spec = secret(row, &sub_id, &purpose);
            entry.other.push((purpose, spec));
        }
    }
    let mut list = Vec::with_capacity(rows.len());
    let mut problems = Vec::new();
    for row in rows {
        let id: String = row.try_get("id").unwrap_or_default();
        match subscription(row, by_sub.remove(&id).unwrap_or_default()) {
            Ok(sub) => list.push(sub),
            Err(e) => problems.push(RowProblem {
                id,
                message: e.to_string(),
            }),
        }
    }
    (list, problems)
}

fn secret(row: &PgRow, sub_id: &str, purpose: &str) -> Result<SecretSpec, RowError> {
    let reference: Option<String> = row.try_get("reference").map_err(RowError::SecretColumn)?;
    let sealed: Option<Vec<u8>> = row.try_get("sealed").map_err(RowError::SecretColumn)?;
    let expires_ms: Option<i64> = row.try_get("expires_ms").map_err(RowError::SecretColumn)?;
    let reference = match (reference, sealed) {
        (Some(r), None) => SecretRef::parse(&r).map_err(RowError::Reference)?,
        (None, Some(bytes)) => {
            let tenant: String = row.try_get("tenant").map_err(RowError::SecretColumn)?;
            SecretRef::Sealed(SealedSecret {
                binding: Binding::new(&tenant, sub_id, purpose),
                sealed: Arc::from(bytes),
            })
        }
        _ => return Err(RowError::ReferenceAndSealed),
    };
    let expires = expires_ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0).unsigned_abs()));
    Ok(SecretSpec { reference, expires })
}

fn subscription(row: &PgRow, secrets: SecretRows) -> Result<Subscription, RowError> {
    let SecretRows {
        signing: secrets,
        other,
    } = secrets;
    let field = |name: &'static str| move |error: sqlx::Error| RowError::Column { name, error };
    let id: String = row.try_get("id").map_err(field("id"))?;
    check_id(&id).map_err(|_| RowError::Id(id.clone()))?;
    let tenant: String = row.try_get("tenant").map_err(field("tenant"))?;
    check_tenant(&tenant).map_err(|e| RowError::invalid("tenant", e))?;
    let url: String = row.try_get("url").map_err(field("url"))?;
    let url = parse_destination(&url).map_err(|e| RowError::invalid("url", e))?;
    let event_types: Option<Vec<String>> =
        row.try_get("event_types").map_err(field("event_types"))?;
    let event_types = event_types
        .map(|t| parse_event_types(&t))
        .transpose()
        .map_err(|e| RowError::invalid("event_types", e.join("; ")))?;
    let rate: Option<String> = row.try_get("rate").map_err(field("rate"))?;
    let rate = rate
        .map(|r| r.parse::<Rate>())
        .transpose()
        .map_err(|e| RowError::invalid("rate", e))?;
    let max_concurrent: Option<i32> = row
        .try_get("max_concurrent")
        .map_err(field("max_concurrent"))?;
    let secrets = secrets
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RowError::Secret {
            purpose: "secrets".into(),
            error: Box::new(e),
        })?;
    if secrets.is_empty() {
        return Err(RowError::NoSigningSecret);
    }
    let request: sqlx::types::Json<StoredRequest> =
        row.try_get("request").map_err(field("request"))?;
    let payload_filter: Option<serde_json::Value> = row
        .try_get("payload_filter")
        .map_err(field("payload_filter"))?;
    let payload_filter = payload_filter
        .map(|f| PayloadFilter::compile(&f))
        .transpose()
        .map_err(|e| RowError::invalid("payload_filter", e))?;
    let mut by_purpose = HashMap::new();
    for (purpose, spec) in other {
        let spec = spec.map_err(|e| RowError::Secret {
            purpose: purpose.clone(),
            error: Box::new(e),
        })?;
        // Newest first, as queried: the first of a purpose is the one in force.
        by_purpose.entry(purpose).or_insert(spec.reference);
    }
    let parts = request.0.assemble(&url, &by_purpose)?;
    Ok(Subscription {
        id,
        tenant,
        url,
        event_types,
        secrets,
        enabled: row.try_get("enabled").map_err(field("enabled"))?,
        paused: row.try_get("paused").map_err(field("paused"))?,
        max_concurrent: max_concurrent
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0),
        rate,
        headers: parts.headers,
        basic_auth: parts.basic_auth,
        oauth2: parts.oauth2,
        tls: parts.tls,
        amqp: parts.amqp,
        payload_filter,
        trace_context: parts.trace_context,
    })
}

/// How many secrets the store holds, of each kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SecretCounts {
    pub references: usize,
    pub sealed: usize,
}

pub async fn secret_counts(store: &PgStore) -> Result<SecretCounts, StoreError> {
    let (references, sealed): (i64, i64) =
        sqlx::query_as("SELECT count(reference), count(sealed) FROM subscription_secrets")
            .fetch_one(store.pool())
            .await?;
    Ok(SecretCounts {
        references: usize::try_from(references).unwrap_or(0),
        sealed: usize::try_from(sealed).unwrap_or(0),
    })
}

/// How many sealed secrets are sealed with the keyring's first key.
pub async fn sealed_with(store: &PgStore, ring: &Keyring) -> Result<usize, StoreError> {
    let rows: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT sealed FROM subscription_secrets WHERE sealed IS NOT NULL")
            .fetch_all(store.pool())
            .await?;
    Ok(rows.iter().filter(|s| ring.is_current(s)).count())
}

/// What [`reseal`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resealed {
    /// Sealed values sealed again with the first key, in the current form.
    pub secrets: usize,
    /// Remembered create answers that held their secret and now refer to its row.
    pub answers: usize,
}

/// Seals every sealed value not sealed with the first key in the current form (bound to its
/// tenant, subscription and purpose) again, whatever its purpose; and turns the remembered
/// create answers that hold their secret sealed into answers that refer to the secret's row.
/// One transaction: a value that does not open with any key of the ring stops it, nothing is
/// changed, and the error names its subscription.
pub async fn reseal(store: &PgStore, ring: &Keyring) -> Result<Resealed, ResealError> {
    let mut tx = store.pool().begin().await.map_err(StoreError::from)?;
    let rows: Vec<(String, i64, String, String, Vec<u8>)> = sqlx::query_as(
        "SELECT x.subscription_id, x.position, x.purpose, s.tenant, x.sealed \
         FROM subscription_secrets x JOIN subscriptions s ON s.id = x.subscription_id \
         WHERE x.sealed IS NOT NULL FOR UPDATE OF x",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    let mut done = Resealed::default();
    for (id, position, purpose, tenant, sealed) in rows {
        if ring.is_current(&sealed) {
            continue;
        }
        let binding = Binding::new(&tenant, &id, &purpose);
        let secret = ring
            .open(&binding, &sealed)
            .map_err(|e| ResealError::open(&id, e))?;
        let again = ring
            .seal(&binding, &secret)
            .map_err(|e| ResealError::open(&id, e))?;
        sqlx::query(
            "UPDATE subscription_secrets SET sealed = $3 \
             WHERE subscription_id = $1 AND position = $2",
        )
        .bind(&id)
        .bind(position)
        .bind(again)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        done.secrets += 1;
    }
    done.answers = super::idempotency::refer_remembered_secrets(&mut tx, ring).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(done)
}

#[derive(Debug, thiserror::Error)]
pub enum ResealError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the sealed secret of subscription {id:?}: {message}; nothing was changed")]
    Open { id: String, message: String },
    #[error(
        "the answer remembered for Idempotency-Key {key:?} ({scope}): {message}; nothing was \
         changed"
    )]
    Answer {
        scope: String,
        key: String,
        message: String,
    },
}

impl ResealError {
    pub(super) fn open(id: &str, error: crate::subscriptions::seal::SealError) -> Self {
        Self::Open {
            id: id.to_owned(),
            message: error.to_string(),
        }
    }
}

/// Sets `paused` of a subscription; `None` when there is no such subscription, else whether
/// it changed.
pub async fn set_paused(
    store: &PgStore,
    id: &str,
    paused: bool,
) -> Result<Option<bool>, StoreError> {
    let exists: Option<bool> = sqlx::query_scalar("SELECT paused FROM subscriptions WHERE id = $1")
        .bind(id)
        .fetch_optional(store.pool())
        .await?;
    match exists {
        None => Ok(None),
        Some(now) if now == paused => Ok(Some(false)),
        Some(_) => {
            // Resuming clears why hookrelay had disabled it, if it had.
            sqlx::query(
                "UPDATE subscriptions SET paused = $2, updated_at = now(), \
                 disabled_reason = CASE WHEN $2 THEN disabled_reason END WHERE id = $1",
            )
            .bind(id)
            .bind(paused)
            .execute(store.pool())
            .await?;
            Ok(Some(true))
        }
    }
}

/// Pauses the enabled, unpaused subscriptions among `ids` with `reason` (hookrelay disabling
/// the subscriptions of an endpoint failing for `endpoints.disable_after`); returns the (id,
/// tenant) of those this call changed.
pub async fn disable(
    store: &PgStore,
    ids: &[String],
    reason: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    Ok(sqlx::query_as(
        "UPDATE subscriptions SET paused = true, disabled_reason = $2, updated_at = now() \
         WHERE id = ANY($1) AND enabled AND NOT paused RETURNING id, tenant",
    )
    .bind(ids)
    .bind(reason)
    .fetch_all(store.pool())
    .await?)
}
