//! Tier hold and release: the incident lever instead of purging.
//!
//! A tier's queue dead-letters expired messages into `<prefix>.promote` with their routing key
//! (`retry-1h.<tenant>`), and the promote exchange routes them to a retry lane. To hold the tier,
//! a policy gives it a `dead-letter-routing-key` of `held.retry-1h` (a policy cannot replace the
//! exchange the queue's arguments name, but it can set the routing key they leave unset), and
//! a parking queue `<prefix>.held.retry-1h` is bound to the promote exchange with exactly that
//! key. Expired messages then wait there, in expiry order, durable and visible, instead of being
//! promoted. Should the policy go missing, promotion simply resumes: nothing is ever dropped.
//!
//! Release moves the parked messages back to the promote exchange with their original routing
//! keys at a chosen rate, then removes the policy, and only once the broker is seen to stop
//! parking the tier unbinds the parking queue and moves what expired meanwhile.

use std::time::Duration;

use lapin::options::{QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use serde::Serialize;
use serde_json::json;

use crate::broker::error::{Refusal, refused};
use crate::broker::management::{Management, ManagementError, Policy, QueueInfo};
use crate::broker::publish::Publisher;
use crate::contract::envelope::check_tenant;
use crate::contract::headers;
use crate::contract::headers::TENANT_HEADER;
use crate::contract::ladder::{Ladder, TierId};
use crate::ops::mover::{MoveError, MoveOptions, MoveReport, Plan, move_messages};
use crate::ops::progress::Progress;

/// How long release waits to see the broker stop parking a tier once its hold is removed: the
/// management API reports a queue's policy from statistics sampled every 5 s by default.
const LIFT_TIMEOUT: Duration = Duration::from_secs(15);

/// Priority of hold policies: above what teams usually give their own catch-all policies, since
/// only one policy applies to a queue.
const HOLD_PRIORITY: i64 = 100;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("{0:?} is not a tier of ladder {1:?}; its tiers (and deferral queues) are {2}")]
    UnknownTier(String, String, String),
    #[error("{0} is not held (its parking queue does not exist)")]
    NotHeld(String),
    #[error("the broker: {0}")]
    Broker(#[from] lapin::Error),
    #[error(transparent)]
    Management(#[from] ManagementError),
    #[error(transparent)]
    Move(#[from] MoveError),
    #[error(
        "{tier} still parks its expired messages: the hold was removed, but {why}. Its parking \
         queue {parking} stays bound, so nothing is lost; fix that, then run `hookrelay tier \
         release` again"
    )]
    StillParks {
        tier: String,
        parking: String,
        why: String,
    },
}

/// Finds a tier by name (`retry-1h`, `hookrelay.retry-1h`) or delay (`1h`).
pub fn find(ladder: &Ladder, name: &str) -> Result<TierId, TierError> {
    ladder.find_tier(name).ok_or_else(|| {
        TierError::UnknownTier(
            name.to_owned(),
            ladder.prefix.clone(),
            ladder
                .tier_ids()
                .map(|id| ladder.tier(id).name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        )
    })
}

fn queue_args(ladder: &Ladder) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(ladder.queue_type.as_str().into()),
    );
    args
}

/// Regex for exactly one queue name.
fn exact_pattern(name: &str) -> String {
    format!("^{}$", crate::broker::topology::regex_literal(name))
}

/// Stops promotion out of `tier`: its expired messages park in `<prefix>.held.<tier>`.
pub async fn hold(
    api: &Management,
    channel: &Channel,
    ladder: &Ladder,
    tier: TierId,
) -> Result<(), TierError> {
    let parking = ladder.held_queue(tier);
    channel
        .queue_declare(
            parking.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            queue_args(ladder),
        )
        .await?;
    channel
        .queue_bind(
            parking.as_str().into(),
            ladder.promote_exchange().as_str().into(),
            ladder.held_routing_key(tier).as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    api.put_policy(
        &ladder.hold_policy(tier),
        &Policy {
            pattern: exact_pattern(&ladder.tier_queue(tier)),
            apply_to: "queues".to_owned(),
            priority: HOLD_PRIORITY,
            definition: [(
                "dead-letter-routing-key".to_owned(),
                json!(ladder.held_routing_key(tier)),
            )]
            .into_iter()
            .collect(),
        },
    )
    .await?;
    Ok(())
}

/// What a release did: the main pass, and the stragglers that expired while it ran.
#[derive(Debug, Clone, Default)]
pub struct Released {
    pub first_pass: MoveReport,
    pub stragglers: MoveReport,
}

/// The routing key a parked message was promoted with before the hold: the broker records it in
/// `x-death`; hookrelay's tenant header rebuilds it otherwise.
fn original_key(ladder: &Ladder, tier: TierId, properties: &BasicProperties) -> String {
    // Both come from the message: only a tier key of a tenant id is a routing key to reuse.
    let recorded = headers::last_death(properties)
        .and_then(|death| death.routing_keys.into_iter().next())
        .filter(|k| {
            ladder.is_tier_routing_key(tier, k)
                && k.split_once('.')
                    .is_some_and(|(_, t)| check_tenant(t).is_ok())
        });
    recorded.unwrap_or_else(|| {
        let tenant = headers::read_str_header(properties, TENANT_HEADER)
            .filter(|t| check_tenant(t).is_ok())
            .unwrap_or_else(|| "unknown".into());
        ladder.tier_routing_key(tier, &tenant)
    })
}

/// Returns the parked messages of `tier` to the retry lanes at `options.rate`, then lifts the
/// hold and moves what expired in the meantime.
pub async fn release(
    api: &Management,
    channel: &Channel,
    publisher: &Publisher,
    ladder: &Ladder,
    tier: TierId,
    options: &MoveOptions,
    show_progress: bool,
) -> Result<Released, TierError> {
    let parking = ladder.held_queue(tier);
    let parked = match crate::ops::mover::depth(channel, &parking).await {
        Ok(n) => n,
        Err(e) if refused(&e) == Some(Refusal::NotFound) => {
            return Err(TierError::NotHeld(ladder.tier_queue(tier)));
        }
        Err(e) => return Err(e.into()),
    };
    let promote = ladder.promote_exchange();
    let plan = |props: &BasicProperties, _: &[u8]| Plan::Move {
        exchange: promote.clone(),
        routing_key: original_key(ladder, tier, props),
        properties: props.clone(),
    };
    let progress = show_progress.then(|| Progress::new(parked.into(), "moved"));
    // While the hold stays, newer expiries queue behind the parked ones: order is kept.
    let first_pass = move_messages(
        channel,
        publisher,
        &parking,
        options,
        progress.as_ref(),
        plan,
    )
    .await?;
    api.delete_policy(&ladder.hold_policy(tier)).await?;
    // Policy changes reach queues asynchronously (and the management API sees them some seconds
    // later). Unbinding while the tier still parks would send its expiries past the parking
    // queue, so the unbind waits until the broker is seen to stop parking, or does not happen.
    if !wait_applied(api, ladder, tier, false, LIFT_TIMEOUT).await? {
        let why = match api
            .queue(&ladder.tier_queue(tier))
            .await?
            .and_then(|q| q.policy)
        {
            Some(policy) if policy != ladder.hold_policy(tier) => format!(
                "policy {policy}, which the broker applies to it, sets its \
                 dead-letter-routing-key to {}",
                ladder.held_routing_key(tier)
            ),
            _ => format!(
                "the broker was not seen to apply the change within {}",
                crate::units::fmt_duration(LIFT_TIMEOUT)
            ),
        };
        return Err(TierError::StillParks {
            tier: ladder.tier_queue(tier),
            parking,
            why,
        });
    }
    channel
        .queue_unbind(
            parking.as_str().into(),
            promote.as_str().into(),
            ladder.held_routing_key(tier).as_str().into(),
            FieldTable::default(),
        )
        .await?;
    // Anything that expired between the pass and the policy's removal.
    let stragglers = move_messages(
        channel,
        publisher,
        &parking,
        &MoveOptions {
            limit: None,
            dry_run: false,
            rate: options.rate,
        },
        None,
        plan,
    )
    .await?;
    // Quorum queues refuse `if-empty` deletes; nothing can reach the queue any more, so an
    // empty one is removed and a non-empty one (a message published by hand) is left for status
    // to show.
    if crate::ops::mover::depth(channel, &parking).await? == 0 {
        channel
            .queue_delete(parking.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    Ok(Released {
        first_pass,
        stragglers,
    })
}

/// One tier as `tier status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TierState {
    pub tier: String,
    pub delay: String,
    pub waiting: Option<i64>,
    pub held: bool,
    pub parked: Option<i64>,
}

/// Whether each tier is held, and how many messages wait in it and in its parking queue.
pub async fn status(api: &Management, ladder: &Ladder) -> Result<Vec<TierState>, TierError> {
    let mut out = Vec::new();
    for i in ladder.tier_ids() {
        let tier = ladder.tier(i);
        let policy = api.policy(&ladder.hold_policy(i)).await?;
        let waiting = api
            .queue(&ladder.tier_queue(i))
            .await?
            .and_then(|q| q.messages);
        let parked = api
            .queue(&ladder.held_queue(i))
            .await?
            .map(|q| q.messages.unwrap_or(0));
        out.push(TierState {
            tier: tier.name.clone(),
            delay: crate::units::fmt_duration(tier.delay),
            waiting,
            held: policy.is_some(),
            parked,
        });
    }
    Ok(out)
}

/// Whether the broker parks the tier's expiries, by the queue's effective policy: the hold
/// applies, or whatever policy applies sets the hold's dead-letter routing key.
fn parks(ladder: &Ladder, tier: TierId, queue: &QueueInfo) -> bool {
    let key = ladder.held_routing_key(tier);
    queue.policy.as_deref() == Some(ladder.hold_policy(tier).as_str())
        || queue
            .effective_policy_definition
            .get("dead-letter-routing-key")
            .and_then(|v| v.as_str())
            == Some(key.as_str())
}

/// Waits until the broker parks the tier's expiries (`held`) or no longer does, as its queue's
/// effective policy shows (policy changes reach queues asynchronously), at most `timeout`.
pub async fn wait_applied(
    api: &Management,
    ladder: &Ladder,
    tier: TierId,
    held: bool,
    timeout: Duration,
) -> Result<bool, TierError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let q = api.queue(&ladder.tier_queue(tier)).await?;
        let applied = q.is_some_and(|q| parks(ladder, tier, &q));
        if applied == held {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_parks_by_its_effective_policy_whatever_its_name() {
        let ladder = Ladder::build(
            "hr",
            crate::contract::ladder::QueueType::Quorum,
            &["1s"],
            &["1s"],
        )
        .unwrap();
        let tier = ladder.tier_at(0).unwrap();
        let queue = |policy: Option<&str>, key: Option<&str>| QueueInfo {
            policy: policy.map(str::to_owned),
            effective_policy_definition: key
                .map(|k| {
                    [("dead-letter-routing-key".to_owned(), json!(k))]
                        .into_iter()
                        .collect()
                })
                .unwrap_or_default(),
            ..QueueInfo::default()
        };
        assert!(parks(&ladder, tier, &queue(Some("hr.hold.retry-1s"), None)));
        assert!(parks(
            &ladder,
            tier,
            &queue(Some("ops"), Some("held.retry-1s"))
        ));
        assert!(!parks(&ladder, tier, &queue(Some("ops"), Some("other"))));
        assert!(!parks(&ladder, tier, &queue(None, None)));
    }

    #[test]
    fn hold_policies_match_exactly_one_queue() {
        assert_eq!(
            exact_pattern("hookrelay.retry-1h"),
            "^hookrelay\\.retry-1h$"
        );
    }
}
