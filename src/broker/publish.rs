//! Confirmed, mandatory publishing. Used by producers (`hookrelay publish`, [`Publisher`] in the
//! library) and by the worker for every republish into a tier or the dead sink: a publish only
//! counts once the broker confirmed it and did not return it as unroutable, and a return is
//! only ever attributed to the message it belongs to.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::StreamExt;
use tracing::{error, info, warn};

use deadpool_lapin::{Pool, PoolConfig, Runtime};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, ConnectionProperties, PublisherConfirm};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, oneshot};

use crate::config::SecretUrl;
use crate::contract::envelope::{InvalidEnvelope, NewEvent};
use crate::contract::headers::{
    FRAME_MAX, PUBLISH_ID_HEADER, content_header_frame_len, read_u64_header, with_publish_id,
};

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
    #[error(
        "the publishing channel closed before the broker confirmed the message; it may or may \
         not be stored"
    )]
    ChannelLost,
    #[error(
        "the broker returned a message without a publish id on this channel, so no publish on \
         it can be told stored; the channel is closed"
    )]
    Unattributable,
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

/// Confirm-mode channels [`Publisher::publish`] spreads its publishes over, each with many in
/// flight. [`Publisher::send`] has one more of its own, so its messages keep their order.
pub const PUBLISH_CHANNELS: usize = 4;

/// The most publishes that may await their confirm at once, over all channels: what a stalled
/// broker can make the publisher hold in memory.
pub const MAX_IN_FLIGHT: usize = 4096;

/// Confirmed publishing on one pooled connection, re-created when the broker connection drops.
/// Channels are opened on it concurrently: it is shared, not checked out per open.
///
/// AMQP does not say which publish a `basic.return` belongs to: the broker sends it before the
/// confirm, and a confirm may cover many publishes at once (`multiple`), so lapin hands a
/// return to whichever confirm it resolves next. So every message carries an id of its own
/// publish ([`PUBLISH_ID_HEADER`]), which the returned copy carries back, and each channel's
/// [`ConfirmChannel`] settles a publish only once it has seen every return that can be that
/// message's. Many messages are in flight on each channel.
pub struct Publisher {
    pool: Pool,
    /// The connection taken from `pool`, shared by every channel open until it drops; then it
    /// goes back to the pool, which replaces it.
    conn: Mutex<Option<Arc<deadpool_lapin::Object>>>,
    /// Slot 0 is [`Publisher::send`]'s; the others take [`Publisher::publish`] in turn.
    slots: Vec<Mutex<Option<Arc<ConfirmChannel>>>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
    in_flight: Arc<Semaphore>,
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

/// One confirm-mode channel and the publishes awaiting their confirm on it.
struct ConfirmChannel {
    channel: Channel,
    /// Held from handing a message to lapin until its confirm is in the ledger, and by every
    /// sweep: so a sweep sees the confirm of every message sent on the channel.
    sending: Mutex<()>,
    ledger: std::sync::Mutex<Ledger>,
    /// The task that sweeps the ledger, woken by confirms and by new entries.
    sweeper: std::sync::Mutex<Option<Waker>>,
    /// A return named no publish of ours, or a message may have been sent without its confirm
    /// reaching the ledger: nothing on this channel can be told stored any more.
    poisoned: AtomicBool,
}

#[derive(Default)]
struct Ledger {
    pending: Vec<Awaiting>,
    /// Returns seen, by publish id, until that publish's own confirm settles it.
    returned: HashMap<u64, Returned>,
}

struct Awaiting {
    id: u64,
    confirm: PublisherConfirm,
    reply: oneshot::Sender<Result<(), PublishError>>,
    /// Released when the publish settles, not when its caller stops waiting.
    _permit: OwnedSemaphorePermit,
}

struct Returned {
    exchange: String,
    routing_key: String,
    reply: String,
}

type Outcome = Result<(), PublishError>;

impl ConfirmChannel {
    /// Wraps a confirm-mode channel and starts its sweeper.
    fn start(channel: Channel) -> Arc<Self> {
        let this = Arc::new(Self {
            channel,
            sending: Mutex::new(()),
            ledger: std::sync::Mutex::new(Ledger::default()),
            sweeper: std::sync::Mutex::new(None),
            poisoned: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&this);
        tokio::spawn(std::future::poll_fn(move |cx| Self::sweep(&weak, cx)));
        this
    }

    fn usable(&self) -> bool {
        self.channel.status().connected() && !self.poisoned.load(Ordering::SeqCst)
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake_sweeper(&self) {
        let waker = self
            .sweeper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Closes the channel: lapin then fails every confirm still awaited on it.
    fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let _ = channel.close(200, "confirms unattributable".into()).await;
        });
    }

    /// Hands one message to lapin and puts its confirm in the ledger; the receiver gets the
    /// outcome.
    async fn put(
        self: &Arc<Self>,
        permit: OwnedSemaphorePermit,
        id: u64,
        message: Message<'_>,
        after: Duration,
    ) -> Result<oneshot::Receiver<Outcome>, PublishError> {
        let options = BasicPublishOptions {
            mandatory: message.mandatory,
            ..BasicPublishOptions::default()
        };
        let _sending = self.sending.lock().await;
        // lapin registers the message's confirm as soon as the publish starts: if this future
        // is dropped or fails before the confirm is in the ledger, a return could go to a
        // confirm nobody sweeps.
        let mut unsettled = PoisonOnDrop(Some(self));
        let publish = self.channel.basic_publish(
            message.exchange,
            message.routing_key,
            options,
            message.body,
            message.properties,
        );
        let confirm =
            tokio::time::timeout(after, publish)
                .await
                .map_err(|_| PublishError::NoAnswer {
                    what: "taking the message",
                    after,
                })??;
        let (reply, outcome) = oneshot::channel();
        self.ledger().pending.push(Awaiting {
            id,
            confirm,
            reply,
            _permit: permit,
        });
        unsettled.0 = None;
        drop(_sending);
        self.wake_sweeper();
        Ok(outcome)
    }

    /// The sweeper's one step: settles every publish whose confirm came, once every return
    /// that may be its own has been seen. Ends when the channel is gone.
    fn sweep(this: &Weak<Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(this) = this.upgrade() else {
            return Poll::Ready(());
        };
        // Before trying the lock, so a sender that holds it wakes us when it lets go.
        *this.sweeper.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        let Ok(_sending) = this.sending.try_lock() else {
            return Poll::Pending;
        };
        let mut ledger = this.ledger();
        // lapin attaches a return to the first confirm it resolves after the return arrived,
        // which resolves no later than the returned message's own. So once a pass over the
        // ledger finds nothing newly resolved, every return belonging to what was resolved
        // before it has been seen.
        let mut resolved = Vec::new();
        loop {
            let before = resolved.len();
            let mut i = 0;
            while i < ledger.pending.len() {
                match Pin::new(&mut ledger.pending[i].confirm).poll(cx) {
                    Poll::Ready(confirmation) => {
                        resolved.push((ledger.pending.swap_remove(i), confirmation));
                    }
                    Poll::Pending => i += 1,
                }
            }
            if resolved.len() == before {
                break;
            }
        }
        for (_, confirmation) in &mut resolved {
            let (Ok(Confirmation::Ack(returned)) | Ok(Confirmation::Nack(returned))) = confirmation
            else {
                continue;
            };
            let Some(returned) = returned.take() else {
                continue;
            };
            match read_u64_header(&returned.properties, PUBLISH_ID_HEADER) {
                Some(id) => {
                    ledger.returned.insert(
                        id,
                        Returned {
                            exchange: returned.delivery.exchange.to_string(),
                            routing_key: returned.delivery.routing_key.to_string(),
                            reply: format!("{} {}", returned.reply_code, returned.reply_text),
                        },
                    );
                }
                None => {
                    error!(exchange = %returned.delivery.exchange, routing_key = %returned.delivery.routing_key, "The broker returned a message without a publish id; closing the channel");
                    this.poison();
                }
            }
        }
        let poisoned = this.poisoned.load(Ordering::SeqCst);
        for (awaiting, confirmation) in resolved {
            let outcome = match (confirmation, ledger.returned.remove(&awaiting.id)) {
                (Err(e), _) => Err(PublishError::Broker(e)),
                (Ok(_), Some(r)) => Err(PublishError::Unroutable {
                    exchange: r.exchange,
                    routing_key: r.routing_key,
                    reply: r.reply,
                }),
                (Ok(_), None) if poisoned => Err(PublishError::Unattributable),
                (Ok(Confirmation::Ack(_)), None) => Ok(()),
                (Ok(Confirmation::Nack(_)), None) => Err(PublishError::Nacked),
                (Ok(Confirmation::NotRequested), None) => {
                    unreachable!("the channel is in confirm mode")
                }
            };
            // The caller may have stopped waiting (its deadline passed): nothing to tell.
            let _ = awaiting.reply.send(outcome);
        }
        Poll::Pending
    }
}

impl Drop for ConfirmChannel {
    fn drop(&mut self) {
        // Lets the sweeper see the channel is gone and end.
        self.wake_sweeper();
    }
}

/// Poisons a channel unless disarmed (set to `None`) once a sent message's confirm is in the
/// ledger.
struct PoisonOnDrop<'a>(Option<&'a Arc<ConfirmChannel>>);

impl Drop for PoisonOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(channel) = self.0 {
            channel.poison();
        }
    }
}

/// One message as lapin takes it, checked.
struct Message<'a> {
    exchange: ShortString,
    routing_key: ShortString,
    body: &'a [u8],
    properties: BasicProperties,
    mandatory: bool,
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
            slots: (0..=PUBLISH_CHANNELS).map(|_| Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            confirm_timeout,
            blocked: Arc::new(AtomicBool::new(false)),
            frame_max: AtomicUsize::new(FRAME_MAX),
        };
        publisher.lane(1).await?;
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
    /// Also for work that needs channels of its own beside the publishes (the API's resumes),
    /// so that work opens no connection more.
    pub async fn connection(&self) -> Result<Arc<deadpool_lapin::Object>, PublishError> {
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

    /// The channel of `slot`, or a new one in its place once it closed or was poisoned.
    async fn lane(&self, slot: usize) -> Result<Arc<ConfirmChannel>, PublishError> {
        let Some(slot) = self.slots.get(slot) else {
            return Err(PublishError::Connect("no such publishing channel".into()));
        };
        let mut slot = slot.lock().await;
        if let Some(lane) = slot.as_ref()
            && lane.usable()
        {
            return Ok(Arc::clone(lane));
        }
        let lane = ConfirmChannel::start(self.new_channel().await?);
        *slot = Some(Arc::clone(&lane));
        Ok(lane)
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

    /// Checks one message and hands it to the channel of `slot`, waiting for room if
    /// [`MAX_IN_FLIGHT`] publishes await their confirm; the receiver gets its outcome.
    async fn hand_over(
        &self,
        slot: usize,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<oneshot::Receiver<Outcome>, PublishError> {
        // A routing key may come from a message (a tenant header, an `x-death` entry): over 255
        // bytes it is an error for this message, not a panic in the AMQP client.
        let short = |what, s: &str| {
            ShortString::try_new(s).map_err(|_| PublishError::TooLong { what, len: s.len() })
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let properties = with_publish_id(properties, id);
        // lapin sends the properties as one frame without looking at its size, and the broker
        // closes the whole connection on one over frame_max: refuse this message alone instead.
        let len = content_header_frame_len(&properties);
        let frame_max = self.frame_max.load(Ordering::SeqCst);
        if len > frame_max {
            return Err(PublishError::TooLarge { len, frame_max });
        }
        let message = Message {
            exchange: short("the exchange name", exchange)?,
            routing_key: short("the routing key", routing_key)?,
            body,
            properties,
            mandatory,
        };
        let permit = Arc::clone(&self.in_flight)
            .acquire_owned()
            .await
            .map_err(|_| PublishError::Connect("the publisher is closed".into()))?;
        let lane = self.lane(slot).await?;
        lane.put(permit, id, message, self.confirm_timeout).await
    }

    /// Publishes one message with `mandatory` and waits for the broker's confirm. `Ok` means
    /// the broker has it in at least one queue; `Unroutable` means this very message was
    /// returned.
    ///
    /// One deadline, the confirm timeout, covers the whole publish: the wait for room (all
    /// [`MAX_IN_FLIGHT`] may be awaiting confirms), opening a channel, handing the message over
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
        let slot = 1 + self.next_slot.fetch_add(1, Ordering::Relaxed) % PUBLISH_CHANNELS;
        let outcome = tokio::time::timeout_at(
            deadline,
            self.hand_over(slot, exchange, routing_key, body, properties, true),
        )
        .await
        .map_err(|_| PublishError::NoAnswer {
            what: "taking the message",
            after,
        })??;
        Self::confirmed(tokio::time::timeout_at(deadline, outcome).await, after)
    }

    /// What waiting for an outcome came to.
    fn confirmed(
        waited: Result<Result<Outcome, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
        after: Duration,
    ) -> Outcome {
        match waited {
            Ok(Ok(outcome)) => outcome,
            // The channel's ledger is gone: the channel closed and was replaced.
            Ok(Err(_)) => Err(PublishError::ChannelLost),
            Err(_) => Err(PublishError::ConfirmTimeout(after)),
        }
    }

    /// Sends one message and returns the wait for its confirm, so a caller can keep many in
    /// flight; messages sent this way keep their order (one channel of their own). Without
    /// `mandatory` an unroutable message is confirmed and dropped by the broker (right for
    /// notices nobody may be listening to). With it, `Unroutable` means this very message was
    /// returned, as with [`Publisher::publish`].
    pub async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<impl Future<Output = Outcome> + Send + 'static, PublishError> {
        let after = self.confirm_timeout;
        let outcome = tokio::time::timeout(
            after,
            self.hand_over(0, exchange, routing_key, body, properties, mandatory),
        )
        .await
        .map_err(|_| PublishError::NoAnswer {
            what: "taking the message",
            after,
        })??;
        Ok(async move { Self::confirmed(tokio::time::timeout(after, outcome).await, after) })
    }

    /// Validates `event` against the envelope contract and publishes it to `ingress` with the
    /// tenant as routing key. Returns the envelope id.
    pub async fn publish_event(
        &self,
        ingress: &str,
        event: &NewEvent,
        max_body: usize,
    ) -> Result<String, PublishError> {
        self.publish_event_in(ingress, event, max_body, None).await
    }

    /// As [`Publisher::publish_event`], with the trace context `cx` (the caller's publish
    /// span, or a producer's `traceparent` as given) unless the event carries one already.
    pub async fn publish_event_in(
        &self,
        ingress: &str,
        event: &NewEvent,
        max_body: usize,
        cx: Option<&opentelemetry::Context>,
    ) -> Result<String, PublishError> {
        event.validate(max_body)?;
        let properties = match cx {
            Some(cx) => {
                crate::contract::trace_context::with_context_if_absent(event.properties(), cx)
            }
            None => event.properties(),
        };
        self.publish(ingress, &event.tenant, &event.body, properties)
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
        self.in_flight.close();
        for slot in &self.slots {
            if let Some(lane) = slot.lock().await.take() {
                let _ = lane.channel.close(200, "bye".into()).await;
            }
        }
        if let Some(conn) = self.conn.lock().await.take() {
            let _ = conn.close(200, "bye".into()).await;
        }
    }
}
