//! AMQP destinations: deliveries per second into a partner's broker (a RabbitMQ node of the
//! bench's own, started on free ports and stopped after) against a raw lapin loop publishing
//! the same bodies with confirms, `mandatory` and persistent, to the same exchange of the same
//! node, with as many confirms outstanding as the worker may have attempts in flight to the
//! destination ([`IN_FLIGHT`], the default endpoint cap: as many connections to the partner).
//!
//! hookrelay's figure runs from the first message's arrival in the partner's queue to the
//! last's, its events published into the ladder beforehand; the raw loop's from its first
//! publish to its last confirm.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use serde::Serialize;

use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::Ladder;
use hookrelay::contract::signing::generate_secret;

use super::{
    BenchError, BenchOptions, BenchSession, Binaries, body, file_secret, publish_many, say,
    start_worker, subscription_toml, to_ingress, uncapped,
};
use crate::node::Node;

/// One pair of runs: the raw loop's rate and hookrelay's, deliveries per second.
#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub raw: f64,
    pub hookrelay: f64,
    pub ratio: f64,
}

/// The subscription's `max_concurrent`, and the raw loop's confirms outstanding.
pub const IN_FLIGHT: u16 = 64;

const EXCHANGE: &str = "hooks";
const QUEUE: &str = "inbox";

/// Counts what arrives in the partner's queue, with the first and last arrival.
#[derive(Default)]
struct Arrivals {
    count: AtomicU64,
    first_us: AtomicU64,
    last_us: AtomicU64,
}

impl Arrivals {
    fn reset(&self) {
        self.count.store(0, Ordering::SeqCst);
        self.first_us.store(0, Ordering::SeqCst);
        self.last_us.store(0, Ordering::SeqCst);
    }

    fn saw(&self, at: &Instant, now: Instant) {
        let us = now.duration_since(*at).as_micros() as u64;
        let _ = self
            .first_us
            .compare_exchange(0, us, Ordering::SeqCst, Ordering::SeqCst);
        self.last_us.store(us, Ordering::SeqCst);
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn seconds(&self) -> f64 {
        let first = self.first_us.load(Ordering::SeqCst);
        let last = self.last_us.load(Ordering::SeqCst);
        (last.saturating_sub(first)) as f64 / 1e6
    }
}

/// `repeat` pairs of runs, raw loop first in each.
pub async fn run(
    config: &Config,
    options: &BenchOptions,
    binaries: &Binaries,
    repeat: usize,
) -> Result<Vec<Pair>, BenchError> {
    say("starting the partner's RabbitMQ node");
    let node = tokio::task::spawn_blocking(|| Node::start("bench-partner"))
        .await
        .map_err(|e| BenchError::Other(e.to_string()))?
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let partner_url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", node.amqp_port);
    let partner = Connection::connect(&partner_url, ConnectionProperties::default()).await?;
    let setup = partner.create_channel().await?;
    setup
        .exchange_declare(
            EXCHANGE.into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    setup
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    setup
        .queue_bind(
            QUEUE.into(),
            EXCHANGE.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    // The partner's consumer: takes everything, counts it.
    let arrivals = Arc::new(Arrivals::default());
    let epoch = Instant::now();
    let consumer_channel = partner.create_channel().await?;
    let mut consumer = consumer_channel
        .basic_consume(
            QUEUE.into(),
            "bench-partner".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let counting = Arc::clone(&arrivals);
    let consume = tokio::spawn(async move {
        while let Some(Ok(_)) = consumer.next().await {
            counting.saw(&epoch, Instant::now());
        }
    });

    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let session = BenchSession::open(config, &format!("hookrelay-bench-{run_id}")).await?;
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let password_file = secret_dir.path().join("partner.pw");
    std::fs::write(&password_file, "guest")?;
    let subscriptions = subscription_toml(
        "bench_amqp",
        "bench",
        &format!("amqp://127.0.0.1:{}/%2f", node.amqp_port),
        &file_secret(&secret_file),
        &format!(
            "basic_auth = {{ username = \"guest\", password = {} }}\n\
             amqp = {{ exchange = \"{EXCHANGE}\" }}\nmax_concurrent = {IN_FLIGHT}\n",
            file_secret(&password_file)
        ),
    );
    let n = options.events;
    let mut pairs = Vec::with_capacity(repeat);
    for r in 0..repeat {
        setup
            .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await?;
        let raw = raw_loop(&partner, n, IN_FLIGHT).await?;
        wait_arrivals(&arrivals, n as u64).await?;
        arrivals.reset();
        say(&format!("run {}: raw loop: {raw:.0} publishes/s", r + 1));

        let ladder = Ladder::build(
            &format!("hookrelay-bench-{run_id}-{r}"),
            options.queue_type,
            &["1s", "10s"],
            &["1s", "10s"],
        )?;
        let topology = ladder.objects();
        topology.apply(&session.channel).await?;
        let ingress = ladder.ingress();
        publish_many(&session.publisher, n, |i| {
            to_ingress(
                &ingress,
                NewEvent {
                    id: format!("evt_{i}"),
                    tenant: "bench".into(),
                    event_type: "bench.event".into(),
                    subscription: Some("bench_amqp".into()),
                    timestamp: None,
                    body: body(i),
                },
            )
        })
        .await?;
        let mut worker = start_worker(
            &binaries.worker,
            config,
            &ladder,
            Some(options.prefetch),
            &subscriptions,
            &uncapped(),
        )
        .await?;
        let waited = wait_arrivals(&arrivals, n as u64).await;
        let _ = worker.child.kill().await;
        let _ = topology.delete(&session.channel).await;
        waited?;
        let ours = n as f64 / arrivals.seconds().max(1e-9);
        arrivals.reset();
        say(&format!("run {}: hookrelay: {ours:.0} deliveries/s", r + 1));
        pairs.push(Pair {
            raw,
            hookrelay: ours,
            ratio: ours / raw.max(1e-9),
        });
    }
    consume.abort();
    session.publisher.close().await;
    let _ = session.conn.close(200, "bench done".into()).await;
    let _ = partner.close(200, "bench done".into()).await;
    drop(node);
    Ok(pairs)
}

/// `n` bodies published to the partner's exchange with confirms, up to `window` outstanding;
/// publishes per second from the first publish to the last confirm.
async fn raw_loop(partner: &Connection, n: usize, window: u16) -> Result<f64, BenchError> {
    let channel = partner.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let started = Instant::now();
    let mut confirms = futures_util::stream::FuturesUnordered::new();
    for i in 0..n {
        let confirm = channel
            .basic_publish(
                EXCHANGE.into(),
                "bench.event".into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &body(i),
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into()),
            )
            .await?;
        confirms.push(confirm);
        while confirms.len() >= usize::from(window.max(1)) {
            if let Some(c) = confirms.next().await {
                c?;
            }
        }
    }
    while let Some(c) = confirms.next().await {
        c?;
    }
    let secs = started.elapsed().as_secs_f64();
    let _ = channel.close(200, "done".into()).await;
    Ok(n as f64 / secs.max(1e-9))
}

async fn wait_arrivals(arrivals: &Arrivals, n: u64) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while arrivals.count.load(Ordering::SeqCst) < n {
        if Instant::now() > deadline {
            return Err(BenchError::Other(format!(
                "{} of {n} messages reached the partner within 600 s",
                arrivals.count.load(Ordering::SeqCst)
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
