//! OAuth2 client credentials (RFC 6749 section 4.4) for endpoints that want a bearer token: one
//! token per subscription, kept until shortly before it expires, fetched once however many
//! deliveries need it at the same moment, and dropped when the endpoint answers 401 with it.
//!
//! What the token endpoint answered is parsed here ([`parse_token_response`]); the request
//! itself goes through [`crate::delivery::http::HttpSender::post_form`], so the token endpoint
//! passes the egress policy like any endpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde::Deserialize;

use crate::delivery::http::{FormError, HttpSender};
use crate::subscriptions::{ClientAuthMethod, OAuth2, SecretStore};

/// How long a token without `expires_in` is used (unless the endpoint refuses it first).
pub const UNSTATED_LIFETIME: Duration = Duration::from_secs(3600);

/// A token is refreshed this long before it expires, or a quarter of its lifetime when that is
/// shorter: an attempt must not reach the endpoint with a token that expired on the way.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// An access token and which fetch produced it. `Debug` never shows the token.
#[derive(Clone)]
pub struct Token {
    pub value: Arc<str>,
    /// Counts fetches of this subscription's token: a 401 drops the token only if it is still
    /// the one that was refused, so concurrent 401s cause one refresh.
    pub generation: u64,
    fresh_until: Instant,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// What the token endpoint returned, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub access_token: String,
    pub lifetime: Duration,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: Option<String>,
    token_type: Option<String>,
    expires_in: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: Option<String>,
    error_description: Option<String>,
}

/// Why a token endpoint gave no token. Each says whose move it is; in every case the delivery
/// waits in the ladder and is tried again (with a new fetch), so the fix is what changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// It answered an error status: the client's id, secret, scope or audience is wrong, or,
    /// for a 5xx or 429, the identity provider is in trouble ([`TokenError::is_transient`]).
    #[error("the token endpoint answered HTTP {status}{detail}")]
    Refused { status: u16, detail: String },
    /// Its answer is not a bearer token hookrelay can send: the provider's configuration.
    #[error("{0}")]
    Malformed(String),
    /// No answer: the provider or the network, or (the egress policy, the credentials) the
    /// settings, as [`FormError::is_transient`] tells.
    #[error("{0}")]
    Unreachable(FormError),
    /// The subscription's client secret does not resolve: its reference.
    #[error("client_secret: {0}")]
    Secret(String),
}

impl TokenError {
    /// Whether the identity provider may answer differently soon without a change of settings.
    pub fn is_transient(&self) -> bool {
        match self {
            TokenError::Unreachable(e) => e.is_transient(),
            TokenError::Refused { status, .. } => *status >= 500 || *status == 429,
            TokenError::Malformed(_) | TokenError::Secret(_) => false,
        }
    }
}

/// No token for a subscription: from which token endpoint (shown without credentials), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("OAuth2 token from {from}: {error}")]
pub struct TokenFailure {
    pub from: String,
    pub error: TokenError,
}

const NOT_SECONDS: &str = "the token endpoint's expires_in is not a number of seconds";

fn malformed(what: &str) -> TokenError {
    TokenError::Malformed(what.to_owned())
}

/// The token in a token endpoint's answer, or why there is none. Error texts quote the
/// endpoint's `error` and `error_description` (RFC 6749 section 5.2), never the body at large:
/// it could echo what was sent.
pub fn parse_token_response(status: u16, body: &[u8]) -> Result<Fetched, TokenError> {
    if !(200..=299).contains(&status) {
        let detail = serde_json::from_slice::<ErrorResponse>(body)
            .ok()
            .and_then(|e| {
                e.error.map(|error| match e.error_description {
                    Some(d) => format!(": {} ({})", clip(&error), clip(&d)),
                    None => format!(": {}", clip(&error)),
                })
            })
            .unwrap_or_default();
        return Err(TokenError::Refused { status, detail });
    }
    let parsed: TokenResponse = serde_json::from_slice(body)
        .map_err(|_| malformed("the token endpoint's answer is not a JSON token response"))?;
    let access_token = parsed
        .access_token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| malformed("the token endpoint's answer has no access_token"))?;
    if let Some(kind) = &parsed.token_type
        && !kind.eq_ignore_ascii_case("bearer")
    {
        return Err(TokenError::Malformed(format!(
            "the token endpoint issued a {:?} token; only bearer tokens are sent",
            clip(kind)
        )));
    }
    if reqwest::header::HeaderValue::from_str(&format!("Bearer {access_token}")).is_err() {
        return Err(malformed(
            "the token endpoint's access_token is not a header value",
        ));
    }
    // A number, or (some servers) a number in a string.
    let lifetime = match parsed.expires_in {
        None | Some(serde_json::Value::Null) => UNSTATED_LIFETIME,
        Some(serde_json::Value::Number(n)) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(1e9)))
            .ok_or_else(|| malformed(NOT_SECONDS))?,
        Some(serde_json::Value::String(s)) => s
            .trim()
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| malformed(NOT_SECONDS))?,
        Some(_) => return Err(malformed(NOT_SECONDS)),
    };
    Ok(Fetched {
        access_token,
        lifetime,
    })
}

/// How long a token with `lifetime` is used before a new one is asked for.
pub fn fresh_for(lifetime: Duration) -> Duration {
    lifetime.saturating_sub(REFRESH_MARGIN.min(lifetime / 4))
}

/// The form body and the basic credentials of a client-credentials request.
pub fn token_request(spec: &OAuth2, client_secret: &str) -> (String, Option<String>) {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("grant_type", "client_credentials");
    if let Some(scope) = &spec.scope {
        form.append_pair("scope", scope);
    }
    if let Some(audience) = &spec.audience {
        form.append_pair("audience", audience);
    }
    let basic = match spec.method {
        ClientAuthMethod::Post => {
            form.append_pair("client_id", &spec.client_id);
            form.append_pair("client_secret", client_secret);
            None
        }
        // RFC 6749 section 2.3.1: both form-encoded before they are joined.
        ClientAuthMethod::Basic => {
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let pair = format!("{}:{}", enc(&spec.client_id), enc(client_secret));
            Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
        }
    };
    (form.finish(), basic)
}

fn clip(s: &str) -> String {
    crate::units::shorten(s, 200)
}

struct Entry {
    spec: OAuth2,
    token: Mutex<Option<Token>>,
    /// Held while a token is fetched: who comes meanwhile waits for that fetch.
    fetching: tokio::sync::Mutex<()>,
    /// The last failed fetch: when it ended and why, for those who waited on it.
    failed: Mutex<Option<(Instant, TokenFailure)>>,
    generation: Mutex<u64>,
}

/// The tokens of every OAuth2 subscription, by subscription id.
#[derive(Default)]
pub struct Tokens {
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    /// Token requests by result (`issued`, `failed`), when counted.
    requests: Option<prometheus::IntCounterVec>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").finish_non_exhaustive()
    }
}

impl Tokens {
    /// Tokens whose requests are counted in `requests` by result.
    pub fn counted(requests: prometheus::IntCounterVec) -> Self {
        Self {
            entries: Mutex::default(),
            requests: Some(requests),
        }
    }

    fn count(&self, result: &str) {
        if let Some(requests) = &self.requests {
            requests.with_label_values(&[result]).inc();
        }
    }

    /// Drops the tokens of subscriptions `is_live` no longer knows; returns how many remain.
    pub fn retain(&self, is_live: impl Fn(&str) -> bool) -> usize {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|id, _| is_live(id));
        entries.len()
    }

    fn entry(&self, subscription: &str, spec: &OAuth2) -> Arc<Entry> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(subscription) {
            // A changed spec (another client, scope or endpoint) starts afresh.
            Some(e) if e.spec == *spec => Arc::clone(e),
            _ => {
                let e = Arc::new(Entry {
                    spec: spec.clone(),
                    token: Mutex::new(None),
                    fetching: tokio::sync::Mutex::new(()),
                    failed: Mutex::new(None),
                    generation: Mutex::new(0),
                });
                entries.insert(subscription.to_owned(), Arc::clone(&e));
                e
            }
        }
    }

    /// A fresh token for `subscription`: the cached one, or one fetched now. Deliveries that
    /// ask while a fetch is under way wait for it and share its token, or its error.
    pub async fn get(
        &self,
        subscription: &str,
        spec: &OAuth2,
        secrets: &SecretStore,
        http: &HttpSender,
    ) -> Result<Token, TokenFailure> {
        let entry = self.entry(subscription, spec);
        let asked = Instant::now();
        if let Some(token) = fresh(&entry) {
            return Ok(token);
        }
        let _fetching = entry.fetching.lock().await;
        if let Some(token) = fresh(&entry) {
            return Ok(token);
        }
        if let Some((at, why)) = &*entry.failed.lock().unwrap_or_else(|p| p.into_inner())
            && *at >= asked
        {
            return Err(why.clone());
        }
        let fetched = fetch(spec, secrets, http).await;
        self.count(if fetched.is_ok() { "issued" } else { "failed" });
        match fetched {
            Ok(fetched) => {
                let generation = {
                    let mut g = entry.generation.lock().unwrap_or_else(|p| p.into_inner());
                    *g += 1;
                    *g
                };
                let token = Token {
                    value: Arc::from(fetched.access_token),
                    generation,
                    fresh_until: Instant::now() + fresh_for(fetched.lifetime),
                };
                *entry.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
                Ok(token)
            }
            Err(error) => {
                let why = TokenFailure {
                    from: shown(&spec.token_url),
                    error,
                };
                *entry.failed.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((Instant::now(), why.clone()));
                Err(why)
            }
        }
    }

    /// The endpoint refused `token`: the next delivery fetches a new one, unless another
    /// delivery's refusal already caused that.
    pub fn refused(&self, subscription: &str, token: &Token) {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = entries.get(subscription) {
            let mut held = entry.token.lock().unwrap_or_else(|p| p.into_inner());
            if held
                .as_ref()
                .is_some_and(|t| t.generation == token.generation)
            {
                *held = None;
            }
        }
    }

    /// Tokens fetched for `subscription` so far (for tests and status).
    pub fn fetches(&self, subscription: &str) -> u64 {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(subscription).map_or(0, |e| {
            *e.generation.lock().unwrap_or_else(|p| p.into_inner())
        })
    }
}

fn fresh(entry: &Entry) -> Option<Token> {
    entry
        .token
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .filter(|t| Instant::now() < t.fresh_until)
        .cloned()
}

fn shown(url: &reqwest::Url) -> String {
    crate::config::shown_url(url)
}

async fn fetch(
    spec: &OAuth2,
    secrets: &SecretStore,
    http: &HttpSender,
) -> Result<Fetched, TokenError> {
    let secret = secrets
        .resolve_text(&spec.client_secret)
        .map_err(|e| TokenError::Secret(e.to_string()))?;
    let (form, basic) = token_request(spec, &secret);
    let (status, body) = http
        .post_form(&spec.token_url, basic, form)
        .await
        .map_err(TokenError::Unreachable)?;
    parse_token_response(status, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_responses_parse_and_errors_say_what_the_server_said() {
        let ok = parse_token_response(
            200,
            br#"{"access_token":"abc","token_type":"Bearer","expires_in":120}"#,
        )
        .unwrap();
        assert_eq!(ok.access_token, "abc");
        assert_eq!(ok.lifetime, Duration::from_secs(120));
        let as_text = parse_token_response(200, br#"{"access_token":"a","expires_in":"30"}"#);
        assert_eq!(as_text.unwrap().lifetime, Duration::from_secs(30));
        let unstated = parse_token_response(200, br#"{"access_token":"a"}"#).unwrap();
        assert_eq!(unstated.lifetime, UNSTATED_LIFETIME);

        let refused = parse_token_response(
            401,
            br#"{"error":"invalid_client","error_description":"unknown client","echo":"s3cret"}"#,
        )
        .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the token endpoint answered HTTP 401: invalid_client (unknown client)"
        );
        assert!(!refused.is_transient(), "the client's settings are wrong");
        let down = parse_token_response(503, b"<html>").unwrap_err();
        assert_eq!(down.to_string(), "the token endpoint answered HTTP 503");
        assert!(down.is_transient(), "the provider is in trouble");
        assert!(
            parse_token_response(200, br#"{"access_token":"a","token_type":"mac"}"#)
                .unwrap_err()
                .to_string()
                .contains("only bearer")
        );
        assert!(parse_token_response(200, br#"{"token_type":"bearer"}"#).is_err());
        assert!(parse_token_response(200, b"{\"access_token\":\"a\\nb\"}").is_err());
        assert!(parse_token_response(200, br#"{"access_token":"a","expires_in":-1}"#).is_err());
    }

    #[test]
    fn an_unanswered_token_request_is_tried_again_unless_the_settings_refuse_it() {
        let silent = TokenError::Unreachable(FormError::NoAnswer(Duration::from_secs(10)));
        assert_eq!(
            silent.to_string(),
            "no answer within http.token_timeout (10s)"
        );
        assert!(silent.is_transient(), "the provider or the network");
        assert!(
            TokenError::Unreachable(FormError::Transport("connect: refused".into())).is_transient()
        );
        let denied = TokenError::Unreachable(FormError::Denied("egress denied".into()));
        assert!(
            !denied.is_transient(),
            "only a change of egress settings lets it through"
        );
        assert!(!TokenError::Unreachable(FormError::Credentials).is_transient());
    }

    #[test]
    fn a_token_is_renewed_before_it_expires() {
        assert_eq!(
            fresh_for(Duration::from_secs(3600)),
            Duration::from_secs(3540)
        );
        assert_eq!(fresh_for(Duration::from_secs(4)), Duration::from_secs(3));
        assert_eq!(fresh_for(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_client_authenticates_by_basic_or_in_the_form() {
        let mut spec = OAuth2 {
            token_url: "https://idp.example/token".parse().unwrap(),
            client_id: "hook relay".into(),
            client_secret: crate::subscriptions::SecretRef::Env("S".into()),
            scope: Some("a b".into()),
            audience: None,
            method: ClientAuthMethod::Basic,
        };
        let (form, basic) = token_request(&spec, "p&ss");
        assert_eq!(form, "grant_type=client_credentials&scope=a+b");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic.unwrap().trim_start_matches("Basic "))
            .unwrap();
        assert_eq!(decoded, b"hook+relay:p%26ss");
        spec.method = ClientAuthMethod::Post;
        let (form, basic) = token_request(&spec, "p&ss");
        assert!(basic.is_none());
        assert_eq!(
            form,
            "grant_type=client_credentials&scope=a+b&client_id=hook+relay&client_secret=p%26ss"
        );
    }
}
