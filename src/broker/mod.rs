//! The broker edge: confirmed publishing, the ladder's objects, and the management API.

pub mod drift;
pub mod management;
pub mod publish;
pub mod topology;
