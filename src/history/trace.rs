//! An event's whole story from the history database, for `hookrelay trace` and
//! `GET /v1/events/{id}`, and a subscription's attempts page by page for
//! `GET /v1/subscriptions/{id}/attempts`.

use serde::Serialize;
use sqlx::{PgPool, Row};

/// When an event was accepted at the ingress (again, for a replay's copy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    pub id: String,
    pub tenant: String,
    pub event_type: Option<String>,
    pub subscription: Option<String>,
    /// The replay that published this copy (`rpl_<hex>`).
    pub replay: Option<String>,
    /// For a copy a redrive published through the ingress: its redrive count.
    pub redrives: i32,
    /// RFC 3339, UTC.
    pub at: String,
}

/// One attempt-log record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Attempt {
    pub envelope: Option<String>,
    /// For a delivery made by fan-out: the event it came from.
    pub event: Option<String>,
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    /// 1-based; 0 when no HTTP request was made.
    pub attempt: i32,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub latency_ms: Option<i64>,
    pub outcome: String,
    /// The tier a retry waits in.
    pub tier: Option<String>,
    pub lane: String,
    /// Times redriven out of the dead sink before this attempt.
    pub redrives: i32,
    pub replay: Option<String>,
    /// RFC 3339, UTC.
    pub at: String,
}

/// Everything history holds about one id: its acceptance(s) and every attempt of it or, for an
/// event that fanned out, of its deliveries; oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Story {
    pub id: String,
    pub accepted: Vec<Accepted>,
    pub attempts: Vec<Attempt>,
    /// Each delivery's latest outcome, in the order the deliveries were first seen.
    pub outcomes: Vec<Outcome>,
}

/// A delivery's latest outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Outcome {
    pub envelope: String,
    pub outcome: String,
}

const TIME: &str = r#"to_char(TIMEZONE('UTC', {col}), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"#;

fn time(col: &str) -> String {
    TIME.replace("{col}", col)
}

fn attempt_columns() -> String {
    format!(
        "envelope, event, tenant, subscription, attempt, status, error, latency_ms, outcome, tier, \
         lane, redrives, replay, {} AS at_text, (extract(epoch from at) * 1000000)::int8 AS at_us, \
         stream_offset",
        time("at")
    )
}

fn attempt_of(row: &sqlx::postgres::PgRow) -> Result<Attempt, sqlx::Error> {
    Ok(Attempt {
        envelope: row.try_get("envelope")?,
        event: row.try_get("event")?,
        tenant: row.try_get("tenant")?,
        subscription: row.try_get("subscription")?,
        attempt: row.try_get("attempt")?,
        status: row.try_get("status")?,
        error: row.try_get("error")?,
        latency_ms: row.try_get("latency_ms")?,
        outcome: row.try_get("outcome")?,
        tier: row.try_get("tier")?,
        lane: row.try_get("lane")?,
        redrives: row.try_get("redrives")?,
        replay: row.try_get("replay")?,
        at: row.try_get("at_text")?,
    })
}

/// The story of `id` (an event id or a delivery's id), `None` when history holds nothing of
/// it; with `tenant`, `None` too when it is another tenant's.
pub async fn story(
    pool: &PgPool,
    id: &str,
    tenant: Option<&str>,
) -> Result<Option<Story>, sqlx::Error> {
    let rows = sqlx::query(&format!(
        "SELECT {} FROM history_attempts WHERE (envelope = $1 OR event = $1) \
         AND ($2::text IS NULL OR tenant = $2) ORDER BY at, stream_offset",
        attempt_columns()
    ))
    .bind(id)
    .bind(tenant)
    .fetch_all(pool)
    .await?;
    let attempts = rows.iter().map(attempt_of).collect::<Result<Vec<_>, _>>()?;
    // A delivery made by fan-out was accepted as its event.
    let mut ids = vec![id.to_owned()];
    ids.extend(attempts.iter().filter_map(|a| a.event.clone()));
    ids.sort();
    ids.dedup();
    let accepted = sqlx::query(&format!(
        "SELECT id, tenant, event_type, subscription, replay, redrives, {} AS at_text \
         FROM history_events \
         WHERE id = ANY($1) AND ($2::text IS NULL OR tenant = $2) \
         ORDER BY accepted_at, stream_offset",
        time("accepted_at")
    ))
    .bind(&ids)
    .bind(tenant)
    .fetch_all(pool)
    .await?
    .iter()
    .map(|row| {
        Ok(Accepted {
            id: row.try_get("id")?,
            tenant: row.try_get("tenant")?,
            event_type: row.try_get("event_type")?,
            subscription: row.try_get("subscription")?,
            replay: row.try_get("replay")?,
            redrives: row.try_get("redrives")?,
            at: row.try_get("at_text")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Story::of(id, accepted, attempts))
}

impl Story {
    /// The story of `id` from what was found of it; `None` when nothing was.
    pub fn of(id: &str, accepted: Vec<Accepted>, attempts: Vec<Attempt>) -> Option<Self> {
        if accepted.is_empty() && attempts.is_empty() {
            return None;
        }
        Some(Self {
            id: id.to_owned(),
            outcomes: outcomes(&attempts),
            accepted,
            attempts,
        })
    }
}

/// Each delivery's latest outcome, in the order the deliveries were first seen (pure).
pub fn outcomes(attempts: &[Attempt]) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = Vec::new();
    for a in attempts {
        let Some(envelope) = &a.envelope else {
            continue;
        };
        match out.iter_mut().find(|o| o.envelope == *envelope) {
            Some(entry) => entry.outcome = a.outcome.clone(),
            None => out.push(Outcome {
                envelope: envelope.clone(),
                outcome: a.outcome.clone(),
            }),
        }
    }
    out
}

/// Where a page of attempts ends: the last one's time (microseconds) and stream offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub at_us: i64,
    pub offset: i64,
}

impl Cursor {
    pub fn encode(self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("{}:{}", self.at_us, self.offset))
    }

    pub fn decode(text: &str) -> Option<Self> {
        use base64::Engine;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let (at, offset) = raw.split_once(':')?;
        Some(Self {
            at_us: at.parse().ok()?,
            offset: offset.parse().ok()?,
        })
    }
}

/// Which attempts of a subscription a page holds.
#[derive(Debug, Clone, Default)]
pub struct AttemptQuery {
    /// Only the tenant's (a tenant-scoped caller).
    pub tenant: Option<String>,
    /// At or after this time, microseconds since the epoch.
    pub since_us: Option<i64>,
    pub outcome: Option<String>,
    pub after: Option<Cursor>,
    pub limit: u32,
    /// Newest first (the portal's lists); else oldest first. The cursor follows the order.
    pub newest_first: bool,
}

/// One page of a subscription's attempts, oldest first (or newest, as asked), and the cursor
/// of the next page.
pub async fn attempts_of(
    pool: &PgPool,
    subscription: &str,
    query: &AttemptQuery,
) -> Result<(Vec<Attempt>, Option<Cursor>), sqlx::Error> {
    let limit = i64::from(query.limit.max(1));
    let (past, order) = if query.newest_first {
        ("<", "DESC")
    } else {
        (">", "ASC")
    };
    let rows = sqlx::query(&format!(
        "SELECT {} FROM history_attempts WHERE subscription = $1 \
         AND ($2::text IS NULL OR tenant = $2) \
         AND ($3::int8 IS NULL OR at >= to_timestamp($3::float8 / 1000000)) \
         AND ($4::text IS NULL OR outcome = $4) \
         AND ($5::int8 IS NULL OR (at, stream_offset) {past} (to_timestamp($5::float8 / 1000000), $6)) \
         ORDER BY at {order}, stream_offset {order} LIMIT $7",
        attempt_columns()
    ))
    .bind(subscription)
    .bind(&query.tenant)
    .bind(query.since_us)
    .bind(&query.outcome)
    .bind(query.after.map(|c| c.at_us))
    .bind(query.after.map_or(0, |c| c.offset))
    .bind(limit + 1)
    .fetch_all(pool)
    .await?;
    let more = rows.len() as i64 > limit;
    let mut page = Vec::with_capacity(rows.len());
    let mut last = None;
    for row in rows.iter().take(limit as usize) {
        page.push(attempt_of(row)?);
        last = Some(Cursor {
            at_us: row.try_get("at_us")?,
            offset: row.try_get("stream_offset")?,
        });
    }
    Ok((page, if more { last } else { None }))
}

/// Whether history holds any attempt of `subscription` (of `tenant`'s, when given).
pub async fn has_attempts(
    pool: &PgPool,
    subscription: &str,
    tenant: Option<&str>,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM history_attempts WHERE subscription = $1 \
         AND ($2::text IS NULL OR tenant = $2))",
    )
    .bind(subscription)
    .bind(tenant)
    .fetch_one(pool)
    .await
}

/// The story in words, a line per step (pure): what `hookrelay trace` prints.
pub fn render(story: &Story) -> String {
    let mut out = String::new();
    let first = story.accepted.first();
    out.push_str(&story.id);
    if let Some(a) = first {
        out.push_str(&format!(
            "  tenant {}  type {}",
            a.tenant,
            a.event_type.as_deref().unwrap_or("-")
        ));
    }
    out.push('\n');
    let mut lines: Vec<(&str, String)> = Vec::new();
    for a in &story.accepted {
        let what = match &a.replay {
            Some(r) => format!("accepted again: replayed by {r}"),
            None if a.redrives > 0 => {
                format!("redriven out of the dead sink ({})", a.redrives)
            }
            None if a.id != story.id => format!("accepted as event {}", a.id),
            None => "accepted at the ingress".to_owned(),
        };
        let what = match &a.subscription {
            Some(s) => format!("{what} (for {s})"),
            None => what,
        };
        lines.push((&a.at, what));
    }
    let mut redrives: Vec<(String, i32)> = Vec::new();
    for a in &story.attempts {
        let envelope = a.envelope.clone().unwrap_or_default();
        let seen = redrives.iter_mut().find(|(e, _)| *e == envelope);
        let before = seen.as_ref().map_or(0, |(_, r)| *r);
        // A redrive the archive kept is told by its acceptance above.
        let told = story
            .accepted
            .iter()
            .any(|x| x.redrives == a.redrives && x.replay.is_none());
        if a.redrives > before && !told {
            lines.push((
                &a.at,
                format!("redriven out of the dead sink ({})", a.redrives),
            ));
        }
        match seen {
            Some(entry) => entry.1 = a.redrives,
            None => redrives.push((envelope.clone(), a.redrives)),
        }
        let mut what = String::new();
        if envelope != story.id {
            what.push_str(&format!("[{envelope}] "));
        }
        if a.attempt > 0 {
            what.push_str(&format!("attempt {}", a.attempt));
        } else {
            what.push_str("no request");
        }
        if let Some(s) = &a.subscription {
            what.push_str(&format!(" to {s}"));
        }
        what.push_str(&format!(": {}", a.outcome));
        match (a.status, &a.error) {
            (Some(status), _) => what.push_str(&format!(", HTTP {status}")),
            (None, Some(error)) => what.push_str(&format!(", {error}")),
            (None, None) => {}
        }
        if let Some(ms) = a.latency_ms {
            what.push_str(&format!(", {ms} ms"));
        }
        if let Some(tier) = &a.tier {
            what.push_str(&format!(", waits in {tier}"));
        }
        if let Some(r) = &a.replay {
            what.push_str(&format!(" (replay {r})"));
        }
        lines.push((&a.at, what));
    }
    // Both lists are in time order; merge them, acceptance first on a tie.
    lines.sort_by(|a, b| a.0.cmp(b.0));
    for (at, what) in lines {
        out.push_str(&format!("  {at}  {what}\n"));
    }
    match story.outcomes.as_slice() {
        [] => out.push_str("  outcome: no delivery recorded yet\n"),
        [one] => out.push_str(&format!("  outcome: {}\n", one.outcome)),
        many => {
            for o in many {
                out.push_str(&format!("  outcome of {}: {}\n", o.envelope, o.outcome));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: i32, outcome: &str, redrives: i32, at: &str) -> Attempt {
        Attempt {
            envelope: Some("evt_1".into()),
            event: None,
            tenant: Some("acme".into()),
            subscription: Some("sub_a".into()),
            attempt: n,
            status: Some(if outcome == "delivered" { 204 } else { 503 }),
            error: None,
            latency_ms: Some(12),
            outcome: outcome.into(),
            tier: (outcome == "retried").then(|| "retry-1s".into()),
            lane: "hookrelay.ready".into(),
            redrives,
            replay: None,
            at: at.into(),
        }
    }

    #[test]
    fn the_story_reads_in_time_order_with_tiers_redrives_and_the_outcome() {
        let attempts = vec![
            attempt(1, "retried", 0, "2026-12-04T10:00:01.000000Z"),
            attempt(2, "exhausted", 0, "2026-12-04T10:00:02.000000Z"),
            attempt(1, "delivered", 1, "2026-12-04T10:05:00.000000Z"),
        ];
        let story = Story {
            id: "evt_1".into(),
            accepted: vec![Accepted {
                id: "evt_1".into(),
                tenant: "acme".into(),
                event_type: Some("order.paid".into()),
                subscription: None,
                replay: None,
                redrives: 0,
                at: "2026-12-04T10:00:00.000000Z".into(),
            }],
            outcomes: outcomes(&attempts),
            attempts,
        };
        let text = render(&story);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "evt_1  tenant acme  type order.paid");
        assert!(lines[1].ends_with("accepted at the ingress"), "{text}");
        assert!(
            lines[2].ends_with("attempt 1 to sub_a: retried, HTTP 503, 12 ms, waits in retry-1s"),
            "{text}"
        );
        assert!(lines[3].contains("attempt 2 to sub_a: exhausted"), "{text}");
        assert!(
            lines[4].ends_with("redriven out of the dead sink (1)"),
            "{text}"
        );
        assert!(
            lines[5].contains("attempt 1 to sub_a: delivered, HTTP 204"),
            "{text}"
        );
        assert_eq!(lines[6], "  outcome: delivered");
    }

    #[test]
    fn a_cursor_survives_its_encoding_and_garbage_is_none() {
        let c = Cursor {
            at_us: 1_796_342_400_123_456,
            offset: 42,
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        assert_eq!(Cursor::decode("!!"), None);
        assert_eq!(Cursor::decode("bm9jb2xvbg"), None);
    }
}
