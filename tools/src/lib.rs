//! hookrelay's development tools, kept out of the library that ships:
//!
//! - [`receiver`]: an embedded webhook endpoint that verifies signatures independently, for the
//!   demo and the tests.
//! - [`demo`]: `hookrelay-dev demo`, the whole path end to end.
//! - [`bench`]: `hookrelay-dev bench`, throughput against a raw consume loop, and the rest.
//! - [`kit`]: what the tests, the demo and the bench share.
//! - [`node`]: a RabbitMQ node (or a cluster of three) of its own beside the machine's broker,
//!   for the fault suite and the bench's cluster runs.

#![warn(clippy::unwrap_used)]

pub mod bench;
pub mod demo;
pub mod kit;
pub mod node;
pub mod receiver;
