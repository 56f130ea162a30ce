//! An embedded webhook endpoint on loopback, for the demo and the tests: it verifies each
//! request's Standard Webhooks signature with an independent implementation (the
//! `standardwebhooks` crate), records what arrived, and answers as a script says.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use hookrelay::units::now_ms;

/// The TLS library [`Receiver::start_tls`] takes a configuration of.
pub use tokio_rustls::rustls;

/// How the endpoint answers one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(u16),
    /// A redirect status with a `Location`.
    Redirect(u16, String),
    /// A status with `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
    /// Waits, then answers with the status (longer than the request timeout: a timeout).
    Slow(Duration, u16),
}

/// What the script sees of a request.
#[derive(Debug)]
pub struct Incoming<'a> {
    pub id: &'a str,
    /// `X-Delivery-Attempt`, 0 when absent.
    pub attempt: u32,
    pub path: &'a str,
    pub body: &'a [u8],
    pub headers: &'a HeaderMap,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Record {
    pub id: String,
    pub attempt: u32,
    pub idempotency_key: String,
    /// `webhook-timestamp`: the seconds the signature was made with; `None` when absent or
    /// not a number.
    pub timestamp: Option<u64>,
    pub path: String,
    /// What the endpoint answered.
    pub status: u16,
    /// For each configured secret, whether the signature verified with it.
    pub verified_with: Vec<bool>,
    /// `webhook-signature` as received (every `v1,` and `v1a,` signature).
    pub signature: String,
    /// Every request header, as received.
    pub headers: HeaderMap,
    pub received_at_ms: u64,
    /// Its place in arrival order, from 0 (records are kept in the order answers were made).
    pub arrival: usize,
    /// Requests being answered when it arrived, itself included.
    pub concurrent: usize,
    pub body: Bytes,
}

type Script = dyn Fn(&Incoming<'_>) -> Reply + Send + Sync;

struct Inner {
    verifiers: Vec<standardwebhooks::Webhook>,
    script: Box<Script>,
    records: Mutex<Vec<Record>>,
    /// Successful (2xx) answers per webhook id.
    delivered: Mutex<HashMap<String, u32>>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
    /// Requests that have arrived.
    arrived: std::sync::atomic::AtomicUsize,
    /// TLS handshakes that failed (a client certificate refused, for one).
    refused: std::sync::atomic::AtomicUsize,
}

/// Accepts TCP connections and completes their TLS handshakes; a failed handshake is counted
/// and dropped, and accepting goes on.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    inner: Arc<Inner>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            match self.acceptor.accept(stream).await {
                Ok(tls) => return (tls, addr),
                Err(_) => {
                    self.inner
                        .refused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A running endpoint. Dropping it stops the server.
pub struct Receiver {
    addr: SocketAddr,
    /// "https" for a receiver over TLS.
    scheme: &'static str,
    inner: Arc<Inner>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    /// Binds `127.0.0.1:0` and serves. `secrets` are `whsec_` secrets to verify with (none: no
    /// verification); `script` picks each answer.
    pub async fn start(
        secrets: &[String],
        script: impl Fn(&Incoming<'_>) -> Reply + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        Self::serve(secrets, None, script).await
    }

    /// As [`Receiver::start`], over TLS with `tls` (which may require a client certificate).
    /// A handshake that fails is dropped before any request: as an endpoint that refuses the
    /// client's certificate does. [`Receiver::handshakes_refused`] counts them.
    pub async fn start_tls(
        secrets: &[String],
        tls: Arc<tokio_rustls::rustls::ServerConfig>,
        script: impl Fn(&Incoming<'_>) -> Reply + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        Self::serve(secrets, Some(tls), script).await
    }

    async fn serve(
        secrets: &[String],
        tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
        script: impl Fn(&Incoming<'_>) -> Reply + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let verifiers = secrets
            .iter()
            .map(|s| {
                standardwebhooks::Webhook::new(s).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let inner = Arc::new(Inner {
            verifiers,
            script: Box::new(script),
            records: Mutex::new(Vec::new()),
            delivered: Mutex::new(HashMap::new()),
            in_flight: Default::default(),
            max_in_flight: Default::default(),
            arrived: Default::default(),
            refused: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .fallback(axum::routing::post(receive))
            .with_state(Arc::clone(&inner));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        match tls {
            None => {
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await;
                });
            }
            Some(tls) => {
                let listener = TlsListener {
                    tcp: listener,
                    acceptor: tokio_rustls::TlsAcceptor::from(tls),
                    inner: Arc::clone(&inner),
                };
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await;
                });
            }
        }
        Ok(Self {
            addr,
            scheme,
            inner,
            stop: Some(stop),
        })
    }

    /// TLS handshakes that failed, for a receiver started with [`Receiver::start_tls`].
    pub fn handshakes_refused(&self) -> usize {
        self.inner
            .refused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`.
    /// `http://127.0.0.1:port{path}`, or `https://` over TLS (the server certificate names
    /// the address).
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.addr)
    }

    pub fn records(&self) -> Vec<Record> {
        lock(&self.inner.records).clone()
    }

    /// Every request for one webhook id, in arrival order.
    pub fn records_for(&self, id: &str) -> Vec<Record> {
        lock(&self.inner.records)
            .iter()
            .filter(|r| r.id == id)
            .cloned()
            .collect()
    }

    pub fn request_count(&self) -> usize {
        lock(&self.inner.records).len()
    }

    /// Distinct webhook ids answered with 2xx.
    pub fn delivered_count(&self) -> usize {
        lock(&self.inner.delivered).len()
    }

    /// 2xx answers per webhook id.
    pub fn delivered(&self) -> HashMap<String, u32> {
        lock(&self.inner.delivered).clone()
    }

    /// The most requests this endpoint was answering at once.
    pub fn max_in_flight(&self) -> usize {
        self.inner
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Webhook ids answered with 2xx more than once, and how many extra times.
    pub fn duplicates(&self) -> usize {
        lock(&self.inner.delivered)
            .values()
            .map(|&n| n.saturating_sub(1) as usize)
            .sum()
    }

    /// Polls until `done` holds or `timeout` passes; returns whether it held.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&Self) -> bool) -> bool {
        crate::kit::wait_until(timeout, async || done(self)).await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn receive(
    State(inner): State<Arc<Inner>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let id = text("webhook-id");
    let attempt = text("x-delivery-attempt").parse().unwrap_or(0);
    let verified_with = inner
        .verifiers
        .iter()
        .map(|v| v.verify(&body, &headers).is_ok())
        .collect();
    let reply = (inner.script)(&Incoming {
        id: &id,
        attempt,
        path: uri.path(),
        body: &body,
        headers: &headers,
    });
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// Counts the request out however it ends (a client that gives up drops the handler).
    struct Counted<'a>(&'a AtomicUsize);
    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    // Under the records' lock, so that arrival order and concurrency agree.
    let (arrival, concurrent) = {
        let _order = lock(&inner.records);
        (
            inner.arrived.fetch_add(1, Ordering::SeqCst),
            inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1,
        )
    };
    inner.max_in_flight.fetch_max(concurrent, Ordering::SeqCst);
    let counted = Counted(&inner.in_flight);
    let status = match &reply {
        Reply::Status(s) | Reply::RetryAfter(s, _) | Reply::Redirect(s, _) => *s,
        Reply::Slow(wait, s) => {
            tokio::time::sleep(*wait).await;
            *s
        }
    };
    drop(counted);
    if (200..300).contains(&status) {
        *lock(&inner.delivered).entry(id.clone()).or_default() += 1;
    }
    lock(&inner.records).push(Record {
        idempotency_key: text("idempotency-key"),
        timestamp: text("webhook-timestamp").parse().ok(),
        id,
        attempt,
        path: uri.path().to_owned(),
        status,
        verified_with,
        signature: text("webhook-signature"),
        headers: headers.clone(),
        received_at_ms: now_ms(),
        arrival,
        concurrent,
        body,
    });
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match reply {
        Reply::RetryAfter(_, secs) => (code, [("retry-after", secs.to_string())]).into_response(),
        Reply::Redirect(_, location) => (code, [("location", location)]).into_response(),
        _ => code.into_response(),
    }
}
