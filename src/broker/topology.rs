//! The broker objects a ladder stands for, and what is done with them: `apply` declares them,
//! [`Binding::unbind`] removes the bindings into lanes the ladder no longer routes to (found by
//! [`Topology::stale_bindings`]), `export` writes them as RabbitMQ definitions. Comparing them
//! with the broker is [`crate::broker::drift`]'s.
//!
//! Tiers dead-letter into `{p}.promote`, never into a tier, so the broker's cycle rule (a message
//! expiring back into a queue it already expired from is dropped) can never apply.

use std::collections::BTreeMap;

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, ExchangeUnbindOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};

use crate::broker::error::{Refusal, refused};
use crate::broker::management::{Management, ManagementError, Policy};
use crate::contract::headers::SHARD_HEADER;
use crate::contract::ladder::{Ladder, QueueRole, QueueType};
use crate::contract::retention::StreamKind;

/// The exchange type of `rabbitmq_consistent_hash_exchange`, which sharded ladders need.
pub const CONSISTENT_HASH: &str = "x-consistent-hash";
/// The plugin that provides [`CONSISTENT_HASH`].
pub const CONSISTENT_HASH_PLUGIN: &str = "rabbitmq_consistent_hash_exchange";

/// The delivery limit of the queues hookrelay requeues into on purpose: a lane (a delivery whose
/// republish failed goes back to it) and the dead sink (a redrive pass returns what it keeps),
/// and a tier's parking queue (release returns what it cannot move yet). RabbitMQ 4 gives a
/// quorum queue a limit of 20 when nothing sets one, after which it dead-letters or drops the
/// message; 3.x has none. `-1` (unlimited) is refused by 3.x, so the largest 32-bit value stands
/// for "no limit" on both.
pub const DELIVERY_LIMIT: i64 = 2_147_483_647;

/// Where a sharded ladder's lanes put their leaders: on the node that leads the fewest queues
/// (RabbitMQ 3.10's `balanced`; below 1,000 queues it counts leaders, above it picks at random).
pub const LEADER_LOCATOR: &str = "balanced";

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

/// A binding from an exchange to a queue or (`to_exchange`) to another exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub source: String,
    pub destination: String,
    pub to_exchange: bool,
    pub routing_key: String,
    pub arguments: BTreeMap<String, Arg>,
}

impl Binding {
    fn to_queue(source: &str, queue: &str, routing_key: &str) -> Self {
        Self {
            source: source.to_owned(),
            destination: queue.to_owned(),
            to_exchange: false,
            routing_key: routing_key.to_owned(),
            arguments: BTreeMap::new(),
        }
    }
    fn to_exchange(source: &str, exchange: &str) -> Self {
        Self {
            to_exchange: true,
            ..Self::to_queue(source, exchange, "")
        }
    }
    /// `exchange` for an exchange-to-exchange binding, `queue` otherwise.
    pub fn destination_type(&self) -> &'static str {
        if self.to_exchange {
            "exchange"
        } else {
            "queue"
        }
    }

    /// Binds it (idempotent).
    pub async fn bind(&self, channel: &lapin::Channel) -> Result<(), TopologyError> {
        let args = field_table(&self.arguments);
        let bound = if self.to_exchange {
            channel
                .exchange_bind(
                    self.destination.as_str().into(),
                    self.source.as_str().into(),
                    self.routing_key.as_str().into(),
                    ExchangeBindOptions::default(),
                    args,
                )
                .await
        } else {
            channel
                .queue_bind(
                    self.destination.as_str().into(),
                    self.source.as_str().into(),
                    self.routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    args,
                )
                .await
        };
        bound.map_err(|e| declare_error(self.to_string(), e))
    }

    /// Removes it; removing a binding that is not there is not an error.
    pub async fn unbind(&self, channel: &lapin::Channel) -> Result<(), TopologyError> {
        let args = field_table(&self.arguments);
        let unbound = if self.to_exchange {
            channel
                .exchange_unbind(
                    self.destination.as_str().into(),
                    self.source.as_str().into(),
                    self.routing_key.as_str().into(),
                    ExchangeUnbindOptions::default(),
                    args,
                )
                .await
        } else {
            channel
                .queue_unbind(
                    self.destination.as_str().into(),
                    self.source.as_str().into(),
                    self.routing_key.as_str().into(),
                    args,
                )
                .await
        };
        unbound.map_err(|e| declare_error(self.to_string(), e))
    }
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "binding {} -> {} {} (routing key {:?})",
            self.source,
            self.destination_type(),
            self.destination,
            self.routing_key
        )
    }
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
            b.bind(channel).await?;
        }
        Ok(Applied {
            exchanges: self.exchanges.len(),
            queues: self.queues.len(),
            bindings: self.bindings.len(),
        })
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
                "source": b.source, "vhost": vhost, "destination": b.destination,
                "destination_type": b.destination_type(), "routing_key": b.routing_key,
                "arguments": args(&b.arguments),
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
            serde_json::from_str(include_str!("../../rabbitmq/definitions.json")).unwrap();
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
