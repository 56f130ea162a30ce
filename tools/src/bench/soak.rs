//! A storm of changes against a worker's memory (`hookrelay-dev bench --soak 4000`): one
//! subscription in a PostgreSQL store of the bench's own, with three header secrets of
//! `--soak-header-kb` each, changed N times in a row, each change sealing the three anew and
//! moving the subscription to another path, cap and rate (what a PATCH of all of them writes).
//! A `hookrelay worker` follows the store; an event is delivered every 100 changes, so attempts
//! resolve the secrets and judge the endpoints of the versions they meet. The worker's resident
//! memory (VmRSS) is read before the storm, after it (once its sweep has looked), and after the
//! store's next full read; with its peak and what `hookrelay_worker_cache_entries` says.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;

use hookrelay::config::Config;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::signing::generate_secret;
use hookrelay::store::PgStore;
use hookrelay::store::request::header_purpose;
use hookrelay::subscriptions::seal::{Binding, Keyring, generate_key};
use hookrelay::subscriptions::{
    ExtraHeader, HeaderValueSpec, SealedSecret, SecretRef, SecretSpec, Subscription,
};

use super::store::ready_within;
use super::{
    BenchError, BenchSession, Binaries, Sink, body, machine, peak_rss_mib, rss_mib, say,
    spawn_worker, start_sink, to_ingress, wait_count,
};
use crate::kit::{ScratchDb, pg_server_url};

#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Changes in the storm.
    pub changes: usize,
    /// Size of each of the three header secrets, in KiB.
    pub header_kb: usize,
    pub queue_type: QueueType,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakReport {
    pub machine: String,
    pub broker: String,
    pub changes: usize,
    pub header_kb: usize,
    /// VmRSS after start-up and a first round of deliveries, before the storm.
    pub before_mib: f64,
    /// VmRSS once the storm is over and a sweep has looked.
    pub after_storm_mib: f64,
    /// VmRSS after the store's next full read.
    pub after_resync_mib: f64,
    /// VmHWM at the end.
    pub peak_mib: f64,
    /// (after resync - before) / before, in per cent.
    pub growth_percent: f64,
    /// `hookrelay_worker_cache_entries` at the end, by cache.
    pub cache_entries: Vec<(String, i64)>,
    pub seconds: f64,
}

/// How long the worker's store resync is in the soak: the last figure is taken after one.
const RESYNC: Duration = Duration::from_secs(10);
/// The worker's sweep interval and a margin.
const SWEPT: Duration = Duration::from_secs(7);

pub async fn run(
    config: &Config,
    options: &SoakOptions,
    binaries: &Binaries,
) -> Result<SoakReport, BenchError> {
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("hookrelay-soak-{run_id}");
    let session = BenchSession::open(config, &prefix).await?;
    let db = ScratchDb::create_on(&pg_server_url(), "hookrelay_soak").await?;
    let ladder = Ladder::build(&prefix, options.queue_type, &["1s"], &["1s"])?;
    ladder.objects().apply(&session.channel).await?;
    let result = storm(config, options, binaries, &session, &ladder, &db.url).await;
    let _ = ladder.objects().delete(&session.channel).await;
    session.publisher.close().await;
    let _ = session.conn.close(200, "soak done".into()).await;
    let mut report = result?;
    report.broker = format!("RabbitMQ {}", session.broker);
    drop(db);
    Ok(report)
}

/// Version `n` of the soak's subscription.
struct Versions {
    ring: Keyring,
    url: String,
    signing: SecretRef,
    header: usize,
}

impl Versions {
    fn version(&self, n: usize) -> Result<Subscription, BenchError> {
        let url = reqwest::Url::parse(&format!("{}/v{n}", self.url))
            .map_err(|e| BenchError::Other(e.to_string()))?;
        let mut sub = Subscription::new("soak", "soak", url, self.signing.clone());
        sub.secrets = vec![SecretSpec::new(self.signing.clone())];
        sub.max_concurrent = Some(10 + u32::try_from(n % 1000).unwrap_or(0));
        sub.rate = Some(
            format!("{}/s", 1000 + n)
                .parse::<hookrelay::units::Rate>()
                .map_err(|e| BenchError::Other(e.to_string()))?,
        );
        sub.headers = Vec::with_capacity(3);
        for h in 0..3 {
            let name = format!("x-soak-{h}");
            let binding = Binding::new("soak", "soak", &header_purpose(&name));
            let mut value = format!("{n}-{h}-");
            value.extend(std::iter::repeat_n(
                'k',
                self.header.saturating_sub(value.len()),
            ));
            let sealed = self
                .ring
                .seal(&binding, value.as_bytes())
                .map_err(|e| BenchError::Other(e.to_string()))?;
            sub.headers.push(ExtraHeader {
                name,
                value: HeaderValueSpec::Secret(SecretRef::Sealed(SealedSecret {
                    binding,
                    sealed: Arc::from(sealed),
                })),
            });
        }
        Ok(sub)
    }
}

async fn put(
    store: &PgStore,
    sub: &Subscription,
    before: Option<&Subscription>,
) -> Result<(), BenchError> {
    let mut tx = store.pool().begin().await?;
    store.put_from_file(&mut tx, sub, before).await?;
    tx.commit().await?;
    Ok(())
}

async fn storm(
    config: &Config,
    options: &SoakOptions,
    binaries: &Binaries,
    session: &BenchSession,
    ladder: &Ladder,
    db_url: &str,
) -> Result<SoakReport, BenchError> {
    let started = std::time::Instant::now();
    let store = PgStore::connect(db_url, Duration::from_secs(10)).await?;
    store.migrate().await?;
    let key = generate_key();
    let dir = tempfile::tempdir()?;
    let signing = dir.path().join("soak.whsec");
    std::fs::write(&signing, generate_secret())?;
    let sink = Sink::new(None);
    let sink_addr = start_sink(Arc::clone(&sink)).await?;
    let versions = Versions {
        ring: Keyring::from_base64(&[&key]).map_err(|e| BenchError::Other(e.to_string()))?,
        url: format!("http://{sink_addr}/hook"),
        signing: SecretRef::File(signing.clone()),
        header: options.header_kb * 1024,
    };
    let mut current = versions.version(0)?;
    put(&store, &current, None).await?;

    let env = [
        ("HOOKRELAY_STORE_KEYS", "env:SOAK_STORE_KEY".to_owned()),
        ("SOAK_STORE_KEY", key.clone()),
        ("HOOKRELAY_STORE_RESYNC", format!("{}s", RESYNC.as_secs())),
    ];
    let mut worker = spawn_worker(
        &binaries.worker,
        config,
        ladder,
        None,
        std::path::Path::new(db_url),
        &env,
        tempfile::tempdir()?,
    )?;
    ready_within(worker.metrics_port, Duration::from_secs(60)).await?;
    let pid = worker
        .child
        .id()
        .ok_or_else(|| BenchError::Other("the worker exited at start".into()))?;
    let ingress = ladder.ingress();
    let mut published = 0usize;
    let publish = async |published: &mut usize| -> Result<(), BenchError> {
        let i = *published;
        let (exchange, key, payload, properties) = to_ingress(
            &ingress,
            NewEvent {
                id: format!("soak_{i}"),
                tenant: "soak".into(),
                event_type: "soak.event".into(),
                subscription: Some("soak".into()),
                timestamp: None,
                body: body(i),
            },
        );
        session
            .publisher
            .send(&exchange, &key, &payload, properties, true)
            .await?
            .await?;
        *published += 1;
        Ok(())
    };
    for _ in 0..20 {
        publish(&mut published).await?;
    }
    wait_count(&sink, published as u64, Duration::from_secs(60)).await?;
    tokio::time::sleep(SWEPT).await;
    let before = rss_mib(pid).unwrap_or(0.0);
    say(&format!(
        "soak: worker at {before:.1} MiB before {} changes",
        options.changes
    ));

    for n in 1..=options.changes {
        let next = versions.version(n)?;
        put(&store, &next, Some(&current)).await?;
        current = next;
        if n % 100 == 0 {
            publish(&mut published).await?;
        }
        if n % 500 == 0 || n == options.changes {
            say(&format!(
                "soak: {n}/{} changes, worker at {:.1} MiB",
                options.changes,
                rss_mib(pid).unwrap_or(0.0)
            ));
        }
    }
    publish(&mut published).await?;
    wait_count(&sink, published as u64, Duration::from_secs(120)).await?;
    tokio::time::sleep(SWEPT).await;
    let after_storm = rss_mib(pid).unwrap_or(0.0);
    tokio::time::sleep(RESYNC + Duration::from_secs(1)).await;
    let after_resync = rss_mib(pid).unwrap_or(0.0);
    let peak = peak_rss_mib(pid).unwrap_or(0.0);
    let cache_entries = cache_entries(worker.metrics_port).await;
    let _ = worker.child.kill().await;
    let delivered = sink.count.load(Ordering::SeqCst);
    say(&format!("soak: {delivered} deliveries"));
    Ok(SoakReport {
        machine: machine(),
        broker: String::new(),
        changes: options.changes,
        header_kb: options.header_kb,
        before_mib: before,
        after_storm_mib: after_storm,
        after_resync_mib: after_resync,
        peak_mib: peak,
        growth_percent: (after_resync - before) / before.max(1e-9) * 100.0,
        cache_entries,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `hookrelay_worker_cache_entries` from the worker's `/metrics`, by cache.
async fn cache_entries(port: u16) -> Vec<(String, i64)> {
    let Ok(client) = reqwest::Client::builder().no_proxy().build() else {
        return Vec::new();
    };
    let Ok(text) = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
    else {
        return Vec::new();
    };
    let text = text.text().await.unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("hookrelay_worker_cache_entries{cache=\""))
        .filter_map(|l| {
            let (cache, rest) = l.split_once("\"}")?;
            Some((cache.to_owned(), rest.trim().parse().ok()?))
        })
        .collect()
}

impl SoakReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "hookrelay bench, a storm of changes ({}; {}; {} changes, three header secrets of {} KiB)\n\
             \n\
             | worker RSS | MiB |\n|---|---:|\n",
            self.machine, self.broker, self.changes, self.header_kb
        );
        for (what, mib) in [
            ("before the storm", self.before_mib),
            ("after the storm (swept)", self.after_storm_mib),
            ("after the store's full read", self.after_resync_mib),
            ("peak (VmHWM)", self.peak_mib),
        ] {
            out.push_str(&format!("| {what} | {mib:.1} |\n"));
        }
        out.push_str(&format!(
            "\ngrowth after the full read: {:+.1} %; cache entries at the end: {}\n",
            self.growth_percent,
            self.cache_entries
                .iter()
                .map(|(c, n)| format!("{c}={n}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        out
    }
}
