//! What a throughput run's streams took, and `hookrelay history` running beside the worker:
//!
//! - [`StreamCounts`]: the messages, bytes and attempt records each of the ladder's streams
//!   gained during a run, read back from the streams (so per delivery: how many stream messages
//!   the broker wrote, and how large);
//! - [`HistoryBeside`] (`--with-history`): `hookrelay history` as a process of its own beside
//!   the worker, into a database of its own, and how long after the last delivery it had every
//!   record of the run in PostgreSQL.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lapin::Connection;
use serde::Serialize;

use hookrelay::broker::streams::{StreamReadError, end_of, read_window};
use hookrelay::config::Config;
use hookrelay::contract::ladder::Ladder;
use hookrelay::contract::retention::StreamKind;
use hookrelay::observe::events::AttemptRecord;
use hookrelay::store::PgStore;

use super::BenchError;
use crate::kit::{ScratchDb, ladder_toml, pg_server_url};

/// What one stream holds: messages, their bodies' bytes, and (for the attempt log) records.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StreamHeld {
    pub messages: u64,
    pub bytes: u64,
    pub records: u64,
}

/// What the run's ladder's streams hold after it, and per delivery.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamCounts {
    pub deliveries: u64,
    pub archive: Option<StreamHeld>,
    pub attempts: Option<StreamHeld>,
}

impl StreamCounts {
    pub fn line(&self) -> String {
        let per = |n: u64| n as f64 / self.deliveries.max(1) as f64;
        let mut line = String::from("streams per delivery:");
        if let Some(a) = self.archive {
            line += &format!(
                " archive {:.2} messages, {:.0} bytes;",
                per(a.messages),
                per(a.bytes)
            );
        }
        match self.attempts {
            Some(a) => {
                line += &format!(
                    " attempt log {:.4} messages ({:.1} records a message, {:.0} bytes a record)",
                    per(a.messages),
                    a.records as f64 / a.messages.max(1) as f64,
                    a.bytes as f64 / a.records.max(1) as f64,
                );
            }
            None if self.archive.is_none() => line += " none",
            None => {}
        }
        line + "\n"
    }
}

/// Reads `stream` from its start to its end now.
async fn held(conn: &Connection, stream: &str, records: bool) -> Option<StreamHeld> {
    let end = end_of(conn, stream, None).await.ok()?;
    let mut held = StreamHeld::default();
    let Some(end) = end else {
        return Some(held);
    };
    read_window::<StreamReadError>(
        conn,
        stream,
        std::time::UNIX_EPOCH,
        end,
        |_| (),
        async |d| {
            held.messages += 1;
            held.bytes += d.data.len() as u64;
            if records {
                held.records += AttemptRecord::read_message(&d.data).map_or(0, |r| r.len() as u64);
            }
            Ok(())
        },
    )
    .await
    .ok()?;
    Some(held)
}

/// What the ladder's streams hold (each `None` when the ladder has no such stream).
pub async fn count(conn: &Connection, ladder: &Ladder, deliveries: u64) -> StreamCounts {
    let archive = match ladder.archive {
        Some(_) => held(conn, &ladder.stream(StreamKind::Archive), false).await,
        None => None,
    };
    let attempts = match ladder.attempts {
        Some(_) => held(conn, &ladder.stream(StreamKind::Attempts), true).await,
        None => None,
    };
    StreamCounts {
        deliveries,
        archive,
        attempts,
    }
}

/// `hookrelay history` beside the worker, what it wrote, and how late.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HistoryBesideReport {
    /// Attempt rows in PostgreSQL when it had read the attempt log to its end.
    pub attempt_rows: i64,
    /// From the bench's look after the last delivery until history had read the attempt log to
    /// its end: the attempt log's lag to PostgreSQL at the end of a burst.
    pub caught_up_ms: f64,
    /// Whether it got there within a minute.
    pub caught_up: bool,
}

impl HistoryBesideReport {
    pub fn line(&self) -> String {
        format!(
            "hookrelay history beside: {} attempt rows, {} {:.0} ms after the last delivery\n",
            self.attempt_rows,
            if self.caught_up {
                "caught up"
            } else {
                "NOT caught up"
            },
            self.caught_up_ms
        )
    }
}

/// `hookrelay history` running on a ladder, into a scratch database.
pub struct HistoryBeside {
    child: tokio::process::Child,
    pool: sqlx::PgPool,
    db: ScratchDb,
    _dir: tempfile::TempDir,
}

impl HistoryBeside {
    pub async fn start(exe: &Path, config: &Config, ladder: &Ladder) -> Result<Self, BenchError> {
        let db = ScratchDb::create_on(&pg_server_url(), "hookrelay_bench_beside").await?;
        let store = PgStore::connect(&db.url, Duration::from_secs(5)).await?;
        store.migrate().await?;
        let pool = store.pool().clone();
        let dir = tempfile::tempdir()?;
        let ladder_file = dir.path().join("ladder.toml");
        std::fs::write(&ladder_file, ladder_toml(ladder))?;
        let child = tokio::process::Command::new(exe)
            .arg("history")
            .env("HOOKRELAY_AMQP_URL", config.amqp.url.expose())
            .env("HOOKRELAY_LADDER", &ladder_file)
            .env("HOOKRELAY_HISTORY_DATABASE", &db.url)
            .env("HOOKRELAY_HISTORY_LISTEN", "")
            .env("HOOKRELAY_LOG_LEVEL", "error")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self {
            child,
            pool,
            db,
            _dir: dir,
        })
    }

    /// Waits (at most a minute) until history has read the attempt log to offset `end`, then
    /// stops it.
    pub async fn finish(mut self, end: u64) -> HistoryBesideReport {
        let started = Instant::now();
        let mut report = HistoryBesideReport::default();
        while started.elapsed() < Duration::from_secs(60) {
            let next: Option<i64> = sqlx::query_scalar(
                "SELECT max(next_offset) FROM history_progress WHERE stream LIKE '%attempts'",
            )
            .fetch_one(&self.pool)
            .await
            .ok()
            .flatten();
            if next.is_some_and(|n| n as u64 >= end) {
                report.caught_up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        report.caught_up_ms = started.elapsed().as_secs_f64() * 1000.0;
        report.attempt_rows = sqlx::query_scalar("SELECT count(*) FROM history_attempts")
            .fetch_one(&self.pool)
            .await
            .unwrap_or(0);
        let _ = self.child.kill().await;
        self.pool.close().await;
        drop(self.db);
        report
    }
}
