//! `topology plan`: the ladder's objects compared with what the broker has, difference by
//! difference, and the objects under the prefix that the ladder no longer names.

use std::collections::BTreeMap;

use crate::broker::management::Policy;
use crate::broker::topology::{Arg, Topology};
use crate::contract::ladder::Ladder;

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
            let present = broker
                .bindings
                .iter()
                .any(|(s, d, k)| *s == b.source && *d == b.queue && *k == b.routing_key);
            if !present {
                drift.push(Drift::Missing(format!(
                    "binding {} -> {} (routing key {:?})",
                    b.source, b.queue, b.routing_key
                )));
            }
        }
        drift
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
    /// (source exchange, destination queue, routing key)
    pub bindings: Vec<(String, String, String)>,
    pub policies: BTreeMap<String, Policy>,
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
