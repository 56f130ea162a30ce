//! One subscription, the event types it receives, and every subscription indexed for a
//! fan-out.

use std::collections::HashMap;
use std::sync::Arc;

use crate::contract::envelope::{InvalidEnvelope, check_event_type};
use crate::units::Rate;

use super::*;

/// Which event types a subscription receives: exact names and `prefix.*` wildcards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventFilter {
    Exact(String),
    /// `order.*`: stored as `order.`; matches every type that starts with it.
    Prefix(String),
}

/// Why text is not an event filter: the filter is to be rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("{0:?}: a wildcard is written \"prefix.*\" (for example \"order.*\")")]
    Wildcard(String),
    /// Not an event type; the envelope's rule says why.
    #[error("{0}")]
    EventType(InvalidEnvelope),
}

impl EventFilter {
    pub fn parse(raw: &str) -> Result<Self, FilterError> {
        if let Some(prefix) = raw.strip_suffix('*') {
            if !prefix.ends_with('.') || check_event_type(prefix.trim_end_matches('.')).is_err() {
                return Err(FilterError::Wildcard(raw.to_owned()));
            }
            return Ok(Self::Prefix(prefix.to_owned()));
        }
        check_event_type(raw).map_err(FilterError::EventType)?;
        Ok(Self::Exact(raw.to_owned()))
    }

    pub fn matches(&self, event_type: &str) -> bool {
        match self {
            EventFilter::Exact(t) => t == event_type,
            EventFilter::Prefix(p) => event_type.starts_with(p.as_str()),
        }
    }
}

/// As written: `order.created`, `order.*`.
impl std::fmt::Display for EventFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventFilter::Exact(t) => f.write_str(t),
            EventFilter::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// One subscription as it is now. `Debug` shows the URL without user information or query.
#[derive(Clone, PartialEq, Eq)]
pub struct Subscription {
    pub id: String,
    pub tenant: String,
    /// An HTTP endpoint, or a partner's broker (`amqp://`, `amqps://`) published to at `amqp`.
    pub url: reqwest::Url,
    /// The exchange and routing key of an `amqp://` or `amqps://` url; `None` for HTTP.
    pub amqp: Option<AmqpTarget>,
    /// `None`: every event type.
    pub event_types: Option<Vec<EventFilter>>,
    /// Newest first.
    pub secrets: Vec<SecretSpec>,
    /// A disabled subscription receives nothing; what waits for it is cancelled.
    pub enabled: bool,
    /// A paused subscription is sent nothing, and nothing of it is cancelled or charged: what
    /// arrives for it waits in its parking queue until `hookrelay subscriptions resume`.
    pub paused: bool,
    /// Attempts at once to this subscription's endpoint, instead of `endpoints.max_concurrent`.
    pub max_concurrent: Option<u32>,
    /// Requests per unit of time to this subscription's endpoint (`"50/s"`), instead of
    /// `endpoints.rate`; shared by the fleet like the cap.
    pub rate: Option<Rate>,
    /// Headers added to every attempt.
    pub headers: Vec<ExtraHeader>,
    /// `Authorization: Basic` on every attempt.
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization: Bearer` with a token from an OAuth2 token endpoint.
    pub oauth2: Option<OAuth2>,
    /// A client certificate presented to the endpoint (mutual TLS).
    pub tls: Option<ClientTls>,
    /// Which events of its types it is sent, by their payload; `None`: all.
    pub payload_filter: Option<PayloadFilter>,
    /// Send the attempt's W3C `traceparent`/`tracestate`, so a receiver that traces sees the
    /// delivery in its own trace (docs/tracing.md). Off unless asked: it tells the receiver
    /// the producer's trace id.
    pub trace_context: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("url", &crate::config::shown_url(&self.url))
            .field("amqp", &self.amqp)
            .field("event_types", &self.event_types)
            .field("secrets", &self.secrets)
            .field("enabled", &self.enabled)
            .field("paused", &self.paused)
            .field("max_concurrent", &self.max_concurrent)
            .field("rate", &self.rate)
            .field("headers", &self.headers)
            .field("basic_auth", &self.basic_auth.as_ref().map(|b| &b.username))
            .field("oauth2", &self.oauth2)
            .field("tls", &self.tls)
            .field(
                "payload_filter",
                &self.payload_filter.as_ref().map(|f| f.as_json()),
            )
            .field("trace_context", &self.trace_context)
            .finish()
    }
}

impl Subscription {
    /// A subscription with every event type, one secret, enabled.
    pub fn new(id: &str, tenant: &str, url: reqwest::Url, secret: SecretRef) -> Self {
        Self {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            url,
            amqp: None,
            event_types: None,
            secrets: vec![SecretSpec::new(secret)],
            enabled: true,
            paused: false,
            max_concurrent: None,
            rate: None,
            headers: Vec::new(),
            basic_auth: None,
            oauth2: None,
            payload_filter: None,
            tls: None,
            trace_context: false,
        }
    }

    /// The secret references of its headers and endpoint authentication (not its signing
    /// secrets).
    pub fn request_references(&self) -> Vec<&SecretRef> {
        let mut refs: Vec<&SecretRef> = self
            .headers
            .iter()
            .filter_map(|h| match &h.value {
                HeaderValueSpec::Secret(r) => Some(r),
                HeaderValueSpec::Static(_) => None,
            })
            .collect();
        refs.extend(self.basic_auth.as_ref().map(|b| &b.password));
        refs.extend(self.oauth2.as_ref().map(|o| &o.client_secret));
        if let Some(tls) = &self.tls {
            refs.extend([&tls.cert, &tls.key]);
            refs.extend(tls.ca.as_ref());
        }
        refs
    }

    pub fn accepts(&self, event_type: &str) -> bool {
        self.event_types
            .as_ref()
            .is_none_or(|filters| filters.iter().any(|f| f.matches(event_type)))
    }
}

/// Every subscription, by id, and the enabled ones by tenant (a fan-out looks up its tenant's
/// subscriptions, not all of them: a store may hold millions).
#[derive(Debug, Clone, Default)]
pub struct Subscriptions {
    /// Keys and lists shared (`Arc`), so a version with a few changes is a cheap copy of the
    /// maps, not of every id and list.
    by_id: HashMap<Arc<str>, Arc<Subscription>>,
    /// Sorted by id.
    by_tenant: HashMap<Arc<str>, Arc<Vec<Arc<Subscription>>>>,
}

impl Subscriptions {
    pub fn from_list(list: impl IntoIterator<Item = Subscription>) -> Self {
        Self::from_map(
            list.into_iter()
                .map(|s| (s.id.clone(), Arc::new(s)))
                .collect(),
        )
    }

    pub(super) fn from_map(by_id: HashMap<String, Arc<Subscription>>) -> Self {
        let by_id: HashMap<Arc<str>, Arc<Subscription>> = by_id
            .into_iter()
            .map(|(id, s)| (Arc::from(id), s))
            .collect();
        let mut lists: HashMap<Arc<str>, Vec<Arc<Subscription>>> = HashMap::new();
        for s in by_id.values().filter(|s| s.enabled) {
            lists
                .entry(Arc::from(s.tenant.as_str()))
                .or_default()
                .push(Arc::clone(s));
        }
        let by_tenant = lists
            .into_iter()
            .map(|(tenant, mut list)| {
                list.sort_by(|a, b| a.id.cmp(&b.id));
                (tenant, Arc::new(list))
            })
            .collect();
        Self { by_id, by_tenant }
    }

    /// This version with some subscriptions replaced (`Some`) or removed (`None`), by id. Only
    /// the lists of the tenants concerned are rebuilt, from their old lists.
    pub fn with_changes(
        &self,
        changes: impl IntoIterator<Item = (String, Option<Subscription>)>,
    ) -> Self {
        let mut by_id = self.by_id.clone();
        let mut by_tenant = self.by_tenant.clone();
        // Per tenant touched: the ids that left or changed, and what is enabled now.
        let mut touched: HashMap<
            String,
            (std::collections::HashSet<String>, Vec<Arc<Subscription>>),
        > = HashMap::new();
        for (id, new) in changes {
            if let Some(old) = by_id.remove(id.as_str()) {
                touched
                    .entry(old.tenant.clone())
                    .or_default()
                    .0
                    .insert(id.clone());
            }
            if let Some(new) = new {
                let new = Arc::new(new);
                let entry = touched.entry(new.tenant.clone()).or_default();
                entry.0.insert(id.clone());
                if new.enabled {
                    entry.1.push(Arc::clone(&new));
                }
                by_id.insert(Arc::from(id), new);
            }
        }
        for (tenant, (gone, added)) in touched {
            let mut list: Vec<Arc<Subscription>> = by_tenant
                .get(tenant.as_str())
                .map(|l| {
                    l.iter()
                        .filter(|s| !gone.contains(&s.id))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            list.extend(added);
            if list.is_empty() {
                by_tenant.remove(tenant.as_str());
            } else {
                list.sort_by(|a, b| a.id.cmp(&b.id));
                by_tenant.insert(Arc::from(tenant), Arc::new(list));
            }
        }
        Self { by_id, by_tenant }
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
        self.by_tenant.get(tenant).map_or_else(Vec::new, |list| {
            list.iter()
                .filter(|s| s.accepts(event_type))
                .cloned()
                .collect()
        })
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_with_changes_indexes_as_a_version_built_whole() {
        let sub = |id: &str, tenant: &str, enabled: bool| {
            let mut s = Subscription::new(
                id,
                tenant,
                "https://h.example/x".parse().unwrap(),
                SecretRef::Env("X".into()),
            );
            s.enabled = enabled;
            s
        };
        let before = Subscriptions::from_list([
            sub("a1", "a", true),
            sub("a2", "a", true),
            sub("b1", "b", true),
            sub("c1", "c", true),
        ]);
        let changes = vec![
            ("a1".to_owned(), None),                        // deleted
            ("a2".to_owned(), Some(sub("a2", "a", false))), // disabled
            ("b1".to_owned(), Some(sub("b1", "c", true))),  // moved to tenant c
            ("d1".to_owned(), Some(sub("d1", "d", true))),  // new
        ];
        let after = before.with_changes(changes);
        let whole = Subscriptions::from_list([
            sub("a2", "a", false),
            sub("b1", "c", true),
            sub("c1", "c", true),
            sub("d1", "d", true),
        ]);
        for tenant in ["a", "b", "c", "d"] {
            let ids = |s: &Subscriptions| {
                s.matching(tenant, "t.x")
                    .iter()
                    .map(|s| s.id.clone())
                    .collect::<Vec<_>>()
            };
            assert_eq!(ids(&after), ids(&whole), "tenant {tenant}");
        }
        assert_eq!(after.len(), 4);
        assert!(after.get("a1").is_none());
        assert_eq!(before.len(), 4, "the old version is untouched");
        assert_eq!(before.matching("a", "t.x").len(), 2);
    }
}
