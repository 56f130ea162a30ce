//! `hookrelay history`: reads the archive and attempt-log streams and writes them into
//! PostgreSQL in batches (`COPY`), each batch in one transaction with the stream offset it
//! reached. A crash or `kill -9` loses the open transaction and nothing else; the next start
//! reads on from the stored offset, so every record lands exactly once. Two processes on one
//! database cannot both write a batch: each checks, under a row lock, that the stored offset is
//! where it started, and reads again from the stored offset when it is not.
//!
//! Nothing here is on the delivery path: when this falls behind, the streams keep the records
//! (within their retention) and the lag shows in `hookrelay_history_lag_seconds`.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use lapin::{Connection, ConnectionProperties};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::rows::{
    ATTEMPT_COLUMNS, AttemptRow, EVENT_COLUMNS, EventRow, create_partition, day_of,
    expired_partitions,
};
use crate::broker::streams::{StreamReader, StreamStart};
use crate::config::{HistoryConfig, SecretUrl};
use crate::contract::ladder::Ladder;
use crate::contract::retention::StreamKind;

/// How often retention looks for day partitions to drop.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);
/// Waits between reconnections after an error, doubling up to the last.
const BACKOFF: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(
        "the ladder keeps no stream to read ([archive] and [attempts] are both enabled = false): \
         there is no history to materialize"
    )]
    NothingToRead,
    #[error("connecting to the broker: {0}")]
    Connect(lapin::Error),
    #[error("reading {stream}: {source}")]
    Read {
        stream: String,
        source: lapin::Error,
    },
    #[error("the broker stopped {stream}'s reader (the stream deleted, or the connection closed)")]
    Ended { stream: String },
    #[error(
        "another `hookrelay history` moved {stream} on to offset {found} (this one was at \
         {expected}); reading on from there"
    )]
    Moved {
        stream: String,
        expected: u64,
        found: u64,
    },
    #[error("the history database: {0}")]
    Database(#[from] sqlx::Error),
}

/// What `hookrelay history` reports on `/metrics`.
#[derive(Clone)]
pub struct HistoryMetrics {
    pub registry: Registry,
    /// Records written, by stream (`archive`, `attempts`).
    pub records: IntCounterVec,
    /// Stream messages that were not records and were passed over, by stream.
    pub skipped: IntCounterVec,
    /// Batches committed, by stream.
    pub batches: IntCounterVec,
    /// The next offset to read, by stream.
    pub offset: IntGaugeVec,
    /// How old the newest record written was when its batch committed; 0 once a flush
    /// interval passes with nothing to read (caught up).
    pub lag: prometheus::GaugeVec,
    /// How long the oldest record of each batch waited from its time to its commit.
    pub delay: HistogramVec,
}

impl HistoryMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let records = IntCounterVec::new(
            Opts::new(
                "hookrelay_history_records_total",
                "Stream records written into the history database",
            ),
            &["stream"],
        )
        .expect("static metric definition");
        let skipped = IntCounterVec::new(
            Opts::new(
                "hookrelay_history_skipped_total",
                "Stream messages that were not records, passed over",
            ),
            &["stream"],
        )
        .expect("static metric definition");
        let batches = IntCounterVec::new(
            Opts::new(
                "hookrelay_history_batches_total",
                "Batches committed to the history database",
            ),
            &["stream"],
        )
        .expect("static metric definition");
        let offset = IntGaugeVec::new(
            Opts::new(
                "hookrelay_history_next_offset",
                "The next stream offset history reads",
            ),
            &["stream"],
        )
        .expect("static metric definition");
        let lag = prometheus::GaugeVec::new(
            Opts::new(
                "hookrelay_history_lag_seconds",
                "Age of the newest record written when its batch committed (0 when caught up)",
            ),
            &["stream"],
        )
        .expect("static metric definition");
        let delay = HistogramVec::new(
            HistogramOpts::new(
                "hookrelay_history_delay_seconds",
                "Time from the oldest record of a batch to the batch's commit",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
            ]),
            &["stream"],
        )
        .expect("static metric definition");
        for c in [&records, &skipped, &batches] {
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
        }
        registry
            .register(Box::new(offset.clone()))
            .expect("registered once");
        registry
            .register(Box::new(lag.clone()))
            .expect("registered once");
        registry
            .register(Box::new(delay.clone()))
            .expect("registered once");
        Self {
            registry,
            records,
            skipped,
            batches,
            offset,
            lag,
            delay,
        }
    }
}

impl HistoryMetrics {
    /// Every metric's name, for checking alert rules against.
    pub fn names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let collectors: [&dyn Collector; 6] = [
            &self.records,
            &self.skipped,
            &self.batches,
            &self.offset,
            &self.lag,
            &self.delay,
        ];
        collectors
            .iter()
            .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
            .collect()
    }
}

impl Default for HistoryMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything `hookrelay history` runs on.
#[derive(Clone)]
pub struct HistorySetup {
    pub pool: PgPool,
    pub amqp_url: SecretUrl,
    pub ladder: Ladder,
    pub config: HistoryConfig,
    pub metrics: HistoryMetrics,
}

/// Materializes until `stop` is cancelled, reconnecting (and reading on from the stored
/// offsets) after any error. Returns only on `stop` or when there is nothing to read.
pub async fn run(setup: HistorySetup, stop: CancellationToken) -> Result<(), HistoryError> {
    let kinds: Vec<StreamKind> = setup.ladder.streams().into_iter().map(|(k, _)| k).collect();
    if kinds.is_empty() {
        return Err(HistoryError::NothingToRead);
    }
    let mut failures = 0usize;
    while !stop.is_cancelled() {
        let started = Instant::now();
        let result = run_once(&setup, &kinds, &stop).await;
        match result {
            Ok(()) => return Ok(()),
            Err(e) => {
                // A run that went well for a while starts the backoff over.
                if started.elapsed() > Duration::from_secs(60) {
                    failures = 0;
                }
                let wait = BACKOFF[failures.min(BACKOFF.len() - 1)];
                failures += 1;
                warn!(error = %e, retry_in = ?wait, "History stopped reading; reading on from the stored offsets");
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    Ok(())
}

async fn run_once(
    setup: &HistorySetup,
    kinds: &[StreamKind],
    stop: &CancellationToken,
) -> Result<(), HistoryError> {
    let conn = Connection::connect(
        setup.amqp_url.expose(),
        ConnectionProperties::default().with_connection_name("hookrelay history".into()),
    )
    .await
    .map_err(HistoryError::Connect)?;
    // One failing stream stops both: each reads on from its own stored offset anyway.
    let failed = stop.child_token();
    let followers = kinds.iter().map(|kind| {
        let failed = failed.clone();
        let conn = &conn;
        async move {
            let result = follow(setup, conn, *kind, &failed).await;
            if result.is_err() {
                failed.cancel();
            }
            result
        }
    });
    let results = futures_util::future::join_all(followers).await;
    let _ = conn.close(200, "history stopped".into()).await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    Ok(())
}

/// The table a stream is materialized into.
pub fn table_of(kind: StreamKind) -> &'static str {
    match kind {
        StreamKind::Archive => "history_events",
        StreamKind::Attempts => "history_attempts",
    }
}

/// A batch being collected.
#[derive(Default)]
struct Batch {
    text: String,
    rows: u64,
    skipped: u64,
    days: HashSet<u64>,
    oldest: Option<SystemTime>,
    newest: Option<SystemTime>,
}

impl Batch {
    fn add_time(&mut self, t: SystemTime) {
        self.days.insert(day_of(t));
        self.oldest = Some(self.oldest.map_or(t, |o| o.min(t)));
        self.newest = Some(self.newest.map_or(t, |n| n.max(t)));
    }
}

/// Reads one stream and writes it in batches until `stop`.
async fn follow(
    setup: &HistorySetup,
    conn: &Connection,
    kind: StreamKind,
    stop: &CancellationToken,
) -> Result<(), HistoryError> {
    let stream = setup.ladder.stream(kind);
    let label = kind.as_str();
    let table = table_of(kind);
    let pool = &setup.pool;
    sqlx::query(
        "INSERT INTO history_progress (stream, next_offset) VALUES ($1, 0) \
         ON CONFLICT (stream) DO NOTHING",
    )
    .bind(&stream)
    .execute(pool)
    .await?;
    let stored: i64 =
        sqlx::query_scalar("SELECT next_offset FROM history_progress WHERE stream = $1")
            .bind(&stream)
            .fetch_one(pool)
            .await?;
    let mut next = u64::try_from(stored).unwrap_or(0);
    let start = if next == 0 {
        StreamStart::First
    } else {
        StreamStart::Offset(next)
    };
    let prefetch = u16::try_from(setup.config.batch.saturating_mul(2)).unwrap_or(u16::MAX);
    let read_error = |source| HistoryError::Read {
        stream: stream.clone(),
        source,
    };
    let mut reader = StreamReader::open(conn, &stream, start, prefetch)
        .await
        .map_err(read_error)?;
    info!(stream = %stream, offset = next, "Reading into the history database");
    setup.metrics.offset.with_label_values(&[label]).set(stored);
    let mut partitions: HashSet<u64> = HashSet::new();
    let mut last_retention: Option<Instant> = None;
    let flush = setup.config.flush;
    let result = async {
        loop {
            if last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
                drop_expired(pool, table, setup.config.retention_days, &mut partitions).await?;
                last_retention = Some(Instant::now());
            }
            // The first message of a batch: as long as it takes.
            let first = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                m = tokio::time::timeout(flush, reader.next()) => m,
            };
            let first = match first {
                Err(_) => {
                    setup.metrics.lag.with_label_values(&[label]).set(0.0);
                    continue;
                }
                Ok(None) => {
                    return Err(HistoryError::Ended {
                        stream: stream.clone(),
                    });
                }
                Ok(Some(m)) => m.map_err(read_error)?,
            };
            let mut batch = Batch::default();
            let mut end = next;
            let mut message = Some(first);
            let deadline = tokio::time::Instant::now() + flush;
            loop {
                if let Some(m) = message.take()
                    && let Some(offset) = m.offset
                    // A reader attached at an offset may be given the rest of its chunk first.
                    && offset >= next
                {
                    end = end.max(offset + 1);
                    add(kind, &mut batch, offset, &m.delivery);
                }
                if batch.rows + batch.skipped >= setup.config.batch as u64 || stop.is_cancelled() {
                    break;
                }
                match tokio::time::timeout_at(deadline, reader.next()).await {
                    Err(_) => break,
                    Ok(None) => break,
                    Ok(Some(m)) => message = Some(m.map_err(read_error)?),
                }
            }
            if end == next {
                continue;
            }
            let missing: Vec<u64> = batch.days.difference(&partitions).copied().collect();
            for day in missing {
                sqlx::query(&create_partition(table, day))
                    .execute(pool)
                    .await?;
                partitions.insert(day);
            }
            commit(pool, &stream, kind, next, end, &batch).await?;
            next = end;
            let m = &setup.metrics;
            m.records.with_label_values(&[label]).inc_by(batch.rows);
            m.skipped.with_label_values(&[label]).inc_by(batch.skipped);
            m.batches.with_label_values(&[label]).inc();
            m.offset
                .with_label_values(&[label])
                .set(i64::try_from(next).unwrap_or(i64::MAX));
            let now = SystemTime::now();
            let age = |t: Option<SystemTime>| {
                t.and_then(|t| now.duration_since(t).ok())
                    .map_or(0.0, |d| d.as_secs_f64())
            };
            m.lag.with_label_values(&[label]).set(age(batch.newest));
            m.delay
                .with_label_values(&[label])
                .observe(age(batch.oldest));
        }
    }
    .await;
    reader.close().await;
    result
}

/// Adds one stream message to the batch: a row, or a skip the metric counts.
fn add(kind: StreamKind, batch: &mut Batch, offset: u64, delivery: &lapin::message::Delivery) {
    match kind {
        StreamKind::Archive => {
            match EventRow::read(
                offset,
                delivery.routing_key.as_str(),
                &delivery.properties,
                SystemTime::now(),
            ) {
                Some(row) => {
                    batch.add_time(row.accepted_at);
                    row.copy_line(&mut batch.text);
                    batch.rows += 1;
                }
                None => batch.skipped += 1,
            }
        }
        StreamKind::Attempts => match AttemptRow::read(offset, &delivery.data) {
            Ok(rows) => {
                for row in rows {
                    batch.add_time(row.at);
                    row.copy_line(&mut batch.text);
                    batch.rows += 1;
                }
            }
            Err(reason) => {
                warn!(offset, %reason, "Passed over a message of the attempt log");
                batch.skipped += 1;
            }
        },
    }
}

/// Writes a batch and the offset it reached in one transaction, if the stored offset is still
/// where this reader started it.
async fn commit(
    pool: &PgPool,
    stream: &str,
    kind: StreamKind,
    expected: u64,
    end: u64,
    batch: &Batch,
) -> Result<(), HistoryError> {
    let mut tx = pool.begin().await?;
    let found: i64 =
        sqlx::query_scalar("SELECT next_offset FROM history_progress WHERE stream = $1 FOR UPDATE")
            .bind(stream)
            .fetch_one(&mut *tx)
            .await?;
    let found = u64::try_from(found).unwrap_or(0);
    if found != expected {
        return Err(HistoryError::Moved {
            stream: stream.to_owned(),
            expected,
            found,
        });
    }
    if batch.rows > 0 {
        let columns = match kind {
            StreamKind::Archive => EVENT_COLUMNS,
            StreamKind::Attempts => ATTEMPT_COLUMNS,
        };
        let mut copy = tx
            .copy_in_raw(&format!("COPY {} ({columns}) FROM STDIN", table_of(kind)))
            .await?;
        copy.send(batch.text.as_bytes()).await?;
        copy.finish().await?;
    }
    let newest = batch
        .newest
        .map(|t| humantime::format_rfc3339_micros(t).to_string());
    sqlx::query(
        "UPDATE history_progress SET next_offset = $2, \
         newest_at = COALESCE($3::timestamptz, newest_at), updated_at = now() WHERE stream = $1",
    )
    .bind(stream)
    .bind(i64::try_from(end).unwrap_or(i64::MAX))
    .bind(newest)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Drops `table`'s day partitions older than `keep_days`.
async fn drop_expired(
    pool: &PgPool,
    table: &str,
    keep_days: u32,
    partitions: &mut HashSet<u64>,
) -> Result<(), HistoryError> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = $1",
    )
    .bind(table)
    .fetch_all(pool)
    .await?;
    let today = day_of(SystemTime::now());
    for name in expired_partitions(table, &names, today, keep_days) {
        sqlx::query(&format!("DROP TABLE IF EXISTS {name}"))
            .execute(pool)
            .await?;
        info!(partition = %name, keep_days, "Dropped a day of history past its retention");
    }
    // Forget what may have been dropped; creating again is idempotent.
    partitions.clear();
    Ok(())
}
