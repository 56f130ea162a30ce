//! The egress policy as the HTTP client applies it: every blocked address class reached through
//! a hostname (answered by a resolver seam, since no public DNS answers here), the allow-list,
//! a name resolving to a mix, a name that rebinds, IP literals in every notation, redirects,
//! scheme and port rules, a proxy (targets checked, a silent resolver bounded); and end to end, a
//! refused endpoint dead-lettered as `egress_denied` without a connection.

mod common;

use hookrelay::contract::headers;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::Counters;
use common::egress::{RebindingLookup, SilentLookup, StaticLookup, allowing};
use hookrelay::config::EgressConfig;
use hookrelay::config::HttpConfig;
use hookrelay::contract::envelope::EnvelopeId;
use hookrelay::delivery::egress::{EgressPolicy, GuardedResolver, ResolveError};
use hookrelay::delivery::http::{FormError, HttpSender, WebhookRequest};
use hookrelay::delivery::route::AttemptResult;
use hookrelay_tools::receiver::{Receiver, Reply};

/// A TCP listener that counts the connections it accepts.
async fn counting_listener() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((_socket, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, count)
}

fn sender(policy: EgressPolicy, lookup: StaticLookup) -> HttpSender {
    let config = HttpConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        ..HttpConfig::default()
    };
    HttpSender::new(&config, Arc::new(policy), Arc::new(lookup)).unwrap()
}

async fn post(sender: &HttpSender, url: &str) -> AttemptResult {
    let url = reqwest::Url::parse(url).unwrap();
    let id = EnvelopeId::parse("evt_egress").unwrap();
    sender
        .send(WebhookRequest {
            url: &url,
            id: &id,
            attempt: 1,
            timestamp: 1,
            signature: "v1,x".into(),
            body: Bytes::from_static(b"{}"),
            extra: Vec::new(),
            client_tls: None,
        })
        .await
        .result
}

fn denied(result: &AttemptResult) -> &str {
    match result {
        AttemptResult::EgressDenied(text) => text,
        other => panic!("expected an egress denial, got {other:?}"),
    }
}

/// One hostname per blocked class; the listener shows no connection is ever made.
#[tokio::test]
async fn every_blocked_class_is_refused_through_a_hostname() {
    let (addr, accepted) = counting_listener().await;
    let classes = [
        ("loopback.test", "127.0.0.1", "loopback"),
        ("loopback6.test", "::1", "loopback"),
        ("rfc1918-10.test", "10.1.2.3", "private"),
        ("rfc1918-172.test", "172.20.0.5", "private"),
        ("rfc1918-192.test", "192.168.1.10", "private"),
        ("metadata.test", "169.254.169.254", "link-local"),
        ("linklocal6.test", "fe80::1", "link-local"),
        ("cgnat.test", "100.64.1.1", "carrier-grade NAT"),
        ("unspecified.test", "0.0.0.0", "unspecified"),
        ("unspecified6.test", "::", "unspecified"),
        ("multicast.test", "239.1.1.1", "multicast"),
        ("multicast6.test", "ff05::2", "multicast"),
        ("broadcast.test", "255.255.255.255", "broadcast"),
        ("docs.test", "203.0.113.9", "documentation"),
        ("docs6.test", "2001:db8::9", "documentation"),
        ("reserved.test", "240.0.0.9", "reserved"),
        ("ula.test", "fd00::9", "unique-local"),
        ("mapped.test", "::ffff:10.0.0.1", "private"),
        (
            "mapped-metadata.test",
            "::ffff:169.254.169.254",
            "link-local",
        ),
        ("nat64.test", "64:ff9b::7f00:1", "loopback"),
        ("6to4.test", "2002:c0a8:0101::1", "private"),
    ];
    let mut lookup = StaticLookup::default();
    for (host, ip, _) in &classes {
        lookup = lookup.with(host, &[ip]);
    }
    let sender = sender(EgressPolicy::default(), lookup);
    for (host, ip, class) in classes {
        let result = post(&sender, &format!("http://{host}:{}/hook", addr.port())).await;
        let expected_ip: std::net::IpAddr = ip.parse().unwrap();
        assert_eq!(
            denied(&result),
            format!("egress denied: {host} resolves to {expected_ip} ({class})"),
        );
    }
    // A deliberate pause: a connection, had one been made, is counted by then.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "no connection was made");
}

#[tokio::test]
async fn the_allow_list_lets_a_blocked_range_through() {
    let s = common::secret();
    let receiver = common::ok_receiver(&s).await;
    let port = receiver.addr().port();
    let lookup = StaticLookup::default().with("partner.test", &["127.0.0.1"]);
    let blocked = sender(EgressPolicy::default(), lookup.clone());
    denied(&post(&blocked, &format!("http://partner.test:{port}/")).await);
    let allowed = sender(allowing(&["127.0.0.0/8"]), lookup);
    assert_eq!(
        post(&allowed, &format!("http://partner.test:{port}/")).await,
        AttemptResult::Response {
            status: 204,
            retry_after: None
        }
    );
    assert_eq!(receiver.request_count(), 1);
}

#[tokio::test]
async fn a_name_resolving_to_allowed_and_blocked_addresses_is_refused() {
    let (addr, accepted) = counting_listener().await;
    let lookup = StaticLookup::default().with("mixed.test", &["127.0.0.1", "10.9.9.9"]);
    let sender = sender(allowing(&["127.0.0.0/8"]), lookup);
    let result = post(&sender, &format!("http://mixed.test:{}/", addr.port())).await;
    assert_eq!(
        denied(&result),
        "egress denied: mixed.test resolves to 10.9.9.9 (private)"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

/// The resolver the HTTP client uses, by itself.
#[tokio::test]
async fn a_name_with_any_blocked_address_is_refused_whole() {
    let lookup = StaticLookup::default()
        .with("mixed.test", &["93.184.216.34", "10.0.0.7"])
        .with("public.test", &["93.184.216.34", "2606:2800:220:1::1"]);
    let resolver = GuardedResolver::new(Arc::new(EgressPolicy::default()), Arc::new(lookup));
    assert_eq!(
        resolver.resolve_checked("public.test").await.unwrap().len(),
        2
    );
    let err = resolver.resolve_checked("mixed.test").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "egress denied: mixed.test resolves to 10.0.0.7 (private)"
    );
    assert!(matches!(
        resolver.resolve_checked("unknown.test").await,
        Err(ResolveError::Lookup(_))
    ));
}

#[tokio::test]
async fn ip_literals_pass_the_same_rules() {
    let (addr, accepted) = counting_listener().await;
    let sender = sender(EgressPolicy::default(), StaticLookup::default());
    let port = addr.port();
    for (url, text) in [
        (format!("http://127.0.0.1:{port}/"), "127.0.0.1 (loopback)"),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            "::ffff:127.0.0.1 (loopback)",
        ),
        (
            "http://169.254.169.254/latest/meta-data".to_owned(),
            "169.254.169.254 (link-local)",
        ),
        ("http://[fd00::1]/".to_owned(), "fd00::1 (unique-local)"),
    ] {
        let result = post(&sender, &url).await;
        assert!(denied(&result).ends_with(text), "{url}: {result:?}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

/// Every redirect status, the method-preserving 307 and 308 included, toward a target the policy
/// allows (so only the no-redirect rule stands between them): the target records every request,
/// and has none.
#[tokio::test]
async fn a_redirect_is_never_followed() {
    let s = common::secret();
    let target = common::ok_receiver(&s).await;
    let location = target.url("/internal");
    for status in [301, 302, 303, 307, 308] {
        let location = location.clone();
        let redirecting = Receiver::start(&[], move |_| Reply::Redirect(status, location.clone()))
            .await
            .unwrap();
        let sender = sender(allowing(&["127.0.0.0/8"]), StaticLookup::default());
        let result = post(&sender, &redirecting.url("/")).await;
        // A redirect is a retryable answer of the endpoint; its Location is never contacted. A
        // followed redirect would end in the target's 204 instead.
        assert_eq!(
            result,
            AttemptResult::Response {
                status,
                retry_after: None
            }
        );
        assert_eq!(redirecting.request_count(), 1);
    }
    assert_eq!(
        target.request_count(),
        0,
        "the Location was never requested"
    );
}

#[tokio::test]
async fn scheme_and_port_rules() {
    let policy = EgressPolicy::from_config(&EgressConfig {
        https_only: true,
        allowed_ports: vec![443],
        ..EgressConfig::default()
    });
    let lookup = StaticLookup::default().with("public.test", &["93.184.216.34"]);
    let sender = sender(policy, lookup);
    assert!(denied(&post(&sender, "http://public.test/").await).contains("not https"));
    assert!(denied(&post(&sender, "https://public.test:8443/").await).contains("port 8443"));
}

/// End to end: the refusal is a permanent outcome, dead-lettered with the resolved address.
#[tokio::test]
async fn a_refused_endpoint_is_dead_lettered_as_egress_denied() {
    use hookrelay::contract::headers::{LAST_ERROR_HEADER, REASON_HEADER};
    use hookrelay::delivery::worker::WorkerSetup;
    use hookrelay::subscriptions::{LiveSubscriptions, Subscriptions};

    let t = common::TestLadder::apply("egress", &["300ms"], &["300ms"]).await;
    let s = common::secret();
    let receiver = common::ok_receiver(&s).await;
    let mut config = t.config.clone();
    config.egress.allow.clear();
    let url = format!("http://internal.test:{}/", receiver.addr().port());
    let live = LiveSubscriptions::fixed(Subscriptions::from_list([common::subscription(
        "sub_internal",
        "acme",
        &url,
        &s,
    )]));
    let mut setup = WorkerSetup::new(config, t.ladder.clone(), live);
    setup.lookup = Arc::new(StaticLookup::default().with("internal.test", &["127.0.0.1"]));
    let worker = common::RunningWorker::start_setup(&t, setup).await;
    t.publish(&common::event("evt_internal", "acme", "sub_internal"))
        .await;
    assert!(t.wait_dead(1, Duration::from_secs(10)).await);
    let metrics = worker.metrics.clone();
    worker.stop().await;
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(
        headers::read_str_header(p, REASON_HEADER).as_deref(),
        Some("egress_denied")
    );
    assert_eq!(
        headers::read_str_header(p, LAST_ERROR_HEADER).as_deref(),
        Some("egress denied: internal.test resolves to 127.0.0.1 (loopback)")
    );
    assert_eq!(receiver.request_count(), 0);
    assert_eq!(
        metrics.count("hookrelay_retries_total", &[]),
        0,
        "never retried"
    );
    assert_eq!(
        metrics.count("hookrelay_outcomes_total", &[("outcome", "egress_denied")]),
        1
    );
}

/// Through an outbound proxy the client resolves only the proxy, so hookrelay checks the target
/// itself before sending; the proxy's own (here loopback) address is exempt.
#[tokio::test]
async fn through_a_proxy_targets_are_still_checked() {
    let s = common::secret();
    let proxy = common::ok_receiver(&s).await;
    let policy = EgressPolicy::from_config(&EgressConfig {
        proxy: Some(proxy.url("").parse().unwrap()),
        ..EgressConfig::default()
    });
    let lookup = StaticLookup::default()
        .with("public.test", &["93.184.216.34"])
        .with("internal.test", &["10.0.0.1"]);
    let sender = sender(policy, lookup);
    assert_eq!(
        post(&sender, "http://public.test/hook").await,
        AttemptResult::Response {
            status: 204,
            retry_after: None
        }
    );
    assert_eq!(
        denied(&post(&sender, "http://internal.test/hook").await),
        "egress denied: internal.test resolves to 10.0.0.1 (private)"
    );
    // Only the allowed request reached the proxy.
    assert_eq!(proxy.request_count(), 1);
    assert_eq!(proxy.records()[0].path, "/hook");
}

/// Through a proxy hookrelay resolves the target itself, outside the client's timeouts: a
/// resolver that never answers must still end the attempt, as a retryable failure.
#[tokio::test]
async fn through_a_proxy_a_silent_resolver_ends_the_attempt() {
    let s = common::secret();
    let proxy = common::ok_receiver(&s).await;
    let policy = EgressPolicy::from_config(&EgressConfig {
        proxy: Some(proxy.url("").parse().unwrap()),
        ..EgressConfig::default()
    });
    let config = HttpConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        ..HttpConfig::default()
    };
    let sender = HttpSender::new(&config, Arc::new(policy), Arc::new(SilentLookup)).unwrap();
    // Far longer than any bound the attempt has: only a hang reaches it.
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        post(&sender, "http://silent.test/hook"),
    )
    .await
    .expect("the attempt ended");
    match &result {
        AttemptResult::Transport(detail) => {
            assert!(detail.contains("silent.test"), "{detail}")
        }
        other => panic!("expected a transport failure, got {other:?}"),
    }
    assert_eq!(proxy.request_count(), 0, "nothing was sent");
}

/// Two listeners on one port: 127.0.0.1, which the policy allows (standing for a public
/// address), and 127.0.0.2, which it does not (standing for an internal one).
async fn allowed_and_internal() -> (Receiver, std::net::SocketAddr, Arc<AtomicUsize>) {
    let s = common::secret();
    loop {
        let allowed = common::ok_receiver(&s).await;
        let port = allowed.addr().port();
        if let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.2", port)).await {
            let addr = listener.local_addr().unwrap();
            let count = Arc::new(AtomicUsize::new(0));
            let seen = Arc::clone(&count);
            tokio::spawn(async move {
                while let Ok((_socket, _)) = listener.accept().await {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            });
            return (allowed, addr, count);
        }
    }
}

/// DNS rebinding: the name resolves to an allowed address, then to an internal one. Whatever
/// the client connects to is what the policy checked, so nothing reaches the internal address,
/// directly or through a proxy (where hookrelay resolves the target itself on every attempt).
#[tokio::test]
async fn a_name_that_rebinds_to_an_internal_address_never_reaches_it() {
    let (allowed, internal, internal_hits) = allowed_and_internal().await;
    let policy = || allowing(&["127.0.0.1/32"]);
    let rebinding = || RebindingLookup::new("127.0.0.1".parse().unwrap(), internal.ip());
    let url = format!("http://rebind.test:{}/hook", internal.port());
    let config = HttpConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        ..HttpConfig::default()
    };
    let denial = "egress denied: rebind.test resolves to 127.0.0.2 (loopback)";

    // Directly: the client's own resolver is the guarded one; each new connection asks again.
    let direct = HttpSender::new(&config, Arc::new(policy()), Arc::new(rebinding())).unwrap();
    for _ in 0..3 {
        match post(&direct, &url).await {
            AttemptResult::Response { status: 204, .. } => {}
            AttemptResult::EgressDenied(text) => assert_eq!(text, denial),
            other => panic!("{other:?}"),
        }
    }

    // Through a proxy: the first attempt goes out, the next ones are refused at their own lookup.
    let proxy = common::ok_receiver(&common::secret()).await;
    let mut proxied = hookrelay::config::EgressConfig {
        proxy: Some(proxy.url("").parse().unwrap()),
        ..hookrelay::config::EgressConfig::default()
    };
    proxied.allow = vec!["127.0.0.1/32".parse().unwrap()];
    let through = HttpSender::new(
        &config,
        Arc::new(EgressPolicy::from_config(&proxied)),
        Arc::new(rebinding()),
    )
    .unwrap();
    assert!(matches!(
        post(&through, &url).await,
        AttemptResult::Response { status: 204, .. }
    ));
    for _ in 0..2 {
        assert_eq!(denied(&post(&through, &url).await), denial);
    }
    assert_eq!(
        proxy.request_count(),
        1,
        "only the allowed attempt reached the proxy"
    );
    assert!(allowed.request_count() >= 1);
    assert_eq!(
        internal_hits.load(Ordering::SeqCst),
        0,
        "no connection to the internal address"
    );
}

/// IPv4 written as one decimal number, in hex or in octal parts means the same address to the
/// URL parser, and to the policy.
#[tokio::test]
async fn ip_literals_in_decimal_hex_and_octal_are_refused_like_dotted_ones() {
    let (addr, accepted) = counting_listener().await;
    let port = addr.port();
    let direct = sender(EgressPolicy::default(), StaticLookup::default());
    let proxy = common::ok_receiver(&common::secret()).await;
    let through = sender(
        EgressPolicy::from_config(&EgressConfig {
            proxy: Some(proxy.url("").parse().unwrap()),
            ..EgressConfig::default()
        }),
        StaticLookup::default(),
    );
    for host in [
        "2130706433",
        "0x7f.1",
        "0x7f000001",
        "0177.0.0.1",
        "0177.1",
        "127.1",
        "[::ffff:7f00:1]",
    ] {
        let url = format!("http://{host}:{port}/");
        for (how, sender) in [("direct", &direct), ("through a proxy", &through)] {
            let result = post(sender, &url).await;
            assert!(
                denied(&result).ends_with("127.0.0.1 (loopback)"),
                "{url} {how}: {result:?}"
            );
        }
    }
    for host in ["0xa.1", "012.0.0.1", "167772161"] {
        let result = post(&through, &format!("http://{host}/")).await;
        assert!(
            denied(&result).ends_with("10.0.0.1 (private)"),
            "{host}: {result:?}"
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert_eq!(proxy.request_count(), 0, "no literal reached the proxy");
}

#[tokio::test]
async fn a_token_endpoint_passes_the_egress_policy_like_an_endpoint() {
    // An OAuth2 token endpoint on a metadata address, named and literal: refused before any
    // connection, with the policy's reason.
    let (addr, accepted) = counting_listener().await;
    let lookup = StaticLookup::default().with("idp.test", &["169.254.169.254"]);
    let sender = sender(EgressPolicy::default(), lookup);
    for url in [
        format!("http://idp.test:{}/token", addr.port()),
        format!("http://127.0.0.1:{}/token", addr.port()),
    ] {
        let refused = sender
            .post_form(
                &url.parse().unwrap(),
                None,
                "grant_type=client_credentials".into(),
            )
            .await
            .unwrap_err();
        assert!(matches!(refused, FormError::Denied(_)), "{refused}");
        assert!(refused.to_string().contains("egress"), "{refused}");
        // A token request the policy refuses is not tried again until the settings change.
        assert!(!refused.is_transient(), "{refused}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}
