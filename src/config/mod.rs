//! Typed configuration: embedded defaults, then the standard `OTEL_*` variables (for
//! `[traces]`), then a TOML file, then `HOOKRELAY_*` environment
//! variables, then [`Config::validate`] for the rules that span fields.
//!
//! Every setting `key` of section `[section]` can be overridden by `HOOKRELAY_<SECTION>_<KEY>`;
//! the top-level `ladder` and `subscriptions` paths by `HOOKRELAY_LADDER` and
//! `HOOKRELAY_SUBSCRIPTIONS`; `HOOKRELAY_CONFIG` names the file. The environment is read through
//! [`Env`] so tests pass a map instead of mutating the process environment.
//!
//! - [`sections`]: the settings, section by section, and their defaults.
//! - [`store`]: the PostgreSQL store's, among them the bounds of a worker's cache.
//! - [`load`]: defaults, file and environment merged into one [`Config`].
//! - [`validate`]: the rules that span fields, and the time budgets they protect.
//! - [`reference`]: where a secret named in configuration lives.
//! - [`url`]: URLs that may carry credentials, and how any URL is shown.
//! - [`source`]: where subscriptions are kept, as the `subscriptions` setting says.
//! - [`traces`]: where spans go, from `[traces]` or the standard `OTEL_*` variables.

mod load;
mod reference;
mod sections;
mod source;
mod store;
mod traces;
mod url;
mod validate;

#[cfg(test)]
use std::collections::HashMap;
use std::path::PathBuf;

pub use load::{Env, ProcessEnv};
pub use reference::{ReferenceError, SecretSource};
pub use sections::*;
pub use source::Source;
pub use store::StoreConfig;
pub use traces::{OtlpProtocol, TraceSampler, TracesConfig};
pub use url::{SecretUrl, shown_url};

/// What went wrong while loading or validating configuration. Every variant names its source.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid setting {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

impl ConfigError {
    pub(super) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// A map standing in for the process environment.
#[cfg(test)]
fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
