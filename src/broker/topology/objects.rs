//! The broker objects themselves: exchanges, queues, bindings and policies, declared,
//! removed and exported as RabbitMQ definitions.

use std::collections::BTreeMap;

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, ExchangeUnbindOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};

use crate::broker::error::{Refusal, refused};
use crate::broker::management::{Management, ManagementError, Policy};

use super::*;

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
    pub(super) fn new(name: &str, kind: &'static str) -> Self {
        Self {
            name: name.to_owned(),
            kind,
            arguments: BTreeMap::new(),
        }
    }
    pub(super) fn arg(mut self, key: &str, value: Arg) -> Self {
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
    pub(super) fn to_queue(source: &str, queue: &str, routing_key: &str) -> Self {
        Self {
            source: source.to_owned(),
            destination: queue.to_owned(),
            to_exchange: false,
            routing_key: routing_key.to_owned(),
            arguments: BTreeMap::new(),
        }
    }
    pub(super) fn to_exchange(source: &str, exchange: &str) -> Self {
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

pub(super) fn declare_error(object: String, e: lapin::Error) -> TopologyError {
    match refused(&e) {
        Some(Refusal::PreconditionFailed) => TopologyError::Conflict {
            object,
            message: e.to_string(),
        },
        _ => TopologyError::Broker { object, source: e },
    }
}
