//! The broker edge: confirmed publishing, the ladder's objects, the management API, and what
//! the broker's refusals mean.

pub mod drift;
pub mod error;
pub mod management;
pub mod publish;
pub mod topology;
