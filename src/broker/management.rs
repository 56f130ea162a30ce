//! The RabbitMQ management HTTP API, read into typed answers: what `topology plan` compares
//! against, what `status`, `tier` and the worker's depth metrics read, and what tools and tests
//! use to look at queues and connections.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::broker::drift::{BrokerBinding, BrokerExchange, BrokerObjects, BrokerQueue};
use crate::config::SecretUrl;

/// How long an idle connection to the management API is kept for the next request: under the
/// 5 s after which RabbitMQ 4's listener closes it.
const POOL_IDLE: Duration = Duration::from_secs(3);

/// A request that failed on its connection before any answer came (not a timeout, not a
/// refused connect): the server closed a pooled connection as it was reused.
fn is_stale_connection(e: &reqwest::Error) -> bool {
    e.is_request() && !e.is_timeout() && !e.is_connect()
}

/// The pauses before each repeat of a `GET` the API answered with a server error: about 1.5 s
/// in all, far longer than a stream takes to start.
const GET_RETRY_PAUSES: [Duration; 5] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    #[error(
        "the management API at {url} is not reachable ({message}); is the rabbitmq_management \
         plugin enabled (`rabbitmq-plugins enable rabbitmq_management`)?"
    )]
    Unreachable { url: String, message: String },
    #[error("the management API refused {what}: HTTP {status} {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
    #[error("invalid management URL {0}")]
    BadUrl(String),
    #[error("unexpected answer from the management API for {what}: {message}")]
    Unexpected { what: String, message: String },
}

/// A client for one broker's management API, scoped to one vhost. `Debug` leaves the password out.
#[derive(Clone)]
pub struct Management {
    client: reqwest::Client,
    base: reqwest::Url,
    user: String,
    password: String,
    shown: String,
    vhost: String,
}

impl fmt::Debug for Management {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Management")
            .field("base", &self.shown)
            .field("user", &self.user)
            .field("password", &"***")
            .field("vhost", &self.vhost)
            .finish_non_exhaustive()
    }
}

impl Management {
    /// `url` carries the credentials (`http://user:pass@host:15672`); `vhost` is the one the
    /// AMQP URL names.
    pub fn new(url: &SecretUrl, vhost: &str) -> Result<Self, ManagementError> {
        let mut base = url.expose_url().clone();
        // A URL without `scheme://` (`localhost:15672`) parses, but has no path to add to.
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(ManagementError::BadUrl(format!(
                "{url}: expected http(s)://user:pass@host:15672"
            )));
        }
        let user = percent_decode(base.username());
        let password = percent_decode(base.password().unwrap_or_default());
        let _ = base.set_username("");
        let _ = base.set_password(None);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            // RabbitMQ 4's management listener closes a keep-alive connection after 5 s without
            // a request (Cowboy's `request_timeout`); one kept longer is gone when reused.
            .pool_idle_timeout(POOL_IDLE)
            .no_proxy()
            .build()
            .map_err(|e| ManagementError::BadUrl(e.to_string()))?;
        Ok(Self {
            client,
            shown: base.to_string(),
            base,
            user,
            password,
            vhost: vhost.to_owned(),
        })
    }

    /// The vhost of an AMQP URL (`/` when the URL names none).
    pub fn vhost_of(amqp_url: &SecretUrl) -> String {
        amqp_url
            .expose()
            .parse::<lapin::uri::AMQPUri>()
            .map(|u| u.vhost)
            .unwrap_or_else(|_| "/".to_owned())
    }

    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    /// `/api/<segments...>` with each segment percent-encoded (so vhost `/` becomes `%2F`).
    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, ManagementError> {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|()| ManagementError::BadUrl(self.shown.clone()))?;
            path.pop_if_empty().push("api");
            for s in segments {
                path.push(s);
            }
        }
        Ok(url)
    }

    async fn request(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        body: Option<&Value>,
    ) -> Result<reqwest::Response, ManagementError> {
        let what = format!("{method} /api/{}", segments.join("/"));
        let mut req = self
            .client
            .request(method, self.url(segments)?)
            .basic_auth(&self.user, Some(&self.password));
        if let Some(body) = body {
            req = req.json(body);
        }
        // A connection the server closed as it was reused fails before any answer: the request
        // is sent once more on a fresh one. Every request of this client may be repeated (reads,
        // and writes that put or delete a whole object); a timeout is not repeated.
        let resend = req.try_clone();
        let resp = match (req.send().await, resend) {
            (Ok(resp), _) => Ok(resp),
            (Err(e), Some(again)) if is_stale_connection(&e) => again.send().await,
            (Err(e), _) => Err(e),
        }
        .map_err(|e| ManagementError::Unreachable {
            url: self.shown.clone(),
            message: crate::units::error_chain(&e),
        })?;
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            Ok(resp)
        } else {
            let body = resp.text().await.unwrap_or_default();
            Err(ManagementError::Status { what, status, body })
        }
    }

    /// `GET`, asked again after a server error (5xx) with a growing pause, up to
    /// [`GET_RETRY_PAUSES`]: RabbitMQ 3.10 answers a queue listing with HTTP 500 whenever a
    /// stream in the vhost is between its declaration and its leader's start, which on a busy
    /// broker is a matter of milliseconds, not a fault. A read repeats safely; writes do not
    /// and are never asked again.
    async fn get<T: DeserializeOwned>(&self, segments: &[&str]) -> Result<T, ManagementError> {
        let mut pauses = GET_RETRY_PAUSES.iter();
        let resp = loop {
            match self.request(reqwest::Method::GET, segments, None).await {
                Err(ManagementError::Status { status, .. })
                    if (500..600).contains(&status)
                        && let Some(pause) = pauses.next() =>
                {
                    tokio::time::sleep(*pause).await;
                }
                other => break other?,
            }
        };
        resp.json().await.map_err(|e| ManagementError::Unexpected {
            what: format!("/api/{}", segments.join("/")),
            message: e.to_string(),
        })
    }

    /// `GET`, with `None` for 404.
    async fn get_optional<T: DeserializeOwned>(
        &self,
        segments: &[&str],
    ) -> Result<Option<T>, ManagementError> {
        match self.get(segments).await {
            Ok(v) => Ok(Some(v)),
            Err(ManagementError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn put(&self, segments: &[&str], body: &Value) -> Result<(), ManagementError> {
        self.request(reqwest::Method::PUT, segments, Some(body))
            .await
            .map(|_| ())
    }

    /// `DELETE`; what is already gone (404) counts as deleted.
    async fn delete(&self, segments: &[&str]) -> Result<(), ManagementError> {
        match self.request(reqwest::Method::DELETE, segments, None).await {
            Ok(_) | Err(ManagementError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The broker version, to show in messages and to check the API answers at all.
    pub async fn broker_version(&self) -> Result<String, ManagementError> {
        let overview: Overview = self.get(&["overview"]).await?;
        Ok(overview
            .rabbitmq_version
            .unwrap_or_else(|| "unknown".to_owned()))
    }

    /// The exchange types the broker offers (`direct`, `x-consistent-hash`, ...): plugins add
    /// theirs.
    pub async fn exchange_types(&self) -> Result<Vec<String>, ManagementError> {
        let overview: Overview = self.get(&["overview"]).await?;
        Ok(overview
            .exchange_types
            .into_iter()
            .map(|t| t.name)
            .collect())
    }

    /// The state of a feature flag (`enabled`, `disabled`), or `None` if the broker lacks it.
    pub async fn feature_flag(&self, name: &str) -> Result<Option<String>, ManagementError> {
        let flags: Vec<FeatureFlag> = self.get(&["feature-flags"]).await?;
        Ok(flags.into_iter().find(|f| f.name == name).map(|f| f.state))
    }

    /// The deprecated features in use on the broker; `None` where the broker cannot say
    /// (before 3.13, which has no such endpoint).
    pub async fn deprecated_features_used(&self) -> Result<Option<Vec<String>>, ManagementError> {
        let used: Option<Vec<FeatureFlag>> =
            self.get_optional(&["deprecated-features", "used"]).await?;
        Ok(used.map(|u| u.into_iter().map(|f| f.name).collect()))
    }

    /// The consumers of the vhost's queues.
    pub async fn consumers(&self) -> Result<Vec<ConsumerInfo>, ManagementError> {
        self.get(&["consumers", &self.vhost]).await
    }

    /// Every queue of the vhost.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>, ManagementError> {
        self.get(&["queues", &self.vhost]).await
    }

    /// One queue, or `None` if it does not exist.
    pub async fn queue(&self, name: &str) -> Result<Option<QueueInfo>, ManagementError> {
        self.get_optional(&["queues", &self.vhost, name]).await
    }

    /// Exchanges, queues and bindings of the vhost, as `topology plan` compares them.
    pub async fn objects(&self) -> Result<BrokerObjects, ManagementError> {
        let vhost = self.vhost.as_str();
        let mut objects = BrokerObjects::default();
        let exchanges: Vec<ExchangeInfo> = self.get(&["exchanges", vhost]).await?;
        for x in exchanges {
            objects.exchanges.insert(
                x.name,
                BrokerExchange {
                    kind: x.kind,
                    durable: x.durable,
                    arguments: x.arguments,
                },
            );
        }
        for q in self.queues().await? {
            objects.queues.insert(
                q.name,
                BrokerQueue {
                    durable: q.durable,
                    arguments: q.arguments,
                    policy: q.policy,
                },
            );
        }
        let policies: Vec<PolicyInfo> = self.get(&["policies", vhost]).await?;
        for p in policies {
            objects.policies.insert(p.name, p.policy);
        }
        let bindings: Vec<BindingInfo> = self.get(&["bindings", vhost]).await?;
        for b in bindings {
            // The default exchange's implicit bindings (source "") are not the ladder's.
            if !b.source.is_empty() {
                objects.bindings.push(BrokerBinding {
                    source: b.source,
                    destination: b.destination,
                    to_exchange: b.destination_type == "exchange",
                    routing_key: b.routing_key,
                    arguments: b.arguments,
                });
            }
        }
        Ok(objects)
    }

    /// The policy `name` of the vhost, or `None` if there is none.
    pub async fn policy(&self, name: &str) -> Result<Option<Policy>, ManagementError> {
        self.get_optional(&["policies", &self.vhost, name]).await
    }

    /// Creates or replaces the policy `name` of the vhost.
    pub async fn put_policy(&self, name: &str, policy: &Policy) -> Result<(), ManagementError> {
        let body = serde_json::to_value(policy).map_err(|e| ManagementError::Unexpected {
            what: format!("policy {name}"),
            message: e.to_string(),
        })?;
        self.put(&["policies", &self.vhost, name], &body).await
    }

    /// Removes the policy `name` of the vhost; one that does not exist counts as removed.
    pub async fn delete_policy(&self, name: &str) -> Result<(), ManagementError> {
        self.delete(&["policies", &self.vhost, name]).await
    }

    /// Creates the vhost `name` (a no-op if it exists).
    pub async fn create_vhost(&self, name: &str) -> Result<(), ManagementError> {
        self.put(&["vhosts", name], &Value::Object(Map::new()))
            .await
    }

    /// Deletes the vhost `name` and everything in it; one that does not exist counts as deleted.
    pub async fn delete_vhost(&self, name: &str) -> Result<(), ManagementError> {
        self.delete(&["vhosts", name]).await
    }

    /// Imports definitions (as [`crate::broker::topology::Topology::export`] writes them) into
    /// the vhost.
    pub async fn import_definitions(&self, definitions: &Value) -> Result<(), ManagementError> {
        self.request(
            reqwest::Method::POST,
            &["definitions", &self.vhost],
            Some(definitions),
        )
        .await
        .map(|_| ())
    }

    /// Every connection the broker has, with the name its client gave it.
    pub async fn connections(&self) -> Result<Vec<ConnectionInfo>, ManagementError> {
        self.get(&["connections"]).await
    }

    /// Closes (server side) every connection whose client-given name is `name`. Returns how
    /// many were closed.
    pub async fn close_connections_named(&self, name: &str) -> Result<usize, ManagementError> {
        let mut closed = 0;
        for c in self.connections().await? {
            if c.client_name() == Some(name) {
                self.delete(&["connections", &c.name]).await?;
                closed += 1;
            }
        }
        Ok(closed)
    }
}

/// One queue as the management API shows it. The broker leaves out the counts and rates of a
/// queue it has not sampled yet, and writes `null` (or, for an empty map, `[]` on some versions)
/// where it knows nothing: a field it leaves out or writes in another shape reads as its default,
/// so one odd field never hides a queue.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct QueueInfo {
    pub name: String,
    /// `classic`, `quorum` or `stream`.
    #[serde(rename = "type", deserialize_with = "or_default")]
    pub queue_type: String,
    #[serde(deserialize_with = "or_default")]
    pub durable: bool,
    /// The arguments it was declared with, as JSON.
    #[serde(deserialize_with = "or_default")]
    pub arguments: Map<String, Value>,
    /// Ready and unacknowledged together; `None` until the broker has sampled the queue.
    #[serde(deserialize_with = "or_default")]
    pub messages: Option<i64>,
    #[serde(deserialize_with = "or_default")]
    pub messages_ready: i64,
    #[serde(deserialize_with = "or_default")]
    pub messages_unacknowledged: i64,
    #[serde(deserialize_with = "or_default")]
    pub consumers: i64,
    /// The name of the policy that applies to the queue.
    #[serde(deserialize_with = "or_default")]
    pub policy: Option<String>,
    /// What the policies that apply set (`dead-letter-routing-key`, ...).
    #[serde(deserialize_with = "or_default")]
    pub effective_policy_definition: Map<String, Value>,
    #[serde(deserialize_with = "or_default")]
    pub message_stats: MessageStats,
    /// The `timestamp` property (seconds) of the message at the head, where the broker knows it
    /// (classic queues).
    #[serde(deserialize_with = "or_default")]
    pub head_message_timestamp: Option<f64>,
    /// The node leading a quorum queue.
    #[serde(deserialize_with = "or_default")]
    pub leader: Option<String>,
    /// The nodes a quorum queue has a member on.
    #[serde(deserialize_with = "or_default")]
    pub members: Vec<String>,
}

/// A queue's message rates, per second, as the broker last sampled them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MessageStats {
    /// Published into the queue (dead-lettered into it included).
    #[serde(deserialize_with = "or_default")]
    pub publish_details: Rate,
    /// Acknowledged by consumers.
    #[serde(deserialize_with = "or_default")]
    pub ack_details: Rate,
    /// Delivered to consumers or fetched with `basic.get`.
    #[serde(deserialize_with = "or_default")]
    pub deliver_get_details: Rate,
}

/// One rate; `None` while the broker has none (nothing of that kind happened yet).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub struct Rate {
    #[serde(deserialize_with = "or_default")]
    pub rate: Option<f64>,
}

/// A policy, as set with [`Management::put_policy`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// A regular expression for the names it applies to.
    pub pattern: String,
    /// `queues`, `exchanges` or `all`.
    #[serde(rename = "apply-to")]
    pub apply_to: String,
    /// Only the policy of highest priority applies to an object.
    pub priority: i64,
    pub definition: Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Overview {
    #[serde(deserialize_with = "or_default")]
    rabbitmq_version: Option<String>,
    #[serde(default)]
    exchange_types: Vec<ExchangeType>,
}

/// A consumer, as `/api/consumers` lists it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ConsumerInfo {
    pub queue: NameOnly,
    /// The consumer timeout the broker applies to it, in milliseconds (reported from 3.12).
    #[serde(deserialize_with = "or_default")]
    pub consumer_timeout: Option<u64>,
}

/// An object named in another's answer (`{"name": ..., "vhost": ...}`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct NameOnly {
    pub name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ExchangeType {
    name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FeatureFlag {
    name: String,
    #[serde(deserialize_with = "or_default")]
    state: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ExchangeInfo {
    name: String,
    #[serde(rename = "type", deserialize_with = "or_default")]
    kind: String,
    #[serde(deserialize_with = "or_default")]
    durable: bool,
    #[serde(deserialize_with = "or_default")]
    arguments: Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PolicyInfo {
    name: String,
    #[serde(flatten)]
    policy: Policy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BindingInfo {
    source: String,
    destination: String,
    destination_type: String,
    routing_key: String,
    arguments: serde_json::Map<String, serde_json::Value>,
}

/// One connection as the management API shows it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ConnectionInfo {
    /// The broker's name for the connection, which deleting it takes.
    pub name: String,
    #[serde(deserialize_with = "or_default")]
    client_properties: ClientProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ClientProperties {
    /// The name the client gave the connection.
    #[serde(deserialize_with = "or_default")]
    connection_name: Option<String>,
}

impl ConnectionInfo {
    /// The name the client gave the connection (hookrelay's: `<worker> consume`, ...).
    pub fn client_name(&self) -> Option<&str> {
        self.client_properties.connection_name.as_deref()
    }
}

/// The value, or its default where the broker writes `null` or another shape.
fn or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).unwrap_or_default())
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_reads_as_the_broker_writes_it() {
        // A classic queue: nulls where the broker knows nothing, a policy definition written as
        // an empty list (as some versions do), rates only for what happened.
        let classic: QueueInfo = serde_json::from_value(serde_json::json!({
            "name": "hookrelay.retry-10s", "type": "classic", "durable": true,
            "arguments": {"x-message-ttl": 10000}, "messages": 7, "messages_ready": 5,
            "messages_unacknowledged": 2, "consumers": 1, "policy": null,
            "effective_policy_definition": [], "head_message_timestamp": null,
            "message_stats": {"publish_details": {"rate": 2.5}, "ack": 3},
        }))
        .unwrap();
        assert_eq!(classic.name, "hookrelay.retry-10s");
        assert_eq!(classic.queue_type, "classic");
        assert!(classic.durable);
        assert_eq!(classic.arguments["x-message-ttl"], 10000);
        assert_eq!(
            (
                classic.messages,
                classic.messages_ready,
                classic.messages_unacknowledged,
                classic.consumers
            ),
            (Some(7), 5, 2, 1)
        );
        assert_eq!(classic.policy, None);
        assert!(classic.effective_policy_definition.is_empty());
        assert_eq!(classic.head_message_timestamp, None);
        assert_eq!(classic.message_stats.publish_details.rate, Some(2.5));
        assert_eq!(classic.message_stats.ack_details.rate, None);

        // A quorum queue the broker has not sampled yet: no counts at all.
        let quorum: QueueInfo = serde_json::from_value(serde_json::json!({
            "name": "hookrelay.ready", "type": "quorum", "durable": true,
            "arguments": {"x-queue-type": "quorum"}, "leader": "rabbit@a",
            "members": ["rabbit@a", "rabbit@b", "rabbit@c"], "policy": "hookrelay.hold.retry-1h",
            "effective_policy_definition": {"dead-letter-routing-key": "held.retry-1h"},
        }))
        .unwrap();
        assert_eq!(quorum.messages, None);
        assert_eq!((quorum.messages_ready, quorum.consumers), (0, 0));
        assert_eq!(quorum.leader.as_deref(), Some("rabbit@a"));
        assert_eq!(quorum.members.len(), 3);
        assert_eq!(quorum.policy.as_deref(), Some("hookrelay.hold.retry-1h"));
        assert!(
            quorum
                .effective_policy_definition
                .contains_key("dead-letter-routing-key")
        );
    }

    #[test]
    fn a_hold_policy_is_sent_in_the_brokers_words() {
        let mut definition = Map::new();
        definition.insert("dead-letter-routing-key".into(), "held.retry-1h".into());
        let policy = Policy {
            pattern: "^hookrelay\\.retry-1h$".into(),
            apply_to: "queues".into(),
            priority: 100,
            definition,
        };
        assert_eq!(
            serde_json::to_value(&policy).unwrap(),
            serde_json::json!({
                "pattern": "^hookrelay\\.retry-1h$", "apply-to": "queues", "priority": 100,
                "definition": {"dead-letter-routing-key": "held.retry-1h"},
            })
        );
    }

    #[test]
    fn connections_are_found_by_the_name_their_client_gave() {
        let listed: Vec<ConnectionInfo> = serde_json::from_value(serde_json::json!([
            {"name": "127.0.0.1:50000 -> 127.0.0.1:5672",
             "client_properties": {"connection_name": "w1 consume"}},
            {"name": "127.0.0.1:50001 -> 127.0.0.1:5672", "client_properties": {}},
        ]))
        .unwrap();
        let names: Vec<Option<&str>> = listed.iter().map(ConnectionInfo::client_name).collect();
        assert_eq!(names, vec![Some("w1 consume"), None]);
    }
}
