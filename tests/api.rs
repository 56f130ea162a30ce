//! `hookrelay api` over real sockets and a real PostgreSQL (127.0.0.1:5432, or
//! `HOOKRELAY_TEST_DATABASE_URL`): every test creates a database of its own, migrates it, and drops
//! it when done. The routes that touch the broker (test events, returning parked deliveries)
//! run on a ladder of the test's own.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hookrelay::api::auth::Tokens;
use hookrelay::api::quota::Limits;
use hookrelay::api::validate::Egress;
use hookrelay::api::{ApiSetup, BrokerSetup};
use hookrelay::contract::headers::{SUBSCRIPTION_HEADER, TENANT_HEADER, read_str_header};
use hookrelay::contract::signing::signature_header;
use hookrelay::delivery::egress::{EgressPolicy, Lookup};
use hookrelay::store::PgStore;
use hookrelay::subscriptions::SecretStore;
use hookrelay::subscriptions::seal::{Binding, Keyring, generate_key};
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use common::egress::StaticLookup;
use common::{TestLadder, wait_until};

const ADMIN: &str = "admin-token-0123456789abcdef";
const ACME: &str = "acme-token-0123456789abcdef";
const GLOBEX: &str = "globex-token-0123456789abcdef";
const PROBLEM: &str = "application/problem+json";
const WAIT: Duration = Duration::from_secs(20);

/// A database of the test's own ([`common::pg::TestDb`], dropped with it), migrated.
struct TestDb {
    store: PgStore,
    _db: common::pg::TestDb,
}

impl TestDb {
    async fn create() -> Self {
        let db = common::pg::TestDb::create().await;
        let store = db.store().await;
        store.check_schema().await.unwrap();
        Self { store, _db: db }
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }
}

/// A running API on 127.0.0.1:0 over a database of its own.
struct Api {
    base: String,
    db: TestDb,
    keyring: Arc<Keyring>,
    /// The store key, base64.
    key: String,
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

struct Answer {
    status: StatusCode,
    content_type: String,
    location: Option<String>,
    retry_after: Option<String>,
    body: Value,
}

impl Answer {
    #[track_caller]
    fn problem(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(self.content_type, PROBLEM, "{}", self.body);
        assert_eq!(self.body["status"], status, "{}", self.body);
        &self.body
    }

    /// A 422 naming `field` alone, its message saying `says`; the problem.
    #[track_caller]
    fn refused(&self, field: &str, says: &str) -> &Value {
        let problem = self.problem(422);
        assert_eq!(self.fields(), [field], "{problem}");
        let message = problem["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{problem}");
        problem
    }

    /// The fields a 422 names, sorted.
    #[track_caller]
    fn invalid(&self) -> Vec<String> {
        self.problem(422);
        let mut fields = self.fields();
        fields.sort();
        fields
    }

    /// The fields a problem names.
    fn fields(&self) -> Vec<String> {
        self.body["errors"]
            .as_array()
            .map(|e| {
                e.iter()
                    .filter_map(|e| e["field"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Names the tests use: one public, one on a private network.
fn lookup() -> StaticLookup {
    StaticLookup::default()
        .with("hooks.acme.example", &["93.184.215.14"])
        .with("hooks.globex.example", &["93.184.215.15"])
        .with("internal.acme.example", &["10.0.0.5"])
}

/// How a test's API is set up; the default is what most tests run.
struct Options {
    broker: Option<BrokerSetup>,
    max_body: usize,
    policy: EgressPolicy,
    lookup: Arc<dyn Lookup>,
    lookup_timeout: Duration,
    /// Whether it has a history database (the store's).
    history: bool,
    limits: Limits,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            broker: None,
            max_body: 64 * 1024,
            policy: EgressPolicy::default(),
            lookup: Arc::new(lookup()),
            lookup_timeout: Duration::from_secs(1),
            history: true,
            limits: Limits::default(),
        }
    }
}

impl Api {
    async fn start() -> Self {
        Self::start_with(None, 64 * 1024).await
    }

    async fn start_with(broker: Option<BrokerSetup>, max_body: usize) -> Self {
        Self::start_with_policy(broker, max_body, EgressPolicy::default()).await
    }

    async fn start_limited(broker: Option<BrokerSetup>, limits: Limits) -> Self {
        Self::start_setup(broker, 64 * 1024, EgressPolicy::default(), limits).await
    }

    async fn start_with_policy(
        broker: Option<BrokerSetup>,
        max_body: usize,
        policy: EgressPolicy,
    ) -> Self {
        Self::start_with_options(Options {
            broker,
            max_body,
            policy,
            ..Options::default()
        })
        .await
    }

    async fn start_setup(
        broker: Option<BrokerSetup>,
        max_body: usize,
        policy: EgressPolicy,
        limits: Limits,
    ) -> Self {
        Self::start_with_options(Options {
            broker,
            max_body,
            policy,
            limits,
            ..Options::default()
        })
        .await
    }

    async fn start_with_options(options: Options) -> Self {
        let Options {
            broker,
            max_body,
            policy,
            lookup,
            lookup_timeout,
            history,
            limits,
        } = options;
        let db = TestDb::create().await;
        let key = generate_key();
        let keyring = Arc::new(Keyring::from_base64(&[&key]).unwrap());
        let setup = ApiSetup {
            pool: db.store.pool().clone(),
            keyring: Arc::clone(&keyring),
            tokens: Tokens::from_plain(&[
                (ADMIN, None),
                (ACME, Some("acme")),
                (GLOBEX, Some("globex")),
            ]),
            egress: Egress::new(policy, lookup, lookup_timeout),
            max_body,
            broker,
            history: history.then(|| db.store.pool().clone()),
            limits,
            pages: Default::default(),
        };
        let (app, state) = hookrelay::api::router(setup);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            hookrelay::api::serve(listener, app, state, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            base,
            db,
            keyring,
            key,
            client: reqwest::Client::new(),
            stop: Some(stop),
            served: Some(served),
        }
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let location = response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = response.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
        };
        Answer {
            status,
            content_type,
            location,
            retry_after,
            body,
        }
    }

    /// Asks for a replay as `token`.
    async fn replay(&self, token: &str, body: Value) -> Answer {
        self.call(Method::POST, "/v1/replays", token, Some(body))
            .await
    }

    async fn call(&self, method: Method, path: &str, token: &str, body: Option<Value>) -> Answer {
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        self.raw(method, path, Some(token), body, &[]).await
    }

    /// Creates a subscription as `token`; the answer's body (subscription and secret).
    async fn create(&self, token: &str, body: Value) -> Value {
        let answer = self
            .call(Method::POST, "/v1/subscriptions", token, Some(body))
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        answer.body
    }

    /// Replay job `id` as `token` sees it once it is no longer running (or after [`WAIT`]).
    async fn replay_once_done(&self, id: &str, token: &str) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let job = self
                .call(Method::GET, &format!("/v1/replays/{id}"), token, None)
                .await
                .body;
            if job["state"] != "running" || tokio::time::Instant::now() > deadline {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
    }
}

fn acme_sub(id: &str) -> Value {
    json!({ "id": id, "tenant": "acme", "url": "https://hooks.acme.example/in" })
}

#[tokio::test]
async fn every_route_creates_reads_lists_changes_and_deletes() {
    let api = Api::start().await;
    let created = api
        .call(
            Method::POST,
            "/v1/subscriptions",
            ADMIN,
            Some(json!({
                "tenant": "acme",
                "url": "https://hooks.acme.example/in?token=abc",
                "event_types": ["order.*", "invoice.paid"],
                "max_concurrent": 4,
                "rate": "600/m",
                "description": "orders",
            })),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let id = created.body["subscription"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(id.starts_with("sub_"), "{id}");
    assert_eq!(created.location, Some(format!("/v1/subscriptions/{id}")));
    let secret = created.body["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let sub = &created.body["subscription"];
    assert_eq!(sub["rate"], "10/s");
    assert_eq!(sub["event_types"], json!(["order.*", "invoice.paid"]));
    assert_eq!(sub["enabled"], true);
    assert_eq!(sub["paused"], false);
    assert_eq!(sub["secrets"].as_array().unwrap().len(), 1);

    // Stored as the workers read it: sealed, and it opens for this subscription only.
    let sealed: Vec<u8> =
        sqlx::query_scalar("SELECT sealed FROM subscription_secrets WHERE subscription_id = $1")
            .bind(&id)
            .fetch_one(api.db.store.pool())
            .await
            .unwrap();
    assert!(!String::from_utf8_lossy(&sealed).contains(&secret[6..]));
    let binding = Binding::new("acme", &id, "signing");
    assert_eq!(
        api.keyring.open(&binding, &sealed).unwrap(),
        secret.as_bytes()
    );
    let (loaded, problems) = api.db.store.load_all().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let loaded = loaded.get(&id).unwrap();
    assert_eq!(loaded.max_concurrent, Some(4));
    assert!(loaded.accepts("order.paid") && !loaded.accepts("user.created"));

    // Read: the same, and never the secret.
    let read = api
        .call(Method::GET, &format!("/v1/subscriptions/{id}"), ADMIN, None)
        .await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(&read.body, sub);
    assert!(!read.body.to_string().contains(secret));

    // Update: fields left out stay; null clears.
    let patched = api
        .call(
            Method::PATCH,
            &format!("/v1/subscriptions/{id}"),
            ADMIN,
            Some(json!({
                "url": "https://hooks.globex.example/v2",
                "event_types": null,
                "enabled": false,
                "max_concurrent": 9,
                "rate": null,
            })),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["url"], "https://hooks.globex.example/v2");
    assert_eq!(patched.body.get("event_types"), None);
    assert_eq!(patched.body["enabled"], false);
    assert_eq!(patched.body["disabled_reason"], "disabled through the API");
    assert_eq!(patched.body["max_concurrent"], 9);
    assert_eq!(patched.body.get("rate"), None);
    assert_eq!(patched.body["description"], "orders");
    let reenabled = api
        .call(
            Method::PATCH,
            &format!("/v1/subscriptions/{id}"),
            ADMIN,
            Some(json!({ "enabled": true })),
        )
        .await;
    assert_eq!(reenabled.body.get("disabled_reason"), None);

    // Pause and resume (no broker here: the parked deliveries are left to the CLI).
    let paused = api
        .call(
            Method::POST,
            &format!("/v1/subscriptions/{id}/pause"),
            ADMIN,
            None,
        )
        .await;
    assert_eq!(paused.status, StatusCode::OK);
    assert_eq!(paused.body["paused"], true);
    let (loaded, _) = api.db.store.load_all().await.unwrap();
    assert!(loaded.get(&id).unwrap().paused);
    let resumed = api
        .call(
            Method::POST,
            &format!("/v1/subscriptions/{id}/resume"),
            ADMIN,
            Some(json!({ "rate": "50/s" })),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::OK, "{}", resumed.body);
    assert_eq!(resumed.body["subscription"]["paused"], false);
    assert_eq!(resumed.body["returning_parked"], false);
    let bad_rate = api
        .call(
            Method::POST,
            &format!("/v1/subscriptions/{id}/resume"),
            ADMIN,
            Some(json!({ "rate": "fast" })),
        )
        .await;
    assert_eq!(bad_rate.fields(), ["rate"]);

    // Test events need a broker: this API has none.
    let test = api
        .call(
            Method::POST,
            &format!("/v1/subscriptions/{id}/test"),
            ADMIN,
            None,
        )
        .await;
    test.problem(503);

    // List, then delete.
    let list = api
        .call(Method::GET, "/v1/subscriptions", ADMIN, None)
        .await;
    assert_eq!(list.body["data"].as_array().unwrap().len(), 1);
    assert_eq!(list.body.get("next_cursor"), None);
    let deleted = api
        .call(
            Method::DELETE,
            &format!("/v1/subscriptions/{id}"),
            ADMIN,
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    api.call(Method::GET, &format!("/v1/subscriptions/{id}"), ADMIN, None)
        .await
        .problem(404);
    api.call(
        Method::DELETE,
        &format!("/v1/subscriptions/{id}"),
        ADMIN,
        None,
    )
    .await
    .problem(404);
    assert_eq!(api.db.count("subscription_secrets").await, 0);
    api.stop().await;
}

#[tokio::test]
async fn a_tenant_token_sees_and_changes_only_its_own_tenant() {
    let api = Api::start().await;
    // A tenant token creates for its own tenant, named or not.
    let own = api
        .create(ACME, json!({ "url": "https://hooks.acme.example/a" }))
        .await;
    assert_eq!(own["subscription"]["tenant"], "acme");
    // An admin names an id (a tenant token's are generated).
    let globex = api
        .create(
            ADMIN,
            json!({ "id": "sub_globex", "tenant": "globex", "url": "https://hooks.globex.example/g" }),
        )
        .await;
    assert_eq!(globex["subscription"]["tenant"], "globex");
    let other = api
        .call(
            Method::POST,
            "/v1/subscriptions",
            ACME,
            Some(json!({ "tenant": "globex", "url": "https://hooks.acme.example/x" })),
        )
        .await;
    other.problem(422);
    assert_eq!(other.fields(), ["tenant"]);

    // Another tenant's subscription does not exist for acme's token, whatever the route.
    let path = "/v1/subscriptions/sub_globex";
    for (method, path, body) in [
        (Method::GET, path.to_owned(), None),
        (
            Method::PATCH,
            path.to_owned(),
            Some(json!({ "enabled": false })),
        ),
        (Method::POST, format!("{path}/pause"), None),
        (Method::POST, format!("{path}/resume"), None),
        (Method::POST, format!("{path}/secrets/rotate"), None),
        (Method::POST, format!("{path}/test"), None),
        (Method::DELETE, path.to_owned(), None),
    ] {
        let answer = api.call(method.clone(), &path, ACME, body).await;
        let problem = answer.problem(404);
        assert_eq!(
            problem["type"], "urn:hookrelay:problem:not-found",
            "{method} {path}"
        );
    }
    // Untouched.
    let still = api.call(Method::GET, path, GLOBEX, None).await;
    assert_eq!(still.body["enabled"], true);
    assert_eq!(still.body["paused"], false);
    assert_eq!(still.body["secrets"].as_array().unwrap().len(), 1);

    // Lists are scoped; asking for another tenant gives nothing.
    let mine = api.call(Method::GET, "/v1/subscriptions", ACME, None).await;
    let tenants: Vec<&str> = mine.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["acme"]);
    let theirs = api
        .call(Method::GET, "/v1/subscriptions?tenant=globex", ACME, None)
        .await;
    assert_eq!(theirs.body["data"], json!([]));
    let all = api
        .call(Method::GET, "/v1/subscriptions", ADMIN, None)
        .await;
    assert_eq!(all.body["data"].as_array().unwrap().len(), 2);
    api.stop().await;
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401_with_no_detail() {
    let api = Api::start().await;
    api.create(ADMIN, acme_sub("sub_a")).await;
    for token in [None, Some("wrong-token-0123456789abcdef"), Some("")] {
        for (method, path) in [
            (Method::GET, "/v1/subscriptions"),
            (Method::GET, "/v1/subscriptions/sub_a"),
            (Method::DELETE, "/v1/subscriptions/sub_a"),
            (Method::POST, "/v1/subscriptions/sub_a/secrets/rotate"),
        ] {
            let answer = api.raw(method, path, token, None, &[]).await;
            let problem = answer.problem(401);
            assert_eq!(problem.get("detail"), None, "{problem}");
            assert_eq!(problem.get("errors"), None, "{problem}");
        }
    }
    // Not a bearer token at all.
    let basic = api
        .raw(
            Method::GET,
            "/v1/subscriptions",
            None,
            None,
            &[("authorization", "Basic YWRtaW46YWRtaW4=")],
        )
        .await;
    basic.problem(401);
    // The document is public.
    let doc = api
        .raw(Method::GET, "/v1/openapi.json", None, None, &[])
        .await;
    assert_eq!(doc.status, StatusCode::OK);
    assert_eq!(api.db.count("subscriptions").await, 1);
    api.stop().await;
}

#[tokio::test]
async fn bad_input_is_a_problem_naming_the_field_and_nothing_is_stored() {
    let api = Api::start_with(None, 4096).await;
    let post = |body: Vec<u8>| {
        api.raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ADMIN),
            Some(body),
            &[],
        )
    };

    let malformed = post(b"{\"tenant\": \"acme\", \"url\": ".to_vec()).await;
    assert_eq!(
        malformed.problem(400)["type"],
        "urn:hookrelay:problem:malformed-body"
    );
    let trailing =
        post(b"{\"tenant\": \"acme\", \"url\": \"https://hooks.acme.example\"} x".to_vec()).await;
    trailing.problem(400);

    let unknown = post(
        serde_json::to_vec(&json!({
            "tenant": "acme", "url": "https://hooks.acme.example", "secret": "whsec_x"
        }))
        .unwrap(),
    )
    .await;
    unknown.problem(422);
    assert!(
        unknown.body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `secret`"),
        "{}",
        unknown.body
    );

    let wrong_type =
        post(serde_json::to_vec(&json!({ "tenant": "acme", "url": 5 })).unwrap()).await;
    wrong_type.problem(422);
    assert_eq!(wrong_type.fields(), ["url"]);

    let oversized = post(
        serde_json::to_vec(&json!({
            "tenant": "acme", "url": "https://hooks.acme.example", "description": "x".repeat(5000)
        }))
        .unwrap(),
    )
    .await;
    assert_eq!(
        oversized.problem(413)["type"],
        "urn:hookrelay:problem:body-too-large"
    );

    for (body, field, says) in [
        (
            json!({ "tenant": "acme", "url": "not a url" }),
            "url",
            "not a URL",
        ),
        (
            json!({ "tenant": "acme", "url": "ftp://hooks.acme.example/" }),
            "url",
            "http",
        ),
        (
            json!({ "tenant": "acme", "url": "http://10.1.2.3/hook" }),
            "url",
            "private",
        ),
        (
            json!({ "tenant": "acme", "url": "http://127.0.0.1:8080/" }),
            "url",
            "loopback",
        ),
        (
            json!({ "tenant": "acme", "url": "http://169.254.169.254/latest" }),
            "url",
            "link-local",
        ),
        (
            json!({ "tenant": "acme", "url": "https://internal.acme.example/" }),
            "url",
            "10.0.0.5 (private)",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hooks.acme.example", "event_types": ["order*"] }),
            "event_types",
            "prefix.*",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hooks.acme.example", "event_types": [] }),
            "event_types",
            "empty",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hooks.acme.example", "rate": "lots" }),
            "rate",
            "rate",
        ),
        (
            json!({ "tenant": "ac.me", "url": "https://hooks.acme.example" }),
            "tenant",
            "tenant",
        ),
        (
            json!({ "url": "https://hooks.acme.example" }),
            "tenant",
            "required",
        ),
        (
            json!({ "id": "a b", "tenant": "acme", "url": "https://hooks.acme.example" }),
            "id",
            "letters",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hooks.acme.example", "max_concurrent": 0 }),
            "max_concurrent",
            "between",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hooks.acme.example", "description": "a\u{0}b" }),
            "description",
            "control characters",
        ),
    ] {
        post(serde_json::to_vec(&body).unwrap())
            .await
            .refused(field, says);
    }
    assert_eq!(api.db.count("subscriptions").await, 0);
    assert_eq!(api.db.count("subscription_secrets").await, 0);
    assert_eq!(api.db.count("idempotency_keys").await, 0);

    // A change is checked the same way, and a refused one changes nothing.
    api.create(ADMIN, acme_sub("sub_a")).await;
    for body in [
        json!({ "url": "http://192.168.1.1/" }),
        json!({ "event_types": ["bad pattern"] }),
        json!({ "tenant": "globex" }),
        json!({ "max_concurrent": -1 }),
    ] {
        let answer = api
            .call(
                Method::PATCH,
                "/v1/subscriptions/sub_a",
                ADMIN,
                Some(body.clone()),
            )
            .await;
        answer.problem(422);
    }
    let after = api
        .call(Method::GET, "/v1/subscriptions/sub_a", ADMIN, None)
        .await;
    assert_eq!(after.body["url"], "https://hooks.acme.example/in");
    assert_eq!(after.body.get("event_types"), None);
    assert_eq!(after.body["tenant"], "acme");

    // Only an object is a body; an optional one may be absent or null, and whitespace alone is
    // not JSON.
    let array = api
        .raw(
            Method::POST,
            "/v1/subscriptions/sub_a/secrets/rotate",
            Some(ADMIN),
            Some(b"[null, null]".to_vec()),
            &[],
        )
        .await;
    assert_eq!(array.problem(422)["errors"][0]["field"], "(body)");
    for empty in [&b""[..], b"null", b" null\n"] {
        let answer = api
            .raw(
                Method::POST,
                "/v1/subscriptions/sub_a/resume",
                Some(ADMIN),
                Some(empty.to_vec()),
                &[],
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    for blank in [&b" "[..], b"\n"] {
        api.raw(
            Method::POST,
            "/v1/subscriptions/sub_a/resume",
            Some(ADMIN),
            Some(blank.to_vec()),
            &[],
        )
        .await
        .problem(400);
    }
    let first_page = api
        .call(Method::GET, "/v1/subscriptions?cursor=", ADMIN, None)
        .await;
    assert_eq!(first_page.status, StatusCode::OK, "{}", first_page.body);

    // Unknown routes and methods are problems too.
    api.call(Method::GET, "/v2/nothing", ADMIN, None)
        .await
        .problem(404);
    api.call(Method::PUT, "/v1/subscriptions/sub_a", ADMIN, None)
        .await
        .problem(405);
    let taken = api
        .call(
            Method::POST,
            "/v1/subscriptions",
            ADMIN,
            Some(acme_sub("sub_a")),
        )
        .await;
    taken.problem(409);
    api.stop().await;
}

#[tokio::test]
async fn a_repeated_create_with_an_idempotency_key_gets_the_first_answer() {
    let api = Api::start().await;
    let body =
        serde_json::to_vec(&json!({ "tenant": "acme", "url": "https://hooks.acme.example/i" }))
            .unwrap();
    let key = [("idempotency-key", "create-1")];
    let first = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ADMIN),
            Some(body.clone()),
            &key,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let again = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ADMIN),
            Some(body.clone()),
            &key,
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body, first.body);
    assert_eq!(again.location, first.location);
    assert_eq!(api.db.count("subscriptions").await, 1);
    // The remembered answer holds the secret sealed, never in clear.
    let stored: Value = sqlx::query_scalar("SELECT body FROM idempotency_keys")
        .fetch_one(api.db.store.pool())
        .await
        .unwrap();
    let secret = first.body["secret"].as_str().unwrap();
    assert!(!stored.to_string().contains(secret));

    // Same key, another body: refused, nothing created.
    let other =
        serde_json::to_vec(&json!({ "tenant": "acme", "url": "https://hooks.acme.example/j" }))
            .unwrap();
    let reused = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ADMIN),
            Some(other.clone()),
            &key,
        )
        .await;
    assert_eq!(
        reused.problem(422)["type"],
        "urn:hookrelay:problem:idempotency-key-reused"
    );
    assert_eq!(reused.fields(), ["Idempotency-Key"]);
    // Keys belong to their caller: acme's token may use the same key for its own request.
    let acme = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ACME),
            Some(other),
            &key,
        )
        .await;
    assert_eq!(acme.status, StatusCode::CREATED, "{}", acme.body);
    assert_eq!(api.db.count("subscriptions").await, 2);

    // Concurrent retries of one request create one subscription.
    let body =
        serde_json::to_vec(&json!({ "tenant": "acme", "url": "https://hooks.acme.example/k" }))
            .unwrap();
    let key = [("idempotency-key", "create-2")];
    let answers = futures_util::future::join_all((0..8).map(|_| {
        api.raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ADMIN),
            Some(body.clone()),
            &key,
        )
    }))
    .await;
    let created = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let replayed = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!((created, replayed), (1, 7));
    assert!(answers.iter().all(|a| a.body == answers[0].body));
    assert_eq!(api.db.count("subscriptions").await, 3);

    api.raw(
        Method::POST,
        "/v1/subscriptions",
        Some(ADMIN),
        Some(body),
        &[("idempotency-key", "")],
    )
    .await
    .problem(422);
    api.stop().await;
}

#[tokio::test]
async fn lists_filter_and_page_with_an_opaque_cursor() {
    let api = Api::start().await;
    for i in 0..7 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        api.create(
            ADMIN,
            json!({
                "id": format!("sub_{i}"),
                "tenant": tenant,
                "url": "https://hooks.acme.example/p",
                "paused": i == 4,
                "enabled": i != 6,
            }),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/subscriptions?limit=3".to_owned();
    loop {
        let page = api.call(Method::GET, &path, ADMIN, None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let data = page.body["data"].as_array().unwrap();
        assert!(data.len() <= 3);
        seen.extend(data.iter().map(|s| s["id"].as_str().unwrap().to_owned()));
        match page.body["next_cursor"].as_str() {
            Some(cursor) => {
                assert!(!cursor.contains("sub_"), "{cursor}");
                path = format!("/v1/subscriptions?limit=3&cursor={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(seen, (0..7).map(|i| format!("sub_{i}")).collect::<Vec<_>>());

    let ids = |answer: Answer| -> Vec<String> {
        answer.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        ids(api
            .call(Method::GET, "/v1/subscriptions?tenant=acme", ADMIN, None)
            .await),
        ["sub_0", "sub_2", "sub_4", "sub_6"]
    );
    assert_eq!(
        ids(api
            .call(Method::GET, "/v1/subscriptions?paused=true", ADMIN, None)
            .await),
        ["sub_4"]
    );
    assert_eq!(
        ids(api
            .call(
                Method::GET,
                "/v1/subscriptions?tenant=acme&enabled=false",
                ADMIN,
                None
            )
            .await),
        ["sub_6"]
    );
    assert_eq!(
        ids(api
            .call(
                Method::GET,
                "/v1/subscriptions?enabled=true&paused=false",
                GLOBEX,
                None
            )
            .await),
        ["sub_1", "sub_3", "sub_5"]
    );
    for bad in [
        "limit=0",
        "limit=501",
        "cursor=%21%21",
        "enabled=maybe",
        "colour=red",
        "tenant=ac.me",
        "cursor=c3ViXzEAeA",
    ] {
        let answer = api
            .call(
                Method::GET,
                &format!("/v1/subscriptions?{bad}"),
                ADMIN,
                None,
            )
            .await;
        answer.problem(422);
    }
    api.stop().await;
}

/// Signs one message with every key the workers would use for `id` now, and checks it with
/// the standardwebhooks crate against `secret`.
async fn verifies(api: &Api, id: &str, secret: &str) -> bool {
    let (subs, problems) = api.db.store.load_all().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let sub = subs.get(id).unwrap();
    let store = SecretStore::new(Duration::ZERO).with_keyring(Arc::clone(&api.keyring));
    let (keys, errors) = store.keys_for(sub);
    assert!(errors.is_empty(), "{errors:?}");
    let body = br#"{"type":"order.paid"}"#;
    let ts = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = signature_header(keys.iter().map(|k| k.as_ref()), "evt_rot", ts, body);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("webhook-id", "evt_rot".parse().unwrap());
    headers.insert("webhook-timestamp", ts.to_string().parse().unwrap());
    headers.insert("webhook-signature", header.parse().unwrap());
    standardwebhooks::Webhook::new(secret)
        .unwrap()
        .verify(body, &headers)
        .is_ok()
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_old_one_until_the_old_one_expires() {
    let api = Api::start().await;
    let created = api.create(ADMIN, acme_sub("sub_rot")).await;
    let first = created["secret"].as_str().unwrap().to_owned();
    assert!(verifies(&api, "sub_rot", &first).await);

    let rotated = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_rot/secrets/rotate",
            ACME,
            Some(json!({ "expire_old_after": "1h" })),
        )
        .await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let second = rotated.body["secret"].as_str().unwrap().to_owned();
    assert_ne!(first, second);
    let secrets = rotated.body["subscription"]["secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 2);
    assert_eq!(secrets[0].get("expires_at"), None);
    assert_eq!(secrets[1]["expires_at"], rotated.body["old_expires_at"]);
    // During the overlap both verify: each delivery carries a signature with each.
    assert!(verifies(&api, "sub_rot", &first).await);
    assert!(verifies(&api, "sub_rot", &second).await);
    // Never shown again.
    let read = api
        .call(Method::GET, "/v1/subscriptions/sub_rot", ACME, None)
        .await;
    assert!(!read.body.to_string().contains(&second[6..]));

    // A second rotation with no overlap: only the newest signs.
    let third = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_rot/secrets/rotate",
            ACME,
            Some(json!({ "expire_old_after": "0s" })),
        )
        .await;
    let third_secret = third.body["secret"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(verifies(&api, "sub_rot", &third_secret).await);
    assert!(!verifies(&api, "sub_rot", &second).await);
    assert!(!verifies(&api, "sub_rot", &first).await);

    // The overlap may also end at a time; not both ways at once, nor in the past.
    let at = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_rot/secrets/rotate",
            ACME,
            Some(json!({ "old_expires_at": "2099-01-01T00:00:00Z" })),
        )
        .await;
    at.problem(422);
    assert_eq!(at.fields(), ["old_expires_at"]);
    let in_a_day =
        humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(86_400))
            .to_string();
    let ok = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_rot/secrets/rotate",
            ACME,
            Some(json!({ "old_expires_at": in_a_day })),
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    api.call(
        Method::POST,
        "/v1/subscriptions/sub_rot/secrets/rotate",
        ACME,
        Some(json!({ "old_expires_at": in_a_day, "expire_old_after": "1h" })),
    )
    .await
    .problem(422);
    api.stop().await;
}

fn broker(t: &TestLadder) -> BrokerSetup {
    BrokerSetup {
        amqp_url: t.config.amqp.url.clone(),
        confirm_timeout: t.config.amqp.confirm_timeout,
        ladder: t.ladder.clone(),
        max_event_bytes: t.config.limits.max_body_bytes,
        resume_wait: Duration::from_millis(100),
        management: None,
    }
}

#[tokio::test]
async fn a_test_event_goes_through_the_ingress_to_its_subscription() {
    let t = TestLadder::apply("api-test-event", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    api.create(
        ADMIN,
        json!({ "id": "sub_t", "tenant": "acme", "url": "https://hooks.acme.example/t", "event_types": ["order.*"] }),
    )
    .await;
    // hookrelay.test is not a type it receives: it would be cancelled as filtered.
    let filtered = api
        .call(Method::POST, "/v1/subscriptions/sub_t/test", ACME, None)
        .await;
    filtered.problem(422);
    assert_eq!(filtered.fields(), ["event_type"]);

    let sent = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_t/test",
            ACME,
            Some(json!({ "event_type": "order.test", "data": { "n": 1 } })),
        )
        .await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{}", sent.body);
    let envelope = sent.body["envelope_id"].as_str().unwrap();
    let lane = t.ladder.first_lane();
    assert!(wait_until(WAIT, || async { t.depth(&lane).await == 1 }).await);
    let messages = t.take_all(&lane).await;
    let m = &messages[0];
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some(envelope)
    );
    assert_eq!(
        m.properties.kind().as_ref().map(|s| s.as_str()),
        Some("order.test")
    );
    assert_eq!(
        read_str_header(&m.properties, SUBSCRIPTION_HEADER).as_deref(),
        Some("sub_t")
    );
    let body: Value = serde_json::from_slice(&m.data).unwrap();
    assert_eq!(body["data"], json!({ "n": 1 }));

    let not_an_object = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_t/test",
            ACME,
            Some(json!({ "event_type": "order.test", "data": [1] })),
        )
        .await;
    assert_eq!(not_an_object.fields(), ["data"]);

    // A disabled subscription would cancel it.
    api.call(
        Method::PATCH,
        "/v1/subscriptions/sub_t",
        ACME,
        Some(json!({ "enabled": false })),
    )
    .await;
    api.call(Method::POST, "/v1/subscriptions/sub_t/test", ACME, None)
        .await
        .problem(409);
    api.stop().await;
}

/// History rows as `hookrelay history` writes them, for the read routes.
async fn put_history(api: &Api) {
    let pool = api.db.store.pool();
    let today = hookrelay::history::rows::day_of(SystemTime::now());
    for table in ["history_events", "history_attempts"] {
        sqlx::query(&hookrelay::history::rows::create_partition(table, today))
            .execute(pool)
            .await
            .unwrap();
    }
    sqlx::query(
        "INSERT INTO history_events (id, tenant, event_type, accepted_at, stream_offset) VALUES \
         ('evt_a', 'acme', 'order.paid', now() - interval '10 s', 0), \
         ('evt_g', 'globex', 'order.paid', now() - interval '10 s', 1)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO history_attempts (envelope, tenant, subscription, attempt, status, outcome, \
         tier, lane, at, stream_offset) VALUES \
         ('evt_a', 'acme', 'sub_a', 1, 503, 'retried', 'retry-1s', 'l', now() - interval '9 s', 0), \
         ('evt_a', 'acme', 'sub_a', 2, 503, 'retried', 'retry-2s', 'l', now() - interval '8 s', 1), \
         ('evt_a', 'acme', 'sub_a', 3, 204, 'delivered', NULL, 'l', now() - interval '6 s', 2), \
         ('evt_g', 'globex', 'sub_g', 1, 204, 'delivered', NULL, 'l', now() - interval '9 s', 3)",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn history_and_replays_answer_each_tenant_for_its_own_alone() {
    let t = TestLadder::apply("api-history", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    api.create(ADMIN, acme_sub("sub_a")).await;
    api.create(
        ADMIN,
        json!({ "id": "sub_g", "tenant": "globex", "url": "https://hooks.globex.example/in" }),
    )
    .await;
    put_history(&api).await;

    // An event's story: its tenant and an admin see it; another tenant does not.
    for token in [ACME, ADMIN] {
        let story = api.call(Method::GET, "/v1/events/evt_a", token, None).await;
        assert_eq!(story.status, StatusCode::OK, "{}", story.body);
        assert_eq!(story.body["accepted"].as_array().unwrap().len(), 1);
        let steps: Vec<(i64, &str)> = story.body["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["attempt"].as_i64().unwrap(),
                    a["outcome"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(steps, [(1, "retried"), (2, "retried"), (3, "delivered")]);
        assert_eq!(story.body["outcomes"][0]["outcome"], "delivered");
    }
    api.call(Method::GET, "/v1/events/evt_a", GLOBEX, None)
        .await
        .problem(404);
    api.call(Method::GET, "/v1/events/evt_none", ADMIN, None)
        .await
        .problem(404);

    // Attempts, a page at a time, filtered.
    let mut seen = Vec::new();
    let mut path = "/v1/subscriptions/sub_a/attempts?limit=2".to_owned();
    loop {
        let page = api.call(Method::GET, &path, ACME, None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        for a in page.body["data"].as_array().unwrap() {
            seen.push(a["attempt"].as_i64().unwrap());
        }
        match page.body["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/subscriptions/sub_a/attempts?limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, [1, 2, 3]);
    let delivered = api
        .call(
            Method::GET,
            "/v1/subscriptions/sub_a/attempts?outcome=delivered&since=1h",
            ACME,
            None,
        )
        .await;
    assert_eq!(
        delivered.body["data"].as_array().unwrap().len(),
        1,
        "{}",
        delivered.body
    );
    let later = api
        .call(
            Method::GET,
            "/v1/subscriptions/sub_a/attempts?since=7s",
            ACME,
            None,
        )
        .await;
    assert_eq!(
        later.body["data"].as_array().unwrap().len(),
        1,
        "{}",
        later.body
    );
    api.call(
        Method::GET,
        "/v1/subscriptions/sub_a/attempts",
        GLOBEX,
        None,
    )
    .await
    .problem(404);
    let bad = api
        .call(
            Method::GET,
            "/v1/subscriptions/sub_a/attempts?cursor=xyz&limit=0&since=soon",
            ACME,
            None,
        )
        .await;
    bad.problem(422);
    let mut fields = bad.fields();
    fields.sort();
    assert_eq!(fields, ["cursor", "limit", "since"]);

    // Replays: three of acme's events and two of globex's in the archive.
    for (id, tenant, sub) in [
        ("evt_r1", "acme", "sub_a"),
        ("evt_r2", "acme", "sub_a"),
        ("evt_r3", "acme", "sub_a"),
        ("evt_r4", "globex", "sub_g"),
        ("evt_r5", "globex", "sub_g"),
    ] {
        t.publish(&common::event(id, tenant, sub)).await;
    }
    let lane = t.ladder.first_lane();
    assert!(wait_until(WAIT, || async { t.depth(&lane).await == 5 }).await);
    api.call(
        Method::POST,
        "/v1/replays",
        GLOBEX,
        Some(json!({ "from": "1h", "tenant": "acme" })),
    )
    .await
    .problem(404);
    let invalid = api
        .call(
            Method::POST,
            "/v1/replays",
            ACME,
            Some(json!({ "from": "later", "rate": "fast", "type": "order.*.x" })),
        )
        .await;
    invalid.problem(422);
    let mut fields = invalid.fields();
    fields.sort();
    assert_eq!(fields, ["from", "rate", "type"]);

    let started = api
        .call(
            Method::POST,
            "/v1/replays",
            ACME,
            Some(json!({ "from": "1h" })),
        )
        .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.body);
    assert_eq!(started.body["tenant"], "acme", "a tenant replays its own");
    let id = started.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        started.location.as_deref(),
        Some(format!("/v1/replays/{id}").as_str())
    );
    let job = settled(&api, ACME, &id).await;
    assert_eq!(job["state"], "finished", "{job}");
    assert_eq!(job["matched"], 3, "{job}");
    assert_eq!(job["published"], 3, "{job}");
    assert!(wait_until(WAIT, || async { t.depth(&lane).await == 8 }).await);
    api.call(Method::GET, &format!("/v1/replays/{id}"), GLOBEX, None)
        .await
        .problem(404);
    let admin = api
        .call(Method::GET, &format!("/v1/replays/{id}"), ADMIN, None)
        .await;
    assert_eq!(admin.status, StatusCode::OK);

    // At most four at once: paced to one event a second, four are running when a fifth comes.
    let mut running = Vec::new();
    for _ in 0..4 {
        let r = api
            .call(
                Method::POST,
                "/v1/replays",
                ADMIN,
                Some(json!({ "from": "1h", "rate": "1/s", "dry_run": false, "tenant": "globex" })),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
        running.push(r.body["id"].as_str().unwrap().to_owned());
    }
    api.call(
        Method::POST,
        "/v1/replays",
        ADMIN,
        Some(json!({ "from": "1h", "dry_run": true })),
    )
    .await
    .problem(409);
    api.stop().await;
}

/// The seconds a 429 says to wait.
fn retry_after(answer: &Answer) -> u64 {
    answer
        .retry_after
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a 429 without Retry-After: {}", answer.body))
}

#[tokio::test]
async fn tenant_quotas_are_kept_with_409_422_and_429_with_retry_after() {
    let t = TestLadder::apply("api-quotas", &["300ms"], &["300ms"]).await;
    // One write and one test event a minute: a second within the minute is refused whatever
    // the machine's speed.
    let limits = Limits {
        max_subscriptions_per_tenant: 2,
        max_event_types: 3,
        writes_per_minute: 1,
        test_events_per_minute: 1,
        ..Default::default()
    };
    let api = Api::start_limited(Some(broker(&t)), limits).await;

    // event_types: at most 3 entries, reported with the request's other problems.
    let four = json!(["a.1", "a.2", "a.3", "a.4"]);
    let refused = api
        .call(
            Method::POST,
            "/v1/subscriptions",
            ADMIN,
            Some(json!({ "tenant": "acme", "url": "ftp://x", "event_types": four })),
        )
        .await;
    assert_eq!(refused.invalid(), ["event_types", "url"]);
    api.create(
        ADMIN,
        json!({ "id": "sub_1", "tenant": "acme", "url": "https://hooks.acme.example/1",
                "event_types": ["a.1", "a.2", "a.3"] }),
    )
    .await;
    let patched = api
        .call(
            Method::PATCH,
            "/v1/subscriptions/sub_1",
            ADMIN,
            Some(json!({ "event_types": four })),
        )
        .await;
    assert_eq!(patched.invalid(), ["event_types"]);

    // Subscriptions per tenant: 2 for acme, whoever creates them; globex has its own count.
    api.create(ADMIN, acme_sub("sub_2")).await;
    let third = api
        .call(
            Method::POST,
            "/v1/subscriptions",
            ADMIN,
            Some(acme_sub("sub_3")),
        )
        .await;
    let problem = third.problem(409);
    assert_eq!(
        problem["type"], "urn:hookrelay:problem:quota-exceeded",
        "{problem}"
    );
    assert_eq!(api.db.count("subscriptions").await, 2);
    api.create(
        ADMIN,
        json!({ "id": "sub_g", "tenant": "globex", "url": "https://hooks.globex.example/in" }),
    )
    .await;
    // Creates at once for one tenant are counted one after the other: one room, one created.
    let creates = (0..6).map(|i| {
        let body = json!({ "id": format!("sub_g{i}"), "tenant": "globex",
                           "url": "https://hooks.globex.example/in" });
        api.call(Method::POST, "/v1/subscriptions", ADMIN, Some(body))
    });
    let statuses: Vec<u16> = futures_util::future::join_all(creates)
        .await
        .iter()
        .map(|a| a.status.as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        5,
        "{statuses:?}"
    );
    // Deleting one makes room again.
    let deleted = api
        .call(Method::DELETE, "/v1/subscriptions/sub_2", ADMIN, None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    api.create(ADMIN, acme_sub("sub_3")).await;

    // Writes a minute, per tenant: acme's second is refused, with when to try again; reads go
    // on, and neither globex nor an admin is held up.
    let change = |token: &'static str, sub: &'static str| {
        let api = &api;
        async move {
            let body = json!({ "description": "changed" });
            let path = format!("/v1/subscriptions/{sub}");
            api.call(Method::PATCH, &path, token, Some(body)).await
        }
    };
    let first = change(ACME, "sub_1").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let second = change(ACME, "sub_1").await;
    let problem = second.problem(429);
    assert_eq!(
        problem["type"], "urn:hookrelay:problem:rate-limited",
        "{problem}"
    );
    let wait = retry_after(&second);
    assert!((1..=60).contains(&wait), "{wait}");
    for refused in [
        api.call(Method::POST, "/v1/subscriptions/sub_1/pause", ACME, None)
            .await,
        api.call(Method::DELETE, "/v1/subscriptions/sub_1", ACME, None)
            .await,
        api.replay(ACME, json!({ "from": "1h", "dry_run": true }))
            .await,
    ] {
        refused.problem(429);
        retry_after(&refused);
    }
    let read = api
        .call(Method::GET, "/v1/subscriptions/sub_1", ACME, None)
        .await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(
        read.body["description"], "changed",
        "the refused ones changed nothing"
    );
    assert_eq!(read.body["paused"], false);
    let globex = change(GLOBEX, "sub_g").await;
    assert_eq!(globex.status, StatusCode::OK, "{}", globex.body);
    for _ in 0..3 {
        let admin = change(ADMIN, "sub_1").await;
        assert_eq!(admin.status, StatusCode::OK, "{}", admin.body);
    }

    // Test events a minute, counted apart from writes: acme's writes are spent, its first test
    // event goes.
    let sent = api
        .call(Method::POST, "/v1/subscriptions/sub_3/test", ACME, None)
        .await;
    assert_eq!(sent.status, StatusCode::ACCEPTED, "{}", sent.body);
    let again = api
        .call(Method::POST, "/v1/subscriptions/sub_3/test", ACME, None)
        .await;
    again.problem(429);
    assert!((1..=60).contains(&retry_after(&again)));
    let by_admin = api
        .call(Method::POST, "/v1/subscriptions/sub_3/test", ADMIN, None)
        .await;
    assert_eq!(by_admin.status, StatusCode::ACCEPTED, "{}", by_admin.body);
    api.stop().await;
}

/// Polls a replay job until it is no longer running (or [`WAIT`] passes); its last view.
async fn settled(api: &Api, token: &str, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let job = api
            .call(Method::GET, &format!("/v1/replays/{id}"), token, None)
            .await
            .body;
        if job["state"] != "running" || tokio::time::Instant::now() > deadline {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A rate no pace can be made of was once accepted: the job's thread panicked converting it,
/// the job stayed `running` and kept one of the process's replay slots until a restart.
#[tokio::test]
async fn replay_and_resume_rates_and_tenant_windows_are_bounded() {
    let t = TestLadder::apply("api-replay-bounds", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    api.create(ADMIN, acme_sub("sub_a")).await;
    for rate in ["1e-300/s", "1e308/s", "0.0000001/s", "2000000/s", "1e400/s"] {
        for token in [ACME, ADMIN] {
            let refused = api
                .replay(
                    token,
                    json!({ "from": "1h", "rate": rate, "dry_run": true }),
                )
                .await;
            assert_eq!(refused.invalid(), ["rate"], "{rate}");
        }
        let resume = api
            .call(
                Method::POST,
                "/v1/subscriptions/sub_a/resume",
                ACME,
                Some(json!({ "rate": rate })),
            )
            .await;
        assert_eq!(resume.invalid(), ["rate"], "{rate}");
    }
    // A tenant's token replays a bounded window at a bounded pace (api.tenant_replay_window,
    // api.tenant_replay_rate); an admin's is bounded by what a rate can be alone.
    let wide = json!({ "from": "30d", "dry_run": true });
    assert_eq!(api.replay(ACME, wide).await.invalid(), ["from"]);
    let fast = json!({ "from": "1h", "rate": "5000/s", "dry_run": true });
    assert_eq!(api.replay(ACME, fast).await.invalid(), ["rate"]);
    // A time before 1970 is not a time the archive has (and once panicked being written back).
    let ancient = json!({ "from": "100y", "dry_run": true });
    assert_eq!(api.replay(ADMIN, ancient).await.invalid(), ["from"]);
    // Four slots, all free: nothing refused above holds one.
    for _ in 0..4 {
        let started = api
            .replay(
                ADMIN,
                json!({ "from": "30d", "rate": "5000/s", "dry_run": true }),
            )
            .await;
        assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.body);
        let id = started.body["id"].as_str().unwrap();
        let job = settled(&api, ADMIN, id).await;
        assert_eq!(job["state"], "finished", "{job}");
    }
    api.stop().await;
}

#[tokio::test]
async fn replays_are_limited_per_tenant_and_a_tenant_cancels_its_own() {
    let t = TestLadder::apply("api-replay-tenant", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    api.create(ADMIN, acme_sub("sub_a")).await;
    api.create(
        ADMIN,
        json!({ "id": "sub_g", "tenant": "globex", "url": "https://hooks.globex.example/in" }),
    )
    .await;
    for (id, tenant, sub) in [
        ("evt_t1", "acme", "sub_a"),
        ("evt_t2", "acme", "sub_a"),
        ("evt_t3", "globex", "sub_g"),
        ("evt_t4", "globex", "sub_g"),
    ] {
        t.publish(&common::event(id, tenant, sub)).await;
    }
    let lane = t.ladder.first_lane();
    assert!(wait_until(WAIT, || async { t.depth(&lane).await == 4 }).await);
    // One a minute: the first goes at once, the second keeps the job running.
    let slow = json!({ "from": "1h", "rate": "1/m" });
    let start = |token: &'static str| api.replay(token, slow.clone());
    let acme = start(ACME).await;
    assert_eq!(acme.status, StatusCode::ACCEPTED, "{}", acme.body);
    let acme_id = acme.body["id"].as_str().unwrap().to_owned();
    // api.replays_per_tenant (1): acme's second waits for its first; globex is not held up.
    let second = start(ACME).await;
    second.problem(409);
    let globex = start(GLOBEX).await;
    assert_eq!(globex.status, StatusCode::ACCEPTED, "{}", globex.body);
    let globex_id = globex.body["id"].as_str().unwrap().to_owned();

    // Cancelling: another tenant's replay is not found, as on every route.
    let cancel = |id: &str| format!("/v1/replays/{id}/cancel");
    api.call(Method::POST, &cancel(&acme_id), GLOBEX, None)
        .await
        .problem(404);
    api.call(Method::POST, &cancel("rpl_0000000000000000"), ACME, None)
        .await
        .problem(404);
    let cancelled = api.call(Method::POST, &cancel(&acme_id), ACME, None).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.body);
    let job = settled(&api, ACME, &acme_id).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    assert!(job["finished_at"].is_string(), "{job}");
    assert!(
        job["published"].as_u64().unwrap() < 2,
        "stopped before its second event: {job}"
    );
    // Cancelling again says the same; its slot is free again.
    let again = api.call(Method::POST, &cancel(&acme_id), ACME, None).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["state"], "cancelled");
    let next = start(ACME).await;
    assert_eq!(next.status, StatusCode::ACCEPTED, "{}", next.body);
    // An admin cancels anyone's.
    let by_admin = api
        .call(Method::POST, &cancel(&globex_id), ADMIN, None)
        .await;
    assert_eq!(by_admin.status, StatusCode::OK, "{}", by_admin.body);
    assert_eq!(
        settled(&api, GLOBEX, &globex_id).await["state"],
        "cancelled"
    );
    // A replay that ended by itself is not cancelled after the fact.
    let quick = api
        .replay(GLOBEX, json!({ "from": "1h", "dry_run": true }))
        .await;
    assert_eq!(quick.status, StatusCode::ACCEPTED, "{}", quick.body);
    let quick_id = quick.body["id"].as_str().unwrap();
    assert_eq!(settled(&api, GLOBEX, quick_id).await["state"], "finished");
    api.call(Method::POST, &cancel(quick_id), GLOBEX, None)
        .await
        .problem(409);
    api.stop().await;
}

/// Attempt records as a worker publishes them to the attempt log: each envelope delivered.
async fn log_delivered(t: &TestLadder, ids: &[&str]) {
    let records: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({ "envelope": id, "tenant": "acme", "subscription": "sub_a", "attempt": 1,
                    "status": 204, "outcome": "delivered", "lane": "l", "redrives": 0,
                    "at": hookrelay::units::now_rfc3339() })
        })
        .collect();
    let publisher = t.publisher().await;
    publisher
        .send(
            &t.ladder.attempts_exchange(),
            "delivered.acme",
            &serde_json::to_vec(&records).unwrap(),
            BasicProperties::default(),
            false,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    publisher.close().await;
}

#[tokio::test]
async fn an_only_undelivered_replay_past_its_index_bound_fails_saying_so() {
    let t = TestLadder::apply("api-replay-index", &["300ms"], &["300ms"]).await;
    let limits = Limits {
        replay_index_max: 3,
        ..Default::default()
    };
    let api = Api::start_limited(Some(broker(&t)), limits).await;
    for id in ["evt_i1", "evt_i2"] {
        t.publish(&common::event(id, "acme", "sub_a")).await;
    }
    let only_undelivered = json!({ "from": "1h", "only_undelivered": true, "dry_run": true });
    // Within the bound: the log's two deliveries are remembered and skipped.
    log_delivered(&t, &["evt_i1", "evt_i2"]).await;
    let within = api.replay(ADMIN, only_undelivered.clone()).await;
    assert_eq!(within.status, StatusCode::ACCEPTED, "{}", within.body);
    let job = settled(&api, ADMIN, within.body["id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "finished", "{job}");
    assert_eq!(job["delivered_already"], 2, "{job}");
    // Past it: the job fails and says why, rather than holding an index without end.
    log_delivered(&t, &["evt_x1", "evt_x2"]).await;
    let past = api.replay(ADMIN, only_undelivered).await;
    assert_eq!(past.status, StatusCode::ACCEPTED, "{}", past.body);
    let job = settled(&api, ADMIN, past.body["id"].as_str().unwrap()).await;
    assert_eq!(job["state"], "failed", "{job}");
    let error = job["error"].as_str().unwrap();
    assert!(
        error.contains("only_undelivered") && error.contains('3'),
        "{error}"
    );
    assert_eq!(job["published"], 0, "{job}");
    api.stop().await;
}

/// What a worker does for a paused subscription: park its deliveries (`n` of acme's). The
/// parking queue.
async fn park(t: &TestLadder, subscription: &str, n: usize) -> String {
    t.ladder
        .declare_paused_queue(&t.channel, subscription)
        .await
        .unwrap();
    let parking = t.ladder.paused_queue(subscription);
    for i in 0..n {
        let mut headers = FieldTable::default();
        headers.insert(TENANT_HEADER.into(), AMQPValue::LongString("acme".into()));
        headers.insert(
            SUBSCRIPTION_HEADER.into(),
            AMQPValue::LongString(subscription.into()),
        );
        t.channel
            .basic_publish(
                "".into(),
                parking.as_str().into(),
                BasicPublishOptions::default(),
                br#"{"a":1}"#,
                BasicProperties::default()
                    .with_message_id(format!("evt_parked_{i}").into())
                    .with_type("order.paid".into())
                    .with_delivery_mode(2)
                    .with_headers(headers),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let count = u32::try_from(n).unwrap();
    assert!(wait_until(WAIT, || async { t.depth(&parking).await == count }).await);
    parking
}

#[tokio::test]
async fn a_resume_returns_the_parked_deliveries_to_their_lane() {
    let t = TestLadder::apply("api-resume", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    api.create(ADMIN, json!({ "id": "sub_p", "tenant": "acme", "url": "https://hooks.acme.example/p", "paused": true }))
        .await;
    let parking = park(&t, "sub_p", 3).await;

    let resumed = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_p/resume",
            ADMIN,
            Some(json!({ "rate": "100/s" })),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::OK, "{}", resumed.body);
    assert_eq!(resumed.body["returning_parked"], true);
    let lane = t.ladder.first_lane();
    assert!(wait_until(WAIT, || async { t.depth(&lane).await == 3 }).await);
    assert!(wait_until(WAIT, || async { !t.queue_exists(&parking).await }).await);
    api.stop().await;
}

/// One HTTP/1.1 answer read off a raw connection: status, headers (names lower-cased), body.
struct RawAnswer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the server said it closes the connection after this answer.
    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// The next answer on `reader`, or `None` when the server closed the connection first.
async fn read_answer<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<RawAnswer> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut status_line = String::new();
    if reader.read_line(&mut status_line).await.ok()? == 0 {
        return None;
    }
    let status = status_line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.ok()?;
    Some(RawAnswer {
        status,
        headers,
        body,
    })
}

/// A client that keeps its connection after an answer must learn when the server will not:
/// the API once answered 401 before reading a request's body, said nothing, and closed, so the
/// next request a keep-alive client sent on that connection got no answer.
#[tokio::test]
async fn a_refused_request_with_a_body_keeps_its_connection_or_says_it_closes() {
    use tokio::io::{AsyncWriteExt, BufReader};
    let api = Api::start_with(None, 4096).await;
    let addr = api.base.trim_start_matches("http://").to_owned();
    let body = serde_json::to_vec(&acme_sub("sub_k")).unwrap();
    let refused_post = |body_len: usize, token: &str| {
        format!(
            "POST /v1/subscriptions HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n"
        )
    };
    let next = format!(
        "GET /v1/subscriptions HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {ADMIN}\r\n\r\n"
    );
    let wrong = "wrong-token-0123456789abcdef";

    // The body never comes: whatever the server does, it says it closes.
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(refused_post(body.len(), wrong).as_bytes())
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let first = tokio::time::timeout(WAIT, read_answer(&mut reader))
        .await
        .expect("an answer without the body")
        .expect("an answer, not a closed connection");
    assert_eq!(first.status, 401);
    let problem: Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(problem["type"], "urn:hookrelay:problem:unauthorized");
    assert!(
        first.closes(),
        "answered before the body without Connection: close: {:?}",
        first.headers
    );

    // The body comes a moment after the head, the next request right behind it: both are
    // answered, or the first says the connection closes.
    for pause in [Duration::ZERO, Duration::from_millis(200)] {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream
            .write_all(refused_post(body.len(), wrong).as_bytes())
            .await
            .unwrap();
        tokio::time::sleep(pause).await;
        // The server may have answered and closed meanwhile: a failed write is its answer.
        let _ = stream.write_all(&body).await;
        let _ = stream.write_all(next.as_bytes()).await;
        let mut reader = BufReader::new(stream);
        let first = read_answer(&mut reader).await.expect("the 401");
        assert_eq!(first.status, 401, "{pause:?}");
        if !first.closes() {
            let second = tokio::time::timeout(WAIT, read_answer(&mut reader))
                .await
                .expect("an answer or a close");
            let second = second.unwrap_or_else(|| {
                panic!("after {pause:?}: the connection closed without saying so after a 401")
            });
            assert_eq!(second.status, 200, "{pause:?}");
        }
    }

    // A body over api.max_body_bytes is answered 413 before it is read to its end: said too.
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let big = vec![b' '; 64 * 1024];
    stream
        .write_all(refused_post(big.len(), ADMIN).as_bytes())
        .await
        .unwrap();
    let (read_half, mut write_half) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = write_half.write_all(&big).await;
        write_half
    });
    let mut reader = BufReader::new(read_half);
    let first = read_answer(&mut reader).await.expect("the 413");
    assert_eq!(first.status, 413);
    assert!(
        first.closes(),
        "413 without Connection: close: {:?}",
        first.headers
    );
    drop(writer.await);

    // A keep-alive client with a pool of one: every request answered.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    for _ in 0..100 {
        let refused = client
            .post(format!("{}/v1/subscriptions", api.base))
            .bearer_auth(wrong)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let listed = client
            .get(format!("{}/v1/subscriptions", api.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(listed.status(), StatusCode::OK);
    }
    assert_eq!(api.db.count("subscriptions").await, 0);
    api.stop().await;
}

/// `PUT /api/vhost-limits/<vhost>/max-connections`: `Some(n)` sets it, `None` lifts it.
async fn limit_connections(config: &hookrelay::config::Config, vhost: &str, max: Option<u32>) {
    let mut url = config.management.url.expose_url().clone();
    let (user, password) = (url.username().to_owned(), url.password().map(str::to_owned));
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.path_segments_mut()
        .unwrap()
        .extend(["api", "vhost-limits", vhost, "max-connections"]);
    let client = reqwest::Client::new();
    let request = match max {
        Some(n) => client.put(url).json(&json!({ "value": n })),
        None => client.delete(url),
    };
    let answer = request.basic_auth(user, password).send().await.unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
}

/// Resumes once opened a broker connection each, paused or not: 200 concurrent resumes made
/// 200. Here the test's vhost allows two connections, the test's own and the API's: every
/// resume works through the API's one, and only the one that changed `paused` acts.
#[tokio::test]
async fn concurrent_resumes_act_once_on_the_api_connection() {
    let mut config = common::config();
    let vhost = common::unique("vhost");
    let root = common::management(&config);
    root.create_vhost(&vhost).await.unwrap();
    let mut url = config.amqp.url.expose_url().clone();
    url.set_path(&format!("/{vhost}"));
    config.amqp.url = hookrelay::config::SecretUrl::parse(url.as_str()).unwrap();
    let t = TestLadder::apply_on(
        config.clone(),
        "api-resumes",
        hookrelay::contract::ladder::QueueType::Quorum,
        &["300ms"],
        &["300ms"],
    )
    .await;
    // Above the 200 resumes this makes: a tenant's writes a minute are not what is tested.
    let limits = Limits {
        writes_per_minute: 1_000,
        ..Default::default()
    };
    let api = Api::start_limited(Some(broker(&t)), limits).await;
    api.create(ADMIN, json!({ "id": "sub_p", "tenant": "acme", "url": "https://hooks.acme.example/p", "paused": true }))
        .await;
    api.create(ADMIN, acme_sub("sub_live")).await;
    let parking = park(&t, "sub_p", 3).await;
    limit_connections(&config, &vhost, Some(2)).await;

    let resumes = (0..200).map(|i| {
        let path = if i % 2 == 0 {
            "/v1/subscriptions/sub_p/resume"
        } else {
            "/v1/subscriptions/sub_live/resume"
        };
        api.call(Method::POST, path, ACME, Some(json!({ "rate": "100/s" })))
    });
    let answers = futures_util::future::join_all(resumes).await;
    let mut returning = 0;
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.body["subscription"]["paused"], false);
        if answer.body["returning_parked"] == true {
            returning += 1;
            assert_eq!(answer.body["subscription"]["id"], "sub_p");
        }
    }
    assert_eq!(
        returning, 1,
        "only the resume that changed paused returns parked deliveries"
    );
    let lane = t.ladder.first_lane();
    assert!(
        wait_until(WAIT, || async { t.depth(&lane).await == 3 }).await,
        "the parked deliveries came back (through the API's connection: the vhost allows no other)"
    );
    assert!(wait_until(WAIT, || async { !t.queue_exists(&parking).await }).await);
    // Once resumed, a resume changes nothing.
    let again = api
        .call(Method::POST, "/v1/subscriptions/sub_p/resume", ACME, None)
        .await;
    assert_eq!(again.body["returning_parked"], false, "{}", again.body);
    api.stop().await;
    limit_connections(&config, &vhost, None).await;
    drop(t);
    root.delete_vhost(&vhost).await.unwrap();
}

#[tokio::test]
async fn the_served_openapi_document_is_the_checked_in_one() {
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json"))
            .expect("docs/openapi.json");
    let generated = hookrelay::api::openapi::document();
    assert!(
        checked_in == generated,
        "docs/openapi.json is out of date: run `cargo run -- api openapi > docs/openapi.json`"
    );
    let api = Api::start().await;
    let served = api
        .client
        .get(format!("{}/v1/openapi.json", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(served, checked_in);
    let doc: Value = serde_json::from_str(&served).unwrap();
    for path in [
        "/v1/subscriptions",
        "/v1/subscriptions/{id}",
        "/v1/subscriptions/{id}/pause",
        "/v1/subscriptions/{id}/resume",
        "/v1/subscriptions/{id}/secrets/rotate",
        "/v1/subscriptions/{id}/test",
        "/v1/replays",
        "/v1/replays/{id}",
        "/v1/replays/{id}/cancel",
    ] {
        assert!(doc["paths"][path].is_object(), "{path}");
    }
    api.stop().await;
}

/// Runs schemathesis (the version `tools/schemathesis` pins, installed under target/) against
/// the API, with the admin token and a broker so that test events and resumes are served (no
/// broker is a documented 503), over every phase: examples, coverage, fuzzing, stateful.
///
/// Checks: all of them but two, which report rules the OpenAPI document cannot say
/// (docs/api.md, "Fuzzed"), not defects:
/// - `positive_data_acceptance`: schema-valid requests refused with 422, such as the same
///   `Idempotency-Key` with another body, both `expire_old_after` and `old_expires_at`, a test
///   event of a type the subscription does not receive, a cursor this API never gave, a URL the
///   egress policy refuses.
/// - `ensure_resource_availability`: a create replayed with its `Idempotency-Key` after the
///   subscription was deleted gets the first answer again, by design; schemathesis's stateful
///   phase replays scenarios against the same database, and reads that as a created resource
///   that is not found.
///
/// So any 5xx fails it, and so does an answer that does not match the document (status, content
/// type, headers, body schema), a schema-invalid request that is accepted, a request without
/// the token that is not refused, a deleted subscription still found.
///
/// Bounded by time (40 s of testing; the first run also installs schemathesis), with a fixed seed
/// and one worker so that a failure can be replayed (`--seed 1`; the number of cases still
/// depends on the machine's speed).
#[tokio::test]
async fn schemathesis_finds_no_server_error() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/schemathesis");
    let installed = tokio::process::Command::new(script)
        .output()
        .await
        .unwrap_or_else(|e| panic!("could not run {script}: {e}"));
    assert!(
        installed.status.success(),
        "{script} could not install schemathesis ({}):\n{}",
        installed.status,
        String::from_utf8_lossy(&installed.stderr)
    );
    let exe = String::from_utf8(installed.stdout).unwrap();
    let exe = exe.trim();
    assert!(!exe.is_empty(), "{script} printed no path");

    let t = TestLadder::apply("api-schemathesis", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    // Its working directory: where it would leave anything it writes.
    let work = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let run = tokio::process::Command::new(exe)
        .current_dir(work.path())
        .arg("run")
        .arg(format!("{}/v1/openapi.json", api.base))
        .args(["-H", &format!("Authorization: Bearer {ADMIN}")])
        .args(["--checks", "all"])
        .args([
            "--exclude-checks",
            "positive_data_acceptance,ensure_resource_availability",
        ])
        .args(["--max-time", "40", "--workers", "1", "--seed", "1"])
        .args(["--generation-database", "none", "--no-color"])
        .kill_on_drop(true)
        .output();
    let run = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("schemathesis did not finish within 300 s")
        .unwrap_or_else(|e| panic!("could not run {exe}: {e}"));
    let elapsed = started.elapsed();
    api.stop().await;
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.success(),
        "schemathesis failed ({}, after {elapsed:.0?}):\n{output}",
        run.status
    );
    // The summary, for the log of a passing run.
    for line in output.lines().filter(|l| l.contains("generated,")) {
        eprintln!("schemathesis, {elapsed:.0?}:{line}");
    }
}

/// A token endpoint on loopback that issues `token` to anyone, for an hour.
async fn token_endpoint(token: &'static str) -> String {
    let app = axum::Router::new().route(
        "/token",
        axum::routing::post(move || async move {
            format!(r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":3600}}"#)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/token")
}

#[tokio::test]
async fn headers_endpoint_auth_and_v1a_keys_are_stored_sealed_never_shown_and_delivered() {
    use hookrelay_tools::receiver::{Receiver, Reply};
    const API_KEY: &str = "k_live_5e0b7a0c2d9f4e13";
    const CLIENT_SECRET: &str = "cs_8d1f60a2b7e94c55";
    const TOKEN: &str = "at_a93c1e7b4f2d0856";
    let t = TestLadder::apply("api-auth", &["300ms"], &["300ms"]).await;
    let policy = common::egress::allowing(&["127.0.0.0/8"]);
    let api = Api::start_with_policy(Some(broker(&t)), 64 * 1024, policy).await;
    let receiver = Receiver::start(&[], |req| {
        let header = |name: &str| {
            req.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
        };
        if header("x-api-key") == API_KEY && header("authorization") == format!("Bearer {TOKEN}") {
            Reply::Status(204)
        } else {
            Reply::Status(401)
        }
    })
    .await
    .unwrap();
    let token_url = token_endpoint(TOKEN).await;

    let create = |id: &str| {
        json!({
            "id": id, "tenant": "acme", "url": receiver.url("/hook"),
            "signatures": ["v1", "v1a"],
            "headers": { "X-Team": "orders", "X-Api-Key": { "secret": API_KEY } },
            "oauth2": { "token_url": token_url, "client_id": "hookrelay", "client_secret": CLIENT_SECRET, "scope": "hooks" },
        })
    };
    let created = api.create(ADMIN, create("sub_auth")).await;
    let whsec = created["secret"].as_str().unwrap().to_owned();
    let whpk = created["public_key"].as_str().unwrap().to_owned();
    assert!(
        whsec.starts_with("whsec_") && whpk.starts_with("whpk_"),
        "{created}"
    );
    let view = &created["subscription"];
    assert_eq!(view["headers"]["x-team"], json!({ "value": "orders" }));
    assert_eq!(view["headers"]["x-api-key"], json!({ "secret": true }));
    assert_eq!(view["oauth2"]["client_id"], "hookrelay");
    assert_eq!(view["oauth2"]["auth_method"], "basic");
    let keys: Vec<&Value> = view["secrets"].as_array().unwrap().iter().collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys.iter()
            .filter(|k| k["public_key"] == json!(whpk))
            .count(),
        1
    );
    // Neither the answer nor a read, nor anything the database holds, has a secret value.
    let read = api
        .call(Method::GET, "/v1/subscriptions/sub_auth", ACME, None)
        .await;
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT coalesce(encode(sealed, 'escape'), reference, '') || ' ' || purpose \
         FROM subscription_secrets UNION ALL SELECT request::text FROM subscriptions",
    )
    .fetch_all(api.db.store.pool())
    .await
    .unwrap();
    for place in [
        created.to_string(),
        read.body.to_string(),
        stored.join("\n"),
    ] {
        assert!(
            !place.contains(API_KEY) && !place.contains(CLIENT_SECRET),
            "{place}"
        );
    }
    assert!(
        stored.iter().any(|s| s.ends_with(" header:x-api-key")),
        "{stored:?}"
    );

    // A worker following the store delivers with them: the header opened from its sealed row,
    // a token from the token endpoint, and v1 and v1a signatures.
    let worker = {
        let (first, _) = api.db.store.load_all().await.unwrap();
        let mut setup = hookrelay::delivery::worker::WorkerSetup::new(
            t.config.clone(),
            t.ladder.clone(),
            hookrelay::subscriptions::LiveSubscriptions::followed(first),
        );
        setup.secrets =
            SecretStore::new(Duration::from_millis(100)).with_keyring(Arc::clone(&api.keyring));
        common::RunningWorker::launch(&t, setup).await
    };
    t.publish(&common::event("evt_auth", "acme", "sub_auth"))
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await,
        "{:?}",
        receiver
            .records()
            .iter()
            .map(|r| r.status)
            .collect::<Vec<_>>()
    );
    worker.stop().await;
    let record = receiver.records().pop().unwrap();
    assert_eq!(
        record.headers.get("x-team").and_then(|v| v.to_str().ok()),
        Some("orders")
    );
    let mut headers = reqwest::header::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        headers.insert(name, record.headers[name].clone());
    }
    standardwebhooks::Webhook::new(&whsec)
        .unwrap()
        .verify(&record.body, &headers)
        .unwrap();
    {
        use base64::Engine;
        use base64::engine::general_purpose::STANDARD;
        use ed25519_dalek::{Signature, Verifier, VerifyingKey};
        let public: [u8; 32] = STANDARD
            .decode(whpk.trim_start_matches("whpk_"))
            .unwrap()
            .try_into()
            .unwrap();
        let v1a = record
            .signature
            .split(' ')
            .find_map(|s| s.strip_prefix("v1a,"))
            .unwrap();
        let mut message = format!("{}.{}.", record.id, record.timestamp.unwrap()).into_bytes();
        message.extend_from_slice(&record.body);
        VerifyingKey::from_bytes(&public)
            .unwrap()
            .verify(
                &message,
                &Signature::from_slice(&STANDARD.decode(v1a).unwrap()).unwrap(),
            )
            .unwrap();
    }

    // Refusals name the field: a reserved header, two sources of Authorization, a client
    // certificate that is not PEM, or for an http:// endpoint.
    for (body, field) in [
        (
            json!({ "headers": { "Webhook-Id": "x" } }),
            "headers.Webhook-Id",
        ),
        (
            json!({ "basic_auth": { "username": "u", "password": "p" },
                    "oauth2": { "token_url": token_url, "client_id": "c", "client_secret": "s" } }),
            "basic_auth",
        ),
        (
            json!({ "tls": { "cert": "-----BEGIN CERTIFICATE-----", "key": "nope" } }),
            "tls.key",
        ),
        (
            json!({ "oauth2": { "token_url": "http://169.254.169.254/token", "client_id": "c", "client_secret": "s" } }),
            "oauth2.token_url",
        ),
        (json!({ "signatures": [] }), "signatures"),
    ] {
        let mut request = json!({ "tenant": "acme", "url": receiver.url("/x") });
        for (k, v) in body.as_object().unwrap() {
            request[k] = v.clone();
        }
        let refused = api
            .call(Method::POST, "/v1/subscriptions", ACME, Some(request))
            .await;
        refused.problem(422);
        assert_eq!(refused.fields(), [field], "{}", refused.body);
    }

    // A change replaces what it names: headers removed, their secret rows with them.
    let changed = api
        .call(
            Method::PATCH,
            "/v1/subscriptions/sub_auth",
            ACME,
            Some(json!({ "headers": null })),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    assert_eq!(changed.body.get("headers"), None);
    let header_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM subscription_secrets WHERE purpose LIKE 'header:%'",
    )
    .fetch_one(api.db.store.pool())
    .await
    .unwrap();
    assert_eq!(header_rows, 0);

    // Rotating to v1a alone: a public key, no shared secret; both sign until the old expire.
    let rotated = api
        .call(
            Method::POST,
            "/v1/subscriptions/sub_auth/secrets/rotate",
            ACME,
            Some(json!({ "signatures": ["v1a"], "expire_old_after": "1h" })),
        )
        .await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    assert_eq!(rotated.body.get("secret"), None);
    assert!(
        rotated.body["public_key"]
            .as_str()
            .unwrap()
            .starts_with("whpk_")
    );
    assert_eq!(
        rotated.body["subscription"]["secrets"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    api.stop().await;
}

#[tokio::test]
async fn headers_of_the_connection_and_credentials_in_urls_are_refused() {
    let api = Api::start().await;
    for header in [
        "Proxy-Authorization",
        "Expect",
        "Upgrade",
        "Keep-Alive",
        "Trailer",
        "TE",
        "Proxy-Connection",
    ] {
        let answer = api
            .call(
                Method::POST,
                "/v1/subscriptions",
                ADMIN,
                Some(json!({
                    "tenant": "acme", "url": "https://hooks.acme.example/in",
                    "headers": { header: "x" },
                })),
            )
            .await;
        answer.refused(&format!("headers.{header}"), "reserved");
    }
    // Credentials in a URL would be stored and shown in clear: refused, pointing to where they
    // belong, without repeating them.
    for (body, field, says) in [
        (
            json!({ "tenant": "acme", "url": "https://hook:hunter2@hooks.acme.example/in" }),
            "url",
            "basic_auth",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hook@hooks.acme.example/in" }),
            "url",
            "basic_auth",
        ),
        (
            json!({ "tenant": "acme", "url": "https://hooks.acme.example/in",
                    "oauth2": { "token_url": "https://c:hunter2@hooks.acme.example/token",
                                "client_id": "c", "client_secret": "s" } }),
            "oauth2.token_url",
            "client_secret",
        ),
    ] {
        let answer = api
            .call(Method::POST, "/v1/subscriptions", ADMIN, Some(body))
            .await;
        let problem = answer.refused(field, says);
        assert!(!problem.to_string().contains("hunter2"), "{problem}");
    }
    assert_eq!(api.db.count("subscriptions").await, 0);

    // A change is refused alike, and changes nothing.
    api.create(ADMIN, acme_sub("sub_a")).await;
    for body in [
        json!({ "url": "https://hook:hunter2@hooks.acme.example/in" }),
        json!({ "headers": { "Proxy-Authorization": "Basic eDp5" } }),
        json!({ "oauth2": { "token_url": "https://c:hunter2@hooks.acme.example/token",
                            "client_id": "c", "client_secret": "s" } }),
    ] {
        api.call(
            Method::PATCH,
            "/v1/subscriptions/sub_a",
            ADMIN,
            Some(body.clone()),
        )
        .await
        .problem(422);
    }
    let after = api
        .call(Method::GET, "/v1/subscriptions/sub_a", ADMIN, None)
        .await;
    assert_eq!(after.body["url"], "https://hooks.acme.example/in");
    assert_eq!(after.body.get("headers"), None);
    assert_eq!(after.body.get("oauth2"), None);
    api.stop().await;
}

#[tokio::test]
async fn another_tenants_ids_are_answered_as_unknown_ones() {
    let t = TestLadder::apply("api-unknown-ids", &["300ms"], &["300ms"]).await;
    let api = Api::start_with(Some(broker(&t)), 64 * 1024).await;
    api.create(
        ADMIN,
        json!({ "id": "sub_g", "tenant": "globex", "url": "https://hooks.globex.example/in" }),
    )
    .await;

    // An id another tenant took answers as an id nobody took: a tenant token names none.
    let create = |id: &str| {
        api.call(
            Method::POST,
            "/v1/subscriptions",
            ACME,
            Some(json!({ "id": id, "url": "https://hooks.acme.example/in" })),
        )
    };
    let taken = create("sub_g").await;
    let free = create("sub_free").await;
    assert_eq!(
        (taken.status, free.status),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::UNPROCESSABLE_ENTITY
        ),
        "{} / {}",
        taken.body,
        free.body
    );
    assert_eq!(taken.fields(), ["id"]);
    assert_eq!(taken.body, free.body);
    assert_eq!(api.db.count("subscriptions").await, 1);
    // An admin sees every tenant: to it a taken id is a conflict.
    api.call(
        Method::POST,
        "/v1/subscriptions",
        ADMIN,
        Some(json!({ "id": "sub_g", "tenant": "acme", "url": "https://hooks.acme.example/in" })),
    )
    .await
    .problem(409);

    // A replay naming another tenant's subscription is started as one naming an unknown one:
    // a tenant's replay reads its own tenant's events only, so both find nothing. (One after
    // the other: a tenant runs one replay at a time, api.replays_per_tenant.)
    for sub in ["sub_g", "sub_none"] {
        let started = api
            .call(
                Method::POST,
                "/v1/replays",
                ACME,
                Some(json!({ "from": "1h", "subscription": sub })),
            )
            .await;
        assert_eq!(
            started.status,
            StatusCode::ACCEPTED,
            "{sub}: {}",
            started.body
        );
        assert_eq!(started.body["tenant"], "acme");
        let id = started.body["id"].as_str().unwrap().to_owned();
        let job = api.replay_once_done(&id, ACME).await;
        assert_eq!(job["state"], "finished", "{job}");
        assert_eq!(job["published"], 0, "{job}");
    }

    // Attempts: another tenant's subscription and a missing one are answered alike, and
    // take the same path: both read history.
    let theirs = api
        .call(Method::GET, "/v1/subscriptions/sub_g/attempts", ACME, None)
        .await;
    let missing = api
        .call(
            Method::GET,
            "/v1/subscriptions/sub_none/attempts",
            ACME,
            None,
        )
        .await;
    theirs.problem(404);
    assert_eq!(theirs.body, missing.body);
    api.stop().await;

    let without_history = Api::start_with_options(Options {
        history: false,
        ..Options::default()
    })
    .await;
    without_history
        .create(
            ADMIN,
            json!({ "id": "sub_g", "tenant": "globex", "url": "https://hooks.globex.example/in" }),
        )
        .await;
    for id in ["sub_g", "sub_none"] {
        without_history
            .call(
                Method::GET,
                &format!("/v1/subscriptions/{id}/attempts"),
                ACME,
                None,
            )
            .await
            .problem(503);
    }
    without_history.stop().await;
}

#[tokio::test]
async fn slow_name_lookups_hold_no_database_connection() {
    // Lookups of slow.acme.example wait until the test lets them answer.
    let gated = Arc::new(common::egress::GatedLookup::new(
        "slow.acme.example",
        &["93.184.215.16"],
        lookup(),
    ));
    let api = Api::start_with_options(Options {
        lookup: gated.clone(),
        lookup_timeout: Duration::from_secs(600),
        ..Options::default()
    })
    .await;
    for n in 1..=4 {
        api.create(ADMIN, acme_sub(&format!("sub_u{n}"))).await;
    }
    api.create(
        ADMIN,
        json!({ "id": "sub_g", "tenant": "globex", "url": "https://hooks.globex.example/in" }),
    )
    .await;

    // As many creates and changes as the pool has connections (8), each waiting on the name.
    let send = |method: Method, path: String, body: Value| {
        let request = api
            .client
            .request(method, format!("{}{path}", api.base))
            .bearer_auth(ACME)
            .json(&body);
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        })
    };
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(send(
            Method::POST,
            "/v1/subscriptions".into(),
            json!({ "url": "https://slow.acme.example/in" }),
        ));
    }
    for n in 1..=4 {
        slow.push(send(
            Method::PATCH,
            format!("/v1/subscriptions/sub_u{n}"),
            json!({ "url": "https://slow.acme.example/in" }),
        ));
    }
    assert!(wait_until(WAIT, || async { gated.held() == 8 }).await);

    // Meanwhile another tenant is answered, and so is a change of a subscription being
    // changed slowly.
    let list = api
        .call(Method::GET, "/v1/subscriptions", GLOBEX, None)
        .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let read = api
        .call(Method::GET, "/v1/subscriptions/sub_g", GLOBEX, None)
        .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let meanwhile = api
        .call(
            Method::PATCH,
            "/v1/subscriptions/sub_u1",
            ADMIN,
            Some(json!({ "description": "changed meanwhile" })),
        )
        .await;
    assert_eq!(meanwhile.status, StatusCode::OK, "{}", meanwhile.body);
    assert!(
        slow.iter().all(|s| !s.is_finished()),
        "the slow ones are still waiting on the name"
    );

    gated.open();
    let mut statuses = Vec::new();
    for s in slow {
        let (status, body) = s.await.unwrap();
        statuses.push(status.as_u16());
        assert!(status.is_success(), "{status}: {body}");
    }
    assert_eq!(statuses, [201, 201, 201, 201, 200, 200, 200, 200]);
    // The slow change applied on top of the one made meanwhile, not over it.
    let after = api
        .call(Method::GET, "/v1/subscriptions/sub_u1", ADMIN, None)
        .await;
    assert_eq!(after.body["url"], "https://slow.acme.example/in");
    assert_eq!(after.body["description"], "changed meanwhile");
    api.stop().await;
}

/// Copies the sealed value of (`from`, `from_purpose`) over that of (`to`, `to_purpose`).
async fn move_sealed(api: &Api, from: (&str, &str), to: (&str, &str)) {
    let moved = sqlx::query(
        "UPDATE subscription_secrets SET sealed = (SELECT sealed FROM subscription_secrets \
         WHERE subscription_id = $1 AND purpose = $2) WHERE subscription_id = $3 AND purpose = $4",
    )
    .bind(from.0)
    .bind(from.1)
    .bind(to.0)
    .bind(to.1)
    .execute(api.db.store.pool())
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(moved, 1);
}

#[tokio::test]
async fn a_sealed_value_opens_only_in_its_own_row_field_and_tenant() {
    let api = Api::start().await;
    let with_secrets = |id: &str| {
        json!({
            "id": id, "tenant": "acme", "url": "https://hooks.acme.example/in",
            "headers": { "X-Api-Key": { "secret": format!("key-of-{id}") } },
            "basic_auth": { "username": "u", "password": format!("password-of-{id}") },
        })
    };
    for id in ["sub_field", "sub_row", "sub_other", "sub_tenant"] {
        api.create(ADMIN, with_secrets(id)).await;
    }
    let secrets = SecretStore::new(Duration::ZERO).with_keyring(Arc::clone(&api.keyring));
    let problems = |id: &'static str| {
        let (secrets, api) = (&secrets, &api);
        async move {
            let (subs, rows) = api.db.store.load_all().await.unwrap();
            assert!(rows.is_empty(), "{rows:?}");
            secrets
                .problems_of(subs.get(id).unwrap())
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        }
    };
    for id in ["sub_field", "sub_row", "sub_tenant"] {
        assert_eq!(problems(id).await, Vec::<String>::new());
    }

    // Another field of the same subscription: the header's key as the password.
    move_sealed(
        &api,
        ("sub_field", "header:x-api-key"),
        ("sub_field", "basic_auth.password"),
    )
    .await;
    // Another subscription's row.
    move_sealed(
        &api,
        ("sub_other", "basic_auth.password"),
        ("sub_row", "basic_auth.password"),
    )
    .await;
    // Another tenant: the row moved whole.
    sqlx::query("UPDATE subscriptions SET tenant = 'globex' WHERE id = 'sub_tenant'")
        .execute(api.db.store.pool())
        .await
        .unwrap();
    for (id, count) in [("sub_field", 1), ("sub_row", 1), ("sub_tenant", 3)] {
        let found = problems(id).await;
        assert_eq!(found.len(), count, "{id}: {found:?}");
        for p in found {
            assert!(p.contains("does not open"), "{id}: {p}");
            assert!(!p.contains("password-of") && !p.contains("key-of"), "{p}");
        }
    }

    // A remembered create answer holds a reference to the secret's row, not the secret sealed,
    // and gives the secret only to the tenant it was created for.
    let body = serde_json::to_vec(&json!({ "url": "https://hooks.acme.example/i" })).unwrap();
    let key = [("idempotency-key", "create-1")];
    let first = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ACME),
            Some(body.clone()),
            &key,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let stored: Value = sqlx::query_scalar("SELECT body FROM idempotency_keys")
        .fetch_one(api.db.store.pool())
        .await
        .unwrap();
    assert_eq!(stored.get("secret"), None, "{stored}");
    assert_eq!(stored.get("sealed_secret"), None, "{stored}");
    let again = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ACME),
            Some(body.clone()),
            &key,
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body, first.body);
    // An answer remembered as earlier versions kept it, the secret sealed in it for the
    // subscription id alone, is still given again.
    let id = first.body["subscription"]["id"].as_str().unwrap();
    let secret = first.body["secret"].as_str().unwrap();
    let mut legacy = first.body.clone();
    legacy.as_object_mut().unwrap().remove("secret");
    legacy["sealed_secret"] = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .encode(common::seal_old_form(&api.key, id, secret.as_bytes()))
            .into()
    };
    sqlx::query("UPDATE idempotency_keys SET body = $1")
        .bind(&legacy)
        .execute(api.db.store.pool())
        .await
        .unwrap();
    let old_form = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ACME),
            Some(body.clone()),
            &key,
        )
        .await;
    assert_eq!(old_form.status, StatusCode::OK, "{}", old_form.body);
    assert_eq!(old_form.body, first.body);
    // The remembered answer moved to globex's keys: not globex's to see.
    sqlx::query("UPDATE idempotency_keys SET scope = 'tenant:globex'")
        .execute(api.db.store.pool())
        .await
        .unwrap();
    let moved = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(GLOBEX),
            Some(body.clone()),
            &key,
        )
        .await;
    assert!(!moved.body.to_string().contains(secret), "{}", moved.body);
    moved.problem(500);
    // Once the secret's row is gone, the first answer cannot be given again.
    sqlx::query("UPDATE idempotency_keys SET scope = 'tenant:acme', body = $1")
        .bind(&stored)
        .execute(api.db.store.pool())
        .await
        .unwrap();
    api.call(
        Method::DELETE,
        &format!("/v1/subscriptions/{id}"),
        ACME,
        None,
    )
    .await;
    let gone = api
        .raw(
            Method::POST,
            "/v1/subscriptions",
            Some(ACME),
            Some(body),
            &key,
        )
        .await;
    gone.problem(409);
    assert!(!gone.body.to_string().contains(secret), "{}", gone.body);
    api.stop().await;
}

/// The catalog of event types: an admin writes it (a new schema is a new version), every
/// token reads it, a tenant's write is 403, unknown names are 404, and hostile schemas and
/// examples their schema refuses are 422 naming the field. Nothing is fetched: the remote
/// `$ref` points at an address that would not answer.
#[tokio::test]
async fn the_catalog_is_written_by_admins_read_by_tenants_and_refuses_hostile_schemas() {
    let api = Api::start().await;
    let path = "/v1/event-types/order.paid";
    let body = |schema: Value, example: Value| json!({"description": "An order was paid", "mode": "enforce", "schema": schema, "example": example});
    let schema =
        json!({"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}});
    let created = api
        .call(
            Method::PUT,
            path,
            ADMIN,
            Some(body(schema.clone(), json!({"id": "o1"}))),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["versions"][0]["version"], 1);
    // The same schema again changes the type in place; a new one is the next version.
    let same = api
        .call(
            Method::PUT,
            path,
            ADMIN,
            Some(body(schema.clone(), json!({"id": "o1"}))),
        )
        .await;
    assert_eq!(same.status, StatusCode::OK, "{}", same.body);
    assert_eq!(same.body["versions"].as_array().unwrap().len(), 1);
    let v2 = json!({"type": "object", "required": ["id", "amount"]});
    let changed = api
        .call(
            Method::PUT,
            path,
            ADMIN,
            Some(body(v2, json!({"id": "o1", "amount": 2}))),
        )
        .await;
    assert_eq!(
        changed.body["versions"][1]["version"], 2,
        "{}",
        changed.body
    );

    // Tenants read it, and cannot write it.
    let read = api.call(Method::GET, path, ACME, None).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body["mode"], "enforce");
    let listed = api.call(Method::GET, "/v1/event-types", GLOBEX, None).await;
    assert_eq!(listed.body["data"][0]["name"], "order.paid");
    let tenant_write = api
        .call(
            Method::PUT,
            "/v1/event-types/order.new",
            ACME,
            Some(body(schema.clone(), json!({"id": "o"}))),
        )
        .await;
    tenant_write.problem(403);
    api.call(Method::DELETE, path, ACME, None)
        .await
        .problem(403);
    assert_eq!(api.db.count("event_types").await, 1);
    // Unknown, and impossible, names are not found.
    api.call(Method::GET, "/v1/event-types/order.none", ACME, None)
        .await
        .problem(404);
    api.call(Method::GET, "/v1/event-types/a%20b", ADMIN, None)
        .await
        .problem(404);
    api.call(Method::DELETE, "/v1/event-types/order.none", ADMIN, None)
        .await
        .problem(404);

    // Hostile schemas and wrong examples: 422 naming the field, nothing stored.
    let mut deep = json!({"type": "string"});
    for _ in 0..40 {
        deep = json!({"type": "object", "properties": {"a": deep}});
    }
    let huge: Vec<u32> = (0..5_000).collect();
    let refusals = [
        (deep, json!({}), "schema", "nested deeper than 32 levels"),
        (
            json!({"enum": huge}),
            json!(1),
            "schema",
            "lists 5000 values",
        ),
        (
            json!({"properties": {"a": {"$ref": "http://10.255.255.1/schema.json"}}}),
            json!({}),
            "schema",
            "only references within the schema",
        ),
        (
            json!({"$schema": "http://json-schema.org/draft-07/schema#"}),
            json!({}),
            "schema",
            "draft 2020-12",
        ),
        (
            json!({"pattern": "^(a)\\1$"}),
            json!("aa"),
            "schema",
            "does not compile",
        ),
        (schema.clone(), json!({"id": 3}), "example", "at \"/id\""),
    ];
    for (schema, example, field, says) in refusals {
        api.call(
            Method::PUT,
            "/v1/event-types/order.hostile",
            ADMIN,
            Some(body(schema, example)),
        )
        .await
        .refused(field, says);
    }
    api.call(
        Method::PUT,
        "/v1/event-types/order.*",
        ADMIN,
        Some(body(json!({}), json!({}))),
    )
    .await
    .refused("name", "");
    api.call(
        Method::PUT,
        "/v1/event-types/order.nul",
        ADMIN,
        Some(json!({"description": "a\u{0}b", "schema": {}, "example": null})),
    )
    .await
    .refused("description", "control characters");
    assert_eq!(api.db.count("event_types").await, 1);
    assert_eq!(api.db.count("event_type_versions").await, 2);

    let deleted = api.call(Method::DELETE, path, ADMIN, None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(api.db.count("event_type_versions").await, 0);
    api.stop().await;
}
