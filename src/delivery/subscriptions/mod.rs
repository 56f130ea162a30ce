//! Subscriptions (id -> tenant, endpoint URL, event types, secrets) and the secret references
//! they carry. Secrets are `env:NAME` or `file:PATH` references, resolved when an attempt is
//! made, never copied into a message.
//!
//! - [`parse`]: the file and its validation.
//! - [`secrets`]: secret references and their resolution.
//! - [`headers`]: a subscription's own request headers, and the reserved names.
//! - [`auth`]: how it authenticates to its endpoint: basic auth, OAuth2, a client certificate.
//! - [`live`]: the version in force, reloaded as the file changes.

pub mod auth;
pub mod headers;
pub mod live;
pub mod parse;
pub mod secrets;

pub use auth::{BasicAuth, ClientAuthMethod, ClientTls, OAuth2};
pub use headers::{ExtraHeader, HeaderValueSpec};
pub use live::{LiveSubscriptions, Reload};
pub use parse::{EventFilter, Subscription, SubscriptionError, SubscriptionErrors, Subscriptions};
pub use secrets::{SealedSecret, SecretError, SecretRef, SecretSpec, SecretStore};
