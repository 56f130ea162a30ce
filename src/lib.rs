//! hookrelay: a webhook dispatcher on RabbitMQ. Producers publish events to an ingress exchange;
//! workers deliver each one as a signed HTTP POST, move failures through a ladder of TTL tiers,
//! and dead-letter what cannot be delivered, with a reason.
//!
//! One message through `src/`, folder by folder:
//!
//! - [`config`]: typed settings: defaults, a TOML file, `HOOKRELAY_*` variables, validation.
//! - [`contract`]: the envelope producers publish, the headers hookrelay adds, the signature
//!   receivers verify, the ladder (its tiers, dedicated tenants, shards and streams) and every
//!   name it gives a queue.
//! - [`broker`]: confirmed publishing, the ladder's exchanges and queues, reading its streams,
//!   what the broker's refusals mean, the management API.
//! - [`delivery`]: the worker, one delivery's dispatch, the routing decision, egress,
//!   endpoint limits and each worker's share of them in a fleet, OAuth2 tokens for endpoints,
//!   the HTTP edge and the AMQP edge (a partner's RabbitMQ), the parking of paused
//!   subscriptions and the poll of the broker's queues.
//! - [`observe`]: metrics, `/healthz` and `/readyz`, operational events and the attempt log.
//! - [`ops`]: operator tools: status, tier hold and release, subscription resume, redrive, the
//!   mover, the attempt-log tail, progress.
//! - [`catalog`]: the event types producers promise: a JSON Schema per version, an example, a
//!   validation mode; compiled once per change, and the verdict on one event.
//! - [`subscriptions`]: who receives what, and where (an HTTP endpoint or a partner's broker):
//!   the file, secret references and their sealing, the version in force.
//! - [`store`]: where subscriptions are kept: the file, or PostgreSQL with encrypted secrets;
//!   every query of the store's tables, the API's and the remembered `Idempotency-Key`s among them.
//! - [`history`]: the archive and the attempt log materialized into PostgreSQL: `hookrelay
//!   history`, and the story of an event for `trace` and the API.
//! - [`api`]: `hookrelay api`, the control plane's HTTP API over the PostgreSQL store.
//! - [`web`]: the pages `hookrelay api` serves beside it: the tenant portal and the operator
//!   console.
//! - [`cli`]: the command line.
//! - [`units`]: durations, clocks, truncation: a leaf every module may use.
//!
//! The demo, the bench and the verifying receiver live in `tools/`, outside this library.

#![warn(clippy::unwrap_used)]

pub mod api;
pub mod broker;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod contract;
pub mod delivery;
pub mod history;
pub mod observe;
pub mod ops;
pub mod store;
pub mod subscriptions;
pub mod units;
pub mod web;
