//! Subscriptions (id -> tenant, endpoint URL, event types, secrets) and the secret references
//! they carry. Secrets are `env:NAME` or `file:PATH` references, resolved when an attempt is
//! made, never copied into a message.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use serde::Deserialize;
use toml::Spanned;

use crate::config::{Env, ProcessEnv};
use crate::contract::envelope::{check_event_type, check_tenant};
use crate::delivery::signing::{KeyError, SigningKey};

/// A problem in a subscriptions file, located by line and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}: {field}: {message}")]
pub struct SubscriptionError {
    pub path: String,
    pub line: usize,
    pub field: String,
    pub message: String,
}

/// All the problems found in one file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct SubscriptionErrors(pub Vec<SubscriptionError>);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "subscription")]
    subscriptions: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: Spanned<String>,
    tenant: Spanned<String>,
    url: Spanned<String>,
    #[serde(default)]
    event_types: Option<Spanned<Vec<String>>>,
    secrets: Spanned<Vec<SecretEntry>>,
    #[serde(default = "enabled_by_default")]
    enabled: bool,
    #[serde(default)]
    max_concurrent: Option<u32>,
}

fn enabled_by_default() -> bool {
    true
}

/// `"env:NAME"`, or `{ ref = "env:NAME", expires = "2027-01-31T00:00:00Z" }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SecretEntry {
    Plain(String),
    Detailed {
        #[serde(rename = "ref")]
        reference: String,
        expires: Option<String>,
    },
}

/// Which event types a subscription receives: exact names and `prefix.*` wildcards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventFilter {
    Exact(String),
    /// `order.*`: stored as `order.`; matches every type that starts with it.
    Prefix(String),
}

impl EventFilter {
    fn parse(raw: &str) -> Result<Self, String> {
        if let Some(prefix) = raw.strip_suffix('*') {
            if !prefix.ends_with('.') || check_event_type(prefix.trim_end_matches('.')).is_err() {
                return Err(format!(
                    "{raw:?}: a wildcard is written \"prefix.*\" (for example \"order.*\")"
                ));
            }
            return Ok(Self::Prefix(prefix.to_owned()));
        }
        check_event_type(raw).map_err(|e| e.to_string())?;
        Ok(Self::Exact(raw.to_owned()))
    }

    pub fn matches(&self, event_type: &str) -> bool {
        match self {
            EventFilter::Exact(t) => t == event_type,
            EventFilter::Prefix(p) => event_type.starts_with(p.as_str()),
        }
    }
}

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
            Err(format!(
                "{raw:?} is not a secret reference: use \"env:NAME\" or \"file:PATH\""
            ))
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

/// One subscription as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub id: String,
    pub tenant: String,
    pub url: reqwest::Url,
    /// `None`: every event type.
    pub event_types: Option<Vec<EventFilter>>,
    /// Newest first.
    pub secrets: Vec<SecretSpec>,
    /// A disabled subscription receives nothing; what waits for it is cancelled.
    pub enabled: bool,
    /// Attempts at once to this subscription's endpoint, instead of `endpoints.max_concurrent`.
    pub max_concurrent: Option<u32>,
}

impl Subscription {
    /// A subscription with every event type, one secret, enabled.
    pub fn new(id: &str, tenant: &str, url: reqwest::Url, secret: SecretRef) -> Self {
        Self {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            url,
            event_types: None,
            secrets: vec![SecretSpec::new(secret)],
            enabled: true,
            max_concurrent: None,
        }
    }

    pub fn accepts(&self, event_type: &str) -> bool {
        self.event_types
            .as_ref()
            .is_none_or(|filters| filters.iter().any(|f| f.matches(event_type)))
    }
}

/// Every subscription, by id.
#[derive(Debug, Clone, Default)]
pub struct Subscriptions {
    by_id: HashMap<String, Arc<Subscription>>,
}

impl Subscriptions {
    pub fn load(path: &Path) -> Result<Self, SubscriptionErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            SubscriptionErrors(vec![SubscriptionError {
                path: path.display().to_string(),
                line: 0,
                field: "(file)".into(),
                message: format!("cannot read: {e}"),
            }])
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Parses and validates a whole file, collecting every problem rather than the first.
    pub fn parse(path: &str, text: &str) -> Result<Self, SubscriptionErrors> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let error = |offset: usize, field: &str, message: String| SubscriptionError {
            path: path.to_owned(),
            line: line_of(offset),
            field: field.to_owned(),
            message,
        };
        let file: File = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of(s.start));
            // The key written on the offending line, when there is one (`url = 5` -> `url`).
            let field = text
                .lines()
                .nth(line.saturating_sub(1))
                .and_then(|l| l.split_once('='))
                .map(|(key, _)| key.trim().to_owned())
                .filter(|key| !key.is_empty() && !key.starts_with('['))
                .unwrap_or_else(|| "(syntax)".into());
            SubscriptionErrors(vec![SubscriptionError {
                path: path.to_owned(),
                line,
                field,
                message: e.message().trim().to_owned(),
            }])
        })?;
        let mut errors = Vec::new();
        let mut by_id = HashMap::new();
        for entry in file.subscriptions {
            let before = errors.len();
            let id = entry.id.get_ref();
            if crate::contract::envelope::check_id(id).is_err() {
                errors.push(error(
                    entry.id.span().start,
                    "id",
                    format!("{id:?}: expected 1 to 128 letters, digits, '_' or '-'"),
                ));
            }
            if by_id.contains_key(id) {
                errors.push(error(
                    entry.id.span().start,
                    "id",
                    format!("{id:?} is defined twice"),
                ));
            }
            if let Err(e) = check_tenant(entry.tenant.get_ref()) {
                errors.push(error(entry.tenant.span().start, "tenant", e.to_string()));
            }
            let url = match reqwest::Url::parse(entry.url.get_ref()) {
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                    Some(url)
                }
                Ok(_) => {
                    errors.push(error(
                        entry.url.span().start,
                        "url",
                        format!(
                            "{:?}: expected an http:// or https:// URL with a host",
                            entry.url.get_ref()
                        ),
                    ));
                    None
                }
                Err(e) => {
                    errors.push(error(
                        entry.url.span().start,
                        "url",
                        format!("{:?} is not a URL: {e}", entry.url.get_ref()),
                    ));
                    None
                }
            };
            let event_types = match &entry.event_types {
                None => None,
                Some(types) => {
                    let mut filters = Vec::new();
                    for raw in types.get_ref() {
                        match EventFilter::parse(raw) {
                            Ok(f) => filters.push(f),
                            Err(message) => {
                                errors.push(error(types.span().start, "event_types", message))
                            }
                        }
                    }
                    if types.get_ref().is_empty() {
                        errors.push(error(
                            types.span().start,
                            "event_types",
                            "an empty list would match nothing; leave event_types out to \
                             receive every type"
                                .into(),
                        ));
                    }
                    Some(filters)
                }
            };
            let mut secrets = Vec::new();
            for raw in entry.secrets.get_ref() {
                let (reference, expires) = match raw {
                    SecretEntry::Plain(r) => (r, None),
                    SecretEntry::Detailed { reference, expires } => (reference, expires.as_ref()),
                };
                let expires = match expires.map(|t| humantime::parse_rfc3339_weak(t)) {
                    None => None,
                    Some(Ok(at)) => Some(at),
                    Some(Err(e)) => {
                        errors.push(error(
                            entry.secrets.span().start,
                            "secrets.expires",
                            format!(
                                "{:?} is not a time like \"2027-01-31T00:00:00Z\": {e}",
                                expires.map_or("", |t| t.as_str())
                            ),
                        ));
                        None
                    }
                };
                match SecretRef::parse(reference) {
                    Ok(reference) => secrets.push(SecretSpec { reference, expires }),
                    Err(message) => {
                        errors.push(error(entry.secrets.span().start, "secrets", message))
                    }
                }
            }
            if entry.secrets.get_ref().is_empty() {
                errors.push(error(
                    entry.secrets.span().start,
                    "secrets",
                    "at least one secret reference is needed to sign deliveries".into(),
                ));
            }
            if errors.len() == before
                && let Some(url) = url
            {
                by_id.insert(
                    id.clone(),
                    Arc::new(Subscription {
                        id: id.clone(),
                        tenant: entry.tenant.into_inner(),
                        url,
                        event_types,
                        secrets,
                        enabled: entry.enabled,
                        max_concurrent: entry.max_concurrent.filter(|&n| n > 0),
                    }),
                );
            }
        }
        if errors.is_empty() {
            Ok(Self { by_id })
        } else {
            Err(SubscriptionErrors(errors))
        }
    }

    pub fn from_list(list: impl IntoIterator<Item = Subscription>) -> Self {
        Self {
            by_id: list
                .into_iter()
                .map(|s| (s.id.clone(), Arc::new(s)))
                .collect(),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Arc<Subscription>> {
        self.by_id.get(id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Subscription>> {
        self.by_id.values()
    }

    /// The enabled subscriptions of `tenant` that receive `event_type`, by id: a fan-out's
    /// targets.
    pub fn matching(&self, tenant: &str, event_type: &str) -> Vec<Arc<Subscription>> {
        let mut found: Vec<Arc<Subscription>> = self
            .by_id
            .values()
            .filter(|s| s.enabled && s.tenant == tenant && s.accepts(event_type))
            .cloned()
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        found
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
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

/// The subscriptions in force, replaced whole when the file changes and the new version is
/// valid. Readers take a snapshot per attempt without locking.
#[derive(Debug)]
pub struct LiveSubscriptions {
    current: ArcSwap<Subscriptions>,
    path: Option<PathBuf>,
    /// The file content last put in force, and the error last reported for a refused one.
    state: Mutex<(Vec<u8>, Option<String>)>,
}

/// What one look at the file found.
#[derive(Debug)]
pub enum Reload {
    Unchanged,
    /// A new version is in force, with this many subscriptions.
    Applied(usize),
    /// A changed file was refused; the previous version stays. `first` is false when the same
    /// problems were already reported.
    Refused {
        errors: SubscriptionErrors,
        first: bool,
    },
}

impl LiveSubscriptions {
    /// Subscriptions that never change (tests, the demo).
    pub fn fixed(subscriptions: Subscriptions) -> Self {
        Self {
            current: ArcSwap::from_pointee(subscriptions),
            path: None,
            state: Mutex::new((Vec::new(), None)),
        }
    }

    /// Loads the file; it must be valid now.
    pub fn from_file(path: &Path) -> Result<Self, SubscriptionErrors> {
        let content = read_file(path)?;
        let subscriptions = Self::parse_bytes(path, &content)?;
        Ok(Self {
            current: ArcSwap::from_pointee(subscriptions),
            path: Some(path.to_path_buf()),
            state: Mutex::new((content, None)),
        })
    }

    fn parse_bytes(path: &Path, content: &[u8]) -> Result<Subscriptions, SubscriptionErrors> {
        let text = std::str::from_utf8(content).map_err(|_| {
            SubscriptionErrors(vec![SubscriptionError {
                path: path.display().to_string(),
                line: 0,
                field: "(file)".into(),
                message: "not UTF-8 text".into(),
            }])
        })?;
        Subscriptions::parse(&path.display().to_string(), text)
    }

    /// The version in force now.
    pub fn current(&self) -> Arc<Subscriptions> {
        self.current.load_full()
    }

    /// The file this was loaded from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the file again. A changed, valid version replaces the current one, after `accept`
    /// agrees (the worker checks that its secrets resolve); anything else leaves it in force.
    pub fn reload(
        &self,
        accept: impl Fn(&Subscriptions) -> Result<(), SubscriptionErrors>,
    ) -> Reload {
        let Some(path) = &self.path else {
            return Reload::Unchanged;
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let content = match read_file(path) {
            Ok(c) => c,
            Err(errors) => return refuse(&mut state, errors),
        };
        if content == state.0 {
            state.1 = None;
            return Reload::Unchanged;
        }
        match Self::parse_bytes(path, &content).and_then(|s| accept(&s).map(|()| s)) {
            Ok(subscriptions) => {
                let n = subscriptions.len();
                self.current.store(Arc::new(subscriptions));
                *state = (content, None);
                Reload::Applied(n)
            }
            Err(errors) => refuse(&mut state, errors),
        }
    }
}

fn refuse(state: &mut (Vec<u8>, Option<String>), errors: SubscriptionErrors) -> Reload {
    let shown = errors.to_string();
    let first = state.1.as_deref() != Some(shown.as_str());
    state.1 = Some(shown);
    Reload::Refused { errors, first }
}

fn read_file(path: &Path) -> Result<Vec<u8>, SubscriptionErrors> {
    std::fs::read(path).map_err(|e| {
        SubscriptionErrors(vec![SubscriptionError {
            path: path.display().to_string(),
            line: 0,
            field: "(file)".into(),
            message: format!("cannot read: {e}"),
        }])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[subscription]]
id = "sub_orders"
tenant = "acme"
url = "https://hooks.acme.example/orders"
event_types = ["order.*", "invoice.paid"]
secrets = ["env:ACME_WHSEC_V2", "file:/run/secrets/acme_v1"]

[[subscription]]
id = "sub_all"
tenant = "acme"
url = "http://127.0.0.1:9000/"
secrets = ["env:X"]
"#;

    #[test]
    fn parses_the_documented_shape() {
        let subs = Subscriptions::parse("s.toml", GOOD).unwrap();
        assert_eq!(subs.len(), 2);
        let orders = subs.get("sub_orders").unwrap();
        assert_eq!(orders.tenant, "acme");
        assert_eq!(
            orders.secrets,
            vec![
                SecretSpec::new(SecretRef::Env("ACME_WHSEC_V2".into())),
                SecretSpec::new(SecretRef::File("/run/secrets/acme_v1".into()))
            ]
        );
        assert!(orders.enabled);
        assert!(orders.accepts("order.paid"));
        assert!(orders.accepts("order.refund.created"));
        assert!(orders.accepts("invoice.paid"));
        assert!(!orders.accepts("invoice.sent"));
        assert!(!orders.accepts("orders"));
        assert!(subs.get("sub_all").unwrap().accepts("anything"));
    }

    #[test]
    fn every_problem_is_reported_with_its_line_and_field() {
        let text = r#"
[[subscription]]
id = "a.b"
tenant = "acme"
url = "ftp://x"
secrets = ["whsec_abc"]

[[subscription]]
id = "ok"
tenant = "ac me"
url = "https://x.example"
event_types = ["order*"]
secrets = []
"#;
        let errors = Subscriptions::parse("s.toml", text).unwrap_err().0;
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 6, "{shown:#?}");
        assert!(shown[0].starts_with("s.toml:3: id:"), "{}", shown[0]);
        assert!(shown[1].starts_with("s.toml:5: url:"), "{}", shown[1]);
        assert!(shown[2].contains("never the secret itself"), "{}", shown[2]);
        assert!(shown[3].starts_with("s.toml:10: tenant:"), "{}", shown[3]);
        assert!(shown[4].contains("prefix.*"), "{}", shown[4]);
        assert!(shown[5].starts_with("s.toml:13: secrets:"), "{}", shown[5]);

        let err = Subscriptions::parse("s.toml", "[[subscription]]\nid = 5\n").unwrap_err();
        assert_eq!(err.0[0].line, 2, "{err}");
        assert_eq!(
            err.to_string(),
            "s.toml:2: id: invalid type: integer `5`, expected a string"
        );
        let err = Subscriptions::parse("s.toml", "[[subscription]]\nid = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
    }

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

    #[test]
    fn a_reload_applies_valid_versions_and_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subs.toml");
        let version = |url: &str| {
            format!(
                "[[subscription]]\nid = \"s\"\ntenant = \"t\"\nurl = \"{url}\"\nsecrets = [\"env:X\"]\n"
            )
        };
        std::fs::write(&path, version("https://one.example")).unwrap();
        let live = LiveSubscriptions::from_file(&path).unwrap();
        let url = |live: &LiveSubscriptions| live.current().get("s").unwrap().url.to_string();
        assert!(matches!(live.reload(|_| Ok(())), Reload::Unchanged));

        std::fs::write(&path, version("https://two.example")).unwrap();
        assert!(matches!(live.reload(|_| Ok(())), Reload::Applied(1)));
        assert_eq!(url(&live), "https://two.example/");

        std::fs::write(&path, "[[subscription]]\nid = ").unwrap();
        assert!(matches!(
            live.reload(|_| Ok(())),
            Reload::Refused { first: true, .. }
        ));
        assert!(matches!(
            live.reload(|_| Ok(())),
            Reload::Refused { first: false, .. }
        ));
        assert_eq!(url(&live), "https://two.example/");

        // Valid, but the caller refuses it (say, a secret that does not resolve).
        std::fs::write(&path, version("https://three.example")).unwrap();
        let refuse = |_: &Subscriptions| {
            Err(SubscriptionErrors(vec![SubscriptionError {
                path: "p".into(),
                line: 0,
                field: "secrets".into(),
                message: "does not resolve".into(),
            }]))
        };
        assert!(matches!(
            live.reload(refuse),
            Reload::Refused { first: true, .. }
        ));
        assert_eq!(url(&live), "https://two.example/");
        // Once the caller agrees, the same file goes into force.
        assert!(matches!(live.reload(|_| Ok(())), Reload::Applied(1)));
        assert_eq!(url(&live), "https://three.example/");

        std::fs::remove_file(&path).unwrap();
        assert!(matches!(live.reload(|_| Ok(())), Reload::Refused { .. }));
        assert_eq!(url(&live), "https://three.example/");
    }
}
