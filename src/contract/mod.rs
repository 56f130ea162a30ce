//! What producers and hookrelay agree on.
//!
//! - [`envelope`]: the envelope a producer publishes, its validation, and how a delivery is read
//!   back into one.
//! - [`headers`]: every header hookrelay reads or writes, and the properties of each republish.
//! - [`ladder`]: the retry ladder (tiers, schedule, dedicated tenants, shards) and every name it
//!   gives a queue or exchange.
//! - [`retention`]: the ladder's two streams (the archive of accepted events, the attempt log)
//!   and how long the broker keeps what they hold.
//! - [`signing`]: the Standard Webhooks signature a receiver verifies.
//! - [`trace_context`]: the W3C trace context an event carries, read and written.

pub mod envelope;
pub mod headers;
pub mod ladder;
pub mod retention;
pub mod signing;
pub mod trace_context;
