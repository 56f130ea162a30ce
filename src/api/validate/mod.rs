//! Checking what a caller sends, with the checks the subscriptions file gets (ids, tenants,
//! URLs, event types, rates) and the egress policy the worker applies at attempt time: a URL
//! that resolves to a blocked address is refused at creation with the reason (and is still
//! checked at every attempt, since DNS answers change). Every problem is reported, not the first.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::debug;

use crate::contract::envelope::{check_event_type, check_id, check_tenant};
use crate::delivery::egress::{EgressDenied, EgressPolicy, GuardedResolver, Lookup, ResolveError};
use crate::subscriptions::parse::{
    URL_CREDENTIALS_INSTEAD, parse_destination, parse_event_types, refuse_credentials,
};
use crate::subscriptions::{EventFilter, PayloadFilter};
use crate::units::Rate;

use super::auth::Scope;
use super::model::{
    CreateSubscription, EventType, RotateSecret, SignatureScheme, UpdateSubscription,
};
use super::problem::{ApiError, FieldError};
use crate::store::request::{self as stored, StoredRequest};
use crate::store::subscriptions::{SubscriptionRow, SubscriptionWrite};

mod request;

pub use request::MAX_SECRET_LEN;
use request::{basic_auth, headers, oauth2, request_conflicts, tls};

pub const MAX_URL_LEN: usize = 2048;
pub const MAX_DESCRIPTION_LEN: usize = 1024;
/// How long the current secrets keep signing after a rotation that does not say.
pub const DEFAULT_OVERLAP: Duration = Duration::from_secs(24 * 3600);
/// The longest overlap a rotation may ask for.
pub const MAX_OVERLAP: Duration = Duration::from_secs(366 * 24 * 3600);

/// The egress policy, with the resolver the worker uses to apply it.
#[derive(Debug, Clone)]
pub struct Egress {
    policy: Arc<EgressPolicy>,
    resolver: GuardedResolver,
}

impl Egress {
    /// `timeout` bounds each lookup: a creation does not hang on a resolver that never answers.
    pub fn new(policy: EgressPolicy, lookup: Arc<dyn Lookup>, timeout: Duration) -> Self {
        let policy = Arc::new(policy);
        Self {
            resolver: GuardedResolver::new(Arc::clone(&policy), lookup).with_timeout(timeout),
            policy,
        }
    }

    /// Refuses an endpoint the policy would refuse at attempt time. A name that does not
    /// resolve now is let through: it may exist by the first delivery, and is checked then.
    pub async fn check(&self, url: &reqwest::Url) -> Result<(), EgressDenied> {
        self.policy.check_url(url)?;
        if let Some(url::Host::Domain(host)) = url.host() {
            match self.resolver.resolve_checked(host).await {
                Ok(_) => {}
                Err(ResolveError::Denied(denied)) => return Err(denied),
                Err(e) => debug!(error = %e, "Endpoint host does not resolve yet; accepted"),
            }
        }
        Ok(())
    }
}

/// A subscription's settings, checked.
#[derive(Debug, Clone)]
pub struct Checked {
    pub id: String,
    pub tenant: String,
    pub url: reqwest::Url,
    pub event_types: Option<Vec<EventFilter>>,
    pub enabled: bool,
    pub paused: bool,
    pub max_concurrent: Option<u32>,
    pub rate: Option<Rate>,
    pub description: String,
    /// Headers and endpoint authentication, without secret values.
    pub request: StoredRequest,
    pub payload_filter: Option<PayloadFilter>,
    /// Secrets this request gives, by purpose, to seal and store.
    pub new_secrets: Vec<(String, Plain)>,
    /// Purposes whose stored secrets go (`header:` for every header's).
    pub replaced: Vec<String>,
}

/// A secret value as a caller sent it, until it is sealed. `Debug` does not show it.
#[derive(Clone)]
pub struct Plain(pub String);

impl std::fmt::Debug for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(secret)")
    }
}

impl Checked {
    /// The event types as stored: exact names and `prefix.*`.
    pub fn event_types_text(&self) -> Option<Vec<String>> {
        self.event_types
            .as_ref()
            .map(|f| f.iter().map(ToString::to_string).collect())
    }

    /// A stored row read back into checked settings, for a change to apply to. A row that does
    /// not validate (written by hand) is an internal error: the API does not build on it.
    pub fn from_store(row: SubscriptionRow) -> Result<Self, ApiError> {
        let id = row.id;
        let bad =
            |what: String| ApiError::internal(format!("subscription {id:?} in the store: {what}"));
        let url = parse_destination(&row.url).map_err(|e| bad(format!("url: {e}")))?;
        let event_types = row
            .event_types
            .map(|t| parse_event_types(&t))
            .transpose()
            .map_err(|e| bad(format!("event_types: {}", e.join("; "))))?;
        let rate = row
            .rate
            .map(|r| r.parse::<Rate>())
            .transpose()
            .map_err(|e| bad(format!("rate: {e}")))?;
        let payload_filter = row
            .payload_filter
            .as_ref()
            .map(PayloadFilter::compile)
            .transpose()
            .map_err(|e| bad(format!("filter: {e}")))?;
        Ok(Checked {
            tenant: row.tenant,
            url,
            event_types,
            enabled: row.enabled,
            paused: row.paused,
            max_concurrent: row.max_concurrent,
            rate,
            description: row.description,
            request: row.request,
            payload_filter,
            new_secrets: Vec::new(),
            replaced: Vec::new(),
            id,
        })
    }

    /// What the store writes of it.
    pub fn to_store(&self) -> SubscriptionWrite<'_> {
        SubscriptionWrite {
            id: &self.id,
            tenant: &self.tenant,
            url: self.url.as_str(),
            event_types: self.event_types_text(),
            enabled: self.enabled,
            paused: self.paused,
            max_concurrent: self.max_concurrent,
            rate: self.rate.map(|r| r.to_string()),
            description: &self.description,
            request: &self.request,
            payload_filter: self.payload_filter.as_ref().map(PayloadFilter::as_json),
            replaced: &self.replaced,
        }
    }
}

/// Collects the problems of one request.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    fn finish<T>(self, value: T) -> Result<T, ApiError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ApiError::Invalid(self.0))
        }
    }
}

fn url(raw: &str, problems: &mut Problems) -> Option<reqwest::Url> {
    if raw.len() > MAX_URL_LEN {
        problems.add("url", format!("longer than {MAX_URL_LEN} characters"));
        return None;
    }
    match parse_destination(raw)
        .and_then(|u| refuse_credentials(&u, URL_CREDENTIALS_INSTEAD).map(|()| u))
    {
        Ok(u) => Some(u),
        Err(e) => {
            problems.add("url", e.to_string());
            None
        }
    }
}

fn payload_filter(raw: &serde_json::Value, problems: &mut Problems) -> Option<PayloadFilter> {
    match PayloadFilter::compile(raw) {
        Ok(filter) => Some(filter),
        Err(e) => {
            problems.add("filter", e.to_string());
            None
        }
    }
}

fn event_types(raw: &[EventType], problems: &mut Problems) -> Option<Vec<EventFilter>> {
    match parse_event_types(raw) {
        Ok(f) => Some(f),
        Err(messages) => {
            for m in messages {
                problems.add("event_types", m);
            }
            None
        }
    }
}

fn max_concurrent(n: u32, problems: &mut Problems) -> Option<u32> {
    if n == 0 || i32::try_from(n).is_err() {
        problems.add("max_concurrent", "must be between 1 and 2147483647");
        return None;
    }
    Some(n)
}

/// Bounded as every [`Rate`] is.
fn rate(raw: &str, problems: &mut Problems) -> Option<Rate> {
    match raw.parse::<Rate>() {
        Ok(r) => Some(r),
        Err(e) => {
            problems.add("rate", e.to_string());
            None
        }
    }
}

fn description(raw: &str, problems: &mut Problems) {
    // PostgreSQL text holds no NUL; other control characters have no place in a label either.
    if raw
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        problems.add("description", "control characters are not allowed");
    } else if raw.chars().count() > MAX_DESCRIPTION_LEN {
        problems.add(
            "description",
            format!("longer than {MAX_DESCRIPTION_LEN} characters"),
        );
    }
}

/// The signature schemes asked for, deduplicated; `["v1"]` when none.
pub fn schemes(
    raw: Option<&[SignatureScheme]>,
    field: &str,
) -> Result<Vec<SignatureScheme>, ApiError> {
    match raw {
        None => Ok(vec![SignatureScheme::V1]),
        Some([]) => Err(ApiError::field(
            field,
            "name at least one of \"v1\" and \"v1a\"",
        )),
        Some(list) if list.len() > 2 => {
            Err(ApiError::field(field, "at most two: \"v1\" and \"v1a\""))
        }
        Some(list) => {
            let mut unique = list.to_vec();
            unique.sort();
            unique.dedup();
            Ok(unique)
        }
    }
}

async fn egress(url: Option<&reqwest::Url>, egress: &Egress, problems: &mut Problems) {
    if let Some(url) = url
        && let Err(reason) = egress.check(url).await
    {
        problems.add("url", reason.to_string());
    }
}

async fn token_egress(url: Option<&reqwest::Url>, egress: &Egress, problems: &mut Problems) {
    if let Some(url) = url
        && let Err(reason) = egress.check(url).await
    {
        problems.add("oauth2.token_url", reason.to_string());
    }
}

/// A new subscription, checked for `scope`: a tenant token creates for its own tenant only.
pub async fn create(
    req: CreateSubscription,
    scope: &Scope,
    egress_policy: &Egress,
) -> Result<Checked, ApiError> {
    let mut problems = Problems::default();
    let id = match (req.id, scope) {
        // Ids are unique across tenants: a tenant that could name one would learn, from a
        // conflict, that another tenant has it. The refusal is the same whatever the id.
        (Some(_), Scope::Tenant(_)) => {
            problems.add(
                "id",
                "a tenant token's subscriptions get generated ids: leave id out (the answer \
                 and its Location name the new one); only an admin token names an id",
            );
            String::new()
        }
        (Some(id), Scope::Admin) => {
            if check_id(&id).is_err() {
                problems.add("id", "expected 1 to 128 letters, digits, '_' or '-'");
            }
            id
        }
        (None, _) => format!("sub_{}", uuid::Uuid::new_v4().simple()),
    };
    let tenant = match (req.tenant, scope.tenant()) {
        (Some(t), Some(own)) if t != own => {
            problems.add(
                "tenant",
                "a tenant token creates subscriptions of its own tenant only",
            );
            t
        }
        (Some(t), _) => {
            if let Err(e) = check_tenant(&t) {
                problems.add("tenant", e.to_string());
            }
            t
        }
        (None, Some(own)) => own.to_owned(),
        (None, None) => {
            problems.add("tenant", "required with an admin token");
            String::new()
        }
    };
    let url = url(&req.url, &mut problems);
    let event_types = req
        .event_types
        .as_deref()
        .and_then(|raw| event_types(raw, &mut problems));
    let max_concurrent = req
        .max_concurrent
        .and_then(|n| max_concurrent(n, &mut problems));
    let rate = req.rate.as_deref().and_then(|r| rate(r, &mut problems));
    let description = req.description.unwrap_or_default();
    self::description(&description, &mut problems);
    let mut request = (StoredRequest::default(), Vec::new());
    request.0.trace_context = req.trace_context.unwrap_or(false);
    request.0.amqp = req.amqp.clone();
    if let Some(raw) = &req.headers {
        headers(raw, &mut problems, &mut request);
    }
    if let Some(raw) = &req.basic_auth {
        basic_auth(raw, &mut problems, &mut request);
    }
    let token_url = req
        .oauth2
        .as_ref()
        .and_then(|raw| oauth2(raw, &mut problems, &mut request));
    if let Some(raw) = &req.tls {
        tls(raw, &mut problems, &mut request);
    }
    if let Some(url) = &url {
        request_conflicts(url, &request.0, &mut problems);
    }
    // Only a URL that is otherwise fine is looked up.
    if problems.0.is_empty() {
        egress(url.as_ref(), egress_policy, &mut problems).await;
        token_egress(token_url.as_ref(), egress_policy, &mut problems).await;
    }
    let payload_filter = req
        .filter
        .as_ref()
        .and_then(|raw| payload_filter(raw, &mut problems));
    let (request, new_secrets) = request;
    let checked = url.map(|url| Checked {
        id,
        tenant,
        url,
        event_types,
        enabled: req.enabled.unwrap_or(true),
        paused: req.paused.unwrap_or(false),
        max_concurrent,
        rate,
        description,
        request,
        payload_filter,
        new_secrets,
        replaced: Vec::new(),
    });
    match checked {
        Some(c) => problems.finish(c),
        None => Err(ApiError::Invalid(problems.0)),
    }
}

/// `current` with the change applied, checked.
pub async fn update(
    mut current: Checked,
    req: UpdateSubscription,
    egress_policy: &Egress,
) -> Result<Checked, ApiError> {
    let mut problems = Problems::default();
    let mut new_url = None;
    if let Some(raw) = &req.url {
        new_url = url(raw, &mut problems);
    }
    if let Some(types) = req.event_types {
        current.event_types = match types {
            None => None,
            Some(raw) => event_types(&raw, &mut problems),
        };
    }
    if let Some(enabled) = req.enabled {
        current.enabled = enabled;
    }
    if let Some(filter) = &req.filter {
        current.payload_filter = filter
            .as_ref()
            .and_then(|raw| payload_filter(raw, &mut problems));
    }
    if let Some(trace_context) = req.trace_context {
        current.request.trace_context = trace_context;
    }
    if let Some(amqp) = &req.amqp {
        current.request.amqp = amqp.clone();
    }
    if let Some(n) = req.max_concurrent {
        current.max_concurrent = n.and_then(|n| max_concurrent(n, &mut problems));
    }
    if let Some(r) = req.rate {
        current.rate = r.and_then(|r| rate(&r, &mut problems));
    }
    if let Some(d) = req.description {
        description(&d, &mut problems);
        current.description = d;
    }
    // Each of the four replaced whole when given; what is not given keeps its stored secrets.
    let mut given = (StoredRequest::default(), Vec::new());
    if let Some(raw) = &req.headers {
        current.replaced.push("header:".into());
        current.request.headers.clear();
        if let Some(raw) = raw {
            headers(raw, &mut problems, &mut given);
        }
        current.request.headers = std::mem::take(&mut given.0.headers);
    }
    if let Some(raw) = &req.basic_auth {
        current.replaced.push(stored::BASIC_PASSWORD.into());
        if let Some(raw) = raw {
            basic_auth(raw, &mut problems, &mut given);
        }
        current.request.basic_auth = given.0.basic_auth.take();
    }
    let mut token_url = None;
    if let Some(raw) = &req.oauth2 {
        current.replaced.push(stored::OAUTH2_CLIENT_SECRET.into());
        if let Some(raw) = raw {
            token_url = oauth2(raw, &mut problems, &mut given);
        }
        current.request.oauth2 = given.0.oauth2.take();
    }
    if let Some(raw) = &req.tls {
        current.replaced.extend([
            stored::TLS_CERT.to_owned(),
            stored::TLS_KEY.to_owned(),
            stored::TLS_CA.to_owned(),
        ]);
        if let Some(raw) = raw {
            tls(raw, &mut problems, &mut given);
        }
        current.request.tls = given.0.tls.take();
    }
    current.new_secrets = given.1;
    request_conflicts(
        new_url.as_ref().unwrap_or(&current.url),
        &current.request,
        &mut problems,
    );
    if problems.0.is_empty() {
        egress(new_url.as_ref(), egress_policy, &mut problems).await;
        token_egress(token_url.as_ref(), egress_policy, &mut problems).await;
    }
    if let Some(u) = new_url {
        current.url = u;
    }
    problems.finish(current)
}

/// When a rotation's replaced secrets stop signing.
pub fn overlap_end(req: &RotateSecret, now: SystemTime) -> Result<SystemTime, ApiError> {
    match (&req.expire_old_after, &req.old_expires_at) {
        (Some(_), Some(_)) => Err(ApiError::field(
            "expire_old_after",
            "give expire_old_after or old_expires_at, not both",
        )),
        (Some(after), None) => match humantime::parse_duration(after) {
            Ok(d) if d <= MAX_OVERLAP => Ok(now + d),
            Ok(_) => Err(ApiError::field("expire_old_after", "at most 366 days")),
            Err(_) => Err(ApiError::field(
                "expire_old_after",
                format!("{after:?} is not a duration like \"24h\" or \"30m\""),
            )),
        },
        (None, Some(at)) => match humantime::parse_rfc3339_weak(at) {
            Ok(t) if t + Duration::from_secs(60) < now => Err(ApiError::field(
                "old_expires_at",
                "is in the past; use \"expire_old_after\": \"0s\" to stop them at once",
            )),
            Ok(t) if t > now + MAX_OVERLAP => {
                Err(ApiError::field("old_expires_at", "at most 366 days ahead"))
            }
            Ok(t) => Ok(t.max(now)),
            Err(_) => Err(ApiError::field(
                "old_expires_at",
                format!("{at:?} is not a time like \"2027-01-31T00:00:00Z\""),
            )),
        },
        (None, None) => Ok(now + DEFAULT_OVERLAP),
    }
}

/// A test event's type: one the subscription receives, or it would be cancelled as filtered.
pub fn test_event_type(
    requested: Option<String>,
    receives: &Option<Vec<EventFilter>>,
) -> Result<String, ApiError> {
    let event_type = requested.unwrap_or_else(|| "hookrelay.test".into());
    check_event_type(&event_type).map_err(|e| ApiError::field("event_type", e.to_string()))?;
    let accepted = receives
        .as_ref()
        .is_none_or(|filters| filters.iter().any(|f| f.matches(&event_type)));
    if !accepted {
        return Err(ApiError::field(
            "event_type",
            format!(
                "the subscription does not receive {event_type:?}, so the event would be \
                 cancelled as filtered; name a type it receives"
            ),
        ));
    }
    Ok(event_type)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::egress::SystemLookup;

    fn egress() -> Egress {
        Egress::new(
            EgressPolicy::default(),
            Arc::new(SystemLookup),
            Duration::from_millis(200),
        )
    }

    fn request(url: &str) -> CreateSubscription {
        CreateSubscription {
            id: None,
            tenant: Some("acme".into()),
            url: url.into(),
            event_types: None,
            enabled: None,
            paused: None,
            max_concurrent: None,
            rate: None,
            description: None,
            signatures: None,
            headers: None,
            basic_auth: None,
            oauth2: None,
            tls: None,
            filter: None,
            trace_context: None,
            amqp: None,
        }
    }

    #[tokio::test]
    async fn an_amqp_destination_needs_its_exchange_and_no_oauth2() {
        let url = "amqps://93.184.216.34/orders";
        let mut with = request(url);
        with.amqp = Some(crate::subscriptions::AmqpTarget {
            exchange: "webhooks.in".into(),
            routing_key: Some("acme".into()),
        });
        let made = create(with, &Scope::Admin, &egress()).await.unwrap();
        assert_eq!(made.request.amqp.unwrap().exchange, "webhooks.in");
        let Err(ApiError::Invalid(problems)) = create(request(url), &Scope::Admin, &egress()).await
        else {
            panic!("an amqp url without an exchange was accepted");
        };
        assert_eq!(problems[0].field, "amqp", "{problems:?}");
    }

    #[tokio::test]
    async fn trace_context_is_off_unless_asked() {
        let url = "https://93.184.216.34/hook";
        let plain = create(request(url), &Scope::Admin, &egress())
            .await
            .unwrap();
        assert!(!plain.request.trace_context);
        let mut asked = request(url);
        asked.trace_context = Some(true);
        let on = create(asked, &Scope::Admin, &egress()).await.unwrap();
        assert!(on.request.trace_context);
    }

    #[tokio::test]
    async fn every_problem_of_a_create_is_named_by_field() {
        let mut bad = request("ftp://x.example");
        bad.id = Some("a.b".into());
        bad.event_types = Some(vec![EventType("order*".into())]);
        bad.rate = Some("fast".into());
        bad.max_concurrent = Some(0);
        let Err(ApiError::Invalid(errors)) = create(bad, &Scope::Admin, &egress()).await else {
            panic!("accepted");
        };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["id", "url", "event_types", "max_concurrent", "rate"]
        );
    }

    #[tokio::test]
    async fn private_addresses_are_refused_with_the_reason() {
        let Err(ApiError::Invalid(errors)) =
            create(request("http://10.1.2.3/hook"), &Scope::Admin, &egress()).await
        else {
            panic!("accepted");
        };
        assert_eq!(errors[0].field, "url");
        assert!(
            errors[0].message.contains("private"),
            "{}",
            errors[0].message
        );
        let loopback = create(request("http://localhost:9/x"), &Scope::Admin, &egress()).await;
        assert!(
            matches!(loopback, Err(ApiError::Invalid(_))),
            "{loopback:?}"
        );
    }

    #[tokio::test]
    async fn a_tenant_token_creates_for_its_own_tenant() {
        let scope = Scope::Tenant("acme".into());
        let mut other = request("https://192.0.2.1.nip.invalid/x");
        other.tenant = Some("globex".into());
        let Err(ApiError::Invalid(errors)) = create(other, &scope, &egress()).await else {
            panic!("accepted");
        };
        assert_eq!(errors[0].field, "tenant");
        let mut own = request("https://hooks.invalid/x");
        own.tenant = None;
        assert_eq!(create(own, &scope, &egress()).await.unwrap().tenant, "acme");
    }

    #[test]
    fn a_rotation_overlaps_for_what_the_caller_says() {
        let now = SystemTime::now();
        assert_eq!(
            overlap_end(&RotateSecret::default(), now).unwrap(),
            now + DEFAULT_OVERLAP
        );
        let after = RotateSecret {
            expire_old_after: Some("1h".into()),
            ..RotateSecret::default()
        };
        assert_eq!(
            overlap_end(&after, now).unwrap(),
            now + Duration::from_secs(3600)
        );
        let both = RotateSecret {
            expire_old_after: Some("1h".into()),
            old_expires_at: Some("2030-01-01T00:00:00Z".into()),
            signatures: None,
        };
        assert!(overlap_end(&both, now).is_err());
        let past = RotateSecret {
            old_expires_at: Some("2001-01-01T00:00:00Z".into()),
            ..RotateSecret::default()
        };
        assert!(overlap_end(&past, now).is_err());
    }
}
