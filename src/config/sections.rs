//! The settings, section by section, with their defaults and how each is written.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{SecretUrl, Source, StoreConfig, TracesConfig};
use crate::units::Rate;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The ladder file (`HOOKRELAY_LADDER`).
    pub ladder: PathBuf,
    /// The subscriptions file, or a `postgres://` URL of the subscription store
    /// (`HOOKRELAY_SUBSCRIPTIONS`).
    pub subscriptions: PathBuf,
    pub amqp: AmqpConfig,
    pub management: ManagementConfig,
    pub broker: BrokerConfig,
    pub worker: WorkerConfig,
    pub http: HttpConfig,
    pub limits: LimitsConfig,
    pub secrets: SecretsConfig,
    pub store: StoreConfig,
    pub catalog: CatalogConfig,
    pub reload: ReloadConfig,
    pub egress: EgressConfig,
    pub endpoints: EndpointConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub traces: TracesConfig,
    pub api: ApiConfig,
    pub history: HistoryConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ladder: PathBuf::from("topology/ladder.toml"),
            subscriptions: PathBuf::from("subscriptions.toml"),
            amqp: AmqpConfig::default(),
            management: ManagementConfig::default(),
            broker: BrokerConfig::default(),
            worker: WorkerConfig::default(),
            http: HttpConfig::default(),
            limits: LimitsConfig::default(),
            secrets: SecretsConfig::default(),
            store: StoreConfig::default(),
            catalog: CatalogConfig::default(),
            reload: ReloadConfig::default(),
            egress: EgressConfig::default(),
            endpoints: EndpointConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
            traces: TracesConfig::default(),
            api: ApiConfig::default(),
            history: HistoryConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpConfig {
    /// `HOOKRELAY_AMQP_URL`. The vhost is the URL's path (`%2f` is `/`).
    pub url: SecretUrl,
    /// The longest one publish of the worker's may take, every wait on the broker together (a
    /// free channel, opening one, taking the message, its confirm); then that try fails.
    #[serde(with = "humantime_serde")]
    pub confirm_timeout: Duration,
    /// First pause before reconnecting after the broker connection drops; doubles up to `reconnect_max`.
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        Self {
            url: SecretUrl::shipped("amqp://guest:guest@127.0.0.1:5672/%2f"),
            confirm_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagementConfig {
    /// `HOOKRELAY_MANAGEMENT_URL`: the RabbitMQ management HTTP API, credentials in the URL.
    pub url: SecretUrl,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        Self {
            url: SecretUrl::shipped("http://guest:guest@127.0.0.1:15672"),
        }
    }
}

/// Facts about the broker that hookrelay relies on but cannot ask for over AMQP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// The broker's `consumer_timeout` (set in `rabbitmq/rabbitmq.conf`). A delivery held longer
    /// than this closes the worker's channel, so the attempt budget must stay well below it.
    #[serde(with = "humantime_serde")]
    pub consumer_timeout: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            consumer_timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Deliveries the worker works on at once from the shared lanes: the sum of their channels'
    /// prefetch. Dedicated tenants' lanes have budgets of their own (in the ladder file).
    pub in_flight: u16,
    /// The share of a budget the retry lane gets; the first-attempt lane gets the rest. Idle
    /// first-attempt capacity is not lent to retries (see docs/architecture.md), so a deep retry backlog never
    /// delays new events.
    pub retry_share: f64,
    /// Margin kept between the attempt budget and the broker's `consumer_timeout`.
    #[serde(with = "humantime_serde")]
    pub lease_slack: Duration,
    /// On SIGTERM, how long in-flight attempts may take to finish before the worker exits anyway.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// First pause before a republish the broker did not confirm is tried again; doubles up to
    /// `amqp.reconnect_max`. The tries go on within the lease ([`Config::lease`]), so a missing
    /// tier or a blocked broker holds the delivery instead of repeating its attempt.
    #[serde(with = "humantime_serde")]
    pub requeue_delay: Duration,
}

impl WorkerConfig {
    /// A budget split into (first-attempt prefetch, retry prefetch): the retry lane gets
    /// `retry_share` of it, rounded up, and each lane at least one.
    pub fn split(&self, in_flight: u16) -> (u16, u16) {
        let in_flight = in_flight.max(2);
        let retry =
            ((f64::from(in_flight) * self.retry_share).ceil() as u16).clamp(1, in_flight - 1);
        (in_flight - retry, retry)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            in_flight: 300,
            retry_share: 0.3,
            lease_slack: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(45),
            requeue_delay: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// The whole request, response body included. Standard Webhooks asks endpoints to answer
    /// within 15 to 30 seconds; the default gives them the lower end.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// The whole request for an OAuth2 token (lookup, connect, answer), for subscriptions that
    /// authenticate with one. It comes before the attempt, in the same hold of the delivery.
    #[serde(with = "humantime_serde")]
    pub token_timeout: Duration,
    /// At most this much of a response body is read; the rest is dropped.
    pub max_response_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(15),
            token_timeout: Duration::from_secs(5),
            max_response_bytes: 64 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest body an envelope may carry.
    pub max_body_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 256 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsConfig {
    /// How long a resolved secret reference is reused before it is read again. Rotation takes
    /// effect on the first attempt after this much time.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
}

impl Default for SecretsConfig {
    fn default() -> Self {
        Self {
            refresh: Duration::from_secs(5),
        }
    }
}

/// The catalog of event types ([`crate::catalog`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// What a worker does with events of a type the catalog does not list: `off` (the
    /// default), `warn` (deliver, count and report each) or `enforce` (dead-letter each
    /// `schema_invalid`: only listed types are delivered).
    pub unlisted: crate::catalog::ValidationMode,
    /// How often a worker that follows PostgreSQL looks for a changed catalog (one small
    /// query); one that reads the file reloads it with the subscriptions.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        Self {
            unlisted: crate::catalog::ValidationMode::Off,
            refresh: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReloadConfig {
    /// How often the worker looks at the subscriptions file for changes; SIGHUP reloads at once.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
        }
    }
}

/// The egress section of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// CIDRs allowed even though they are in a blocked class, e.g. `["127.0.0.0/8"]` for a local
    /// test endpoint or `["10.20.0.0/16"]` for an internal partner network. A bare address is
    /// a network of one.
    #[serde(serialize_with = "write_nets", deserialize_with = "read_nets")]
    pub allow: Vec<IpNet>,
    /// Refuse `http://` endpoints.
    pub https_only: bool,
    /// Ports endpoints may use; empty allows any.
    pub allowed_ports: Vec<u16>,
    /// An outbound HTTP(S) proxy for every delivery, e.g. `http://proxy.internal:3128`; `""`
    /// in the file or the environment for none. The proxy's own address is exempt from the
    /// policy; the target's addresses are checked by hookrelay before the request, and the proxy
    /// must enforce the rest. It may carry credentials, so it is kept as a [`SecretUrl`].
    #[serde(serialize_with = "write_optional", deserialize_with = "read_proxy")]
    pub proxy: Option<SecretUrl>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConfig {
    /// Attempts at once per endpoint (scheme, host, port and path); a subscription may set its
    /// own.
    pub max_concurrent: u32,
    /// Attempts at once per host and port, across all its endpoints: protects a host many
    /// subscriptions share. Filling it defers, never opens a breaker.
    pub max_concurrent_per_host: u32,
    /// Consecutive failed attempts (5xx, timeouts, connection errors) that open the breaker,
    /// once they span `breaker_window`.
    pub breaker_failures: u32,
    /// How long the failures in a row must span, from the start of the first attempt to the
    /// end of the latest, to open the breaker: attempts made together fail together, and a
    /// burst of failures within a fraction of a second is one look at the endpoint, however
    /// many. `0s`: the count alone decides.
    #[serde(with = "humantime_serde")]
    pub breaker_window: Duration,
    /// How long an open breaker refuses attempts before it lets one probe through; never
    /// longer than the ladder's shortest scheduled wait, so an envelope's next scheduled retry
    /// finds the probe due.
    #[serde(with = "humantime_serde")]
    pub breaker_cooldown: Duration,
    /// The delivery horizon: how long after its first try an envelope deferred for an open
    /// breaker is dead-lettered `horizon_expired`. Deferrals are not attempts, so without it an
    /// endpoint down for good would keep envelopes forever. Waiting a busy endpoint's turn is
    /// not trying and never expires an envelope. `0s`: the schedule's span (the ladder's waits
    /// added up).
    #[serde(with = "humantime_serde")]
    pub horizon: Duration,
    /// How long a breaker stays open before its endpoint is announced quarantined
    /// (`endpoint.quarantined`; `endpoint.recovered` when it closes).
    #[serde(with = "humantime_serde")]
    pub quarantine_after: Duration,
    /// How long a breaker stays open before hookrelay pauses the subscriptions pointing at its
    /// endpoint in a PostgreSQL store, with a reason (`subscription.disabled`): their envelopes
    /// park rather than cycle through the tiers until they expire. `0s`: never. A file is never
    /// written: with a file this does nothing.
    #[serde(with = "humantime_serde")]
    pub disable_after: Duration,
    /// Attempts at once an endpoint is allowed when its breaker closes. The limit grows by one
    /// with each success and halves with each failure (or 429) until it reaches the endpoint's
    /// cap, so a recovered endpoint is not met with its whole backlog at once. `0`: no ramp.
    pub recovery_start: u32,
    /// Requests per unit of time per endpoint (`"50/s"`, `"600/m"`), fleet-wide; a
    /// subscription's `rate` overrides. A delivery over it is deferred into a deferral queue.
    /// `""`: no limit.
    #[serde(serialize_with = "write_optional", deserialize_with = "read_rate")]
    pub rate: Option<Rate>,
    /// How long a delivery may wait for a slot of an endpoint at its cap when that endpoint
    /// answers fast: its attempts take no longer than this and it made progress within it.
    /// At most one delivery waits per slot; any other delivery over a cap is deferred at once.
    /// Bounded so short that the lane slot it holds meanwhile costs other tenants no more than
    /// an attempt to a fast endpoint does. `0s`: never wait.
    #[serde(with = "humantime_serde")]
    pub busy_wait: Duration,
    /// The most of a shared lane's prefetch one endpoint's attempts may hold at once, as a
    /// fraction (0 to 1; `1`: no limit but the caps). A delivery beyond it is deferred as busy.
    /// An attempt holds its lane slot until it ends, so an endpoint that hangs holds as many
    /// slots as it has attempts out: this keeps the rest of the lane (a shard's, whose prefetch
    /// is a fraction of the budget) moving the deliveries of the tenants behind it.
    pub lane_share: f64,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            max_concurrent: 64,
            max_concurrent_per_host: 256,
            breaker_failures: 20,
            breaker_window: Duration::from_secs(1),
            breaker_cooldown: Duration::from_secs(30),
            horizon: Duration::ZERO,
            quarantine_after: Duration::from_secs(300),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            recovery_start: 2,
            rate: None,
            busy_wait: Duration::from_millis(20),
            lane_share: 0.25,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where the worker serves `/metrics`, `/healthz` and `/readyz`; `None` (`""` in the file or
    /// the environment) turns it off.
    #[serde(serialize_with = "write_optional", deserialize_with = "read_listen")]
    pub listen: Option<SocketAddr>,
    /// How often the management API is read: queue depths, and which lanes of tenants no
    /// longer dedicated exist (one read serves both; a lane retired meanwhile only waits, its
    /// messages are safe in it, and a deleted lane is dropped at once, by the broker's cancel).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([0, 0, 0, 0], 9464))),
            poll_interval: Duration::from_secs(15),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter such as `info` or `hookrelay=debug,lapin=warn`; `RUST_LOG` wins when set.
    pub level: String,
    pub format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// `hookrelay api`: the control plane's HTTP API over the PostgreSQL store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Where the API listens (`--listen` overrides).
    pub listen: SocketAddr,
    /// Who may call it: bearer tokens by reference, each an admin's or scoped to one tenant.
    /// In the file `{ token = "env:NAME", tenant = "acme" }` (no tenant: admin); in
    /// `HOOKRELAY_API_TOKENS` a comma-separated list of `env:NAME` (admin) and
    /// `acme=env:NAME` (tenant acme).
    pub tokens: Vec<ApiToken>,
    /// The largest request body accepted; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// After a resume sets `paused = false`, how long the API waits for the workers to see it
    /// before it returns the subscription's parked deliveries.
    #[serde(with = "humantime_serde")]
    pub resume_wait: Duration,
    /// Subscriptions one tenant may have; a create beyond is answered 409.
    pub max_subscriptions_per_tenant: u32,
    /// Entries a subscription's `event_types` may hold.
    pub max_event_types: usize,
    /// Requests that change something (every POST, PATCH and DELETE but test events) one
    /// tenant's tokens may make per minute; beyond, 429 with `Retry-After`.
    pub writes_per_minute: u32,
    /// Test events one tenant's tokens may send per minute; beyond, 429 with `Retry-After`.
    pub test_events_per_minute: u32,
    /// Replays running at once in the API process.
    pub replays_running: usize,
    /// Replays one tenant's tokens may have running at once.
    pub replays_per_tenant: usize,
    /// The widest window (`to` - `from`) a tenant's token may replay.
    #[serde(with = "humantime_serde")]
    pub tenant_replay_window: Duration,
    /// The fastest pace a tenant's token may replay at, and its replays' pace when not given.
    #[serde(deserialize_with = "read_required_rate")]
    pub tenant_replay_rate: Rate,
    /// Envelope ids the index of one `only_undelivered` replay may hold (about 100 bytes
    /// each); past it the replay fails and says so.
    pub replay_index_max: usize,
    /// Where the pages are reached from outside (`https://hooks.example.com`), which portal
    /// links point to; empty: `http://` and the host the link was asked at. `https://` marks
    /// the pages' cookies `Secure`.
    pub public_url: String,
    /// How long a portal or console session lasts after it was opened.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Who may show the tenant portal in a frame (CSP `frame-ancestors`): origins such as
    /// `https://app.example.com`; empty: nobody.
    pub frame_ancestors: Vec<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tokens: Vec::new(),
            max_body_bytes: 64 * 1024,
            resume_wait: Duration::from_secs(2),
            max_subscriptions_per_tenant: 1_000,
            max_event_types: 100,
            writes_per_minute: 120,
            test_events_per_minute: 20,
            replays_running: 4,
            replays_per_tenant: 1,
            tenant_replay_window: Duration::from_secs(24 * 3600),
            tenant_replay_rate: default_replay_rate(),
            replay_index_max: 500_000,
            public_url: String::new(),
            session_ttl: Duration::from_secs(8 * 3600),
            frame_ancestors: Vec::new(),
        }
    }
}

/// `hookrelay history`: the attempt log and the archive materialized into PostgreSQL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// The PostgreSQL database history is kept in (`postgres://...`); unset: the subscription
    /// store's, when `subscriptions` is a `postgres://` URL. Migrated by `hookrelay store migrate`.
    #[serde(serialize_with = "write_optional", deserialize_with = "read_database")]
    pub database: Option<SecretUrl>,
    /// Records written per transaction, at most.
    pub batch: usize,
    /// How long a batch waits to fill before it is written anyway.
    #[serde(with = "humantime_serde")]
    pub flush: Duration,
    /// Days of history kept; older day partitions are dropped.
    pub retention_days: u32,
    /// Where `hookrelay history` serves `/metrics` and `/healthz`; `""` turns it off.
    #[serde(serialize_with = "write_optional", deserialize_with = "read_listen")]
    pub listen: Option<SocketAddr>,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            database: None,
            batch: 5_000,
            flush: Duration::from_millis(200),
            retention_days: 30,
            listen: Some(SocketAddr::from(([0, 0, 0, 0], 9465))),
        }
    }
}

impl Config {
    /// The database history is kept in: `history.database`, else the subscription store's.
    pub fn history_database(&self) -> Option<String> {
        if let Some(url) = &self.history.database {
            return Some(url.expose().to_owned());
        }
        match Source::from_setting(&self.subscriptions) {
            Source::Postgres(url) => Some(url),
            Source::File(_) => None,
        }
    }
}

/// One API token: a secret reference (`env:NAME`, `file:PATH`), never the token itself, and
/// the tenant it is scoped to (`None`: an admin token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiToken {
    pub token: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl<'de> Deserialize<'de> for ApiToken {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            /// `env:NAME` or `acme=env:NAME`, as the environment writes it.
            Short(String),
            Table {
                token: String,
                #[serde(default)]
                tenant: Option<String>,
            },
        }
        Ok(match Written::deserialize(deserializer)? {
            Written::Short(text) => match text.split_once('=') {
                Some((tenant, token)) => ApiToken {
                    token: token.trim().to_owned(),
                    tenant: Some(tenant.trim().to_owned()),
                },
                None => ApiToken {
                    token: text,
                    tenant: None,
                },
            },
            Written::Table { token, tenant } => ApiToken { token, tenant },
        })
    }
}

/// Writes `None` as `""`, the form files and the environment use for "off" (and so the
/// defaults keep a key, and an environment name, for a setting that is off).
fn write_optional<T: Serialize, S: Serializer>(
    value: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => value.serialize(serializer),
        None => serializer.serialize_str(""),
    }
}

/// `""` is `None`; anything else must parse.
fn read_optional<'de, D: Deserializer<'de>, T, E: std::fmt::Display>(
    deserializer: D,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.is_empty() {
        return Ok(None);
    }
    parse(&text).map(Some).map_err(D::Error::custom)
}

fn read_listen<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SocketAddr>, D::Error> {
    read_optional(deserializer, |text| {
        text.parse().map_err(|_| {
            format!(
                "expected an address like \"0.0.0.0:9464\" (or \"\" to turn the endpoint off), \
                 found {text:?}"
            )
        })
    })
}

fn read_rate<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Rate>, D::Error> {
    read_optional(deserializer, |text| text.parse::<Rate>())
}

fn read_required_rate<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Rate, D::Error> {
    String::deserialize(deserializer)?
        .parse()
        .map_err(D::Error::custom)
}

fn read_proxy<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SecretUrl>, D::Error> {
    read_optional(deserializer, |text| {
        // The text is not repeated: it may hold a password.
        SecretUrl::parse(text).map_err(|e| {
            format!("expected a URL like \"http://proxy.internal:3128\" (or \"\" for none) ({e})")
        })
    })
}

fn read_database<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SecretUrl>, D::Error> {
    read_optional(deserializer, |text| {
        SecretUrl::parse(text).map_err(|e| {
            format!("expected a URL like \"postgres://hookrelay@db/hookrelay\" (or \"\") ({e})")
        })
    })
}

fn write_nets<S: Serializer>(nets: &[IpNet], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(nets.iter().map(ToString::to_string))
}

fn read_nets<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    Vec::<String>::deserialize(deserializer)?
        .iter()
        .map(|text| {
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    D::Error::custom(format!(
                        "{text:?} is not a CIDR like \"10.20.0.0/16\" or an address"
                    ))
                })
        })
        .collect()
}

/// The pace of a replay unless told otherwise: replayed events share the first-attempt lane
/// with every tenant's new events, so a replay must not outrun the workers.
pub const DEFAULT_REPLAY_RATE: &str = "1000/s";

/// [`DEFAULT_REPLAY_RATE`], as a rate.
pub fn default_replay_rate() -> Rate {
    Rate::shipped(1_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_replay_rate_reads_as_written() {
        assert_eq!(
            DEFAULT_REPLAY_RATE.parse::<Rate>(),
            Ok(default_replay_rate())
        );
    }
}
