//! The worker: consumes the ready lanes and hands every delivery to [`crate::delivery::dispatch`] in a task
//! of its own, the moment the broker hands it over, so each channel's prefetch is the
//! concurrency bound and the broker's `consumer_timeout` measures real work.
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
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::broker::error::{Refusal, refused};
use crate::broker::management::Management;
use crate::broker::publish::{PublishError, Publisher};
use crate::config::Config;
use crate::contract::ladder::Ladder;
use crate::delivery::dispatch::Dispatcher;
use crate::delivery::egress::{EgressPolicy, Lookup, SystemLookup};
use crate::delivery::http::HttpSender;
use crate::delivery::lane::{Lane, LaneKind};
use crate::delivery::subscriptions::{
    LiveSubscriptions, Reload, SecretStore, SubscriptionError, SubscriptionErrors, Subscriptions,
};
use crate::observe::events::{Notices, OperationalEvent};
use crate::observe::metrics::Metrics;

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
    lanes: Vec<Arc<Lane>>,
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
    /// Shutdown was asked for and the drain finished (or hit its deadline).
    Shutdown,
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
        } = setup;
        config
            .validate()
            .map_err(|e| WorkerError::Config(e.to_string()))?;
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
        let lanes = lanes_of(&config, &ladder, &metrics).await;
        let dispatcher = Dispatcher::new(
            config,
            ladder,
            Arc::new(subscriptions),
            Arc::new(secrets),
            http,
            publisher,
            notices,
            metrics,
        );
        Ok(Self {
            dispatcher: Arc::new(dispatcher),
            notices_task,
            hangup: Hangup::listen(),
            vitals,
            name,
            lanes,
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
    /// finish within `worker.shutdown_grace`, and returns. Reconnects with backoff when the
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
            Ok(api) => helpers.push(tokio::spawn(crate::observe::vitals::poll_queues(
                api,
                self.dispatcher.ladder.clone(),
                self.lanes.clone(),
                Arc::clone(&self.dispatcher.publisher),
                metrics.clone(),
                config.metrics.poll_interval,
                stop_helpers.clone(),
            ))),
            Err(e) => warn!(error = %e, "No queue depth metrics"),
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let amqp = &self.dispatcher.config.amqp;
        let mut backoff = amqp.reconnect_min;
        let mut ever_connected = false;
        let mut result = Ok(());
        loop {
            match self.session(&mut shutdown, &tracker).await {
                SessionEnd::Shutdown => break,
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
                        () = &mut shutdown => break,
                    }
                    backoff = (backoff * 2).min(amqp.reconnect_max);
                    self.dispatcher.metrics.reconnects.inc();
                }
            }
        }
        // Tasks of sessions that failed may still be finishing their republishes.
        drain(&tracker, self.dispatcher.config.worker.shutdown_grace).await;
        stop_helpers.cancel();
        for helper in helpers {
            let _ = helper.await;
        }
        let Worker {
            dispatcher,
            notices_task,
            ..
        } = self;
        // Dropping the last `Notices` lets its task send what is buffered and end.
        let publisher = Arc::clone(&dispatcher.publisher);
        drop(dispatcher);
        let _ = tokio::time::timeout(Duration::from_secs(5), notices_task).await;
        publisher.close().await;
        info!("Worker stopped");
        result
    }

    async fn session(
        &self,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
        tracker: &TaskTracker,
    ) -> SessionEnd {
        let failed = |error: String, connected| SessionEnd::Failed { error, connected };
        let config = &self.dispatcher.config;
        let props = ConnectionProperties::default()
            .with_connection_name(format!("{} consume", self.name).into());
        let conn = match tokio::time::timeout(
            BROKER_ANSWER,
            Connection::connect(config.amqp.url.expose(), props),
        )
        .await
        {
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
        let mut channels: Vec<(Channel, String)> = Vec::new();
        type Item = (usize, Option<lapin::Result<Delivery>>);
        let mut streams: Vec<BoxStream<'static, Item>> = Vec::new();
        for (i, lane) in self.lanes.iter().enumerate() {
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
            let consumer = match tokio::time::timeout(BROKER_ANSWER, consumer).await {
                Ok(result) => result.map_err(|e| match refused(&e) {
                    Some(Refusal::NotFound) => {
                        format!("{e}; the topology is missing: run `hookrelay topology apply`")
                    }
                    _ => e.to_string(),
                }),
                Err(_) => Err(format!("no answer within {BROKER_ANSWER:?}")),
            };
            match consumer {
                Ok((ch, consumer)) => {
                    channels.push((ch, consumer.tag().to_string()));
                    // A marker after the last item tells which consumer ended.
                    streams.push(
                        consumer
                            .map(Some)
                            .chain(stream::once(async { None }))
                            .map(move |d| (i, d))
                            .boxed(),
                    );
                }
                Err(e) => {
                    let _ = tokio::time::timeout(
                        BROKER_ANSWER,
                        conn.close(200, "cannot consume".into()),
                    )
                    .await;
                    return failed(format!("consuming {}: {e}", lane.queue), false);
                }
            }
        }
        info!(
            lanes = ?self.lanes.iter().map(|l| l.queue.as_str()).collect::<Vec<_>>(),
            "Consuming"
        );
        let consuming = &self.dispatcher.metrics.consuming;
        consuming.set(1);
        let _not_consuming = scopeguard(|| consuming.set(0));
        let mut deliveries = stream::select_all(streams);
        loop {
            tokio::select! {
                () = &mut *shutdown => break,
                next = deliveries.next() => match next {
                    Some((i, Some(Ok(delivery)))) => {
                        let lane = Arc::clone(&self.lanes[i]);
                        tracker.spawn(Arc::clone(&self.dispatcher).handle(lane, delivery));
                    }
                    Some((i, Some(Err(e)))) => {
                        return failed(format!("consumer of {}: {e}", self.lanes[i].queue), true);
                    }
                    Some((i, None)) => {
                        return failed(format!("the broker cancelled the consumer of {}", self.lanes[i].queue), true);
                    }
                    None => return failed("no consumer left".into(), true),
                }
            }
        }
        // Drain: stop taking deliveries, let the in-flight ones ack on this connection, close.
        info!(
            in_flight = tracker.len(),
            "Shutting down: cancelling consumers and draining"
        );
        for (ch, tag) in &channels {
            let cancel = ch.basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
            match tokio::time::timeout(BROKER_ANSWER, cancel).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "Cancelling a consumer failed"),
                Err(_) => warn!("The broker did not confirm a consumer's cancellation"),
            }
        }
        drain(tracker, config.worker.shutdown_grace).await;
        let _ = tokio::time::timeout(BROKER_ANSWER, conn.close(200, "shutdown".into())).await;
        SessionEnd::Shutdown
    }
}

/// How long a session waits for the broker to answer while connecting, opening its consumers
/// or closing. A broker that takes the TCP connection but stalls (booting, half-open) then
/// fails the session, which is retried with backoff, instead of hanging the worker.
const BROKER_ANSWER: Duration = Duration::from_secs(30);

/// Budget a retired tenant's lanes get while they drain.
const RETIRED_IN_FLIGHT: u16 = 20;

/// The lanes to consume: the shared pair, each dedicated tenant's pair, and the lanes of tenants
/// no longer dedicated that still exist (found through the management API), so what they hold
/// is delivered.
async fn lanes_of(config: &Config, ladder: &Ladder, metrics: &Metrics) -> Vec<Arc<Lane>> {
    let mut pairs = vec![(
        ladder.first_lane(),
        ladder.retry_lane(),
        config.worker.in_flight,
    )];
    for d in &ladder.dedicated {
        pairs.push((
            ladder.first_lane_of(&d.tenant),
            ladder.retry_lane_of(&d.tenant),
            d.in_flight,
        ));
    }
    let existing = match Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    ) {
        Ok(api) => api
            .objects()
            .await
            .map(|o| o.queues.into_keys().collect::<Vec<_>>()),
        Err(e) => Err(e),
    };
    match existing {
        Ok(queues) => {
            for tenant in ladder.retired_tenants(&queues) {
                info!(tenant = %tenant, "Draining the lanes of a tenant no longer dedicated");
                let (first, retry) = (ladder.first_lane_of(&tenant), ladder.retry_lane_of(&tenant));
                if queues.contains(&first) && queues.contains(&retry) {
                    pairs.push((first, retry, RETIRED_IN_FLIGHT));
                }
            }
        }
        Err(e) => {
            warn!(error = %e, "Cannot list queues; lanes of tenants no longer dedicated are not drained by this worker")
        }
    }
    let mut lanes = Vec::new();
    for (first, retry, budget) in pairs {
        let (first_prefetch, retry_prefetch) = config.worker.split(budget);
        lanes.push(Arc::new(Lane::new(
            LaneKind::First,
            first,
            first_prefetch,
            metrics,
        )));
        lanes.push(Arc::new(Lane::new(
            LaneKind::Retry,
            retry,
            retry_prefetch,
            metrics,
        )));
    }
    lanes
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

/// Waits for in-flight deliveries, at most `grace`. What is still unfinished then was never
/// acked, so the broker returns it to its lane when the connection closes.
async fn drain(tracker: &TaskTracker, grace: Duration) {
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
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

/// Resolves when the process receives SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    info!("Shutdown signal received");
}
