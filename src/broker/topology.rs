//! The broker objects a ladder stands for, and what is done with them: `apply` declares them,
//! `retire` unbinds the lanes of tenants no longer dedicated, `export` writes them as RabbitMQ
//! definitions. Comparing them with the broker is [`crate::broker::drift`]'s.
//!
//! Tiers dead-letter into `{p}.promote`, never into a tier, so the broker's cycle rule (a message
//! expiring back into a queue it already expired from is dropped) can never apply.

use std::collections::BTreeMap;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::broker::error::{Refusal, refused};
use crate::broker::management::{Management, ManagementError, Policy};
use crate::contract::ladder::{Ladder, QueueType};

/// The delivery limit of the queues hookrelay requeues into on purpose: a lane (a delivery whose
/// republish failed goes back to it) and the dead sink (a redrive pass returns what it keeps),
/// and a tier's parking queue (release returns what it cannot move yet). RabbitMQ 4 gives a
/// quorum queue a limit of 20 when nothing sets one, after which it dead-letters or drops the
/// message; 3.x has none. `-1` (unlimited) is refused by 3.x, so the largest 32-bit value stands
/// for "no limit" on both.
pub const DELIVERY_LIMIT: i64 = 2_147_483_647;

/// Below hold policies (100), which match tiers only, so the two never compete. A team's own
/// policy of higher priority that matches these queues would replace this one (only one policy
/// applies to a queue); `topology plan` reports it.
const DELIVERY_LIMIT_PRIORITY: i64 = 10;

/// Why declaring the topology failed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "the broker refused {object}: {message}. It probably exists with other arguments; \
         `hookrelay topology plan` shows the difference"
    )]
    Conflict { object: String, message: String },
    #[error("broker error while declaring {object}: {source}")]
    Broker {
        object: String,
        source: lapin::Error,
    },
}

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

        let mut queues = vec![
            Queue {
                name: self.first_lane(),
                arguments: queue_args(&lane_extra),
            },
            Queue {
                name: self.retry_lane(),
                arguments: queue_args(&lane_extra),
            },
        ];
        let mut bindings = vec![
            Binding {
                source: self.ingress_unrouted(),
                queue: self.first_lane(),
                routing_key: String::new(),
            },
            Binding {
                source: self.promote_unrouted(),
                queue: self.retry_lane(),
                routing_key: String::new(),
            },
        ];
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
                bindings.push(Binding {
                    source,
                    queue: lane,
                    routing_key: key,
                });
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
            bindings.push(Binding {
                source: self.delay_exchange(),
                queue: self.tier_queue(i),
                routing_key: self.retries_into(i),
            });
        }
        queues.push(Queue {
            name: self.dead(),
            arguments: queue_args(&[]),
        });
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
                        n.starts_with(&self.first_lane()) || n.starts_with(&self.retry_lane())
                    })
                    .chain([self.dead()])
                    .collect();
                vec![NamedPolicy {
                    name: self.delivery_limit_policy(),
                    policy: Policy {
                        pattern: format!(
                            "^{}\\.(ready\\..+|dead|held\\..+|paused\\..+)$",
                            regex_literal(&self.prefix)
                        ),
                        apply_to: "queues".to_owned(),
                        priority: DELIVERY_LIMIT_PRIORITY,
                        definition: [(
                            "delivery-limit".to_owned(),
                            serde_json::json!(DELIVERY_LIMIT),
                        )]
                        .into_iter()
                        .collect(),
                    },
                    covers,
                }]
            }
            QueueType::Classic => Vec::new(),
        };
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

/// `text` as a regular expression that matches exactly it.
pub(crate) fn regex_literal(text: &str) -> String {
    let mut p = String::with_capacity(text.len());
    for c in text.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            p.push('\\');
        }
        p.push(c);
    }
    p
}

/// An argument value as both AMQP and the management API see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Str(String),
    Int(i64),
}

impl Arg {
    fn to_amqp(&self) -> AMQPValue {
        match self {
            Arg::Str(s) => AMQPValue::LongString(s.as_str().into()),
            Arg::Int(i) => AMQPValue::LongLongInt(*i),
        }
    }
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Arg::Str(s) => serde_json::Value::from(s.as_str()),
            Arg::Int(i) => serde_json::Value::from(*i),
        }
    }
    /// Whether the broker's JSON rendering of an argument is this value.
    pub fn matches_json(&self, value: &serde_json::Value) -> bool {
        match self {
            Arg::Str(s) => value.as_str() == Some(s),
            Arg::Int(i) => value.as_i64() == Some(*i),
        }
    }
}

fn field_table(args: &BTreeMap<String, Arg>) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in args {
        table.insert(k.as_str().into(), v.to_amqp());
    }
    table
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub name: String,
    pub kind: &'static str,
    pub arguments: BTreeMap<String, Arg>,
}

impl Exchange {
    fn new(name: &str, kind: &'static str) -> Self {
        Self {
            name: name.to_owned(),
            kind,
            arguments: BTreeMap::new(),
        }
    }
    fn arg(mut self, key: &str, value: Arg) -> Self {
        self.arguments.insert(key.to_owned(), value);
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub name: String,
    pub arguments: BTreeMap<String, Arg>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub source: String,
    pub queue: String,
    pub routing_key: String,
}

/// A policy the ladder sets, and the ladder's queues it must be the one applying to.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedPolicy {
    pub name: String,
    pub policy: Policy,
    pub covers: Vec<String>,
}

/// The durable objects of one ladder. All exchanges and queues are durable and never auto-deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub exchanges: Vec<Exchange>,
    pub queues: Vec<Queue>,
    pub bindings: Vec<Binding>,
    /// Set through the management API (`apply_policies`), not AMQP.
    pub policies: Vec<NamedPolicy>,
}

/// What `apply` declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub exchanges: usize,
    pub queues: usize,
    pub bindings: usize,
}

impl Topology {
    /// Declares every object. Idempotent: declaring an existing object with the same arguments
    /// is a no-op; with different arguments the broker refuses and nothing is changed.
    pub async fn apply(&self, channel: &lapin::Channel) -> Result<Applied, TopologyError> {
        let durable = |passive| ExchangeDeclareOptions {
            durable: true,
            passive,
            ..ExchangeDeclareOptions::default()
        };
        for x in &self.exchanges {
            let kind = match x.kind {
                "direct" => lapin::ExchangeKind::Direct,
                "fanout" => lapin::ExchangeKind::Fanout,
                "topic" => lapin::ExchangeKind::Topic,
                other => lapin::ExchangeKind::Custom(other.to_owned()),
            };
            channel
                .exchange_declare(
                    x.name.as_str().into(),
                    kind,
                    durable(false),
                    field_table(&x.arguments),
                )
                .await
                .map_err(|e| declare_error(format!("exchange {}", x.name), e))?;
        }
        for q in &self.queues {
            channel
                .queue_declare(
                    q.name.as_str().into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..QueueDeclareOptions::default()
                    },
                    field_table(&q.arguments),
                )
                .await
                .map_err(|e| declare_error(format!("queue {}", q.name), e))?;
        }
        for b in &self.bindings {
            channel
                .queue_bind(
                    b.queue.as_str().into(),
                    b.source.as_str().into(),
                    b.routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    declare_error(
                        format!("binding {} -> {} ({:?})", b.source, b.queue, b.routing_key),
                        e,
                    )
                })?;
        }
        Ok(Applied {
            exchanges: self.exchanges.len(),
            queues: self.queues.len(),
            bindings: self.bindings.len(),
        })
    }

    /// Unbinds the lanes of tenants that no longer have lanes of their own, so their new events
    /// and retries take the shared lanes. Their queues stay, with whatever they hold: workers
    /// keep draining them (see [`Ladder::retired_tenants`]), and nothing is moved or lost.
    pub async fn retire(
        ladder: &Ladder,
        channel: &lapin::Channel,
        tenants: &[String],
    ) -> Result<(), TopologyError> {
        for tenant in tenants {
            for (queue, source, key) in [
                (
                    ladder.first_lane_of(tenant),
                    ladder.ingress(),
                    tenant.clone(),
                ),
                (
                    ladder.retry_lane_of(tenant),
                    ladder.promote_exchange(),
                    ladder.promotions_of(tenant),
                ),
            ] {
                channel
                    .queue_unbind(
                        queue.as_str().into(),
                        source.as_str().into(),
                        key.as_str().into(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| declare_error(format!("binding {source} -> {queue}"), e))?;
            }
        }
        Ok(())
    }

    /// Sets the ladder's policies (creating or replacing each); they reach existing queues in
    /// place.
    pub async fn apply_policies(&self, api: &Management) -> Result<usize, ManagementError> {
        for p in &self.policies {
            api.put_policy(&p.name, &p.policy).await?;
        }
        Ok(self.policies.len())
    }

    /// Removes the ladder's policies. For the demo and tests, as [`Topology::delete`].
    pub async fn delete_policies(&self, api: &Management) -> Result<(), ManagementError> {
        for p in &self.policies {
            api.delete_policy(&p.name).await?;
        }
        Ok(())
    }

    /// Deletes every object, messages included. For the demo and tests, which own their prefix;
    /// operators remove a ladder by hand, after looking at what is in it.
    pub async fn delete(&self, channel: &lapin::Channel) -> Result<(), lapin::Error> {
        for q in &self.queues {
            channel
                .queue_delete(
                    q.name.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await?;
        }
        for x in &self.exchanges {
            channel
                .exchange_delete(
                    x.name.as_str().into(),
                    lapin::options::ExchangeDeleteOptions::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// The objects as RabbitMQ definitions JSON for `rabbitmqctl import_definitions` (or the
    /// management API's `POST /api/definitions`).
    pub fn export(&self, vhost: &str) -> serde_json::Value {
        use serde_json::{Map, Value, json};
        let args = |a: &BTreeMap<String, Arg>| -> Value {
            Value::Object(
                a.iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect::<Map<_, _>>(),
            )
        };
        json!({
            "exchanges": self.exchanges.iter().map(|x| json!({
                "name": x.name, "vhost": vhost, "type": x.kind, "durable": true,
                "auto_delete": false, "internal": false, "arguments": args(&x.arguments),
            })).collect::<Vec<_>>(),
            "queues": self.queues.iter().map(|q| json!({
                "name": q.name, "vhost": vhost, "durable": true, "auto_delete": false,
                "arguments": args(&q.arguments),
            })).collect::<Vec<_>>(),
            "bindings": self.bindings.iter().map(|b| json!({
                "source": b.source, "vhost": vhost, "destination": b.queue,
                "destination_type": "queue", "routing_key": b.routing_key, "arguments": {},
            })).collect::<Vec<_>>(),
            "policies": self.policies.iter().map(|p| json!({
                "vhost": vhost, "name": p.name, "pattern": p.policy.pattern,
                "apply-to": p.policy.apply_to, "priority": p.policy.priority,
                "definition": p.policy.definition,
            })).collect::<Vec<_>>(),
        })
    }
}

fn declare_error(object: String, e: lapin::Error) -> TopologyError {
    match refused(&e) {
        Some(Refusal::PreconditionFailed) => TopologyError::Conflict {
            object,
            message: e.to_string(),
        },
        _ => TopologyError::Broker { object, source: e },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_LADDER: &str = include_str!("../../topology/ladder.toml");

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
                        assert!(!tier_queues.contains(&b.queue), "{} -> {}", q.name, b.queue);
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
    }

    #[test]
    fn quorum_ladders_limit_deliveries_on_the_queues_they_requeue_into_and_plan_checks_it() {
        use crate::broker::drift::{BrokerObjects, BrokerQueue, Drift};
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        let topo = ladder.objects();
        let [limit] = topo.policies.as_slice() else {
            panic!("one policy: {:?}", topo.policies)
        };
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
        let classic = Ladder::build("c", QueueType::Classic, &["1s"], &["1s"]).unwrap();
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
            serde_json::from_str(include_str!("../../rabbitmq/definitions.json")).unwrap();
        assert_eq!(
            exported, shipped,
            "rabbitmq/definitions.json is stale: run `hookrelay topology export > rabbitmq/definitions.json`"
        );
    }
}
