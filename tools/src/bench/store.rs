//! The subscription store at scale (`hookrelay-dev bench --store 10,100000`): for each count N
//! of subscriptions, in a PostgreSQL database of the bench's own (migrated, dropped after):
//!
//! - **fill**: N subscriptions over max(N/10, 1) tenants, each with one secret reference to one
//!   shared file, inserted by two `INSERT ... SELECT ... FROM generate_series`;
//!   (triggers off for the fill: nobody follows the bench's database while it is written);
//! - **start-up**: `hookrelay worker` on the store, from spawn until `/readyz` answers 200, on an
//!   empty ladder (a worker holds only what it delivers for: `store.cache_*`);
//! - **memory**: that worker's resident memory (VmRSS) 2 s after it is ready, idle; and again at
//!   the end of the hot-set run below, holding the smallest N's subscriptions (the working set);
//! - **misses**: a cache as a worker's, in the bench process, reading subscriptions it does not
//!   hold one after another: by id, and a tenant's list (a fan-out's), p50/p99;
//! - **lookup cost**: deliveries per second counted at the sink (as the main run counts them) of
//!   `--events` events published beforehand, each naming a subscription of its tenant, spread
//!   over all N (a stride through the ids), against the smallest N of the run; and again with
//!   the events naming only as many subscriptions as the smallest N has (the hot set: the
//!   snapshot's size alone, without a working set of N subscriptions);
//! - **change to a worker**: the library's follower (`store::follow`) in the bench process on a
//!   cache as a worker's, then one subscription (held) updated at a time, and the time from the
//!   UPDATE's commit until the cache shows the new URL (polled every millisecond), first
//!   with nothing else running, then while a worker delivers `--events` more events being
//!   published.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;
use hookrelay::observe::metrics::Metrics;
use hookrelay::store::PgStore;
use hookrelay::subscriptions::cache::{CacheLimits, Key, SubscriptionCache};
use hookrelay::subscriptions::{LiveSubscriptions, SecretStore};

use super::{
    BenchError, BenchSession, Binaries, Sink, body, machine, publish_many, rss_mib, say,
    spawn_worker, start_sink, to_ingress, uncapped, wait_count,
};
use crate::kit::{Percentiles, ScratchDb, pg_server_url, spread};

#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Subscription counts, each measured in turn.
    pub counts: Vec<usize>,
    /// Events per throughput run, and again for the load during the changes.
    pub events: usize,
    /// URL changes timed per count, idle and again under load.
    pub changes: usize,
    pub prefetch: u16,
    pub repeat: usize,
    pub queue_type: QueueType,
}

/// One count, one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreRun {
    pub run: usize,
    pub subscriptions: usize,
    pub tenants: usize,
    pub fill_seconds: f64,
    /// Spawn until `/readyz` answers 200.
    pub startup_ms: f64,
    /// VmRSS, idle, 2 s after ready.
    pub rss_mib: f64,
    /// VmRSS at the end of the hot-set run: the smallest N's subscriptions held.
    pub rss_busy_mib: f64,
    /// A miss read from the store: one subscription by id, and a tenant's list.
    pub miss_id: Percentiles,
    pub miss_tenant: Percentiles,
    /// (RSS - the smallest count's RSS) / (N - the smallest N), in the same run.
    pub bytes_per_subscription: Option<f64>,
    pub deliveries_per_s: f64,
    /// Deliveries per second over the smallest count's, in the same run.
    pub throughput_ratio: f64,
    /// The same, with the events naming only the first `smallest` subscriptions of the N: the
    /// snapshot's size alone, without a working set of N subscriptions.
    pub hot_deliveries_per_s: f64,
    pub hot_ratio: f64,
    /// Commit of an UPDATE until a follower's snapshot shows it.
    pub change_idle: Percentiles,
    pub change_under_load: Percentiles,
    /// Deliveries per second at the sink while the changes under load were timed.
    pub load_deliveries_per_s: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreReport {
    pub machine: String,
    pub broker: String,
    pub postgres: String,
    pub events: usize,
    pub prefetch: u16,
    pub changes: usize,
    pub runs: Vec<StoreRun>,
}

/// Misses timed per count, by id and by tenant.
const MISSES: usize = 500;

/// The subscription ids the fill writes, `sub_<j>`, and the tenant of each.
fn subscription_id(j: usize) -> String {
    format!("sub_{j}")
}

fn tenants_for(n: usize) -> usize {
    (n / 10).max(1)
}

fn tenant_of(j: usize, tenants: usize) -> String {
    format!("t{}", j % tenants)
}

/// The subscription event `i` names among the first `n`: a stride through the ids (coprime with
/// the counts the bench is run with), so a run of events touches subscriptions all over them.
fn target(i: usize, n: usize) -> usize {
    (i.wrapping_mul(7919) + 1) % n.max(1)
}

pub async fn run(
    config: &Config,
    options: &StoreOptions,
    binaries: &Binaries,
) -> Result<StoreReport, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-bench-{run_id}");
    let session = BenchSession::open(config, &prefix).await?;
    let db = ScratchDb::create_on(&pg_server_url(), "hookrelay_bench").await?;
    say(&format!("store: database {}", shown(&db.url)));
    let result = runs(config, options, binaries, &session, &prefix, &db).await;
    session.publisher.close().await;
    let _ = session.conn.close(200, "bench done".into()).await;
    let mut report = result?;
    report.broker = format!("RabbitMQ {}", session.broker);
    drop(db);
    Ok(report)
}

fn shown(url: &str) -> String {
    hookrelay::config::Source::Postgres(url.to_owned()).shown()
}

async fn runs(
    config: &Config,
    options: &StoreOptions,
    binaries: &Binaries,
    session: &BenchSession,
    prefix: &str,
    db: &ScratchDb,
) -> Result<StoreReport, BenchError> {
    let store = PgStore::connect(&db.url, Duration::from_secs(10)).await?;
    store.migrate().await?;
    let postgres: String = sqlx::query_scalar("SELECT current_setting('server_version')")
        .fetch_one(store.pool())
        .await?;
    let secret_dir = tempfile::tempdir()?;
    let secret_file = secret_dir.path().join("bench.whsec");
    std::fs::write(&secret_file, generate_secret())?;
    let sink = Sink::new(None);
    let sink_addr = start_sink(Arc::clone(&sink)).await?;
    let mut report = StoreReport {
        machine: machine(),
        postgres: format!("PostgreSQL {postgres}"),
        events: options.events,
        prefetch: options.prefetch,
        changes: options.changes,
        ..StoreReport::default()
    };
    let smallest = options.counts.iter().copied().min().unwrap_or(0);
    for run in 1..=options.repeat {
        let mut rows = Vec::new();
        for &n in &options.counts {
            let measure = Measure {
                smallest,
                config,
                options,
                binaries,
                session,
                store: &store,
                db_url: &db.url,
                sink: &sink,
                url: format!("http://{sink_addr}/hook"),
                tag: format!("{prefix}-n{n}r{run}"),
            };
            let row = measure.count(n, run, &secret_file).await?;
            say(&format!(
                "store: {n} subscriptions run {run}: ready in {:.0} ms, {:.1} MiB, {:.0} \
                 deliveries/s, change p99 {:.1} ms idle / {:.1} ms under load",
                row.startup_ms,
                row.rss_mib,
                row.deliveries_per_s,
                row.change_idle.p99_ms,
                row.change_under_load.p99_ms
            ));
            rows.push(row);
        }
        if let Some(base) = rows.iter().find(|r| r.subscriptions == smallest).cloned() {
            for row in &mut rows {
                row.throughput_ratio = row.deliveries_per_s / base.deliveries_per_s.max(1e-9);
                row.hot_ratio = row.hot_deliveries_per_s / base.deliveries_per_s.max(1e-9);
                if row.subscriptions > base.subscriptions {
                    row.bytes_per_subscription = Some(
                        (row.rss_mib - base.rss_mib) * 1024.0 * 1024.0
                            / (row.subscriptions - base.subscriptions) as f64,
                    );
                }
            }
        }
        report.runs.extend(rows);
    }
    Ok(report)
}

/// What measuring one count needs.
struct Measure<'a> {
    /// The smallest count of the run: the events of the hot-set throughput name only as many.
    smallest: usize,
    config: &'a Config,
    options: &'a StoreOptions,
    binaries: &'a Binaries,
    session: &'a BenchSession,
    store: &'a PgStore,
    db_url: &'a str,
    sink: &'a Arc<Sink>,
    /// Where every subscription delivers.
    url: String,
    /// The ladder's prefix, unique to this count and run.
    tag: String,
}

impl Measure<'_> {
    async fn count(&self, n: usize, run: usize, secret: &Path) -> Result<StoreRun, BenchError> {
        let tenants = tenants_for(n);
        let filled = Instant::now();
        fill(self.store, n, tenants, &self.url, secret).await?;
        let fill_seconds = filled.elapsed().as_secs_f64();
        say(&format!(
            "store: {n} subscriptions over {tenants} tenants written in {fill_seconds:.2}s"
        ));
        let ladder = Ladder::build(
            &self.tag,
            self.options.queue_type,
            &["1s", "10s"],
            &["1s", "10s"],
        )?;
        ladder.objects().apply(&self.session.channel).await?;
        let mut row = StoreRun {
            run,
            subscriptions: n,
            tenants,
            fill_seconds,
            ..StoreRun::default()
        };
        let measured = self.on_ladder(&ladder, n, &mut row).await;
        let _ = ladder.objects().delete(&self.session.channel).await;
        measured?;
        Ok(row)
    }

    async fn on_ladder(
        &self,
        ladder: &Ladder,
        n: usize,
        row: &mut StoreRun,
    ) -> Result<(), BenchError> {
        // Start-up and memory, idle: nothing waits in the ladder yet.
        let (startup, rss) = {
            let mut worker = self.worker(ladder)?;
            let ready = ready_within(worker.metrics_port, Duration::from_secs(120)).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss = worker.child.id().and_then(rss_mib).unwrap_or(0.0);
            let _ = worker.child.kill().await;
            (ready?, rss)
        };
        row.startup_ms = startup.as_secs_f64() * 1000.0;
        row.rss_mib = rss;

        (row.miss_id, row.miss_tenant) = self.misses(n, MISSES).await?;

        // The follower, as a worker runs it, in this process, on a cache as a worker's.
        let opened = hookrelay::store::follow::Opened::listen(self.store.clone()).await?;
        let cache = Arc::new(SubscriptionCache::new(
            self.limits()?,
            Arc::new(hookrelay::store::held::StoreLoader::own_pool(
                self.store,
                self.config.store.lookup_connections,
            )),
        ));
        let live = Arc::new(LiveSubscriptions::cached(cache));
        let stop = CancellationToken::new();
        let following = tokio::spawn(hookrelay::store::follow::follow(
            opened.following(),
            Arc::clone(&live),
            Arc::new(SecretStore::new(self.config.secrets.refresh)),
            Metrics::new(),
            self.config.store.resync,
            stop.clone(),
        ));
        let result = self.with_follower(ladder, n, &live, row).await;
        stop.cancel();
        let _ = following.await;
        result
    }

    async fn with_follower(
        &self,
        ladder: &Ladder,
        n: usize,
        live: &LiveSubscriptions,
        row: &mut StoreRun,
    ) -> Result<(), BenchError> {
        // One change first, not timed: it returns once the follower listens.
        self.changes(live, n, 1, "warm").await?;
        row.change_idle =
            Percentiles::of(self.changes(live, n, self.options.changes, "idle").await?);

        // Lookups among the N: a backlog published beforehand, counted at the sink; events over
        // all N, then over the first `smallest` only.
        let ingress = ladder.ingress();
        let events = self.options.events;
        row.deliveries_per_s = self.throughput(ladder, n, n, "evt").await?.0;
        (row.hot_deliveries_per_s, row.rss_busy_mib) =
            self.throughput(ladder, n, self.smallest, "hot").await?;

        // Changes while a worker (ready first) delivers events being published.
        let mut worker = self.worker(ladder)?;
        ready_within(worker.metrics_port, Duration::from_secs(120)).await?;
        self.sink.reset();
        let started = Instant::now();
        let load = publish_many(&self.session.publisher, events, |i| {
            to_ingress(&ingress, self.event(n, target(i, n), i, "load"))
        });
        let changes = async {
            let timed = self.changes(live, n, self.options.changes, "load").await;
            let delivered = self.sink.count.load(Ordering::SeqCst);
            row.load_deliveries_per_s = delivered as f64 / started.elapsed().as_secs_f64();
            timed
        };
        let (published, timed) = tokio::join!(load, changes);
        let delivered = match published {
            Ok(()) => wait_count(self.sink, events as u64, Duration::from_secs(600)).await,
            Err(e) => Err(e),
        };
        let _ = worker.child.kill().await;
        delivered?;
        row.change_under_load = Percentiles::of(timed?);
        Ok(())
    }

    /// Deliveries per second of a worker started on `--events` events published beforehand,
    /// naming the first `cover` of the `n` subscriptions, and its RSS once it delivered them.
    async fn throughput(
        &self,
        ladder: &Ladder,
        n: usize,
        cover: usize,
        kind: &str,
    ) -> Result<(f64, f64), BenchError> {
        let ingress = ladder.ingress();
        let events = self.options.events;
        say(&format!(
            "store: publishing {events} events over {cover} of {n} subscriptions through {ingress}"
        ));
        publish_many(&self.session.publisher, events, |i| {
            to_ingress(&ingress, self.event(n, target(i, cover), i, kind))
        })
        .await?;
        self.sink.reset();
        let mut worker = self.worker(ladder)?;
        let delivered = wait_count(self.sink, events as u64, Duration::from_secs(600)).await;
        let rss = worker.child.id().and_then(rss_mib).unwrap_or(0.0);
        let _ = worker.child.kill().await;
        delivered?;
        let (count, secs) = self.sink.window();
        Ok((count as f64 / secs.max(1e-9), rss))
    }

    /// `count` misses of a cache as a worker's, one after another, by id and by tenant, over
    /// subscriptions and tenants spread through the `n`: milliseconds each.
    async fn misses(
        &self,
        n: usize,
        count: usize,
    ) -> Result<(Percentiles, Percentiles), BenchError> {
        let cache = Arc::new(SubscriptionCache::new(
            self.limits()?,
            Arc::new(hookrelay::store::held::StoreLoader::own_pool(
                self.store,
                self.config.store.lookup_connections,
            )),
        ));
        let tenants = tenants_for(n);
        let mut by_id = Vec::with_capacity(count);
        let mut by_tenant = Vec::with_capacity(count);
        for k in 0..count {
            let j = target(k + 20_000, n);
            // A lookup that gave up waiting (the machine stalled) counts what it waited.
            let started = Instant::now();
            let _ = cache
                .lookup(&Key::id(&subscription_id(j)), &tenant_of(j, tenants))
                .await;
            by_id.push(started.elapsed().as_secs_f64() * 1000.0);
            let tenant = tenant_of(target(k + 40_000, n), tenants);
            let started = Instant::now();
            let _ = cache.lookup(&Key::tenant(&tenant), &tenant).await;
            by_tenant.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        Ok((Percentiles::of(by_id), Percentiles::of(by_tenant)))
    }

    fn limits(&self) -> Result<CacheLimits, BenchError> {
        CacheLimits::of(&self.config.store).ok_or_else(|| {
            BenchError::Other(
                "--store measures a worker with a cache: store.cache_entries > 0".into(),
            )
        })
    }

    /// `hookrelay worker` on the store, endpoint caps lifted so the budget bounds what is in
    /// flight, as in the shards run.
    fn worker(&self, ladder: &Ladder) -> Result<super::WorkerProcess, BenchError> {
        spawn_worker(
            &self.binaries.worker,
            self.config,
            ladder,
            Some(self.options.prefetch),
            Path::new(self.db_url),
            &uncapped(),
            tempfile::tempdir()?,
        )
    }

    /// Event `i`, to subscription `j` of the `n`.
    fn event(&self, n: usize, j: usize, i: usize, kind: &str) -> NewEvent {
        NewEvent {
            id: format!("{kind}_{i}"),
            tenant: tenant_of(j, tenants_for(n)),
            event_type: "bench.event".into(),
            subscription: Some(subscription_id(j)),
            timestamp: None,
            body: body(i),
        }
    }

    /// `count` URL changes one after another, each to a subscription elsewhere in the N: the
    /// milliseconds from the UPDATE's commit until `live` shows the new URL. The new URLs still
    /// lead to the sink.
    async fn changes(
        &self,
        live: &LiveSubscriptions,
        n: usize,
        count: usize,
        kind: &str,
    ) -> Result<Vec<f64>, BenchError> {
        let mut times = Vec::with_capacity(count);
        let cache = live
            .cache()
            .ok_or_else(|| BenchError::Other("the follower has no cache".into()))?;
        for k in 0..count {
            let j = target(k + 5_000, n);
            let id = subscription_id(j);
            // Held first: a change to what a worker does not hold needs nothing.
            let mut held = false;
            for _ in 0..20 {
                if cache
                    .lookup(&Key::id(&id), &tenant_of(j, tenants_for(n)))
                    .await
                    .is_ok()
                {
                    held = true;
                    break;
                }
            }
            if !held {
                return Err(BenchError::Other(format!("{id} could not be read")));
            }
            let url = format!("{}/{kind}/{k}", self.url);
            sqlx::query("UPDATE subscriptions SET url = $1, updated_at = now() WHERE id = $2")
                .bind(&url)
                .bind(&id)
                .execute(self.store.pool())
                .await?;
            let committed = Instant::now();
            loop {
                if cache.get(&id).is_some_and(|s| s.url.as_str() == url) {
                    break;
                }
                if committed.elapsed() > Duration::from_secs(30) {
                    return Err(BenchError::Other(format!(
                        "the change of {id} did not reach the follower within 30s"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            times.push(committed.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(times)
    }
}

/// The store holding exactly `n` subscriptions `sub_<j>` of tenants `t<j % tenants>`, each with
/// one secret: a reference to `secret`.
async fn fill(
    store: &PgStore,
    n: usize,
    tenants: usize,
    url: &str,
    secret: &Path,
) -> Result<(), BenchError> {
    let n = i64::try_from(n).map_err(|_| BenchError::Other(format!("{n} subscriptions")))?;
    let tenants = i64::try_from(tenants).unwrap_or(i64::MAX);
    let mut tx = store.pool().begin().await?;
    sqlx::query("TRUNCATE subscriptions CASCADE")
        .execute(&mut *tx)
        .await?;
    // Without the triggers (a notification per row) and the foreign key's checks: nobody
    // follows the bench's database while it is written, and the rows are made consistent.
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO subscriptions (id, tenant, url) \
         SELECT 'sub_' || j, 't' || (j % $2), $3 FROM generate_series(0, $1 - 1) AS j",
    )
    .bind(n)
    .bind(tenants)
    .bind(url)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO subscription_secrets (subscription_id, reference) \
         SELECT 'sub_' || j, $2 FROM generate_series(0, $1 - 1) AS j",
    )
    .bind(n)
    .bind(format!("file:{}", secret.display()))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    sqlx::query("ANALYZE subscriptions, subscription_secrets")
        .execute(store.pool())
        .await?;
    Ok(())
}

/// Polls the worker's `/readyz` until it answers 200: the time since now.
pub(super) async fn ready_within(
    metrics_port: u16,
    timeout: Duration,
) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(1))
        .build()
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let url = format!("http://127.0.0.1:{metrics_port}/readyz");
    while started.elapsed() < timeout {
        if client
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(BenchError::Other(format!(
        "the worker was not ready within {}s",
        timeout.as_secs()
    )))
}

impl StoreReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "hookrelay bench, subscription store ({}; {}; {}; {} events, prefetch {}, {} changes)\n\
             \n\
             subscriptions run  fill s  ready ms  RSS idle  RSS hot  deliveries/s  ratio  hot/s  ratio   \
             miss id p50/p99 ms  miss tenant p50/p99 ms   change idle p50/p99 ms   under load p50/p99 ms (deliveries/s)\n",
            self.machine, self.broker, self.postgres, self.events, self.prefetch, self.changes,
        );
        for r in &self.runs {
            out += &format!(
                "{:>13} {:>3} {:>7.2} {:>9.0} {:>9.1} {:>8.1} {:>13.0} {:>6.2} {:>6.0} {:>6.2}   \
                 {:>8.2} {:>8.2}   {:>9.2} {:>10.2}   {:>10.1} {:>10.1}   {:>10.1} {:>8.1} ({:.0})\n",
                r.subscriptions,
                r.run,
                r.fill_seconds,
                r.startup_ms,
                r.rss_mib,
                r.rss_busy_mib,
                r.deliveries_per_s,
                r.throughput_ratio,
                r.hot_deliveries_per_s,
                r.hot_ratio,
                r.miss_id.p50_ms,
                r.miss_id.p99_ms,
                r.miss_tenant.p50_ms,
                r.miss_tenant.p99_ms,
                r.change_idle.p50_ms,
                r.change_idle.p99_ms,
                r.change_under_load.p50_ms,
                r.change_under_load.p99_ms,
                r.load_deliveries_per_s,
            );
        }
        out += "\nsummary (min / median / max over runs)\n";
        let mut counts: Vec<usize> = self.runs.iter().map(|r| r.subscriptions).collect();
        counts.sort_unstable();
        counts.dedup();
        for n in counts {
            let of = |f: &dyn Fn(&StoreRun) -> f64| {
                spread(
                    self.runs
                        .iter()
                        .filter(|r| r.subscriptions == n)
                        .map(f)
                        .collect(),
                )
            };
            let show = |(lo, mid, hi): (f64, f64, f64), digits: usize| {
                format!("{lo:.digits$}/{mid:.digits$}/{hi:.digits$}")
            };
            out += &format!(
                "{n} subscriptions: ready {} ms, RSS idle {} MiB, hot {} MiB, {} deliveries/s, \
                 ratio {} (hot set {}), miss p50/p99 by id {} / {} ms, by tenant {} / {} ms, \
                 change p99 idle {} ms, under load {} ms\n",
                show(of(&|r| r.startup_ms), 0),
                show(of(&|r| r.rss_mib), 1),
                show(of(&|r| r.rss_busy_mib), 1),
                show(of(&|r| r.deliveries_per_s), 0),
                show(of(&|r| r.throughput_ratio), 2),
                show(of(&|r| r.hot_ratio), 2),
                show(of(&|r| r.miss_id.p50_ms), 2),
                show(of(&|r| r.miss_id.p99_ms), 2),
                show(of(&|r| r.miss_tenant.p50_ms), 2),
                show(of(&|r| r.miss_tenant.p99_ms), 2),
                show(of(&|r| r.change_idle.p99_ms), 1),
                show(of(&|r| r.change_under_load.p99_ms), 1),
            );
        }
        out
    }
}
