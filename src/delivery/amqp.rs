//! The AMQP edge: publishes a signed delivery into a partner's RabbitMQ, with publisher
//! confirms and `mandatory`, over a small pool of connections per destination. What came back
//! is put in the HTTP edge's terms ([`AttemptResult`]), so the ladder, the breakers, the caps
//! and the attempt log treat both alike: a confirm is a 200, an exchange the broker does not
//! have (404 NOT_FOUND) a 410, anything else a failed attempt with the broker's words.
//!
//! Every address connected to passed the egress policy: the broker's host is resolved here,
//! each address checked, and the socket opened to a checked address (the name goes only to
//! TLS). A partner that takes TCP and never answers holds one attempt until the request
//! timeout, then its socket is shut, which ends lapin's I/O thread for it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::tcp::{AsyncTcpStream, OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use crate::broker::error::{Refusal, refused};
use crate::config::HttpConfig;
use crate::contract::envelope::EnvelopeId;
use crate::delivery::egress::{EgressPolicy, GuardedResolver, Lookup, ResolveError};
use crate::delivery::http::{AttemptReport, ClientPem, USER_AGENT_VALUE};
use crate::delivery::route::AttemptResult;
use crate::subscriptions::AmqpTarget;
use crate::subscriptions::destination;

/// Idle connections kept per destination: as many as the default endpoint cap lets be in use,
/// so a destination kept busy at its cap reuses every connection instead of opening one per
/// publish (the bench measured that at 2 % of a raw loop). More are opened while more attempts
/// are out (a higher cap) and closed when they come back to a full pool.
pub const MAX_IDLE_PER_DESTINATION: usize = 64;
/// An idle connection this old is closed: a partner is not held open for nothing.
pub const IDLE_CLOSE: Duration = Duration::from_secs(60);

/// One publish, ready to send.
pub struct AmqpMessage<'a> {
    /// The subscription: whose pool the connection comes from.
    pub subscription: &'a str,
    pub url: &'a reqwest::Url,
    pub target: &'a AmqpTarget,
    pub event_type: &'a str,
    pub id: &'a EnvelopeId,
    /// 1-based.
    pub attempt: u32,
    /// Seconds since the epoch; part of the signed content.
    pub timestamp: u64,
    /// The `webhook-signature` value.
    pub signature: String,
    pub body: Bytes,
    /// The subscription's own headers, as AMQP headers.
    pub extra: Vec<(String, String)>,
    /// The broker login (user name, password); lapin's `guest` when `None`.
    pub login: Option<(String, String)>,
    pub client_tls: Option<ClientPem>,
}

impl std::fmt::Debug for AmqpMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpMessage")
            .field("subscription", &self.subscription)
            .field("url", &crate::config::shown_url(self.url))
            .field("target", &self.target)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl AmqpMessage<'_> {
    /// The message's properties: the Standard Webhooks headers (as an HTTP receiver gets them),
    /// the attempt, the subscription's own headers; JSON, persistent, `message_id` the
    /// envelope id (the idempotency key), `type` the event type.
    pub fn properties(&self) -> BasicProperties {
        let mut headers = FieldTable::default();
        let mut put = |name: &str, value: String| {
            headers.insert(
                ShortString::from(name.to_owned()),
                AMQPValue::LongString(LongString::from(value)),
            );
        };
        for (name, value) in &self.extra {
            put(name, value.clone());
        }
        put("webhook-id", self.id.as_str().to_owned());
        put("webhook-timestamp", self.timestamp.to_string());
        put("webhook-signature", self.signature.clone());
        put("x-delivery-attempt", self.attempt.to_string());
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(self.id.as_str().into())
            .with_type(self.event_type.into())
            .with_timestamp(self.timestamp)
            .with_app_id(USER_AGENT_VALUE.into())
            .with_headers(headers)
    }

    /// What a pooled connection was opened with: a change (a rotated password or
    /// certificate, a new URL) opens new ones.
    fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.url.as_str().as_bytes());
        for part in self.login.iter().flat_map(|(u, p)| [u, p]) {
            h.update([0]);
            h.update(part.as_bytes());
        }
        if let Some(pem) = &self.client_tls {
            h.update([1]);
            h.update(pem.identity.as_bytes());
            h.update(pem.ca.as_deref().unwrap_or_default().as_bytes());
        }
        h.finalize().into()
    }
}

/// Shuts a connection's socket when dropped, through a duplicate of its descriptor that the
/// connecting closure leaves here: lapin's I/O thread then reads the end and stops, whatever
/// state the handshake was in.
#[derive(Default)]
struct Shutter(Arc<Mutex<Option<std::net::TcpStream>>>);

impl Drop for Shutter {
    fn drop(&mut self) {
        if let Some(socket) = self.0.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// An open connection and its confirm-mode channel.
struct Link {
    connection: Connection,
    channel: Channel,
    fingerprint: [u8; 32],
    idle_since: Instant,
    _shutter: Shutter,
}

impl Link {
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

/// Why a connection was not made.
#[derive(Debug)]
enum ConnectError {
    Denied(String),
    Failed(String),
}

/// Sends deliveries to partners' brokers. Clones share the pools.
#[derive(Clone)]
pub struct AmqpSender {
    config: HttpConfig,
    policy: Arc<EgressPolicy>,
    resolver: GuardedResolver,
    /// Idle links by subscription id.
    pools: Arc<Mutex<HashMap<String, Vec<Link>>>>,
}

impl std::fmt::Debug for AmqpSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSender").finish_non_exhaustive()
    }
}

impl AmqpSender {
    /// Timeouts are the HTTP edge's: `http.connect_timeout` for the connection (lookup, TCP,
    /// TLS, the AMQP handshake), `http.request_timeout` for all of an attempt.
    pub fn new(config: &HttpConfig, policy: Arc<EgressPolicy>, lookup: Arc<dyn Lookup>) -> Self {
        Self {
            resolver: GuardedResolver::new(Arc::clone(&policy), lookup)
                .with_timeout(config.connect_timeout),
            config: config.clone(),
            policy,
            pools: Arc::default(),
        }
    }

    /// Closes the idle connections of subscriptions `is_live` no longer knows, and those idle
    /// longer than [`IDLE_CLOSE`]; returns how many stay open.
    pub fn retain_live(&self, is_live: impl Fn(&str) -> bool) -> usize {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|id, links| {
            links.retain(|l| l.idle_since.elapsed() < IDLE_CLOSE && l.usable());
            is_live(id) && !links.is_empty()
        });
        pools.values().map(Vec::len).sum()
    }

    fn take(&self, subscription: &str, fingerprint: [u8; 32]) -> Option<Link> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let links = pools.get_mut(subscription)?;
        links.retain(|l| l.fingerprint == fingerprint && l.usable());
        while let Some(link) = links.pop() {
            if link.idle_since.elapsed() < IDLE_CLOSE {
                return Some(link);
            }
        }
        None
    }

    fn give_back(&self, subscription: &str, mut link: Link) {
        link.idle_since = Instant::now();
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let links = pools.entry(subscription.to_owned()).or_default();
        if links.len() < MAX_IDLE_PER_DESTINATION {
            links.push(link);
        }
    }

    /// Publishes one delivery and waits for the broker's confirm, all within
    /// `http.request_timeout`.
    pub async fn send(&self, message: AmqpMessage<'_>) -> AttemptReport {
        let started = Instant::now();
        let report = |result, excerpt: String| AttemptReport {
            result,
            latency: started.elapsed(),
            response_excerpt: excerpt,
        };
        if let Err(denied) = self.policy.check_url(message.url) {
            return report(
                AttemptResult::EgressDenied(denied.to_string()),
                String::new(),
            );
        }
        let limit = self.config.request_timeout;
        match tokio::time::timeout(limit, self.send_unbounded(&message)).await {
            Ok((result, excerpt)) => report(result, excerpt),
            Err(_) => report(AttemptResult::Timeout, String::new()),
        }
    }

    async fn send_unbounded(&self, message: &AmqpMessage<'_>) -> (AttemptResult, String) {
        let fingerprint = message.fingerprint();
        let link = match self.take(message.subscription, fingerprint) {
            Some(link) => link,
            None => match self.connect(message, fingerprint).await {
                Ok(link) => link,
                Err(ConnectError::Denied(why)) => {
                    return (AttemptResult::EgressDenied(why), String::new());
                }
                Err(ConnectError::Failed(why)) => {
                    return (AttemptResult::Transport(why), String::new());
                }
            },
        };
        let routing_key = message.target.routing_key_for(message.event_type);
        let published = async {
            let confirm = link
                .channel
                .basic_publish(
                    message.target.exchange.as_str().into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message.body,
                    message.properties(),
                )
                .await?;
            confirm.await
        }
        .await;
        let (result, excerpt) = match published {
            Ok(Confirmation::Ack(None)) => (
                AttemptResult::Response {
                    status: 200,
                    retry_after: None,
                },
                "confirmed".to_owned(),
            ),
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => (
                AttemptResult::Transport(format!(
                    "the partner's broker returned the message: {} {} (exchange {:?}, routing \
                     key {:?})",
                    returned.reply_code, returned.reply_text, message.target.exchange, routing_key
                )),
                String::new(),
            ),
            Ok(Confirmation::Nack(None)) => (
                AttemptResult::Transport(
                    "the partner's broker did not take the message (basic.nack)".into(),
                ),
                String::new(),
            ),
            Ok(Confirmation::NotRequested) => (
                AttemptResult::NotSent("the channel is not in confirm mode".into()),
                String::new(),
            ),
            Err(e) => return classify(&e, message.target),
        };
        self.give_back(message.subscription, link);
        (result, excerpt)
    }

    /// A new connection and confirm-mode channel to the destination, within
    /// `http.connect_timeout`.
    async fn connect(
        &self,
        message: &AmqpMessage<'_>,
        fingerprint: [u8; 32],
    ) -> Result<Link, ConnectError> {
        let limit = self.config.connect_timeout;
        let shutter = Shutter::default();
        let open = async {
            let addrs = self.addresses(message.url).await?;
            let uri = amqp_uri(message)?;
            let tls = tls_config(message.client_tls.as_ref());
            let domain = uri.authority.host.clone();
            let tls_wanted = uri.scheme == AMQPScheme::AMQPS;
            let held = Arc::clone(&shutter.0);
            let runtime = lapin::runtime::default_runtime()
                .map_err(|e| ConnectError::Failed(e.to_string()))?;
            let connection = Connection::connector(
                uri,
                runtime,
                async move |_uri, runtime| {
                    let stream = AsyncTcpStream::connect(&runtime, addrs.clone()).await?;
                    if let AsyncTcpStream::Plain(socket) = &stream
                        && let Ok(fd) = socket.get_ref().as_fd().try_clone_to_owned()
                    {
                        *held.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(std::net::TcpStream::from(fd));
                    }
                    if tls_wanted {
                        return Ok(stream.into_tls(&domain, tls.as_ref()).await?);
                    }
                    Ok(stream)
                },
                ConnectionProperties::default()
                    .with_connection_name(format!("hookrelay {}", message.subscription).into()),
            )
            .await
            .map_err(|e| ConnectError::Failed(connect_error(&e)))?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| ConnectError::Failed(connect_error(&e)))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| ConnectError::Failed(connect_error(&e)))?;
            Ok::<_, ConnectError>((connection, channel))
        };
        let (connection, channel) = tokio::time::timeout(limit, open).await.map_err(|_| {
            ConnectError::Failed(format!(
                "the partner's broker did not complete the connection within \
                 http.connect_timeout ({})",
                crate::units::fmt_duration(limit)
            ))
        })??;
        Ok(Link {
            connection,
            channel,
            fingerprint,
            idle_since: Instant::now(),
            _shutter: shutter,
        })
    }

    /// The broker's addresses, each allowed by the egress policy.
    async fn addresses(&self, url: &reqwest::Url) -> Result<Vec<SocketAddr>, ConnectError> {
        let port = destination::port(url).unwrap_or(5672);
        let ips: Vec<IpAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
            Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
            Some(url::Host::Domain(host)) => match self.resolver.resolve_checked(host).await {
                Ok(ips) => ips,
                Err(ResolveError::Denied(d)) => return Err(ConnectError::Denied(d.to_string())),
                Err(e) => return Err(ConnectError::Failed(e.to_string())),
            },
            None => return Err(ConnectError::Failed("the url has no host".into())),
        };
        Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }
}

/// The URI lapin connects with: the url's scheme, host, port and vhost, and the login.
fn amqp_uri(message: &AmqpMessage<'_>) -> Result<AMQPUri, ConnectError> {
    let mut uri: AMQPUri = message
        .url
        .as_str()
        .parse()
        .map_err(|e| ConnectError::Failed(format!("not an AMQP URI: {e}")))?;
    if let Some((username, password)) = &message.login {
        uri.authority.userinfo = AMQPUserInfo {
            username: username.clone(),
            password: password.clone(),
        };
    }
    Ok(uri)
}

fn tls_config(pem: Option<&ClientPem>) -> OwnedTLSConfig {
    OwnedTLSConfig {
        // The certificate chain and the key travel as one PEM; each reader takes its part.
        identity: pem.map(|p| OwnedIdentity::PKCS8 {
            pem: p.identity.as_bytes().to_vec(),
            key: p.identity.as_bytes().to_vec(),
        }),
        cert_chain: pem.and_then(|p| p.ca.as_deref().map(str::to_owned)),
    }
}

/// A failed connection in words: the broker's refusal (a wrong login is 403
/// ACCESS_REFUSED), or the I/O error.
fn connect_error(e: &lapin::Error) -> String {
    match refused(e) {
        Some(Refusal::AccessRefused) => format!("access refused by the partner's broker: {e}"),
        _ => format!("cannot connect to the partner's broker: {e}"),
    }
}

/// A publish the broker refused: an exchange it does not have is gone (as a 410), a refusal
/// of access or anything else a failed attempt.
fn classify(e: &lapin::Error, target: &AmqpTarget) -> (AttemptResult, String) {
    match refused(e) {
        Some(Refusal::NotFound) => (
            AttemptResult::Response {
                status: 410,
                retry_after: None,
            },
            format!(
                "the partner's broker has no exchange {:?}: {e}",
                target.exchange
            ),
        ),
        Some(Refusal::AccessRefused) => (
            AttemptResult::Transport(format!(
                "access refused by the partner's broker on exchange {:?}: {e}",
                target.exchange
            )),
            String::new(),
        ),
        _ => (
            AttemptResult::Transport(format!("the publish failed: {e}")),
            String::new(),
        ),
    }
}
