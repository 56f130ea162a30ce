//! Authentication to the endpoint beyond the signature, each against a real server that
//! enforces it: basic auth (an endpoint that checks the credentials), OAuth2 client credentials (a token endpoint issuing expiring tokens, an endpoint
//! that accepts only a live one) and mutual TLS (a TLS endpoint that requires a client
//! certificate made here with rcgen).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{Counters, RunningWorker, Secret, TestLadder, event, secret, subscription};
use hookrelay::contract::headers::{self, LAST_ERROR_HEADER, REASON_HEADER};
use hookrelay::subscriptions::{ClientAuthMethod, ClientTls, OAuth2, SecretRef};
use hookrelay_tools::receiver::{Receiver, Reply, rustls};

const WAIT: Duration = Duration::from_secs(30);

/// An OAuth2 token endpoint: client credentials by basic auth, tokens that expire, a way to
/// revoke them all; and the check an endpoint makes of a bearer token.
struct Idp {
    client_id: String,
    client_secret: String,
    lifetime: Duration,
    /// Each token request waits this long before its answer: concurrent deliveries must share
    /// one request rather than each making its own meanwhile.
    delay: Duration,
    live: Mutex<HashMap<String, Instant>>,
    issued: AtomicUsize,
    refused: AtomicUsize,
    /// Every form body and Authorization header received, to search for secrets.
    seen: Mutex<Vec<String>>,
}

impl Idp {
    fn new(client_secret: &str, lifetime: Duration) -> Arc<Self> {
        Arc::new(Self {
            client_id: "hookrelay-test".into(),
            client_secret: client_secret.into(),
            lifetime,
            delay: Duration::from_millis(300),
            live: Mutex::new(HashMap::new()),
            issued: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn accepts(&self, authorization: Option<&str>) -> bool {
        let Some(token) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else {
            return false;
        };
        self.live
            .lock()
            .unwrap()
            .get(token)
            .is_some_and(|until| Instant::now() < *until)
    }

    fn revoke_all(&self) {
        self.live.lock().unwrap().clear();
    }

    async fn start(self: &Arc<Self>) -> String {
        use axum::http::{HeaderMap, StatusCode};
        let idp = Arc::clone(self);
        let app = axum::Router::new().route(
            "/token",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let idp = Arc::clone(&idp);
                async move {
                    use base64::Engine;
                    let authorization = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    idp.seen
                        .lock()
                        .unwrap()
                        .push(format!("{authorization} {body}"));
                    let expected = format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD
                            .encode(format!("{}:{}", idp.client_id, idp.client_secret))
                    );
                    if authorization != expected
                        || !body.contains("grant_type=client_credentials")
                        || !body.contains("scope=webhooks%3Awrite")
                    {
                        idp.refused.fetch_add(1, Ordering::SeqCst);
                        return (
                            StatusCode::UNAUTHORIZED,
                            r#"{"error":"invalid_client","error_description":"client authentication failed"}"#
                                .to_owned(),
                        );
                    }
                    tokio::time::sleep(idp.delay).await;
                    let n = idp.issued.fetch_add(1, Ordering::SeqCst) + 1;
                    let token = format!("tok-{n}-{}", uuid::Uuid::new_v4().simple());
                    idp.live
                        .lock()
                        .unwrap()
                        .insert(token.clone(), Instant::now() + idp.lifetime);
                    (
                        StatusCode::OK,
                        serde_json::json!({
                            "access_token": token,
                            "token_type": "Bearer",
                            "expires_in": idp.lifetime.as_secs(),
                        })
                        .to_string(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}/token")
    }
}

/// A receiver that answers 204 to a live token of `idp` and 401 to anything else.
async fn guarded_receiver(s: &Secret, idp: &Arc<Idp>) -> Receiver {
    let idp = Arc::clone(idp);
    Receiver::start(std::slice::from_ref(&s.whsec), move |req| {
        let authorization = req
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if idp.accepts(authorization) {
            Reply::Status(204)
        } else {
            Reply::Status(401)
        }
    })
    .await
    .unwrap()
}

fn oauth_subscription(
    receiver: &Receiver,
    s: &Secret,
    token_url: &str,
    client_secret_file: &std::path::Path,
) -> hookrelay::subscriptions::Subscription {
    let mut sub = subscription("sub_oauth", "acme", &receiver.url("/hook"), s);
    sub.oauth2 = Some(OAuth2 {
        token_url: token_url.parse().unwrap(),
        client_id: "hookrelay-test".into(),
        client_secret: SecretRef::File(client_secret_file.to_owned()),
        scope: Some("webhooks:write".into()),
        audience: None,
        method: ClientAuthMethod::Basic,
    });
    sub
}

/// Publishes `n` events at once after the `from` published before, and waits until the
/// receiver has delivered all `from + n`.
async fn burst_delivered(t: &TestLadder, receiver: &Receiver, from: usize, n: usize) {
    t.publish_all((from..from + n).map(|i| event(&format!("evt_{i:04}"), "acme", "sub_oauth")))
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == from + n)
            .await,
        "{} of {} delivered",
        receiver.delivered_count(),
        from + n
    );
}

#[tokio::test]
async fn an_oauth2_token_is_fetched_once_for_concurrent_deliveries_renewed_before_expiry_and_refreshed_once_after_a_401()
 {
    let t = TestLadder::apply("oauth", &["300ms"], &["300ms", "300ms", "300ms"]).await;
    let s = secret();
    let dir = tempfile::tempdir().unwrap();
    let client_secret = "cs-3f9a1c7e55d04b2a";
    let secret_file = dir.path().join("client-secret");
    std::fs::write(&secret_file, client_secret).unwrap();
    // A 4 s token is used for 3 s (a quarter of its life is the margin).
    let idp = Idp::new(client_secret, Duration::from_secs(4));
    let token_url = idp.start().await;
    let receiver = guarded_receiver(&s, &idp).await;
    let sub = oauth_subscription(&receiver, &s, &token_url, &secret_file);
    let worker = RunningWorker::start(&t, vec![sub]).await;

    // 100 deliveries at once, while the token request takes 300 ms: one request.
    burst_delivered(&t, &receiver, 0, 100).await;
    assert_eq!(idp.issued.load(Ordering::SeqCst), 1);
    assert_eq!(
        receiver.request_count(),
        100,
        "no request went without a live token"
    );

    // Past the token's renewal point (3 s), the next burst renews it once, before it expires.
    tokio::time::sleep(Duration::from_millis(3300)).await;
    burst_delivered(&t, &receiver, 100, 100).await;
    assert_eq!(idp.issued.load(Ordering::SeqCst), 2);
    assert_eq!(
        receiver.request_count(),
        200,
        "no request carried an expired token"
    );

    // The identity provider revokes every token: the endpoint answers 401 to the deliveries in
    // flight; they are retried, and however many 401s came back, the token is fetched once.
    idp.revoke_all();
    burst_delivered(&t, &receiver, 200, 50).await;
    let issued = worker.metrics.count(
        "hookrelay_oauth_token_requests_total",
        &[("result", "issued")],
    );
    worker.stop().await;
    assert_eq!(issued, 3, "the worker counts the token requests it made");
    let refused = receiver
        .records()
        .iter()
        .filter(|r| r.status == 401)
        .count();
    assert!(refused >= 1, "the revoked token was refused at least once");
    assert_eq!(idp.issued.load(Ordering::SeqCst), 3);
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
    // A 401 to a token is not the endpoint failing, and the envelope id stays the key.
    assert_eq!(receiver.duplicates(), 0);
    let seen = idp.seen.lock().unwrap().join("\n");
    assert!(
        !seen.contains(client_secret),
        "client_secret_basic: the secret travels only base64-encoded in the header"
    );
}

#[tokio::test]
async fn a_refused_client_secret_is_retried_then_dead_lettered_as_exhausted_with_the_reason() {
    let t = TestLadder::apply("oauth-refused", &["200ms"], &["200ms", "200ms"]).await;
    let s = secret();
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("client-secret");
    std::fs::write(&secret_file, "not-the-secret").unwrap();
    let idp = Idp::new("the-real-secret", Duration::from_secs(60));
    let token_url = idp.start().await;
    let receiver = guarded_receiver(&s, &idp).await;
    let sub = oauth_subscription(&receiver, &s, &token_url, &secret_file);
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish(&event("evt_refused", "acme", "sub_oauth")).await;
    assert!(t.wait_dead(1, WAIT).await);
    let failed = worker.metrics.count(
        "hookrelay_oauth_token_requests_total",
        &[("result", "failed")],
    );
    worker.stop().await;
    assert_eq!(failed, 3);
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(
        headers::read_str_header(p, REASON_HEADER).as_deref(),
        Some("exhausted")
    );
    let error = headers::read_str_header(p, LAST_ERROR_HEADER).unwrap();
    assert!(
        error.contains("OAuth2 token") && error.contains("HTTP 401: invalid_client"),
        "{error}"
    );
    // One token request per attempt (three attempts), and nothing reached the endpoint.
    assert_eq!(idp.refused.load(Ordering::SeqCst), 3);
    assert_eq!(receiver.request_count(), 0);
}

/// A TLS server config with the certificate for 127.0.0.1 that requires a client certificate
/// signed by `clients`.
fn mutual_tls(server: &Pki, clients: &Pki) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let (cert, key) = server.leaf(&["127.0.0.1"], false);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(clients.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    Arc::new(config)
}

#[tokio::test]
async fn a_client_certificate_is_presented_and_one_the_endpoint_refuses_ends_exhausted() {
    let t = TestLadder::apply("mtls", &["200ms"], &["200ms", "200ms"]).await;
    let s = secret();
    let ours = Pki::new("ours");
    let rogue = Pki::new("rogue");
    let receiver = Receiver::start_tls(
        std::slice::from_ref(&s.whsec),
        mutual_tls(&ours, &ours),
        |_| Reply::Status(204),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        SecretRef::File(path)
    };
    let ca = write("ca.pem", &ours.ca_pem());
    let (cert, key) = ours.leaf(&["hookrelay.client"], true);
    let (rogue_cert, rogue_key) = rogue.leaf(&["hookrelay.client"], true);
    let mut good = subscription("sub_good", "acme", &receiver.url("/hook"), &s);
    good.tls = Some(ClientTls {
        cert: write("client.pem", &cert),
        key: write("client.key", &key),
        ca: Some(ca.clone()),
    });
    let mut bad = subscription("sub_rogue", "acme", &receiver.url("/hook"), &s);
    bad.tls = Some(ClientTls {
        cert: write("rogue.pem", &rogue_cert),
        key: write("rogue.key", &rogue_key),
        ca: Some(ca.clone()),
    });
    let worker = RunningWorker::start(&t, vec![good, bad]).await;
    t.publish(&event("evt_good", "acme", "sub_good")).await;
    t.publish(&event("evt_rogue", "acme", "sub_rogue")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;
    let records = receiver.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].id, "evt_good");
    assert_eq!(records[0].verified_with, [true]);
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(
        p.message_id().as_ref().map(|m| m.as_str()),
        Some("evt_rogue")
    );
    assert_eq!(
        headers::read_str_header(p, REASON_HEADER).as_deref(),
        Some("exhausted")
    );
    let error = headers::read_str_header(p, LAST_ERROR_HEADER).unwrap();
    assert!(error.starts_with("transport error"), "{error}");
    assert!(
        receiver.handshakes_refused() >= 3,
        "each attempt was refused at the handshake"
    );
    // Neither key travelled anywhere the broker keeps.
    assert!(!error.contains("PRIVATE KEY"));
}

#[tokio::test]
async fn a_client_key_that_is_not_pem_is_not_sent_and_says_so_without_its_content() {
    let t = TestLadder::apply("mtls-bad-pem", &["200ms"], &["200ms"]).await;
    let s = secret();
    let ours = Pki::new("ours");
    let receiver = Receiver::start_tls(
        std::slice::from_ref(&s.whsec),
        mutual_tls(&ours, &ours),
        |_| Reply::Status(204),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = ours.leaf(&["hookrelay.client"], true);
    let cert_file = dir.path().join("client.pem");
    let key_file = dir.path().join("client.key");
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, "kEy-MaTeRiAl-not-pem").unwrap();
    let mut sub = subscription("sub_badkey", "acme", &receiver.url("/hook"), &s);
    sub.tls = Some(ClientTls {
        cert: SecretRef::File(cert_file),
        key: SecretRef::File(key_file),
        ca: None,
    });
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish(&event("evt_badkey", "acme", "sub_badkey")).await;
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;
    let dead = t.drain_dead().await;
    let error = headers::read_str_header(&dead[0].delivery.properties, LAST_ERROR_HEADER).unwrap();
    assert!(
        error.contains("sub_badkey") && error.contains("not a PEM certificate and private key"),
        "{error}"
    );
    assert!(!error.contains("kEy-MaTeRiAl"));
    assert_eq!(receiver.request_count(), 0);
}

#[tokio::test]
async fn basic_auth_is_sent_to_an_endpoint_that_checks_it_and_a_wrong_password_is_rejected() {
    use base64::Engine;
    let t = TestLadder::apply("basic", &["200ms"], &["200ms"]).await;
    let s = secret();
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("hookrelay:pw-71c0e2")
    );
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), move |req| {
        let given = req
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if given == Some(expected.as_str()) {
            Reply::Status(204)
        } else {
            Reply::Status(401)
        }
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let with_password = |id: &str, password: &str| {
        let path = dir.path().join(id);
        std::fs::write(&path, format!("{password}\n")).unwrap();
        let mut sub = subscription(id, "acme", &receiver.url("/hook"), &s);
        sub.basic_auth = Some(hookrelay::subscriptions::BasicAuth {
            username: "hookrelay".into(),
            password: SecretRef::File(path),
        });
        sub
    };
    let worker = RunningWorker::start(
        &t,
        vec![
            with_password("sub_right", "pw-71c0e2"),
            with_password("sub_wrong", "pw-guessed"),
        ],
    )
    .await;
    t.publish(&event("evt_right", "acme", "sub_right")).await;
    t.publish(&event("evt_wrong", "acme", "sub_wrong")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;
    assert_eq!(
        receiver.delivered(),
        HashMap::from([("evt_right".into(), 1)])
    );
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(
        p.message_id().as_ref().map(|m| m.as_str()),
        Some("evt_wrong")
    );
    // Without OAuth2 a 401 is the endpoint's final word: rejected, not retried.
    assert_eq!(
        headers::read_str_header(p, REASON_HEADER).as_deref(),
        Some("rejected")
    );
    assert_eq!(
        headers::read_u64_header(p, headers::STATUS_HEADER),
        Some(401)
    );
}
