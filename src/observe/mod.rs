//! What the worker tells the outside: metrics, health, operational events and the attempt log.

pub mod events;
pub mod metrics;
pub mod vitals;
