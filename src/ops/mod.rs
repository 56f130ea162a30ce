//! Operator tools.
//!
//! - [`status`]: `hookrelay status`, the ladder at a glance.
//! - [`tier`]: holding a tier and releasing it, the incident lever instead of purging.
//! - [`redrive`]: moving envelopes out of the dead sink with a fresh budget.
//! - [`replay`]: publishing archived events again, by time range, tenant, subscription, type.
//! - [`pause`]: resuming a paused subscription, out of its parking queue.
//! - [`mover`]: the confirmed, paced queue-to-exchange move all three use.
//! - [`tail`]: following the attempt log.
//! - [`progress`]: progress bars (or log lines) for long work.

pub mod mover;
pub mod pause;
pub mod progress;
pub mod redrive;
pub mod replay;
pub mod status;
pub mod tail;
pub mod tier;
