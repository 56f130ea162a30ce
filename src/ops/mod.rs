//! Operator tools: status, tier hold and release, redrive, and the mover both use.

pub mod mover;
pub mod progress;
pub mod redrive;
pub mod status;
pub mod tail;
pub mod tier;
