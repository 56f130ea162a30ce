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

/// Links (a connection and its confirm-mode channel) per destination. Publishes are pipelined:
/// every attempt on a link publishes at once and waits for its own confirm, so a few links
/// carry a destination at its cap; a new one is opened only while every link has a publish
/// out, one connect at a time.
pub const LINKS_PER_DESTINATION: usize = 4;
/// A link with nothing in flight for this long is closed: a partner is not held open for
/// nothing.
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

/// An open connection and its confirm-mode channel, shared by the attempts in flight on it.
struct Link {
    connection: Connection,
    channel: Channel,
    fingerprint: [u8; 32],
    _shutter: Shutter,
}

impl Link {
    /// False once the broker closed the channel (a 404 does) or the connection broke.
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

/// A link in a pool; the pool's `Arc` plus one per attempt in flight on it.
struct Pooled {
    link: Arc<Link>,
    last_used: Instant,
}

impl Pooled {
    fn in_flight(&self) -> usize {
        Arc::strong_count(&self.link) - 1
    }
}

/// How a connect round ended, as its waiters learn it.
type RoundResult = Option<Result<(), ConnectError>>;

/// A destination's links, and the connect under way if there is one (the connect guard:
/// attempts that find no link wait for it instead of each opening a connection).
#[derive(Default)]
struct Pool {
    links: Vec<Pooled>,
    connecting: Option<tokio::sync::watch::Receiver<RoundResult>>,
}

/// Why a connection was not made.
#[derive(Debug, Clone)]
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
    /// Links by subscription id.
    pools: Arc<Mutex<HashMap<String, Pool>>>,
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

    /// Closes the links of subscriptions `is_live` no longer knows, those with nothing in
    /// flight for [`IDLE_CLOSE`] and those the broker closed; returns how many stay open. A
    /// closed link's socket is shut when its last attempt lets go of it.
    pub fn retain_live(&self, is_live: impl Fn(&str) -> bool) -> usize {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|id, pool| {
            pool.links.retain(|l| {
                (l.in_flight() > 0 || l.last_used.elapsed() < IDLE_CLOSE) && l.link.usable()
            });
            is_live(id) && (!pool.links.is_empty() || pool.connecting.is_some())
        });
        pools.values().map(|p| p.links.len()).sum()
    }

    /// A link to publish on: the least busy one, a new one while all are busy and the pool is
    /// not full, or the one another attempt is opening. Waits hold no lock; the caller's
    /// timeout bounds them.
    async fn lease(
        &self,
        message: &AmqpMessage<'_>,
        fingerprint: [u8; 32],
    ) -> Result<Lease, ConnectError> {
        loop {
            let (mut round, guard) = {
                let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
                let pool = pools.entry(message.subscription.to_owned()).or_default();
                pool.links
                    .retain(|l| l.link.fingerprint == fingerprint && l.link.usable());
                let least = pool.links.iter().min_by_key(|l| l.in_flight());
                if let Some(l) = least
                    && (l.in_flight() == 0
                        || pool.links.len() >= LINKS_PER_DESTINATION
                        || pool.connecting.is_some())
                {
                    return Ok(self.lease_of(message.subscription, Arc::clone(&l.link)));
                }
                match &pool.connecting {
                    Some(round) => (round.clone(), None),
                    None => {
                        let (tx, rx) = tokio::sync::watch::channel(None);
                        pool.connecting = Some(rx.clone());
                        let guard = ConnectGuard {
                            pools: Arc::clone(&self.pools),
                            subscription: message.subscription.to_owned(),
                            round: tx,
                        };
                        (rx, Some(guard))
                    }
                }
            };
            let Some(guard) = guard else {
                // Another attempt connects: its failure is this attempt's too (no stampede on
                // a partner that is down); after a success, or if it gave up, look again.
                if let Ok(ended) = round.wait_for(Option::is_some).await
                    && let Some(Err(e)) = &*ended
                {
                    return Err(e.clone());
                }
                continue;
            };
            return match self.connect(message, fingerprint).await {
                Ok(link) => {
                    let link = Arc::new(link);
                    guard.finish(Ok(()), Some(Arc::clone(&link)));
                    Ok(self.lease_of(message.subscription, link))
                }
                Err(e) => {
                    guard.finish(Err(e.clone()), None);
                    Err(e)
                }
            };
        }
    }

    fn lease_of(&self, subscription: &str, link: Arc<Link>) -> Lease {
        Lease {
            pools: Arc::clone(&self.pools),
            subscription: subscription.to_owned(),
            link,
            healthy: false,
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
        let mut lease = match self.lease(message, fingerprint).await {
            Ok(lease) => lease,
            Err(ConnectError::Denied(why)) => {
                return (AttemptResult::EgressDenied(why), String::new());
            }
            Err(ConnectError::Failed(why)) => {
                return (AttemptResult::Transport(why), String::new());
            }
        };
        let routing_key = message.target.routing_key_for(message.event_type);
        let published = async {
            let confirm = lease
                .link
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
            // The lease, not kept, takes the link out of the pool: the next attempt gets a
            // fresh one.
            Err(e) => return classify(&e, message.target),
        };
        lease.healthy = true;
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

/// An attempt's hold on a link. Dropped unhealthy (the publish failed, or the attempt timed
/// out and was dropped mid-publish) it takes the link out of the pool, so no later attempt
/// waits on it; the link's socket is shut when the last attempt on it lets go.
struct Lease {
    pools: Arc<Mutex<HashMap<String, Pool>>>,
    subscription: String,
    link: Arc<Link>,
    healthy: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pool) = pools.get_mut(&self.subscription) else {
            return;
        };
        if self.healthy {
            if let Some(l) = pool
                .links
                .iter_mut()
                .find(|l| Arc::ptr_eq(&l.link, &self.link))
            {
                l.last_used = Instant::now();
            }
        } else {
            pool.links.retain(|l| !Arc::ptr_eq(&l.link, &self.link));
        }
    }
}

/// The connect under way for a destination. However it ends (done, failed, or dropped with
/// its attempt's timeout) the pool stops waiting on it and its waiters wake.
struct ConnectGuard {
    pools: Arc<Mutex<HashMap<String, Pool>>>,
    subscription: String,
    round: tokio::sync::watch::Sender<RoundResult>,
}

impl ConnectGuard {
    /// Puts the new link in the pool and tells the waiters how the connect went.
    fn finish(self, result: Result<(), ConnectError>, link: Option<Arc<Link>>) {
        if let Some(link) = link {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(pool) = pools.get_mut(&self.subscription) {
                pool.links.push(Pooled {
                    link,
                    last_used: Instant::now(),
                });
            }
        }
        self.round.send_replace(Some(result));
    }
}

impl Drop for ConnectGuard {
    fn drop(&mut self) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = pools.get_mut(&self.subscription)
            && pool
                .connecting
                .as_ref()
                .is_some_and(|r| r.same_channel(&self.round.subscribe()))
        {
            pool.connecting = None;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EgressConfig;
    use crate::delivery::egress::SystemLookup;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Attempts that find no link wait for the one connect under way and share its failure:
    /// a partner that takes TCP and never answers gets one connection, not one per attempt.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_attempts_share_one_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = Arc::clone(&accepted);
        let hang = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        let config = HttpConfig {
            connect_timeout: Duration::from_millis(500),
            request_timeout: Duration::from_secs(10),
            ..HttpConfig::default()
        };
        let policy = Arc::new(EgressPolicy::from_config(&EgressConfig {
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            ..EgressConfig::default()
        }));
        let sender = AmqpSender::new(&config, policy, Arc::new(SystemLookup));
        let url: reqwest::Url = format!("amqp://127.0.0.1:{port}/%2f").parse().unwrap();
        let target = AmqpTarget {
            exchange: "hooks".into(),
            routing_key: None,
        };
        let id = EnvelopeId::parse("evt_1").unwrap();
        let attempts = (0..8).map(|_| {
            sender.send(AmqpMessage {
                subscription: "sub_1",
                url: &url,
                target: &target,
                event_type: "order.created",
                id: &id,
                attempt: 1,
                timestamp: 0,
                signature: String::new(),
                body: Bytes::from_static(b"{}"),
                extra: Vec::new(),
                login: None,
                client_tls: None,
            })
        });
        let reports = futures_util::future::join_all(attempts).await;
        for r in &reports {
            assert!(
                matches!(&r.result, AttemptResult::Transport(e)
                    if e.contains("did not complete the connection")),
                "{:?}",
                r.result
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(sender.retain_live(|_| true), 0, "no link is left");
        hang.abort();
    }
}
