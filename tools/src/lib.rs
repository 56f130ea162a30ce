//! hookrelay's development tools, kept out of the library that ships:
//!
//! - [`receiver`]: an embedded webhook endpoint that verifies signatures independently, for the
//!   demo and the tests.
//! - [`demo`]: `hookrelay-dev demo`, the whole path end to end.
//! - [`bench`]: `hookrelay-dev bench`, throughput against a raw consume loop, and the rest.
//! - [`kit`]: what the tests, the demo and the bench share.

#![warn(clippy::unwrap_used)]

pub mod bench;
pub mod demo;
pub mod kit;
pub mod receiver;
