//! Typed configuration: embedded defaults, then a TOML file, then `HOOKRELAY_*` environment
//! variables, then [`Config::validate`] for the rules that span fields.
//!
//! Every setting `key` of section `[section]` can be overridden by `HOOKRELAY_<SECTION>_<KEY>`;
//! the top-level `ladder` and `subscriptions` paths by `HOOKRELAY_LADDER` and
//! `HOOKRELAY_SUBSCRIPTIONS`; `HOOKRELAY_CONFIG` names the file. The environment is read through
//! [`Env`] so tests pass a map instead of mutating the process environment.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

use crate::units::{Rate, fmt_duration};

/// Variables with a meaning of their own rather than `<SECTION>_<KEY>`.
const CONFIG_VAR: &str = "HOOKRELAY_CONFIG";
const ENV_PREFIX: &str = "HOOKRELAY_";

/// What went wrong while loading or validating configuration. Every variant names its source.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid setting {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

impl ConfigError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// Where settings come from besides files. `ProcessEnv` in production, a map in tests.
pub trait Env: Send + Sync {
    fn var(&self, name: &str) -> Option<String>;
    /// Every variable name starting with `HOOKRELAY_`.
    fn hookrelay_names(&self) -> Vec<String>;
}

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
    fn hookrelay_names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.starts_with(ENV_PREFIX))
            .collect()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
    fn hookrelay_names(&self) -> Vec<String> {
        self.keys()
            .filter(|k| k.starts_with(ENV_PREFIX))
            .cloned()
            .collect()
    }
}

/// How a URL that may carry secrets is shown anywhere (errors, logs, headers, events):
/// `scheme://host[:port]/path`. User information and the query (where tokens travel) are left
/// out, and so is the fragment; a URL without a host shows its scheme alone.
pub fn shown_url(url: &Url) -> String {
    match url.host_str() {
        Some(host) => {
            let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}{}", url.scheme(), url.path())
        }
        None => format!("{}:", url.scheme()),
    }
}

/// A URL that may carry credentials: `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(Url);

impl SecretUrl {
    pub fn parse(text: &str) -> Result<Self, url::ParseError> {
        Url::parse(text).map(Self)
    }

    /// A URL this file writes as a default; the defaults are parsed by every test that loads a
    /// configuration.
    fn shipped(text: &'static str) -> Self {
        Self::parse(text).expect("the shipped default URLs parse")
    }

    /// The full URL, credentials included. Only for handing to a client library.
    pub fn expose(&self) -> &str {
        self.0.as_str()
    }

    /// The parsed URL, credentials included. Only for handing to a client library.
    pub fn expose_url(&self) -> &Url {
        &self.0
    }

    /// The URL with no user information at all, for showing as a link.
    pub fn without_credentials(&self) -> String {
        let mut url = self.0.clone();
        if url.set_username("").is_err() || url.set_password(None).is_err() {
            return self.redacted();
        }
        url.to_string()
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        let text = self.0.as_str();
        if self.0.cannot_be_a_base() {
            // Written without `scheme://` (`user:pass@host:port` parses as scheme `user`):
            // whatever precedes the `@` may be a password.
            return match text.rfind('@') {
                Some(at) => format!("***{}", &text[at..]),
                None => text.to_owned(),
            };
        }
        let mut url = self.0.clone();
        if !url.username().is_empty() || url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        url.to_string()
    }
}

impl FromStr for SecretUrl {
    type Err = url::ParseError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl From<Url> for SecretUrl {
    fn from(url: Url) -> Self {
        Self(url)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // The text is not repeated: it may hold a password.
        Self::parse(&text).map_err(|e| D::Error::custom(format!("expected a URL ({e})")))
    }
}

/// The whole configuration of one hookrelay process.
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
    pub reload: ReloadConfig,
    pub egress: EgressConfig,
    pub endpoints: EndpointConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
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
            reload: ReloadConfig::default(),
            egress: EgressConfig::default(),
            endpoints: EndpointConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
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

/// The PostgreSQL subscription store (used when `subscriptions` is a `postgres://` URL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// References (`env:NAME`, `file:PATH`) to the keys that seal stored secrets, newest first:
    /// the first seals, all open. Each key is 32 bytes in base64 (`hookrelay store
    /// generate-key`). Needed by the API, and by workers once the store holds sealed secrets.
    pub keys: Vec<String>,
    /// How often a worker reads the whole store again, besides the changes it is notified of.
    #[serde(with = "humantime_serde")]
    pub resync: Duration,
    /// The longest a connection to the store may take to open.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            resync: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
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
            tenant_replay_rate: crate::ops::replay::default_rate(),
            replay_index_max: 500_000,
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
        match crate::store::Source::from_setting(&self.subscriptions) {
            crate::store::Source::Postgres(url) => Some(url),
            crate::store::Source::File(_) => None,
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

impl Config {
    /// Defaults, then the file named by `file` or `HOOKRELAY_CONFIG` (if any), then the
    /// environment, then validation.
    pub fn load(file: Option<&Path>, env: &dyn Env) -> Result<Self, ConfigError> {
        let mut table = toml::Table::try_from(Config::default()).map_err(|e| {
            ConfigError::invalid("defaults", format!("cannot serialise defaults: {e}"))
        })?;
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| env.var(CONFIG_VAR).map(PathBuf::from));
        if let Some(path) = &file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let overlay: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
            merge(&mut table, overlay);
        }
        apply_env(&mut table, env)?;
        let config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: file.unwrap_or_else(|| PathBuf::from("(defaults and environment)")),
                    message: e.to_string(),
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Rules that span fields. Called by [`Config::load`]; call it again after editing a config
    /// in code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.amqp
            .url
            .expose()
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|e| ConfigError::invalid("amqp.url", format!("not an AMQP URI: {e}")))?;
        let management = self.management.url.expose_url();
        if !matches!(management.scheme(), "http" | "https") || !management.has_host() {
            return Err(ConfigError::invalid(
                "management.url",
                format!(
                    "expected an http(s) URL with a host, like http://user:pass@host:15672; \
                     found {}",
                    self.management.url
                ),
            ));
        }
        for (field, value) in [
            ("amqp.confirm_timeout", self.amqp.confirm_timeout),
            ("amqp.reconnect_min", self.amqp.reconnect_min),
            ("http.connect_timeout", self.http.connect_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("http.token_timeout", self.http.token_timeout),
            ("broker.consumer_timeout", self.broker.consumer_timeout),
            ("worker.shutdown_grace", self.worker.shutdown_grace),
            ("reload.interval", self.reload.interval),
            ("metrics.poll_interval", self.metrics.poll_interval),
            ("store.resync", self.store.resync),
            ("store.connect_timeout", self.store.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::invalid(field, "must be longer than zero"));
            }
        }
        for key in &self.store.keys {
            crate::delivery::subscriptions::SecretRef::parse(key)
                .map_err(|e| ConfigError::invalid("store.keys", e))?;
        }
        if self.amqp.reconnect_max < self.amqp.reconnect_min {
            return Err(ConfigError::invalid(
                "amqp.reconnect_max",
                "must not be shorter than amqp.reconnect_min",
            ));
        }
        if self.endpoints.max_concurrent == 0
            || self.endpoints.max_concurrent_per_host == 0
            || self.endpoints.breaker_failures == 0
        {
            return Err(ConfigError::invalid(
                "endpoints.max_concurrent/max_concurrent_per_host/breaker_failures",
                "must be at least 1",
            ));
        }
        if !(self.endpoints.lane_share > 0.0 && self.endpoints.lane_share <= 1.0) {
            return Err(ConfigError::invalid(
                "endpoints.lane_share",
                "must be above 0 and at most 1 (a fraction of a lane's prefetch; 1 for no limit \
                 but the caps)",
            ));
        }
        if self.endpoints.busy_wait > Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "endpoints.busy_wait",
                "must be at most 1s: the waiting delivery holds a slot of its lane, which other \
                 tenants share; a slower endpoint's deliveries belong in the deferral queues",
            ));
        }
        if self.worker.in_flight < 2 {
            return Err(ConfigError::invalid(
                "worker.in_flight",
                "must be at least 2 (one delivery per lane)",
            ));
        }
        if !(self.worker.retry_share > 0.0 && self.worker.retry_share < 1.0) {
            return Err(ConfigError::invalid(
                "worker.retry_share",
                format!(
                    "must be between 0 and 1 (exclusive), as in 0.3; found {}",
                    self.worker.retry_share
                ),
            ));
        }
        if self.limits.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "limits.max_body_bytes",
                "must be at least 1",
            ));
        }
        if self.history.batch == 0 || self.history.retention_days == 0 {
            return Err(ConfigError::invalid(
                "history.batch/retention_days",
                "must be at least 1",
            ));
        }
        if self.history.flush.is_zero() {
            return Err(ConfigError::invalid(
                "history.flush",
                "must be longer than zero",
            ));
        }
        if let Some(url) = &self.history.database
            && !matches!(url.expose_url().scheme(), "postgres" | "postgresql")
        {
            return Err(ConfigError::invalid(
                "history.database",
                format!("expected a postgres:// URL; found {url}"),
            ));
        }
        if self.api.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "api.max_body_bytes",
                "must be at least 1",
            ));
        }
        if self.api.max_subscriptions_per_tenant == 0
            || self.api.max_event_types == 0
            || self.api.writes_per_minute == 0
            || self.api.test_events_per_minute == 0
            || self.api.replays_running == 0
            || self.api.replays_per_tenant == 0
            || self.api.replay_index_max == 0
        {
            return Err(ConfigError::invalid(
                "api.max_subscriptions_per_tenant/max_event_types/writes_per_minute/\
                 test_events_per_minute/replays_running/replays_per_tenant/replay_index_max",
                "must be at least 1 (a large number for practically no limit)",
            ));
        }
        if self.api.replays_per_tenant > self.api.replays_running {
            return Err(ConfigError::invalid(
                "api.replays_per_tenant",
                "must not exceed api.replays_running",
            ));
        }
        if self.api.tenant_replay_window.is_zero() {
            return Err(ConfigError::invalid(
                "api.tenant_replay_window",
                "must be longer than zero",
            ));
        }
        for token in &self.api.tokens {
            crate::delivery::subscriptions::SecretRef::parse(&token.token)
                .map_err(|e| ConfigError::invalid("api.tokens", format!("token: {e}")))?;
            if let Some(tenant) = &token.tenant {
                crate::contract::envelope::check_tenant(tenant)
                    .map_err(|e| ConfigError::invalid("api.tokens", format!("tenant: {e}")))?;
            }
        }
        let lease = self.lease_window();
        if lease >= self.broker.consumer_timeout {
            return Err(ConfigError::invalid(
                "broker.consumer_timeout",
                format!(
                    "the longest a delivery is held before its outcome is first published (an \
                     OAuth2 token {} + the attempt, lookup through a proxy {} + connect {} + \
                     request {}, + one publish {} + slack {} = {}) must stay below the broker's consumer_timeout ({}); a \
                     publish that fails is tried again only while another fits before \
                     consumer_timeout less the slack. Raise consumer_timeout in rabbitmq.conf, or \
                     lower the timeouts",
                    fmt_duration(self.http.token_timeout),
                    fmt_duration(self.lookup_budget()),
                    fmt_duration(self.http.connect_timeout),
                    fmt_duration(self.http.request_timeout),
                    fmt_duration(self.publish_budget()),
                    fmt_duration(self.worker.lease_slack),
                    fmt_duration(lease),
                    fmt_duration(self.broker.consumer_timeout),
                ),
            ));
        }
        if self.worker.shutdown_grace <= self.attempt_budget() {
            return Err(ConfigError::invalid(
                "worker.shutdown_grace",
                format!(
                    "must be longer than one attempt and its publish (OAuth2 token + lookup \
                     through a proxy + connect + request + confirm = {}) so a drain can finish \
                     what is in flight",
                    fmt_duration(self.attempt_budget())
                ),
            ));
        }
        Ok(())
    }

    /// The longest one delivery can be held before its outcome is first published, and that
    /// publish: a wait for a fast endpoint's slot (`endpoints.busy_wait`), an OAuth2 token's
    /// fetch (for subscriptions with one), the HTTP attempt and one publish
    /// ([`Config::publish_budget`]). Nothing else waits while holding the delivery: an endpoint
    /// that is slow, stuck or down defers at once, unpaced (a deferral is one confirmed
    /// publish, like a retry). A publish that fails is tried again within [`Config::lease`],
    /// not within this.
    pub fn attempt_budget(&self) -> Duration {
        self.endpoints.busy_wait
            + self.http.token_timeout
            + self.lookup_budget()
            + self.http.connect_timeout
            + self.http.request_timeout
            + self.publish_budget()
    }

    /// Through a proxy, hookrelay resolves and checks the target itself before the request
    /// (the proxy would resolve it out of the policy's sight), bounded by `http.connect_timeout`;
    /// without one the lookup is part of the connect.
    pub fn lookup_budget(&self) -> Duration {
        match self.egress.proxy {
            Some(_) => self.http.connect_timeout,
            None => Duration::ZERO,
        }
    }

    /// The longest one confirmed publish may take: one deadline covers the wait for a free
    /// channel, opening it, handing the message over and its confirm (`Publisher::publish`).
    pub fn publish_budget(&self) -> Duration {
        self.amqp.confirm_timeout
    }

    /// How long after it is handed over a delivery may be held: the broker's `consumer_timeout`
    /// less `worker.lease_slack`. A republish that fails is tried again within it.
    pub fn lease(&self) -> Duration {
        self.broker
            .consumer_timeout
            .saturating_sub(self.worker.lease_slack)
    }

    /// The attempt budget plus slack: what the broker's `consumer_timeout` must exceed.
    pub fn lease_window(&self) -> Duration {
        self.attempt_budget() + self.worker.lease_slack
    }

    /// Every environment variable that overrides a setting, in `section.key` order.
    pub fn env_names() -> Vec<String> {
        let mut names = vec![CONFIG_VAR.to_owned()];
        if let Ok(table) = toml::Table::try_from(Config::default()) {
            names.extend(env_slots(&table).into_keys());
        }
        names
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
fn read_optional<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    parse: impl FnOnce(&str) -> Result<T, String>,
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

fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// `HOOKRELAY_<SECTION>_<KEY>` -> (section, key) for every setting the defaults have.
fn env_slots(table: &toml::Table) -> BTreeMap<String, (Option<String>, String)> {
    let mut slots = BTreeMap::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(section) => {
                for inner in section.keys() {
                    let var = format!("{ENV_PREFIX}{key}_{inner}").to_uppercase();
                    slots.insert(var, (Some(key.clone()), inner.clone()));
                }
            }
            _ => {
                let var = format!("{ENV_PREFIX}{key}").to_uppercase();
                slots.insert(var, (None, key.clone()));
            }
        }
    }
    slots
}

fn apply_env(table: &mut toml::Table, env: &dyn Env) -> Result<(), ConfigError> {
    let slots = env_slots(table);
    let mut names = env.hookrelay_names();
    names.sort();
    for var in names {
        if var == CONFIG_VAR {
            continue;
        }
        let Some((section, key)) = slots.get(&var) else {
            return Err(ConfigError::Env {
                var,
                message: format!(
                    "not a hookrelay setting; known variables: {}",
                    Config::env_names().join(", ")
                ),
            });
        };
        let Some(raw) = env.var(&var) else { continue };
        let target = match section {
            Some(s) => match table.get_mut(s).and_then(toml::Value::as_table_mut) {
                Some(section) => section,
                // The slots come from this very table; an error, not a panic, should that change.
                None => {
                    return Err(ConfigError::Env {
                        var,
                        message: format!("the config file sets {s} to a value, not a section"),
                    });
                }
            },
            None => &mut *table,
        };
        let typed = match target.get(key.as_str()) {
            Some(toml::Value::Integer(_)) => raw
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    message: format!("expected a whole number, found {raw:?}"),
                })?,
            // Lists are comma-separated: HOOKRELAY_EGRESS_ALLOW="127.0.0.0/8,10.20.0.0/16".
            Some(toml::Value::Array(_)) => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|item| !item.is_empty())
                    .map(|item| match item.parse::<i64>() {
                        Ok(n) => toml::Value::Integer(n),
                        Err(_) => toml::Value::String(item.to_owned()),
                    })
                    .collect(),
            ),
            Some(toml::Value::Float(_)) => raw
                .trim()
                .parse::<f64>()
                .map(toml::Value::Float)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    message: format!("expected a number such as 0.3, found {raw:?}"),
                })?,
            Some(toml::Value::Boolean(_)) => raw
                .trim()
                .parse::<bool>()
                .map(toml::Value::Boolean)
                .map_err(|_| ConfigError::Env {
                var: var.clone(),
                message: format!("expected true or false, found {raw:?}"),
            })?,
            _ => toml::Value::String(raw),
        };
        target.insert(key.clone(), typed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_validate_and_keep_the_lease_rule() {
        let config = Config::load(None, &env(&[])).unwrap();
        assert_eq!(config, Config::default());
        // The shipped defaults: 5s + 3s + 10s + 5s + 30s slack is well below the 5m
        // consumer_timeout that rabbitmq/rabbitmq.conf sets.
        assert!(config.lease_window() * 4 <= config.broker.consumer_timeout);
    }

    #[test]
    fn the_lease_rule_counts_every_wait_a_delivery_can_make() {
        let defaults = Config::default();
        // A fast endpoint's slot 20ms, an OAuth2 token 5s, the attempt (3s + 15s), one publish
        // under one deadline 5s, then 30s slack. No deferral pacing: it would hold a lane slot.
        assert_eq!(defaults.attempt_budget(), Duration::from_millis(28_020));
        assert_eq!(defaults.lease_window(), Duration::from_millis(58_020));
        assert!(defaults.validate().is_ok());
        assert_eq!(defaults.lease(), Duration::from_secs(270));
        let mut slow = Config::default();
        slow.http.request_timeout = Duration::from_secs(300);
        let refused = slow.validate().unwrap_err().to_string();
        assert!(
            refused.contains("broker.consumer_timeout") && refused.contains("request 5m"),
            "{refused}"
        );
        // Through a proxy, the pre-send lookup of the target (bounded by the connect timeout)
        // comes before the attempt's own connect.
        let proxied = Config::load(
            None,
            &env(&[("HOOKRELAY_EGRESS_PROXY", "http://proxy.internal:3128")]),
        )
        .unwrap();
        // slot 0.02 + token 5 + lookup 3 + connect 3 + request 15 + confirm 5
        assert_eq!(proxied.attempt_budget(), Duration::from_millis(31_020));
        // The drain must have room for an attempt and its publish.
        let mut short_grace = Config::default();
        short_grace.worker.shutdown_grace = Duration::from_secs(15);
        let refused = short_grace.validate().unwrap_err().to_string();
        assert!(
            refused.contains("worker.shutdown_grace") && refused.contains("28s"),
            "{refused}"
        );
    }

    #[test]
    fn shipped_rabbitmq_conf_matches_the_default_consumer_timeout() {
        let conf = include_str!("../rabbitmq/rabbitmq.conf");
        let ms: u64 = conf
            .lines()
            .find_map(|l| l.trim().strip_prefix("consumer_timeout"))
            .and_then(|rest| rest.trim().strip_prefix('='))
            .map(|v| v.trim().parse().unwrap())
            .expect("rabbitmq.conf sets consumer_timeout");
        assert_eq!(
            Duration::from_millis(ms),
            BrokerConfig::default().consumer_timeout
        );
        assert!(Config::default().lease_window() < Duration::from_millis(ms));
    }

    #[test]
    fn environment_overrides_the_file_and_is_typed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[http]\nrequest_timeout = \"12s\"\n[worker]\nin_flight = 7\n",
        )
        .unwrap();
        let config = Config::load(
            Some(&path),
            &env(&[
                ("HOOKRELAY_WORKER_IN_FLIGHT", "9"),
                ("HOOKRELAY_WORKER_RETRY_SHARE", "0.25"),
                ("HOOKRELAY_AMQP_URL", "amqp://u:p@h:1/v"),
                ("HOOKRELAY_LADDER", "x.toml"),
                ("HOOKRELAY_EGRESS_ALLOW", "127.0.0.0/8, 10.20.0.0/16"),
                ("HOOKRELAY_EGRESS_ALLOWED_PORTS", "443,8443"),
                ("HOOKRELAY_EGRESS_HTTPS_ONLY", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.egress.allow,
            vec![
                "127.0.0.0/8".parse::<IpNet>().unwrap(),
                "10.20.0.0/16".parse().unwrap()
            ]
        );
        assert_eq!(config.egress.allowed_ports, vec![443, 8443]);
        assert!(config.egress.https_only);
        assert_eq!(config.http.request_timeout, Duration::from_secs(12));
        assert_eq!(config.worker.in_flight, 9);
        assert_eq!(config.worker.retry_share, 0.25);
        assert_eq!(config.amqp.url.expose(), "amqp://u:p@h:1/v");
        assert_eq!(config.ladder, PathBuf::from("x.toml"));
    }

    #[test]
    fn errors_name_the_field() {
        let err = Config::load(None, &env(&[("HOOKRELAY_WORKER_IN_FLIGHT", "lots")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("HOOKRELAY_WORKER_IN_FLIGHT: expected a whole number")
        );

        let err = Config::load(None, &env(&[("HOOKRELAY_WORKR_PREFETCH", "1")])).unwrap_err();
        assert!(err.to_string().contains("not a hookrelay setting"));

        let err = Config::load(
            None,
            &env(&[("HOOKRELAY_HTTP_REQUEST_TIMEOUT", "10 parsecs")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("request_timeout"), "{err}");

        let err =
            Config::load(None, &env(&[("HOOKRELAY_BROKER_CONSUMER_TIMEOUT", "20s")])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid setting broker.consumer_timeout"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[http]\nrequest_timout = \"20s\"\n").unwrap();
        let err = Config::load(Some(&path), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("request_timout"), "{err}");
    }

    #[test]
    fn a_management_url_must_be_http_with_a_host() {
        for bad in [
            "localhost:15672",
            "ftp://h:21",
            "guest:guest@localhost:15672",
        ] {
            let err = Config::load(None, &env(&[("HOOKRELAY_MANAGEMENT_URL", bad)])).unwrap_err();
            let shown = err.to_string();
            assert!(
                shown.starts_with("invalid setting management.url"),
                "{bad}: {shown}"
            );
            assert!(!shown.contains("guest:guest"), "{shown}");
        }
    }

    #[test]
    fn a_lane_share_is_a_fraction_above_zero() {
        for bad in ["0", "1.5", "-0.25", "NaN"] {
            let err = Config::load(None, &env(&[("HOOKRELAY_ENDPOINTS_LANE_SHARE", bad)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("invalid setting endpoints.lane_share"),
                "{bad}: {err}"
            );
        }
        for good in ["0.1", "1"] {
            let config =
                Config::load(None, &env(&[("HOOKRELAY_ENDPOINTS_LANE_SHARE", good)])).unwrap();
            assert_eq!(config.endpoints.lane_share.to_string(), good);
        }
    }

    #[test]
    fn typed_settings_name_the_field_and_what_they_expect() {
        for (var, value, expected) in [
            ("HOOKRELAY_LOG_FORMAT", "xml", "expected `text` or `json`"),
            ("HOOKRELAY_METRICS_LISTEN", "port 9464", "an address like"),
            ("HOOKRELAY_EGRESS_ALLOW", "not-a-cidr", "is not a CIDR"),
            (
                "HOOKRELAY_EGRESS_PROXY",
                "http://u:s3cret@[::",
                "a URL like",
            ),
            (
                "HOOKRELAY_MANAGEMENT_URL",
                "http://u:s3cret@[::",
                "expected a URL",
            ),
        ] {
            let err = Config::load(None, &env(&[(var, value)])).unwrap_err();
            let shown = err.to_string();
            let field = var
                .trim_start_matches("HOOKRELAY_")
                .to_lowercase()
                .replacen('_', ".", 1);
            assert!(shown.contains(&field), "{var}: {shown}");
            assert!(shown.contains(expected), "{var}: {shown}");
            assert!(!shown.contains("s3cret"), "{var}: {shown}");
        }
    }

    #[test]
    fn the_api_quotas_and_replay_bounds_are_typed_and_checked() {
        let config = Config::load(
            None,
            &env(&[
                ("HOOKRELAY_API_TENANT_REPLAY_RATE", "600/m"),
                ("HOOKRELAY_API_TENANT_REPLAY_WINDOW", "2h"),
                ("HOOKRELAY_API_REPLAYS_PER_TENANT", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(config.api.tenant_replay_rate, "10/s".parse().unwrap());
        assert_eq!(config.api.tenant_replay_window, Duration::from_secs(7200));
        assert_eq!(config.api.replays_per_tenant, 2);
        for (var, value, expected) in [
            ("HOOKRELAY_API_TENANT_REPLAY_RATE", "1e-300/s", "between"),
            ("HOOKRELAY_API_REPLAYS_PER_TENANT", "5", "must not exceed"),
            ("HOOKRELAY_API_REPLAYS_RUNNING", "0", "at least 1"),
            ("HOOKRELAY_API_REPLAY_INDEX_MAX", "0", "at least 1"),
            ("HOOKRELAY_API_WRITES_PER_MINUTE", "0", "at least 1"),
            ("HOOKRELAY_API_MAX_EVENT_TYPES", "0", "at least 1"),
            (
                "HOOKRELAY_API_TENANT_REPLAY_WINDOW",
                "0s",
                "longer than zero",
            ),
        ] {
            let err = Config::load(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.to_string().contains(expected), "{var}: {err}");
        }
    }

    #[test]
    fn empty_turns_metrics_and_the_proxy_off() {
        let config = Config::load(
            None,
            &env(&[
                ("HOOKRELAY_METRICS_LISTEN", ""),
                ("HOOKRELAY_EGRESS_PROXY", ""),
                ("HOOKRELAY_LOG_FORMAT", "json"),
                ("HOOKRELAY_EGRESS_ALLOW", "10.1.2.3"),
            ]),
        )
        .unwrap();
        assert_eq!(config.metrics.listen, None);
        assert_eq!(config.egress.proxy, None);
        assert_eq!(config.log.format, LogFormat::Json);
        // A bare address is a network of one.
        assert_eq!(
            config.egress.allow,
            vec!["10.1.2.3/32".parse::<IpNet>().unwrap()]
        );
        assert_eq!(
            Config::default().metrics.listen,
            Some("0.0.0.0:9464".parse().unwrap())
        );
        // Off still has a key, so it still has an environment name.
        assert!(
            Config::env_names()
                .iter()
                .any(|n| n == "HOOKRELAY_EGRESS_PROXY")
        );
    }

    #[test]
    fn a_shown_url_has_no_user_information_query_or_fragment() {
        let shown = |s: &str| shown_url(&Url::parse(s).unwrap());
        assert_eq!(
            shown("https://user:pw@hooks.example:8443/a/b?token=t&x=1#frag"),
            "https://hooks.example:8443/a/b"
        );
        assert_eq!(shown("http://u@[::1]/"), "http://[::1]/");
        assert_eq!(shown("mailto:someone@example.com"), "mailto:");
    }

    #[test]
    fn a_proxy_password_never_reaches_debug_output() {
        let config = Config::load(
            None,
            &env(&[(
                "HOOKRELAY_EGRESS_PROXY",
                "http://ops:s3cret@proxy.internal:3128",
            )]),
        )
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("ops:***@proxy.internal:3128"), "{shown}");
        let proxy = config.egress.proxy.unwrap();
        assert_eq!(proxy.expose(), "http://ops:s3cret@proxy.internal:3128/");
        assert_eq!(proxy.without_credentials(), "http://proxy.internal:3128/");
    }

    #[test]
    fn the_retry_share_splits_a_budget() {
        let w = WorkerConfig::default();
        assert_eq!(w.split(300), (210, 90));
        assert_eq!(w.split(500), (350, 150));
        assert_eq!(w.split(2), (1, 1));
        assert_eq!(w.split(10), (7, 3));
        let err = Config::load(None, &env(&[("HOOKRELAY_WORKER_RETRY_SHARE", "1.5")])).unwrap_err();
        assert!(err.to_string().contains("worker.retry_share"), "{err}");
    }

    #[test]
    fn credentials_never_reach_debug_output() {
        let config = Config::default();
        let shown = format!("{config:?}");
        assert!(!shown.contains("guest:guest"), "{shown}");
        assert!(shown.contains("guest:***@127.0.0.1:5672"));
        // Written without a scheme, the part before the `@` may be a password.
        let bare = SecretUrl::parse("guest:s3cret@localhost:15672").unwrap();
        assert_eq!(bare.to_string(), "***@localhost:15672");
        assert_eq!(bare.without_credentials(), "***@localhost:15672");
    }

    #[test]
    fn api_tokens_are_references_with_an_optional_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[api]\nlisten = \"0.0.0.0:9000\"\ntokens = [{ token = \"env:ADMIN\" }, \
             { token = \"file:/run/acme\", tenant = \"acme\" }]\n",
        )
        .unwrap();
        let config = Config::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(config.api.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.api.tokens[1].tenant.as_deref(), Some("acme"));
        let config = Config::load(
            None,
            &env(&[
                ("HOOKRELAY_API_TOKENS", "env:ADMIN, acme=env:ACME"),
                ("HOOKRELAY_API_MAX_BODY_BYTES", "1024"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.api.tokens,
            vec![
                ApiToken {
                    token: "env:ADMIN".into(),
                    tenant: None
                },
                ApiToken {
                    token: "env:ACME".into(),
                    tenant: Some("acme".into())
                }
            ]
        );
        assert_eq!(config.api.max_body_bytes, 1024);
        for (var, value, field) in [
            ("HOOKRELAY_API_TOKENS", "s3cret-token", "api.tokens"),
            ("HOOKRELAY_API_TOKENS", "ac.me=env:X", "api.tokens"),
            ("HOOKRELAY_API_MAX_BODY_BYTES", "0", "api.max_body_bytes"),
            ("HOOKRELAY_STORE_KEYS", "not-a-reference", "store.keys"),
        ] {
            let err = Config::load(None, &env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{var}: {err}");
            assert!(!err.contains("s3cret"), "{var}: {err}");
        }
    }

    #[test]
    fn every_setting_has_an_environment_name() {
        let names = Config::env_names();
        for expected in [
            "HOOKRELAY_AMQP_URL",
            "HOOKRELAY_MANAGEMENT_URL",
            "HOOKRELAY_LADDER",
            "HOOKRELAY_SUBSCRIPTIONS",
            "HOOKRELAY_CONFIG",
            "HOOKRELAY_HTTP_CONNECT_TIMEOUT",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing");
        }
    }
}
