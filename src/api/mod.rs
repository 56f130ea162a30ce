//! `hookrelay api`: the control plane's HTTP API, versioned under `/v1`, over the PostgreSQL
//! store that workers follow. Subscriptions are created, read, listed, changed, deleted, paused
//! and resumed through it; it generates signing secrets (stored sealed, shown once) and rotates
//! them with an overlap, and sends test events through the ingress exchange.
//!
//! - [`auth`]: bearer tokens, admin or scoped to a tenant.
//! - [`extract`]: a JSON body read from bytes, an id of a path, an `Idempotency-Key`.
//! - [`keepalive`]: `Connection: close` on an answer that left its request's body unread.
//! - [`problem`]: errors as RFC 9457 problem details, and the problem answers the handlers
//!   document.
//! - [`quota`]: what one tenant may take: subscriptions, writes and test events a minute, replays.
//! - [`model`]: the JSON it takes and answers.
//! - [`validate`]: the checks of the subscriptions file and the worker's egress policy.
//! - [`actions`]: pause, resume, rotate the signing secret, send a test event.
//! - [`subscriptions`]: the handlers of subscriptions, over [`crate::store::subscriptions`] and
//!   [`crate::store::idempotency`].
//! - [`event_types`]: the catalog of event types: every token reads it, an admin's writes it.
//! - [`history`]: an event's story and a subscription's attempts, from the history database.
//! - [`replays`]: replays of archived events, run as jobs of the API process.
//! - [`portal_links`]: one-time links into the tenant portal, and revoking its sessions.
//! - [`openapi`]: the OpenAPI document, generated from the handlers and types.

pub mod actions;
pub mod auth;
pub mod event_types;
pub mod extract;
pub mod history;
pub mod keepalive;
pub mod model;
pub mod openapi;
pub mod portal_links;
pub mod problem;
pub mod quota;
pub mod replays;
pub mod subscriptions;
pub mod validate;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use sqlx::PgPool;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::broker::management::Management;
use crate::broker::publish::{PublishError, Publisher};
use crate::config::SecretUrl;
use crate::contract::envelope::NewEvent;
use crate::contract::ladder::Ladder;
use crate::ops::mover::MoveOptions;
use crate::subscriptions::Subscriptions;
use crate::subscriptions::seal::Keyring;
use crate::units::Rate;

use auth::Tokens;
use problem::ApiError;
use validate::Egress;

/// How often a test event the broker returned as unroutable is published in all, and the pause
/// between: a binding just declared on a Khepri cluster routes within moments.
const UNROUTABLE_TRIES: u32 = 3;
const UNROUTABLE_PAUSE: Duration = Duration::from_millis(200);

/// What the API needs of the broker: test events and returning a resumed subscription's
/// parked deliveries.
#[derive(Debug, Clone)]
pub struct BrokerSetup {
    pub amqp_url: SecretUrl,
    pub confirm_timeout: Duration,
    pub ladder: Ladder,
    /// `limits.max_body_bytes`: a test event's body must fit it like any event.
    pub max_event_bytes: usize,
    /// `api.resume_wait`.
    pub resume_wait: Duration,
    /// The management API (`management.url`): the console reads the ladder's queues and holds
    /// tiers through it. `None`: the console's broker pages say it is not configured.
    pub management: Option<Management>,
}

/// Everything the API is built from.
#[derive(Debug)]
pub struct ApiSetup {
    pub pool: PgPool,
    pub keyring: Arc<Keyring>,
    pub tokens: Tokens,
    pub egress: Egress,
    /// `api.max_body_bytes`.
    pub max_body: usize,
    /// `None`: test events and replays are answered 503, and resumes leave parked deliveries
    /// to `hookrelay subscriptions resume`.
    pub broker: Option<BrokerSetup>,
    /// The history database (`history.database`, else the store's); `None`: the history
    /// routes are answered 503.
    pub history: Option<PgPool>,
    /// Per-tenant quotas and the bounds of replays (`[api]`).
    pub limits: quota::Limits,
    /// The pages' settings: where portal links point, how long sessions last, who may frame
    /// the portal.
    pub pages: PagesSetup,
}

/// The settings of the pages (`api.public_url`, `api.session_ttl`, `api.frame_ancestors`).
#[derive(Debug, Clone)]
pub struct PagesSetup {
    pub public_url: String,
    pub session_ttl: Duration,
    pub frame_ancestors: Vec<String>,
}

impl PagesSetup {
    pub fn from_config(api: &crate::config::ApiConfig) -> Self {
        Self {
            public_url: api.public_url.trim_end_matches('/').to_owned(),
            session_ttl: api.session_ttl,
            frame_ancestors: api.frame_ancestors.clone(),
        }
    }
}

impl Default for PagesSetup {
    fn default() -> Self {
        Self::from_config(&crate::config::ApiConfig::default())
    }
}

/// The handlers' shared state.
#[derive(Debug, Clone)]
pub struct ApiState(Arc<Shared>);

#[derive(Debug)]
pub struct Shared {
    pub pool: PgPool,
    pub keyring: Arc<Keyring>,
    pub egress: Egress,
    pub max_body: usize,
    broker: Option<BrokerSetup>,
    history: Option<PgPool>,
    limits: quota::Limits,
    pub pages: PagesSetup,
    /// The API's tokens: the console's sign-in takes an admin's.
    pub tokens: Tokens,
    /// Each tenant's writes and test events of the last minute.
    pace: quota::Pace,
    replays: Arc<replays::SharedJobs>,
    /// Connected at the first test event or resume, so the API serves without a broker. Its
    /// one connection carries the resumes' work too.
    publisher: OnceCell<Arc<Publisher>>,
    /// Subscriptions whose parked deliveries are being returned.
    returning: Returning,
    /// Resumes returning parked deliveries, and replays; waited for at shutdown.
    background: TaskTracker,
    /// Cancelled at shutdown: replays stop where they are.
    stop: CancellationToken,
}

/// Subscriptions whose parked deliveries are being returned, one run at a time each: a resume
/// that comes while one runs is remembered (with its rate) for a run after it.
#[derive(Debug, Default)]
struct Returning(Mutex<HashMap<String, Option<Option<Rate>>>>);

impl Returning {
    /// Whether the caller is to run; false when a run is under way, which then goes once more
    /// at `rate`.
    fn begin(&self, id: &str, rate: Option<Rate>) -> bool {
        let mut runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match runs.entry(id.to_owned()) {
            Entry::Occupied(mut run) => {
                *run.get_mut() = Some(rate);
                false
            }
            Entry::Vacant(free) => {
                free.insert(None);
                true
            }
        }
    }

    /// At the end of a run: the rate to run again at, when a resume came meanwhile; else the
    /// subscription is free.
    fn again(&self, id: &str) -> Option<Option<Rate>> {
        let mut runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let again = runs.get_mut(id).and_then(Option::take);
        if again.is_none() {
            runs.remove(id);
        }
        again
    }
}

impl Deref for ApiState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl ApiState {
    /// The broker's setup, when the API has one (the console's broker pages use it).
    pub fn broker(&self) -> Option<&BrokerSetup> {
        self.broker.as_ref()
    }

    /// The history database, when the API has one.
    pub fn history_pool(&self) -> Option<&PgPool> {
        self.history.as_ref()
    }

    /// The API's confirming publisher, connected at its first use.
    pub async fn publisher(&self) -> Result<(Arc<Publisher>, &BrokerSetup), ApiError> {
        let Some(broker) = &self.broker else {
            return Err(ApiError::Unavailable(
                "this API runs without a broker connection".into(),
            ));
        };
        let publisher = self
            .publisher
            .get_or_try_init(|| async {
                Publisher::connect(&broker.amqp_url, "hookrelay api", broker.confirm_timeout)
                    .await
                    .map(Arc::new)
            })
            .await
            .map_err(|e| ApiError::Unavailable(format!("the broker: {e}")))?;
        Ok((Arc::clone(publisher), broker))
    }

    /// Publishes `event` to the ingress exchange, confirmed; its envelope id.
    async fn publish(&self, event: &NewEvent) -> Result<String, ApiError> {
        let (publisher, broker) = self.publisher().await?;
        let ingress = broker.ladder.ingress();
        // With traces on, the test event's trace starts here.
        let span = crate::observe::traces::publish_span(&ingress, &event.id, None);
        // On a Khepri cluster a binding declared a moment ago may not route on every node yet:
        // a returned publish is tried again a few times before the caller is told.
        let mut tries = 0;
        let published = loop {
            tries += 1;
            match publisher
                .publish_event_in(&ingress, event, broker.max_event_bytes, span.context())
                .await
            {
                Err(PublishError::Unroutable { .. }) if tries < UNROUTABLE_TRIES => {
                    tokio::time::sleep(UNROUTABLE_PAUSE).await;
                }
                other => break other,
            }
        };
        published.map_err(|e| match e {
            PublishError::Invalid(invalid) => ApiError::field("data", invalid.to_string()),
            other => ApiError::Unavailable(format!(
                "the broker did not take the test event ({other}); try again"
            )),
        })
    }

    /// Starts returning `id`'s parked deliveries, after the workers have had time to see it
    /// resumed, unless a run for it is under way (which then goes once more); false when there
    /// is no broker to do it with.
    fn return_parked(&self, id: &str, rate: Option<Rate>) -> bool {
        let Some(broker) = self.broker.clone() else {
            return false;
        };
        if !self.returning.begin(id, rate) {
            return true;
        }
        let state = self.clone();
        let id = id.to_owned();
        self.background.spawn(async move {
            let mut rate = rate;
            loop {
                tokio::time::sleep(broker.resume_wait).await;
                if let Err(e) = state.move_parked(&broker, &id, rate).await {
                    subscriptions::log_parked_failure(&id, &e);
                }
                match state.returning.again(&id) {
                    Some(next) => rate = next,
                    None => break,
                }
            }
        });
        true
    }

    async fn move_parked(
        &self,
        broker: &BrokerSetup,
        id: &str,
        rate: Option<Rate>,
    ) -> anyhow::Result<()> {
        let paused = crate::store::subscriptions::paused(&self.pool, id).await?;
        if paused == Some(true) {
            info!(subscription = %id, "Paused again before its parked deliveries were returned; they stay parked");
            return Ok(());
        }
        let (publisher, _) = self.publisher().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        // The publisher's connection: the move's channels beside its publishes, no other.
        let conn = publisher.connection().await?;
        let options = MoveOptions {
            rate,
            ..Default::default()
        };
        // The store no longer pauses it (checked above), and a deleted one comes back to be
        // cancelled as deleted: nothing here for `check_resumable` to refuse.
        let resumed = crate::ops::pause::resume(
            &conn,
            &publisher,
            &broker.ladder,
            &Subscriptions::default(),
            id,
            &options,
            false,
        )
        .await?;
        info!(
            subscription = %id,
            returned = resumed.moved(),
            kept = resumed.kept(),
            parking_removed = resumed.removed,
            "Returned a resumed subscription's parked deliveries"
        );
        Ok(())
    }
}

/// The API's routes. `/v1/openapi.json` is public; everything else needs a token.
pub fn router(setup: ApiSetup) -> (Router, ApiState) {
    let state = ApiState(Arc::new(Shared {
        pool: setup.pool,
        keyring: setup.keyring,
        egress: setup.egress,
        max_body: setup.max_body,
        broker: setup.broker,
        history: setup.history,
        limits: setup.limits,
        pages: setup.pages,
        tokens: setup.tokens.clone(),
        pace: quota::Pace::default(),
        replays: Default::default(),
        publisher: OnceCell::new(),
        returning: Returning::default(),
        background: TaskTracker::new(),
        stop: CancellationToken::new(),
    }));
    use subscriptions as s;
    let guarded = Router::new()
        .route("/v1/subscriptions", post(s::create).get(s::list))
        .route(
            "/v1/subscriptions/{id}",
            get(s::read).patch(s::update).delete(s::remove),
        )
        .route("/v1/subscriptions/{id}/pause", post(actions::pause))
        .route("/v1/subscriptions/{id}/resume", post(actions::resume))
        .route(
            "/v1/subscriptions/{id}/secrets/rotate",
            post(actions::rotate),
        )
        .route("/v1/subscriptions/{id}/test", post(actions::send_test))
        .route("/v1/subscriptions/{id}/attempts", get(history::attempts))
        .route("/v1/events/{id}", get(history::event))
        .route("/v1/replays", post(replays::create))
        .route("/v1/replays/{id}", get(replays::read))
        .route("/v1/replays/{id}/cancel", post(replays::cancel))
        .route("/v1/event-types", get(event_types::list))
        .route(
            "/v1/event-types/{name}",
            get(event_types::read)
                .put(event_types::put)
                .delete(event_types::remove),
        )
        .route("/v1/portal-links", post(portal_links::create))
        .route("/v1/portal-sessions/revoke", post(portal_links::revoke))
        // Inside the token check (a layer wraps those before it): the scope is known.
        .route_layer(from_fn_with_state(state.clone(), quota::limit))
        .route_layer(from_fn_with_state(
            auth::Gate {
                tokens: setup.tokens,
                drain: setup.max_body,
            },
            auth::require_token,
        ));
    let app = guarded
        .route("/v1/openapi.json", get(openapi::serve))
        .fallback(s::no_route)
        .method_not_allowed_fallback(s::method_not_allowed)
        .layer(DefaultBodyLimit::max(setup.max_body))
        .layer(from_fn(keepalive::announce_close))
        .with_state(state.clone());
    (app, state)
}

/// How long a shutdown waits for resumes that are returning parked deliveries.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` completes, then lets requests in flight finish
/// and waits (within [`SHUTDOWN_GRACE`]) for background resumes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "Serving the API");
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    state.stop.cancel();
    state.background.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, state.background.wait())
        .await
        .is_err()
    {
        warn!(
            "Stopped with parked deliveries still being returned; `hookrelay subscriptions resume` finishes that"
        );
    }
    if let Some(publisher) = state.publisher.get() {
        publisher.close().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_is_returned_by_one_run_at_a_time_and_no_resume_is_lost() {
        let returning = Returning::default();
        let slow: Rate = "1/s".parse().unwrap();
        let fast: Rate = "100/s".parse().unwrap();
        assert!(returning.begin("sub_a", None));
        // Resumes while it runs: none runs beside it; the last one's rate goes next.
        assert!(!returning.begin("sub_a", Some(slow)));
        assert!(!returning.begin("sub_a", Some(fast)));
        assert!(
            returning.begin("sub_b", None),
            "another subscription is not held up"
        );
        assert_eq!(returning.again("sub_a"), Some(Some(fast)));
        assert_eq!(returning.again("sub_a"), None);
        assert!(returning.begin("sub_a", None), "free once its run ended");
        assert_eq!(returning.again("sub_b"), None);
    }
}
