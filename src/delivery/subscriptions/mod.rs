//! Subscriptions (id -> tenant, endpoint URL, event types, secrets) and the secret references
//! they carry. Secrets are `env:NAME` or `file:PATH` references, resolved when an attempt is
//! made, never copied into a message.
//!
//! - [`parse`]: the file and its validation.
//! - [`secrets`]: secret references and their resolution.
//! - [`headers`]: a subscription's own request headers and basic auth, and the reserved names.
//! - [`live`]: the version in force, reloaded as the file changes.

pub mod headers;
pub mod live;
pub mod parse;
pub mod secrets;

pub use headers::{BasicAuth, ExtraHeader, HeaderValueSpec};
pub use live::{LiveSubscriptions, Reload};
pub use parse::{EventFilter, Subscription, SubscriptionError, SubscriptionErrors, Subscriptions};
pub use secrets::{SealedSecret, SecretError, SecretRef, SecretSpec, SecretStore};
