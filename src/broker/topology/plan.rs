//! The broker objects a ladder stands for: exchanges, queues, bindings and policies.

use std::collections::BTreeMap;

use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::broker::management::Policy;
use crate::contract::headers::SHARD_HEADER;
use crate::contract::ladder::{Ladder, QueueRole, QueueType};
use crate::contract::retention::StreamKind;

use super::objects::declare_error;
use super::*;

impl Ladder {
    /// Every broker object the ladder stands for, in declaration order.
    pub fn objects(&self) -> Topology {
        let queue_args = |extra: &[(&str, Arg)]| {
            let mut args = BTreeMap::new();
            args.insert(
                "x-queue-type".to_owned(),
                Arg::Str(self.queue_type.as_str().into()),
            );
            for (k, v) in extra {
                args.insert((*k).to_owned(), v.clone());
            }
            args
        };
        let at_least_once: Vec<(&str, Arg)> = match self.queue_type {
            QueueType::Quorum => vec![
                ("x-dead-letter-strategy", Arg::Str("at-least-once".into())),
                ("x-overflow", Arg::Str("reject-publish".into())),
            ],
            QueueType::Classic => vec![],
        };
        // Lanes dead-letter to the sink, so a message that expires there (a producer-set
        // `expiration`) is kept with the broker's reason instead of being dropped.
        let mut lane_extra = vec![
            ("x-dead-letter-exchange", Arg::Str(String::new())),
            ("x-dead-letter-routing-key", Arg::Str(self.dead())),
        ];
        lane_extra.extend(at_least_once.iter().cloned());

        let exchanges = vec![
            Exchange::new(&self.ingress_unrouted(), "fanout"),
            Exchange::new(&self.ingress(), "direct")
                .arg("alternate-exchange", Arg::Str(self.ingress_unrouted())),
            Exchange::new(&self.delay_exchange(), "topic"),
            Exchange::new(&self.promote_unrouted(), "fanout"),
            Exchange::new(&self.promote_exchange(), "topic")
                .arg("alternate-exchange", Arg::Str(self.promote_unrouted())),
            Exchange::new(&self.events_exchange(), "topic"),
            Exchange::new(&self.attempts_exchange(), "topic"),
        ];

        let mut exchanges = exchanges;
        let mut queues = Vec::new();
        let mut bindings = Vec::new();
        for (first, retry, _) in self.shared_lanes() {
            for lane in [first, retry] {
                queues.push(Queue {
                    name: lane,
                    arguments: queue_args(&lane_extra),
                });
            }
        }
        if self.shards <= 1 {
            bindings.push(Binding::to_queue(
                &self.ingress_unrouted(),
                &self.first_lane(),
                "",
            ));
            bindings.push(Binding::to_queue(
                &self.promote_unrouted(),
                &self.retry_lane(),
                "",
            ));
        } else {
            // First attempts: the plugin hashes the routing key (the tenant) onto the shards,
            // each bound with weight 1. Retries: the tiers dead-letter with routing key
            // `<tier>.<tenant>`, which hashes differently per tier, and the plugin hashes a
            // header as a typed value, never as the same bucket as the routing key (checked on
            // 3.10), so retries carry the index of their shard instead and a headers exchange
            // routes by it; what names no shard here goes to shard 0 through the alternate.
            exchanges.push(Exchange::new(&self.ingress_shards(), CONSISTENT_HASH));
            exchanges.push(Exchange::new(&self.promote_unmatched(), "fanout"));
            exchanges.push(
                Exchange::new(&self.promote_shards(), "headers")
                    .arg("alternate-exchange", Arg::Str(self.promote_unmatched())),
            );
            bindings.push(Binding::to_exchange(
                &self.ingress_unrouted(),
                &self.ingress_shards(),
            ));
            bindings.push(Binding::to_exchange(
                &self.promote_unrouted(),
                &self.promote_shards(),
            ));
            for i in 0..self.shards {
                bindings.push(Binding::to_queue(
                    &self.ingress_shards(),
                    &self.first_shard(i),
                    "1",
                ));
                // The routing key is ignored by a headers exchange; it names the shard, so
                // `topology plan` tells the bindings apart by it.
                let mut shard = Binding::to_queue(
                    &self.promote_shards(),
                    &self.retry_shard(i),
                    &format!("s{i}"),
                );
                shard
                    .arguments
                    .insert("x-match".into(), Arg::Str("all".into()));
                shard
                    .arguments
                    .insert(SHARD_HEADER.into(), Arg::Str(i.to_string()));
                bindings.push(shard);
            }
            bindings.push(Binding::to_queue(
                &self.promote_unmatched(),
                &self.retry_shard(0),
                "",
            ));
        }
        // A dedicated tenant's events bind straight to its lane (the alternate exchange only
        // sees what no binding takes), and its retries come back to its own retry lane.
        for d in &self.dedicated {
            for (lane, source, key) in [
                (
                    self.first_lane_of(&d.tenant),
                    self.ingress(),
                    d.tenant.clone(),
                ),
                (
                    self.retry_lane_of(&d.tenant),
                    self.promote_exchange(),
                    self.promotions_of(&d.tenant),
                ),
            ] {
                queues.push(Queue {
                    name: lane.clone(),
                    arguments: queue_args(&lane_extra),
                });
                bindings.push(Binding::to_queue(&source, &lane, &key));
            }
        }
        for i in self.tier_ids() {
            let tier = self.tier(i);
            let ttl = i64::try_from(tier.delay.as_millis()).unwrap_or(i64::MAX);
            let mut extra = vec![
                ("x-message-ttl", Arg::Int(ttl)),
                ("x-dead-letter-exchange", Arg::Str(self.promote_exchange())),
            ];
            extra.extend(at_least_once.iter().cloned());
            queues.push(Queue {
                name: self.tier_queue(i),
                arguments: queue_args(&extra),
            });
            exchanges.push(Exchange::new(&self.tier_exchange(i), "fanout"));
            bindings.push(Binding::to_queue(
                &self.tier_exchange(i),
                &self.tier_queue(i),
                "",
            ));
            bindings.push(Binding::to_queue(
                &self.delay_exchange(),
                &self.tier_queue(i),
                &self.retries_into(i),
            ));
        }
        queues.push(Queue {
            name: self.dead(),
            arguments: queue_args(&[]),
        });
        // The streams. The archive takes every event the ingress accepts, by the broker's own
        // routing, so the producer's confirm covers its copy: it is bound where the shared
        // lanes take their events (the ingress alternate, a fanout) and beside each dedicated
        // tenant's binding, so nothing is added in front of the alternate exchange and the
        // ingress keeps its type. The attempt log takes every record. Retention is a policy,
        // not arguments, so that changing it reaches an existing stream.
        for (kind, _) in self.streams() {
            let stream = self.stream(kind);
            queues.push(Queue {
                name: stream.clone(),
                arguments: BTreeMap::from([("x-queue-type".to_owned(), Arg::Str("stream".into()))]),
            });
            match kind {
                StreamKind::Archive => {
                    bindings.push(Binding::to_queue(&self.ingress_unrouted(), &stream, ""));
                    for d in &self.dedicated {
                        bindings.push(Binding::to_queue(&self.ingress(), &stream, &d.tenant));
                    }
                }
                StreamKind::Attempts => {
                    bindings.push(Binding::to_queue(&self.attempts_exchange(), &stream, "#"));
                }
            }
        }
        // A policy, not an `x-delivery-limit` argument: the broker refuses (406) to declare an
        // existing queue with an argument it was not created with, and every ladder applied
        // before has its queues already; a policy reaches existing queues in place. Classic
        // queues have no delivery limit.
        let policies = match self.queue_type {
            QueueType::Quorum => {
                let covers: Vec<String> = queues
                    .iter()
                    .map(|q| q.name.clone())
                    .filter(|n| {
                        matches!(
                            self.role_of(n),
                            Some(QueueRole::FirstLane { .. } | QueueRole::RetryLane { .. })
                        )
                    })
                    .chain([self.dead()])
                    .collect();
                let mut definition = serde_json::Map::new();
                definition.insert("delivery-limit".to_owned(), DELIVERY_LIMIT.into());
                // Shards spread their leaders over the cluster: the broker places a queue it
                // creates under this policy on the node leading the fewest queues (3.10 has
                // `balanced` as a queue argument and as this policy key; checked live). A policy
                // and not the argument, for the reason above: shard lanes already declared keep
                // their arguments. It places only queues created after it is set (so apply sets
                // policies first); existing leaders stay where they are until an operator runs
                // `rabbitmq-queues rebalance quorum`. One shard keeps the unsharded layout.
                if self.shards > 1 {
                    definition.insert("queue-leader-locator".to_owned(), LEADER_LOCATOR.into());
                }
                vec![NamedPolicy {
                    name: self.delivery_limit_policy(),
                    policy: Policy {
                        pattern: format!(
                            "^{}\\.(ready\\..+|dead|held\\..+|paused\\..+)$",
                            regex_literal(&self.prefix)
                        ),
                        apply_to: "queues".to_owned(),
                        priority: DELIVERY_LIMIT_PRIORITY,
                        definition,
                    },
                    covers,
                }]
            }
            QueueType::Classic => Vec::new(),
        };
        let mut policies = policies;
        for (kind, retention) in self.streams() {
            let mut definition = serde_json::Map::new();
            definition.insert("max-age".to_owned(), retention.max_age_arg().into());
            definition.insert("max-length-bytes".to_owned(), retention.max_bytes.into());
            definition.insert(
                "stream-max-segment-size-bytes".to_owned(),
                retention.segment_bytes().into(),
            );
            policies.push(NamedPolicy {
                name: self.retention_policy(kind),
                policy: Policy {
                    pattern: format!("^{}$", regex_literal(&self.stream(kind))),
                    apply_to: "queues".to_owned(),
                    priority: DELIVERY_LIMIT_PRIORITY,
                    definition,
                },
                covers: vec![self.stream(kind)],
            });
        }
        Topology {
            exchanges,
            queues,
            bindings,
            policies,
        }
    }
}

impl Ladder {
    /// Declares the parking queue of paused subscription `subscription` and binds it to the
    /// delay exchange with its key: durable, of the ladder's queue type, covered by the
    /// delivery-limit policy as the tiers' parking queues are (resume returns what it cannot
    /// move yet). Idempotent. It is not part of [`Ladder::objects`]: it exists while something
    /// is parked, and drift ignores it.
    pub async fn declare_paused_queue(
        &self,
        channel: &lapin::Channel,
        subscription: &str,
    ) -> Result<(), TopologyError> {
        let name = self.paused_queue(subscription);
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(self.queue_type.as_str().into()),
        );
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args,
            )
            .await
            .map_err(|e| declare_error(format!("queue {name}"), e))?;
        let key = self.paused_routing_key(subscription);
        channel
            .queue_bind(
                name.as_str().into(),
                self.delay_exchange().as_str().into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                declare_error(
                    format!("binding {} -> {name} ({key:?})", self.delay_exchange()),
                    e,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_LADDER: &str = include_str!("../../../topology/ladder.toml");

    #[test]
    fn tiers_never_dead_letter_into_a_tier() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        let topo = ladder.objects();
        let tier_queues: Vec<String> = ladder.tier_ids().map(|i| ladder.tier_queue(i)).collect();
        for q in &topo.queues {
            if let Some(Arg::Str(dlx)) = q.arguments.get("x-dead-letter-exchange") {
                // Whatever a queue dead-letters into, no binding of that exchange (or the
                // alternate behind it) leads back to a tier.
                let mut reachable = vec![dlx.clone()];
                if let Some(x) = topo.exchanges.iter().find(|x| &x.name == dlx)
                    && let Some(Arg::Str(ae)) = x.arguments.get("alternate-exchange")
                {
                    reachable.push(ae.clone());
                }
                for b in &topo.bindings {
                    if reachable.contains(&b.source) {
                        assert!(
                            !tier_queues.contains(&b.destination),
                            "{} -> {}",
                            q.name,
                            b.destination
                        );
                    }
                }
            }
        }
        let tier = topo
            .queues
            .iter()
            .find(|q| q.name == "hookrelay.retry-10s")
            .unwrap();
        assert_eq!(tier.arguments["x-message-ttl"], Arg::Int(10_000));
        assert_eq!(
            tier.arguments["x-dead-letter-strategy"],
            Arg::Str("at-least-once".into())
        );
        assert_eq!(
            tier.arguments["x-overflow"],
            Arg::Str("reject-publish".into())
        );
        // Deferral queues are declared and routed exactly as tiers are.
        let defer = topo
            .queues
            .iter()
            .find(|q| q.name == "hookrelay.defer-250ms")
            .unwrap();
        assert_eq!(defer.arguments["x-message-ttl"], Arg::Int(250));
        assert_eq!(
            defer.arguments["x-dead-letter-exchange"],
            Arg::Str("hookrelay.promote".into())
        );
        assert!(topo.bindings.iter().any(|b| b.source == "hookrelay.delay"
            && b.destination == "hookrelay.defer-5s"
            && b.routing_key == "defer-5s.*"));
        assert_eq!(tier_queues.len(), 9, "5 tiers and 4 deferral queues");
    }

    #[test]
    fn quorum_ladders_limit_deliveries_on_the_queues_they_requeue_into_and_plan_checks_it() {
        use crate::broker::drift::{BrokerObjects, BrokerQueue, Drift};
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        let topo = ladder.objects();
        let [limit, archive, attempts] = topo.policies.as_slice() else {
            panic!("three policies: {:?}", topo.policies)
        };
        assert_eq!(archive.name, "hookrelay.archive-retention");
        assert_eq!(archive.covers, ["hookrelay.archive"]);
        assert_eq!(archive.policy.definition["max-age"], "7D");
        assert_eq!(attempts.covers, ["hookrelay.attempts"]);
        assert_eq!(limit.name, "hookrelay.delivery-limit");
        assert_eq!(
            limit.policy.definition["delivery-limit"],
            serde_json::json!(DELIVERY_LIMIT)
        );
        assert_eq!(
            limit.covers,
            [
                "hookrelay.ready.first",
                "hookrelay.ready.retry",
                "hookrelay.dead"
            ]
        );
        let classic = Ladder::build("c", QueueType::Classic, &["1s"], &["1s"])
            .unwrap()
            .with_stream(StreamKind::Archive, None)
            .with_stream(StreamKind::Attempts, None);
        assert!(
            classic.objects().policies.is_empty(),
            "classic queues have no limit"
        );

        // Missing, then replaced on a lane by a policy of higher priority.
        let mut broker = BrokerObjects::default();
        assert!(
            topo.diff(&broker)
                .contains(&Drift::Missing("policy hookrelay.delivery-limit".into()))
        );
        broker
            .policies
            .insert(limit.name.clone(), limit.policy.clone());
        broker.queues.insert(
            "hookrelay.ready.first".into(),
            BrokerQueue {
                durable: true,
                arguments: Default::default(),
                policy: Some("team-wide".into()),
            },
        );
        let drift: Vec<String> = topo.diff(&broker).iter().map(ToString::to_string).collect();
        assert!(
            drift.contains(
                &"differs: queue hookrelay.ready.first: policy is team-wide on the broker, the \
                  ladder says hookrelay.delivery-limit"
                    .to_owned()
            ),
            "{drift:#?}"
        );
    }

    #[test]
    fn exported_definitions_match_the_copy_in_rabbitmq() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        let exported = ladder.objects().export("/");
        let shipped: serde_json::Value =
            serde_json::from_str(include_str!("../../../rabbitmq/definitions.json")).unwrap();
        assert_eq!(
            exported, shipped,
            "rabbitmq/definitions.json is stale: run `hookrelay topology export > rabbitmq/definitions.json`"
        );
    }

    #[test]
    fn a_sharded_ladder_hashes_first_attempts_and_routes_retries_by_their_shard() {
        use crate::broker::drift::{BrokerBinding, BrokerObjects};
        let one = Ladder::parse(DEFAULT_LADDER).unwrap();
        let four = one.clone().with_shards(4).unwrap();
        let topo = four.objects();
        let kind = |name: &str| {
            topo.exchanges
                .iter()
                .find(|x| x.name == name)
                .map(|x| (x.kind, x.arguments.get("alternate-exchange").cloned()))
        };
        assert_eq!(
            kind("hookrelay.ingress.shards"),
            Some((CONSISTENT_HASH, None))
        );
        assert_eq!(
            kind("hookrelay.promote.shards"),
            Some((
                "headers",
                Some(Arg::Str("hookrelay.promote.shards.unmatched".into()))
            ))
        );
        let lanes: Vec<&str> = topo
            .queues
            .iter()
            .map(|q| q.name.as_str())
            .filter(|n| n.contains(".ready."))
            .collect();
        assert_eq!(lanes.len(), 8);
        assert!(!lanes.contains(&"hookrelay.ready.first"), "{lanes:?}");
        assert_eq!(topo.policies[0].covers.len(), 9, "8 shards and the sink");
        // Shards spread their leaders; one shard keeps the unsharded policy as it was.
        assert_eq!(
            topo.policies[0].policy.definition["queue-leader-locator"],
            LEADER_LOCATOR
        );
        assert!(
            !one.objects().policies[0]
                .policy
                .definition
                .contains_key("queue-leader-locator")
        );
        let shard3 = topo
            .bindings
            .iter()
            .find(|b| b.destination == "hookrelay.ready.retry-s3")
            .unwrap();
        assert_eq!(shard3.arguments[SHARD_HEADER], Arg::Str("3".into()));
        let exported = topo.export("/");
        let e2e: Vec<_> = exported["bindings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["destination_type"] == "exchange")
            .map(|b| b["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            e2e,
            ["hookrelay.ingress.shards", "hookrelay.promote.shards"]
        );

        // On a broker that has the unsharded ladder's bindings, the sharded ladder's apply
        // unbinds the unsharded lanes; the other way round, the shard exchanges and shards.
        let broker_of = |topo: &Topology| BrokerObjects {
            bindings: topo
                .bindings
                .iter()
                .map(|b| BrokerBinding {
                    source: b.source.clone(),
                    destination: b.destination.clone(),
                    to_exchange: b.to_exchange,
                    routing_key: b.routing_key.clone(),
                    arguments: b
                        .arguments
                        .iter()
                        .map(|(k, v)| (k.clone(), v.to_json()))
                        .collect(),
                })
                .collect(),
            ..BrokerObjects::default()
        };
        let stale: Vec<String> = topo
            .stale_bindings(&four, &broker_of(&one.objects()))
            .iter()
            .map(|b| b.destination.clone())
            .collect();
        assert_eq!(stale, ["hookrelay.ready.first", "hookrelay.ready.retry"]);
        let back = one.objects().stale_bindings(&one, &broker_of(&topo));
        assert_eq!(back.len(), 2 + 4 + 4 + 1, "{back:#?}");
        assert!(
            back.iter()
                .any(|b| b.to_exchange && b.destination == "hookrelay.ingress.shards")
        );
        let two = one.clone().with_shards(2).unwrap();
        let shrunk: Vec<String> = two
            .objects()
            .stale_bindings(&two, &broker_of(&topo))
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(shrunk.len(), 4, "{shrunk:#?}");
        assert!(topo.stale_bindings(&four, &broker_of(&topo)).is_empty());
    }
}
