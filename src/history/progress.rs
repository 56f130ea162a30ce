//! Where `hookrelay history` is in each stream, for `hookrelay status`.

use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::units::fmt_duration;

/// One stream's row of `history_progress`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamProgress {
    pub stream: String,
    /// The next offset history reads.
    pub next_offset: i64,
    /// How old the newest record written is, in seconds (`None`: nothing written yet).
    pub newest_age: Option<f64>,
    /// How long ago the last batch committed, in seconds.
    pub committed_age: f64,
}

/// The progress of `streams` (those history has started on).
pub async fn of(pool: &PgPool, streams: &[String]) -> Result<Vec<StreamProgress>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT stream, next_offset, \
         extract(epoch from now() - newest_at)::float8 AS newest_age, \
         extract(epoch from now() - updated_at)::float8 AS committed_age \
         FROM history_progress WHERE stream = ANY($1) ORDER BY stream",
    )
    .bind(streams)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StreamProgress {
                stream: r.try_get("stream")?,
                next_offset: r.try_get("next_offset")?,
                newest_age: r.try_get("newest_age")?,
                committed_age: r.try_get("committed_age")?,
            })
        })
        .collect()
}

fn age(seconds: f64) -> String {
    fmt_duration(std::time::Duration::from_secs_f64(seconds.max(0.0)))
}

/// Lines for `hookrelay status` (pure); `streams` are the ladder's, in order.
pub fn render(streams: &[String], progress: &[StreamProgress]) -> String {
    let mut out = String::from("History (hookrelay history, into PostgreSQL):\n");
    for stream in streams {
        match progress.iter().find(|p| p.stream == *stream) {
            None => out.push_str(&format!(
                "  {stream}: not read yet (is hookrelay history running?)\n"
            )),
            Some(p) => out.push_str(&format!(
                "  {stream}: read to offset {}; newest record written {} old, last batch {} ago\n",
                p.next_offset,
                p.newest_age.map_or_else(|| "-".to_owned(), age),
                age(p.committed_age),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_says_how_far_history_read_and_which_stream_it_has_not() {
        let text = render(
            &["p.archive".into(), "p.attempts".into()],
            &[StreamProgress {
                stream: "p.attempts".into(),
                next_offset: 1200,
                newest_age: Some(2.0),
                committed_age: 1.0,
            }],
        );
        assert!(text.contains("p.archive: not read yet"), "{text}");
        assert!(
            text.contains(
                "p.attempts: read to offset 1200; newest record written 2s old, last batch 1s ago"
            ),
            "{text}"
        );
    }
}
