//! The pages under a full store (`hookrelay-dev bench --pages`): 10,000 subscriptions over 100
//! tenants and 1,000,000 attempt rows over ten days (sizes settable), in a PostgreSQL database of
//! the bench's own (migrated, dropped after); then `hookrelay api`'s app in the bench process, an
//! operator signed in to the console and a tenant's portal session opened, and each page fetched
//! `--page-requests` times over loopback, timed from request to the last byte of the answer.
//! The API runs without a broker here: `/ui/` and `/ui/dead` time what they read from the
//! database (endpoints in trouble, dead letters by reason over a day of attempts); their broker
//! figures are the management API's own time.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use hookrelay::api::auth::Tokens;
use hookrelay::api::validate::Egress;
use hookrelay::api::{ApiSetup, PagesSetup};
use hookrelay::delivery::egress::{EgressPolicy, SystemLookup};
use hookrelay::history::rows;
use hookrelay::store::PgStore;
use hookrelay::subscriptions::seal::{Keyring, generate_key};

use super::{BenchError, machine, say};
use crate::kit::{Percentiles, ScratchDb, pg_server_url};

const ADMIN: &str = "bench-admin-token-0123456789";
const TENANT_TOKEN: &str = "bench-tenant-token-0123456789";
/// The tenant whose portal is timed (`t7`, one of the 100).
const TENANT: &str = "t7";

#[derive(Debug, Clone)]
pub struct PagesOptions {
    pub subscriptions: u64,
    pub attempts: u64,
    pub requests: usize,
}

/// One page's timings.
#[derive(Debug, Clone, Serialize)]
pub struct PageTiming {
    pub page: String,
    pub status: u16,
    pub bytes: usize,
    pub time: Percentiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct PagesReport {
    pub machine: String,
    pub subscriptions: u64,
    pub attempts: u64,
    pub fill_seconds: f64,
    pub pages: Vec<PageTiming>,
}

impl PagesReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "pages over {} subscriptions and {} attempt rows ({})\n\n\
             | page | status | bytes | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n",
            self.subscriptions, self.attempts, self.machine
        );
        for p in &self.pages {
            out.push_str(&format!(
                "| `{}` | {} | {} | {:.1} | {:.1} | {:.1} |\n",
                p.page, p.status, p.bytes, p.time.p50_ms, p.time.p99_ms, p.time.max_ms
            ));
        }
        out
    }
}

/// The pages timed; `{sub}` is a subscription of [`TENANT`] with its share of the attempts.
const PAGES: &[&str] = &[
    "/ui/",
    "/ui/subscriptions",
    "/ui/subscriptions?tenant=t7",
    "/ui/subscriptions?q=t7/9907",
    "/ui/subscriptions?after=sub_5000",
    "/ui/dead",
    "/portal/",
    "/portal/endpoints/{sub}",
    "/portal/attempts?endpoint={sub}",
    "/portal/attempts?endpoint={sub}&outcome=delivered",
    "/portal/event-types",
    "/v1/subscriptions/{sub}/attempts?limit=50",
];

pub async fn run(options: &PagesOptions) -> Result<PagesReport, BenchError> {
    let db = ScratchDb::create_on(&pg_server_url(), "hookrelay_pages").await?;
    let store = PgStore::connect(&db.url, Duration::from_secs(5)).await?;
    store.migrate().await?;
    let pool = store.pool().clone();
    let fill = Instant::now();
    say(&format!(
        "filling {} subscriptions and {} attempt rows",
        options.subscriptions, options.attempts
    ));
    sqlx::query(
        "INSERT INTO subscriptions (id, tenant, url, description) \
         SELECT 'sub_' || j, 't' || (j % 100), 'https://hooks.example.com/t' || (j % 100) || '/' || j, \
                'endpoint ' || j FROM generate_series(0, $1 - 1) AS j",
    )
    .bind(options.subscriptions as i64)
    .execute(&pool)
    .await?;
    let today = rows::day_of(SystemTime::now());
    let days = 10u64;
    for d in 0..days {
        sqlx::query(&rows::create_partition("history_attempts", today - d))
            .execute(&pool)
            .await?;
    }
    // Attempt r is of subscription r % N (so its tenant is that subscription's), spread over
    // the ten days.
    sqlx::query(&format!(
        "INSERT INTO history_attempts (envelope, tenant, subscription, attempt, status, error, \
         latency_ms, outcome, tier, lane, at, stream_offset) \
         SELECT 'evt_' || r, 't' || ((r % {n}) % 100), 'sub_' || (r % {n}), r % 5 + 1, \
         CASE WHEN r % 5 = 4 THEN 204 ELSE 503 END, \
         CASE WHEN r % 5 = 4 THEN NULL ELSE 'HTTP 503' END, 40, \
         CASE WHEN r % 5 = 4 THEN 'delivered' ELSE 'retried' END, \
         CASE WHEN r % 5 = 4 THEN NULL ELSE 'retry-10s' END, 'hookrelay.ready.first', \
         date_trunc('day', now()) - ((r % {days}) || ' days')::interval + (r % 80000) * interval '1 s', r \
         FROM generate_series(0, {attempts} - 1) AS r",
        n = options.subscriptions.max(1),
        attempts = options.attempts,
    ))
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE subscriptions, history_attempts")
        .execute(&pool)
        .await?;
    let fill_seconds = fill.elapsed().as_secs_f64();
    say(&format!("filled in {fill_seconds:.0} s"));

    let key = generate_key();
    let keyring = Keyring::from_base64(&[&key]).map_err(|e| BenchError::Other(e.to_string()))?;
    let setup = ApiSetup {
        pool: pool.clone(),
        keyring: Arc::new(keyring),
        tokens: Tokens::from_plain(&[(ADMIN, None), (TENANT_TOKEN, Some(TENANT))]),
        egress: Egress::new(
            EgressPolicy::default(),
            Arc::new(SystemLookup),
            Duration::from_secs(2),
        ),
        max_body: 64 * 1024,
        broker: None,
        history: Some(pool.clone()),
        limits: Default::default(),
        pages: PagesSetup::default(),
    };
    let (app, state) = hookrelay::web::app(setup);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        let _ = hookrelay::api::serve(listener, app, state, async {
            let _ = stopped.await;
        })
        .await;
    });
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let console = sign_in(&client, &base).await?;
    let portal = open_portal(&client, &base).await?;

    let sub = "sub_7";
    let mut pages = Vec::new();
    for page in PAGES {
        let path = page.replace("{sub}", sub);
        let (cookie, bearer) = if path.starts_with("/ui/") {
            (Some(console.as_str()), None)
        } else if path.starts_with("/portal/") {
            (Some(portal.as_str()), None)
        } else {
            (None, Some(TENANT_TOKEN))
        };
        let mut ms = Vec::with_capacity(options.requests);
        let (mut status, mut bytes) = (0, 0);
        for _ in 0..options.requests {
            let mut request = client.get(format!("{base}{path}"));
            if let Some(cookie) = cookie {
                request = request.header("cookie", cookie);
            }
            if let Some(token) = bearer {
                request = request.bearer_auth(token);
            }
            let t = Instant::now();
            let answer = request.send().await?;
            status = answer.status().as_u16();
            bytes = answer.bytes().await?.len();
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        if status != 200 {
            return Err(BenchError::Other(format!("{path} answered {status}")));
        }
        let time = Percentiles::of(ms);
        say(&format!(
            "{path}: p50 {:.1} ms, p99 {:.1} ms",
            time.p50_ms, time.p99_ms
        ));
        pages.push(PageTiming {
            page: path,
            status,
            bytes,
            time,
        });
    }
    let _ = stop.send(());
    let _ = served.await;
    pool.close().await;
    drop(db);
    Ok(PagesReport {
        machine: machine(),
        subscriptions: options.subscriptions,
        attempts: options.attempts,
        fill_seconds,
        pages,
    })
}

/// The console's session cookie, signed in with the admin token.
async fn sign_in(client: &reqwest::Client, base: &str) -> Result<String, BenchError> {
    let answer = client
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={ADMIN}"))
        .send()
        .await?;
    cookie_of(&answer).ok_or_else(|| BenchError::Other("the console sign-in set no cookie".into()))
}

/// A portal session of [`TENANT`], from a one-time link.
async fn open_portal(client: &reqwest::Client, base: &str) -> Result<String, BenchError> {
    let link: serde_json::Value = client
        .post(format!("{base}/v1/portal-links"))
        .bearer_auth(TENANT_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    let url = link["url"]
        .as_str()
        .ok_or_else(|| BenchError::Other(format!("no portal link: {link}")))?;
    let answer = client.post(url).send().await?;
    cookie_of(&answer).ok_or_else(|| BenchError::Other("the portal link set no cookie".into()))
}

fn cookie_of(answer: &reqwest::Response) -> Option<String> {
    let set = answer.headers().get("set-cookie")?.to_str().ok()?;
    Some(set.split(';').next()?.to_owned())
}
