//! An event's story read from the streams themselves over a window, for `hookrelay trace
//! --since` without the history database: the same [`Story`] the database gives, at the cost of
//! reading every record of the window.

use std::time::SystemTime;

use super::rows::{AttemptRow, EventRow};
use super::trace::{Accepted, Attempt, Story};
use crate::broker::streams::{StreamReadError, end_of, read_window};
use crate::contract::ladder::Ladder;
use crate::contract::retention::StreamKind;

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// The story of `id` from `since` to the streams' ends now; `None` when neither stream holds
/// anything of it.
pub async fn story(
    conn: &lapin::Connection,
    ladder: &Ladder,
    id: &str,
    since: SystemTime,
) -> Result<Option<Story>, StreamReadError> {
    let mut attempts = Vec::new();
    if ladder.attempts.is_some() {
        let stream = ladder.stream(StreamKind::Attempts);
        if let Some(end) = end_of(conn, &stream, None).await? {
            read_window::<StreamReadError>(
                conn,
                &stream,
                since,
                end,
                |_| (),
                async |d| {
                    for row in AttemptRow::read(0, &d.data).unwrap_or_default() {
                        let r = row.record;
                        if r.envelope.as_deref() == Some(id) || r.event.as_deref() == Some(id) {
                            attempts.push(Attempt {
                                attempt: i32::try_from(r.attempt).unwrap_or(i32::MAX),
                                status: r.status.map(i32::from),
                                latency_ms: r
                                    .latency_ms
                                    .map(|l| i64::try_from(l).unwrap_or(i64::MAX)),
                                redrives: i32::try_from(r.redrives).unwrap_or(i32::MAX),
                                at: rfc3339(row.at),
                                envelope: r.envelope,
                                event: r.event,
                                tenant: r.tenant,
                                subscription: r.subscription,
                                error: r.error,
                                outcome: r.outcome,
                                tier: r.tier,
                                lane: r.lane,
                                replay: r.replay,
                            });
                        }
                    }
                    Ok(())
                },
            )
            .await?;
        }
    }
    let mut ids = vec![id.to_owned()];
    ids.extend(attempts.iter().filter_map(|a| a.event.clone()));
    let mut accepted = Vec::new();
    if ladder.archive.is_some() {
        let stream = ladder.stream(StreamKind::Archive);
        if let Some(end) = end_of(conn, &stream, None).await? {
            read_window::<StreamReadError>(
                conn,
                &stream,
                since,
                end,
                |_| (),
                async |d| {
                    if let Some(row) =
                        EventRow::read(0, d.routing_key.as_str(), &d.properties, SystemTime::now())
                        && ids.contains(&row.id)
                    {
                        accepted.push(Accepted {
                            at: rfc3339(row.accepted_at),
                            id: row.id,
                            tenant: row.tenant,
                            event_type: row.event_type,
                            subscription: row.subscription,
                            replay: row.replay,
                            redrives: i32::try_from(row.redrives).unwrap_or(i32::MAX),
                        });
                    }
                    Ok(())
                },
            )
            .await?;
        }
    }
    Ok(Story::of(id, accepted, attempts))
}
