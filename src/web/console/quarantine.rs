//! The endpoints the workers have quarantined, followed from the events exchange: the API
//! process binds a queue of its own (exclusive, so it goes with the connection; bounded, so a
//! stalled follower costs the broker little) to `endpoint.quarantined` and
//! `endpoint.recovered`, and keeps the endpoints quarantined now in memory. It knows only what
//! was announced since it started following (at the API's start, when it has a broker).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

use crate::api::BrokerSetup;

/// The most messages the follower's queue holds before the broker drops the oldest.
const QUEUE_BOUND: i32 = 1000;
/// The most endpoints remembered (announcements past it are left out).
const MOST: usize = 1000;
/// The pause before following again after the connection failed.
const RETRY: Duration = Duration::from_secs(5);

/// One quarantined endpoint, as its announcement said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quarantined {
    /// `host:port#hash` (the path may hold a secret, so workers never announce it).
    pub endpoint: String,
    pub detail: Option<String>,
    /// RFC 3339, UTC.
    pub at: String,
}

#[derive(Debug, Default)]
struct Known {
    endpoints: BTreeMap<String, Quarantined>,
    /// Why following stopped, until it follows again.
    trouble: Option<String>,
    following: bool,
}

/// What the follower knows, shared with the pages.
#[derive(Debug, Clone, Default)]
pub struct Watch(Arc<Mutex<Known>>);

impl Watch {
    /// Starts following the events exchange of `broker` (from inside a Tokio runtime).
    pub fn start(broker: &BrokerSetup) -> Self {
        let watch = Self::default();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(follow(watch.clone(), broker.clone()));
        }
        watch
    }

    /// The endpoints quarantined now, and why the list may be incomplete.
    pub fn now(&self) -> (Vec<Quarantined>, Option<String>) {
        let known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let trouble = match (&known.trouble, known.following) {
            (Some(t), _) => Some(t.clone()),
            (None, false) => {
                Some("not following the events exchange (no broker, or not yet)".to_owned())
            }
            (None, true) => None,
        };
        (known.endpoints.values().cloned().collect(), trouble)
    }

    /// Whether the endpoint labelled `label` (`host:port#hash`) is quarantined now, and why the
    /// answer may be incomplete.
    pub fn of(&self, label: &str) -> (Option<Quarantined>, Option<String>) {
        let (all, trouble) = self.now();
        (all.into_iter().find(|q| q.endpoint == label), trouble)
    }

    fn set(&self, change: impl FnOnce(&mut Known)) {
        change(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Takes one announcement (the JSON of an operational event).
    fn take(&self, routing_key: &str, body: &[u8]) {
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(body) else {
            return;
        };
        let text = |k: &str| event.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let Some(endpoint) = text("endpoint") else {
            return;
        };
        self.set(|known| match routing_key {
            "endpoint.quarantined" if known.endpoints.len() < MOST => {
                known.endpoints.insert(
                    endpoint.clone(),
                    Quarantined {
                        endpoint,
                        detail: text("detail"),
                        at: text("at").unwrap_or_default(),
                    },
                );
            }
            "endpoint.recovered" => {
                known.endpoints.remove(&endpoint);
            }
            _ => {}
        });
    }
}

async fn follow(watch: Watch, broker: BrokerSetup) {
    loop {
        let result = follow_once(&watch, &broker).await;
        let why = match result {
            Ok(()) => "the broker closed the events queue".to_owned(),
            Err(e) => e.to_string(),
        };
        tracing::debug!(error = %why, "The console stopped following quarantines; again soon");
        watch.set(|known| {
            known.following = false;
            known.trouble = Some(format!("not following the events exchange: {why}"));
        });
        tokio::time::sleep(RETRY).await;
    }
}

async fn follow_once(watch: &Watch, broker: &BrokerSetup) -> Result<(), lapin::Error> {
    let conn = Connection::connect(
        broker.amqp_url.expose(),
        ConnectionProperties::default().with_connection_name("hookrelay api console".into()),
    )
    .await?;
    let followed = consume(watch, broker, &conn).await;
    let _ = conn.close(200, "done".into()).await;
    followed
}

async fn consume(
    watch: &Watch,
    broker: &BrokerSetup,
    conn: &Connection,
) -> Result<(), lapin::Error> {
    let channel = conn.create_channel().await?;
    let mut args = FieldTable::default();
    // Exclusive queues are classic whatever the vhost's default type.
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    args.insert("x-max-length".into(), AMQPValue::LongInt(QUEUE_BOUND));
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await?;
    let exchange = broker.ladder.events_exchange();
    for key in ["endpoint.quarantined", "endpoint.recovered"] {
        channel
            .queue_bind(
                queue.name().as_str().into(),
                exchange.as_str().into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    let mut deliveries = channel
        .basic_consume(
            queue.name().as_str().into(),
            "hookrelay-console".into(),
            BasicConsumeOptions {
                no_ack: true,
                exclusive: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    watch.set(|known| {
        known.following = true;
        known.trouble = None;
    });
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        watch.take(delivery.routing_key.as_str(), &delivery.data);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_takes_its_endpoint_off_the_list() {
        let watch = Watch::default();
        let event = |endpoint: &str| {
            serde_json::to_vec(&serde_json::json!({
                "event": "x", "endpoint": endpoint, "detail": "open 30s", "at": "2026-01-01T00:00:00Z"
            }))
            .unwrap()
        };
        watch.take("endpoint.quarantined", &event("a.example:443#1"));
        watch.take("endpoint.quarantined", &event("b.example:443#2"));
        watch.take("endpoint.recovered", &event("a.example:443#1"));
        watch.take("endpoint.quarantined", b"not json");
        let (now, _) = watch.now();
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].endpoint, "b.example:443#2");
        assert_eq!(now[0].detail.as_deref(), Some("open 30s"));
    }
}
