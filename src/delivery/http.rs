//! The HTTP edge: builds the signed webhook request and sends it with enforced timeouts, no
//! redirects and a capped response read. Classifying what came back is [`crate::delivery::route`]'s job.

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::header::{
    CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, InvalidHeaderValue, RETRY_AFTER, USER_AGENT,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::HttpConfig;
use crate::contract::envelope::EnvelopeId;
use crate::delivery::egress::{EgressPolicy, GuardedResolver, Lookup, find_denial};
use crate::delivery::route::{AttemptResult, parse_retry_after};

pub const USER_AGENT_VALUE: &str = concat!("hookrelay/", env!("CARGO_PKG_VERSION"));

/// One attempt, ready to send.
#[derive(Debug, Clone)]
pub struct WebhookRequest<'a> {
    pub url: &'a reqwest::Url,
    pub id: &'a EnvelopeId,
    /// 1-based.
    pub attempt: u32,
    /// Seconds since the epoch; part of the signed content.
    pub timestamp: u64,
    /// The `webhook-signature` value.
    pub signature: String,
    pub body: Bytes,
    /// The subscription's own headers (and `Authorization` for basic auth or a bearer token),
    /// checked against the reserved names when the subscription was read; secret ones marked
    /// sensitive.
    pub extra: Vec<(HeaderName, HeaderValue)>,
    /// The client certificate to present, for a subscription with one.
    pub client_tls: Option<ClientPem>,
}

/// A subscription's client certificate and key as PEM text, and the CA the endpoint's
/// certificate must chain to when not the system's. `Debug` shows the subscription only.
#[derive(Clone)]
pub struct ClientPem {
    pub subscription: String,
    /// The certificate chain, then the private key.
    pub identity: Arc<str>,
    pub ca: Option<Arc<str>>,
}

impl std::fmt::Debug for ClientPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPem")
            .field("subscription", &self.subscription)
            .finish_non_exhaustive()
    }
}

impl ClientPem {
    fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.identity.as_bytes());
        h.update([0]);
        if let Some(ca) = &self.ca {
            h.update(ca.as_bytes());
        }
        h.finalize().into()
    }
}

impl WebhookRequest<'_> {
    /// The Standard Webhooks headers plus the idempotency and attempt headers. Fails only if
    /// the signature is not a header value, which a signature of ours always is.
    pub fn headers(&self) -> Result<HeaderMap, InvalidHeaderValue> {
        let mut h = HeaderMap::with_capacity(8);
        // An envelope id is ASCII letters, digits, '_' and '-' by construction.
        let id = HeaderValue::from_str(self.id.as_str())?;
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        h.insert(HeaderName::from_static("webhook-id"), id.clone());
        h.insert(
            HeaderName::from_static("webhook-timestamp"),
            HeaderValue::from(self.timestamp),
        );
        h.insert(
            HeaderName::from_static("webhook-signature"),
            HeaderValue::from_str(&self.signature)?,
        );
        h.insert(HeaderName::from_static("idempotency-key"), id);
        h.insert(
            HeaderName::from_static("x-delivery-attempt"),
            HeaderValue::from(self.attempt),
        );
        for (name, value) in &self.extra {
            // Never one of the above: reserved names are refused where subscriptions are read.
            if !h.contains_key(name) {
                h.insert(name.clone(), value.clone());
            }
        }
        Ok(h)
    }
}

/// What an attempt produced, with its latency and the start of the response body for logs.
#[derive(Debug, Clone)]
pub struct AttemptReport {
    pub result: AttemptResult,
    pub latency: Duration,
    pub response_excerpt: String,
}

/// Clients with a client certificate, by subscription id, with the fingerprint of its PEM.
type TlsClients = HashMap<String, ([u8; 32], reqwest::Client)>;

/// Sends webhooks over one pooled client shared by every task, and a client of its own for each
/// subscription that presents a certificate. Every address they connect to passed the egress
/// policy.
#[derive(Debug, Clone)]
pub struct HttpSender {
    client: reqwest::Client,
    config: HttpConfig,
    policy: Arc<EgressPolicy>,
    resolver: GuardedResolver,
    /// By subscription id, with the fingerprint of the PEM each was built from: a rotated
    /// certificate (seen when its reference is read again) gets a new client.
    tls_clients: Arc<Mutex<TlsClients>>,
}

impl HttpSender {
    pub fn new(
        config: &HttpConfig,
        policy: Arc<EgressPolicy>,
        lookup: Arc<dyn Lookup>,
    ) -> Result<Self, reqwest::Error> {
        // A lookup gets the connect timeout: in the client it is part of connecting, and through
        // a proxy (resolved here, before the client starts its clocks) it would have no bound.
        let resolver =
            GuardedResolver::new(Arc::clone(&policy), lookup).with_timeout(config.connect_timeout);
        let client = builder(config, &policy, &resolver)?.build()?;
        Ok(Self {
            client,
            config: config.clone(),
            policy,
            resolver,
            tls_clients: Arc::default(),
        })
    }

    /// Drops the clients of subscriptions `is_live` no longer knows; returns how many remain.
    pub fn retain_tls_clients(&self, is_live: impl Fn(&str) -> bool) -> usize {
        let mut clients = self.tls_clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|id, _| is_live(id));
        clients.len()
    }

    /// The client that presents `pem`'s certificate, built the first time it is needed and
    /// again when the PEM changes. The error says what is wrong, never what the PEM holds.
    fn tls_client(&self, pem: &ClientPem) -> Result<reqwest::Client, ClientTlsError> {
        let fingerprint = pem.fingerprint();
        let mut clients = self.tls_clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((held, client)) = clients.get(&pem.subscription)
            && *held == fingerprint
        {
            return Ok(client.clone());
        }
        let subscription = || pem.subscription.clone();
        let identity = reqwest::Identity::from_pem(pem.identity.as_bytes())
            .map_err(|_| ClientTlsError::NotIdentity(subscription()))?;
        let mut builder = builder(&self.config, &self.policy, &self.resolver)
            .map_err(ClientTlsError::Builder)?
            .identity(identity);
        if let Some(ca) = &pem.ca {
            let roots = reqwest::Certificate::from_pem_bundle(ca.as_bytes())
                .ok()
                .filter(|r| !r.is_empty())
                .ok_or_else(|| ClientTlsError::NotCa(subscription()))?;
            builder = builder.tls_certs_only(roots);
        }
        let client = builder.build().map_err(|e| ClientTlsError::Unusable {
            subscription: subscription(),
            detail: innermost(&e),
        })?;
        clients.insert(pem.subscription.clone(), (fingerprint, client.clone()));
        Ok(client)
    }

    /// POSTs a form (an OAuth2 token request) and reads the answer, capped: the status and the
    /// body, or why there is none, all within `http.token_timeout`. The target passes the
    /// egress policy like an endpoint.
    pub async fn post_form(
        &self,
        url: &reqwest::Url,
        authorization: Option<String>,
        form: String,
    ) -> Result<(u16, Bytes), FormError> {
        let limit = self.config.token_timeout;
        tokio::time::timeout(limit, self.post_form_unbounded(url, authorization, form))
            .await
            .unwrap_or(Err(FormError::NoAnswer(limit)))
    }

    async fn post_form_unbounded(
        &self,
        url: &reqwest::Url,
        authorization: Option<String>,
        form: String,
    ) -> Result<(u16, Bytes), FormError> {
        if let Some(result) = self.precheck(url).await {
            return Err(FormError::unanswered(result));
        }
        let mut request = self
            .client
            .post(url.clone())
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            )
            .header(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE))
            .header(
                reqwest::header::ACCEPT,
                HeaderValue::from_static("application/json"),
            )
            .body(form);
        if let Some(value) = authorization {
            let mut value = HeaderValue::from_str(&value).map_err(|_| FormError::Credentials)?;
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| FormError::unanswered(classify_error(&e)))?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while body.len() < self.config.max_response_bytes {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return Err(FormError::unanswered(classify_error(&e))),
            }
        }
        Ok((status, Bytes::from(body)))
    }

    /// The policy's verdict before any connection: scheme, port, IP-literal hosts, and (through a
    /// proxy, where the client resolves only the proxy) the target's addresses.
    async fn precheck(&self, url: &reqwest::Url) -> Option<AttemptResult> {
        if let Err(denied) = self.policy.check_url(url) {
            return Some(AttemptResult::EgressDenied(denied.to_string()));
        }
        if self.policy.proxy().is_some()
            && let Some(url::Host::Domain(host)) = url.host()
            && let Err(e) = self.resolver.resolve_checked(host).await
        {
            return Some(match e {
                crate::delivery::egress::ResolveError::Denied(d) => {
                    AttemptResult::EgressDenied(d.to_string())
                }
                other => AttemptResult::Transport(other.to_string()),
            });
        }
        None
    }

    pub async fn send(&self, request: WebhookRequest<'_>) -> AttemptReport {
        let started = Instant::now();
        if let Some(result) = self.precheck(request.url).await {
            return AttemptReport {
                result,
                latency: started.elapsed(),
                response_excerpt: String::new(),
            };
        }
        let headers = match request.headers() {
            Ok(headers) => headers,
            Err(e) => {
                return AttemptReport {
                    result: AttemptResult::NotSent(format!(
                        "cannot build the request headers: {e}"
                    )),
                    latency: started.elapsed(),
                    response_excerpt: String::new(),
                };
            }
        };
        let client = match &request.client_tls {
            None => self.client.clone(),
            Some(pem) => match self.tls_client(pem) {
                Ok(client) => client,
                Err(reason) => {
                    return AttemptReport {
                        result: AttemptResult::NotSent(reason.to_string()),
                        latency: started.elapsed(),
                        response_excerpt: String::new(),
                    };
                }
            },
        };
        let sent = client
            .post(request.url.clone())
            .headers(headers)
            .body(request.body)
            .send()
            .await;
        let (result, response_excerpt) = match sent {
            Err(e) => (classify_error(&e), String::new()),
            Ok(mut response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                // Read at most the cap; a body cut short still leaves the status standing. A
                // timeout while reading the body is a timeout of the attempt.
                let mut excerpt = Vec::new();
                let mut read = 0usize;
                let mut timed_out = false;
                while read < self.config.max_response_bytes {
                    match response.chunk().await {
                        Ok(Some(chunk)) => {
                            read += chunk.len();
                            if excerpt.len() < 256 {
                                let take = (256 - excerpt.len()).min(chunk.len());
                                excerpt.extend_from_slice(&chunk[..take]);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            timed_out = e.is_timeout();
                            break;
                        }
                    }
                }
                let result = if timed_out {
                    AttemptResult::Timeout
                } else {
                    AttemptResult::Response {
                        status,
                        retry_after,
                    }
                };
                (result, String::from_utf8_lossy(&excerpt).into_owned())
            }
        };
        AttemptReport {
            result,
            latency: started.elapsed(),
            response_excerpt,
        }
    }
}

/// Why a subscription's client certificate cannot be presented. The attempt is not sent;
/// [`ClientTlsError::is_subscriptions`] says whose setting is to be fixed.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    #[error(
        "the client certificate of subscription {0} is not a PEM certificate and private key \
         (PKCS#8, PKCS#1 or SEC1)"
    )]
    NotIdentity(String),
    #[error("the tls.ca of subscription {0} is not a PEM certificate")]
    NotCa(String),
    #[error("cannot use the client certificate of subscription {subscription}: {detail}")]
    Unusable {
        subscription: String,
        detail: String,
    },
    /// hookrelay's own HTTP settings (the proxy), not the subscription's.
    #[error("cannot build a TLS client: {0}")]
    Builder(reqwest::Error),
}

impl ClientTlsError {
    /// Whether the subscription's `tls` settings are at fault (else hookrelay's configuration).
    pub fn is_subscriptions(&self) -> bool {
        !matches!(self, ClientTlsError::Builder(_))
    }
}

/// Why a form POST (a token request) has no answer to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    /// The egress policy refuses the target: only a change of settings lets it through.
    #[error("{0}")]
    Denied(String),
    /// No connection, or it broke: the target or the network.
    #[error("transport error: {0}")]
    Transport(String),
    /// Over `http.request_timeout`.
    #[error("timeout")]
    Timeout,
    /// Over `http.token_timeout`, all of it.
    #[error("no answer within http.token_timeout ({})", crate::units::fmt_duration(*.0))]
    NoAnswer(Duration),
    /// The client id and secret make no `Authorization` header: the subscription's settings.
    #[error("the client credentials are not a header value")]
    Credentials,
}

impl FormError {
    /// Whether asking again may get an answer without a change of settings.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            FormError::Transport(_) | FormError::Timeout | FormError::NoAnswer(_)
        )
    }

    /// What [`HttpSender::precheck`] and [`classify_error`] found; they find no other kinds.
    fn unanswered(result: AttemptResult) -> Self {
        match result {
            AttemptResult::EgressDenied(why) => FormError::Denied(why),
            AttemptResult::Timeout => FormError::Timeout,
            AttemptResult::Transport(why) => FormError::Transport(why),
            other => FormError::Transport(other.describe()),
        }
    }
}

/// The client every request goes through: enforced timeouts, no redirects, the guarded
/// resolver, the policy's proxy.
fn builder(
    config: &HttpConfig,
    policy: &EgressPolicy,
    resolver: &GuardedResolver,
) -> Result<reqwest::ClientBuilder, reqwest::Error> {
    let builder = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .timeout(config.request_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(resolver.clone()))
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true);
    Ok(match policy.proxy() {
        Some(proxy) => builder.proxy(reqwest::Proxy::all(proxy.clone())?),
        None => builder.no_proxy(),
    })
}

/// The innermost cause of an error: what actually happened ("Connection refused").
fn innermost(e: &dyn std::error::Error) -> String {
    let mut detail = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        detail = inner.to_string();
        source = inner.source();
    }
    detail
}

fn classify_error(e: &reqwest::Error) -> AttemptResult {
    if let Some(denied) = find_denial(e) {
        return AttemptResult::EgressDenied(denied.to_string());
    }
    if e.is_timeout() {
        return AttemptResult::Timeout;
    }
    let detail = innermost(e);
    let kind = if e.is_connect() { "connect" } else { "request" };
    AttemptResult::Transport(format!("{kind}: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::egress::SystemLookup;

    #[test]
    fn a_bad_client_certificate_is_the_subscriptions_to_fix() {
        let sender = HttpSender::new(
            &HttpConfig::default(),
            Arc::new(EgressPolicy::default()),
            Arc::new(SystemLookup),
        )
        .unwrap();
        let pem = ClientPem {
            subscription: "sub_1".into(),
            identity: Arc::from("not a PEM"),
            ca: None,
        };
        let e = sender.tls_client(&pem).unwrap_err();
        assert!(matches!(e, ClientTlsError::NotIdentity(_)), "{e}");
        assert!(e.is_subscriptions(), "{e}");
        assert_eq!(
            e.to_string(),
            "the client certificate of subscription sub_1 is not a PEM certificate and private \
             key (PKCS#8, PKCS#1 or SEC1)"
        );
    }

    #[test]
    fn a_form_post_is_tried_again_only_when_settings_do_not_refuse_it() {
        assert_eq!(
            FormError::NoAnswer(Duration::from_secs(90)).to_string(),
            "no answer within http.token_timeout (1m30s)"
        );
        assert!(FormError::Timeout.is_transient());
        assert!(FormError::NoAnswer(Duration::from_secs(90)).is_transient());
        let denied = FormError::unanswered(AttemptResult::EgressDenied("private".into()));
        assert_eq!(denied, FormError::Denied("private".into()));
        assert!(!denied.is_transient());
        let refused = FormError::unanswered(AttemptResult::Transport("connect: refused".into()));
        assert_eq!(refused.to_string(), "transport error: connect: refused");
        assert!(refused.is_transient());
        assert!(!FormError::Credentials.is_transient());
    }
}
