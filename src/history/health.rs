//! What the console reads of recent attempts: the endpoints failing now, and what was
//! dead-lettered lately by reason. Both bound `at`, so only the newest day partitions are read.

use std::time::Duration;

use sqlx::{PgPool, Row};

/// A subscription whose recent attempts failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failing {
    pub subscription: String,
    pub tenant: Option<String>,
    /// Attempts that made a request and did not deliver.
    pub failures: i64,
    pub delivered: i64,
    /// The newest failure's status and error.
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    /// RFC 3339, UTC.
    pub last_at: String,
}

fn seconds(window: Duration) -> f64 {
    window.as_secs_f64()
}

/// The subscriptions with the most failed attempts over the last `window`, at most `limit`.
pub async fn failing(
    pool: &PgPool,
    window: Duration,
    limit: u32,
) -> Result<Vec<Failing>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT subscription, max(tenant) AS tenant, \
                count(*) FILTER (WHERE outcome <> 'delivered') AS failures, \
                count(*) FILTER (WHERE outcome = 'delivered') AS delivered, \
                (array_agg(status ORDER BY at DESC) FILTER (WHERE outcome <> 'delivered'))[1] AS last_status, \
                (array_agg(error ORDER BY at DESC) FILTER (WHERE outcome <> 'delivered'))[1] AS last_error, \
                to_char(max(at) FILTER (WHERE outcome <> 'delivered') AT TIME ZONE 'UTC', \
                        'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS last_at \
         FROM history_attempts \
         WHERE at > now() - make_interval(secs => $1) AND attempt > 0 \
           AND subscription IS NOT NULL \
         GROUP BY subscription \
         HAVING count(*) FILTER (WHERE outcome <> 'delivered') > 0 \
         ORDER BY failures DESC, subscription LIMIT $2",
    )
    .bind(seconds(window))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Failing {
                subscription: r.try_get("subscription")?,
                tenant: r.try_get("tenant")?,
                failures: r.try_get("failures")?,
                delivered: r.try_get("delivered")?,
                last_status: r.try_get("last_status")?,
                last_error: r.try_get("last_error")?,
                last_at: r.try_get("last_at")?,
            })
        })
        .collect()
}

/// How many deliveries went to the dead sink over the last `window`, by reason (the attempt
/// log's outcome of a dead-lettering is its reason), for the `reasons` named.
pub async fn dead_by_reason(
    pool: &PgPool,
    window: Duration,
    reasons: &[&str],
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let reasons: Vec<String> = reasons.iter().map(|r| (*r).to_owned()).collect();
    let rows = sqlx::query(
        "SELECT outcome, count(*) AS n FROM history_attempts \
         WHERE at > now() - make_interval(secs => $1) AND outcome = ANY($2) \
         GROUP BY outcome ORDER BY n DESC, outcome",
    )
    .bind(seconds(window))
    .bind(&reasons)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("outcome")?, r.try_get("n")?)))
        .collect()
}
