//! Secret references (`env:NAME`, `file:PATH`) and the store that resolves them when an
//! attempt is made, with a short cache so rotation takes effect within `secrets.refresh`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::config::{Env, ProcessEnv};
use crate::delivery::signing::{KeyError, SigningKey};

use super::*;

/// Where a secret lives. The reference is what configuration and messages may show.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SecretRef {
    Env(String),
    File(PathBuf),
}

impl SecretRef {
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

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretRef::Env(name) => write!(f, "env:{name}"),
            SecretRef::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// A secret reference and when it stops being used for signing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    pub reference: SecretRef,
    pub expires: Option<SystemTime>,
}

impl SecretSpec {
    pub fn new(reference: SecretRef) -> Self {
        Self {
            reference,
            expires: None,
        }
    }

    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|at| now >= at)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret {reference}: environment variable is not set")]
    EnvMissing { reference: String },
    #[error("secret {reference}: cannot read file: {message}")]
    FileUnreadable { reference: String, message: String },
    #[error("secret {reference}: {source}")]
    Malformed { reference: String, source: KeyError },
}

struct Cached {
    at: Instant,
    key: Result<Arc<SigningKey>, SecretError>,
}

/// Resolves secret references to signing keys, reusing a resolution for `refresh` so an attempt
/// does not read a file, yet a rotation is seen within that time.
pub struct SecretStore {
    refresh: Duration,
    env: Arc<dyn Env>,
    cache: Mutex<HashMap<SecretRef, Cached>>,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretStore")
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl SecretStore {
    pub fn new(refresh: Duration) -> Self {
        Self::with_env(refresh, Arc::new(ProcessEnv))
    }

    pub fn with_env(refresh: Duration, env: Arc<dyn Env>) -> Self {
        Self {
            refresh,
            env,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn resolve(&self, reference: &SecretRef) -> Result<Arc<SigningKey>, SecretError> {
        {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = cache.get(reference)
                && hit.at.elapsed() < self.refresh
            {
                return hit.key.clone();
            }
        }
        let key = self.read(reference);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
            reference.clone(),
            Cached {
                at: Instant::now(),
                key: key.clone(),
            },
        );
        key
    }

    fn read(&self, reference: &SecretRef) -> Result<Arc<SigningKey>, SecretError> {
        let shown = reference.to_string();
        let raw = match reference {
            SecretRef::Env(name) => self.env.var(name).ok_or(SecretError::EnvMissing {
                reference: shown.clone(),
            })?,
            SecretRef::File(path) => {
                std::fs::read_to_string(path).map_err(|e| SecretError::FileUnreadable {
                    reference: shown.clone(),
                    message: e.to_string(),
                })?
            }
        };
        SigningKey::from_whsec(&raw)
            .map(Arc::new)
            .map_err(|source| SecretError::Malformed {
                reference: shown,
                source,
            })
    }

    /// The keys of every unexpired secret of `subscription` that resolves, newest first, and
    /// the errors of those that do not.
    pub fn keys_for(
        &self,
        subscription: &Subscription,
    ) -> (Vec<Arc<SigningKey>>, Vec<SecretError>) {
        let now = SystemTime::now();
        let mut keys = Vec::with_capacity(subscription.secrets.len());
        let mut errors = Vec::new();
        for spec in subscription.secrets.iter().filter(|s| !s.is_expired(now)) {
            match self.resolve(&spec.reference) {
                Ok(k) => keys.push(k),
                Err(e) => errors.push(e),
            }
        }
        (keys, errors)
    }

    /// Every reference of every subscription that does not resolve; a worker refuses to start
    /// while this is not empty.
    pub fn unresolved(&self, subscriptions: &Subscriptions) -> Vec<(String, SecretError)> {
        let mut missing = Vec::new();
        for sub in subscriptions.iter() {
            for e in self.keys_for(sub).1 {
                missing.push((sub.id.clone(), e));
            }
        }
        missing.sort_by(|a, b| a.0.cmp(&b.0));
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_resolve_from_env_and_files_and_refresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1");
        let v1 = crate::delivery::signing::generate_secret();
        std::fs::write(&path, format!("{v1}\n")).unwrap();
        let v2 = crate::delivery::signing::generate_secret();
        let env: HashMap<String, String> = [("V2".to_string(), v2.clone())].into();
        let store = SecretStore::with_env(Duration::ZERO, Arc::new(env));
        let mut sub = Subscription::new(
            "s",
            "t",
            "http://x.example".parse().unwrap(),
            SecretRef::Env("V2".into()),
        );
        sub.secrets
            .push(SecretSpec::new(SecretRef::File(path.clone())));
        let (keys, errors) = store.keys_for(&sub);
        assert_eq!((keys.len(), errors.len()), (2, 0));
        let expected = SigningKey::from_whsec(&v2).unwrap().sign("i", 1, b"{}");
        assert_eq!(keys[0].sign("i", 1, b"{}"), expected);

        std::fs::remove_file(&path).unwrap();
        let (keys, errors) = store.keys_for(&sub);
        assert_eq!(keys.len(), 1);
        assert!(
            errors[0].to_string().starts_with("secret file:"),
            "{}",
            errors[0]
        );
        let subs = Subscriptions::from_list([sub]);
        assert_eq!(store.unresolved(&subs).len(), 1);
    }

    #[test]
    fn expired_secrets_stop_signing_and_disabled_subscriptions_get_no_fan_out() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old");
        let new = dir.path().join("new");
        std::fs::write(&old, crate::delivery::signing::generate_secret()).unwrap();
        std::fs::write(&new, crate::delivery::signing::generate_secret()).unwrap();
        let text = format!(
            r#"
[[subscription]]
id = "b_rotating"
tenant = "acme"
url = "https://a.example"
secrets = ["file:{new}", {{ ref = "file:{old}", expires = "2001-01-01T00:00:00Z" }}]

[[subscription]]
id = "a_current"
tenant = "acme"
url = "https://b.example"
event_types = ["order.paid"]
secrets = [{{ ref = "file:{old}", expires = "2999-01-01T00:00:00Z" }}]

[[subscription]]
id = "c_off"
tenant = "acme"
url = "https://c.example"
enabled = false
secrets = ["file:{new}"]
"#,
            new = new.display(),
            old = old.display()
        );
        let subs = Subscriptions::parse("s.toml", &text).unwrap();
        let store = SecretStore::new(Duration::ZERO);
        assert_eq!(store.keys_for(subs.get("b_rotating").unwrap()).0.len(), 1);
        assert_eq!(store.keys_for(subs.get("a_current").unwrap()).0.len(), 1);
        let ids: Vec<_> = subs
            .matching("acme", "order.paid")
            .iter()
            .map(|s| s.id.clone())
            .collect();
        assert_eq!(ids, vec!["a_current", "b_rotating"]);
        assert_eq!(subs.matching("acme", "order.sent").len(), 1);
        assert!(subs.matching("globex", "order.paid").is_empty());

        let err = Subscriptions::parse(
            "s.toml",
            "[[subscription]]\nid = \"x\"\ntenant = \"t\"\nurl = \"https://x.example\"\nsecrets = [{ ref = \"env:A\", expires = \"soon\" }]\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("secrets.expires"), "{err}");
    }
}
