//! Subscriptions (id -> tenant, endpoint URL, event types, secrets) and the secret references
//! they carry. Secrets are `env:NAME` or `file:PATH` references, resolved when an attempt is
//! made, never copied into a message.
//!
//! - [`subscription`]: one subscription, what it receives, and all of them indexed by tenant.
//! - [`parse`]: the file and its validation.
//! - [`secrets`]: secret references and their resolution.
//! - [`seal`]: secrets at rest, encrypted with the store's keys.
//! - [`headers`]: a subscription's own request headers, and the reserved names.
//! - [`destination`]: where deliveries go: an HTTP endpoint or a partner's RabbitMQ exchange.
//! - [`auth`]: how it authenticates to its endpoint: basic auth, OAuth2, a client certificate.
//! - [`payload`]: payload filters: which events it is sent, by what their payload holds.
//! - [`live`]: the version in force, reloaded as the file changes.
//! - [`cache`]: from a large store, the subscriptions in use, held within bounds.

pub mod auth;
pub mod cache;
pub mod destination;
pub mod headers;
pub mod live;
pub mod parse;
pub mod payload;
pub mod seal;
pub mod secrets;
pub mod subscription;

pub use auth::{BasicAuth, ClientAuthMethod, ClientTls, OAuth2};
pub use destination::AmqpTarget;
pub use headers::{ExtraHeader, HeaderValueSpec};
pub use live::{LiveSubscriptions, Reload};
pub use parse::{SubscriptionError, SubscriptionErrors};
pub use payload::{Payload, PayloadFilter, PayloadFilterError};
pub use secrets::{SealedSecret, SecretError, SecretRef, SecretSpec, SecretStore};
pub use subscription::{EventFilter, FilterError, Subscription, Subscriptions};
