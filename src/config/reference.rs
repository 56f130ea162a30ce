//! Secret references as configuration writes them: where a secret lives, never the secret.

use std::path::PathBuf;

/// Where a secret lives: `env:NAME` or `file:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

/// Why text is not a secret reference. None repeats the text: it may be the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("env: needs a variable name, as in \"env:ACME_WHSEC\"")]
    NoVariable,
    #[error("file: needs a path, as in \"file:/run/secrets/acme\"")]
    NoPath,
    /// A `whsec_` secret written where its reference belongs: it is to be moved out of the
    /// configuration, not only rewritten.
    #[error("secrets are references, never the secret itself: use \"env:NAME\" or \"file:PATH\"")]
    Secret,
    #[error("not a secret reference: use \"env:NAME\" or \"file:PATH\"")]
    NotAReference,
}

impl SecretSource {
    pub fn parse(raw: &str) -> Result<Self, ReferenceError> {
        if let Some(name) = raw.strip_prefix("env:") {
            if name.is_empty() {
                return Err(ReferenceError::NoVariable);
            }
            Ok(Self::Env(name.to_owned()))
        } else if let Some(path) = raw.strip_prefix("file:") {
            if path.is_empty() {
                return Err(ReferenceError::NoPath);
            }
            Ok(Self::File(PathBuf::from(path)))
        } else if raw.starts_with("whsec_") {
            Err(ReferenceError::Secret)
        } else {
            // Not quoted: what was written may be a secret without its prefix.
            Err(ReferenceError::NotAReference)
        }
    }
}
