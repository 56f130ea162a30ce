//! hookrelay: a webhook dispatcher on RabbitMQ. Producers publish events to an ingress exchange;
//! workers deliver each one as a signed HTTP POST, move failures through a ladder of TTL tiers,
//! and dead-letter what cannot be delivered, with a reason.
//!
//! One message through `src/`, in order:
//!
//! - [`config`]: typed settings: defaults, a TOML file, `HOOKRELAY_*` variables, validation.
//! - [`envelope`]: the contract producers follow, and how a delivery is read back.
//! - [`topology`]: the ladder file and the exchanges, lanes, tiers and sink it declares.
//! - [`publish`]: confirmed, mandatory publishing, for producers and for every republish.
//! - [`worker`]: consumes the lanes, one task per delivery; reconnects, reloads, drains.
//! - [`dispatch`]: one delivery: subscription as it is now, sign, send, decide, settle.
//! - [`subscriptions`]: who receives what (live from a file), secret references, fan-out targets.
//! - [`signing`]: Standard Webhooks signatures.
//! - [`egress`]: where a webhook may go, checked on the addresses actually connected to.
//! - [`endpoint`]: per-endpoint concurrency caps and circuit breakers.
//! - [`http`]: the signed POST, with enforced timeouts and a capped response read.
//! - [`outcome`]: the pure decision: ack, which tier, cancel, fan out, or dead-letter and why.
//! - [`events`]: operational events for owning systems, never holding up a delivery.
//! - [`metrics`]: the worker's Prometheus vital signs; [`vitals`] serves them and polls depths.
//! - [`management`]: the RabbitMQ management API, for `plan`, `status` and the tools below.
//! - [`status`]: `hookrelay status`, the ladder at a glance.
//! - [`tier`]: holding a tier and releasing it, the incident lever instead of purging.
//! - [`redrive`]: moving envelopes out of the dead sink with a fresh budget.
//! - [`mover`]: the confirmed, paced queue-to-exchange move both of those use.
//! - [`progress`]: progress bars (or log lines) for long work.
//! - [`bench`]: `hookrelay bench`, throughput against a raw consume loop, and the rest.
//! - [`receiver`]: an embedded, verifying webhook endpoint for the demo and tests.
//! - [`demo`]: `hookrelay demo`, the whole path end to end.
//! - [`cli`]: the command line.

#![warn(clippy::unwrap_used)]

pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod dispatch;
pub mod egress;
pub mod endpoint;
pub mod envelope;
pub mod events;
pub mod http;
pub mod management;
pub mod metrics;
pub mod mover;
pub mod outcome;
pub mod progress;
pub mod publish;
pub mod receiver;
pub mod redrive;
pub mod signing;
pub mod status;
pub mod subscriptions;
pub mod tier;
pub mod topology;
pub mod vitals;
pub mod worker;
