//! `hookrelay status`: the whole ladder at a glance, from the management API. Every lane (the
//! shared ones, each dedicated tenant's, and those of tenants no longer dedicated), tier and the
//! dead sink with what waits, what is in flight, who consumes, the rates in and out,
//! the oldest message's age where the broker knows it, and where each queue's messages go next.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::broker::management::{Management, ManagementError, QueueInfo};
use crate::contract::ladder::{Ladder, QueueRole};
use crate::contract::retention::StreamKind;
use crate::units::fmt_duration;

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Management(#[from] ManagementError),
    #[error(
        "none of ladder {prefix:?}'s queues exist on vhost {vhost:?}; declare them with \
         `hookrelay topology apply` (or point --ladder / HOOKRELAY_AMQP_URL at the right ones)"
    )]
    Missing { prefix: String, vhost: String },
}

/// One queue of the ladder.
#[derive(Debug, Clone, Serialize)]
pub struct QueueStatus {
    pub queue: String,
    /// `lane`, `tier`, `parked`, `dead`.
    pub role: &'static str,
    pub exists: bool,
    pub ready: i64,
    pub unacked: i64,
    pub consumers: i64,
    /// Messages per second published into the queue (dead-lettered into it, for lanes fed by
    /// tiers, counts here too).
    pub in_per_s: f64,
    /// Messages per second leaving: acknowledged for lanes; for tiers (whose messages leave by
    /// expiring, which the broker does not count), derived from the depth's change between two
    /// samples, so only known with `--watch`.
    pub out_per_s: Option<f64>,
    /// Age of the oldest message, where the broker knows it (classic queues holding messages
    /// with a timestamp); the worker's `hookrelay_oldest_ready_age_seconds` covers the rest.
    pub oldest_age_s: Option<f64>,
    pub ttl: Option<String>,
    /// Where the queue's messages go next, in words.
    pub next: String,
    pub held: bool,
    /// The shard of the ladder's shared lanes this queue is (sharded ladders only).
    pub shard: Option<u16>,
    /// The node leading the queue (quorum queues, from the management API).
    pub leader: Option<String>,
}

/// Reads the ladder's queues. `previous` (an earlier sample and its time) lets tier out-rates
/// be derived.
pub async fn collect(
    api: &Management,
    ladder: &Ladder,
    previous: Option<&(Instant, Vec<QueueStatus>)>,
) -> Result<Vec<QueueStatus>, StatusError> {
    let listed = api.queues().await?;
    let by_name: HashMap<&str, &QueueInfo> = listed.iter().map(|q| (q.name.as_str(), q)).collect();
    let mut names: Vec<(String, QueueRole)> = Vec::new();
    for (first, retry, shard) in ladder.shared_lanes() {
        names.push((
            first,
            QueueRole::FirstLane {
                tenant: None,
                shard,
            },
        ));
        names.push((
            retry,
            QueueRole::RetryLane {
                tenant: None,
                shard,
            },
        ));
    }
    for d in &ladder.dedicated {
        let tenant = Some(d.tenant.clone());
        names.push((
            ladder.first_lane_of(&d.tenant),
            QueueRole::FirstLane {
                tenant: tenant.clone(),
                shard: None,
            },
        ));
        names.push((
            ladder.retry_lane_of(&d.tenant),
            QueueRole::RetryLane {
                tenant,
                shard: None,
            },
        ));
    }
    // Lanes the ladder no longer routes to (tenants no longer dedicated, shards of another
    // shard count), which workers drain until an operator deletes them.
    let mut retired: Vec<(String, QueueRole)> = listed
        .iter()
        .filter_map(|q| {
            let role = ladder.role_of(&q.name)?;
            ladder
                .is_retired_lane(&role)
                .then(|| (q.name.clone(), role))
        })
        .collect();
    retired.sort_by(|a, b| a.0.cmp(&b.0));
    names.extend(retired);
    for i in ladder.tier_ids() {
        names.push((ladder.tier_queue(i), QueueRole::Tier(i)));
        if by_name.contains_key(ladder.held_queue(i).as_str()) {
            names.push((ladder.held_queue(i), QueueRole::Parked(i)));
        }
    }
    let mut paused: Vec<(String, QueueRole)> = listed
        .iter()
        .filter_map(|q| match ladder.role_of(&q.name)? {
            role @ QueueRole::Paused { .. } => Some((q.name.clone(), role)),
            _ => None,
        })
        .collect();
    paused.sort_by(|a, b| a.0.cmp(&b.0));
    names.extend(paused);
    names.push((ladder.dead(), QueueRole::Dead));
    for (kind, _) in ladder.streams() {
        names.push((ladder.stream(kind), QueueRole::Stream(kind)));
    }
    if names.iter().all(|(n, _)| !by_name.contains_key(n.as_str())) {
        return Err(StatusError::Missing {
            prefix: ladder.prefix.clone(),
            vhost: api.vhost().to_owned(),
        });
    }
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let mut rows = Vec::new();
    for (name, kind) in names {
        let role = kind.label();
        let Some(q) = by_name.get(name.as_str()) else {
            rows.push(QueueStatus {
                queue: name,
                role,
                exists: false,
                ready: 0,
                unacked: 0,
                consumers: 0,
                in_per_s: 0.0,
                out_per_s: None,
                oldest_age_s: None,
                ttl: None,
                next: "MISSING: run `hookrelay topology apply`".into(),
                held: false,
                shard: None,
                leader: None,
            });
            continue;
        };
        // A stream keeps what it is given (consumers read it by offset): its depth is its size.
        let ready = match kind {
            QueueRole::Stream(_) => q.messages.unwrap_or(q.messages_ready),
            _ => q.messages_ready,
        };
        let stats = &q.message_stats;
        let in_per_s = stats.publish_details.rate.unwrap_or(0.0);
        let held = matches!(kind, QueueRole::Tier(_))
            && q.effective_policy_definition
                .contains_key("dead-letter-routing-key");
        let out_per_s = match kind {
            QueueRole::Tier(_) | QueueRole::Parked(_) | QueueRole::Paused { .. } => previous
                .and_then(|(at, rows)| {
                    let before = rows.iter().find(|r| r.queue == name)?;
                    let dt = at.elapsed().as_secs_f64();
                    (dt > 0.5).then(|| (in_per_s - (ready - before.ready) as f64 / dt).max(0.0))
                }),
            _ => stats.ack_details.rate.or(stats.deliver_get_details.rate),
        };
        let ttl = q
            .arguments
            .get("x-message-ttl")
            .and_then(Value::as_u64)
            .map(|ms| fmt_duration(Duration::from_millis(ms)));
        let shard = match &kind {
            QueueRole::FirstLane {
                tenant: None,
                shard,
            }
            | QueueRole::RetryLane {
                tenant: None,
                shard,
            } if ladder.shards > 1 && !ladder.is_retired_lane(&kind) => *shard,
            _ => None,
        };
        let next = match kind {
            QueueRole::FirstLane {
                tenant: Some(_), ..
            }
            | QueueRole::RetryLane {
                tenant: Some(_), ..
            } if ladder.is_retired_lane(&kind) => {
                "workers drain it (tenant no longer dedicated); delete it once empty".to_owned()
            }
            QueueRole::FirstLane { .. } | QueueRole::RetryLane { .. }
                if ladder.is_retired_lane(&kind) =>
            {
                format!(
                    "workers drain it (not a lane of the ladder's {} shard(s)); delete it once empty",
                    ladder.shards
                )
            }
            QueueRole::FirstLane { .. } | QueueRole::RetryLane { .. } => {
                "workers; dead-letters to the sink".to_owned()
            }
            QueueRole::Tier(i) if held => {
                format!("HELD: expired messages park in {}", ladder.held_queue(i))
            }
            QueueRole::Tier(_) => format!(
                "on expiry -> {} -> retry lane",
                q.arguments
                    .get("x-dead-letter-exchange")
                    .and_then(Value::as_str)
                    .unwrap_or("(no dead-letter exchange!)")
            ),
            QueueRole::Parked(_) => "waits for `hookrelay tier release`".to_owned(),
            QueueRole::Paused { subscription } => {
                format!("paused; waits for `hookrelay subscriptions resume {subscription}`")
            }
            QueueRole::Dead => "kept for inspection and `hookrelay redrive`".to_owned(),
            QueueRole::Stream(kind) => {
                let kept = ladder
                    .streams()
                    .into_iter()
                    .find(|(k, _)| *k == kind)
                    .map(|(_, r)| r.describe())
                    .unwrap_or_default();
                match kind {
                    StreamKind::Archive => format!("every accepted event, kept {kept}"),
                    StreamKind::Attempts => format!("every attempt record, kept {kept}"),
                }
            }
        };

        rows.push(QueueStatus {
            queue: name,
            role,
            exists: true,
            ready,
            unacked: q.messages_unacknowledged,
            consumers: q.consumers,
            in_per_s,
            out_per_s,
            oldest_age_s: q.head_message_timestamp.map(|ts| (now - ts).max(0.0)),
            ttl,
            next,
            held,
            shard,
            leader: q.leader.clone(),
        });
    }
    Ok(rows)
}

/// The shards side by side, for a sharded ladder: what waits and is in flight in each pair and
/// which node leads it, so a hot shard (and a node leading too many) stands out. Which tenants
/// make a shard hot the management API cannot tell: it counts a queue's messages, not their
/// routing keys, and reading them would take them off the lane.
fn render_shards(ladder: &Ladder, rows: &[QueueStatus]) -> String {
    if ladder.shards <= 1 {
        return String::new();
    }
    let mut table = vec![
        [
            "SHARD", "FIRST", "RETRY", "UNACKED", "IN/s", "OUT/s", "LEADER",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for i in 0..ladder.shards {
        let pair: Vec<&QueueStatus> = rows.iter().filter(|r| r.shard == Some(i)).collect();
        let ready = |role: &str| -> i64 {
            pair.iter()
                .filter(|r| r.queue.contains(role))
                .map(|r| r.ready)
                .sum()
        };
        let out: Option<f64> = pair.iter().filter_map(|r| r.out_per_s).reduce(|a, b| a + b);
        let mut leaders: Vec<&str> = pair.iter().filter_map(|r| r.leader.as_deref()).collect();
        leaders.dedup();
        table.push(vec![
            format!("s{i}"),
            ready(".ready.first-").to_string(),
            ready(".ready.retry-").to_string(),
            pair.iter().map(|r| r.unacked).sum::<i64>().to_string(),
            format!("{:.1}", pair.iter().map(|r| r.in_per_s).sum::<f64>()),
            opt_rate(out),
            if leaders.is_empty() {
                "-".to_owned()
            } else {
                leaders.join(", ")
            },
        ]);
    }
    let mut out = format!(
        "\nShards ({} first/retry pairs; FIRST and RETRY are ready messages):\n\n",
        ladder.shards
    );
    out.push_str(&align(&table, 1..=5));
    out.push_str(
        "Hottest tenants: not shown. The management API counts each shard's messages, not \
         their tenants (routing keys), and reading them would take them off the lane; \
         `hookrelay attempts tail --tenant` shows a tenant's traffic.\n",
    );
    out
}

/// Columns padded to their widest cell, those in `numeric` right-aligned, the last one left
/// as it is.
fn align(table: &[Vec<String>], numeric: std::ops::RangeInclusive<usize>) -> String {
    let columns = table.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| table.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in table {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else if numeric.contains(&c) {
                line.push_str(&format!("{cell:>w$}  ", w = widths[c]));
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn opt_rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}"))
}

/// The workers consuming the ladder: one consumer each on the fleet's lane, the count every
/// worker divides the endpoint limits by.
fn render_fleet(ladder: &Ladder, rows: &[QueueStatus]) -> String {
    let lane = ladder.fleet_lane();
    match rows.iter().find(|r| r.queue == lane && r.exists) {
        Some(r) => format!(
            "Workers: {} (consumers of {lane}; each takes 1/{} of every endpoint cap and rate)\n\n",
            r.consumers,
            r.consumers.max(1)
        ),
        None => "\n".to_owned(),
    }
}

/// The table `hookrelay status` prints.
pub fn render(ladder: &Ladder, vhost: &str, broker: &str, rows: &[QueueStatus]) -> String {
    let mut out = format!(
        "Ladder {:?} on vhost {vhost:?} ({broker}); rates are per second\n",
        ladder.prefix
    );
    out.push_str(&render_fleet(ladder, rows));
    let header = [
        "QUEUE", "ROLE", "READY", "UNACKED", "CONS", "IN/s", "OUT/s", "OLDEST", "TTL", "NEXT",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for r in rows {
        table.push(vec![
            r.queue.clone(),
            if r.held {
                "tier*".into()
            } else {
                r.role.into()
            },
            r.ready.to_string(),
            r.unacked.to_string(),
            r.consumers.to_string(),
            format!("{:.1}", r.in_per_s),
            opt_rate(r.out_per_s),
            r.oldest_age_s.map_or_else(
                || "-".into(),
                |s| fmt_duration(Duration::from_secs(s as u64)),
            ),
            r.ttl.clone().unwrap_or_else(|| "-".into()),
            r.next.clone(),
        ]);
    }
    out.push_str(&align(&table, 2..=6));
    out.push_str(&render_shards(ladder, rows));
    if rows.iter().any(|r| r.held) {
        out.push_str(
            "\ntier* = held: promotion stopped; `hookrelay tier release <tier>` resumes it\n",
        );
    }
    if rows
        .iter()
        .any(|r| r.role == "tier" && r.out_per_s.is_none())
    {
        out.push_str("Tier OUT/s (expiries) is derived between samples: see it with --watch\n");
    }
    out
}
