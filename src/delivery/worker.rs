//! The worker: consumes the ready lanes and hands every delivery to [`crate::delivery::dispatch`] in a task
//! of its own, the moment the broker hands it over, so each channel's prefetch is the
//! concurrency bound and the broker's `consumer_timeout` measures real work. The shards of a
//! sharded ladder are the exception: their prefetches add up to twice the budget so an idle
//! shard's share is not wasted, and a worker-wide semaphore of the budget bounds what is
//! processed at once (see [`lane_specs`]); a delivery waits there at most for the ones handed
//! over before it.
//!
//! The lanes are the ladder's (shared, or its shards, and dedicated) and those the ladder no
//! longer routes to that still exist (tenants no longer dedicated, shards of another shard
//! count), found through the management API at start and at every poll of it. A lane
//! whose queue is deleted ends alone (the broker cancels its consumer); the session goes on.
//!
//! It reconnects with backoff when the broker connection drops, keeps the subscriptions file in
//! force as it changes (polling and SIGHUP), and on shutdown stops consuming, lets in-flight
//! deliveries finish, and returns.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::broker::error::{Refusal, refused};
use crate::broker::management::Management;
use crate::broker::publish::{PublishError, Publisher};
use crate::config::Config;
use crate::contract::ladder::Ladder;
use crate::contract::ladder::QueueRole;
use crate::delivery::dispatch::Dispatcher;
use crate::delivery::egress::{EgressPolicy, Lookup, SystemLookup};
use crate::delivery::http::HttpSender;
use crate::delivery::lane::{Lane, LaneKind, LaneSpec, Lanes, SharedBudget};
use crate::delivery::poll::QueuePoll;
use crate::observe::events::{Notices, OperationalEvent};
use crate::observe::metrics::Metrics;
use crate::subscriptions::{
    LiveSubscriptions, Reload, SecretStore, SubscriptionError, SubscriptionErrors, Subscriptions,
};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start: {0}")]
    Publisher(#[from] PublishError),
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("{0}")]
    Config(String),
    #[error(
        "secret references do not resolve, so deliveries could not be signed:\n{0}\n\
         Set the variables or create the files, or fix the subscriptions file"
    )]
    Secrets(String),
    #[error("cannot consume from the broker: {0}")]
    Consume(String),
    #[error("{0}")]
    Listen(#[from] std::io::Error),
}

/// What a worker is made of. [`WorkerSetup::new`] fills in the production defaults; tests swap
/// the resolver or the secret store.
pub struct WorkerSetup {
    pub config: Config,
    pub ladder: Ladder,
    pub subscriptions: LiveSubscriptions,
    pub secrets: SecretStore,
    /// Name resolution for endpoints (the egress policy checks what it returns).
    pub lookup: Arc<dyn Lookup>,
    /// Labels the worker's connections in the management UI: `<name> consume`, `<name> publish`.
    pub name: String,
    /// The PostgreSQL store `subscriptions` was loaded from, which the worker follows; `None`
    /// for a file (reloaded as it changes) or fixed subscriptions.
    pub store: Option<crate::store::follow::Following>,
}

impl WorkerSetup {
    pub fn new(config: Config, ladder: Ladder, subscriptions: LiveSubscriptions) -> Self {
        Self {
            secrets: SecretStore::new(config.secrets.refresh),
            config,
            ladder,
            subscriptions,
            lookup: Arc::new(SystemLookup),
            name: "hookrelay-worker".into(),
            store: None,
        }
    }
}

/// A configured worker, connected for publishing and ready to [`Worker::run`].
pub struct Worker {
    dispatcher: Arc<Dispatcher>,
    notices_task: tokio::task::JoinHandle<()>,
    /// Registered at start, so a SIGHUP that arrives before `run` is not the default (fatal).
    hangup: Option<Hangup>,
    vitals: Option<tokio::net::TcpListener>,
    name: String,
    lanes: Lanes,
    /// The queues the management API last listed (`None`: not known), which tells sessions
    /// which lanes of tenants no longer dedicated exist. Filled at start and by every poll of
    /// the management API (`metrics.poll_interval`).
    queues: tokio::sync::watch::Sender<Option<Vec<String>>>,
    store: Option<crate::store::follow::Following>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How a broker session ended.
enum SessionEnd {
    /// Shutdown was asked for; the whole drain must end by `deadline` (`worker.shutdown_grace`
    /// after the signal).
    Shutdown { deadline: Instant },
    /// The connection or a consumer failed; `connected` says whether it got as far as consuming.
    Failed { error: String, connected: bool },
}

/// The subscriptions' secrets must resolve before they are put in force.
fn check_secrets(
    secrets: &SecretStore,
    subscriptions: &Subscriptions,
) -> Result<(), SubscriptionErrors> {
    let unresolved = secrets.unresolved(subscriptions);
    if unresolved.is_empty() {
        return Ok(());
    }
    Err(SubscriptionErrors(
        unresolved
            .into_iter()
            .map(|(sub, e)| SubscriptionError {
                path: "(subscriptions)".into(),
                line: 0,
                field: format!("subscription {sub}: secrets"),
                message: e.to_string(),
            })
            .collect(),
    ))
}

impl Worker {
    /// Checks that every secret resolves and connects the publishing side.
    pub async fn start(setup: WorkerSetup) -> Result<Self, WorkerError> {
        let WorkerSetup {
            config,
            ladder,
            subscriptions,
            secrets,
            lookup,
            name,
            store,
        } = setup;
        config
            .validate()
            .map_err(|e| WorkerError::Config(e.to_string()))?;
        // A shard's delivery may wait about one attempt for a permit before its own attempt.
        let held = config.lease_window() + config.attempt_budget();
        if ladder.shards > 1 && held >= config.broker.consumer_timeout {
            return Err(WorkerError::Config(format!(
                "broker.consumer_timeout ({}) must exceed {} with a sharded ladder: a delivery may \
                 wait one attempt for the shared budget, then make its own",
                crate::units::fmt_duration(config.broker.consumer_timeout),
                crate::units::fmt_duration(held)
            )));
        }
        if let Err(errors) = check_secrets(&secrets, &subscriptions.current()) {
            return Err(WorkerError::Secrets(
                errors
                    .0
                    .iter()
                    .map(|e| format!("  {}: {}", e.field, e.message))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
        }
        let policy = EgressPolicy::from_config(&config.egress);
        let http = HttpSender::new(&config.http, Arc::new(policy), lookup)?;
        let publisher = Arc::new(
            Publisher::connect(
                &config.amqp.url,
                &format!("{name} publish"),
                config.amqp.confirm_timeout,
            )
            .await?,
        );
        let vitals = crate::observe::vitals::bind(config.metrics.listen).await?;
        let metrics = Metrics::new();
        // Notices have a connection of their own: their confirms and returns (nobody may bind
        // the events exchange) stay apart from the republishes the lanes wait on.
        let notice_publisher = Arc::new(
            Publisher::connect(
                &config.amqp.url,
                &format!("{name} notices"),
                config.amqp.confirm_timeout,
            )
            .await?,
        );
        let (notices, notices_task) = Notices::start(
            notice_publisher,
            ladder.events_exchange(),
            ladder.attempts_exchange(),
            metrics.clone(),
        );
        let listed = list_queues(&config).await;
        let queues = tokio::sync::watch::Sender::new(
            listed.map(|queues| queues.into_iter().map(|q| q.name).collect()),
        );
        let (first_budget, retry_budget) = config.worker.split(config.worker.in_flight);
        let lanes = Lanes::new(SharedBudget::new(first_budget, retry_budget));
        let mut dispatcher = Dispatcher::new(
            config,
            ladder,
            Arc::new(subscriptions),
            Arc::new(secrets),
            http,
            publisher,
            notices,
            metrics,
        );
        dispatcher.store = store.as_ref().map(|f| f.store.clone());
        Ok(Self {
            dispatcher: Arc::new(dispatcher),
            notices_task,
            hangup: Hangup::listen(),
            vitals,
            name,
            lanes,
            queues,
            store,
        })
    }

    pub fn metrics(&self) -> Metrics {
        self.dispatcher.metrics.clone()
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served, if anywhere.
    pub fn vitals_addr(&self) -> Option<std::net::SocketAddr> {
        crate::observe::vitals::local_addr(&self.vitals)
    }

    /// Consumes until `shutdown` resolves, then stops consuming, lets in-flight deliveries
    /// finish, and returns, all within `worker.shutdown_grace` of the signal: one deadline
    /// governs cancelling, draining and closing. Reconnects with backoff when the
    /// broker connection drops; fails only if the very first session cannot consume.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
        let tracker = TaskTracker::new();
        let stop_helpers = CancellationToken::new();
        let mut helpers = vec![tokio::spawn(reload_loop(
            Arc::clone(&self.dispatcher),
            self.hangup.take(),
            stop_helpers.clone(),
        ))];
        let metrics = self.dispatcher.metrics.clone();
        if let Some(store) = self.store.take() {
            helpers.push(tokio::spawn(crate::store::follow::follow(
                store,
                Arc::clone(&self.dispatcher.subscriptions),
                Arc::clone(&self.dispatcher.secrets),
                metrics.clone(),
                self.dispatcher.config.store.resync,
                stop_helpers.clone(),
            )));
        }
        if let Some(listener) = self.vitals.take() {
            helpers.push(tokio::spawn(crate::observe::vitals::serve(
                listener,
                metrics.clone(),
                stop_helpers.clone(),
            )));
        }
        let config = &self.dispatcher.config;
        match Management::new(
            &config.management.url,
            &Management::vhost_of(&config.amqp.url),
        ) {
            Ok(api) => {
                let poll = QueuePoll {
                    api,
                    ladder: self.dispatcher.ladder.clone(),
                    lanes: self.lanes.clone(),
                    listed: self.queues.clone(),
                    publisher: Arc::clone(&self.dispatcher.publisher),
                    metrics: metrics.clone(),
                    interval: config.metrics.poll_interval,
                };
                helpers.push(tokio::spawn(poll.run(stop_helpers.clone())));
            }
            Err(e) => warn!(error = %e, "No queue depth metrics"),
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let amqp = &self.dispatcher.config.amqp;
        let mut backoff = amqp.reconnect_min;
        let mut ever_connected = false;
        let mut result = Ok(());
        let grace = self.dispatcher.config.worker.shutdown_grace;
        let mut deadline = None;
        loop {
            match self.session(&mut shutdown, &tracker, !ever_connected).await {
                SessionEnd::Shutdown { deadline: at } => {
                    deadline = Some(at);
                    break;
                }
                SessionEnd::Failed { error, connected } => {
                    if !ever_connected && !connected {
                        result = Err(WorkerError::Consume(error));
                        break;
                    }
                    ever_connected = true;
                    if connected {
                        backoff = amqp.reconnect_min;
                    }
                    warn!(error = %error, retry_in = ?backoff, "Broker session ended; reconnecting");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut shutdown => {
                            deadline = Some(Instant::now() + grace);
                            break;
                        }
                    }
                    backoff = (backoff * 2).min(amqp.reconnect_max);
                    self.dispatcher.metrics.reconnects.inc();
                }
            }
        }
        // The session drained already when it saw the signal; this covers tasks of sessions
        // that failed, still finishing their republishes, within the same deadline.
        let deadline = deadline.unwrap_or_else(|| Instant::now() + grace);
        drain(&tracker, deadline).await;
        // What is still unsettled now gives up: it was never acked, and returns to its lane
        // when the connection it came on closes (or the process exits).
        self.dispatcher.abandon.cancel();
        stop_helpers.cancel();
        for mut helper in helpers {
            if tokio::time::timeout_at(deadline, &mut helper)
                .await
                .is_err()
            {
                helper.abort();
            }
        }
        let Worker {
            dispatcher,
            notices_task,
            ..
        } = self;
        // Dropping the last `Notices` lets its task send what is buffered and end.
        let publisher = Arc::clone(&dispatcher.publisher);
        let _ = tokio::time::timeout_at(deadline, dispatcher.parking.close()).await;
        drop(dispatcher);
        let notices_left = Instant::now() + NOTICES_FLUSH;
        let _ = tokio::time::timeout_at(deadline.min(notices_left), notices_task).await;
        let _ = tokio::time::timeout_at(deadline, publisher.close()).await;
        info!("Worker stopped");
        result
    }

    /// One broker connection, consuming every lane there is until shutdown or a failure.
    /// `first` says no session consumed before: a missing lane of the ladder then fails it.
    async fn session(
        &self,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
        tracker: &TaskTracker,
        first: bool,
    ) -> SessionEnd {
        let failed = |error: String, connected| SessionEnd::Failed { error, connected };
        let config = &self.dispatcher.config;
        let grace = config.worker.shutdown_grace;
        let props = ConnectionProperties::default()
            .with_connection_name(format!("{} consume", self.name).into());
        let connect = tokio::time::timeout(
            BROKER_ANSWER,
            Connection::connect(config.amqp.url.expose(), props),
        );
        // A signal while connecting (the broker may take long to answer) ends the wait.
        let connected = tokio::select! {
            connected = connect => connected,
            () = &mut *shutdown => {
                return SessionEnd::Shutdown { deadline: Instant::now() + grace };
            }
        };
        let conn = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return failed(format!("connecting to {}: {e}", config.amqp.url), false);
            }
            Err(_) => {
                return failed(
                    format!(
                        "connecting to {}: no answer within {BROKER_ANSWER:?}",
                        config.amqp.url
                    ),
                    false,
                );
            }
        };
        let metrics = &self.dispatcher.metrics;
        let mut queues = self.queues.subscribe();
        let wanted = lane_specs(
            config,
            &self.dispatcher.ladder,
            queues.borrow_and_update().as_deref(),
        );
        let mut consumed = Consumed::default();
        self.join_fleet(&conn).await;
        let opened = tokio::select! {
            opened = self.open_lanes(&conn, &wanted, first, &mut consumed) => Some(opened),
            () = &mut *shutdown => None,
        };
        match opened {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                close(conn, Instant::now() + BROKER_ANSWER, "cannot consume").await;
                return failed(e, false);
            }
            None => {
                let deadline = Instant::now() + grace;
                close(conn, deadline, "shutdown").await;
                return SessionEnd::Shutdown { deadline };
            }
        }
        info!(lanes = ?consumed.queues(), "Consuming");
        // Counted again now that this worker's consumer is registered, then every RECOUNT for
        // as long as the session lasts; attempts wait until the count settles.
        let fleet_metric = metrics.fleet_workers.clone();
        let _counting = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            crate::delivery::fleet::count_fleet(
                conn.create_channel().await.ok(),
                self.dispatcher.ladder.fleet_lane(),
                self.dispatcher.endpoints.fleet(),
                move |workers| fleet_metric.set(i64::from(workers)),
            ),
        ));
        let consuming = &metrics.consuming;
        consuming.set(i64::from(consumed.has_all(&wanted)));
        let _not_consuming = scopeguard(|| consuming.set(0));
        let mut listing = true;
        loop {
            tokio::select! {
                () = &mut *shutdown => break,
                // The management API listed the queues again: consume lanes that appeared.
                changed = queues.changed(), if listing => {
                    if changed.is_err() {
                        listing = false;
                        continue;
                    }
                    let listed = queues.borrow_and_update().clone();
                    let wanted = lane_specs(config, &self.dispatcher.ladder, listed.as_deref());
                    for spec in &wanted {
                        if consumed.has(&spec.queue)
                            || listed.as_ref().is_some_and(|l| !l.contains(&spec.queue))
                        {
                            continue;
                        }
                        match self.consume(&conn, spec, &mut consumed).await {
                            Ok(()) => info!(lane = %spec.queue, "Consuming a lane found since"),
                            Err(ConsumeError::NotFound(e)) => lane_missing(spec, &e),
                            Err(e) => return failed(format!("consuming {}: {e}", spec.queue), true),
                        }
                    }
                    consuming.set(i64::from(consumed.has_all(&wanted)));
                }
                next = consumed.deliveries.next(), if !consumed.deliveries.is_empty() => match next {
                    Some((lane, Some(Ok(delivery)))) => {
                        let dispatcher = Arc::clone(&self.dispatcher);
                        let handed_over = Instant::now();
                        tracker.spawn(async move {
                            // A shard's deliveries wait for a permit of the worker-wide budget.
                            let _permit = lane.permit().await;
                            dispatcher.handle(lane, delivery, handed_over).await;
                        });
                    }
                    Some((lane, Some(Err(e)))) => {
                        return failed(format!("consumer of {}: {e}", lane.queue), true);
                    }
                    Some((lane, None)) => {
                        // The broker cancels a consumer whose queue was deleted; its channel and
                        // the connection stay open. Then only that lane ends.
                        if !(conn.status().connected() && consumed.channel_open(&lane.queue)) {
                            return failed(format!("the consumer of {} ended with its channel", lane.queue), true);
                        }
                        let required = consumed.remove(&lane.queue);
                        if required {
                            error!(lane = %lane.queue, "The broker cancelled the consumer of a lane of the ladder (was it deleted?); not ready until it is back (`hookrelay topology apply`)");
                            consuming.set(0);
                        } else {
                            info!(lane = %lane.queue, "The broker cancelled the consumer of a lane no longer dedicated (deleted); no longer consuming it");
                        }
                    }
                    None => {}
                }
            }
        }
        // Drain: stop taking deliveries, let the in-flight ones ack on this connection, close;
        // all by one deadline.
        let deadline = Instant::now() + grace;
        info!(
            in_flight = tracker.len(),
            "Shutting down: cancelling consumers and draining"
        );
        let cancels = consumed.consumers().map(|(ch, tag)| async move {
            if let Err(e) = ch
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await
            {
                warn!(error = %e, "Cancelling a consumer failed");
            }
        });
        if tokio::time::timeout_at(deadline, futures_util::future::join_all(cancels))
            .await
            .is_err()
        {
            warn!("The broker did not confirm the consumers' cancellation in time");
        }
        drain(tracker, deadline).await;
        close(conn, deadline, "shutdown").await;
        SessionEnd::Shutdown { deadline }
    }

    /// Consumes every lane of `wanted`. A lane that is not there is skipped (logged), but in the
    /// very `first` session a missing lane of the ladder fails it, with the reason.
    /// Counts the fleet this session joins before it consumes: the consumers of the lane every
    /// worker consumes, from the broker as they are now. Its count is young from here
    /// ([`crate::delivery::fleet`]). Should the count fail, the session's recounts try again.
    async fn join_fleet(&self, conn: &Connection) {
        let lane = self.dispatcher.ladder.fleet_lane();
        let fleet = self.dispatcher.endpoints.fleet();
        let counted = async {
            let ch = conn.create_channel().await?;
            let others = crate::delivery::fleet::live_consumers(&ch, &lane).await;
            let _ = ch.close(200, "counted".into()).await;
            others
        };
        let others = match tokio::time::timeout(BROKER_ANSWER, counted).await {
            Ok(Ok(others)) => others,
            _ => 0,
        };
        let workers = fleet.join(others);
        self.dispatcher
            .metrics
            .fleet_workers
            .set(i64::from(workers));
    }

    async fn open_lanes(
        &self,
        conn: &Connection,
        wanted: &[LaneSpec],
        first: bool,
        consumed: &mut Consumed,
    ) -> Result<(), String> {
        if first {
            self.tier_exchanges_exist(conn).await?;
        }
        for spec in wanted {
            match self.consume(conn, spec, consumed).await {
                Ok(()) => {}
                // A lane that is not there: a retired one was deleted, which is the operator's
                // right; a required one is missing topology. Neither ends the session, except
                // the very first, which fails the start with the reason.
                Err(ConsumeError::NotFound(e)) if !(spec.required && first) => {
                    lane_missing(spec, &e);
                }
                Err(e) => return Err(format!("consuming {}: {e}", spec.queue)),
            }
        }
        Ok(())
    }
}

impl Worker {
    /// Every tier's exchange is there, so retries have somewhere to go: a ladder applied by an
    /// earlier version has the tiers without them, and the worker says so before consuming.
    async fn tier_exchanges_exist(&self, conn: &Connection) -> Result<(), String> {
        let ladder = &self.dispatcher.ladder;
        let checked = async {
            // A passive declare of a missing exchange closes its channel: one of its own.
            let ch = conn.create_channel().await?;
            for tier in ladder.tier_ids() {
                let name = ladder.tier_exchange(tier);
                let passive = lapin::options::ExchangeDeclareOptions {
                    passive: true,
                    durable: true,
                    ..Default::default()
                };
                if let Err(e) = ch
                    .exchange_declare(
                        name.as_str().into(),
                        lapin::ExchangeKind::Fanout,
                        passive,
                        FieldTable::default(),
                    )
                    .await
                {
                    return Ok(Err((name, e)));
                }
            }
            let _ = ch.close(200, "checked".into()).await;
            Ok::<_, lapin::Error>(Ok(()))
        };
        match tokio::time::timeout(BROKER_ANSWER, checked).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err((name, e)))) => Err(match refused(&e) {
                Some(Refusal::NotFound) => format!(
                    "exchange {name} does not exist (a ladder applied by an earlier version has \
                     tiers without exchanges of their own); the topology is missing: run \
                     `hookrelay topology apply`"
                ),
                _ => format!("checking exchange {name}: {e}"),
            }),
            Ok(Err(e)) => Err(format!("checking the tiers' exchanges: {e}")),
            Err(_) => Err(format!(
                "checking the tiers' exchanges: no answer within {BROKER_ANSWER:?}"
            )),
        }
    }
}

/// Closes `conn`, waiting for the broker's answer until `deadline` at most. The close goes on
/// in the background after that (bounded by [`BROKER_ANSWER`]): in-flight deliveries return to
/// their lanes once it completes, or when the process exits.
async fn close(conn: Connection, deadline: Instant, why: &'static str) {
    let closing = tokio::spawn(async move {
        let _ = tokio::time::timeout(BROKER_ANSWER, conn.close(200, why.into())).await;
    });
    if tokio::time::timeout_at(deadline, closing).await.is_err() {
        warn!("The broker did not confirm the close before the drain deadline");
    }
}

/// How long buffered notices may take to go out at shutdown, within the drain deadline.
const NOTICES_FLUSH: Duration = Duration::from_secs(5);

/// How long a session waits for the broker to answer while connecting, opening its consumers
/// or closing. A broker that takes the TCP connection but stalls (booting, half-open) then
/// fails the session, which is retried with backoff, instead of hanging the worker.
const BROKER_ANSWER: Duration = Duration::from_secs(30);

/// Budget a retired tenant's lanes get while they drain.
const RETIRED_IN_FLIGHT: u16 = 20;

/// The lanes to consume: the shared pair, or each shard's pair, and each dedicated tenant's pair
/// (required), and the lanes the ladder no longer routes to among `listed` (the queues that
/// exist: tenants no longer dedicated, shards of another shard count, the unsharded pair of a
/// sharded ladder or the shards of an unsharded one), so what they hold is delivered. Without a
/// listing, only the required ones.
///
/// The shards' rule: each shard's prefetch is `ceil(2 × budget / N)` of its kind's budget
/// (`worker.in_flight` split by `worker.retry_share`), at most the budget, and every delivery
/// from a shard takes a permit of a worker-wide semaphore of that budget before it is
/// processed. So deliveries processed at once never exceed the budget, a busy shard can use up
/// to twice its even share while others idle, and one shard never holds all of it.
///
/// On a shared lane (or shard) one endpoint's attempts hold at most `endpoints.lane_share` of
/// its prefetch ([`endpoint_most`]): an attempt holds its slot until it ends, so an endpoint
/// that hangs would otherwise leave the tenants behind it only what its cap leaves of the
/// lane. A dedicated tenant's lanes are its own and have no such limit.
pub fn lane_specs(config: &Config, ladder: &Ladder, listed: Option<&[String]>) -> Vec<LaneSpec> {
    let mut specs = Vec::new();
    let share = config.endpoints.lane_share;
    let mut pair =
        |first: String, retry: String, budget: (u16, u16), shared: bool, shard, shares| {
            let (first_prefetch, retry_prefetch) = budget;
            specs.push(LaneSpec {
                kind: LaneKind::First,
                queue: first,
                prefetch: first_prefetch,
                required: true,
                shard,
                shares_budget: shares,
                endpoint_most: shared.then(|| endpoint_most(first_prefetch, share)),
            });
            specs.push(LaneSpec {
                kind: LaneKind::Retry,
                queue: retry,
                prefetch: retry_prefetch,
                required: true,
                shard,
                shares_budget: shares,
                endpoint_most: shared.then(|| endpoint_most(retry_prefetch, share)),
            });
        };
    let (first_budget, retry_budget) = config.worker.split(config.worker.in_flight);
    let sharded = ladder.shards > 1;
    let per_shard = (
        shard_prefetch(first_budget, ladder.shards),
        shard_prefetch(retry_budget, ladder.shards),
    );
    for (first, retry, shard) in ladder.shared_lanes() {
        pair(first, retry, per_shard, true, shard, sharded);
    }
    for d in &ladder.dedicated {
        pair(
            ladder.first_lane_of(&d.tenant),
            ladder.retry_lane_of(&d.tenant),
            config.worker.split(d.in_flight),
            false,
            None,
            false,
        );
    }
    let (retired_first, retired_retry) = config.worker.split(RETIRED_IN_FLIGHT);
    let mut retired: Vec<LaneSpec> = listed
        .unwrap_or_default()
        .iter()
        .filter_map(|queue| {
            let role = ladder.role_of(queue)?;
            if !ladder.is_retired_lane(&role) {
                return None;
            }
            let (kind, prefetch, shard) = match role {
                QueueRole::FirstLane { shard, .. } => (LaneKind::First, retired_first, shard),
                QueueRole::RetryLane { shard, .. } => (LaneKind::Retry, retired_retry, shard),
                _ => return None,
            };
            Some(LaneSpec {
                kind,
                queue: queue.clone(),
                prefetch,
                required: false,
                shard,
                shares_budget: false,
                endpoint_most: None,
            })
        })
        .collect();
    retired.sort_by(|a, b| a.queue.cmp(&b.queue));
    specs.extend(retired);
    specs
}

/// The most attempts one endpoint may have out from a shared lane of `prefetch`: `share` of it,
/// rounded up, at least 1.
pub fn endpoint_most(prefetch: u16, share: f64) -> u32 {
    ((f64::from(prefetch) * share).ceil() as u32).clamp(1, u32::from(prefetch.max(1)))
}

/// A shard's prefetch: `ceil(2 × budget / shards)`, at least 1, at most `budget` (exactly the
/// budget when there is one shard).
pub fn shard_prefetch(budget: u16, shards: u16) -> u16 {
    let shards = u32::from(shards.max(1));
    let share = (2 * u32::from(budget)).div_ceil(shards);
    u16::try_from(share.clamp(1, u32::from(budget.max(1)))).unwrap_or(budget)
}

/// The queues of the worker's vhost, or `None` (logged) when the management API cannot say.
async fn list_queues(config: &Config) -> Option<Vec<crate::broker::management::QueueInfo>> {
    let listed = match Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    ) {
        Ok(api) => api.queues().await,
        Err(e) => Err(e),
    };
    match listed {
        Ok(queues) => Some(queues),
        Err(e) => {
            warn!(error = %e, "Cannot list queues; lanes of tenants no longer dedicated are drained once the management API answers");
            None
        }
    }
}

/// Why a lane could not be consumed.
#[derive(Debug, thiserror::Error)]
enum ConsumeError {
    /// The queue does not exist (the broker closed only that lane's channel).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

fn lane_missing(spec: &LaneSpec, e: &str) {
    if spec.required {
        error!(lane = %spec.queue, error = %e, "A lane of the ladder is missing; not ready until it exists: run `hookrelay topology apply`");
    } else {
        info!(lane = %spec.queue, "A lane of a tenant no longer dedicated is gone; not consuming it");
    }
}

type LaneItem = (Arc<Lane>, Option<lapin::Result<Delivery>>);

/// A session's consumers: each lane's channel and consumer tag, and all their deliveries as one
/// stream (a lane's stream ends with a `None` item, which tells which consumer ended).
#[derive(Default)]
struct Consumed {
    by_queue: std::collections::BTreeMap<String, (Channel, String, bool)>,
    deliveries: stream::SelectAll<BoxStream<'static, LaneItem>>,
    /// Channels of lanes that ended: kept open for the acks of what they delivered.
    ended: Vec<(Channel, String)>,
}

impl Consumed {
    fn has(&self, queue: &str) -> bool {
        self.by_queue.contains_key(queue)
    }

    fn has_all(&self, wanted: &[LaneSpec]) -> bool {
        wanted
            .iter()
            .filter(|s| s.required)
            .all(|s| self.has(&s.queue))
    }

    fn queues(&self) -> Vec<&str> {
        self.by_queue.keys().map(String::as_str).collect()
    }

    fn channel_open(&self, queue: &str) -> bool {
        self.by_queue
            .get(queue)
            .is_some_and(|(ch, _, _)| ch.status().connected())
    }

    /// Forgets an ended lane; returns whether it was required.
    fn remove(&mut self, queue: &str) -> bool {
        match self.by_queue.remove(queue) {
            Some((ch, tag, required)) => {
                self.ended.push((ch, tag));
                required
            }
            None => false,
        }
    }

    /// Every consumer still on, to cancel.
    fn consumers(&self) -> impl Iterator<Item = (&Channel, &String)> {
        self.by_queue.values().map(|(ch, tag, _)| (ch, tag))
    }
}

impl Worker {
    /// Opens a channel for `spec` with its prefetch and consumes the lane, within
    /// [`BROKER_ANSWER`].
    async fn consume(
        &self,
        conn: &Connection,
        spec: &LaneSpec,
        consumed: &mut Consumed,
    ) -> Result<(), ConsumeError> {
        let lane = self.lanes.lane(spec, &self.dispatcher.metrics);
        let consumer = async {
            let ch = conn.create_channel().await?;
            ch.basic_qos(lane.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = ch
                .basic_consume(
                    lane.queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((ch, consumer))
        };
        let (ch, consumer) = match tokio::time::timeout(BROKER_ANSWER, consumer).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Err(match refused(&e) {
                    Some(Refusal::NotFound) => ConsumeError::NotFound(format!(
                        "{e}; the topology is missing: run `hookrelay topology apply`"
                    )),
                    _ => ConsumeError::Other(e.to_string()),
                });
            }
            Err(_) => {
                return Err(ConsumeError::Other(format!(
                    "no answer within {BROKER_ANSWER:?}"
                )));
            }
        };
        let tag = consumer.tag().to_string();
        consumed
            .by_queue
            .insert(spec.queue.clone(), (ch, tag, spec.required));
        consumed.deliveries.push(
            consumer
                .map(Some)
                .chain(stream::once(async { None }))
                .map(move |d| (Arc::clone(&lane), d))
                .boxed(),
        );
        Ok(())
    }
}

/// Runs `f` when dropped.
struct Guard<F: FnMut()>(F);

impl<F: FnMut()> Drop for Guard<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

fn scopeguard<F: FnMut()>(f: F) -> Guard<F> {
    Guard(f)
}

/// Waits for in-flight deliveries until `deadline`. What is still unfinished then was never
/// acked, so the broker returns it to its lane when the connection closes.
async fn drain(tracker: &TaskTracker, deadline: Instant) {
    tracker.close();
    if tokio::time::timeout_at(deadline, tracker.wait())
        .await
        .is_err()
    {
        warn!(
            in_flight = tracker.len(),
            "Drain deadline passed; unfinished deliveries return to their lanes"
        );
    }
}

/// SIGHUP, where there is such a thing.
struct Hangup(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangup {
    fn listen() -> Option<Self> {
        #[cfg(unix)]
        {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .ok()
                .map(Hangup)
        }
        #[cfg(not(unix))]
        {
            None
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.0.recv().await;
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    }
}

/// Looks at the subscriptions file every `reload.interval` and on SIGHUP. A changed, valid file
/// whose secrets resolve goes into force; anything else is refused, loudly, and the last good
/// version stays.
async fn reload_loop(
    dispatcher: Arc<Dispatcher>,
    mut hangup: Option<Hangup>,
    stop: CancellationToken,
) {
    if dispatcher.subscriptions.path().is_none() {
        return;
    }
    let mut tick = tokio::time::interval(dispatcher.config.reload.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hup = async {
            match hangup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = hup => info!("SIGHUP: reloading subscriptions"),
        }
        let secrets = Arc::clone(&dispatcher.secrets);
        match dispatcher
            .subscriptions
            .reload(|s| check_secrets(&secrets, s))
        {
            Reload::Unchanged => {}
            Reload::Applied(n) => {
                dispatcher
                    .metrics
                    .subscription_reloads
                    .with_label_values(&["applied"])
                    .inc();
                info!(subscriptions = n, "Subscriptions reloaded");
            }
            Reload::Refused { errors, first } => {
                if first {
                    dispatcher
                        .metrics
                        .subscription_reloads
                        .with_label_values(&["refused"])
                        .inc();
                    for e in &errors.0 {
                        error!(problem = %e, "Subscriptions file refused; the previous version stays in force");
                    }
                    dispatcher.notices.operational(
                        OperationalEvent::new("subscriptions.reload_failed", "invalid")
                            .detail(&errors.to_string()),
                    );
                }
            }
        }
    }
}

/// Resolves when the process receives SIGTERM or SIGINT. The handlers are installed when this
/// is called, not when the future is first polled: a signal that arrives while the worker is
/// still starting (connecting to a slow broker) is then a clean stop, not the default action,
/// death by signal.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let installed = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        match installed {
            (Some(mut term), Some(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Some(mut term), None) => {
                term.recv().await;
            }
            (None, _) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        info!("Shutdown signal received");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladders_lanes_are_required_and_retired_ones_are_consumed_while_listed() {
        let config = Config::default();
        let ladder = Ladder::parse(include_str!("../../topology/ladder.toml"))
            .unwrap()
            .with_dedicated("bigco", 100)
            .unwrap();
        let names = |specs: &[LaneSpec], required: bool| -> Vec<String> {
            specs
                .iter()
                .filter(|s| s.required == required)
                .map(|s| s.queue.clone())
                .collect()
        };
        let ours = [
            "hookrelay.ready.first",
            "hookrelay.ready.retry",
            "hookrelay.ready.first.bigco",
            "hookrelay.ready.retry.bigco",
        ];
        // Without a listing: the ladder's lanes only.
        let unlisted = lane_specs(&config, &ladder, None);
        assert_eq!(names(&unlisted, true), ours);
        assert!(names(&unlisted, false).is_empty());
        // Listed: a retired tenant's lanes, each on its own (one may be deleted already);
        // never a dedicated tenant's twice, never a tier or another ladder's queue.
        let listed: Vec<String> = [
            "hookrelay.ready.first.oldco",
            "hookrelay.ready.retry.gone",
            "hookrelay.ready.first.bigco",
            "hookrelay.retry-10s",
            "other.ready.first.oldco",
        ]
        .map(String::from)
        .to_vec();
        let specs = lane_specs(&config, &ladder, Some(&listed));
        assert_eq!(names(&specs, true), ours);
        assert_eq!(
            names(&specs, false),
            ["hookrelay.ready.first.oldco", "hookrelay.ready.retry.gone"]
        );
        let retired: Vec<_> = specs.iter().filter(|s| !s.required).collect();
        assert_eq!(retired[0].kind, LaneKind::First);
        assert_eq!(retired[1].kind, LaneKind::Retry);
        let (first, retry) = config.worker.split(RETIRED_IN_FLIGHT);
        assert_eq!((retired[0].prefetch, retired[1].prefetch), (first, retry));
        // An endpoint holds at most a quarter (the default share) of a shared lane; a dedicated
        // tenant's lanes are its own.
        let most: Vec<_> = specs.iter().map(|s| s.endpoint_most).collect();
        assert_eq!(most, [Some(53), Some(23), None, None, None, None]);
    }

    #[test]
    fn shards_share_the_budget_and_the_unsharded_lanes_are_drained_once_listed() {
        let config = Config::default(); // in_flight 300: 210 first, 90 retry
        let ladder = Ladder::parse(include_str!("../../topology/ladder.toml"))
            .unwrap()
            .with_shards(4)
            .unwrap();
        let listed: Vec<String> = [
            "hookrelay.ready.first",
            "hookrelay.ready.retry",
            "hookrelay.ready.first-s1",
            "hookrelay.ready.first-s7",
        ]
        .map(String::from)
        .to_vec();
        let specs = lane_specs(&config, &ladder, Some(&listed));
        let shards: Vec<_> = specs.iter().filter(|s| s.required).collect();
        assert_eq!(shards.len(), 8);
        for s in &shards {
            assert!(s.shares_budget && s.shard.is_some(), "{s:?}");
            let want = match s.kind {
                LaneKind::First => 105, // ceil(2 × 210 / 4)
                LaneKind::Retry => 45,  // ceil(2 × 90 / 4)
            };
            assert_eq!(s.prefetch, want, "{s:?}");
            // A quarter of the shard, rounded up: what one endpoint's attempts may hold of it.
            assert_eq!(s.endpoint_most, Some(u32::from(want).div_ceil(4)), "{s:?}");
        }
        let retired: Vec<_> = specs
            .iter()
            .filter(|s| !s.required)
            .map(|s| (s.queue.as_str(), s.shard, s.shares_budget))
            .collect();
        assert_eq!(
            retired,
            [
                ("hookrelay.ready.first", None, false),
                ("hookrelay.ready.first-s7", Some(7), false),
                ("hookrelay.ready.retry", None, false),
            ]
        );
        assert_eq!(shard_prefetch(210, 1), 210, "one shard: the whole budget");
        assert_eq!(shard_prefetch(8, 4), 4);
        assert_eq!(shard_prefetch(3, 64), 1);
        assert_eq!(shard_prefetch(5, 2), 5, "never more than the budget");
        assert_eq!(endpoint_most(105, 0.25), 27);
        assert_eq!(endpoint_most(3, 0.01), 1, "at least one");
        assert_eq!(endpoint_most(210, 1.0), 210, "1: the whole lane");
    }
}
