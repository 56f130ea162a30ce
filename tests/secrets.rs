//! Secrets never leave the process: a worker runs with passwords and tokens in endpoint URLs,
//! signing keys (good and malformed), header values, basic-auth and OAuth2 client secrets, an
//! OAuth2 access token, a TLS client key, management and proxy credentials, through every failure
//! path (not https, a malformed key at reload and at an attempt, an invalid URL at reload, 4xx,
//! 5xx, 410, unreachable, egress denied, a proxy that does not answer, a management API that
//! refuses the password, an endpoint refusing the OAuth2 token, a client key that is not one),
//! and everything it wrote is searched for any of them: its log, its metrics, the dead
//! letters' headers, the operational events and the attempt records.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::egress::StaticLookup;
use common::{Counters, RunningWorker, SubsFile, TestLadder, subscription_toml, wait_until};
use hookrelay::broker::management::Management;
use hookrelay::config::SecretUrl;
use hookrelay::delivery::egress::EgressPolicy;
use hookrelay::delivery::http::HttpSender;
use hookrelay::delivery::worker::WorkerSetup;
use hookrelay::subscriptions::{LiveSubscriptions, SecretRef, Subscription, Subscriptions};
use hookrelay_tools::receiver::{Receiver, Reply};
use lapin::options::BasicGetOptions;
use lapin::types::{AMQPValue, FieldTable};

const WAIT: Duration = Duration::from_secs(30);

/// Everything the process logs, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Installs the process-wide subscriber; nextest runs each test in a process of its own.
    fn install() -> Self {
        let captured = Self::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_env_filter("hookrelay=trace")
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        captured
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// A secret value unique to this run, so a match can only be a leak.
fn secret_text(what: &str) -> String {
    format!("{what}{}", uuid::Uuid::new_v4().simple())
}

/// Every message waiting in `queue`: routing key, headers and body as text.
async fn take_all(t: &TestLadder, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(m) = t
        .channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        out.push(format!(
            "{} {:?} {}",
            m.delivery.routing_key,
            m.delivery.properties.headers(),
            String::from_utf8_lossy(&m.delivery.data)
        ));
    }
    out
}

/// Every header of a dead letter, nested tables and arrays included, as text.
fn header_texts(headers: Option<&FieldTable>) -> String {
    fn value_text(value: &AMQPValue, out: &mut String) {
        match value {
            AMQPValue::LongString(s) => out.push_str(&String::from_utf8_lossy(s.as_bytes())),
            AMQPValue::ShortString(s) => out.push_str(s.as_str()),
            AMQPValue::FieldTable(t) => table_text(t, out),
            AMQPValue::FieldArray(a) => {
                for v in a.as_slice() {
                    value_text(v, out);
                    out.push(' ');
                }
            }
            other => out.push_str(&format!("{other:?}")),
        }
    }
    fn table_text(table: &FieldTable, out: &mut String) {
        for (key, value) in table.inner() {
            out.push_str(&format!("{key}="));
            value_text(value, out);
            out.push('\n');
        }
    }
    let mut out = String::new();
    if let Some(headers) = headers {
        table_text(headers, &mut out);
    }
    out
}

/// What of `secrets` each place shows: `(place, secret)` for every leak.
fn leaks<'a>(places: &'a [(&'a str, String)], secrets: &'a [String]) -> Vec<(&'a str, &'a str)> {
    let mut found = Vec::new();
    for (place, text) in places {
        for secret in secrets {
            if text.contains(secret.as_str()) {
                found.push((*place, secret.as_str()));
            }
        }
    }
    found
}

#[tokio::test]
async fn no_secret_reaches_logs_dead_letters_events_or_attempt_records() {
    let log = Captured::install();
    let t = TestLadder::apply("leaks", &["300ms"], &["300ms"]).await;
    let events = t.keep_all(&t.ladder.events_exchange()).await;
    let attempts = t.keep_all(&t.ladder.attempts_exchange()).await;

    let user = secret_text("urluser");
    let password = secret_text("urlpass");
    let token = secret_text("qtoken");
    let mgmt_password = secret_text("mgmtpass");
    let proxy_password = secret_text("proxypass");
    // A key that turns malformed while the worker runs: base64 with one byte that is not, the
    // byte and its place being what a decoder's error would quote.
    let bad_body = format!("{}~{}", secret_text("A"), secret_text("B"));
    let bad_key = format!("whsec_{bad_body}");
    let bad_byte_at = bad_body.find('~').unwrap();
    let good = common::secret();
    // A header and a basic-auth password from secret references, on sub_fail's requests.
    let api_key = secret_text("apikey");
    let basic_password = secret_text("basicpw");
    let header_dir = tempfile::tempdir().unwrap();
    let api_key_file = header_dir.path().join("api-key");
    std::fs::write(&api_key_file, format!("{api_key}\n")).unwrap();
    let password_file = header_dir.path().join("basic-password");
    std::fs::write(&password_file, &basic_password).unwrap();
    let basic_token = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("hookrelay:{basic_password}"))
    };
    let auth_toml = format!(
        "headers = {{ \"X-Api-Key\" = {{ secret = \"file:{}\" }}, \"X-Team\" = \"orders\" }}\n\
         basic_auth = {{ username = \"hookrelay\", password = \"file:{}\" }}\n",
        api_key_file.display(),
        password_file.display()
    );
    // An OAuth2 client secret and the token it gets (the endpoint refuses the token: 401, a new
    // one each attempt), and a client key that is not PEM (never sent; the error names it).
    let oauth_secret = secret_text("oauthsecret");
    let access_token = secret_text("accesstoken");
    let oauth_secret_file = header_dir.path().join("oauth-secret");
    std::fs::write(&oauth_secret_file, &oauth_secret).unwrap();
    let oauth_basic = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("leaky:{oauth_secret}"))
    };
    let token_url = {
        let issued = access_token.clone();
        let app = axum::Router::new().route(
            "/token",
            axum::routing::post(move || {
                let issued = issued.clone();
                async move {
                    format!(
                        r#"{{"access_token":"{issued}","token_type":"bearer","expires_in":60}}"#
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
    };
    let tls_key = secret_text("tlskey");
    let tls_cert_file = header_dir.path().join("client.pem");
    let tls_key_file = header_dir.path().join("client.key");
    std::fs::write(
        &tls_cert_file,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(
        &tls_key_file,
        format!("-----BEGIN PRIVATE KEY-----\n{tls_key}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let oauth_toml = format!(
        "oauth2 = {{ token_url = \"{token_url}\", client_id = \"leaky\", client_secret = \"file:{}\" }}\n",
        oauth_secret_file.display()
    );
    let tls_toml = format!(
        "tls = {{ cert = \"file:{}\", key = \"file:{}\" }}\n",
        tls_cert_file.display(),
        tls_key_file.display()
    );
    let mut secrets = vec![
        oauth_secret.clone(),
        access_token.clone(),
        oauth_basic.clone(),
        tls_key.clone(),
        api_key.clone(),
        basic_password.clone(),
        basic_token.clone(),
        user.clone(),
        password.clone(),
        token.clone(),
        mgmt_password.clone(),
        proxy_password.clone(),
        bad_body.clone(),
        good.whsec.clone(),
        good.whsec.trim_start_matches("whsec_").to_owned(),
        // What base64's error says of the malformed key: the byte's value and its offset.
        format!("symbol {}", b'~'),
        format!("offset {bad_byte_at}"),
    ];

    let receiver = Receiver::start(std::slice::from_ref(&good.whsec), |req| match req.path {
        "/reject" => Reply::Status(400),
        "/fail" => Reply::Status(500),
        "/oauth" => Reply::Status(401),
        "/gone" => Reply::Status(410),
        _ => Reply::Status(204),
    })
    .await
    .unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let port = receiver.addr().port();
    // Credentials in a URL's user information are refused; secrets in its query are taken,
    // and must not leak either.
    let url = |host: &str, path: &str| {
        format!("http://{host}/{path}?user={user}&password={password}&token={token}&x=1")
    };
    let local = format!("127.0.0.1:{port}");

    // Phase one: http allowed; a management API that refuses the password.
    let key_dir = tempfile::tempdir().unwrap();
    let key_file = key_dir.path().join("turns-bad");
    std::fs::write(&key_file, &good.whsec).unwrap();
    let turning = format!("\"file:{}\"", key_file.display());
    let file_text = |extra: &str| {
        [
            subscription_toml(
                "sub_reject",
                "acme",
                &url(&local, "reject"),
                &good.file_ref(),
                "",
            ),
            subscription_toml(
                "sub_fail",
                "acme",
                &url(&local, "fail"),
                &good.file_ref(),
                &auth_toml,
            ),
            subscription_toml(
                "sub_gone",
                "acme",
                &url(&local, "gone"),
                &good.file_ref(),
                "",
            ),
            subscription_toml(
                "sub_unreachable",
                "acme",
                &url(&format!("127.0.0.1:{closed_port}"), "x"),
                &good.file_ref(),
                "",
            ),
            subscription_toml(
                "sub_internal",
                "acme",
                &url(&format!("internal.test:{port}"), "x"),
                &good.file_ref(),
                "",
            ),
            subscription_toml("sub_key", "acme", &url(&local, "key"), &turning, ""),
            subscription_toml(
                "sub_oauth",
                "acme",
                &format!("http://{local}/oauth"),
                &good.file_ref(),
                &oauth_toml,
            ),
            subscription_toml(
                "sub_mtls",
                "acme",
                &format!("https://{local}/mtls"),
                &good.file_ref(),
                &tls_toml,
            ),
            extra.to_owned(),
        ]
        .concat()
    };
    let file = SubsFile::new(&file_text(""));
    let mut config = t.config.clone();
    let mut management = t.config.management.url.expose_url().clone();
    management.set_username("hookrelay-leaks").unwrap();
    management.set_password(Some(&mgmt_password)).unwrap();
    config.management.url = SecretUrl::from(management);
    let lookup = StaticLookup::default()
        .with("internal.test", &["10.0.0.1"])
        .with("public.test", &["93.184.216.34"]);
    let mut setup = WorkerSetup::new(
        config.clone(),
        t.ladder.clone(),
        LiveSubscriptions::from_file(&file.path).unwrap(),
    );
    setup.lookup = Arc::new(lookup.clone());
    let worker = RunningWorker::start_setup(&t, setup).await;

    // The key turns malformed; the next attempt reads it again.
    std::fs::write(&key_file, &bad_key).unwrap();
    for sub in [
        "sub_reject",
        "sub_fail",
        "sub_gone",
        "sub_unreachable",
        "sub_internal",
        "sub_key",
        "sub_oauth",
        "sub_mtls",
    ] {
        t.publish(&common::event(&format!("evt_{sub}"), "acme", sub))
            .await;
    }
    assert!(t.wait_dead(8, WAIT).await, "every envelope dead-lettered");
    // sub_fail's requests carried its headers, the secret one read from its file.
    let fail = receiver
        .records()
        .into_iter()
        .find(|r| r.path == "/fail")
        .expect("sub_fail was attempted");
    let header = |name: &str| {
        fail.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("x-api-key"), api_key);
    assert_eq!(header("x-team"), "orders");
    assert_eq!(header("authorization"), format!("Basic {basic_token}"));

    // Reloads refused: a URL that is not http(s), then a subscription whose key is malformed.
    let not_http = format!("ftp://{user}:{password}@{local}/?token={token}");
    file.write(&file_text(&subscription_toml(
        "sub_ftp",
        "acme",
        &not_http,
        &good.file_ref(),
        "",
    )));
    let refused = async |n: u64| {
        wait_until(WAIT, async || {
            worker.metrics.count(
                "hookrelay_subscription_reloads_total",
                &[("result", "refused")],
            ) >= n
        })
        .await
    };
    assert!(refused(1).await);
    file.write(&file_text(&subscription_toml(
        "sub_new",
        "acme",
        &url(&local, "new"),
        &turning,
        "",
    )));
    assert!(refused(2).await);
    // The depth poll meets the management API's refusal of the password.
    assert!(wait_until(WAIT, async || log.text().contains("HTTP 401")).await);
    // Everything the worker's metrics say, labels included.
    let metrics = reqwest::get(format!(
        "http://{}/metrics",
        worker.vitals.expect("the test worker serves metrics")
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(metrics.contains("hookrelay_"), "{metrics}");
    worker.stop().await;

    // Phase two: https only, through a proxy with credentials that does not answer.
    config.egress.https_only = true;
    config.egress.proxy = Some(
        SecretUrl::parse(&format!(
            "http://proxyuser:{proxy_password}@127.0.0.1:{closed_port}"
        ))
        .unwrap(),
    );
    // Through a proxy the target's lookup adds a connect timeout to an attempt; the drain
    // must still have room for one (the lease rule checks it).
    config.worker.shutdown_grace = Duration::from_secs(15);
    let subs = vec![
        Subscription::new(
            "sub_plain",
            "acme",
            url("public.test", "plain").parse().unwrap(),
            good.reference.clone(),
        ),
        Subscription::new(
            "sub_proxied",
            "acme",
            url("public.test", "proxied")
                .replacen("http:", "https:", 1)
                .parse()
                .unwrap(),
            good.reference.clone(),
        ),
    ];
    let mut setup = WorkerSetup::new(
        config.clone(),
        t.ladder.clone(),
        LiveSubscriptions::fixed(Subscriptions::from_list(subs)),
    );
    setup.lookup = Arc::new(lookup.clone());
    let worker = RunningWorker::start_setup(&t, setup).await;
    for sub in ["sub_plain", "sub_proxied"] {
        t.publish(&common::event(&format!("evt_{sub}"), "acme", sub))
            .await;
    }
    assert!(t.wait_dead(10, WAIT).await, "every envelope dead-lettered");
    worker.stop().await;

    // Debug output of what holds credentials.
    let api = Management::new(&config.management.url, "/").unwrap();
    let sender = HttpSender::new(
        &config.http,
        Arc::new(EgressPolicy::from_config(&config.egress)),
        Arc::new(lookup),
    )
    .unwrap();
    let key_error = hookrelay::subscriptions::SecretStore::new(Duration::ZERO)
        .resolve(&SecretRef::File(key_file.clone()))
        .unwrap_err();

    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), 10);
    let dead_headers: String = dead
        .iter()
        .map(|m| header_texts(m.delivery.properties.headers().as_ref()))
        .collect();
    let places = [
        ("log", log.text()),
        ("dead-letter headers", dead_headers),
        ("events", take_all(&t, &events).await.join("\n")),
        ("attempt records", take_all(&t, &attempts).await.join("\n")),
        ("metrics", metrics),
        (
            "Debug of config, management, sender, key error",
            format!("{config:?} {api:?} {sender:?} {key_error:?} {key_error}"),
        ),
    ];
    secrets.sort();
    let found = leaks(&places, &secrets);
    assert!(
        found.is_empty(),
        "secrets leaked: {found:?}\n\n{}",
        places
            .iter()
            .map(|(place, text)| format!("--- {place}\n{text}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // And every path was taken: each place holds what it should.
    let all = places
        .iter()
        .map(|(_, text)| text.as_str())
        .collect::<String>();
    for expected in [
        "rejected",
        "exhausted",
        "gone",
        "egress_denied",
        "not https",
        "subscriptions.reload_failed",
        "not base64",
        "HTTP 401",
        "refused the OAuth2 token",
        "cannot use the client certificate of subscription sub_mtls",
    ] {
        assert!(all.contains(expected), "nothing says {expected:?}");
    }
}

#[tokio::test]
async fn a_subscription_with_a_secret_key_signs_v1a_beside_v1() {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use common::{event, ok_receiver, secret, subscription};
    use ed25519_dalek::{Signature, Verifier, VerifyingKey};
    use hookrelay::contract::signing::generate_key_pair;
    use hookrelay::subscriptions::SecretSpec;

    let t = TestLadder::apply("v1a", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let (secret_key, public_key) = generate_key_pair();
    let key_file = dir.path().join("signing.whsk");
    std::fs::write(&key_file, &secret_key).unwrap();
    let mut sub = subscription("sub_a", "acme", &receiver.url("/"), &s);
    sub.secrets.push(SecretSpec::new(SecretRef::File(key_file)));
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish(&event("evt_v1a", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    worker.stop().await;
    let record = receiver.records().remove(0);
    // v1 verified by the independent library with the whsec_ secret...
    assert_eq!(record.verified_with, [true]);
    // ...and v1a by ed25519-dalek with the public key alone, over "{id}.{timestamp}.{body}".
    let v1a: Vec<&str> = record
        .signature
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1a,"))
        .collect();
    assert_eq!(v1a.len(), 1, "{}", record.signature);
    let public: [u8; 32] = STANDARD
        .decode(public_key.strip_prefix("whpk_").unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let verifier = VerifyingKey::from_bytes(&public).unwrap();
    let mut message = format!("{}.{}.", record.id, record.timestamp.unwrap()).into_bytes();
    message.extend_from_slice(&record.body);
    let signature = Signature::from_slice(&STANDARD.decode(v1a[0]).unwrap()).unwrap();
    verifier.verify(&message, &signature).unwrap();
    // The secret key never travels: not in the request.
    assert!(!record.signature.contains(&secret_key[5..]));
}
