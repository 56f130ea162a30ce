//! Every name the ladder gives a queue or exchange, and the role a queue's name stands for:
//! the one place that knows how the ladder names its queues.

use super::{Ladder, MAX_SHARDS, TierId};
use crate::contract::retention::StreamKind;

/// What a queue of the ladder is for, read from its name: the one place that knows how the
/// ladder names its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueRole {
    /// A first-attempt lane: a shared one (`tenant` is `None`; `shard` is its index when the
    /// shared lane is sharded) or a tenant's own.
    FirstLane {
        tenant: Option<String>,
        shard: Option<u16>,
    },
    /// A retry lane, which the tiers promote into.
    RetryLane {
        tenant: Option<String>,
        shard: Option<u16>,
    },
    /// A delay tier or a deferral queue (they differ only in what the worker sends there).
    Tier(TierId),
    /// The parking queue of a held tier.
    Parked(TierId),
    /// The parking queue of a paused subscription.
    Paused { subscription: String },
    /// The dead-letter sink.
    Dead,
    /// One of the ladder's streams: the archive of accepted events or the attempt log.
    Stream(StreamKind),
}

impl QueueRole {
    /// The role as metrics and `hookrelay status` label it: `lane`, `tier`, `parked`,
    /// `paused`, `dead`.
    pub fn label(&self) -> &'static str {
        match self {
            QueueRole::FirstLane { .. } | QueueRole::RetryLane { .. } => "lane",
            QueueRole::Tier(_) => "tier",
            QueueRole::Parked(_) => "parked",
            QueueRole::Paused { .. } => "paused",
            QueueRole::Dead => "dead",
            QueueRole::Stream(_) => "stream",
        }
    }
}
impl Ladder {
    /// Tenants whose dedicated lanes exist on the broker (`queues`, by name) but are no longer
    /// in the ladder.
    pub fn retired_tenants<'a>(&self, queues: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        let mut retired: Vec<String> = queues
            .into_iter()
            .filter_map(|q| match self.role_of(q) {
                Some(QueueRole::FirstLane {
                    tenant: Some(tenant),
                    ..
                }) => Some(tenant),
                _ => None,
            })
            .filter(|t| !self.dedicated.iter().any(|d| d.tenant == *t))
            .collect();
        retired.sort();
        retired.dedup();
        retired
    }

    /// `name` without this ladder's `<prefix>.`, or as it is when it has none.
    pub fn local_name<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(name)
    }

    /// Whether `name` is under this ladder's prefix (`<prefix>.`), named by it or not.
    pub fn names(&self, name: &str) -> bool {
        name.strip_prefix(&self.prefix)
            .is_some_and(|rest| rest.starts_with('.'))
    }

    /// Whether `queue` is the parking queue of a held tier (this ladder's tiers or an old
    /// one's) or of a paused subscription: operational, never drift.
    pub fn is_parking(&self, queue: &str) -> bool {
        queue.starts_with(&self.name("held.")) || queue.starts_with(&self.name("paused."))
    }

    /// What the queue named `queue` is for in this ladder, or `None` when the ladder gives no
    /// queue that name (another ladder's, an old tier, or a name found in a message).
    pub fn role_of(&self, queue: &str) -> Option<QueueRole> {
        let local = queue.strip_prefix(&self.prefix)?.strip_prefix('.')?;
        // "" is the unsharded shared lane, "-s<i>" a shard of it, ".<tenant>" a tenant's own.
        let tenant_lane = |rest: &str| -> Option<(Option<String>, Option<u16>)> {
            if rest.is_empty() {
                return Some((None, None));
            }
            if let Some(index) = rest.strip_prefix("-s") {
                return parse_shard(index).map(|i| (None, Some(i)));
            }
            let tenant = rest.strip_prefix('.')?;
            crate::contract::envelope::check_tenant(tenant).ok()?;
            Some((Some(tenant.to_owned()), None))
        };
        if local == "dead" {
            return Some(QueueRole::Dead);
        }
        for kind in [StreamKind::Archive, StreamKind::Attempts] {
            if local == kind.as_str() {
                return Some(QueueRole::Stream(kind));
            }
        }
        if let Some(rest) = local.strip_prefix("ready.first") {
            return tenant_lane(rest).map(|(tenant, shard)| QueueRole::FirstLane { tenant, shard });
        }
        if let Some(rest) = local.strip_prefix("ready.retry") {
            return tenant_lane(rest).map(|(tenant, shard)| QueueRole::RetryLane { tenant, shard });
        }
        if let Some(subscription) = local.strip_prefix("paused.") {
            return crate::contract::envelope::check_id(subscription)
                .is_ok()
                .then(|| QueueRole::Paused {
                    subscription: subscription.to_owned(),
                });
        }
        let named = |name: &str| self.tier_ids().find(|id| self.tier(*id).name == name);
        if let Some(tier) = local.strip_prefix("held.") {
            return named(tier).map(QueueRole::Parked);
        }
        named(local).map(QueueRole::Tier)
    }

    fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }
    /// Producers publish here with routing key = tenant id.
    pub fn ingress(&self) -> String {
        self.name("ingress")
    }
    pub(crate) fn ingress_unrouted(&self) -> String {
        self.name("ingress.unrouted")
    }
    /// The shared first-attempt lane of an unsharded ladder.
    /// The lane whose consumers are the fleet: the first shared lane (shard 0 when sharded),
    /// which every worker consumes ([`crate::delivery::fleet`]).
    pub fn fleet_lane(&self) -> String {
        self.shared_lanes()
            .first()
            .map(|(first, _, _)| first.clone())
            .unwrap_or_else(|| self.first_lane())
    }

    pub fn first_lane(&self) -> String {
        self.name("ready.first")
    }
    /// The shared retry lane of an unsharded ladder: tiers promote into it.
    pub fn retry_lane(&self) -> String {
        self.name("ready.retry")
    }
    /// Shard `shard` of the shared first-attempt lane. `-s<i>`, not `.s<i>`: a dedicated
    /// tenant may be called `s0`, and its lane is `ready.first.s0`.
    pub fn first_shard(&self, shard: u16) -> String {
        self.name(&format!("ready.first-s{shard}"))
    }
    /// Shard `shard` of the shared retry lane.
    pub fn retry_shard(&self, shard: u16) -> String {
        self.name(&format!("ready.retry-s{shard}"))
    }
    /// The shared lanes as (first-attempt lane, retry lane, shard index): one unsharded pair,
    /// or one pair per shard.
    pub fn shared_lanes(&self) -> Vec<(String, String, Option<u16>)> {
        if self.shards <= 1 {
            return vec![(self.first_lane(), self.retry_lane(), None)];
        }
        (0..self.shards)
            .map(|i| (self.first_shard(i), self.retry_shard(i), Some(i)))
            .collect()
    }
    /// Whether `role` is a lane that exists outside this ladder: a tenant's no longer
    /// dedicated, a shard of another shard count, or the unsharded lane of a sharded ladder.
    /// Workers drain such lanes while they exist; `topology apply` leaves them unbound.
    pub fn is_retired_lane(&self, role: &QueueRole) -> bool {
        let (tenant, shard) = match role {
            QueueRole::FirstLane { tenant, shard } | QueueRole::RetryLane { tenant, shard } => {
                (tenant, shard)
            }
            _ => return false,
        };
        match (tenant, shard) {
            (Some(tenant), _) => !self.dedicated.iter().any(|d| d.tenant == *tenant),
            (None, None) => self.shards > 1,
            (None, Some(i)) => self.shards <= 1 || *i >= self.shards,
        }
    }
    /// Sharded ladders: hashes the routing key (the tenant) onto the first-attempt shards.
    pub fn ingress_shards(&self) -> String {
        self.name("ingress.shards")
    }
    /// Sharded ladders: routes a retry to the retry shard its [`SHARD_HEADER`] names.
    ///
    /// [`SHARD_HEADER`]: crate::contract::headers::SHARD_HEADER
    pub fn promote_shards(&self) -> String {
        self.name("promote.shards")
    }
    /// Sharded ladders: what [`Ladder::promote_shards`] cannot route (no shard header, or a
    /// shard this ladder does not have) goes to retry shard 0, never nowhere.
    pub fn promote_unmatched(&self) -> String {
        self.name("promote.shards.unmatched")
    }
    /// A dedicated tenant's first-attempt lane.
    pub fn first_lane_of(&self, tenant: &str) -> String {
        self.name(&format!("ready.first.{tenant}"))
    }
    /// A dedicated tenant's retry lane.
    pub fn retry_lane_of(&self, tenant: &str) -> String {
        self.name(&format!("ready.retry.{tenant}"))
    }
    /// A paused subscription's deliveries are published here with `paused.<subscription>`. It
    /// also routes `<tier>.<tenant>` into each tier, for tools and for workers of earlier
    /// versions; the worker publishes retries to [`Ladder::tier_exchange`].
    pub fn delay_exchange(&self) -> String {
        self.name("delay")
    }
    /// The exchange of tier `tier` alone (`<prefix>.delay.<tier>`, fanout), which the worker
    /// publishes its retries and deferrals into, with routing key `<tier>.<tenant>`: a fanout
    /// routes without matching a pattern, which on a topic exchange costs the broker about half
    /// again the channel's work for a publish, and the key still travels with the message to
    /// route its promotion.
    pub fn tier_exchange(&self, tier: TierId) -> String {
        self.name(&format!("delay.{}", self.tier(tier).name))
    }
    /// Tiers dead-letter here when a message's TTL runs out.
    pub fn promote_exchange(&self) -> String {
        self.name("promote")
    }
    pub(crate) fn promote_unrouted(&self) -> String {
        self.name("promote.unrouted")
    }
    /// Operational events (`subscription.gone`, `delivery.cancelled`, ...).
    pub fn events_exchange(&self) -> String {
        self.name("events")
    }
    /// The attempt log: one message per settled delivery, routing key `<outcome>.<tenant>`.
    /// The stream `kind` (`<prefix>.archive`, `<prefix>.attempts`).
    pub fn stream(&self, kind: StreamKind) -> String {
        self.name(kind.as_str())
    }
    /// The policy setting `kind`'s retention.
    pub fn retention_policy(&self, kind: StreamKind) -> String {
        self.name(&format!("{}-retention", kind.as_str()))
    }
    pub fn attempts_exchange(&self) -> String {
        self.name("attempts")
    }
    /// Where a held tier's expired messages are parked (`hookrelay tier hold`).
    pub fn held_queue(&self, tier: TierId) -> String {
        self.name(&format!("held.{}", self.tier(tier).name))
    }
    /// Where a paused subscription's deliveries wait, until `hookrelay subscriptions resume`
    /// returns them.
    pub fn paused_queue(&self, subscription: &str) -> String {
        self.name(&format!("paused.{subscription}"))
    }
    /// The routing key a paused subscription's deliveries are published with on the delay
    /// exchange; only its parking queue binds it (tiers bind `retry-...`), so once resume has
    /// unbound it nothing can reach the queue: a late park is returned, never lost.
    pub fn paused_routing_key(&self, subscription: &str) -> String {
        format!("paused.{subscription}")
    }
    /// The routing key on the promote exchange that returns a parked retry to its tenant's
    /// retry lane (a dedicated lane binds `*.<tenant>`, the shared one takes the rest).
    pub fn resumed_retry_key(&self, tenant: &str) -> String {
        format!("paused.{tenant}")
    }
    /// The dead-letter routing key a hold policy gives a tier; only its parking queue is bound
    /// to it on the promote exchange.
    pub fn held_routing_key(&self, tier: TierId) -> String {
        format!("held.{}", self.tier(tier).name)
    }
    /// The name of the policy that holds a tier.
    pub fn hold_policy(&self, tier: TierId) -> String {
        self.name(&format!("hold.{}", self.tier(tier).name))
    }
    /// The name of the policy that gives the queues hookrelay requeues into their delivery
    /// limit (quorum ladders).
    pub fn delivery_limit_policy(&self) -> String {
        self.name("delivery-limit")
    }
    /// The dead-letter sink.
    pub fn dead(&self) -> String {
        self.name("dead")
    }
    pub fn tier_queue(&self, tier: TierId) -> String {
        self.name(&self.tier(tier).name)
    }
    /// Whether `key` is a routing key of tier `tier` (`<tier>.<tenant>`).
    pub fn is_tier_routing_key(&self, tier: TierId, key: &str) -> bool {
        key.strip_prefix(&self.tier(tier).name)
            .is_some_and(|rest| rest.starts_with('.'))
    }

    /// The binding key of tier `tier` on the delay exchange: every tenant's retries into it.
    pub fn retries_into(&self, tier: TierId) -> String {
        format!("{}.*", self.tier(tier).name)
    }

    /// The binding key of a dedicated tenant's retry lane on the promote exchange: its
    /// promotions out of every tier.
    pub fn promotions_of(&self, tenant: &str) -> String {
        format!("*.{tenant}")
    }

    /// The routing key a retry of `tenant` is published with into tier `tier`.
    pub fn tier_routing_key(&self, tier: TierId, tenant: &str) -> String {
        format!("{}.{tenant}", self.tier(tier).name)
    }
}

/// A shard index as queue names write it: decimal, no sign, no leading zero.
fn parse_shard(index: &str) -> Option<u16> {
    if index.is_empty() || (index.len() > 1 && index.starts_with('0')) {
        return None;
    }
    if !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    index.parse().ok().filter(|i| *i < MAX_SHARDS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ladder::tests::DEFAULT_LADDER;

    #[test]
    fn queue_names_have_one_role_each() {
        let ladder = Ladder::parse(DEFAULT_LADDER)
            .unwrap()
            .with_dedicated("bigco", 10)
            .unwrap();
        let shared = |tenant: Option<&str>| tenant.map(str::to_owned);
        assert_eq!(
            ladder.role_of(&ladder.first_lane()),
            Some(QueueRole::FirstLane {
                tenant: None,
                shard: None
            })
        );
        assert_eq!(
            ladder.role_of(&ladder.retry_lane_of("bigco")),
            Some(QueueRole::RetryLane {
                tenant: shared(Some("bigco")),
                shard: None
            })
        );
        assert_eq!(
            ladder.role_of(&ladder.tier_queue(TierId(2))),
            Some(QueueRole::Tier(TierId(2)))
        );
        assert_eq!(
            ladder.role_of(&ladder.held_queue(TierId(3))),
            Some(QueueRole::Parked(TierId(3)))
        );
        assert_eq!(ladder.role_of(&ladder.dead()), Some(QueueRole::Dead));
        assert_eq!(
            ladder.role_of(&ladder.paused_queue("sub_a")),
            Some(QueueRole::Paused {
                subscription: "sub_a".into()
            })
        );
        assert!(ladder.is_parking(&ladder.paused_queue("sub_a")));
        for foreign in [
            "hookrelay.paused.a.b",
            "hookrelay.retry-2m",
            "other.retry-10s",
            "hookrelay",
            "hookrelayx.dead",
            "hookrelay.ready.firstx",
            "hookrelay.ready.first-s",
            "hookrelay.ready.first-s01",
            "hookrelay.ready.first-s64",
            "hookrelay.ready.retry-sx",
            "hookrelay.held.retry-2m",
            "hookrelay.ingress",
        ] {
            assert_eq!(ladder.role_of(foreign), None, "{foreign}");
        }
        for (queue, label) in [
            (ladder.first_lane(), "lane"),
            (ladder.tier_queue(TierId(0)), "tier"),
            (ladder.held_queue(TierId(0)), "parked"),
            (ladder.paused_queue("s"), "paused"),
            (ladder.dead(), "dead"),
        ] {
            assert_eq!(ladder.role_of(&queue).unwrap().label(), label);
        }
    }

    #[test]
    fn shards_name_their_lanes_and_other_counts_are_retired() {
        let one = Ladder::parse(DEFAULT_LADDER).unwrap();
        assert_eq!(one.shards, 1, "the shipped ladder is unsharded");
        assert_eq!(
            one.shared_lanes(),
            vec![(one.first_lane(), one.retry_lane(), None)]
        );
        let four = Ladder::parse(&format!("shards = 4\n{DEFAULT_LADDER}"))
            .unwrap()
            .with_dedicated("s0", 10)
            .unwrap();
        assert_eq!(four.first_shard(3), "hookrelay.ready.first-s3");
        assert_eq!(four.shared_lanes().len(), 4);
        assert_eq!(
            four.role_of("hookrelay.ready.retry-s2"),
            Some(QueueRole::RetryLane {
                tenant: None,
                shard: Some(2)
            })
        );
        // A dedicated tenant called "s0" keeps a lane name of its own.
        assert_eq!(
            four.role_of(&four.first_lane_of("s0")),
            Some(QueueRole::FirstLane {
                tenant: Some("s0".into()),
                shard: None
            })
        );
        let role = |q: &str| four.role_of(q).unwrap();
        assert!(four.is_retired_lane(&role("hookrelay.ready.first")));
        assert!(four.is_retired_lane(&role("hookrelay.ready.retry-s5")));
        assert!(!four.is_retired_lane(&role("hookrelay.ready.retry-s3")));
        assert!(!four.is_retired_lane(&role("hookrelay.ready.first.s0")));
        assert!(four.is_retired_lane(&role("hookrelay.ready.first.gone")));
        assert!(one.is_retired_lane(&role("hookrelay.ready.first-s0")));
        assert!(!one.is_retired_lane(&role("hookrelay.ready.retry")));
        for bad in [0, 65] {
            let err = Ladder::parse(&format!("shards = {bad}\n{DEFAULT_LADDER}")).unwrap_err();
            assert!(err.to_string().contains("shards"), "{err}");
        }
    }
}
