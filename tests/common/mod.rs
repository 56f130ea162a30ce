//! Shared by the integration tests: every test owns a ladder under a unique prefix on the real
//! broker, and removes it when done (also when it panics). Here too: publishing to it, workers
//! in-process or as processes of their own with the files they run from, and waiting on events
//! (`wait_until`, from `hookrelay_tools::kit`, which the demo and the bench share).
//!
//! - [`hostile`]: the table of messages that break the contract.
//! - [`egress`]: a permissive egress policy and a resolver with fixed answers.
//! - [`node`]: RabbitMQ nodes of a test's own, for the fault suite.
//! - [`pki`]: a test CA and the certificates it signs (rcgen).
//! - [`pg`]: PostgreSQL databases and servers of a test's own, for the store.
//! - [`site`]: the API with its pages over a database of the test's own.
//! - [`browser`]: a headless Chromium of the test's own, driven through its ChromeDriver.

#![allow(dead_code)]

pub mod browser;
pub mod egress;
pub mod hostile;
pub mod node;
pub mod pg;
pub mod pki;
pub mod site;

// Not every test binary uses each of these.
#[allow(unused_imports)]
pub use hookrelay_tools::kit::{self, Counters, subscription_toml, wait_until};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use hookrelay::broker::management::Management;
use hookrelay::broker::publish::Publisher;
use hookrelay::config::{Config, ProcessEnv};
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;
use hookrelay::delivery::worker::{Worker, WorkerSetup};
use hookrelay::observe::events::AttemptRecord;
use hookrelay::observe::metrics::Metrics;
use hookrelay::subscriptions::{
    LiveSubscriptions, SecretRef, SecretStore, Subscription, Subscriptions,
};
use hookrelay_tools::receiver::Receiver;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::task::JoinHandle;

/// The configuration tests run with: the machine's broker (or `HOOKRELAY_*` overrides), with
/// timeouts short enough for tests.
pub fn config() -> Config {
    // `RUST_LOG=hookrelay=debug cargo nextest run ... --no-capture` shows the worker's log.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let mut config = Config::load(None, &ProcessEnv).expect("test configuration");
    config.http.connect_timeout = Duration::from_secs(1);
    config.http.request_timeout = Duration::from_secs(2);
    config.http.token_timeout = Duration::from_secs(1);
    // Tests that fail endpoints on purpose would otherwise trip breakers; those that test the
    // breaker set their own threshold.
    config.endpoints.breaker_failures = 100_000;
    // Those tests count failures in a row, however close together; the window's own tests (and
    // those running the defaults) set it.
    config.endpoints.breaker_window = Duration::ZERO;
    // Test ladders span seconds, the default horizon: an envelope deferred because its endpoint's
    // cap was full under load must not expire on that account. The horizon's tests set their own.
    config.endpoints.horizon = Duration::from_secs(600);
    config.worker.shutdown_grace = Duration::from_secs(10);
    config.worker.requeue_delay = Duration::from_millis(200);
    config.amqp.reconnect_min = Duration::from_millis(100);
    config.amqp.reconnect_max = Duration::from_secs(1);
    config.reload.interval = Duration::from_millis(100);
    config.metrics.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    config.metrics.poll_interval = Duration::from_millis(500);
    // Test endpoints listen on loopback, which the egress policy blocks unless allowed.
    config.egress.allow = vec!["127.0.0.0/8".parse().unwrap()];
    config.validate().expect("test configuration is valid");
    config
}

pub fn unique(name: &str) -> String {
    format!(
        "t-{name}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The management API, for the vhost the configuration's AMQP URL names.
pub fn management(config: &Config) -> Management {
    Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    )
    .expect("management client")
}

/// The connections whose client-given name is `name` (they appear a moment after connecting).
pub async fn connections_named(api: &Management, name: &str) -> usize {
    api.connections()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.client_name() == Some(name))
        .count()
}

pub async fn connect(config: &Config) -> Connection {
    Connection::connect(
        config.amqp.url.expose(),
        ConnectionProperties::default().with_connection_name("hookrelay tests".into()),
    )
    .await
    .expect("the broker answers (run rabbitmq/up)")
}

/// A ladder applied under its own prefix; removed on drop.
pub struct TestLadder {
    pub ladder: Ladder,
    pub config: Config,
    pub conn: Connection,
    pub channel: Channel,
    /// Whether dropping this removes the ladder's objects.
    owned: bool,
    /// Queues a test declared beside the ladder (accounting), removed with it.
    extra_queues: std::sync::Mutex<Vec<String>>,
    /// What [`TestLadder::publish`] publishes with, connected at its first use.
    shared_publisher: tokio::sync::OnceCell<Publisher>,
}

impl TestLadder {
    /// Short tiers for tests, e.g. `&["300ms", "600ms"]`.
    pub async fn apply(name: &str, tiers: &[&str], schedule: &[&str]) -> Self {
        Self::apply_typed(name, QueueType::Quorum, tiers, schedule).await
    }

    pub async fn apply_typed(
        name: &str,
        queue_type: QueueType,
        tiers: &[&str],
        schedule: &[&str],
    ) -> Self {
        Self::apply_on(config(), name, queue_type, tiers, schedule).await
    }

    /// On the broker `config` points at (a fault test's own node).
    pub async fn apply_on(
        config: Config,
        name: &str,
        queue_type: QueueType,
        tiers: &[&str],
        schedule: &[&str],
    ) -> Self {
        let ladder = Ladder::build(&unique(name), queue_type, tiers, schedule).unwrap();
        Self::apply_ladder(config, ladder).await
    }

    /// Applies `ladder` as it is (a sharded one, say); its prefix should come from [`unique`].
    pub async fn apply_ladder(config: Config, ladder: Ladder) -> Self {
        let conn = connect(&config).await;
        let channel = conn.create_channel().await.unwrap();
        let topology = ladder.objects();
        // Policies first, as `topology apply` sets them (leader placement is read at creation).
        topology.apply_policies(&management(&config)).await.unwrap();
        topology.apply(&channel).await.unwrap();
        Self {
            ladder,
            config,
            conn,
            channel,
            owned: true,
            extra_queues: Default::default(),
            shared_publisher: Default::default(),
        }
    }

    /// Another connection to an existing ladder (through another cluster node, say); dropping
    /// it removes nothing.
    pub async fn view(ladder: Ladder, config: Config) -> Self {
        let conn = connect(&config).await;
        let channel = conn.create_channel().await.unwrap();
        Self {
            ladder,
            config,
            conn,
            channel,
            owned: false,
            extra_queues: Default::default(),
            shared_publisher: Default::default(),
        }
    }

    /// Messages in a queue (ready ones; nobody consumes the sink).
    pub async fn depth(&self, queue: &str) -> u32 {
        let channel = self.conn.create_channel().await.unwrap();
        let n = hookrelay::ops::mover::depth(&channel, queue).await.unwrap();
        let _ = channel.close(200, "".into()).await;
        n
    }

    /// Whether `queue` exists now.
    pub async fn queue_exists(&self, queue: &str) -> bool {
        let channel = self.conn.create_channel().await.unwrap();
        let found = hookrelay::ops::mover::depth(&channel, queue).await.is_ok();
        let _ = channel.close(200, "".into()).await;
        found
    }

    /// Messages in `queue` now; 0 while it does not exist.
    pub async fn depth_if_exists(&self, queue: &str) -> u32 {
        let channel = self.conn.create_channel().await.unwrap();
        let n = hookrelay::ops::mover::depth(&channel, queue)
            .await
            .unwrap_or(0);
        let _ = channel.close(200, "".into()).await;
        n
    }

    /// Takes every message out of the dead sink.
    pub async fn drain_dead(&self) -> Vec<BasicGetMessage> {
        self.take_all(&self.ladder.dead()).await
    }

    /// Takes every message out of `queue`.
    pub async fn take_all(&self, queue: &str) -> Vec<BasicGetMessage> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            out.push(m);
        }
        out
    }

    /// The first-attempt shard each of `tenants` lands in, from one event each (taken out
    /// again). The plugin's hash is the broker's, so a test asks the broker.
    pub async fn shard_of(&self, tenants: &[String]) -> std::collections::BTreeMap<String, u16> {
        self.publish_all(
            tenants
                .iter()
                .map(|tenant| event(&format!("evt_probe_{tenant}"), tenant, "sub")),
        )
        .await;
        let mut found = std::collections::BTreeMap::new();
        for i in 0..self.ladder.shards {
            for m in self.take_all(&self.ladder.first_shard(i)).await {
                let tenant = m.delivery.routing_key.to_string();
                assert!(found.insert(tenant, i).is_none(), "a tenant in two shards");
            }
        }
        assert_eq!(found.len(), tenants.len(), "every probe landed in a shard");
        found
    }

    /// Waits until the dead sink holds at least `n` messages.
    pub async fn wait_dead(&self, n: u32, timeout: Duration) -> bool {
        wait_until(timeout, async || self.depth(&self.ladder.dead()).await >= n).await
    }

    /// Waits until `exchange` has a binding with `routing_key`: a consumer that binds its own
    /// queue (an attempt-log tail) receives what is published from then on.
    pub async fn wait_bound(&self, exchange: &str, routing_key: &str) -> bool {
        let api = management(&self.config);
        wait_until(Duration::from_secs(10), async || {
            api.objects().await.is_ok_and(|objects| {
                objects
                    .bindings
                    .iter()
                    .any(|b| b.source == exchange && b.routing_key == routing_key)
            })
        })
        .await
    }

    /// Removes `queue` (declared by the test beside the ladder) when this is dropped.
    pub fn owns_queue(&self, queue: &str) {
        self.extra_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queue.to_owned());
    }

    /// Publishes `event` to the ladder's ingress and waits for the broker's confirm.
    pub async fn publish(&self, event: &NewEvent) {
        self.shared_publisher
            .get_or_init(|| self.publisher())
            .await
            .publish_event(&self.ladder.ingress(), event, 1024)
            .await
            .unwrap();
    }

    /// Publishes `events` as [`TestLadder::publish`] does, up to 100 at once.
    pub async fn publish_all(&self, events: impl IntoIterator<Item = NewEvent>) {
        futures_util::stream::iter(events)
            .for_each_concurrent(100, |e| async move { self.publish(&e).await })
            .await;
    }

    /// Starts taking the first `n` attempt-log records of `tenant`, and returns once the tail's
    /// queue is bound: it sees everything published from then on. The task yields the records.
    pub async fn tail_attempts(&self, tenant: &str, n: usize) -> JoinHandle<Vec<AttemptRecord>> {
        let channel = self.conn.create_channel().await.unwrap();
        let exchange = self.ladder.attempts_exchange();
        let of_tenant = tenant.to_owned();
        let tail = tokio::spawn(async move {
            let mut records = Vec::new();
            hookrelay::ops::tail::tail_attempts(
                &channel,
                &exchange,
                None,
                Some(&of_tenant),
                |body| {
                    // A batch bound for this tenant carries other tenants' records too.
                    records.extend(
                        AttemptRecord::read_message(body)
                            .unwrap()
                            .into_iter()
                            .filter(|r| r.matches(None, Some(&of_tenant))),
                    );
                    records.len() < n
                },
            )
            .await
            .unwrap();
            records
        });
        assert!(
            self.wait_bound(&self.ladder.attempts_exchange(), &format!("*.{tenant}"))
                .await
        );
        tail
    }

    /// An exclusive queue (removed with the test's connection) bound to every message of
    /// `exchange`: what a test reads to see everything published there.
    pub async fn keep_all(&self, exchange: &str) -> String {
        let q = self
            .channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        self.channel
            .queue_bind(
                q.name().clone(),
                exchange.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        q.name().to_string()
    }

    /// A queue keeping the attempt log's records whose routing key (`<outcome>.<tenant>`)
    /// matches `routing_key`, declared beside the ladder and removed with it. Quorum, so it
    /// survives the loss of a cluster node as the ladder does.
    pub async fn attempt_log_queue(&self, name: &str, routing_key: &str) -> String {
        let name = format!("{}.accounting.{name}", self.ladder.prefix);
        self.owns_queue(&name);
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            lapin::types::AMQPValue::LongString("quorum".into()),
        );
        self.channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await
            .unwrap();
        self.channel
            .queue_bind(
                name.as_str().into(),
                self.ladder.attempts_exchange().as_str().into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        name
    }

    pub async fn publisher(&self) -> Publisher {
        Publisher::connect(
            &self.config.amqp.url,
            &format!("{} producer", self.ladder.prefix),
            self.config.amqp.confirm_timeout,
        )
        .await
        .unwrap()
    }
}

impl Drop for TestLadder {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let topology = self.ladder.objects();
        let extra = std::mem::take(
            self.extra_queues
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let url = self.config.amqp.url.clone();
        let api = management(&self.config);
        // Queues the ladder does not list but hookrelay made under its prefix (a paused
        // subscription's parking queue, declared by the worker).
        let ours = format!("{}.", self.ladder.prefix);
        // Async cleanup from a destructor: a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(conn) =
                    Connection::connect(url.expose(), ConnectionProperties::default()).await
                    && let Ok(mut ch) = conn.create_channel().await
                {
                    // A deletion the broker fails (a quorum queue's Raft process can exit
                    // `wal_down` under create/delete churn on 3.10) closes the channel and
                    // stops the pass; deleting again is harmless, so try again on a new one.
                    for _ in 0..3 {
                        if topology.delete(&ch).await.is_ok() {
                            break;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        match conn.create_channel().await {
                            Ok(fresh) => ch = fresh,
                            Err(_) => break,
                        }
                    }
                    let _ = topology.delete_policies(&api).await;
                    let made = api.queues().await.unwrap_or_default().into_iter();
                    let made = made.map(|q| q.name).filter(|name| name.starts_with(&ours));
                    for queue in extra.into_iter().chain(made) {
                        let _ = ch
                            .queue_delete(queue.as_str().into(), Default::default())
                            .await;
                    }
                    let _ = conn.close(200, "".into()).await;
                }
            });
        })
        .join();
    }
}

/// A secret written to a file, with the subscription that references it.
pub struct Secret {
    pub whsec: String,
    pub reference: SecretRef,
    _dir: Arc<tempfile::TempDir>,
}

impl Secret {
    /// The reference as a subscriptions file writes it, quoted.
    pub fn file_ref(&self) -> String {
        match &self.reference {
            SecretRef::File(path) => kit::file_secret(path),
            other => panic!("{other:?}"),
        }
    }
}

pub fn secret() -> Secret {
    let dir = tempfile::tempdir().unwrap();
    let whsec = generate_secret();
    let path = dir.path().join("secret");
    std::fs::write(&path, &whsec).unwrap();
    Secret {
        whsec,
        reference: SecretRef::File(path),
        _dir: Arc::new(dir),
    }
}

pub fn subscription(id: &str, tenant: &str, url: &str, secret: &Secret) -> Subscription {
    Subscription::new(id, tenant, url.parse().unwrap(), secret.reference.clone())
}

pub fn event(id: &str, tenant: &str, subscription: &str) -> NewEvent {
    NewEvent {
        id: id.into(),
        tenant: tenant.into(),
        event_type: "order.paid".into(),
        subscription: Some(subscription.into()),
        timestamp: None,
        body: format!(r#"{{"id":"{id}","amount":42}}"#).into_bytes(),
    }
}

/// A worker running in the background until [`RunningWorker::stop`].
pub struct RunningWorker {
    pub metrics: Metrics,
    pub name: String,
    /// Where its `/metrics`, `/healthz`, `/readyz` are served.
    pub vitals: Option<std::net::SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), hookrelay::delivery::worker::WorkerError>>>,
}

impl RunningWorker {
    pub async fn start(t: &TestLadder, subscriptions: Vec<Subscription>) -> Self {
        Self::start_with(t, t.config.clone(), subscriptions).await
    }

    /// A worker with one subscription, `sub_a` of tenant `acme`, to `receiver`'s `/`.
    pub async fn start_for_receiver(t: &TestLadder, receiver: &Receiver, secret: &Secret) -> Self {
        Self::start(
            t,
            vec![subscription("sub_a", "acme", &receiver.url("/"), secret)],
        )
        .await
    }

    pub async fn start_with(
        t: &TestLadder,
        config: Config,
        subscriptions: Vec<Subscription>,
    ) -> Self {
        let live = LiveSubscriptions::fixed(Subscriptions::from_list(subscriptions));
        Self::start_setup(t, WorkerSetup::new(config, t.ladder.clone(), live)).await
    }

    /// A worker that reads its subscriptions from `file` and reloads it as it changes.
    pub async fn start_from_file(t: &TestLadder, file: &SubsFile) -> Self {
        let live = LiveSubscriptions::from_file(&file.path).unwrap();
        Self::start_setup(
            t,
            WorkerSetup::new(t.config.clone(), t.ladder.clone(), live),
        )
        .await
    }

    /// Starts a worker from a setup; its name and a fast secret refresh are set here.
    pub async fn start_setup(t: &TestLadder, mut setup: WorkerSetup) -> Self {
        setup.secrets = SecretStore::new(Duration::from_millis(100));
        Self::launch(t, setup).await
    }

    /// A worker that follows a PostgreSQL store, opening sealed secrets with `keyring`.
    pub async fn start_following(
        t: &TestLadder,
        config: Config,
        store: hookrelay::store::PgStore,
        keyring: hookrelay::subscriptions::seal::Keyring,
    ) -> Self {
        let mut opened = hookrelay::store::follow::Opened::open(store).await.unwrap();
        assert!(opened.problems.is_empty(), "{:?}", opened.problems);
        let first = std::mem::take(&mut opened.first);
        let mut setup =
            WorkerSetup::new(config, t.ladder.clone(), LiveSubscriptions::followed(first));
        setup.store = Some(opened.following());
        setup.secrets =
            SecretStore::new(Duration::from_millis(100)).with_keyring(Arc::new(keyring));
        Self::launch(t, setup).await
    }

    /// A worker on a PostgreSQL store that holds only the subscriptions it delivers for, within
    /// `config.store.cache_*`, opening sealed secrets with `keyring`.
    pub async fn start_cached(
        t: &TestLadder,
        config: Config,
        store: hookrelay::store::PgStore,
        keyring: hookrelay::subscriptions::seal::Keyring,
    ) -> Self {
        use hookrelay::subscriptions::cache::{CacheLimits, SubscriptionCache};
        let limits = CacheLimits::of(&config.store).expect("store.cache_entries above 0");
        let loader =
            hookrelay::store::held::StoreLoader::own_pool(&store, config.store.lookup_connections);
        let cache = Arc::new(SubscriptionCache::new(limits, Arc::new(loader)));
        let opened = hookrelay::store::follow::Opened::listen(store)
            .await
            .unwrap();
        let mut setup =
            WorkerSetup::new(config, t.ladder.clone(), LiveSubscriptions::cached(cache));
        setup.store = Some(opened.following());
        setup.secrets =
            SecretStore::new(Duration::from_millis(100)).with_keyring(Arc::new(keyring));
        Self::launch(t, setup).await
    }

    /// Starts a worker from a setup as it is; its name is set here.
    pub async fn launch(t: &TestLadder, mut setup: WorkerSetup) -> Self {
        let name = format!("{} worker", t.ladder.prefix);
        setup.name = name.clone();
        let worker = Worker::start(setup).await.unwrap();
        let metrics = worker.metrics();
        let vitals = worker.vitals_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(worker.run(async {
            let _ = stopped.await;
        }));
        Self {
            metrics,
            name,
            vitals,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Asks the worker to drain and waits for it to return.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

/// Checks `done` every `poll` until it holds or `timeout` passes, blocking the thread (for
/// `rabbitmqctl` and the like); returns whether it held.
pub fn wait_until_blocking(
    timeout: Duration,
    poll: Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(poll);
    }
}

/// A ladder file for the command line, naming the test's prefix and tiers.
pub fn ladder_file(t: &TestLadder, dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("ladder.toml");
    std::fs::write(&path, kit::ladder_toml(&t.ladder)).unwrap();
    path
}

/// A subscriptions file in a directory of its own, which a test may rewrite while a worker
/// reads it.
pub struct SubsFile {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SubsFile {
    pub fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subscriptions.toml");
        std::fs::write(&path, text).unwrap();
        Self { path, _dir: dir }
    }

    pub fn write(&self, text: &str) {
        // Write-then-rename, as editors and config managers do.
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }
}

/// `hookrelay worker` as a process of its own (see `kit::worker_command`).
pub fn worker_process(name: &str, ladder: &Path, subscriptions: &Path) -> tokio::process::Command {
    let mut command = kit::worker_command(
        Path::new(env!("CARGO_BIN_EXE_hookrelay")),
        name,
        ladder,
        subscriptions,
    );
    // As in [`config`]: envelopes deferred for a full endpoint cap under load must not expire at
    // a test ladder's span of seconds.
    command.env("HOOKRELAY_ENDPOINTS_HORIZON", "10m");
    command
}

/// Runs the hookrelay binary with `args`; (exit code, stdout, stderr).
pub fn hookrelay(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An endpoint that answers 204 to everything and verifies with `secret`.
pub async fn ok_receiver(secret: &Secret) -> Receiver {
    Receiver::start(std::slice::from_ref(&secret.whsec), |_| {
        hookrelay_tools::receiver::Reply::Status(204)
    })
    .await
    .unwrap()
}

/// The `message_id` of each message, in order (a message without one is left out).
pub fn message_ids(messages: &[BasicGetMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| m.delivery.properties.message_id().as_ref())
        .map(|i| i.to_string())
        .collect()
}

/// A receiver that answers 503 to each envelope's first attempt and 200 to the next, so each
/// delivery takes one retry.
pub async fn failing_first_attempts(secret: &Secret) -> Receiver {
    use hookrelay_tools::receiver::Reply;
    Receiver::start(std::slice::from_ref(&secret.whsec), |req| {
        match req.attempt {
            1 => Reply::Status(503),
            _ => Reply::Status(200),
        }
    })
    .await
    .unwrap()
}

/// A receiver that fails every request until the returned switch is set, then answers 200:
/// 400 (rejected) for an id containing `reject_marker`, 500 for any other.
pub async fn failing_until_healthy(
    secret: &Secret,
    reject_marker: &'static str,
) -> (Receiver, Arc<std::sync::atomic::AtomicBool>) {
    use hookrelay_tools::receiver::Reply;
    use std::sync::atomic::{AtomicBool, Ordering};
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&healthy);
    let receiver = Receiver::start(std::slice::from_ref(&secret.whsec), move |req| {
        if flag.load(Ordering::SeqCst) {
            Reply::Status(200)
        } else if req.id.contains(reject_marker) {
            Reply::Status(400)
        } else {
            Reply::Status(500)
        }
    })
    .await
    .unwrap();
    (receiver, healthy)
}

/// A value sealed as hookrelay sealed before a sealed value was bound to its tenant and
/// purpose: `1 | key id | nonce | ciphertext`, the subscription id alone as associated data.
pub fn seal_old_form(key: &str, subscription_id: &str, secret: &[u8]) -> Vec<u8> {
    use base64::Engine;
    use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
    use sha2::Digest;
    let key = base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap();
    let cipher = chacha20poly1305::XChaCha20Poly1305::new_from_slice(&key).unwrap();
    let nonce = chacha20poly1305::XChaCha20Poly1305::generate_nonce(&mut OsRng);
    let sealed = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: secret,
                aad: subscription_id.as_bytes(),
            },
        )
        .unwrap();
    let mut out = vec![1u8];
    out.extend_from_slice(&sha2::Sha256::digest(&key)[..4]);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    out
}
