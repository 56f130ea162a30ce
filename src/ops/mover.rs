//! Moving messages out of a queue, for tier release and dead-letter redrive. Each message that
//! moves is republished and confirmed before the original is acked, so a crash midway
//! duplicates at worst and never loses. Messages that stay are held unacknowledged for the pass
//! and returned together at its end, so they keep their places (as far as the broker keeps the
//! order of returned messages: classic and quorum queues put them back at the head).
//!
//! A pass holds the messages that stay unacknowledged, so it must end within the broker's
//! `consumer_timeout` (5 minutes with `rabbitmq/rabbitmq.conf`); if it does not, the broker
//! closes the channel and returns them itself: nothing is lost, and the pass can be run again.

use std::collections::BTreeMap;

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Acker, BasicProperties, Channel};

use crate::broker::publish::{PublishError, Publisher};
use crate::ops::progress::Progress;

pub use crate::units::Rate;

/// What to do with one message. (One is made per message and consumed at once, so the size
/// difference between the variants costs nothing worth a box.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Plan {
    Move {
        exchange: String,
        routing_key: String,
        properties: BasicProperties,
    },
    /// It stays where it is; the text says why (it is counted by it).
    Keep(String),
}

#[derive(Debug, Clone, Default)]
pub struct MoveOptions {
    pub rate: Option<Rate>,
    /// Move at most this many.
    pub limit: Option<usize>,
    /// Decide, count, move nothing.
    pub dry_run: bool,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoveReport {
    pub examined: usize,
    /// Moved (or, in a dry run, that would have moved).
    pub moved: usize,
    /// Stayed, counted by why.
    pub kept: BTreeMap<String, usize>,
}

impl MoveReport {
    pub fn kept_total(&self) -> usize {
        self.kept.values().sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("queue {queue}: {source}")]
    Queue { queue: String, source: lapin::Error },
    #[error("after moving {} message(s), a republish failed and the pass stopped; what was not moved is still in the queue: {source}", report.moved)]
    Publish {
        report: MoveReport,
        source: PublishError,
    },
}

/// `queue` as the broker sees it now (ready messages, consumers), by a passive declare.
pub async fn inspect(channel: &Channel, queue: &str) -> Result<lapin::Queue, lapin::Error> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// Messages in `queue` now (ready ones).
pub async fn depth(channel: &Channel, queue: &str) -> Result<u32, lapin::Error> {
    Ok(inspect(channel, queue).await?.message_count())
}

/// One pass over what `queue` holds when it starts (messages arriving later wait for the next
/// pass). `plan` sees each message's properties and body.
pub async fn move_messages(
    channel: &Channel,
    publisher: &Publisher,
    queue: &str,
    options: &MoveOptions,
    progress: Option<&Progress>,
    mut plan: impl FnMut(&BasicProperties, &[u8]) -> Plan,
) -> Result<MoveReport, MoveError> {
    let queue_error = |source| MoveError::Queue {
        queue: queue.to_owned(),
        source,
    };
    let snapshot = depth(channel, queue).await.map_err(queue_error)? as usize;
    let mut report = MoveReport::default();
    let mut held: Option<Acker> = None;
    let mut pace = options.rate.map(|r| {
        let mut i = tokio::time::interval(r.interval());
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let result = loop {
        if report.examined >= snapshot || options.limit.is_some_and(|l| report.moved >= l) {
            break Ok(());
        }
        let message = match channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
        {
            Ok(Some(m)) => m,
            Ok(None) => break Ok(()),
            Err(e) => break Err(queue_error(e)),
        };
        report.examined += 1;
        let delivery = message.delivery;
        match plan(&delivery.properties, &delivery.data) {
            Plan::Keep(why) => {
                *report.kept.entry(why).or_default() += 1;
                held = Some(delivery.acker);
            }
            Plan::Move { .. } if options.dry_run => {
                report.moved += 1;
                held = Some(delivery.acker);
            }
            Plan::Move {
                exchange,
                routing_key,
                properties,
            } => {
                if let Some(pace) = pace.as_mut() {
                    pace.tick().await;
                }
                if let Err(source) = publisher
                    .publish(&exchange, &routing_key, &delivery.data, properties)
                    .await
                {
                    // This one goes back with the rest.
                    held = Some(delivery.acker);
                    break Err(MoveError::Publish {
                        report: report.clone(),
                        source,
                    });
                }
                if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
                    break Err(queue_error(e));
                }
                report.moved += 1;
            }
        }
        if let Some(p) = progress {
            p.set(
                report.moved as u64,
                &format!(
                    "examined {} · kept {}",
                    report.examined,
                    report.kept_total()
                ),
            );
        }
    };
    // Everything held goes back at once, in its order.
    if let Some(last) = held {
        let _ = last
            .nack(BasicNackOptions {
                multiple: true,
                requeue: true,
            })
            .await;
    }
    if let Some(p) = progress {
        p.finish();
    }
    result.map(|()| report)
}
