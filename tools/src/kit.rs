//! What the tests, the demo and the bench share: waiting on a condition, reading a worker's
//! counters, percentiles and spreads, the files and the process a `hookrelay worker` runs from,
//! and a PostgreSQL database of one's own.

use std::path::Path;
use std::time::Duration;

use hookrelay::contract::ladder::Ladder;
use hookrelay::contract::retention::StreamKind;
use hookrelay::observe::metrics::Metrics;
use hookrelay::units::fmt_duration;
use serde::Serialize;

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(50);

/// Checks `done` until it holds or `timeout` passes; returns whether it held. `done` may take
/// what it finds as it goes (drain a queue, read a log) between checks.
pub async fn wait_until(timeout: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Reading a worker's counters, as the tests and the demo do.
pub trait Counters {
    /// The sum of a counter over every label set whose labels include `matching`.
    fn count(&self, name: &str, matching: &[(&str, &str)]) -> u64;
}

impl Counters for Metrics {
    fn count(&self, name: &str, matching: &[(&str, &str)]) -> u64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| {
                matching.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().value() as u64)
            .sum()
    }
}

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// Nearest rank: the value at `(n - 1) * p`, rounded.
    pub fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
        Self {
            count: ms.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: ms[ms.len() - 1],
        }
    }
}

/// Min, median and max of the figures of repeated runs (zeros when there are none).
pub fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    values.sort_by(f64::total_cmp);
    (
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
    )
}

/// `ladder` as a ladder file says it: prefix, queue type, tiers, schedule and deferral queues.
/// Dedicated tenants are left out.
pub fn ladder_toml(ladder: &Ladder) -> String {
    let list = |delays: &mut dyn Iterator<Item = Duration>| {
        delays
            .map(|d| format!("\"{}\"", fmt_duration(d)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "prefix = \"{}\"\nqueue_type = \"{}\"\nshards = {}\ntiers = [{}]\nschedule = [{}]\n\
         defer = [{}]\n",
        ladder.prefix,
        ladder.queue_type.as_str(),
        ladder.shards,
        list(&mut ladder.tiers.iter().map(|t| t.delay)),
        list(&mut ladder.schedule.iter().map(|&i| ladder.tier(i).delay)),
        list(&mut ladder.deferrals.iter().map(|t| t.delay)),
    );
    for (kind, retention) in [
        (StreamKind::Archive, ladder.archive),
        (StreamKind::Attempts, ladder.attempts),
    ] {
        text.push_str(&match retention {
            Some(r) => format!(
                "[{}]\nmax_age = \"{}\"\nmax_bytes = {}\n",
                kind.as_str(),
                fmt_duration(r.max_age),
                r.max_bytes
            ),
            None => format!("[{}]\nenabled = false\n", kind.as_str()),
        });
    }
    text
}

/// One `[[subscription]]` table of a subscriptions file. `secrets` is what goes between the
/// brackets (see [`file_secret`]); `extra` adds lines (`enabled = false`).
pub fn subscription_toml(id: &str, tenant: &str, url: &str, secrets: &str, extra: &str) -> String {
    format!(
        "[[subscription]]\nid = \"{id}\"\ntenant = \"{tenant}\"\nurl = \"{url}\"\nsecrets = [{secrets}]\n{extra}\n"
    )
}

/// A secret reference to a file, quoted for a subscriptions file.
pub fn file_secret(path: &Path) -> String {
    format!("\"file:{}\"", path.display())
}

/// `hookrelay worker` as a process of its own: `exe` is the hookrelay binary, `ladder` and
/// `subscriptions` its files. Endpoints on loopback are allowed, the metrics listener is off and
/// only errors are logged, unless the caller sets these again. Killed when dropped.
pub fn worker_command(
    exe: &Path,
    name: &str,
    ladder: &Path,
    subscriptions: &Path,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(exe);
    command
        .args(["worker", "--name", name])
        .env("HOOKRELAY_LADDER", ladder)
        .env("HOOKRELAY_SUBSCRIPTIONS", subscriptions)
        .env("HOOKRELAY_EGRESS_ALLOW", "127.0.0.0/8")
        .env("HOOKRELAY_METRICS_LISTEN", "")
        .env("HOOKRELAY_LOG_LEVEL", "error")
        .kill_on_drop(true);
    command
}

/// The PostgreSQL server the tests and the bench make their databases on:
/// `HOOKRELAY_TEST_DATABASE_URL`, else the one `postgres/up` leaves on loopback.
pub fn pg_server_url() -> String {
    std::env::var("HOOKRELAY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/postgres".into())
}

/// A database of its own on a PostgreSQL server: created with a unique name, dropped with this
/// value (also when its owner panics), so runs side by side never share one.
pub struct ScratchDb {
    /// The database's URL.
    pub url: String,
    admin: String,
    name: String,
}

impl ScratchDb {
    /// Creates `<prefix>_<uuid>` on the server `admin` names.
    pub async fn create_on(admin: &str, prefix: &str) -> Result<Self, sqlx::Error> {
        use sqlx::Connection;
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut url =
            url::Url::parse(admin).map_err(|e| sqlx::Error::Configuration(Box::new(e)))?;
        url.set_path(&format!("/{name}"));
        let mut conn = sqlx::PgConnection::connect(admin).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(Self {
            url: url.to_string(),
            admin: admin.to_owned(),
            name,
        })
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime; the drop statement gets a runtime of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}
