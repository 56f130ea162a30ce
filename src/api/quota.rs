//! What one tenant may take of the API: subscriptions, entries of `event_types`, writes and
//! test events a minute, and of replays how many at once, how wide and how fast. The defaults
//! are `[api]`'s (see `crate::config::ApiConfig`). Admin tokens are the operator's: they are
//! held only to what bounds the store and the process (subscriptions per tenant, `event_types`,
//! replays running at once, the `only_undelivered` index), never to a pace.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sqlx::PgConnection;

use super::auth::Scope;
use super::problem::{ApiError, FieldError};
use super::{ApiState, keepalive};
use crate::config::ApiConfig;
use crate::units::Rate;

/// The API's limits, from `[api]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_subscriptions_per_tenant: u32,
    pub max_event_types: usize,
    pub writes_per_minute: u32,
    pub test_events_per_minute: u32,
    pub replays_running: usize,
    pub replays_per_tenant: usize,
    pub tenant_replay_window: Duration,
    pub tenant_replay_rate: Rate,
    pub replay_index_max: usize,
}

impl Limits {
    pub fn from_config(api: &ApiConfig) -> Self {
        Self {
            max_subscriptions_per_tenant: api.max_subscriptions_per_tenant,
            max_event_types: api.max_event_types,
            writes_per_minute: api.writes_per_minute,
            test_events_per_minute: api.test_events_per_minute,
            replays_running: api.replays_running,
            replays_per_tenant: api.replays_per_tenant,
            tenant_replay_window: api.tenant_replay_window,
            tenant_replay_rate: api.tenant_replay_rate,
            replay_index_max: api.replay_index_max,
        }
    }
}

/// `[api]`'s defaults.
impl Default for Limits {
    fn default() -> Self {
        Self::from_config(&ApiConfig::default())
    }
}

/// What a tenant's request spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Spend {
    /// A request that changes something: `api.writes_per_minute`.
    Write,
    /// A test event: `api.test_events_per_minute`.
    TestEvent,
}

impl Spend {
    fn what(self) -> &'static str {
        match self {
            Spend::Write => "writes",
            Spend::TestEvent => "test events",
        }
    }

    fn setting(self) -> &'static str {
        match self {
            Spend::Write => "api.writes_per_minute",
            Spend::TestEvent => "api.test_events_per_minute",
        }
    }
}

/// One tenant's allowance of one kind: a bucket of a minute's worth, refilled evenly.
#[derive(Debug)]
struct Bucket {
    left: f64,
    at: Instant,
}

/// Every tenant's allowances. A key per tenant that has a token, so it holds no more entries
/// than `api.tokens` names tenants, twice.
#[derive(Debug, Default)]
pub struct Pace(Mutex<HashMap<(Spend, String), Bucket>>);

impl Pace {
    /// Takes one of `tenant`'s `per_minute` at `now`; when none is left, how long until one is.
    pub fn take(
        &self,
        spend: Spend,
        tenant: &str,
        per_minute: u32,
        now: Instant,
    ) -> Result<(), Duration> {
        let full = f64::from(per_minute.max(1));
        let per_second = full / 60.0;
        let mut buckets = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry((spend, tenant.to_owned())).or_insert(Bucket {
            left: full,
            at: now,
        });
        let refilled = now.saturating_duration_since(bucket.at).as_secs_f64() * per_second;
        bucket.left = (bucket.left + refilled).min(full);
        bucket.at = now;
        if bucket.left >= 1.0 {
            bucket.left -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - bucket.left) / per_second))
    }
}

/// Holds a tenant's token to its writes and test events a minute: beyond, 429 with
/// `Retry-After`, before anything of the request is done (its body is read, so the connection
/// stays usable). Reads, and admin tokens, pass.
pub async fn limit(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let Some(Scope::Tenant(tenant)) = request.extensions().get::<Scope>() else {
        return next.run(request).await;
    };
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let test_event = request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|p| p.as_str() == "/v1/subscriptions/{id}/test");
    let spend = if test_event {
        Spend::TestEvent
    } else {
        Spend::Write
    };
    match take(&state, tenant, spend) {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            keepalive::drain(request.into_body(), state.max_body).await;
            refused.into_response()
        }
    }
}

/// Takes one of `tenant`'s writes or test events of this minute, or says when to try again:
/// what [`limit`] does for `/v1`, for the pages' forms.
pub fn take(state: &ApiState, tenant: &str, spend: Spend) -> Result<(), ApiError> {
    let per_minute = match spend {
        Spend::TestEvent => state.limits.test_events_per_minute,
        Spend::Write => state.limits.writes_per_minute,
    };
    state
        .pace
        .take(spend, tenant, per_minute, Instant::now())
        .map_err(|wait| ApiError::RateLimited {
            what: spend.what(),
            setting: spend.setting(),
            per_minute,
            // Whole seconds, rounded up: trying again then succeeds.
            retry_after: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        })
}

/// Refuses a subscription more for `tenant` once it has `max`. Holds a lock on the tenant's
/// count until the transaction `tx` is in ends, so concurrent creates cannot pass it together.
pub async fn check_subscriptions(
    tx: &mut PgConnection,
    tenant: &str,
    max: u32,
) -> Result<(), ApiError> {
    let count = crate::store::subscriptions::count_of_tenant_locked(tx, tenant).await?;
    if count >= i64::from(max) {
        return Err(ApiError::Quota(format!(
            "tenant {tenant:?} has {count} subscriptions, the most allowed \
             (api.max_subscriptions_per_tenant); delete one first"
        )));
    }
    Ok(())
}

/// `checked`, with one problem more when `event_types` had `given` entries, more than `max`.
pub fn with_event_types<T>(
    checked: Result<T, ApiError>,
    given: Option<usize>,
    max: usize,
) -> Result<T, ApiError> {
    let Some(given) = given.filter(|n| *n > max) else {
        return checked;
    };
    let problem = FieldError::new(
        "event_types",
        format!("{given} entries; at most {max} (api.max_event_types)"),
    );
    match checked {
        Err(ApiError::Invalid(mut problems)) => {
            problems.push(problem);
            Err(ApiError::Invalid(problems))
        }
        Err(other) => Err(other),
        Ok(_) => Err(ApiError::Invalid(vec![problem])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_spends_a_minute_s_worth_then_waits_for_the_next() {
        let pace = Pace::default();
        let start = Instant::now();
        for _ in 0..3 {
            assert!(pace.take(Spend::Write, "acme", 3, start).is_ok());
        }
        let wait = pace.take(Spend::Write, "acme", 3, start).unwrap_err();
        assert_eq!(wait, Duration::from_secs(20));
        // Others, and test events, are counted apart.
        assert!(pace.take(Spend::Write, "globex", 3, start).is_ok());
        assert!(pace.take(Spend::TestEvent, "acme", 3, start).is_ok());
        // One comes back every 20 s, and no more than a minute's worth builds up.
        assert!(
            pace.take(Spend::Write, "acme", 3, start + Duration::from_secs(10))
                .is_err()
        );
        assert!(
            pace.take(Spend::Write, "acme", 3, start + Duration::from_secs(20))
                .is_ok()
        );
        let later = start + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(pace.take(Spend::Write, "acme", 3, later).is_ok());
        }
        assert!(pace.take(Spend::Write, "acme", 3, later).is_err());
    }

    #[test]
    fn too_many_event_types_join_the_request_s_other_problems() {
        let ok: Result<(), ApiError> = Ok(());
        assert!(with_event_types(ok, Some(3), 3).is_ok());
        let Err(ApiError::Invalid(p)) = with_event_types(Ok(()), Some(4), 3) else {
            panic!("refused")
        };
        assert_eq!(p[0].field, "event_types");
        let other = Err(ApiError::Invalid(vec![FieldError::new("url", "bad")]));
        let Err(ApiError::Invalid(p)) = with_event_types::<()>(other, Some(4), 3) else {
            panic!("refused")
        };
        let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["url", "event_types"]);
    }
}
