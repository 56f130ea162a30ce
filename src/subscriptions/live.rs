//! The subscriptions in force, live: reloaded when the file changes (or on SIGHUP), a changed
//! file refused loudly when invalid, the last good version kept; or, from a large store, the
//! ones held in a bounded cache.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::cache::SubscriptionCache;
use super::*;

/// The subscriptions in force, replaced whole when the file changes and the new version is
/// valid. Readers take a snapshot per attempt without locking.
#[derive(Debug)]
pub struct LiveSubscriptions {
    current: ArcSwap<Subscriptions>,
    path: Option<PathBuf>,
    /// The file content last put in force, and the error last reported for a refused one.
    state: Mutex<(Vec<u8>, Option<String>)>,
    /// From a store too large to hold whole: what is held ([`super::cache`]), in place of
    /// `current`.
    cache: Option<Arc<SubscriptionCache>>,
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
            cache: None,
        }
    }

    /// Subscriptions held as deliveries need them, in `cache`, which a store's follower keeps
    /// current ([`crate::store::follow`]).
    pub fn cached(cache: Arc<SubscriptionCache>) -> Self {
        Self {
            cache: Some(cache),
            ..Self::fixed(Subscriptions::default())
        }
    }

    /// The cache, when subscriptions are held as deliveries need them.
    pub fn cache(&self) -> Option<&Arc<SubscriptionCache>> {
        self.cache.as_ref()
    }

    /// Loads the file; it must be valid now.
    pub fn from_file(path: &Path) -> Result<Self, SubscriptionErrors> {
        let content = read_file(path)?;
        let subscriptions = Self::parse_bytes(path, &content)?;
        Ok(Self {
            current: ArcSwap::from_pointee(subscriptions),
            path: Some(path.to_path_buf()),
            state: Mutex::new((content, None)),
            cache: None,
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

    /// Subscriptions a store keeps current ([`crate::store::follow`]), starting with `first`.
    pub fn followed(first: Subscriptions) -> Self {
        Self::fixed(first)
    }

    /// Puts a whole new version in force (a full read of a store).
    pub fn replace(&self, subscriptions: Subscriptions) {
        self.current.store(Arc::new(subscriptions));
    }

    /// Puts a whole new version in force and returns the one it replaces (for the caller to
    /// drop where it costs nobody: a large snapshot takes a while to free).
    pub fn replace_arc(&self, subscriptions: Arc<Subscriptions>) -> Arc<Subscriptions> {
        self.current.swap(subscriptions)
    }

    /// Replaces (`Some`) or removes (`None`) some subscriptions, by id.
    pub fn apply(&self, changes: Vec<(String, Option<Subscription>)>) {
        let next = self.current.load().with_changes(changes);
        self.current.store(Arc::new(next));
    }

    /// The version in force now; with a cache, every subscription it holds.
    pub fn current(&self) -> Arc<Subscriptions> {
        match &self.cache {
            Some(cache) => cache.snapshot(),
            None => self.current.load_full(),
        }
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
