//! What the worker tells the outside.
//!
//! - [`metrics`]: the Prometheus vital signs.
//! - [`vitals`]: `/metrics`, `/healthz`, `/readyz`, and the poll that fills in queue depths and
//!   tells the worker which lanes exist.
//! - [`events`]: operational events and the attempt log, never holding up a delivery.
//! - [`logs`]: the process's subscriber: log lines, and spans beside them.
//! - [`traces`]: OpenTelemetry spans over OTLP, never holding up a delivery either.

pub mod events;
pub mod logs;
pub mod metrics;
pub mod traces;
pub mod vitals;
