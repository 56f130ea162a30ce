//! What producers and hookrelay agree on: the envelope and the headers it carries.

pub mod envelope;
pub mod headers;
pub mod ladder;
