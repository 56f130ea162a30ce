//! The HTTP edge: builds the signed webhook request and sends it with enforced timeouts, no
//! redirects and a capped response read. Classifying what came back is [`crate::delivery::route`]'s job.

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::header::{
    CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, InvalidHeaderValue, RETRY_AFTER, USER_AGENT,
};

use std::sync::Arc;

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
    /// The subscription's own headers (and `Authorization` for basic auth), checked against the
    /// reserved names when the subscription was read; secret ones marked sensitive.
    pub extra: Vec<(HeaderName, HeaderValue)>,
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

/// Sends webhooks over one pooled client shared by every task. Every address it connects to
/// passed the egress policy.
#[derive(Debug, Clone)]
pub struct HttpSender {
    client: reqwest::Client,
    max_response_bytes: usize,
    policy: Arc<EgressPolicy>,
    resolver: GuardedResolver,
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
        let mut builder = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(resolver.clone()))
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true);
        builder = match policy.proxy() {
            Some(proxy) => builder.proxy(reqwest::Proxy::all(proxy.clone())?),
            None => builder.no_proxy(),
        };
        Ok(Self {
            client: builder.build()?,
            max_response_bytes: config.max_response_bytes,
            policy,
            resolver,
        })
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
        let sent = self
            .client
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
                while read < self.max_response_bytes {
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

fn classify_error(e: &reqwest::Error) -> AttemptResult {
    if let Some(denied) = find_denial(e) {
        return AttemptResult::EgressDenied(denied.to_string());
    }
    if e.is_timeout() {
        return AttemptResult::Timeout;
    }
    // The innermost cause says what actually happened ("Connection refused").
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        detail = inner.to_string();
        source = inner.source();
    }
    let kind = if e.is_connect() { "connect" } else { "request" };
    AttemptResult::Transport(format!("{kind}: {detail}"))
}
