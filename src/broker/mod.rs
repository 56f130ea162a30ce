//! The RabbitMQ edge.
//!
//! - [`publish`]: confirmed, mandatory publishing, for producers and every republish.
//! - [`topology`]: the broker objects a ladder stands for (its shards too): declared, unbound
//!   when retired, exported.
//! - [`drift`]: `topology plan`, the ladder compared with what the broker has.
//! - [`streams`]: reading the archive and the attempt log's streams from an offset or a time.
//! - [`management`]: the management HTTP API, with typed answers.
//! - [`compat`]: what the broker's release means for hookrelay (RabbitMQ 3.x and 4.x), and the
//!   notes it calls for.
//! - [`error`]: what the broker's refusals mean, by reply code.

pub mod compat;
pub mod drift;
pub mod error;
pub mod management;
pub mod publish;
pub mod streams;
pub mod topology;
