//! Operational events: small JSON messages on the `<prefix>.events` topic exchange that owning
//! systems bind a queue to and act on (`subscription.gone`, `delivery.exhausted`,
//! `delivery.cancelled`, `subscriptions.reload_failed`). Publishing them never blocks or fails a
//! delivery: they pass through a bounded buffer, and what does not fit is counted as dropped.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::BasicProperties;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::metrics::Metrics;
use crate::publish::Publisher;

/// How many notices may wait for the broker before new ones are dropped.
pub const BUFFER: usize = 10_000;
/// How many notices may await their confirm at once.
const IN_FLIGHT: usize = 256;

/// One operational event, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperationalEvent {
    /// The routing key, e.g. `subscription.gone`.
    pub event: String,
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    pub envelope: Option<String>,
    pub reason: String,
    /// What happened, in words (the last error, the cancellation's cause).
    pub detail: Option<String>,
    /// RFC 3339, UTC.
    pub at: String,
}

impl OperationalEvent {
    pub fn new(event: &str, reason: impl Into<String>) -> Self {
        Self {
            event: event.to_owned(),
            tenant: None,
            subscription: None,
            envelope: None,
            reason: reason.into(),
            detail: None,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        }
    }

    pub fn detail(mut self, detail: &str) -> Self {
        self.detail = Some(detail.to_owned());
        self
    }

    pub fn about(mut self, tenant: &str, subscription: Option<&str>, envelope: &str) -> Self {
        self.tenant = Some(tenant.to_owned());
        self.subscription = subscription.map(str::to_owned);
        self.envelope = Some(envelope.to_owned());
        self
    }
}

struct Notice {
    exchange: Arc<str>,
    routing_key: String,
    body: Vec<u8>,
}

/// The sending side, cheap to clone into every task.
#[derive(Clone)]
pub struct Notices {
    tx: mpsc::Sender<Notice>,
    events_exchange: Arc<str>,
    metrics: Metrics,
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices")
            .field("events_exchange", &self.events_exchange)
            .finish_non_exhaustive()
    }
}

impl Notices {
    /// Starts the publishing task. It ends once every `Notices` clone is dropped and what was
    /// buffered has been sent.
    pub fn start(
        publisher: Arc<Publisher>,
        events_exchange: String,
        metrics: Metrics,
    ) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(BUFFER);
        let task = tokio::spawn(drain(publisher, rx, metrics.clone()));
        (
            Self {
                tx,
                events_exchange: events_exchange.into(),
                metrics,
            },
            task,
        )
    }

    /// Queues an operational event; drops (and counts) it when the buffer is full.
    pub fn operational(&self, event: OperationalEvent) {
        let body = serde_json::to_vec(&event).unwrap_or_default();
        self.enqueue(Arc::clone(&self.events_exchange), event.event, body);
    }

    fn enqueue(&self, exchange: Arc<str>, routing_key: String, body: Vec<u8>) {
        let notice = Notice {
            exchange,
            routing_key,
            body,
        };
        if self.tx.try_send(notice).is_err() {
            self.metrics.notices_dropped.inc();
        }
    }
}

async fn drain(publisher: Arc<Publisher>, mut rx: mpsc::Receiver<Notice>, metrics: Metrics) {
    let mut pending = FuturesUnordered::new();
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    loop {
        tokio::select! {
            Some(result) = pending.next(), if !pending.is_empty() => {
                if let Err(e) = result {
                    metrics.notices_failed.inc();
                    warn!(error = %e, "Notice not confirmed by the broker");
                }
            }
            notice = rx.recv(), if pending.len() < IN_FLIGHT => {
                let Some(n) = notice else { break };
                match publisher
                    .send(&n.exchange, &n.routing_key, &n.body, props.clone(), false)
                    .await
                {
                    Ok(confirm) => pending.push(confirm),
                    Err(e) => {
                        metrics.notices_failed.inc();
                        warn!(error = %e, "Notice not published");
                    }
                }
            }
        }
    }
    while let Some(result) = pending.next().await {
        if result.is_err() {
            metrics.notices_failed.inc();
        }
    }
}
