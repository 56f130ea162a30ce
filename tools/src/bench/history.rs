//! History at scale (`hookrelay-dev bench --history`), in a PostgreSQL database of the bench's
//! own (migrated, dropped after) and a ladder of its own:
//!
//! - **materialization**: `--history-records` attempt records published to the attempt log's
//!   stream beforehand, then `hookrelay history`'s loop (the library's, in this process, with
//!   the default batch and flush) started, timed until its stored offset reaches the last;
//! - **lag under steady load**: records published at `--history-rate` per second for
//!   `--history-seconds` while it runs, each one's lag taken from its publish to the first poll
//!   (every 20 ms) of the stored offset past it;
//! - **trace at scale**: `--history-rows` attempt rows (five per event, over ten day
//!   partitions) and one event row per event inserted with `generate_series`, then the story of
//!   random events read through the library (`hookrelay trace`'s query) and through the API
//!   (`GET /v1/events/{id}` over HTTP on loopback), timed one after another.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use lapin::BasicProperties;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use hookrelay::config::Config;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::history::materialize::{self, HistorySetup};
use hookrelay::history::{HistoryMetrics, rows, trace};
use hookrelay::observe::events::AttemptRecord;
use hookrelay::store::PgStore;

use super::{BenchError, BenchSession, machine, publish_many, say};
use crate::kit::{Percentiles, ScratchDb, pg_server_url};

#[derive(Debug, Clone)]
pub struct HistoryOptions {
    pub records: usize,
    pub rate: u32,
    pub seconds: u64,
    pub rows: u64,
    pub lookups: usize,
    pub queue_type: QueueType,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct HistoryReport {
    pub machine: String,
    pub broker: String,
    pub records: usize,
    pub materialize_seconds: f64,
    pub records_per_second: f64,
    pub steady_rate: u32,
    pub steady_records: usize,
    pub lag: Percentiles,
    pub rows: u64,
    pub fill_seconds: f64,
    pub table_mib: f64,
    pub trace: Percentiles,
    pub api: Percentiles,
}

fn record(i: usize) -> (String, String, Vec<u8>, BasicProperties) {
    let r = AttemptRecord {
        envelope: Some(format!("evt_{i:09}")),
        event: None,
        tenant: Some(format!("t{}", i % 100)),
        subscription: Some(format!("sub_{}", i % 1000)),
        attempt: 1,
        status: Some(204),
        error: None,
        latency_ms: Some(3),
        outcome: "delivered".into(),
        tier: None,
        lane: "hookrelay-bench.ready.first".into(),
        redrives: 0,
        replay: None,
        at: hookrelay::units::now_rfc3339(),
    };
    let key = r.routing_key();
    (
        String::new(),
        key,
        serde_json::to_vec(&r).unwrap_or_default(),
        BasicProperties::default(),
    )
}

async fn next_offset(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT max(next_offset) FROM history_progress WHERE stream LIKE '%attempts'",
    )
    .fetch_one(pool)
    .await
    .unwrap_or(Some(0))
    .unwrap_or(0)
}

pub async fn run(config: &Config, options: &HistoryOptions) -> Result<HistoryReport, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-{run_id}");
    let session = BenchSession::open(config, &prefix).await?;
    let db = ScratchDb::create_on(&pg_server_url(), "hookrelay_bench_history").await?;
    let store = PgStore::connect(&db.url, Duration::from_secs(5)).await?;
    store.migrate().await?;
    let pool = store.pool().clone();
    let mut report = HistoryReport {
        machine: machine(),
        broker: format!("RabbitMQ {}", session.broker),
        records: options.records,
        steady_rate: options.rate,
        rows: options.rows,
        ..HistoryReport::default()
    };
    let ladder = Ladder::build(&prefix, options.queue_type, &["1s"], &["1s"])?;
    let topology = ladder.objects();
    topology.apply(&session.channel).await?;
    let result = measure(config, options, &ladder, &session, &pool, &mut report).await;
    let _ = topology.delete(&session.channel).await;
    pool.close().await;
    drop(db);
    result.map(|()| report)
}

async fn measure(
    config: &Config,
    options: &HistoryOptions,
    ladder: &Ladder,
    session: &BenchSession,
    pool: &sqlx::PgPool,
    report: &mut HistoryReport,
) -> Result<(), BenchError> {
    let exchange = ladder.attempts_exchange();
    say(&format!(
        "publishing {} attempt records to {}",
        options.records,
        ladder.stream(hookrelay::contract::retention::StreamKind::Attempts)
    ));
    publish_many(&session.publisher, options.records, |i| {
        let (_, key, body, props) = record(i);
        (exchange.clone(), key, body, props)
    })
    .await?;

    // 1. Materialization from a full stream.
    let stop = CancellationToken::new();
    let mut history = config.history.clone();
    history.listen = None;
    let setup = HistorySetup {
        pool: pool.clone(),
        amqp_url: config.amqp.url.clone(),
        ladder: Ladder {
            // The archive holds nothing here: only the attempt log is read.
            archive: None,
            ..ladder.clone()
        },
        config: history,
        metrics: HistoryMetrics::new(),
    };
    let started = Instant::now();
    let task = tokio::spawn(materialize::run(setup, stop.clone()));
    while next_offset(pool).await < options.records as i64 {
        if started.elapsed() > Duration::from_secs(600) {
            stop.cancel();
            return Err(BenchError::Other(
                "history did not catch up in 600 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.materialize_seconds = started.elapsed().as_secs_f64();
    report.records_per_second = options.records as f64 / report.materialize_seconds;
    say(&format!(
        "materialized {} records in {:.1} s: {:.0}/s",
        options.records, report.materialize_seconds, report.records_per_second
    ));

    // 2. Lag under a steady load: offsets are publish order (the bench is the only writer).
    let n = (u64::from(options.rate) * options.seconds) as usize;
    report.steady_records = n;
    let base = options.records;
    let published: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let polls: Arc<std::sync::Mutex<Vec<(Instant, i64)>>> = Arc::default();
    let poller = {
        let polls = Arc::clone(&polls);
        let pool = pool.clone();
        let done = stop.child_token();
        let handle = tokio::spawn({
            let done = done.clone();
            async move {
                while !done.is_cancelled() {
                    let offset = next_offset(&pool).await;
                    polls
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((Instant::now(), offset));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        (handle, done)
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(
        1.0 / f64::from(options.rate.max(1)),
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut confirms = futures_util::stream::FuturesUnordered::new();
    for i in 0..n {
        tick.tick().await;
        let (_, key, body, props) = record(base + i);
        published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Instant::now());
        confirms.push(
            session
                .publisher
                .send(&exchange, &key, &body, props, true)
                .await?,
        );
        while confirms.len() >= 256 {
            use futures_util::StreamExt;
            if let Some(r) = confirms.next().await {
                r?;
            }
        }
    }
    {
        use futures_util::StreamExt;
        while let Some(r) = confirms.next().await {
            r?;
        }
    }
    let last = (base + n) as i64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while next_offset(pool).await < last && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    poller.1.cancel();
    let _ = poller.0.await;
    stop.cancel();
    let _ = task.await;
    let polls = polls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let published = published.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut lags = Vec::with_capacity(n);
    let mut p = 0;
    for (i, at) in published.iter().enumerate() {
        let offset = (base + i) as i64;
        while p < polls.len() && polls[p].1 <= offset {
            p += 1;
        }
        if let Some((seen, _)) = polls.get(p) {
            lags.push(seen.saturating_duration_since(*at).as_secs_f64() * 1000.0);
        }
    }
    report.lag = Percentiles::of(lags);
    say(&format!(
        "lag at {}/s: p50 {:.0} ms, p99 {:.0} ms ({} of {} seen)",
        options.rate, report.lag.p50_ms, report.lag.p99_ms, report.lag.count, n
    ));

    // 3. trace and GET /v1/events/{id} over many rows.
    sqlx::query("TRUNCATE history_attempts, history_events")
        .execute(pool)
        .await?;
    let today = rows::day_of(SystemTime::now());
    let days = 10u64;
    for table in ["history_attempts", "history_events"] {
        for d in 0..days {
            sqlx::query(&rows::create_partition(table, today - d))
                .execute(pool)
                .await?;
        }
    }
    let events = (options.rows / 5).max(1);
    say(&format!(
        "filling {} attempt rows and {events} event rows over {days} days",
        options.rows
    ));
    let fill = Instant::now();
    // Event e's attempts are at most a minute apart, on day e % days.
    sqlx::query(&format!(
        "INSERT INTO history_events (id, tenant, event_type, accepted_at, stream_offset) \
         SELECT 'evt_' || lpad(e::text, 10, '0'), 't' || (e % 1000), 'order.paid', \
         date_trunc('day', now()) - ((e % {days}) || ' days')::interval + (e % 80000) * interval '1 s', e \
         FROM generate_series(0, {events} - 1) AS e"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO history_attempts (envelope, tenant, subscription, attempt, status, error, \
         latency_ms, outcome, tier, lane, at, stream_offset) \
         SELECT 'evt_' || lpad((r / 5)::text, 10, '0'), 't' || ((r / 5) % 1000), \
         'sub_' || ((r / 5) % 10000), r % 5 + 1, CASE WHEN r % 5 = 4 THEN 204 ELSE 503 END, \
         CASE WHEN r % 5 = 4 THEN NULL ELSE 'HTTP 503' END, 40, \
         CASE WHEN r % 5 = 4 THEN 'delivered' ELSE 'retried' END, \
         CASE WHEN r % 5 = 4 THEN NULL ELSE 'retry-10s' END, 'hookrelay.ready.first', \
         date_trunc('day', now()) - (((r / 5) % {days}) || ' days')::interval \
           + ((r / 5) % 80000) * interval '1 s' + (r % 5) * interval '10 s', r \
         FROM generate_series(0, {} - 1) AS r",
        options.rows
    ))
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE history_attempts")
        .execute(pool)
        .await?;
    sqlx::query("ANALYZE history_events").execute(pool).await?;
    report.fill_seconds = fill.elapsed().as_secs_f64();
    let bytes: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8 FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent \
         WHERE p.relname = 'history_attempts'",
    )
    .fetch_one(pool)
    .await?;
    report.table_mib = bytes as f64 / (1024.0 * 1024.0);
    say(&format!(
        "filled in {:.0} s ({:.0} MiB with indexes)",
        report.fill_seconds, report.table_mib
    ));
    let ids: Vec<String> = (0..options.lookups)
        .map(|i| {
            let e = (i as u64).wrapping_mul(2_654_435_761) % events;
            format!("evt_{e:010}")
        })
        .collect();
    let mut ms = Vec::with_capacity(ids.len());
    for id in &ids {
        let t = Instant::now();
        let story = trace::story(pool, id, None).await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if story.is_none_or(|s| s.attempts.len() != 5) {
            return Err(BenchError::Other(format!(
                "the story of {id} is not 5 attempts"
            )));
        }
    }
    report.trace = Percentiles::of(ms);
    say(&format!(
        "trace: p50 {:.2} ms, p99 {:.2} ms",
        report.trace.p50_ms, report.trace.p99_ms
    ));

    let token = "bench-admin-token-0123456789";
    let (app, state) = hookrelay::api::router(hookrelay::api::ApiSetup {
        pool: pool.clone(),
        keyring: Arc::new(
            hookrelay::subscriptions::seal::Keyring::from_base64(&[
                hookrelay::subscriptions::seal::generate_key(),
            ])
            .map_err(|e| BenchError::Other(e.to_string()))?,
        ),
        tokens: hookrelay::api::auth::Tokens::from_plain(&[(token, None)]),
        egress: hookrelay::api::validate::Egress::new(
            hookrelay::delivery::egress::EgressPolicy::default(),
            Arc::new(hookrelay::delivery::egress::SystemLookup),
            Duration::from_secs(1),
        ),
        max_body: 64 * 1024,
        broker: None,
        history: Some(pool.clone()),
        limits: Default::default(),
        pages: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api_stop = CancellationToken::new();
    let served = tokio::spawn({
        let api_stop = api_stop.clone();
        async move {
            let _ = hookrelay::api::serve(listener, app, state, async move {
                api_stop.cancelled().await;
            })
            .await;
        }
    });
    let client = reqwest::Client::new();
    let mut ms = Vec::with_capacity(ids.len());
    for id in &ids {
        let t = Instant::now();
        let response = client
            .get(format!("http://{addr}/v1/events/{id}"))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| BenchError::Other(e.to_string()))?;
        let ok = response.status().is_success();
        let _ = response.bytes().await;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if !ok {
            return Err(BenchError::Other(format!("GET /v1/events/{id} failed")));
        }
    }
    api_stop.cancel();
    let _ = served.await;
    report.api = Percentiles::of(ms);
    say(&format!(
        "GET /v1/events/{{id}}: p50 {:.2} ms, p99 {:.2} ms",
        report.api.p50_ms, report.api.p99_ms
    ));
    Ok(())
}

impl HistoryReport {
    pub fn table(&self) -> String {
        format!(
            "History ({}, {})\n\
             materialization: {} records in {:.1} s: {:.0} records/s\n\
             lag at {}/s for {} records: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms\n\
             {} attempt rows ({:.0} MiB with indexes, filled in {:.0} s)\n\
             trace (library), {} random events: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n\
             GET /v1/events/{{id}}, same events: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
            self.machine,
            self.broker,
            self.records,
            self.materialize_seconds,
            self.records_per_second,
            self.steady_rate,
            self.steady_records,
            self.lag.p50_ms,
            self.lag.p99_ms,
            self.lag.max_ms,
            self.rows,
            self.table_mib,
            self.fill_seconds,
            self.trace.count,
            self.trace.p50_ms,
            self.trace.p99_ms,
            self.trace.max_ms,
            self.api.p50_ms,
            self.api.p99_ms,
            self.api.max_ms,
        )
    }
}

/// What `--replay` measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayRun {
    pub events: usize,
    /// Reading the window and deciding, publishing nothing.
    pub dry_seconds: f64,
    pub dry_per_second: f64,
    /// Reading and publishing each event again through the ingress, confirmed, unpaced.
    pub seconds: f64,
    pub per_second: f64,
    pub published: u64,
}

/// `events` events of one tenant published through the ingress of a ladder of its own (no
/// worker: they wait in the first-attempt lane), then replayed from the archive: a dry run and
/// a real one, each timed from start to report.
pub async fn replay(
    config: &Config,
    events: usize,
    queue_type: QueueType,
) -> Result<ReplayRun, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-{run_id}");
    let session = BenchSession::open(config, &prefix).await?;
    let ladder = Ladder::build(&prefix, queue_type, &["1s"], &["1s"])?;
    let topology = ladder.objects();
    topology.apply(&session.channel).await?;
    let result = async {
        let from = SystemTime::now() - Duration::from_secs(2);
        let ingress = ladder.ingress();
        say(&format!("publishing {events} events through {ingress}"));
        publish_many(&session.publisher, events, |i| {
            super::to_ingress(
                &ingress,
                hookrelay::contract::envelope::NewEvent {
                    id: format!("evt_{i:09}"),
                    tenant: "replayed".into(),
                    event_type: "bench.event".into(),
                    subscription: Some("sub_replayed".into()),
                    timestamp: None,
                    body: super::body(i),
                },
            )
        })
        .await?;
        let mut options = hookrelay::ops::replay::ReplayOptions {
            id: None,
            from,
            to: None,
            filter: Default::default(),
            only_undelivered: false,
            index_max: None,
            rate: None,
            dry_run: true,
        };
        let mut run = ReplayRun {
            events,
            ..ReplayRun::default()
        };
        let timed = async |options: &hookrelay::ops::replay::ReplayOptions| {
            let t = Instant::now();
            let report = hookrelay::ops::replay::replay(
                &session.conn,
                &session.publisher,
                &ladder,
                options,
                None,
                None,
            )
            .await
            .map_err(|e| BenchError::Other(e.to_string()))?;
            Ok::<_, BenchError>((report, t.elapsed().as_secs_f64()))
        };
        let (dry, seconds) = timed(&options).await?;
        run.dry_seconds = seconds;
        run.dry_per_second = dry.read as f64 / seconds;
        say(&format!("dry run: read {} in {seconds:.1} s", dry.read));
        options.dry_run = false;
        let (done, seconds) = timed(&options).await?;
        run.seconds = seconds;
        run.published = done.published;
        run.per_second = done.published as f64 / seconds;
        say(&format!(
            "replay: published {} in {seconds:.1} s",
            done.published
        ));
        Ok::<_, BenchError>(run)
    }
    .await;
    let _ = topology.delete(&session.channel).await;
    result
}

/// What `--replay-isolation` measured: tenant B's publish-to-delivery latency alone, during a
/// paced replay of tenant A's events, and during an unpaced one.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayIsolation {
    pub events: usize,
    pub rate: u32,
    pub b_idle: Percentiles,
    pub b_paced: Percentiles,
    pub paced_seconds: f64,
    pub b_unpaced: Percentiles,
    pub unpaced_seconds: f64,
}

impl ReplayIsolation {
    pub fn table(&self) -> String {
        let target = 2.0 * self.b_idle.p99_ms + 50.0;
        let verdict = |p: &Percentiles| if p.p99_ms <= target { "met" } else { "not met" };
        format!(
            "Replay of {} events of tenant A against tenant B's first attempts ({})\n\
             B alone: p50 {:.1} ms, p99 {:.1} ms (target for B: p99 <= {target:.0} ms)\n\
             B during A's replay at {}/s ({:.1} s): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms: {}\n\
             B during A's replay unpaced ({:.1} s): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms: {}\n",
            self.events,
            machine(),
            self.b_idle.p50_ms,
            self.b_idle.p99_ms,
            self.rate,
            self.paced_seconds,
            self.b_paced.p50_ms,
            self.b_paced.p99_ms,
            self.b_paced.max_ms,
            verdict(&self.b_paced),
            self.unpaced_seconds,
            self.b_unpaced.p50_ms,
            self.b_unpaced.p99_ms,
            self.b_unpaced.max_ms,
            verdict(&self.b_unpaced),
        )
    }
}

/// A worker delivers tenant A's `events` (published beforehand), then B publishes 1,000
/// events at 100/s alone, again while A's events are replayed from the archive at `rate`, and
/// again while they are replayed unpaced; one ladder (one shard), A and B on endpoints of their
/// own.
pub async fn replay_isolation(
    config: &Config,
    binaries: &super::Binaries,
    events: usize,
    rate: u32,
    prefetch: u16,
    queue_type: QueueType,
) -> Result<ReplayIsolation, BenchError> {
    use super::{
        Sink, start_sink, start_worker, timed_deliveries, to_ingress, uncapped, wait_count,
    };
    use crate::kit::{file_secret, subscription_toml};
    const B_EVENTS: usize = 1_000;
    const B_RATE: u32 = 100;
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-{run_id}");
    let session = BenchSession::open(config, &prefix).await?;
    let ladder = Ladder::build(&prefix, queue_type, &["1s", "10s"], &["1s", "10s"])?;
    let topology = ladder.objects();
    topology.apply(&session.channel).await?;
    let sink_a = Sink::new(None);
    let addr_a = start_sink(Arc::clone(&sink_a)).await?;
    let sink_b = Sink::new(None);
    let addr_b = start_sink(Arc::clone(&sink_b)).await?;
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("bench.whsec");
    std::fs::write(&secret, hookrelay::contract::signing::generate_secret())?;
    let subscriptions = subscription_toml(
        "sub_a",
        "tenant_a",
        &format!("http://{addr_a}/a"),
        &file_secret(&secret),
        "",
    ) + &subscription_toml(
        "sub_b",
        "tenant_b",
        &format!("http://{addr_b}/b"),
        &file_secret(&secret),
        "",
    );
    let ingress = ladder.ingress();
    let event =
        |tenant: &str, sub: &str, id: String, i: usize| hookrelay::contract::envelope::NewEvent {
            id,
            tenant: tenant.into(),
            event_type: "bench.event".into(),
            subscription: Some(sub.into()),
            timestamp: None,
            body: super::body(i),
        };
    let result = async {
        let from = SystemTime::now() - Duration::from_secs(2);
        say(&format!("publishing {events} events of tenant A"));
        publish_many(&session.publisher, events, |i| {
            to_ingress(&ingress, event("tenant_a", "sub_a", format!("a_{i:09}"), i))
        })
        .await?;
        // The window ends a whole second after the last of A's events (the archive's times
        // are seconds): the rounds replay A's originals, never the copies of a round before.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let to = SystemTime::now();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut worker = start_worker(
            &binaries.worker,
            config,
            &ladder,
            Some(prefetch),
            &subscriptions,
            &uncapped(),
        )
        .await?;
        wait_count(&sink_a, events as u64, Duration::from_secs(600)).await?;
        say("A's events delivered; B alone");
        let b = |round: &'static str| {
            let ingress = ingress.clone();
            move |i: usize| {
                to_ingress(
                    &ingress,
                    event("tenant_b", "sub_b", format!("b_{round}_{i}"), i),
                )
            }
        };
        let mut report = ReplayIsolation {
            events,
            rate,
            ..ReplayIsolation::default()
        };
        report.b_idle = timed_deliveries(
            &session.publisher,
            &sink_b,
            B_EVENTS,
            B_RATE,
            Duration::from_secs(120),
            b("idle"),
        )
        .await?;
        for paced in [true, false] {
            let options = hookrelay::ops::replay::ReplayOptions {
                id: None,
                from,
                to: Some(to),
                filter: hookrelay::ops::replay::ReplayFilter {
                    tenant: Some("tenant_a".into()),
                    ..Default::default()
                },
                only_undelivered: false,
                index_max: None,
                rate: paced.then(|| {
                    format!("{rate}/s")
                        .parse()
                        .unwrap_or_else(|_| unreachable!())
                }),
                dry_run: false,
            };
            say(&format!(
                "replaying A's events {}, B publishing",
                if paced { "paced" } else { "unpaced" }
            ));
            let started = Instant::now();
            let replayed = async {
                let r = hookrelay::ops::replay::replay(
                    &session.conn,
                    &session.publisher,
                    &ladder,
                    &options,
                    None,
                    None,
                )
                .await
                .map_err(|e| BenchError::Other(e.to_string()));
                (r, started.elapsed().as_secs_f64())
            };
            let timed = async {
                // B starts once the replay is under way.
                tokio::time::sleep(Duration::from_secs(1)).await;
                timed_deliveries(
                    &session.publisher,
                    &sink_b,
                    B_EVENTS,
                    B_RATE,
                    Duration::from_secs(600),
                    b(if paced { "paced" } else { "unpaced" }),
                )
                .await
            };
            let ((replay, seconds), latency) = tokio::join!(replayed, timed);
            replay?;
            let latency = latency?;
            if paced {
                report.b_paced = latency;
                report.paced_seconds = seconds;
            } else {
                report.b_unpaced = latency;
                report.unpaced_seconds = seconds;
            }
            // Let the worker finish A's copies before the next round.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let rounds = if paced { 2 } else { 3 };
            wait_count(&sink_a, (events * rounds) as u64, Duration::from_secs(600)).await?;
        }
        let _ = worker.child.kill().await;
        Ok::<_, BenchError>(report)
    }
    .await;
    let _ = topology.delete(&session.channel).await;
    result
}
