//! Secret references as configuration writes them: where a secret lives, never the secret.

use std::path::PathBuf;

/// Where a secret lives: `env:NAME` or `file:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

impl SecretSource {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if let Some(name) = raw.strip_prefix("env:") {
            if name.is_empty() {
                return Err("env: needs a variable name, as in \"env:ACME_WHSEC\"".into());
            }
            Ok(Self::Env(name.to_owned()))
        } else if let Some(path) = raw.strip_prefix("file:") {
            if path.is_empty() {
                return Err("file: needs a path, as in \"file:/run/secrets/acme\"".into());
            }
            Ok(Self::File(PathBuf::from(path)))
        } else if raw.starts_with("whsec_") {
            Err("secrets are references, never the secret itself: \
                 use \"env:NAME\" or \"file:PATH\""
                .into())
        } else {
            // Not quoted: what was written may be a secret without its prefix.
            Err("not a secret reference: use \"env:NAME\" or \"file:PATH\"".into())
        }
    }
}
