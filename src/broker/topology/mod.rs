//! The broker objects a ladder stands for, and what is done with them: `apply` declares them,
//! [`Binding::unbind`] removes the bindings into lanes the ladder no longer routes to (found by
//! [`Topology::stale_bindings`]), `export` writes them as RabbitMQ definitions. Comparing them
//! with the broker is [`crate::broker::drift`]'s.
//!
//! Tiers dead-letter into `{p}.promote`, never into a tier, so the broker's cycle rule (a message
//! expiring back into a queue it already expired from is dropped) can never apply.
//!
//! - [`plan`]: the objects a ladder stands for, and the queue a paused subscription parks in.
//! - [`objects`]: exchanges, queues, bindings and policies, declared, removed and exported.

mod objects;
mod plan;

pub use objects::{Applied, Arg, Binding, Exchange, NamedPolicy, Queue, Topology};

/// The exchange type of `rabbitmq_consistent_hash_exchange`, which sharded ladders need.
pub const CONSISTENT_HASH: &str = "x-consistent-hash";
/// The plugin that provides [`CONSISTENT_HASH`].
pub const CONSISTENT_HASH_PLUGIN: &str = "rabbitmq_consistent_hash_exchange";

/// The delivery limit of the queues hookrelay requeues into on purpose: a lane (a delivery whose
/// republish failed goes back to it) and the dead sink (a redrive pass returns what it keeps),
/// and a tier's parking queue (release returns what it cannot move yet). RabbitMQ 4 gives a
/// quorum queue a limit of 20 when nothing sets one, after which it dead-letters or drops the
/// message; 3.x has none. `-1` (unlimited) is refused by 3.x, so the largest 32-bit value stands
/// for "no limit" on both.
pub const DELIVERY_LIMIT: i64 = 2_147_483_647;

/// Where a sharded ladder's lanes put their leaders: on the node that leads the fewest queues
/// (RabbitMQ 3.10's `balanced`; below 1,000 queues it counts leaders, above it picks at random).
pub const LEADER_LOCATOR: &str = "balanced";

/// Below hold policies (100), which match tiers only, so the two never compete. A team's own
/// policy of higher priority that matches these queues would replace this one (only one policy
/// applies to a queue); `topology plan` reports it.
const DELIVERY_LIMIT_PRIORITY: i64 = 10;

/// Why declaring the topology failed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "the broker refused {object}: {message}. It probably exists with other arguments; \
         `hookrelay topology plan` shows the difference"
    )]
    Conflict { object: String, message: String },
    #[error("broker error while declaring {object}: {source}")]
    Broker {
        object: String,
        source: lapin::Error,
    },
}
/// `text` as a regular expression that matches exactly it.
pub(crate) fn regex_literal(text: &str) -> String {
    let mut p = String::with_capacity(text.len());
    for c in text.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            p.push('\\');
        }
        p.push(c);
    }
    p
}
