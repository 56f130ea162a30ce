//! Confirmed, mandatory publishing. Used by producers (`hookrelay publish`, [`Publisher`] in the
//! library) and by the worker for every republish into a tier or the dead sink: a publish only
//! counts once the broker confirmed it and did not return it as unroutable.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tracing::{info, warn};

use deadpool_lapin::{Pool, PoolConfig, Runtime};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, ConnectionProperties};
use tokio::sync::Mutex;

use crate::config::SecretUrl;
use crate::envelope::{InvalidEnvelope, NewEvent};

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
    #[error("cannot reach the broker: {0}")]
    Connect(String),
    #[error("broker error: {0}")]
    Broker(#[from] lapin::Error),
}

impl PublishError {
    /// Whether trying again later may succeed (the message itself is fine).
    pub fn is_transient(&self) -> bool {
        !matches!(self, PublishError::Invalid(_))
    }
}

/// A confirm-mode channel on a pooled connection, re-created when the broker connection drops.
pub struct Publisher {
    pool: Pool,
    channel: Mutex<Option<Channel>>,
    confirm_timeout: Duration,
    /// Set while the broker blocks the connection (a memory or disk alarm).
    blocked: Arc<AtomicBool>,
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
            channel: Mutex::new(None),
            confirm_timeout,
            blocked: Arc::new(AtomicBool::new(false)),
        };
        publisher.channel().await?;
        Ok(publisher)
    }

    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut slot = self.channel.lock().await;
        if let Some(ch) = slot.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let conn = self
            .pool
            .get()
            .await
            .map_err(|e| PublishError::Connect(e.to_string()))?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        self.watch(conn.events_listener());
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
        });
    }

    /// Whether the broker blocks the publishing connection now.
    pub fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::SeqCst)
    }

    /// Publishes one message and waits for the broker's confirm. `Ok` means the broker has it
    /// in at least one queue.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        self.send(exchange, routing_key, body, properties, true)
            .await?
            .await
    }

    /// Sends one message and returns the wait for its confirm, so a caller can keep many in
    /// flight. Without `mandatory` an unroutable message is confirmed and dropped by the broker
    /// (right for notices nobody may be listening to).
    pub async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<impl Future<Output = Result<(), PublishError>> + Send + 'static, PublishError> {
        let channel = self.channel().await?;
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await?;
        let timeout = self.confirm_timeout;
        let (exchange, routing_key) = (exchange.to_owned(), routing_key.to_owned());
        Ok(async move {
            let confirmation = tokio::time::timeout(timeout, confirm)
                .await
                .map_err(|_| PublishError::ConfirmTimeout(timeout))??;
            match confirmation {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                    Err(PublishError::Unroutable {
                        exchange,
                        routing_key,
                        reply: format!("{} {}", returned.reply_code, returned.reply_text),
                    })
                }
                Confirmation::Nack(None) => Err(PublishError::Nacked),
                Confirmation::NotRequested => unreachable!("the channel is in confirm mode"),
            }
        })
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

    /// Closes the connection, waiting for nothing more than the close handshake.
    pub async fn close(&self) {
        if let Some(ch) = self.channel.lock().await.take() {
            let _ = ch.close(200, "bye".into()).await;
        }
        if let Ok(conn) = self.pool.get().await {
            let _ = conn.close(200, "bye".into()).await;
        }
        self.pool.close();
    }
}
