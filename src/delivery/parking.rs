//! Where a paused subscription's deliveries wait. Before the worker republishes a delivery into
//! its subscription's parking queue, it makes sure the queue exists: a pause is a line in the
//! subscriptions file, so no operator command is there to declare it.
//!
//! The queue is declared once per version of the subscription: a resume removes the queue
//! once empty, and only a change (a new version) can pause the subscription again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use crate::broker::topology::TopologyError;
use crate::config::SecretUrl;
use crate::contract::ladder::Ladder;
use crate::subscriptions::Subscription;

/// Versions remembered as declared at most; then the memory starts again (a declare is
/// idempotent, and cheap).
const REMEMBERED: usize = 10_000;

/// How long connecting and declaring may take; a parked delivery's lease covers more.
const ANSWER: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ParkingError {
    #[error("cannot reach the broker to declare the parking queue: {0}")]
    Connect(String),
    #[error(transparent)]
    Declare(#[from] TopologyError),
}

/// The worker's declarer of parking queues, on a connection of its own opened the first time
/// something parks (a worker with nothing paused never opens it).
pub struct Parking {
    url: SecretUrl,
    name: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    link: Option<(Connection, Channel)>,
    /// The version of each subscription whose queue was declared.
    declared: HashMap<String, Arc<Subscription>>,
}

impl std::fmt::Debug for Parking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parking")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Parking {
    /// `name` is the worker's; the connection is named after it.
    pub fn new(url: SecretUrl, name: &str) -> Self {
        Self {
            url,
            name: format!("{name} parking"),
            state: Mutex::new(State::default()),
        }
    }

    /// Makes sure the parking queue of `version`, the subscription as it is in force (paused),
    /// exists.
    pub async fn ensure(
        &self,
        ladder: &Ladder,
        version: &Arc<Subscription>,
    ) -> Result<(), ParkingError> {
        let subscription = version.id.as_str();
        let mut state = self.state.lock().await;
        if state
            .declared
            .get(subscription)
            .is_some_and(|v| Arc::ptr_eq(v, version))
        {
            return Ok(());
        }
        let usable = state
            .link
            .as_ref()
            .is_some_and(|(conn, ch)| conn.status().connected() && ch.status().connected());
        if !usable {
            state.link = Some(self.open().await?);
        }
        let Some((_, channel)) = state.link.as_ref() else {
            return Err(ParkingError::Connect("no channel".into()));
        };
        let declared =
            tokio::time::timeout(ANSWER, ladder.declare_paused_queue(channel, subscription))
                .await
                .map_err(|_| ParkingError::Connect(format!("no answer within {ANSWER:?}")))
                .and_then(|r| r.map_err(ParkingError::from));
        match declared {
            Ok(()) => {
                if state.declared.len() >= REMEMBERED {
                    state.declared.clear();
                }
                state
                    .declared
                    .insert(subscription.to_owned(), Arc::clone(version));
                Ok(())
            }
            Err(e) => {
                // A refused declare closes the channel: open a fresh one next time.
                state.link = None;
                Err(e)
            }
        }
    }

    /// Closes the connection, if one was opened.
    pub async fn close(&self) {
        if let Some((conn, _)) = self.state.lock().await.link.take() {
            let _ = conn.close(200, "bye".into()).await;
        }
    }

    async fn open(&self) -> Result<(Connection, Channel), ParkingError> {
        let connect = async {
            let conn = Connection::connect(
                self.url.expose(),
                ConnectionProperties::default().with_connection_name(self.name.as_str().into()),
            )
            .await?;
            let channel = conn.create_channel().await?;
            Ok::<_, lapin::Error>((conn, channel))
        };
        tokio::time::timeout(ANSWER, connect)
            .await
            .map_err(|_| ParkingError::Connect(format!("no answer within {ANSWER:?}")))?
            .map_err(|e| ParkingError::Connect(e.to_string()))
    }
}
