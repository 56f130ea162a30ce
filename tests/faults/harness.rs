//! What every scenario shares: the setup ([`Scenario`]: a ladder, an endpoint with the mixed
//! script, a worker), the load (a careful producer), and the verdict ([`Account`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::common::node::Node;
use crate::common::{
    self, RunningWorker, Secret, SubsFile, TestLadder, secret, subscription, subscription_toml,
    wait_until,
};
use hookrelay::broker::publish::Publisher;
use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::subscriptions::Subscription;
use hookrelay_tools::node::Install;
use hookrelay_tools::receiver::{Receiver, Reply};
use lapin::options::BasicGetOptions;

pub const N: usize = 3000;
pub const SETTLE: Duration = Duration::from_secs(180);

/// The mixed load: 5% rejected (400), 10% fail once (503) then succeed, 5% for a disabled
/// subscription (cancelled), the rest delivered at once.
fn index(id: &str) -> usize {
    id.rsplit('_')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn mixed_receiver(s: &Secret) -> Receiver {
    Receiver::start(std::slice::from_ref(&s.whsec), |req| {
        let i = index(req.id);
        match (i % 20, i % 10, req.attempt) {
            (0, _, _) => Reply::Status(400),
            (_, 1, 1) => Reply::Status(503),
            _ => Reply::Status(200),
        }
    })
    .await
    .unwrap()
}

/// Each tenant's two subscriptions: `sub_on_<tenant>`, and `sub_off_<tenant>`, disabled.
fn sub_id(kind: &str, tenant: &str) -> String {
    format!("{kind}_{tenant}")
}

fn mixed_subscriptions(receiver: &Receiver, s: &Secret, tenants: &[String]) -> Vec<Subscription> {
    tenants
        .iter()
        .flat_map(|tenant| {
            let mut off =
                subscription(&sub_id("sub_off", tenant), tenant, &receiver.url("/off"), s);
            off.enabled = false;
            [
                subscription(&sub_id("sub_on", tenant), tenant, &receiver.url("/"), s),
                off,
            ]
        })
        .collect()
}

/// Event `i` of the load: its tenant is `tenants[i % tenants.len()]` (see [`tenant_of`]).
fn mixed_event(tag: &str, i: usize, tenants: &[String]) -> NewEvent {
    let tenant = &tenants[i % tenants.len()];
    let sub = if i % 20 == 3 { "sub_off" } else { "sub_on" };
    common::event(&format!("{tag}_{i:05}"), tenant, &sub_id(sub, tenant))
}

/// The tenant of the load's event `id`.
pub fn tenant_of<'a>(id: &str, tenants: &'a [String]) -> &'a str {
    &tenants[index(id) % tenants.len()]
}

/// Publishes the producer keeps in flight at once.
pub const PRODUCER_IN_FLIGHT: usize = 64;

/// Publishes like a careful producer: retries each event (same id) until the broker confirms.
/// Returns the ids, all of them confirmed.
async fn publish_load(
    config: Config,
    ingress: String,
    tag: String,
    tenants: Vec<String>,
    n: usize,
) -> Vec<String> {
    let publisher = Arc::new(
        Publisher::connect(
            &config.amqp.url,
            &format!("{ingress} producer"),
            Duration::from_secs(5),
        )
        .await
        .unwrap(),
    );
    let ids = Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let started = Instant::now();
    futures_util::StreamExt::for_each_concurrent(
        futures_util::stream::iter(0..n),
        PRODUCER_IN_FLIGHT,
        |i| {
            let publisher = Arc::clone(&publisher);
            let ingress = ingress.clone();
            let ids = Arc::clone(&ids);
            let tag = tag.clone();
            let tenants = tenants.clone();
            async move {
                let e = mixed_event(&tag, i, &tenants);
                let mut tries = 0;
                while let Err(err) = publisher.publish_event(&ingress, &e, 4096).await {
                    // Every publish fails while the broker is away; a few lines tell how.
                    tries += 1;
                    if tries == 1 || tries % 50 == 0 {
                        eprintln!(
                            "producer at {:.1?}: {} not yet published (try {tries}): {err}",
                            started.elapsed(),
                            e.id
                        );
                    }
                    // A pause between tries, as a producer backs off while the broker is away.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                ids.lock().unwrap().push(e.id);
            }
        },
    )
    .await;
    publisher.close().await;
    Arc::try_unwrap(ids).unwrap().into_inner().unwrap()
}

/// The version of `install`, which `scenario` needs to be RabbitMQ 4 or later (its nodes come
/// from `TEST_RABBITMQ_ROOT`, see `rabbitmq/v4`).
pub fn rabbitmq_4(install: &Install, scenario: &str) -> String {
    let version = install.version().unwrap_or_default();
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    assert!(
        major >= Some(4),
        "{scenario} needs RabbitMQ 4 nodes (TEST_RABBITMQ_ROOT from rabbitmq/v4), not {version:?}"
    );
    version
}

/// The broker a scenario ran on, for its `FAULT-TABLE` line: `RabbitMQ 4.0.5`.
pub async fn broker(config: &Config) -> String {
    match common::management(config).broker_version().await {
        Ok(v) => format!("RabbitMQ {v}"),
        Err(_) => "RabbitMQ (version unknown)".to_owned(),
    }
}

/// Where the published envelopes ended, counted from outside the worker.
pub struct Account {
    broker: String,
    published: usize,
    delivered: usize,
    dead: usize,
    cancelled: usize,
    /// Published ids in no terminal state.
    missing: Vec<String>,
    duplicated: usize,
    unexpected: usize,
}

/// Waits until every published id has reached a terminal state (or `SETTLE` passes), then
/// counts from the endpoint, the dead sink and the attempt log.
async fn account(
    t: &TestLadder,
    receiver: &Receiver,
    published: &[String],
    cancelled_queue: &str,
) -> Account {
    let mut dead = HashSet::new();
    let mut cancelled = HashSet::new();
    wait_until(SETTLE, async || {
        for m in t.drain_dead().await {
            if let Some(id) = m.delivery.properties.message_id() {
                dead.insert(id.to_string());
            }
        }
        while let Some(m) = t
            .channel
            .basic_get(cancelled_queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            // A batch bound for `cancelled.*` may carry other outcomes' records too.
            for r in
                hookrelay::observe::events::AttemptRecord::read_message(&m.delivery.data).unwrap()
            {
                if r.outcome == "cancelled" {
                    cancelled.insert(r.envelope.unwrap());
                }
            }
        }
        let delivered = receiver.delivered();
        let open = published
            .iter()
            .filter(|id| {
                !delivered.contains_key(*id) && !dead.contains(*id) && !cancelled.contains(*id)
            })
            .count();
        open == 0
    })
    .await;
    let delivered = receiver.delivered();
    let published_set: HashSet<&String> = published.iter().collect();
    let missing: Vec<String> = published
        .iter()
        .filter(|id| {
            !delivered.contains_key(*id) && !dead.contains(*id) && !cancelled.contains(*id)
        })
        .cloned()
        .collect();
    Account {
        broker: broker(&t.config).await,
        published: published.len(),
        delivered: delivered.len(),
        dead: dead.len(),
        cancelled: cancelled.len(),
        missing,
        duplicated: delivered.values().map(|&n| n as usize - 1).sum(),
        unexpected: delivered
            .keys()
            .filter(|id| !published_set.contains(id))
            .count(),
    }
}

/// Messages the ladder's tiers (and deferral queues) hold but neither offer nor have handed out:
/// dead-lettered out of one and not yet accepted by the retry lane (the broker keeps them until it is). Only the
/// cluster scenario can measure it, and so only it can excuse missing envelopes with it.
pub struct HeldInTiers(usize);

impl HeldInTiers {
    /// Reads the tiers through `view`, a connection to a node of `cluster`.
    pub async fn measure(cluster: &[Node], view: &TestLadder) -> Self {
        assert!(
            cluster.len() > 1,
            "only the cluster scenario may count envelopes as held by a tier"
        );
        let mut held = 0;
        let api = common::management(&view.config);
        if let Ok(queues) = api.queues().await {
            // Every TTL queue of the ladder: the retry tiers and the deferral queues, which
            // dead-letter alike.
            for q in queues.iter().filter(|q| {
                matches!(
                    view.ladder.role_of(&q.name),
                    Some(hookrelay::contract::ladder::QueueRole::Tier(_))
                )
            }) {
                let n = q.messages.unwrap_or(0) - q.messages_ready - q.messages_unacknowledged;
                held += n.max(0) as usize;
            }
        }
        Self(held)
    }
}

impl Account {
    /// The broker's major version (0 when unknown).
    pub fn broker_major(&self) -> u32 {
        self.broker
            .strip_prefix("RabbitMQ ")
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// The verdict of every scenario but the cluster one: a published envelope in no terminal
    /// state is lost, whatever the broker may still hold.
    pub fn check(&self, scenario: &str, max_duplicates: usize) {
        self.verdict(scenario, max_duplicates, 0);
    }

    /// The cluster scenario's verdict on RabbitMQ 3. RabbitMQ 3.10.8 can strand dead-lettered messages in a
    /// tier after a quorum leader is lost (docs/guarantees.md): the broker reports them as
    /// messages of the tier, not ready and not handed out. Missing envelopes, as far as the
    /// tiers hold such messages, count as held rather than lost; a message cannot be told apart
    /// there, so they are counted, never named.
    pub fn check_in_cluster(&self, scenario: &str, max_duplicates: usize, held: HeldInTiers) {
        self.verdict(scenario, max_duplicates, held.0);
    }

    /// The invariants every scenario ends with; `stranded` is what the tiers hold (0 but in
    /// the cluster scenario).
    fn verdict(&self, scenario: &str, max_duplicates: usize, stranded: usize) {
        let held = self.missing.len().min(stranded);
        let lost = self.missing.len() - held;
        let held_column = if held > 0 {
            format!(" held by a tier, unpromoted {held} |")
        } else {
            String::new()
        };
        println!(
            "FAULT-TABLE | {} | {scenario} | published {} | delivered {} | dead {} | cancelled {} |{held_column} lost {lost} | duplicated {} |",
            self.broker, self.published, self.delivered, self.dead, self.cancelled, self.duplicated
        );
        assert_eq!(
            lost,
            0,
            "{scenario}: {} published envelopes in no terminal state and {stranded} held by a tier: {:?}",
            self.missing.len(),
            &self.missing[..self.missing.len().min(10)]
        );
        assert_eq!(
            self.unexpected, 0,
            "{scenario}: deliveries with ids nobody published"
        );
        // The mix is deterministic: 5% rejected, 5% cancelled. An envelope deferred for a full
        // cap waits in a tier before its first attempt, so envelopes held by a tier may include
        // some that are to be rejected.
        let rejected = self.published / 20;
        assert!(
            self.dead <= rejected && self.dead + held >= rejected,
            "{scenario}: dead {}, of {rejected} to be rejected, with {held} held by a tier",
            self.dead
        );
        assert_eq!(self.cancelled, self.published / 20, "{scenario}: cancelled");
        assert_eq!(
            self.delivered + held,
            self.published - self.dead - self.cancelled,
            "{scenario}: delivered, or held by a tier on the way"
        );
        assert!(
            self.duplicated <= max_duplicates,
            "{scenario}: {} duplicates, bound {max_duplicates}",
            self.duplicated
        );
    }
}

/// One scenario's pieces: its ladder, the endpoint with the mixed script, and the queue keeping
/// the attempt log's `cancelled` records.
pub struct Scenario {
    pub t: TestLadder,
    pub receiver: Receiver,
    /// The load's tenants, each with its subscriptions: `acme` alone, or (sharded) one per
    /// shard, in shard order.
    pub tenants: Vec<String>,
    secret: Secret,
    name: String,
    cancelled: String,
}

impl Scenario {
    /// The ladder, declared through the broker `config` names, the endpoint, and the attempt
    /// log's queue, bound before any load.
    pub async fn setup(config: Config, name: &str) -> Self {
        Self::setup_sharded(config, name, 1).await
    }

    /// As [`Scenario::setup`], with `shards` shared lane pairs and, above one, one tenant in
    /// each shard (found by asking the broker where probes land, before any load).
    pub async fn setup_sharded(config: Config, name: &str, shards: u16) -> Self {
        let ladder = Self::ladder(name).with_shards(shards).unwrap();
        Self::setup_ladder(config, name, ladder).await
    }

    /// The scenarios' ladder: quorum queues, tiers of 300 ms and 1 s, four attempts.
    pub fn ladder(name: &str) -> Ladder {
        Ladder::build(
            &common::unique(name),
            QueueType::Quorum,
            &["300ms", "1s"],
            &["300ms", "1s", "1s"],
        )
        .unwrap()
    }

    /// As [`Scenario::setup`], with `ladder` (from [`Scenario::ladder`]), applied again if it
    /// is already.
    pub async fn setup_ladder(config: Config, name: &str, ladder: Ladder) -> Self {
        let shards = ladder.shards;
        let t = TestLadder::apply_ladder(config, ladder).await;
        let tenants = if shards > 1 {
            let candidates: Vec<String> = (0..40).map(|i| format!("tenant-{i}")).collect();
            let mut first_of_shard = std::collections::BTreeMap::new();
            for (tenant, shard) in t.shard_of(&candidates).await {
                first_of_shard.entry(shard).or_insert(tenant);
            }
            assert_eq!(
                first_of_shard.len(),
                usize::from(shards),
                "40 tenants cover every shard"
            );
            first_of_shard.into_values().collect()
        } else {
            vec!["acme".to_owned()]
        };
        let secret = secret();
        let receiver = mixed_receiver(&secret).await;
        let cancelled = t.attempt_log_queue("cancelled", "cancelled.*").await;
        Self {
            t,
            receiver,
            tenants,
            secret,
            name: name.to_owned(),
            cancelled,
        }
    }

    /// An in-process worker with the mixed subscriptions, on the broker `t.config` names.
    pub async fn start_worker(&self) -> RunningWorker {
        RunningWorker::start_with(
            &self.t,
            self.t.config.clone(),
            mixed_subscriptions(&self.receiver, &self.secret, &self.tenants),
        )
        .await
    }

    /// The mixed subscriptions as a file, for a worker process of its own.
    pub fn subscriptions_file(&self) -> SubsFile {
        let entry = |kind: &str, tenant: &str, path: &str, extra: &str| {
            subscription_toml(
                &sub_id(kind, tenant),
                tenant,
                &self.receiver.url(path),
                &self.secret.file_ref(),
                extra,
            )
        };
        let file: String = self
            .tenants
            .iter()
            .map(|tenant| {
                entry("sub_on", tenant, "/", "")
                    + &entry("sub_off", tenant, "/off", "enabled = false")
            })
            .collect();
        SubsFile::new(&file)
    }

    /// The load, published in the background on the broker `t.config` names; yields the ids
    /// the broker confirmed.
    pub fn start_load(&self) -> JoinHandle<Vec<String>> {
        self.start_load_via(self.t.config.clone())
    }

    /// [`Scenario::start_load`] through the broker `config` names (another cluster node).
    pub fn start_load_via(&self, config: Config) -> JoinHandle<Vec<String>> {
        tokio::spawn(publish_load(
            config,
            self.t.ladder.ingress(),
            self.name.clone(),
            self.tenants.clone(),
            N,
        ))
    }

    /// The most duplicates `faults` broker faults may cause: per fault, what the worker had in
    /// flight (each delivered again, or its stored replacement beside the redelivered original)
    /// and what the producer had in flight (a publish stored but not confirmed before the fault is
    /// published again, with the same id).
    pub fn duplicate_bound(&self, faults: usize) -> usize {
        faults * (self.t.config.worker.in_flight as usize + PRODUCER_IN_FLIGHT)
    }

    /// Waits until the endpoint has delivered `n` envelopes.
    pub async fn wait_delivered(&self, n: usize) {
        assert!(
            self.receiver
                .wait_until(SETTLE, |r| r.delivered_count() >= n)
                .await
        );
    }

    /// Another connection to the ladder, through the broker `config` names: the test's own
    /// may not have survived the fault.
    pub async fn view(&self, config: Config) -> TestLadder {
        TestLadder::view(self.t.ladder.clone(), config).await
    }

    /// The account of `published`, read through `view` (see [`account`]).
    pub async fn account(&self, view: &TestLadder, published: &[String]) -> Account {
        account(view, &self.receiver, published, &self.cancelled).await
    }
}

/// What the attempt log's stream holds of a scenario: the envelopes with a `delivered` record,
/// and the records in all, read through `view` once the worker has stopped.
pub struct Records {
    pub delivered: HashSet<String>,
    pub records: usize,
}

impl Records {
    pub async fn read(view: &TestLadder) -> Self {
        use hookrelay::broker::streams::{StreamReadError, end_of, read_window};
        let stream = view
            .ladder
            .stream(hookrelay::contract::retention::StreamKind::Attempts);
        let mut this = Self {
            delivered: HashSet::new(),
            records: 0,
        };
        let Some(end) = end_of(&view.conn, &stream, None).await.unwrap() else {
            return this;
        };
        read_window::<StreamReadError>(
            &view.conn,
            &stream,
            std::time::UNIX_EPOCH,
            end,
            |_| (),
            async |d| {
                for r in hookrelay::observe::events::AttemptRecord::read_message(&d.data).unwrap() {
                    this.records += 1;
                    if r.outcome == "delivered"
                        && let Some(id) = r.envelope
                    {
                        this.delivered.insert(id);
                    }
                }
                Ok(())
            },
        )
        .await
        .unwrap();
        this
    }

    /// Waits (at most [`SETTLE`]) until every envelope the endpoint got has its `delivered`
    /// record. A delivery a killed worker made but never acked is delivered again, perhaps
    /// late (deferred behind a full endpoint cap), and recorded only then: the account counts
    /// it delivered already.
    pub async fn wait(view: &TestLadder, receiver: &Receiver) {
        wait_until(SETTLE, async || {
            let records = Self::read(view).await;
            receiver
                .delivered()
                .keys()
                .all(|id| records.delivered.contains(id))
        })
        .await;
    }

    /// Every envelope the endpoint got has its `delivered` record: no record lost. (A record
    /// may be stored twice, when a batch is sent again after a lost confirm.)
    pub fn check(&self, scenario: &str, receiver: &Receiver) {
        let delivered = receiver.delivered();
        let unrecorded: Vec<&String> = delivered
            .keys()
            .filter(|id| !self.delivered.contains(*id))
            .collect();
        println!(
            "RECORD-TABLE | {scenario} | delivered {} | records {} | delivered without a record {} |",
            delivered.len(),
            self.records,
            unrecorded.len()
        );
        assert!(
            unrecorded.is_empty(),
            "{scenario}: {} deliveries without their record: {:?}",
            unrecorded.len(),
            &unrecorded[..unrecorded.len().min(10)]
        );
    }
}
