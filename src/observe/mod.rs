//! What the worker tells the outside.
//!
//! - [`metrics`]: the Prometheus vital signs.
//! - [`vitals`]: `/metrics`, `/healthz`, `/readyz`, and the poll that fills in queue depths and
//!   tells the worker which lanes exist.
//! - [`events`]: operational events and the attempt log, never holding up a delivery.
//! - [`attempt_log`]: the attempt log's message forms, written and read (the compact batch of
//!   many routing keys, and the older forms every reader still reads).
//! - [`logs`]: the process's subscriber: log lines, and spans beside them.
//! - [`traces`]: OpenTelemetry spans over OTLP, never holding up a delivery either.

pub mod attempt_log;
pub mod events;
pub mod logs;
pub mod metrics;
pub mod traces;
pub mod vitals;
