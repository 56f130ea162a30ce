//! The subscriptions file: who receives what (id, tenant, endpoint URL, event types, secret
//! references, enabled, paused, limits), parsed with every problem reported by line and field.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use crate::contract::envelope::check_tenant;
use crate::units::Rate;

use super::headers::reserved_header;
use super::*;

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
    /// The catalog's own section, read by [`crate::catalog::file`].
    #[serde(default, rename = "event_type")]
    _event_types: Option<toml::Value>,
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
    paused: Option<Spanned<bool>>,
    #[serde(default)]
    max_concurrent: Option<u32>,
    #[serde(default)]
    rate: Option<Spanned<String>>,
    #[serde(default)]
    headers: Option<Spanned<std::collections::BTreeMap<String, HeaderEntry>>>,
    #[serde(default)]
    basic_auth: Option<Spanned<BasicAuthEntry>>,
    #[serde(default)]
    oauth2: Option<Spanned<OAuth2Entry>>,
    #[serde(default)]
    tls: Option<Spanned<TlsEntry>>,
    /// A payload filter (docs/subscriptions.md), e.g. `{ "data.amount" = { "$gt" = 100 } }`.
    #[serde(default)]
    filter: Option<Spanned<serde_json::Value>>,
    #[serde(default)]
    trace_context: bool,
    /// For an `amqp://` or `amqps://` url: `{ exchange = "...", routing_key = "..." }`.
    #[serde(default)]
    amqp: Option<Spanned<AmqpTarget>>,
}

/// A header's value in the file: `"static"`, or `{ secret = "env:NAME" }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HeaderEntry {
    Static(String),
    Secret { secret: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuthEntry {
    username: String,
    /// A secret reference.
    password: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OAuth2Entry {
    token_url: String,
    client_id: String,
    /// A secret reference.
    client_secret: String,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    audience: Option<String>,
    #[serde(default)]
    auth_method: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsEntry {
    /// Secret references to PEM text.
    cert: String,
    key: String,
    #[serde(default)]
    ca: Option<String>,
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

/// Why a subscription's URL is refused: it is to be rewritten. Each shows the URL without user
/// information and query, and none when it does not parse: either may hold a password or token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("not a URL: {0}")]
    NotAUrl(url::ParseError),
    #[error("{0:?}: expected an http:// or https:// URL with a host")]
    NotHttp(String),
    #[error("{0:?}: expected an http://, https://, amqp:// or amqps:// URL with a host")]
    NotDestination(String),
    /// The credentials are to move where `instead` says.
    #[error(
        "{shown:?} has credentials in it, which would be stored and shown as the URL is; {instead}"
    )]
    Credentials {
        shown: String,
        instead: &'static str,
    },
}

/// A subscription's endpoint: an http:// or https:// URL with a host.
pub fn parse_url(raw: &str) -> Result<reqwest::Url, UrlError> {
    match reqwest::Url::parse(raw) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Ok(url),
        Ok(other) => Err(UrlError::NotHttp(crate::config::shown_url(&other))),
        Err(e) => Err(UrlError::NotAUrl(e)),
    }
}

/// A subscription's destination: an http(s):// endpoint, or an amqp(s):// broker (the vhost
/// its path) with a host.
pub fn parse_destination(raw: &str) -> Result<reqwest::Url, UrlError> {
    match reqwest::Url::parse(raw) {
        Ok(url)
            if matches!(url.scheme(), "http" | "https" | "amqp" | "amqps")
                && url.host().is_some() =>
        {
            Ok(url)
        }
        Ok(other) => Err(UrlError::NotDestination(crate::config::shown_url(&other))),
        Err(e) => Err(UrlError::NotAUrl(e)),
    }
}

/// Where the credentials of an endpoint go instead of its URL.
pub const URL_CREDENTIALS_INSTEAD: &str = "give them as basic_auth (a username and a password \
     kept as a secret)";
/// Where the credentials of a token endpoint go instead of its URL.
pub const TOKEN_URL_CREDENTIALS_INSTEAD: &str = "give them as client_id and client_secret \
     (auth_method \"basic\" sends them as basic auth)";

/// A URL as a subscription is given it (a file, the API) holds no credentials: a URL is stored,
/// logged and shown as it is, so a password in it would be too. `instead` says where they go.
/// The error does not repeat them.
pub fn refuse_credentials(url: &reqwest::Url, instead: &'static str) -> Result<(), UrlError> {
    if url.username().is_empty() && url.password().is_none() {
        return Ok(());
    }
    Err(UrlError::Credentials {
        shown: crate::config::shown_url(url),
        instead,
    })
}

/// A subscription's event types: exact names and `prefix.*` wildcards, at least one. Every
/// problem is reported.
pub fn parse_event_types<S: AsRef<str>>(raw: &[S]) -> Result<Vec<EventFilter>, Vec<String>> {
    if raw.is_empty() {
        return Err(vec![
            "an empty list would match nothing; leave event_types out to receive every type".into(),
        ]);
    }
    let mut filters = Vec::new();
    let mut problems = Vec::new();
    for r in raw {
        match EventFilter::parse(r.as_ref()) {
            Ok(f) => filters.push(f),
            Err(e) => problems.push(e.to_string()),
        }
    }
    if problems.is_empty() {
        Ok(filters)
    } else {
        Err(problems)
    }
}

/// An `[subscription.oauth2]` table, or the field and why not.
fn parse_oauth2(o: &OAuth2Entry) -> Result<OAuth2, (&'static str, String)> {
    let client_secret =
        SecretRef::parse(&o.client_secret).map_err(|e| ("client_secret", e.to_string()))?;
    let built = OAuth2::build(
        &o.token_url,
        &o.client_id,
        client_secret,
        o.scope.as_deref(),
        o.audience.as_deref(),
        o.auth_method.as_deref(),
    )?;
    refuse_credentials(&built.token_url, TOKEN_URL_CREDENTIALS_INSTEAD)
        .map_err(|e| ("token_url", e.to_string()))?;
    Ok(built)
}

/// A `[subscription.tls]` table, or the field and why not.
fn parse_tls(t: &TlsEntry) -> Result<ClientTls, (&'static str, String)> {
    Ok(ClientTls {
        cert: SecretRef::parse(&t.cert).map_err(|e| ("cert", e.to_string()))?,
        key: SecretRef::parse(&t.key).map_err(|e| ("key", e.to_string()))?,
        ca: match &t.ca {
            None => None,
            Some(raw) => Some(SecretRef::parse(raw).map_err(|e| ("ca", e.to_string()))?),
        },
    })
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
        let file = read_file(path, text)?;
        let mut problems = Problems {
            path,
            text,
            found: Vec::new(),
        };
        let mut by_id = HashMap::new();
        for entry in file.subscriptions {
            let before = problems.found.len();
            if let Some(subscription) = read_entry(entry, &by_id, &mut problems)
                && problems.found.len() == before
            {
                by_id.insert(subscription.id.clone(), Arc::new(subscription));
            }
        }
        if problems.found.is_empty() {
            Ok(Self::from_map(by_id))
        } else {
            Err(SubscriptionErrors(problems.found))
        }
    }

    /// `text` (a valid file) with subscription `id`'s `paused` set, its layout and comments
    /// kept: the value is replaced where it is written, or a `paused = ...` line is added after
    /// the `id` line. The result is parsed again and must say what was asked.
    pub fn with_paused(
        path: &str,
        text: &str,
        id: &str,
        paused: bool,
    ) -> Result<String, SubscriptionErrors> {
        let problem = |line: usize, message: String| {
            SubscriptionErrors(vec![SubscriptionError {
                path: path.to_owned(),
                line,
                field: "paused".into(),
                message,
            }])
        };
        Self::parse(path, text)?;
        let file: File = toml::from_str(text).map_err(|e| problem(0, e.message().to_owned()))?;
        let Some(entry) = file.subscriptions.iter().find(|e| e.id.get_ref() == id) else {
            return Err(problem(0, format!("no subscription {id:?} in the file")));
        };
        let mut edited = text.to_owned();
        match &entry.paused {
            Some(value) => edited.replace_range(value.span(), &paused.to_string()),
            None => {
                let after_id = entry.id.span().end;
                let at = text[after_id..]
                    .find('\n')
                    .map_or(text.len(), |i| after_id + i + 1);
                let line = format!("paused = {paused}\n");
                if at == text.len() && !text.ends_with('\n') {
                    edited.push('\n');
                }
                edited.insert_str(at.min(edited.len()), &line);
            }
        }
        let line = text[..entry.id.span().start].matches('\n').count() + 1;
        match Self::parse(path, &edited) {
            Ok(subs) if subs.get(id).is_some_and(|s| s.paused == paused) => Ok(edited),
            _ => Err(problem(
                line,
                format!(
                    "cannot set paused = {paused} in this file's layout; write it in the \
                     [[subscription]] table of {id:?} by hand"
                ),
            )),
        }
    }
}

/// The problems found in one file, each placed by the line its offset falls on.
struct Problems<'a> {
    path: &'a str,
    text: &'a str,
    found: Vec<SubscriptionError>,
}

impl Problems<'_> {
    fn at(&mut self, offset: usize, field: &str, message: String) {
        self.found.push(SubscriptionError {
            path: self.path.to_owned(),
            line: line_of(self.text, offset),
            field: field.to_owned(),
            message,
        });
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The file as TOML; a syntax error is the one problem reported, on its line.
fn read_file(path: &str, text: &str) -> Result<File, SubscriptionErrors> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_of(text, s.start));
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
    })
}

/// One `[[subscription]]` table, field by field; `None` when one it cannot do without is
/// wrong. Every problem found is added to `problems`, in the order the fields are read.
fn read_entry(
    entry: Entry,
    by_id: &HashMap<String, Arc<Subscription>>,
    problems: &mut Problems<'_>,
) -> Option<Subscription> {
    let id = entry.id.get_ref();
    if crate::contract::envelope::check_id(id).is_err() {
        problems.at(
            entry.id.span().start,
            "id",
            format!("{id:?}: expected 1 to 128 letters, digits, '_' or '-'"),
        );
    }
    if by_id.contains_key(id) {
        problems.at(
            entry.id.span().start,
            "id",
            format!("{id:?} is defined twice"),
        );
    }
    if let Err(e) = check_tenant(entry.tenant.get_ref()) {
        problems.at(entry.tenant.span().start, "tenant", e.to_string());
    }
    let url = read_url(&entry, problems);
    let event_types = read_event_types(&entry, problems);
    let secrets = read_secrets(&entry, problems);
    let rate = read_rate(&entry, problems);
    let headers = read_headers(&entry, problems);
    let basic_auth = read_basic_auth(&entry, problems);
    let oauth2 = entry
        .oauth2
        .as_ref()
        .and_then(|o| match parse_oauth2(o.get_ref()) {
            Ok(o) => Some(o),
            Err((field, message)) => {
                problems.at(o.span().start, &format!("oauth2.{field}"), message);
                None
            }
        });
    let tls = read_tls(&entry, url.as_ref(), problems);
    let amqp = entry.amqp.as_ref().map(|a| a.get_ref().clone());
    if let Some(url) = &url {
        let at = entry
            .amqp
            .as_ref()
            .map_or(entry.url.span().start, |a| a.span().start);
        for (field, why) in super::destination::conflicts(url, amqp.as_ref(), oauth2.is_some()) {
            problems.at(at, field, why);
        }
    }
    let payload_filter = entry.filter.as_ref().and_then(|f| {
        match super::payload::PayloadFilter::compile(f.get_ref()) {
            Ok(filter) => Some(filter),
            Err(e) => {
                problems.at(f.span().start, "filter", e.to_string());
                None
            }
        }
    });
    Some(Subscription {
        id: id.clone(),
        tenant: entry.tenant.into_inner(),
        url: url?,
        amqp,
        event_types,
        secrets,
        enabled: entry.enabled,
        paused: entry.paused.is_some_and(|p| *p.get_ref()),
        max_concurrent: entry.max_concurrent.filter(|&n| n > 0),
        rate,
        headers,
        basic_auth,
        oauth2,
        tls,
        payload_filter,
        trace_context: entry.trace_context,
    })
}

fn read_url(entry: &Entry, problems: &mut Problems<'_>) -> Option<reqwest::Url> {
    match parse_destination(entry.url.get_ref())
        .and_then(|url| refuse_credentials(&url, URL_CREDENTIALS_INSTEAD).map(|()| url))
    {
        Ok(url) => Some(url),
        Err(e) => {
            problems.at(entry.url.span().start, "url", e.to_string());
            None
        }
    }
}

fn read_event_types(entry: &Entry, problems: &mut Problems<'_>) -> Option<Vec<EventFilter>> {
    let types = entry.event_types.as_ref()?;
    match parse_event_types(types.get_ref()) {
        Ok(filters) => Some(filters),
        Err(messages) => {
            for message in messages {
                problems.at(types.span().start, "event_types", message);
            }
            None
        }
    }
}

fn read_secrets(entry: &Entry, problems: &mut Problems<'_>) -> Vec<SecretSpec> {
    let at = entry.secrets.span().start;
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
                problems.at(
                    at,
                    "secrets.expires",
                    format!(
                        "{:?} is not a time like \"2027-01-31T00:00:00Z\": {e}",
                        expires.map_or("", |t| t.as_str())
                    ),
                );
                None
            }
        };
        match SecretRef::parse(reference) {
            Ok(reference) => secrets.push(SecretSpec { reference, expires }),
            Err(e) => problems.at(at, "secrets", e.to_string()),
        }
    }
    if entry.secrets.get_ref().is_empty() {
        problems.at(
            at,
            "secrets",
            "at least one secret reference is needed to sign deliveries".into(),
        );
    }
    secrets
}

fn read_rate(entry: &Entry, problems: &mut Problems<'_>) -> Option<Rate> {
    let raw = entry.rate.as_ref()?;
    match raw.get_ref().parse::<Rate>() {
        Ok(rate) => Some(rate),
        Err(e) => {
            problems.at(raw.span().start, "rate", e.to_string());
            None
        }
    }
}

fn read_headers(entry: &Entry, problems: &mut Problems<'_>) -> Vec<ExtraHeader> {
    let mut headers = Vec::new();
    let Some(table) = &entry.headers else {
        return headers;
    };
    let at = table.span().start;
    for (name, value) in table.get_ref() {
        if let Some(why) = reserved_header(name) {
            problems.at(at, "headers", why);
            continue;
        }
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            problems.at(at, "headers", format!("{name:?} is not a header name"));
            continue;
        }
        let name = name.to_ascii_lowercase();
        if name == "authorization" && (entry.basic_auth.is_some() || entry.oauth2.is_some()) {
            problems.at(
                at,
                "headers",
                "\"authorization\" and basic_auth or oauth2 would each set the Authorization header; keep one".into(),
            );
            continue;
        }
        match value {
            HeaderEntry::Static(v) => {
                if reqwest::header::HeaderValue::from_str(v).is_err() {
                    problems.at(
                        at,
                        "headers",
                        format!(
                            "the value of {name:?} is not a header value (visible ASCII and spaces)"
                        ),
                    );
                } else {
                    headers.push(ExtraHeader {
                        name,
                        value: HeaderValueSpec::Static(v.clone()),
                    });
                }
            }
            HeaderEntry::Secret { secret } => match SecretRef::parse(secret) {
                Ok(r) => headers.push(ExtraHeader {
                    name,
                    value: HeaderValueSpec::Secret(r),
                }),
                Err(e) => problems.at(at, "headers", format!("{name:?}: {e}")),
            },
        }
    }
    headers
}

/// Basic auth, and its conflict with OAuth2 (both would set the Authorization header).
fn read_basic_auth(entry: &Entry, problems: &mut Problems<'_>) -> Option<BasicAuth> {
    let basic_auth = match &entry.basic_auth {
        None => None,
        Some(b) => {
            let at = b.span().start;
            let b = b.get_ref();
            if b.username.contains(':') || b.username.is_empty() {
                problems.at(
                    at,
                    "basic_auth.username",
                    "a user name is not empty and has no ':'".into(),
                );
                None
            } else {
                match SecretRef::parse(&b.password) {
                    Ok(password) => Some(BasicAuth {
                        username: b.username.clone(),
                        password,
                    }),
                    Err(e) => {
                        problems.at(at, "basic_auth.password", e.to_string());
                        None
                    }
                }
            }
        }
    };
    if let (Some(b), Some(_)) = (&entry.basic_auth, &entry.oauth2) {
        problems.at(
            b.span().start,
            "basic_auth",
            "basic_auth and oauth2 would each set the Authorization header; keep one".into(),
        );
    }
    basic_auth
}

/// A client certificate, which only an https:// endpoint can be shown.
fn read_tls(
    entry: &Entry,
    url: Option<&reqwest::Url>,
    problems: &mut Problems<'_>,
) -> Option<ClientTls> {
    let tls = entry
        .tls
        .as_ref()
        .and_then(|t| match parse_tls(t.get_ref()) {
            Ok(t) => Some(t),
            Err((field, message)) => {
                problems.at(t.span().start, &format!("tls.{field}"), message);
                None
            }
        });
    if tls.is_some() && url.is_some_and(|u| !super::destination::is_tls(u)) {
        problems.at(entry.url.span().start, "tls", super::auth::TLS_ONLY.into());
    }
    tls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(extra: &str) -> Result<Subscriptions, SubscriptionErrors> {
        Subscriptions::parse(
            "subs.toml",
            &format!(
                "[[subscription]]\nid = \"s\"\ntenant = \"t\"\nurl = \"https://h.example/x\"\n\
                 secrets = [\"env:X\"]\n{extra}"
            ),
        )
    }

    #[test]
    fn headers_and_basic_auth_are_read_and_reserved_names_refused_by_name() {
        let subs = with(
            "headers = { \"X-Team\" = \"orders\", \"X-Api-Key\" = { secret = \"env:API_KEY\" } }\n\
             basic_auth = { username = \"hookrelay\", password = \"file:/run/pw\" }\n",
        )
        .unwrap();
        let sub = subs.get("s").unwrap();
        let names: Vec<(&str, bool)> = sub
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.as_str(),
                    matches!(h.value, HeaderValueSpec::Secret(_)),
                )
            })
            .collect();
        assert_eq!(names, [("x-api-key", true), ("x-team", false)]);
        assert_eq!(sub.basic_auth.as_ref().unwrap().username, "hookrelay");
        // Debug shows names and references, never a value.
        let shown = format!("{sub:?}");
        assert!(
            shown.contains("x-api-key (from env:API_KEY)") && !shown.contains("orders"),
            "{shown}"
        );

        for (header, why) in [
            (
                "Webhook-Signature",
                "\"Webhook-Signature\" is reserved: the webhook-* headers",
            ),
            (
                "Content-Type",
                "\"Content-Type\" is reserved: hookrelay or the HTTP client sets it",
            ),
            ("Idempotency-Key", "\"Idempotency-Key\" is reserved"),
        ] {
            let err = with(&format!("headers = {{ \"{header}\" = \"x\" }}\n")).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        let both = with(
            "headers = { Authorization = \"Bearer x\" }\n\
             basic_auth = { username = \"u\", password = \"env:P\" }\n",
        )
        .unwrap_err();
        assert!(both.to_string().contains("keep one"), "{both}");
        let colon =
            with("basic_auth = { username = \"a:b\", password = \"env:P\" }\n").unwrap_err();
        assert!(colon.to_string().contains("basic_auth.username"), "{colon}");
        let not_a_ref = with("headers = { \"X-Key\" = { secret = \"plain\" } }\n").unwrap_err();
        assert!(not_a_ref.to_string().contains("\"x-key\""), "{not_a_ref}");
    }

    #[test]
    fn oauth2_and_client_certificates_are_read_and_their_conflicts_refused() {
        let subs = with(
            "[subscription.oauth2]\n\
             token_url = \"https://idp.example/oauth/token\"\n\
             client_id = \"hookrelay\"\n\
             client_secret = \"env:IDP_SECRET\"\n\
             scope = \"webhooks:write\"\n\
             [subscription.tls]\n\
             cert = \"file:/run/secrets/client.pem\"\n\
             key = \"file:/run/secrets/client.key\"\n",
        )
        .unwrap();
        let sub = subs.get("s").unwrap();
        let oauth = sub.oauth2.as_ref().unwrap();
        assert_eq!(oauth.client_id, "hookrelay");
        assert_eq!(oauth.method, ClientAuthMethod::Basic);
        assert_eq!(oauth.scope.as_deref(), Some("webhooks:write"));
        assert_eq!(
            sub.tls.as_ref().unwrap().key,
            SecretRef::File("/run/secrets/client.key".into())
        );

        let refusals = [
            (
                "basic_auth = { username = \"u\", password = \"env:P\" }\n\
                 oauth2 = { token_url = \"https://i.example/t\", client_id = \"c\", client_secret = \"env:S\" }\n",
                "keep one",
            ),
            (
                "headers = { Authorization = \"Bearer x\" }\n\
                 oauth2 = { token_url = \"https://i.example/t\", client_id = \"c\", client_secret = \"env:S\" }\n",
                "keep one",
            ),
            (
                "oauth2 = { token_url = \"ftp://i.example/t\", client_id = \"c\", client_secret = \"env:S\" }\n",
                "oauth2.token_url",
            ),
            (
                "oauth2 = { token_url = \"https://i.example/t\", client_id = \"c\", client_secret = \"whsec_abc\" }\n",
                "oauth2.client_secret: secrets are references",
            ),
            (
                "oauth2 = { token_url = \"https://i.example/t\", client_id = \"c\", client_secret = \"env:S\", auth_method = \"jwt\" }\n",
                "oauth2.auth_method",
            ),
            (
                "tls = { cert = \"file:/c\", key = \"-----BEGIN PRIVATE KEY-----\" }\n",
                "tls.key: not a secret reference",
            ),
        ];
        for (extra, why) in refusals {
            let err = with(extra).unwrap_err();
            assert!(err.to_string().contains(why), "{extra}: {err}");
        }
        let plain_http = Subscriptions::parse(
            "subs.toml",
            "[[subscription]]\nid = \"s\"\ntenant = \"t\"\nurl = \"http://h.example/x\"\n\
             secrets = [\"env:X\"]\ntls = { cert = \"file:/c\", key = \"file:/k\" }\n",
        )
        .unwrap_err();
        assert!(
            plain_http.to_string().contains("must be https://"),
            "{plain_http}"
        );
    }

    #[test]
    fn headers_of_the_connection_and_credentials_in_urls_are_refused() {
        for header in [
            "Proxy-Authorization",
            "Expect",
            "Upgrade",
            "Keep-Alive",
            "Trailer",
            "TE",
            "Proxy-Connection",
        ] {
            let err = with(&format!("headers = {{ \"{header}\" = \"x\" }}\n")).unwrap_err();
            assert!(
                err.to_string().contains(&format!("{header:?} is reserved")),
                "{header}: {err}"
            );
        }
        let with_url = |url: &str| {
            Subscriptions::parse(
                "subs.toml",
                &format!(
                    "[[subscription]]\nid = \"s\"\ntenant = \"t\"\nurl = \"{url}\"\n\
                     secrets = [\"env:X\"]\n"
                ),
            )
            .unwrap_err()
            .to_string()
        };
        let in_url = with_url("https://hook:hunter2@h.example/x");
        assert!(
            in_url.contains("url: ") && in_url.contains("basic_auth"),
            "{in_url}"
        );
        let in_token_url = with(
            "oauth2 = { token_url = \"https://c:hunter2@i.example/t\", client_id = \"c\", \
             client_secret = \"env:S\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            in_token_url.contains("oauth2.token_url") && in_token_url.contains("client_secret"),
            "{in_token_url}"
        );
        // A user name alone is a credential too; and the message never repeats the password.
        let user = with_url("https://hook@h.example/x");
        assert!(user.contains("basic_auth"), "{user}");
        assert!(!in_url.contains("hunter2") && !in_token_url.contains("hunter2"));
    }

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
        assert!(!orders.paused);
        assert!(orders.accepts("order.paid"));
        assert!(orders.accepts("order.refund.created"));
        assert!(orders.accepts("invoice.paid"));
        assert!(!orders.accepts("invoice.sent"));
        assert!(!orders.accepts("orders"));
        assert!(subs.get("sub_all").unwrap().accepts("anything"));
    }

    #[test]
    fn an_amqp_destination_is_read_with_its_exchange_and_checked() {
        let text = "[[subscription]]\nid = \"s\"\ntenant = \"t\"\n\
                    url = \"amqps://broker.partner.example/orders\"\nsecrets = [\"env:X\"]\n\
                    basic_auth = { username = \"hookrelay\", password = \"env:P\" }\n\
                    amqp = { exchange = \"webhooks\" }\n";
        let subs = Subscriptions::parse("s.toml", text).unwrap();
        let s = subs.get("s").unwrap();
        assert_eq!(s.amqp.as_ref().unwrap().routing_key_for("a.b"), "a.b");
        let without = text.replace("amqp = { exchange = \"webhooks\" }\n", "");
        let err = Subscriptions::parse("s.toml", &without).unwrap_err();
        assert_eq!(err.0[0].field, "amqp", "{err}");
        let http = text.replace("amqps://broker.partner.example/orders", "https://h.example");
        let err = Subscriptions::parse("s.toml", &http).unwrap_err();
        assert!(err.to_string().contains("this url is HTTP"), "{err}");
        let ftp = text.replace("amqps://", "ftp://");
        let err = Subscriptions::parse("s.toml", &ftp).unwrap_err();
        assert!(err.to_string().contains("amqp:// or amqps://"), "{err}");
    }

    #[test]
    fn a_subscription_may_be_paused() {
        let text = "[[subscription]]\nid = \"s\"\ntenant = \"t\"\nurl = \"https://x.example\"\n\
                    secrets = [\"env:X\"]\npaused = true\n";
        let subs = Subscriptions::parse("s.toml", text).unwrap();
        let s = subs.get("s").unwrap();
        assert!(s.paused && s.enabled);
        // Paused is not disabled: a fan-out still makes its delivery, which then parks.
        assert_eq!(subs.matching("t", "any.thing").len(), 1);
        let err = Subscriptions::parse("s.toml", &text.replace("true", "\"yes\"")).unwrap_err();
        assert_eq!(err.0[0].field, "paused", "{err}");
    }

    #[test]
    fn a_subscription_may_set_its_rate() {
        let text = "[[subscription]]\nid = \"s\"\ntenant = \"t\"\nurl = \"https://x.example\"\n\
                    secrets = [\"env:X\"]\nrate = \"600/m\"\n";
        let subs = Subscriptions::parse("s.toml", text).unwrap();
        assert_eq!(subs.get("s").unwrap().rate, Some("10/s".parse().unwrap()));
        let err = Subscriptions::parse("s.toml", &text.replace("600/m", "fast")).unwrap_err();
        assert_eq!(
            (err.0[0].field.as_str(), err.0[0].line),
            ("rate", 6),
            "{err}"
        );
    }

    #[test]
    fn paused_is_set_in_place_keeping_the_rest_of_the_file() {
        let paused = Subscriptions::with_paused("s.toml", GOOD, "sub_all", true).unwrap();
        assert_eq!(
            paused,
            GOOD.replace("id = \"sub_all\"\n", "id = \"sub_all\"\npaused = true\n")
        );
        let subs = Subscriptions::parse("s.toml", &paused).unwrap();
        assert!(subs.get("sub_all").unwrap().paused);
        assert!(!subs.get("sub_orders").unwrap().paused);
        // Written already: replaced where it stands.
        let resumed = Subscriptions::with_paused("s.toml", &paused, "sub_all", false).unwrap();
        assert_eq!(
            resumed,
            GOOD.replace("id = \"sub_all\"\n", "id = \"sub_all\"\npaused = false\n")
        );
        let err = Subscriptions::with_paused("s.toml", GOOD, "nobody", true).unwrap_err();
        assert!(
            err.to_string().contains("no subscription \"nobody\""),
            "{err}"
        );
        // An inline table cannot take a new line: refused, not broken.
        let inline = "subscription = [{ id = \"a\", tenant = \"t\", url = \"https://x.example\", \
                      secrets = [\"env:X\"] }]\n";
        let err = Subscriptions::with_paused("s.toml", inline, "a", true).unwrap_err();
        assert!(err.to_string().contains("by hand"), "{err}");
    }

    #[test]
    fn a_payload_filter_is_read_from_the_file_and_a_bad_one_named_with_its_line() {
        let text = r#"
[[subscription]]
id = "big"
tenant = "acme"
url = "https://x.example"
secrets = ["env:S"]
filter = { "data.amount" = { "$gt" = 100 }, "$not" = { "data.test" = true } }

[[subscription]]
id = "bad"
tenant = "acme"
url = "https://x.example"
secrets = ["env:S"]
filter = { "data.amount" = { "$between" = [1, 2] } }
"#;
        let errors = Subscriptions::parse("s.toml", text).unwrap_err().0;
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 1, "{shown:#?}");
        assert!(
            shown[0].starts_with("s.toml:14: filter: at data.amount.$between: unknown operator"),
            "{}",
            shown[0]
        );
        let good = text
            .split("\n\n[[subscription]]\nid = \"bad\"")
            .next()
            .unwrap();
        let subs = Subscriptions::parse("s.toml", good).unwrap();
        let big = subs.get("big").unwrap();
        let filter = big.payload_filter.as_ref().unwrap();
        assert!(filter.matches(&serde_json::json!({"data": {"amount": 101}})));
        assert!(!filter.matches(&serde_json::json!({"data": {"amount": 101, "test": true}})));
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
}
