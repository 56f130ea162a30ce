//! What the worker tells the outside.
//!
//! - [`metrics`]: the Prometheus vital signs.
//! - [`vitals`]: `/metrics`, `/healthz`, `/readyz`, and the poll that fills in queue depths and
//!   tells the worker which lanes exist.
//! - [`events`]: operational events and the attempt log, never holding up a delivery.

pub mod events;
pub mod metrics;
pub mod vitals;
