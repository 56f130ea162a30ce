//! Confirmed, mandatory publishing. Used by producers (`hookrelay publish`, [`Publisher`] in the
//! library) and by the worker for every republish into a tier or the dead sink: a publish only
//! counts once the broker confirmed it and did not return it as unroutable, and a return is
//! only ever attributed to the message it belongs to.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tracing::{info, warn};

use deadpool_lapin::{Pool, PoolConfig, Runtime};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, ConnectionProperties};
use tokio::sync::{Mutex, Semaphore};

use crate::config::SecretUrl;
use crate::contract::envelope::{InvalidEnvelope, NewEvent};
use crate::contract::headers::{FRAME_MAX, content_header_frame_len};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{0}")]
    Invalid(#[from] InvalidEnvelope),
    #[error(
        "the broker returned the message as unroutable from exchange {exchange:?} with routing \
         key {routing_key:?} ({reply}); is the topology applied?"
    )]
    Unroutable {
        exchange: String,
        routing_key: String,
        reply: String,
    },
    #[error("the broker refused the message (nack); a queue may be full or unavailable")]
    Nacked,
    #[error(
        "no confirm from the broker within {0:?}; the connection may be blocked by a resource alarm"
    )]
    ConfirmTimeout(Duration),
    #[error("the broker did not answer {what} within {after:?}")]
    NoAnswer { what: &'static str, after: Duration },
    #[error(
        "the message's properties take a {len}-byte frame, over the connection's frame_max of \
         {frame_max}; the broker would close the connection"
    )]
    TooLarge { len: usize, frame_max: usize },
    #[error("{what} is {len} bytes, over AMQP's 255-byte limit for it")]
    TooLong { what: &'static str, len: usize },
    #[error("cannot reach the broker: {0}")]
    Connect(String),
    #[error("broker error: {0}")]
    Broker(#[from] lapin::Error),
}

impl PublishError {
    /// Whether trying again later may succeed (the message itself is fine).
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            PublishError::Invalid(_) | PublishError::TooLong { .. } | PublishError::TooLarge { .. }
        )
    }
}

/// How many [`Publisher::publish`] calls may await their confirm at once (one confirm-mode
/// channel each).
pub const EXACT_CHANNELS: usize = 64;

/// Confirmed publishing on one pooled connection, re-created when the broker connection drops.
/// Channels are opened on it concurrently: it is shared, not checked out per open.
///
/// AMQP does not say which publish a `basic.return` belongs to: the broker sends it before the
/// confirm, and a confirm may cover many publishes at once (`multiple`). So [`publish`] keeps at
/// most one message awaiting its confirm on each of its channels, which makes the return that
/// precedes the confirm unambiguously that message's. [`send`] pipelines many messages on one
/// shared channel instead; a return there is reported with the returned message's own exchange
/// and routing key, which need not be the message whose confirm carried it.
///
/// [`publish`]: Publisher::publish
/// [`send`]: Publisher::send
pub struct Publisher {
    pool: Pool,
    /// The connection taken from `pool`, shared by every channel open until it drops; then it
    /// goes back to the pool, which replaces it.
    conn: Mutex<Option<Arc<deadpool_lapin::Object>>>,
    /// Confirm-mode channels with nothing in flight, for [`Publisher::publish`].
    idle: std::sync::Mutex<Vec<Channel>>,
    exact: Semaphore,
    /// The shared channel [`Publisher::send`] pipelines on.
    pipelined: Mutex<Option<Channel>>,
    confirm_timeout: Duration,
    /// Set while the broker blocks the connection (a memory or disk alarm).
    blocked: Arc<AtomicBool>,
    /// The frame size the current connection negotiated.
    frame_max: AtomicUsize,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Connects (eagerly, so a wrong URL fails here) with a connection named `name` in the
    /// management UI.
    pub async fn connect(
        url: &SecretUrl,
        name: &str,
        confirm_timeout: Duration,
    ) -> Result<Self, PublishError> {
        let name = name.to_owned();
        let pool = deadpool_lapin::Config {
            url: Some(url.expose().to_owned()),
            pool: Some(PoolConfig::new(1)),
        }
        .create_pool(
            move || ConnectionProperties::default().with_connection_name(name.clone().into()),
            Runtime::Tokio1,
        )
        .map_err(|e| PublishError::Connect(e.to_string()))?;
        let publisher = Self {
            pool,
            conn: Mutex::new(None),
            idle: std::sync::Mutex::new(Vec::new()),
            exact: Semaphore::new(EXACT_CHANNELS),
            pipelined: Mutex::new(None),
            confirm_timeout,
            blocked: Arc::new(AtomicBool::new(false)),
            frame_max: AtomicUsize::new(FRAME_MAX),
        };
        let channel = publisher.new_channel().await?;
        publisher.give_back(channel);
        Ok(publisher)
    }

    /// A new confirm-mode channel on the pooled connection (reconnecting if it dropped), within
    /// the confirm timeout. The deadline covers connecting too: a broker that takes TCP but never
    /// finishes the handshake, or a channel open lapin never answers, becomes an error here
    /// instead of a publish that never returns.
    async fn new_channel(&self) -> Result<Channel, PublishError> {
        let after = self.confirm_timeout;
        tokio::time::timeout(after, self.open_channel())
            .await
            .map_err(|_| PublishError::NoAnswer {
                what: "opening a channel",
                after,
            })?
    }

    async fn open_channel(&self) -> Result<Channel, PublishError> {
        let conn = self.connection().await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(ch)
    }

    /// The shared connection, or a new one from the pool once the current one has dropped.
    async fn connection(&self) -> Result<Arc<deadpool_lapin::Object>, PublishError> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref()
            && conn.status().connected()
        {
            return Ok(Arc::clone(conn));
        }
        // Let go of the dropped one so the pool can recycle it once pending opens let go too.
        *slot = None;
        let conn = self
            .pool
            .get()
            .await
            .map_err(|e| PublishError::Connect(e.to_string()))?;
        self.watch(conn.events_listener());
        self.frame_max
            .store(conn.configuration().frame_max() as usize, Ordering::SeqCst);
        let conn = Arc::new(conn);
        *slot = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// An idle channel for one exact publish, or a new one.
    async fn exact_channel(&self) -> Result<Channel, PublishError> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match idle {
                Some(ch) if ch.status().connected() => return Ok(ch),
                Some(_) => continue,
                None => return self.new_channel().await,
            }
        }
    }

    fn give_back(&self, channel: Channel) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(channel);
    }

    async fn pipelined_channel(&self) -> Result<Channel, PublishError> {
        let mut slot = self.pipelined.lock().await;
        if let Some(ch) = slot.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let ch = self.new_channel().await?;
        *slot = Some(ch.clone());
        Ok(ch)
    }

    /// Follows a connection's events: a blocked connection (resource alarm) is logged and
    /// flagged; publishes then wait for their confirm timeout and the originals stay unacked.
    fn watch(&self, events: impl futures_util::Stream<Item = lapin::Event> + Send + 'static) {
        let blocked = Arc::clone(&self.blocked);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    lapin::Event::ConnectionBlocked(reason) => {
                        blocked.store(true, Ordering::SeqCst);
                        warn!(reason = %reason, "The broker blocked the publishing connection (resource alarm); republishes wait");
                    }
                    lapin::Event::ConnectionUnblocked => {
                        blocked.store(false, Ordering::SeqCst);
                        info!("The broker unblocked the publishing connection");
                    }
                    lapin::Event::Error(_) => break,
                    _ => {}
                }
            }
            // The next connection has a watcher of its own.
            blocked.store(false, Ordering::SeqCst);
        });
    }

    /// Whether the broker blocks the publishing connection now.
    pub fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::SeqCst)
    }

    /// Publishes one message with `mandatory` and waits for the broker's confirm. `Ok` means
    /// the broker has it in at least one queue; `Unroutable` means this very message was
    /// returned.
    ///
    /// One deadline, the confirm timeout, covers the whole publish: the wait for a free channel
    /// (all [`EXACT_CHANNELS`] may be awaiting confirms), opening one, handing the message over
    /// and its confirm. So a publish never takes longer than the lease rule counts for it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let after = self.confirm_timeout;
        let deadline = tokio::time::Instant::now() + after;
        let no_answer = |what| PublishError::NoAnswer { what, after };
        let _permit = tokio::time::timeout_at(deadline, self.exact.acquire())
            .await
            .map_err(|_| no_answer("a free channel"))?
            .map_err(|_| PublishError::Connect("the publisher is closed".into()))?;
        let channel = tokio::time::timeout_at(deadline, self.exact_channel())
            .await
            .map_err(|_| no_answer("opening a channel"))??;
        let sent = tokio::time::timeout_at(
            deadline,
            self.send_on(&channel, exchange, routing_key, body, properties, true),
        )
        .await
        .unwrap_or(Err(no_answer("taking the message")));
        let result = match sent {
            Ok(confirm) => tokio::time::timeout_at(deadline, self.confirmed(confirm))
                .await
                .unwrap_or(Err(PublishError::ConfirmTimeout(after))),
            Err(e) => Err(e),
        };
        match &result {
            // The channel has nothing left in flight: reuse it.
            Ok(()) | Err(PublishError::Unroutable { .. } | PublishError::Nacked) => {
                self.give_back(channel);
            }
            // A confirm may still arrive on it and would be taken for the next message's.
            _ => {
                tokio::spawn(async move {
                    let _ = channel.close(200, "confirm abandoned".into()).await;
                });
            }
        }
        result
    }

    /// Hands one message to `channel`, within the confirm timeout.
    async fn send_on(
        &self,
        channel: &Channel,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<lapin::PublisherConfirm, PublishError> {
        let after = self.confirm_timeout;
        let options = BasicPublishOptions {
            mandatory,
            ..BasicPublishOptions::default()
        };
        // A routing key may come from a message (a tenant header, an `x-death` entry): over 255
        // bytes it is an error for this message, not a panic in the AMQP client.
        let short = |what, s: &str| {
            ShortString::try_new(s).map_err(|_| PublishError::TooLong { what, len: s.len() })
        };
        // lapin sends the properties as one frame without looking at its size, and the broker
        // closes the whole connection on one over frame_max: refuse this message alone instead.
        let len = content_header_frame_len(&properties);
        let frame_max = self.frame_max.load(Ordering::SeqCst);
        if len > frame_max {
            return Err(PublishError::TooLarge { len, frame_max });
        }
        let publish = channel.basic_publish(
            short("the exchange name", exchange)?,
            short("the routing key", routing_key)?,
            options,
            body,
            properties,
        );
        tokio::time::timeout(after, publish)
            .await
            .map_err(|_| PublishError::NoAnswer {
                what: "taking the message",
                after,
            })?
            .map_err(PublishError::from)
    }

    /// Waits (up to the confirm timeout) for a confirm and says what it means.
    fn confirmed(
        &self,
        confirm: lapin::PublisherConfirm,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'static {
        let timeout = self.confirm_timeout;
        async move {
            let confirmation = tokio::time::timeout(timeout, confirm)
                .await
                .map_err(|_| PublishError::ConfirmTimeout(timeout))??;
            match confirmation {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                    Err(PublishError::Unroutable {
                        exchange: returned.delivery.exchange.to_string(),
                        routing_key: returned.delivery.routing_key.to_string(),
                        reply: format!("{} {}", returned.reply_code, returned.reply_text),
                    })
                }
                Confirmation::Nack(None) => Err(PublishError::Nacked),
                Confirmation::NotRequested => unreachable!("the channel is in confirm mode"),
            }
        }
    }

    /// Sends one message on the shared pipelined channel and returns the wait for its confirm,
    /// so a caller can keep many in flight. Without `mandatory` an unroutable message is
    /// confirmed and dropped by the broker (right for notices nobody may be listening to).
    /// With it, an `Unroutable` error names the returned message's exchange and routing key,
    /// which may be another message sent in the same confirm batch: use [`Publisher::publish`]
    /// where it matters which.
    pub async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<impl Future<Output = Result<(), PublishError>> + Send + 'static, PublishError> {
        let channel = self.pipelined_channel().await?;
        let confirm = self
            .send_on(&channel, exchange, routing_key, body, properties, mandatory)
            .await?;
        Ok(self.confirmed(confirm))
    }

    /// Validates `event` against the envelope contract and publishes it to `ingress` with the
    /// tenant as routing key. Returns the envelope id.
    pub async fn publish_event(
        &self,
        ingress: &str,
        event: &NewEvent,
        max_body: usize,
    ) -> Result<String, PublishError> {
        event.validate(max_body)?;
        self.publish(ingress, &event.tenant, &event.body, event.properties())
            .await?;
        Ok(event.id.clone())
    }

    /// Closes the connection, waiting for nothing more than the close handshake (and for that
    /// at most the confirm timeout).
    pub async fn close(&self) {
        let _ = tokio::time::timeout(self.confirm_timeout, self.close_all()).await;
        self.pool.close();
    }

    async fn close_all(&self) {
        self.exact.close();
        if let Some(ch) = self.pipelined.lock().await.take() {
            let _ = ch.close(200, "bye".into()).await;
        }
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        for ch in idle {
            let _ = ch.close(200, "bye".into()).await;
        }
        if let Some(conn) = self.conn.lock().await.take() {
            let _ = conn.close(200, "bye".into()).await;
        }
    }
}
