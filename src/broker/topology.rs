//! The retry ladder: the file in `topology/`, the broker objects it stands for, and the three
//! things done with them (`apply` declares them, `plan` compares them with the broker, `export`
//! writes them as RabbitMQ definitions).
//!
//! ```text
//! producer --(key: tenant)--> {p}.ingress --(alternate)--> {p}.ingress.unrouted --> {p}.ready.first
//! worker --(key: retry-10s.<tenant>)--> {p}.delay --> {p}.retry-10s (TTL) --(expired)-->
//!     {p}.promote --(alternate)--> {p}.promote.unrouted --> {p}.ready.retry
//! worker --(default exchange)--> {p}.dead
//! ```
//!
//! Tiers dead-letter into `{p}.promote`, never into a tier, so the broker's cycle rule (a message
//! expiring back into a queue it already expired from is dropped) can never apply.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde::Deserialize;

use crate::units::fmt_duration;

/// RabbitMQ's limit for `x-message-ttl` (2^32 - 1 ms, about 49 days).
const MAX_TTL_MS: u128 = u32::MAX as u128;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read ladder file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ladder file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid ladder: {field}: {message}")]
    Invalid { field: String, message: String },
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

fn invalid(field: impl Into<String>, message: impl Into<String>) -> TopologyError {
    TopologyError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Quorum queues are replicated and dead-letter at-least-once; classic queues are the fallback
/// for brokers or deployments that cannot run quorum queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    Quorum,
    Classic,
}

impl QueueType {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

/// The ladder file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LadderFile {
    #[serde(default = "default_prefix")]
    prefix: String,
    #[serde(default = "default_queue_type")]
    queue_type: QueueType,
    tiers: Vec<String>,
    schedule: Vec<String>,
    #[serde(default)]
    dedicated: Vec<DedicatedFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DedicatedFile {
    tenant: String,
    #[serde(default = "default_dedicated_in_flight")]
    in_flight: u16,
}

fn default_dedicated_in_flight() -> u16 {
    100
}

/// A tenant with lanes of its own: its events and retries never queue behind anyone else's,
/// and the worker gives it a budget of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dedicated {
    pub tenant: String,
    /// Deliveries at once from its two lanes (split by `worker.retry_share`).
    pub in_flight: u16,
}

fn default_prefix() -> String {
    "hookrelay".into()
}
fn default_queue_type() -> QueueType {
    QueueType::Quorum
}

/// One delay tier: a TTL queue named after its delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub delay: Duration,
    /// `retry-10s`: the queue name after the prefix, and the first word of its routing keys.
    pub name: String,
}

/// A validated ladder: prefix, queue type, tiers (shortest first) and the retry schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    pub prefix: String,
    pub queue_type: QueueType,
    pub tiers: Vec<Tier>,
    /// `schedule[i]` is the index into `tiers` of the wait before attempt `i + 2`.
    pub schedule: Vec<usize>,
    /// Tenants with lanes of their own.
    pub dedicated: Vec<Dedicated>,
}

impl Ladder {
    pub fn load(path: &Path) -> Result<Self, TopologyError> {
        let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            TopologyError::Parse { message, .. } => TopologyError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Self, TopologyError> {
        let file: LadderFile = toml::from_str(text).map_err(|e| TopologyError::Parse {
            path: PathBuf::from("(inline)"),
            message: e.to_string(),
        })?;
        let mut ladder = Self::build(
            &file.prefix,
            file.queue_type,
            &file.tiers.iter().map(String::as_str).collect::<Vec<_>>(),
            &file.schedule.iter().map(String::as_str).collect::<Vec<_>>(),
        )?;
        for (i, d) in file.dedicated.into_iter().enumerate() {
            ladder = ladder
                .with_dedicated(&d.tenant, d.in_flight)
                .map_err(|e| match e {
                    TopologyError::Invalid { message, .. } => {
                        invalid(format!("dedicated[{i}]"), message)
                    }
                    other => other,
                })?;
        }
        Ok(ladder)
    }

    /// Adds a tenant with lanes of its own.
    pub fn with_dedicated(mut self, tenant: &str, in_flight: u16) -> Result<Self, TopologyError> {
        crate::contract::envelope::check_tenant(tenant)
            .map_err(|e| invalid("dedicated", e.to_string()))?;
        if self.dedicated.iter().any(|d| d.tenant == tenant) {
            return Err(invalid(
                "dedicated",
                format!("tenant {tenant:?} is listed twice"),
            ));
        }
        if in_flight < 2 {
            return Err(invalid(
                "dedicated",
                format!("tenant {tenant:?}: in_flight must be at least 2 (one per lane)"),
            ));
        }
        self.dedicated.push(Dedicated {
            tenant: tenant.to_owned(),
            in_flight,
        });
        Ok(self)
    }

    /// Builds and validates a ladder from its parts (durations as written: `10s`, `500ms`).
    pub fn build(
        prefix: &str,
        queue_type: QueueType,
        tiers: &[&str],
        schedule: &[&str],
    ) -> Result<Self, TopologyError> {
        if prefix.is_empty()
            || prefix.len() > 64
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(invalid(
                "prefix",
                format!(
                    "{prefix:?}: expected 1 to 64 letters, digits, '_', '-' or '.', as in \"hookrelay\""
                ),
            ));
        }
        if tiers.is_empty() {
            return Err(invalid("tiers", "at least one tier is needed"));
        }
        let mut parsed = Vec::with_capacity(tiers.len());
        for (i, raw) in tiers.iter().enumerate() {
            let delay = parse_delay(&format!("tiers[{i}]"), raw)?;
            if delay.as_millis() > MAX_TTL_MS {
                return Err(invalid(
                    format!("tiers[{i}]"),
                    format!("{raw} is longer than RabbitMQ's TTL limit (about 49 days)"),
                ));
            }
            if parsed.iter().any(|t: &Tier| t.delay == delay) {
                return Err(invalid(
                    format!("tiers[{i}]"),
                    format!("{raw} is listed twice"),
                ));
            }
            parsed.push(Tier {
                delay,
                name: format!("retry-{}", fmt_duration(delay)),
            });
        }
        parsed.sort_by_key(|t| t.delay);
        let mut steps = Vec::with_capacity(schedule.len());
        for (i, raw) in schedule.iter().enumerate() {
            let delay = parse_delay(&format!("schedule[{i}]"), raw)?;
            let Some(index) = parsed.iter().position(|t| t.delay == delay) else {
                return Err(invalid(
                    format!("schedule[{i}]"),
                    format!(
                        "{raw} has no tier; every wait in the schedule must be one of the tiers ({})",
                        parsed
                            .iter()
                            .map(|t| fmt_duration(t.delay))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            steps.push(index);
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            queue_type,
            tiers: parsed,
            schedule: steps,
            dedicated: Vec::new(),
        })
    }

    /// The number of attempts an envelope gets: the first, then one per schedule entry.
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.schedule.len()).unwrap_or(u32::MAX - 1) + 1
    }

    /// The tier to wait in after `attempts_made` attempts, or `None` when the budget is spent.
    pub fn tier_after(&self, attempts_made: u32) -> Option<usize> {
        let step = usize::try_from(attempts_made).ok()?.checked_sub(1)?;
        self.schedule.get(step).copied()
    }

    /// The smallest tier not shorter than `wait`; the longest tier when none is long enough.
    pub fn tier_not_shorter_than(&self, wait: Duration) -> usize {
        self.tiers
            .iter()
            .position(|t| t.delay >= wait)
            .unwrap_or(self.tiers.len() - 1)
    }

    /// The tier whose name (`retry-1m`) or delay (`1m`) is `name`.
    pub fn find_tier(&self, name: &str) -> Option<usize> {
        let bare = name
            .strip_prefix(&format!("{}.", self.prefix))
            .unwrap_or(name);
        self.tiers.iter().position(|t| {
            t.name == bare || parse_delay("", bare).map(|d| d == t.delay).unwrap_or(false)
        })
    }

    /// Tenants whose dedicated lanes exist on the broker (`queues`, by name) but are no longer
    /// in the ladder.
    pub fn retired_tenants<'a>(&self, queues: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        let start = self.name("ready.first.");
        let mut retired: Vec<String> = queues
            .into_iter()
            .filter_map(|q| q.strip_prefix(&start))
            .filter(|t| !self.dedicated.iter().any(|d| d.tenant == *t))
            .map(str::to_owned)
            .collect();
        retired.sort();
        retired.dedup();
        retired
    }

    fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }
    /// Producers publish here with routing key = tenant id.
    pub fn ingress(&self) -> String {
        self.name("ingress")
    }
    fn ingress_unrouted(&self) -> String {
        self.name("ingress.unrouted")
    }
    /// The shared first-attempt lane.
    pub fn first_lane(&self) -> String {
        self.name("ready.first")
    }
    /// The shared retry lane: tiers promote into it.
    pub fn retry_lane(&self) -> String {
        self.name("ready.retry")
    }
    /// A dedicated tenant's first-attempt lane.
    pub fn first_lane_of(&self, tenant: &str) -> String {
        self.name(&format!("ready.first.{tenant}"))
    }
    /// A dedicated tenant's retry lane.
    pub fn retry_lane_of(&self, tenant: &str) -> String {
        self.name(&format!("ready.retry.{tenant}"))
    }
    /// The worker publishes retries here with routing key `<tier>.<tenant>`.
    pub fn delay_exchange(&self) -> String {
        self.name("delay")
    }
    /// Tiers dead-letter here when a message's TTL runs out.
    pub fn promote_exchange(&self) -> String {
        self.name("promote")
    }
    fn promote_unrouted(&self) -> String {
        self.name("promote.unrouted")
    }
    /// Operational events (`subscription.gone`, `delivery.cancelled`, ...).
    pub fn events_exchange(&self) -> String {
        self.name("events")
    }
    /// The attempt log: one message per settled delivery, routing key `<outcome>.<tenant>`.
    pub fn attempts_exchange(&self) -> String {
        self.name("attempts")
    }
    /// Where a held tier's expired messages are parked (`hookrelay tier hold`).
    pub fn held_queue(&self, tier: usize) -> String {
        self.name(&format!("held.{}", self.tiers[tier].name))
    }
    /// The dead-letter routing key a hold policy gives a tier; only its parking queue is bound
    /// to it on the promote exchange.
    pub fn held_routing_key(&self, tier: usize) -> String {
        format!("held.{}", self.tiers[tier].name)
    }
    /// The name of the policy that holds a tier.
    pub fn hold_policy(&self, tier: usize) -> String {
        self.name(&format!("hold.{}", self.tiers[tier].name))
    }
    /// The dead-letter sink.
    pub fn dead(&self) -> String {
        self.name("dead")
    }
    pub fn tier_queue(&self, tier: usize) -> String {
        self.name(&self.tiers[tier].name)
    }
    /// The routing key a retry of `tenant` is published with into tier `tier`.
    pub fn tier_routing_key(&self, tier: usize, tenant: &str) -> String {
        format!("{}.{tenant}", self.tiers[tier].name)
    }

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
                    format!("*.{}", d.tenant),
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
        for (i, tier) in self.tiers.iter().enumerate() {
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
                routing_key: format!("{}.*", tier.name),
            });
        }
        queues.push(Queue {
            name: self.dead(),
            arguments: queue_args(&[]),
        });
        Topology {
            exchanges,
            queues,
            bindings,
        }
    }
}

fn parse_delay(field: &str, raw: &str) -> Result<Duration, TopologyError> {
    let delay = humantime::parse_duration(raw).map_err(|e| {
        invalid(
            field,
            format!("{raw:?} is not a duration like \"10s\", \"1m\" or \"500ms\": {e}"),
        )
    })?;
    if delay.as_millis() == 0 {
        return Err(invalid(field, format!("{raw:?} must be at least 1ms")));
    }
    Ok(delay)
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

/// The durable objects of one ladder. All exchanges and queues are durable and never auto-deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub exchanges: Vec<Exchange>,
    pub queues: Vec<Queue>,
    pub bindings: Vec<Binding>,
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
                    format!("*.{tenant}"),
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
        })
    }

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
    pub fn extras(&self, prefix: &str, broker: &BrokerObjects) -> Vec<String> {
        let start = format!("{prefix}.");
        let parking = format!("{prefix}.held.");
        let mut extra: Vec<String> = broker
            .queues
            .keys()
            .filter(|n| n.starts_with(&start) && !n.starts_with(&parking))
            .filter(|n| !self.queues.iter().any(|q| &q.name == *n))
            .map(|n| format!("queue {n}"))
            .collect();
        extra.extend(
            broker
                .exchanges
                .keys()
                .filter(|n| n.starts_with(&start) && !self.exchanges.iter().any(|x| &x.name == *n))
                .map(|n| format!("exchange {n}")),
        );
        extra
    }
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

fn declare_error(object: String, e: lapin::Error) -> TopologyError {
    let message = e.to_string();
    if message.contains("PRECONDITION_FAILED") || message.contains("inequivalent") {
        TopologyError::Conflict { object, message }
    } else {
        TopologyError::Broker { object, source: e }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_LADDER: &str = include_str!("../../topology/ladder.toml");

    #[test]
    fn the_shipped_ladder_is_the_documented_default() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        assert_eq!(ladder.prefix, "hookrelay");
        assert_eq!(ladder.queue_type, QueueType::Quorum);
        let names: Vec<_> = ladder.tiers.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["retry-10s", "retry-1m", "retry-10m", "retry-1h", "retry-6h"]
        );
        assert_eq!(ladder.max_attempts(), 10);
        let total: Duration = ladder.schedule.iter().map(|&i| ladder.tiers[i].delay).sum();
        assert_eq!(
            total,
            Duration::from_secs(10 + 60 + 600 + 3600 + 5 * 6 * 3600)
        );
    }

    #[test]
    fn schedule_walks_the_tiers_then_stops() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        assert_eq!(ladder.tier_after(0), None);
        assert_eq!(ladder.tier_after(1), Some(0));
        assert_eq!(ladder.tier_after(2), Some(1));
        assert_eq!(ladder.tier_after(9), Some(4));
        assert_eq!(ladder.tier_after(10), None);
        assert_eq!(ladder.tier_not_shorter_than(Duration::from_secs(30)), 1);
        assert_eq!(ladder.tier_not_shorter_than(Duration::from_secs(60)), 1);
        assert_eq!(ladder.tier_not_shorter_than(Duration::ZERO), 0);
        assert_eq!(ladder.tier_not_shorter_than(Duration::from_secs(86400)), 4);
        assert_eq!(ladder.find_tier("retry-1h"), Some(3));
        assert_eq!(ladder.find_tier("hookrelay.retry-1h"), Some(3));
        assert_eq!(ladder.find_tier("10m"), Some(2));
        assert_eq!(ladder.find_tier("2m"), None);
    }

    #[test]
    fn tiers_never_dead_letter_into_a_tier() {
        let ladder = Ladder::parse(DEFAULT_LADDER).unwrap();
        let topo = ladder.objects();
        let tier_queues: Vec<String> = (0..ladder.tiers.len())
            .map(|i| ladder.tier_queue(i))
            .collect();
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
    fn bad_ladders_are_explained() {
        let err = Ladder::parse("tiers = [\"10s\"]\nschedule = [\"10s\", \"2m\"]\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid ladder: schedule[1]: 2m has no tier; every wait in the schedule must be one of the tiers (10s)"
        );
        let err = Ladder::parse("tiers = [\"soon\"]\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("tiers[0]"), "{err}");
        let err = Ladder::parse("prefix = \"a b\"\ntiers = [\"1s\"]\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
        let err = Ladder::parse("queue_type = \"stream\"\ntiers = [\"1s\"]\nschedule = []\n")
            .unwrap_err();
        assert!(err.to_string().contains("queue_type"), "{err}");
        let err = Ladder::parse("tiers = []\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("at least one tier"), "{err}");
        let err = Ladder::parse("tiers = [\"1s\", \"1000ms\"]\nschedule = []\n").unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
    }

    #[test]
    fn odd_delays_get_compact_names() {
        let ladder = Ladder::build(
            "t",
            QueueType::Classic,
            &["90s", "250ms"],
            &["250ms", "90s"],
        )
        .unwrap();
        assert_eq!(ladder.tiers[0].name, "retry-250ms");
        assert_eq!(ladder.tiers[1].name, "retry-1m30s");
        assert_eq!(ladder.schedule, vec![0, 1]);
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
