//! `hookrelay api` with its pages over a database of the test's own, on 127.0.0.1:0, for the
//! page tests (over HTTP) and the browser tests.

use std::sync::Arc;

use hookrelay::api::auth::Tokens;
use hookrelay::api::validate::Egress;
use hookrelay::api::{ApiSetup, BrokerSetup, PagesSetup};
use hookrelay::delivery::egress::EgressPolicy;
use hookrelay::store::PgStore;
use hookrelay::subscriptions::seal::{Keyring, generate_key};
use tokio::sync::oneshot;

use super::egress::StaticLookup;
use super::pg::TestDb;

pub const ADMIN: &str = "admin-token-0123456789abcdef";
pub const ACME: &str = "acme-token-0123456789abcdef";
pub const GLOBEX: &str = "globex-token-0123456789abcdef";

/// A running API and its pages.
pub struct Site {
    pub base: String,
    pub store: PgStore,
    pub client: reqwest::Client,
    /// What the API seals secrets with (a worker opens them with it).
    pub keyring: Arc<Keyring>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    _db: TestDb,
}

impl Site {
    pub async fn start(broker: Option<BrokerSetup>) -> Self {
        Self::start_with(broker, PagesSetup::default(), EgressPolicy::default()).await
    }

    pub async fn start_with(
        broker: Option<BrokerSetup>,
        pages: PagesSetup,
        policy: EgressPolicy,
    ) -> Self {
        let db = TestDb::create().await;
        let store = db.store().await;
        let key = generate_key();
        let keyring = Arc::new(Keyring::from_base64(&[&key]).unwrap());
        let setup = ApiSetup {
            pool: store.pool().clone(),
            keyring: Arc::clone(&keyring),
            tokens: Tokens::from_plain(&[
                (ADMIN, None),
                (ACME, Some("acme")),
                (GLOBEX, Some("globex")),
            ]),
            egress: Egress::new(
                policy,
                Arc::new(StaticLookup::default()),
                std::time::Duration::from_secs(2),
            ),
            max_body: 64 * 1024,
            broker,
            history: Some(store.pool().clone()),
            limits: Default::default(),
            pages,
        };
        let (app, state) = hookrelay::web::app(setup);
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
            store,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            keyring,
            stop: Some(stop),
            served: Some(served),
            _db: db,
        }
    }

    /// A one-time portal link asked for with `token` and `body`: (status, answer).
    pub async fn portal_link(
        &self,
        token: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let answer = self
            .client
            .post(format!("{}/v1/portal-links", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or_default())
    }

    /// A worker on `t`'s broker delivering this site's subscriptions as the store holds them
    /// now (every row readable), opening their secrets with the site's keyring.
    pub async fn worker(&self, t: &super::TestLadder) -> super::RunningWorker {
        let (first, problems) = self.store.load_all().await.unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let mut setup = hookrelay::delivery::worker::WorkerSetup::new(
            t.config.clone(),
            t.ladder.clone(),
            hookrelay::subscriptions::LiveSubscriptions::followed(first),
        );
        setup.secrets =
            hookrelay::subscriptions::SecretStore::new(std::time::Duration::from_millis(100))
                .with_keyring(Arc::clone(&self.keyring));
        super::RunningWorker::launch(t, setup).await
    }

    /// Event `id` of acme accepted now for `subscription`, as `hookrelay history` records it
    /// (today's partition made first): what an event's story and its replay start from.
    pub async fn accepted(&self, id: &str, event_type: &str, subscription: &str) {
        let today = hookrelay::history::rows::day_of(std::time::SystemTime::now());
        sqlx::query(&hookrelay::history::rows::create_partition(
            "history_events",
            today,
        ))
        .execute(self.store.pool())
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO history_events (id, tenant, event_type, subscription, accepted_at, \
             stream_offset) VALUES ($1, 'acme', $2, $3, now(), 0)",
        )
        .bind(id)
        .bind(event_type)
        .bind(subscription)
        .execute(self.store.pool())
        .await
        .unwrap();
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
    }
}
