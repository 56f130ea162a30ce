//! Who may call the API: bearer tokens configured by reference (`api.tokens`), each an admin's
//! or scoped to one tenant. Only SHA-256 hashes of the tokens are kept in memory, and a
//! presented token is compared with every one of them in constant time, so neither the time an
//! answer takes nor a memory dump tells a token.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{ApiToken, Env};
use crate::subscriptions::SecretRef;

use super::problem::Problem;

/// A token shorter than this is refused at start: a bearer token must not be guessable.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("api.tokens: {reference}: environment variable is not set")]
    EnvMissing { reference: String },
    #[error("api.tokens: {reference}: cannot read file: {message}")]
    FileUnreadable { reference: String, message: String },
    #[error("api.tokens: {reference}: a token must be at least {MIN_TOKEN_LEN} characters")]
    TooShort { reference: String },
    #[error("api.tokens: {0}")]
    NotAReference(String),
}

/// What a caller may see and change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every tenant's subscriptions.
    Admin,
    /// Only this tenant's: another tenant's subscription is answered 404, as if it did not exist.
    Tenant(String),
}

impl Scope {
    /// The tenant a query is limited to (`None`: all).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Scope::Admin => None,
            Scope::Tenant(t) => Some(t),
        }
    }

    /// Whether this caller may see subscriptions of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenant().is_none_or(|t| t == tenant)
    }

    /// The namespace of the caller's `Idempotency-Key`s.
    pub fn idempotency_scope(&self) -> String {
        match self {
            Scope::Admin => "admin".into(),
            Scope::Tenant(t) => format!("tenant:{t}"),
        }
    }
}

/// The configured tokens, hashed.
#[derive(Clone, Default)]
pub struct Tokens {
    hashed: Arc<Vec<([u8; 32], Scope)>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.hashed.len())
            .finish_non_exhaustive()
    }
}

fn hash(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Tokens {
    /// Resolves every reference of `api.tokens` through `env` (or the file it names).
    pub fn resolve(tokens: &[ApiToken], env: &dyn Env) -> Result<Self, TokenError> {
        let mut hashed = Vec::with_capacity(tokens.len());
        for configured in tokens {
            let reference = SecretRef::parse(&configured.token)
                .map_err(|e| TokenError::NotAReference(e.to_string()))?;
            let shown = reference.to_string();
            let value = match &reference {
                SecretRef::Env(name) => env.var(name).ok_or(TokenError::EnvMissing {
                    reference: shown.clone(),
                })?,
                SecretRef::File(path) => {
                    std::fs::read_to_string(path).map_err(|e| TokenError::FileUnreadable {
                        reference: shown.clone(),
                        message: e.to_string(),
                    })?
                }
                SecretRef::Sealed(_) => {
                    return Err(TokenError::NotAReference(
                        "a token is an env: or file: reference".into(),
                    ));
                }
            };
            let value = value.trim();
            if value.len() < MIN_TOKEN_LEN {
                return Err(TokenError::TooShort { reference: shown });
            }
            let scope = match &configured.tenant {
                Some(t) => Scope::Tenant(t.clone()),
                None => Scope::Admin,
            };
            hashed.push((hash(value.as_bytes()), scope));
        }
        Ok(Self {
            hashed: Arc::new(hashed),
        })
    }

    /// Tokens given as they are (tests, benches).
    pub fn from_plain(tokens: &[(&str, Option<&str>)]) -> Self {
        let hashed = tokens
            .iter()
            .map(|(token, tenant)| {
                let scope = tenant.map_or(Scope::Admin, |t| Scope::Tenant(t.to_owned()));
                (hash(token.as_bytes()), scope)
            })
            .collect();
        Self {
            hashed: Arc::new(hashed),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.hashed.is_empty()
    }

    /// The scope of `presented`, or `None`. Every configured token is compared, in constant
    /// time, whichever matches.
    pub fn scope_of(&self, presented: &str) -> Option<Scope> {
        let presented = hash(presented.as_bytes());
        let mut found = None;
        for (known, scope) in self.hashed.iter() {
            if bool::from(known.ct_eq(&presented)) && found.is_none() {
                found = Some(scope.clone());
            }
        }
        found
    }
}

/// The bearer token of `Authorization: Bearer <token>`.
fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// What [`require_token`] checks requests with.
#[derive(Debug, Clone)]
pub struct Gate {
    pub tokens: Tokens,
    /// The most of a refused request's body read before its 401 (`api.max_body_bytes`).
    pub drain: usize,
}

/// Lets through requests with a valid token, with its [`Scope`] in the request's extensions;
/// answers every other 401, with no detail, once its body is read
/// ([`super::keepalive::drain`], at most `drain` bytes).
pub async fn require_token(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    match bearer(&request).and_then(|t| gate.tokens.scope_of(t)) {
        Some(scope) => {
            request.extensions_mut().insert(scope);
            next.run(request).await
        }
        None => {
            super::keepalive::drain(request.into_body(), gate.drain).await;
            Problem::unauthorized().into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn tokens_resolve_by_reference_and_match_by_hash() {
        let env: HashMap<String, String> = [
            ("ADMIN".to_string(), "admin-token-0123456789".to_string()),
            ("ACME".to_string(), "acme-token-0123456789\n".to_string()),
            ("SHORT".to_string(), "short".to_string()),
        ]
        .into();
        let configured = [
            ApiToken {
                token: "env:ADMIN".into(),
                tenant: None,
            },
            ApiToken {
                token: "env:ACME".into(),
                tenant: Some("acme".into()),
            },
        ];
        let tokens = Tokens::resolve(&configured, &env).unwrap();
        assert_eq!(
            tokens.scope_of("admin-token-0123456789"),
            Some(Scope::Admin)
        );
        assert_eq!(
            tokens.scope_of("acme-token-0123456789"),
            Some(Scope::Tenant("acme".into()))
        );
        assert_eq!(tokens.scope_of("acme-token-012345678"), None);
        assert!(!format!("{tokens:?}").contains("token-"));

        let short = [ApiToken {
            token: "env:SHORT".into(),
            tenant: None,
        }];
        assert!(matches!(
            Tokens::resolve(&short, &env),
            Err(TokenError::TooShort { .. })
        ));
        let missing = [ApiToken {
            token: "env:NOPE".into(),
            tenant: None,
        }];
        assert!(matches!(
            Tokens::resolve(&missing, &env),
            Err(TokenError::EnvMissing { .. })
        ));
    }
}
