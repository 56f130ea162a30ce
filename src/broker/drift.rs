//! `topology plan`: the ladder's objects compared with what the broker has, difference by
//! difference, and the objects under the prefix that the ladder no longer names.

use std::collections::BTreeMap;

use crate::broker::management::Policy;
use crate::broker::topology::{Arg, Binding, Topology};
use crate::contract::ladder::{Ladder, QueueRole};

impl Topology {
    /// Compares the ladder with what the broker has. `broker` is the management API's view.
    pub fn diff(&self, broker: &BrokerObjects) -> Vec<Drift> {
        let mut drift = Vec::new();
        for x in &self.exchanges {
            match broker.exchanges.get(&x.name) {
                None => drift.push(Drift::Missing(format!("exchange {}", x.name))),
                Some(actual) => {
                    if actual.kind != x.kind {
                        drift.push(Drift::Differs {
                            object: format!("exchange {}", x.name),
                            field: "type".into(),
                            expected: x.kind.into(),
                            actual: actual.kind.clone(),
                        });
                    }
                    if !actual.durable {
                        drift.push(durable_drift(&format!("exchange {}", x.name)));
                    }
                    diff_args(
                        &format!("exchange {}", x.name),
                        &x.arguments,
                        &actual.arguments,
                        &mut drift,
                    );
                }
            }
        }
        for q in &self.queues {
            match broker.queues.get(&q.name) {
                None => drift.push(Drift::Missing(format!("queue {}", q.name))),
                Some(actual) => {
                    if !actual.durable {
                        drift.push(durable_drift(&format!("queue {}", q.name)));
                    }
                    diff_args(
                        &format!("queue {}", q.name),
                        &q.arguments,
                        &actual.arguments,
                        &mut drift,
                    );
                }
            }
        }
        for p in &self.policies {
            let object = format!("policy {}", p.name);
            match broker.policies.get(&p.name) {
                None => drift.push(Drift::Missing(object)),
                Some(actual) if *actual != p.policy => drift.push(Drift::Differs {
                    object,
                    field: "definition".into(),
                    expected: policy_text(&p.policy),
                    actual: policy_text(actual),
                }),
                Some(_) => {}
            }
            // Only one policy applies to a queue: another one of higher priority that matches
            // takes this one's place (a queue the broker has not sampled yet shows none).
            for queue in &p.covers {
                if let Some(other) = broker.queues.get(queue).and_then(|q| q.policy.as_ref())
                    && *other != p.name
                {
                    drift.push(Drift::Differs {
                        object: format!("queue {queue}"),
                        field: "policy".into(),
                        expected: p.name.clone(),
                        actual: other.clone(),
                    });
                }
            }
        }
        for b in &self.bindings {
            let present = broker.bindings.iter().any(|have| have.is(b));
            if !present {
                drift.push(Drift::Missing(b.to_string()));
            }
        }
        drift
    }

    /// Bindings the broker has that route into lanes or exchanges this ladder no longer uses:
    /// a retired tenant's lanes, the shards of another shard count, the unsharded lanes of a
    /// sharded ladder (and the other way round), the shard exchanges of an unsharded one, and
    /// the streams' bindings it no longer has (a retired tenant's, a stream turned off).
    /// `topology apply` removes them once the ladder's own are in place, so the queues stop
    /// receiving and workers drain them; nothing in them moves.
    pub fn stale_bindings(&self, ladder: &Ladder, broker: &BrokerObjects) -> Vec<Binding> {
        let routing = [
            ladder.ingress(),
            ladder.ingress_unrouted(),
            ladder.ingress_shards(),
            ladder.promote_exchange(),
            ladder.promote_unrouted(),
            ladder.promote_shards(),
            ladder.promote_unmatched(),
            ladder.attempts_exchange(),
        ];
        broker
            .bindings
            .iter()
            .filter(|b| routing.contains(&b.source))
            .filter(|b| !self.bindings.iter().any(|ours| b.is(ours)))
            .filter(|b| {
                if b.to_exchange {
                    ladder.names(&b.destination)
                } else {
                    // A stream's bindings other than the ladder's: a tenant no longer
                    // dedicated, or a stream the ladder turned off (it stays, with what it
                    // holds, and takes nothing more).
                    ladder.role_of(&b.destination).is_some_and(|role| {
                        ladder.is_retired_lane(&role) || matches!(role, QueueRole::Stream(_))
                    })
                }
            })
            .map(BrokerBinding::to_binding)
            .collect()
    }

    /// Objects under `prefix.` that the broker has and the ladder does not (an old tier, say).
    /// Parking queues of held tiers are operational, not drift, and are left out.
    pub fn extras(&self, ladder: &Ladder, broker: &BrokerObjects) -> Vec<String> {
        let mut extra: Vec<String> = broker
            .queues
            .keys()
            .filter(|n| ladder.names(n) && !ladder.is_parking(n))
            .filter(|n| !self.queues.iter().any(|q| &q.name == *n))
            .map(|n| format!("queue {n}"))
            .collect();
        extra.extend(
            broker
                .exchanges
                .keys()
                .filter(|n| ladder.names(n) && !self.exchanges.iter().any(|x| &x.name == *n))
                .map(|n| format!("exchange {n}")),
        );
        extra.extend(
            self.stale_bindings(ladder, broker)
                .iter()
                .map(ToString::to_string),
        );
        extra
    }
}

fn policy_text(p: &Policy) -> String {
    format!(
        "pattern {:?}, apply-to {}, priority {}, {}",
        p.pattern,
        p.apply_to,
        p.priority,
        serde_json::Value::Object(p.definition.clone())
    )
}

fn durable_drift(object: &str) -> Drift {
    Drift::Differs {
        object: object.to_owned(),
        field: "durable".into(),
        expected: "true".into(),
        actual: "false".into(),
    }
}

fn diff_args(
    object: &str,
    expected: &BTreeMap<String, Arg>,
    actual: &serde_json::Map<String, serde_json::Value>,
    drift: &mut Vec<Drift>,
) {
    for (key, want) in expected {
        match actual.get(key) {
            Some(have) if want.matches_json(have) => {}
            // A classic queue declared without x-queue-type reports none.
            None if key == "x-queue-type" && *want == Arg::Str("classic".into()) => {}
            have => drift.push(Drift::Differs {
                object: object.to_owned(),
                field: format!("argument {key}"),
                expected: want.to_json().to_string(),
                actual: have.map_or_else(|| "(absent)".to_owned(), ToString::to_string),
            }),
        }
    }
    for (key, have) in actual {
        if !expected.contains_key(key) {
            drift.push(Drift::Differs {
                object: object.to_owned(),
                field: format!("argument {key}"),
                expected: "(absent)".into(),
                actual: have.to_string(),
            });
        }
    }
}

/// The broker's view of the objects, as read from the management API.
#[derive(Debug, Default, Clone)]
pub struct BrokerObjects {
    pub exchanges: BTreeMap<String, BrokerExchange>,
    pub queues: BTreeMap<String, BrokerQueue>,
    /// Bindings from named exchanges (the default exchange's are left out).
    pub bindings: Vec<BrokerBinding>,
    pub policies: BTreeMap<String, Policy>,
}

#[derive(Debug, Clone)]
pub struct BrokerBinding {
    pub source: String,
    pub destination: String,
    pub to_exchange: bool,
    pub routing_key: String,
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

impl BrokerBinding {
    /// Whether this is the ladder's binding `b`: same ends, routing key and arguments.
    pub fn is(&self, b: &Binding) -> bool {
        self.source == b.source
            && self.destination == b.destination
            && self.to_exchange == b.to_exchange
            && self.routing_key == b.routing_key
            && self.arguments.len() == b.arguments.len()
            && b.arguments.iter().all(|(k, v)| {
                self.arguments
                    .get(k)
                    .is_some_and(|have| v.matches_json(have))
            })
    }

    /// The binding as `topology` can remove it (its arguments are part of its identity).
    pub fn to_binding(&self) -> Binding {
        Binding {
            source: self.source.clone(),
            destination: self.destination.clone(),
            to_exchange: self.to_exchange,
            routing_key: self.routing_key.clone(),
            arguments: self
                .arguments
                .iter()
                .filter_map(|(k, v)| {
                    let arg = match v {
                        serde_json::Value::String(s) => Arg::Str(s.clone()),
                        serde_json::Value::Number(n) => Arg::Int(n.as_i64()?),
                        _ => return None,
                    };
                    Some((k.clone(), arg))
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BrokerExchange {
    pub kind: String,
    pub durable: bool,
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct BrokerQueue {
    pub durable: bool,
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// The policy that applies to it, as the broker last sampled it.
    pub policy: Option<String>,
}

/// One difference between the ladder file and the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    Missing(String),
    Differs {
        object: String,
        field: String,
        expected: String,
        actual: String,
    },
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drift::Missing(object) => write!(f, "missing: {object}"),
            Drift::Differs {
                object,
                field,
                expected,
                actual,
            } => write!(
                f,
                "differs: {object}: {field} is {actual} on the broker, the ladder says {expected}"
            ),
        }
    }
}
