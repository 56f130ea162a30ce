//! AMQP destinations against a partner's RabbitMQ: a node of the test's own on other ports
//! (as the fault suite starts them), which the worker publishes into. Starting a node is slow,
//! so one test starts it and runs every case on it, each with its own ladder, vhost and
//! tenant: delivered and verified with the standardwebhooks crate; an exchange the partner
//! does not have (gone, as a 410); a routing key nothing is bound for (returned, retried); a
//! user the partner refuses to let write (a failed attempt with the broker's words, retried);
//! a partner that takes TCP and never answers (bounded, its sockets shut, another tenant
//! delivered meanwhile); TLS with a client certificate (made here with rcgen; the partner
//! requires one); and, last, the partner stopped and started again mid-run (nothing lost).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::node::{Node, free_port};
use common::pki::Pki;
use common::{RunningWorker, Secret, TestLadder, secret, wait_until};
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::headers::{LAST_ERROR_HEADER, REASON_HEADER, read_str_header};
use hookrelay::subscriptions::{AmqpTarget, BasicAuth, ClientTls, SecretRef, Subscription};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

const WAIT: Duration = Duration::from_secs(30);

/// The partner's node, and what the test made on it.
struct Partner {
    node: Node,
    /// Its TLS listener, which requires a client certificate signed by `pki`.
    tls_port: u16,
    pki: Pki,
    /// Password, certificate and key files, kept while the node and the workers read them.
    dir: tempfile::TempDir,
}

impl Partner {
    async fn start() -> Arc<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // The node may run as the rabbitmq user: it reads its certificate from here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let pki = Pki::new("partner");
        let (cert, key) = pki.leaf(&["127.0.0.1"], false);
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            path.display().to_string()
        };
        let tls_port = free_port();
        let extra = format!(
            "listeners.ssl.default = {tls_port}\n\
             ssl_options.cacertfile = {}\n\
             ssl_options.certfile = {}\n\
             ssl_options.keyfile = {}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n",
            file("ca.pem", &pki.ca_pem()),
            file("server.pem", &cert),
            file("server.key", &key),
        );
        let node = tokio::task::spawn_blocking(move || Node::start_with("partner", &extra))
            .await
            .unwrap();
        Arc::new(Self {
            node,
            tls_port,
            pki,
            dir,
        })
    }

    /// A vhost of the case's own, which `guest` may use as it likes.
    fn vhost(&self, name: &str) {
        self.node.ctl_ok(&["add_vhost", name]);
        self.node
            .ctl_ok(&["set_permissions", "-p", name, "guest", ".*", ".*", ".*"]);
    }

    /// The destination URL of `vhost`.
    fn url(&self, vhost: &str) -> String {
        format!("amqp://127.0.0.1:{}/{vhost}", self.node.amqp_port)
    }

    async fn channel(&self, vhost: &str) -> (Connection, Channel) {
        let conn = Connection::connect(
            &format!(
                "amqp://guest:guest@127.0.0.1:{}/{vhost}",
                self.node.amqp_port
            ),
            ConnectionProperties::default(),
        )
        .await
        .unwrap();
        let channel = conn.create_channel().await.unwrap();
        (conn, channel)
    }

    /// A topic exchange `hooks` and a durable queue `inbox` bound to it with `binding`.
    async fn inbox(&self, vhost: &str, binding: &str) -> (Connection, Channel) {
        let (conn, ch) = self.channel(vhost).await;
        ch.exchange_declare(
            "hooks".into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_declare(
            "inbox".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            "inbox".into(),
            "hooks".into(),
            binding.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        (conn, ch)
    }

    /// A secret (a password, a PEM) kept in a file, as a secret reference.
    fn secret_file(&self, name: &str, text: &str) -> SecretRef {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        SecretRef::File(path)
    }

    /// A subscription of `tenant` publishing into `exchange` of `vhost` as `user`.
    fn subscription(
        &self,
        id: &str,
        tenant: &str,
        url: &str,
        exchange: &str,
        (user, password): (&str, &str),
        s: &Secret,
    ) -> Subscription {
        let mut sub = Subscription::new(id, tenant, url.parse().unwrap(), s.reference.clone());
        sub.amqp = Some(AmqpTarget {
            exchange: exchange.into(),
            routing_key: None,
        });
        sub.basic_auth = Some(BasicAuth {
            username: user.into(),
            password: self.secret_file(&format!("{id}.pw"), password),
        });
        sub
    }
}

fn event(id: &str, tenant: &str, subscription: &str) -> NewEvent {
    common::event(id, tenant, subscription)
}

/// Takes what `queue` holds, until `n` messages were taken or the wait ends.
async fn take(ch: &Channel, queue: &str, n: usize) -> Vec<BasicGetMessage> {
    let mut got = Vec::new();
    wait_until(WAIT, async || {
        while let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .ok()
            .flatten()
        {
            got.push(m);
        }
        got.len() >= n
    })
    .await;
    got
}

/// The message's string headers, as an HTTP receiver would see them.
fn headers_of(m: &BasicGetMessage) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Some(table) = m.delivery.properties.headers() {
        for (name, value) in table.inner() {
            if let AMQPValue::LongString(s) = value {
                out.insert(
                    name.to_string(),
                    String::from_utf8_lossy(s.as_bytes()).into(),
                );
            }
        }
    }
    out
}

/// Verifies a message with the standardwebhooks crate, as the partner's consumer would.
fn verifies(m: &BasicGetMessage, whsec: &str) -> bool {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in headers_of(m) {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.as_bytes()),
            value.parse(),
        ) {
            headers.insert(name, value);
        }
    }
    standardwebhooks::Webhook::new(whsec)
        .unwrap()
        .verify(&m.delivery.data, &headers)
        .is_ok()
}

async fn delivered_and_verified(partner: Arc<Partner>) {
    partner.vhost("ok");
    let (_conn, ch) = partner.inbox("ok", "order.*").await;
    let t = TestLadder::apply("amqp-ok", &["300ms"], &["300ms"]).await;
    let s = secret();
    let sub = partner.subscription(
        "sub_ok",
        "acme",
        &partner.url("ok"),
        "hooks",
        ("guest", "guest"),
        &s,
    );
    let worker = RunningWorker::start(&t, vec![sub]).await;
    let events: Vec<NewEvent> = (0..3)
        .map(|i| event(&format!("evt_ok_{i}"), "acme", "sub_ok"))
        .collect();
    t.publish_all(events.clone()).await;
    let got = take(&ch, "inbox", 3).await;
    assert_eq!(got.len(), 3, "every event reached the partner");
    for m in &got {
        assert!(verifies(m, &s.whsec), "{:?}", headers_of(m));
        let props = &m.delivery.properties;
        let id = props.message_id().as_ref().unwrap().to_string();
        let sent = events.iter().find(|e| e.id == id).unwrap();
        assert_eq!(&m.delivery.data[..], &sent.body[..]);
        assert_eq!(headers_of(m)["webhook-id"], id);
        assert_eq!(props.delivery_mode(), &Some(2));
        assert_eq!(
            props.content_type().as_ref().map(ToString::to_string),
            Some("application/json".into())
        );
        // The routing key is the event type when the subscription names none.
        assert_eq!(m.delivery.routing_key.as_str(), "order.paid");
    }
    worker.stop().await;
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 0, "all were acked");
}

async fn exchange_missing(partner: Arc<Partner>) {
    partner.vhost("nox");
    let t = TestLadder::apply("amqp-nox", &["300ms"], &["300ms", "300ms"]).await;
    let s = secret();
    let sub = partner.subscription(
        "sub_nox",
        "nox",
        &partner.url("nox"),
        "removed",
        ("guest", "guest"),
        &s,
    );
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish(&event("evt_nox", "nox", "sub_nox")).await;
    assert!(t.wait_dead(1, WAIT).await, "dead-lettered");
    let dead = t.drain_dead().await;
    let props = &dead[0].delivery.properties;
    assert_eq!(
        read_str_header(props, REASON_HEADER).as_deref(),
        Some("gone"),
        "a missing exchange is gone at once, as a 410"
    );
    worker.stop().await;
}

async fn no_route(partner: Arc<Partner>) {
    partner.vhost("noroute");
    let (_conn, _ch) = partner.inbox("noroute", "order.*").await;
    let t = TestLadder::apply("amqp-noroute", &["300ms"], &["300ms"]).await;
    let s = secret();
    let mut sub = partner.subscription(
        "sub_noroute",
        "noroute",
        &partner.url("noroute"),
        "hooks",
        ("guest", "guest"),
        &s,
    );
    // Nothing is bound for this key: the broker returns the mandatory message.
    sub.amqp = Some(AmqpTarget {
        exchange: "hooks".into(),
        routing_key: Some("unbound.key".into()),
    });
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish(&event("evt_noroute", "noroute", "sub_noroute"))
        .await;
    assert!(
        t.wait_dead(1, WAIT).await,
        "dead-lettered once retries ran out"
    );
    let dead = t.drain_dead().await;
    let props = &dead[0].delivery.properties;
    assert_eq!(
        read_str_header(props, REASON_HEADER).as_deref(),
        Some("exhausted")
    );
    let error = read_str_header(props, LAST_ERROR_HEADER).unwrap_or_default();
    assert!(
        error.contains("returned the message") && error.contains("NO_ROUTE"),
        "{error}"
    );
    worker.stop().await;
}

async fn access_refused(partner: Arc<Partner>) {
    partner.vhost("ro");
    let (_conn, _ch) = partner.inbox("ro", "#").await;
    // May read and declare, never write.
    partner.node.ctl_ok(&["add_user", "reader", "reader-pw"]);
    partner
        .node
        .ctl_ok(&["set_permissions", "-p", "ro", "reader", ".*", "^$", ".*"]);
    let t = TestLadder::apply("amqp-ro", &["300ms"], &["300ms"]).await;
    let s = secret();
    let sub = partner.subscription(
        "sub_ro",
        "ro",
        &partner.url("ro"),
        "hooks",
        ("reader", "reader-pw"),
        &s,
    );
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish(&event("evt_ro", "ro", "sub_ro")).await;
    assert!(
        t.wait_dead(1, WAIT).await,
        "dead-lettered once retries ran out"
    );
    let dead = t.drain_dead().await;
    let props = &dead[0].delivery.properties;
    assert_eq!(
        read_str_header(props, REASON_HEADER).as_deref(),
        Some("exhausted"),
        "a refusal is a failed attempt, retried through the ladder"
    );
    let error = read_str_header(props, LAST_ERROR_HEADER).unwrap_or_default();
    assert!(
        error.contains("access refused") && error.contains("ACCESS_REFUSED"),
        "{error}"
    );
    worker.stop().await;
}

async fn client_certificate(partner: Arc<Partner>) {
    partner.vhost("tls");
    let (_conn, ch) = partner.inbox("tls", "#").await;
    let t = TestLadder::apply("amqp-tls", &["300ms"], &["300ms"]).await;
    let s = secret();
    let url = format!("amqps://127.0.0.1:{}/tls", partner.tls_port);
    let (cert, key) = partner.pki.leaf(&["hookrelay"], true);
    let mut with_cert =
        partner.subscription("sub_tls", "tls", &url, "hooks", ("guest", "guest"), &s);
    with_cert.tls = Some(ClientTls {
        cert: partner.secret_file("client.pem", &cert),
        key: partner.secret_file("client.key", &key),
        ca: Some(partner.secret_file("client-ca.pem", &partner.pki.ca_pem())),
    });
    // The same broker, a certificate of a CA it does not know: refused in the handshake.
    let (rogue_cert, rogue_key) = Pki::new("rogue").leaf(&["hookrelay"], true);
    let mut rogue = partner.subscription("sub_rogue", "tls", &url, "hooks", ("guest", "guest"), &s);
    rogue.tls = Some(ClientTls {
        cert: partner.secret_file("rogue.pem", &rogue_cert),
        key: partner.secret_file("rogue.key", &rogue_key),
        ca: Some(partner.secret_file("rogue-ca.pem", &partner.pki.ca_pem())),
    });
    let worker = RunningWorker::start(&t, vec![with_cert, rogue]).await;
    t.publish(&event("evt_tls", "tls", "sub_tls")).await;
    t.publish(&event("evt_rogue", "tls", "sub_rogue")).await;
    let got = take(&ch, "inbox", 1).await;
    assert_eq!(
        got.len(),
        1,
        "delivered over TLS with the client certificate"
    );
    assert!(verifies(&got[0], &s.whsec));
    assert!(t.wait_dead(1, WAIT).await, "the other one's attempts end");
    let dead = t.drain_dead().await;
    let props = &dead[0].delivery.properties;
    assert_eq!(
        props
            .message_id()
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("evt_rogue")
    );
    worker.stop().await;
}

async fn partner_hanging(partner: Arc<Partner>) {
    // Takes connections and never says a word; counts those that were shut from our side.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let shut = Arc::new(AtomicUsize::new(0));
    let (a, sh) = (Arc::clone(&accepted), Arc::clone(&shut));
    let hang = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            a.fetch_add(1, Ordering::SeqCst);
            let sh = Arc::clone(&sh);
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 64];
                while socket.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                sh.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    partner.vhost("fine");
    let (_conn, ch) = partner.inbox("fine", "#").await;
    let t = TestLadder::apply("amqp-hang", &["300ms"], &["300ms"]).await;
    let s = secret();
    let hanging = partner.subscription(
        "sub_hang",
        "hang",
        &format!("amqp://127.0.0.1:{port}/%2f"),
        "hooks",
        ("guest", "guest"),
        &s,
    );
    let fine = partner.subscription(
        "sub_fine",
        "fine",
        &partner.url("fine"),
        "hooks",
        ("guest", "guest"),
        &s,
    );
    let worker = RunningWorker::start(&t, vec![hanging, fine]).await;
    t.publish(&event("evt_hang", "hang", "sub_hang")).await;
    t.publish(&event("evt_fine", "fine", "sub_fine")).await;
    assert_eq!(
        take(&ch, "inbox", 1).await.len(),
        1,
        "another tenant is delivered while the partner hangs"
    );
    assert!(
        t.wait_dead(1, WAIT).await,
        "the hanging partner's attempts end"
    );
    let dead = t.drain_dead().await;
    let error =
        read_str_header(&dead[0].delivery.properties, LAST_ERROR_HEADER).unwrap_or_default();
    assert!(error.contains("did not complete the connection"), "{error}");
    // Every connection it took was shut: nothing of it is left open in the worker.
    assert!(
        wait_until(WAIT, async || {
            let n = accepted.load(Ordering::SeqCst);
            n >= 2 && shut.load(Ordering::SeqCst) == n
        })
        .await,
        "accepted {}, shut {}",
        accepted.load(Ordering::SeqCst),
        shut.load(Ordering::SeqCst)
    );
    worker.stop().await;
    hang.abort();
}

/// The partner's node stops after a first batch and starts again while a second waits in the
/// ladder: every event arrives; a duplicate is possible only for what was in flight.
async fn partner_restarted(partner: Arc<Partner>) {
    partner.vhost("bounce");
    let (conn, ch) = partner.inbox("bounce", "#").await;
    let schedule: Vec<&str> = std::iter::repeat_n("1s", 90).collect();
    let t = TestLadder::apply("amqp-bounce", &["1s"], &schedule).await;
    let s = secret();
    let sub = partner.subscription(
        "sub_bounce",
        "bounce",
        &partner.url("bounce"),
        "hooks",
        ("guest", "guest"),
        &s,
    );
    let worker = RunningWorker::start(&t, vec![sub]).await;
    let batch = |from: usize| -> Vec<NewEvent> {
        (from..from + 10)
            .map(|i| event(&format!("evt_bounce_{i}"), "bounce", "sub_bounce"))
            .collect()
    };
    t.publish_all(batch(0)).await;
    let mut got = take(&ch, "inbox", 10).await;
    assert_eq!(got.len(), 10);
    drop((ch, conn));
    let attempts = t.tail_attempts("bounce", 1).await;
    let node = Arc::clone(&partner);
    tokio::task::spawn_blocking(move || node.node.stop())
        .await
        .unwrap();
    t.publish_all(batch(10)).await;
    // An attempt failed while it was down; then it comes back with its data.
    let failed = attempts.await.unwrap();
    assert_ne!(failed[0].outcome, "delivered", "{failed:?}");
    let node = Arc::clone(&partner);
    tokio::task::spawn_blocking(move || node.node.boot())
        .await
        .unwrap();
    let (_conn, ch) = partner.channel("bounce").await;
    got.extend(take(&ch, "inbox", 10).await);
    let mut ids: Vec<String> = got
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string()
        })
        .collect();
    let total = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "nothing lost: {ids:?}");
    assert!(
        total - ids.len() <= 10,
        "duplicates bounded by what was in flight"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_destinations_deliver_into_a_partner_broker() {
    let partner = Partner::start().await;
    tokio::join!(
        delivered_and_verified(Arc::clone(&partner)),
        exchange_missing(Arc::clone(&partner)),
        access_refused(Arc::clone(&partner)),
        no_route(Arc::clone(&partner)),
        partner_hanging(Arc::clone(&partner)),
        client_certificate(Arc::clone(&partner)),
    );
    partner_restarted(Arc::clone(&partner)).await;
}
