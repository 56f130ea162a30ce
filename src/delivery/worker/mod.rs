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
//!
//! - [`lanes`]: which lanes to consume, their budgets, and the consumers of a session.
//! - [`reload`]: the subscriptions file kept in force as it changes.
//! - [`catalog`]: the catalog of event types kept in force as it changes.
//! - [`signals`]: SIGHUP, and the shutdown signal `main` passes in.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::BasicCancelOptions;
use lapin::{Connection, ConnectionProperties};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::broker::management::Management;
use crate::broker::publish::{PublishError, Publisher};
use crate::catalog::{Catalog, LiveCatalog};
use crate::config::Config;
use crate::contract::ladder::Ladder;
use crate::contract::retention::StreamKind;
use crate::delivery::amqp::AmqpSender;
use crate::delivery::dispatch::Dispatcher;
use crate::delivery::egress::{EgressPolicy, Lookup, SystemLookup};
use crate::delivery::http::HttpSender;
use crate::delivery::lane::{Lanes, SharedBudget};
use crate::delivery::poll::QueuePoll;
use crate::delivery::settle::Settler;
use crate::observe::events::Notices;
use crate::observe::metrics::Metrics;
use crate::subscriptions::{LiveSubscriptions, SecretStore};

pub mod catalog;
mod lanes;
mod reload;
mod signals;

pub use catalog::CatalogSource;
pub use lanes::{ConsumeError, LaneError, endpoint_most, lane_specs, shard_prefetch};
use lanes::{Consumed, lane_missing, list_queues};
use reload::{check_secrets, reload_loop};
use signals::Hangup;
pub use signals::shutdown_signal;

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
    /// The very first session failed: [`SessionError::retry_helps`] says whether starting
    /// again later may succeed with nobody acting.
    #[error("cannot consume from the broker: {0}")]
    Consume(SessionError),
    #[error("{0}")]
    Listen(#[from] std::io::Error),
}

/// Why a broker session ended other than by shutdown. The worker starts another, with
/// backoff, unless it never got to consume.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("connecting to {url}: {error}")]
    Connect { url: String, error: lapin::Error },
    #[error("connecting to {url}: no answer within {BROKER_ANSWER:?}")]
    ConnectSilent { url: String },
    #[error(transparent)]
    Lanes(#[from] LaneError),
    #[error("consumer of {queue}: {error}")]
    Consumer { queue: String, error: lapin::Error },
    #[error("the consumer of {0} ended with its channel")]
    ChannelEnded(String),
}

impl SessionError {
    /// Whether another session may consume with nobody acting: the broker may come back, but
    /// missing topology or a refusal waits for an operator ([`LaneError::retry_helps`]).
    pub fn retry_helps(&self) -> bool {
        match self {
            SessionError::Lanes(e) => e.retry_helps(),
            _ => true,
        }
    }
}

/// What a worker is made of. [`WorkerSetup::new`] fills in the production defaults; tests swap
/// the resolver or the secret store.
pub struct WorkerSetup {
    pub config: Config,
    pub ladder: Ladder,
    pub subscriptions: LiveSubscriptions,
    /// The catalog of event types in force at start; kept current from where it was read
    /// (`catalog_source`).
    pub catalog: Arc<LiveCatalog>,
    pub catalog_source: CatalogSource,
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
            catalog: Arc::new(LiveCatalog::new(Catalog::empty(config.catalog.unlisted))),
            catalog_source: CatalogSource::Fixed,
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
    catalog_source: CatalogSource,
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
    Failed {
        error: SessionError,
        connected: bool,
    },
}

impl Worker {
    /// Checks that every secret resolves and connects the publishing side.
    pub async fn start(setup: WorkerSetup) -> Result<Self, WorkerError> {
        let WorkerSetup {
            config,
            ladder,
            subscriptions,
            catalog,
            catalog_source,
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
        let policy = Arc::new(policy);
        let amqp = AmqpSender::new(&config.http, Arc::clone(&policy), Arc::clone(&lookup));
        let http = HttpSender::new(&config.http, policy, lookup)?;
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
            ladder
                .streams()
                .iter()
                .any(|(kind, _)| *kind == StreamKind::Attempts),
            metrics.clone(),
        );
        let listed = list_queues(&config).await;
        let queues = tokio::sync::watch::Sender::new(
            listed.map(|queues| queues.into_iter().map(|q| q.name).collect()),
        );
        let (first_budget, retry_budget) = config.worker.split(config.worker.in_flight);
        let lanes = Lanes::new(SharedBudget::new(first_budget, retry_budget));
        let settler = Settler::new(&config, ladder.clone(), publisher, notices, metrics);
        let mut dispatcher = Dispatcher::new(
            config,
            ladder,
            Arc::new(subscriptions),
            Arc::new(secrets),
            (http, amqp),
            settler,
            store.as_ref().map(|f| f.store.clone()),
        );
        dispatcher.catalog = catalog;
        Ok(Self {
            dispatcher: Arc::new(dispatcher),
            notices_task,
            hangup: Hangup::listen(),
            vitals,
            name,
            lanes,
            queues,
            store,
            catalog_source,
        })
    }

    pub fn metrics(&self) -> Metrics {
        self.dispatcher.settler.metrics.clone()
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
        helpers.push(tokio::spawn(crate::delivery::sweep::sweep_loop(
            Arc::clone(&self.dispatcher),
            stop_helpers.clone(),
        )));
        let metrics = self.dispatcher.settler.metrics.clone();
        let config = &self.dispatcher.config;
        let every = match &self.catalog_source {
            CatalogSource::File(_) => Some(config.reload.interval),
            CatalogSource::Postgres(_) => Some(config.catalog.refresh),
            CatalogSource::Fixed => None,
        };
        if let Some(every) = every {
            helpers.push(tokio::spawn(catalog::follow(
                self.catalog_source.clone(),
                Arc::clone(&self.dispatcher.catalog),
                config.catalog.unlisted,
                every,
                stop_helpers.clone(),
            )));
        }
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
                let api_for_check = api.clone();
                let poll = QueuePoll {
                    api,
                    ladder: self.dispatcher.ladder.clone(),
                    lanes: self.lanes.clone(),
                    listed: self.queues.clone(),
                    publisher: Arc::clone(&self.dispatcher.settler.publisher),
                    metrics: metrics.clone(),
                    interval: config.metrics.poll_interval,
                };
                helpers.push(tokio::spawn(poll.run(stop_helpers.clone())));
                helpers.push(tokio::spawn(check_broker(
                    api_for_check,
                    self.dispatcher.ladder.clone(),
                    crate::broker::compat::Needs::of(config),
                    stop_helpers.clone(),
                )));
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
                    self.dispatcher.settler.metrics.reconnects.inc();
                }
            }
        }
        // The session drained already when it saw the signal; this covers tasks of sessions
        // that failed, still finishing their republishes, within the same deadline.
        let deadline = deadline.unwrap_or_else(|| Instant::now() + grace);
        drain(&tracker, deadline).await;
        // What is still unsettled now gives up: it was never acked, and returns to its lane
        // when the connection it came on closes (or the process exits).
        self.dispatcher.settler.abandon.cancel();
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
        let publisher = Arc::clone(&dispatcher.settler.publisher);
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
        let failed = |error: SessionError, connected| SessionEnd::Failed { error, connected };
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
            Ok(Err(error)) => {
                let url = config.amqp.url.to_string();
                return failed(SessionError::Connect { url, error }, false);
            }
            Err(_) => {
                let url = config.amqp.url.to_string();
                return failed(SessionError::ConnectSilent { url }, false);
            }
        };
        let metrics = &self.dispatcher.settler.metrics;
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
                return failed(e.into(), false);
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
                            Err(error) => {
                                let queue = spec.queue.clone();
                                return failed(LaneError::Consume { queue, error }.into(), true);
                            }
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
                        let queue = lane.queue.clone();
                        return failed(SessionError::Consumer { queue, error: e }, true);
                    }
                    Some((lane, None)) => {
                        // The broker cancels a consumer whose queue was deleted; its channel and
                        // the connection stay open. Then only that lane ends.
                        if !(conn.status().connected() && consumed.channel_open(&lane.queue)) {
                            return failed(SessionError::ChannelEnded(lane.queue.clone()), true);
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
            .settler
            .metrics
            .fleet_workers
            .set(i64::from(workers));
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

/// How long after it starts a worker reads the broker's facts: by then its consumers are
/// listed, with the timeouts the broker applies to them.
const BROKER_CHECK_AFTER: Duration = Duration::from_secs(5);

/// Reads the broker's facts once the worker consumes, and logs them with what they call for
/// (`broker::compat`): a consumer timeout within the lease, messages over RabbitMQ 4's size
/// limit, deprecated features in use.
async fn check_broker(
    api: Management,
    ladder: Ladder,
    needs: crate::broker::compat::Needs,
    stop: CancellationToken,
) {
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(BROKER_CHECK_AFTER) => {}
    }
    match crate::broker::compat::BrokerFacts::read(&api, &ladder).await {
        Ok(facts) => facts.log(needs),
        Err(e) => tracing::debug!(error = %e, "Cannot read the broker's version and settings"),
    }
}
