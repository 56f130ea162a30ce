//! One delivery, from the lane to its settlement, in the order it happens.
//!
//! - [`worker`]: consumes the lanes and hands every delivery to a task of its own.
//! - [`lane`]: a ready queue as the worker consumes it, the budget shards share, and every lane
//!   it has consumed.
//! - [`dispatch`]: one delivery: read the envelope, route, sign, send, decide, settle.
//! - [`lookup`]: the subscriptions a delivery is routed with, from the bounded cache on a
//!   large store, a miss never holding the lane.
//! - [`route`]: the pure decision, before the attempt and after it.
//! - [`records`]: a settled delivery's attempt-log records, stored before its ack.
//! - [`spans`]: the delivery's trace spans: process, attempt, settle.
//! - [`settle`]: what replaces a delivery, confirmed before the ack, and the settler that
//!   publishes it.
//! - [`health`]: the endpoints' health signals reported: events, gauges, failing endpoints'
//!   subscriptions disabled.
//! - [`poll`]: the poll of the broker's queues: depths, idle lanes, lanes that appeared.
//! - [`parking`]: the parking queue a paused subscription's deliveries wait in.
//! - [`endpoint`]: per-endpoint concurrency caps, rate limits, circuit breakers and the ramp
//!   after recovery.
//! - [`fleet`]: the live worker count and each worker's share of the fleet-wide limits.
//! - [`egress`]: where a webhook may go.
//! - [`oauth`]: OAuth2 tokens for endpoints that want one, fetched once and cached.
//! - [`http`]: the signed POST, and the client certificate a subscription presents.
//! - [`amqp`]: the same attempt published into a partner's RabbitMQ, confirmed, over a pool
//!   of connections per destination.
//! - [`sweep`]: what the worker forgets: state no live subscription uses.

pub mod amqp;
pub mod dispatch;
pub mod egress;
pub mod endpoint;
pub mod fleet;
pub mod health;
pub mod http;
pub mod lane;
mod lookup;
pub mod oauth;
pub mod parking;
pub mod poll;
mod records;
pub mod route;
pub mod settle;
pub(crate) mod spans;
pub mod sweep;
pub mod worker;
