//! Shared by the integration tests: every test owns a ladder under a unique prefix on the real
//! broker, and removes it when done (also when it panics).

#![allow(dead_code)]

pub mod node;

use std::sync::Arc;
use std::time::Duration;

use hookrelay::broker::management::Management;
use hookrelay::broker::publish::Publisher;
use hookrelay::broker::topology::{Ladder, QueueType};
use hookrelay::config::{Config, ProcessEnv};
use hookrelay::contract::envelope::NewEvent;
use hookrelay::delivery::signing::generate_secret;
use hookrelay::delivery::subscriptions::{
    LiveSubscriptions, SecretRef, SecretStore, Subscription, Subscriptions,
};
use hookrelay::delivery::worker::{Worker, WorkerSetup};
use hookrelay::observe::metrics::Metrics;
use hookrelay_tools::receiver::Receiver;
use lapin::message::BasicGetMessage;
use lapin::options::BasicGetOptions;
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
    config.endpoints.wait = Duration::from_secs(1);
    // Tests that fail endpoints on purpose would otherwise trip breakers; those that test the
    // breaker set their own threshold.
    config.endpoints.breaker_failures = 100_000;
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

pub fn management(config: &Config) -> Management {
    Management::new(&config.management.url, "/").expect("management client")
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
        let conn = connect(&config).await;
        let channel = conn.create_channel().await.unwrap();
        ladder.objects().apply(&channel).await.unwrap();
        Self {
            ladder,
            config,
            conn,
            channel,
            owned: true,
            extra_queues: Default::default(),
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
        }
    }

    /// Messages in a queue (ready ones; nobody consumes the sink).
    pub async fn depth(&self, queue: &str) -> u32 {
        let channel = self.conn.create_channel().await.unwrap();
        let n = hookrelay::ops::mover::depth(&channel, queue).await.unwrap();
        let _ = channel.close(200, "".into()).await;
        n
    }

    /// Takes every message out of the dead sink.
    pub async fn drain_dead(&self) -> Vec<BasicGetMessage> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(
                self.ladder.dead().as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            out.push(m);
        }
        out
    }

    /// Waits until the dead sink holds at least `n` messages.
    pub async fn wait_dead(&self, n: u32, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if self.depth(&self.ladder.dead()).await >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Removes `queue` (declared by the test beside the ladder) when this is dropped.
    pub fn owns_queue(&self, queue: &str) {
        self.extra_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queue.to_owned());
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
        // Async cleanup from a destructor: a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(conn) =
                    Connection::connect(url.expose(), ConnectionProperties::default()).await
                    && let Ok(ch) = conn.create_channel().await
                {
                    let _ = topology.delete(&ch).await;
                    for queue in extra {
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

    pub async fn start_with(
        t: &TestLadder,
        config: Config,
        subscriptions: Vec<Subscription>,
    ) -> Self {
        let live = LiveSubscriptions::fixed(Subscriptions::from_list(subscriptions));
        Self::start_setup(t, WorkerSetup::new(config, t.ladder.clone(), live)).await
    }

    /// Starts a worker from a setup; its name and a fast secret refresh are set here.
    pub async fn start_setup(t: &TestLadder, mut setup: WorkerSetup) -> Self {
        let name = format!("{} worker", t.ladder.prefix);
        setup.name = name.clone();
        setup.secrets = SecretStore::new(Duration::from_millis(100));
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

/// A ladder file for the command line, naming the test's prefix and tiers.
pub fn ladder_file(t: &TestLadder, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("ladder.toml");
    let list = |v: Vec<String>| {
        v.iter()
            .map(|d| format!("\"{d}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let tiers = t
        .ladder
        .tiers
        .iter()
        .map(|tier| hookrelay::units::fmt_duration(tier.delay))
        .collect();
    let schedule = t
        .ladder
        .schedule
        .iter()
        .map(|&i| hookrelay::units::fmt_duration(t.ladder.tiers[i].delay))
        .collect();
    std::fs::write(
        &path,
        format!(
            "prefix = \"{}\"\nqueue_type = \"{}\"\ntiers = [{}]\nschedule = [{}]\n",
            t.ladder.prefix,
            t.ladder.queue_type.as_str(),
            list(tiers),
            list(schedule)
        ),
    )
    .unwrap();
    path
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
