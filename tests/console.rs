//! The operator console over HTTP, against the real broker: the ladder's depths as the
//! management API reports them, tier hold and release through the page's forms, a redrive of
//! a dead-letter selection, the subscriptions' search; and who may reach any of it.

mod common;

use std::time::{Duration, Instant};

use hookrelay::api::BrokerSetup;
use hookrelay::contract::headers::{REASON_HEADER, TENANT_HEADER};
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::json;

use common::TestLadder;
use common::site::{ACME, ADMIN, GLOBEX, Site};

const FORM: &str = "application/x-www-form-urlencoded";
/// The management API refreshes its queue figures every few seconds.
const SEEN_WITHIN: Duration = Duration::from_secs(20);

fn broker(t: &TestLadder) -> BrokerSetup {
    BrokerSetup {
        amqp_url: t.config.amqp.url.clone(),
        confirm_timeout: t.config.amqp.confirm_timeout,
        ladder: t.ladder.clone(),
        max_event_bytes: t.config.limits.max_body_bytes,
        resume_wait: Duration::from_millis(100),
        management: Some(common::management(&t.config)),
    }
}

/// Tiers long enough that nothing expires during a test.
async fn ladder(name: &str) -> TestLadder {
    TestLadder::apply(name, &["1h"], &["1h"]).await
}

fn cookie_of(answer: &reqwest::Response) -> String {
    let set = answer.headers()[SET_COOKIE].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// An operator's console session cookie.
async fn sign_in(site: &Site) -> String {
    let answer = site
        .client
        .post(format!("{}/ui/login", site.base))
        .header("content-type", FORM)
        .body(serde_urlencoded::to_string([("token", ADMIN)]).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    cookie_of(&answer)
}

async fn get(site: &Site, path: &str, cookie: &str) -> (StatusCode, String) {
    let answer = site
        .client
        .get(format!("{}{path}", site.base))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    (answer.status(), answer.text().await.unwrap())
}

/// The page's CSRF token (the hidden field of its forms).
fn csrf(page: &str) -> String {
    let at = page.find(r#"name="csrf" value=""#).expect("a form") + r#"name="csrf" value=""#.len();
    page[at..].split('"').next().unwrap().to_owned()
}

async fn post(site: &Site, path: &str, cookie: &str, fields: &[(&str, &str)]) -> reqwest::Response {
    site.client
        .post(format!("{}{path}", site.base))
        .header(COOKIE, cookie)
        .header("content-type", FORM)
        .body(serde_urlencoded::to_string(fields).unwrap())
        .send()
        .await
        .unwrap()
}

/// The number in the `data-depth` cell of `queue`'s row.
fn depth_on(page: &str, queue: &str) -> Option<i64> {
    let row = page.find(&format!(r#"data-queue="{queue}""#))?;
    let rest = &page[row..];
    let cell = rest.find("data-depth>")? + "data-depth>".len();
    rest[cell..].split('<').next()?.trim().parse().ok()
}

/// The row of tier `name` in the tiers' table.
fn tier_row<'p>(page: &'p str, name: &str) -> &'p str {
    let at = page
        .find(&format!(r#"data-tier="{name}""#))
        .unwrap_or_else(|| panic!("no row of {name}: {page}"));
    let rest = &page[at..];
    &rest[..rest.find("</tr>").unwrap()]
}

/// `path` once it shows tier `name`'s row (the management API may fail a request now and
/// then on a busy machine; the page then says so instead of the table).
async fn tiers_page(site: &Site, path: &str, cookie: &str, name: &str) -> String {
    let row = format!(r#"data-tier="{name}""#);
    wait_page(site, path, cookie, |p| p.contains(&row)).await
}

/// The figure named `name` on a page.
fn figure(page: &str, name: &str) -> Option<i64> {
    let at = page.find(&format!(r#"data-figure="{name}">"#))? + name.len() + 15;
    page[at..].split('<').next()?.trim().parse().ok()
}

/// Waits until `path` shows what `check` wants (the management API lags the broker).
async fn wait_page(site: &Site, path: &str, cookie: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + SEEN_WITHIN;
    loop {
        let (status, body) = get(site, path, cookie).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if check(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{path} never showed it:\n{body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until `queue` holds `n` ready messages: messages a pass kept go back to the queue
/// asynchronously (a quorum queue applies the return through its log).
async fn wait_depth(t: &TestLadder, queue: &str, n: u32) {
    let deadline = Instant::now() + SEEN_WITHIN;
    loop {
        let depth = t.depth(queue).await;
        if depth == n {
            return;
        }
        assert!(Instant::now() < deadline, "{queue} holds {depth}, not {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn publish_to(t: &TestLadder, queue: &str, n: usize, tenant: &str, reason: &str) {
    for i in 0..n {
        let mut headers = FieldTable::default();
        headers.insert(TENANT_HEADER.into(), AMQPValue::LongString(tenant.into()));
        headers.insert(REASON_HEADER.into(), AMQPValue::LongString(reason.into()));
        t.channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                br#"{"a":1}"#,
                BasicProperties::default()
                    .with_message_id(format!("evt_{tenant}_{i}").into())
                    .with_type("order.paid".into())
                    .with_delivery_mode(2)
                    .with_headers(headers),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_ladder_page_shows_the_brokers_depths_live() {
    let t = ladder("console-depths").await;
    let site = Site::start(Some(broker(&t))).await;
    let cookie = sign_in(&site).await;
    let tier = t.ladder.tier_queue(t.ladder.tier_at(0).unwrap());
    let dead = t.ladder.dead();
    publish_to(&t, &tier, 3, "acme", "exhausted").await;
    publish_to(&t, &dead, 2, "acme", "exhausted").await;

    let page = wait_page(&site, "/ui/", &cookie, |p| {
        depth_on(p, &tier) == Some(3) && depth_on(p, &dead) == Some(2)
    })
    .await;
    assert!(page.contains(&t.ladder.first_lane()), "{page}");
    assert!(page.contains(r#"hx-get="/ui/fragments/ladder""#), "{page}");
    // No worker runs: none consume, nothing is in flight, the lanes are not served.
    assert_eq!(figure(&page, "workers"), Some(0), "{page}");
    assert_eq!(figure(&page, "in-flight"), Some(0), "{page}");
    assert!(page.contains(r#"data-figure="ready">no"#), "{page}");

    // The live region alone, as htmx asks for it: no layout around it.
    let (status, fragment) = get(&site, "/ui/fragments/ladder", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!fragment.contains("<html"), "{fragment}");
    assert_eq!(depth_on(&fragment, &tier), Some(3), "{fragment}");
    let (_, dead_page) = get(&site, "/ui/fragments/dead", &cookie).await;
    assert_eq!(figure(&dead_page, "dead"), Some(2), "{dead_page}");
    site.stop().await;
}

#[tokio::test]
async fn a_tier_is_held_and_released_through_the_forms() {
    let t = ladder("console-hold").await;
    let site = Site::start(Some(broker(&t))).await;
    let cookie = sign_in(&site).await;
    let api = common::management(&t.config);
    let i = t.ladder.tier_at(0).unwrap();
    let name = t.ladder.tier(i).name.clone();
    let held_on_broker = async || {
        hookrelay::ops::tier::status(&api, &t.ladder)
            .await
            .unwrap()
            .iter()
            .find(|s| s.tier == name)
            .unwrap()
            .held
    };
    let page = tiers_page(&site, "/ui/", &cookie, &name).await;
    assert!(
        tier_row(&page, &name).contains(&format!(r#"action="/ui/tiers/{name}/hold""#)),
        "{page}"
    );
    assert!(!held_on_broker().await);

    let held = post(
        &site,
        &format!("/ui/tiers/{name}/hold"),
        &cookie,
        &[("csrf", &csrf(&page))],
    )
    .await;
    assert_eq!(held.status(), StatusCode::SEE_OTHER);
    let to = held.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(to.starts_with("/ui/?done=Held"), "{to}");
    assert!(held_on_broker().await);
    let page = tiers_page(&site, &to, &cookie, &name).await;
    assert!(page.contains(&format!("Held {name}")), "{page}");
    let row = tier_row(&page, &name);
    assert!(
        row.contains(r#"data-held="true""#)
            && row.contains(&format!(r#"action="/ui/tiers/{name}/release""#)),
        "{row}"
    );

    let released = post(
        &site,
        &format!("/ui/tiers/{name}/release"),
        &cookie,
        &[("csrf", &csrf(&page))],
    )
    .await;
    assert_eq!(released.status(), StatusCode::SEE_OTHER);
    assert!(!held_on_broker().await);
    let page = tiers_page(&site, "/ui/", &cookie, &name).await;
    let row = tier_row(&page, &name);
    assert!(
        row.contains(r#"data-held="false""#)
            && row.contains(&format!(r#"action="/ui/tiers/{name}/hold""#)),
        "{row}"
    );
    // Releasing what is not held says so.
    let again = post(
        &site,
        &format!("/ui/tiers/{name}/release"),
        &cookie,
        &[("csrf", &csrf(&page))],
    )
    .await;
    assert_eq!(again.status(), StatusCode::BAD_GATEWAY);
    assert!(again.text().await.unwrap().contains("is not held"));
    site.stop().await;
}

#[tokio::test]
async fn a_dead_letter_selection_is_redriven_through_the_form() {
    let t = ladder("console-redrive").await;
    let site = Site::start(Some(broker(&t))).await;
    let cookie = sign_in(&site).await;
    let dead = t.ladder.dead();
    publish_to(&t, &dead, 2, "acme", "exhausted").await;
    publish_to(&t, &dead, 1, "globex", "exhausted").await;
    publish_to(&t, &dead, 1, "acme", "gone").await;
    let page = wait_page(&site, "/ui/dead", &cookie, |p| figure(p, "dead") == Some(4)).await;
    assert!(page.contains(r#"<option value="exhausted">"#), "{page}");

    // acme's exhausted ones, at most one of them.
    let answer = post(
        &site,
        "/ui/dead/redrive",
        &cookie,
        &[
            ("csrf", &csrf(&page)),
            ("reason", "exhausted"),
            ("tenant", "acme"),
            ("limit", "1"),
        ],
    )
    .await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let to = answer.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(to.contains("moved+1+to"), "{to}");
    wait_depth(&t, &dead, 3).await;
    // Then the rest of acme's exhausted ones; globex's and the gone one stay.
    let answer = post(
        &site,
        "/ui/dead/redrive",
        &cookie,
        &[
            ("csrf", &csrf(&page)),
            ("reason", "exhausted"),
            ("tenant", "acme"),
            ("limit", "100"),
        ],
    )
    .await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let to = answer.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(to.contains("moved+1+to"), "{to}");
    wait_depth(&t, &dead, 2).await;
    // Back through the ingress, to the first lane.
    wait_depth(&t, &t.ladder.first_lane(), 2).await;
    // The page sees the sink shrink.
    wait_page(&site, "/ui/dead", &cookie, |p| figure(p, "dead") == Some(2)).await;

    // A bad selection is refused and moves nothing.
    for fields in [
        [("reason", "nonsense"), ("tenant", ""), ("limit", "1")],
        [("reason", ""), ("tenant", "not a tenant"), ("limit", "1")],
        [("reason", ""), ("tenant", ""), ("limit", "0")],
        [("reason", ""), ("tenant", ""), ("limit", "10001")],
    ] {
        let token = csrf(&page);
        let mut all = vec![("csrf", token.as_str())];
        all.extend(fields);
        let answer = post(&site, "/ui/dead/redrive", &cookie, &all).await;
        assert_eq!(
            answer.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{fields:?}"
        );
    }
    let mut left: Vec<(String, String)> = t
        .drain_dead()
        .await
        .iter()
        .map(|m| {
            let p = &m.delivery.properties;
            (
                p.message_id().as_ref().unwrap().to_string(),
                hookrelay::contract::headers::read_str_header(p, REASON_HEADER).unwrap(),
            )
        })
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            ("evt_acme_0".to_owned(), "gone".to_owned()),
            ("evt_globex_0".to_owned(), "exhausted".to_owned())
        ]
    );
    site.stop().await;
}

#[tokio::test]
async fn every_console_form_needs_its_csrf_token() {
    let t = ladder("console-csrf").await;
    let site = Site::start(Some(broker(&t))).await;
    let cookie = sign_in(&site).await;
    let dead = t.ladder.dead();
    publish_to(&t, &dead, 1, "acme", "exhausted").await;
    let name = t.ladder.tier(t.ladder.tier_at(0).unwrap()).name.clone();
    let api = common::management(&t.config);
    for path in [
        format!("/ui/tiers/{name}/hold"),
        format!("/ui/tiers/{name}/release"),
        "/ui/dead/redrive".to_owned(),
        "/ui/replays/rpl_0123/cancel".to_owned(),
        "/ui/logout".to_owned(),
    ] {
        let fields = [("reason", ""), ("tenant", ""), ("limit", "10")];
        let missing = post(&site, &path, &cookie, &fields).await;
        assert_eq!(missing.status(), StatusCode::FORBIDDEN, "{path}");
        let mut wrong = fields.to_vec();
        wrong.push(("csrf", "0123456789abcdef"));
        let wrong = post(&site, &path, &cookie, &wrong).await;
        assert_eq!(wrong.status(), StatusCode::FORBIDDEN, "{path}");
    }
    // Nothing happened: the tier is not held, the dead letter is still there, still signed in.
    let states = hookrelay::ops::tier::status(&api, &t.ladder).await.unwrap();
    assert!(states.iter().all(|s| !s.held));
    assert_eq!(t.depth(&dead).await, 1);
    assert_eq!(get(&site, "/ui/replays", &cookie).await.0, StatusCode::OK);
    site.stop().await;
}

#[tokio::test]
async fn no_console_route_opens_without_an_operators_session() {
    let site = Site::start(None).await;
    let gets = [
        "/ui/",
        "/ui/fragments/ladder",
        "/ui/dead",
        "/ui/fragments/dead",
        "/ui/subscriptions",
        "/ui/replays",
        "/ui/fragments/replays",
        "/ui/event-types",
    ];
    let posts = [
        "/ui/tiers/retry-1h/hold",
        "/ui/tiers/retry-1h/release",
        "/ui/dead/redrive",
        "/ui/replays/rpl_0123/cancel",
    ];
    // A tenant's portal session, as the portal's cookie and as the console's.
    let (status, link) = site.portal_link(ACME, json!({})).await;
    assert_eq!(status, 201);
    let opened = site
        .client
        .post(link["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), StatusCode::SEE_OTHER);
    let portal = cookie_of(&opened);
    let token = portal.split_once('=').unwrap().1.to_owned();
    let visitors = [
        String::new(),
        portal.clone(),
        format!("hookrelay_console={token}"),
        "hookrelay_console=0123456789abcdef".to_owned(),
    ];
    for cookie in &visitors {
        for path in gets {
            let answer = site
                .client
                .get(format!("{}{path}", site.base))
                .header(COOKIE, cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(
                answer.status(),
                StatusCode::SEE_OTHER,
                "{path} with {cookie:?}"
            );
            assert_eq!(answer.headers()[LOCATION], "/ui/login");
        }
        for path in posts {
            let answer = post(&site, path, cookie, &[("csrf", &token)]).await;
            assert_eq!(
                answer.status(),
                StatusCode::UNAUTHORIZED,
                "{path} with {cookie:?}"
            );
        }
    }
    // The portal session itself still works: it was refused, not spent.
    let (status, _) = get(&site, "/portal/", &portal).await;
    assert_eq!(status, StatusCode::OK);
    site.stop().await;
}

#[tokio::test]
async fn subscriptions_are_searched_by_id_or_url() {
    let site = Site::start(None).await;
    let create = async |token: &str, url: &str| {
        let answer = site
            .client
            .post(format!("{}/v1/subscriptions", site.base))
            .bearer_auth(token)
            .json(&json!({"url": url}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        answer.json::<serde_json::Value>().await.unwrap()["subscription"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let acme = create(ACME, "https://hooks.acme.example/in").await;
    let globex = create(GLOBEX, "https://hooks.globex.example/in").await;
    let cookie = sign_in(&site).await;

    let (status, page) = get(&site, "/ui/subscriptions?q=GLOBEX.example", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&globex) && !page.contains(&acme), "{page}");
    let (_, page) = get(
        &site,
        &format!("/ui/subscriptions?q={}", &acme[4..]),
        &cookie,
    )
    .await;
    assert!(page.contains(&acme) && !page.contains(&globex), "{page}");
    let (_, page) = get(&site, "/ui/subscriptions?tenant=globex", &cookie).await;
    assert!(page.contains(&globex) && !page.contains(&acme), "{page}");
    let (_, page) = get(&site, "/ui/subscriptions?q=nowhere", &cookie).await;
    assert!(page.contains("No subscriptions match"), "{page}");
    // What each receives: its types and its payload filter, as text.
    let answer = site
        .client
        .post(format!("{}/v1/subscriptions", site.base))
        .bearer_auth(ACME)
        .json(
            &json!({"url": "https://hooks.acme.example/big", "event_types": ["order.*"],
                      "filter": {"amount": {"$gt": 100}, "<b>": 1}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let (_, page) = get(&site, "/ui/subscriptions?q=acme.example/big", &cookie).await;
    assert!(page.contains("<code>order.*</code>"), "{page}");
    assert!(
        page.contains(r#"<code class="filter">{&quot;&lt;b&gt;&quot;:1,&quot;amount&quot;:{&quot;$gt&quot;:100}}</code>"#),
        "{page}"
    );
    site.stop().await;
}

#[tokio::test]
async fn endpoints_paused_for_failing_are_in_trouble_and_render_as_text() {
    // No broker: the overview says so, and still shows what the store knows.
    let site = Site::start(None).await;
    let create = async |url: &str| {
        let answer = site
            .client
            .post(format!("{}/v1/subscriptions", site.base))
            .bearer_auth(ACME)
            .json(&json!({"url": url}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        answer.json::<serde_json::Value>().await.unwrap()["subscription"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let failing = create("https://down.acme.example/in").await;
    let fine = create("https://up.acme.example/in").await;
    let cookie = sign_in(&site).await;
    let (status, page) = get(&site, "/ui/", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Cannot read the broker"), "{page}");
    let trouble = &page[page.find(r#"id="trouble""#).expect("the section")..];
    assert!(
        !trouble.contains(&failing) && !trouble.contains(&fine),
        "{trouble}"
    );

    let changed = hookrelay::store::postgres::disable(
        &site.store,
        std::slice::from_ref(&failing),
        "failing for 10m: <script>alert(1)</script>",
    )
    .await
    .unwrap();
    assert_eq!(changed.len(), 1);
    let (_, page) = get(&site, "/ui/", &cookie).await;
    let trouble = &page[page.find(r#"id="trouble""#).unwrap()..];
    assert!(
        trouble.contains(&failing) && !trouble.contains(&fine),
        "{trouble}"
    );
    assert!(
        trouble.contains("failing for 10m: &lt;script&gt;") && !trouble.contains("<script>"),
        "{trouble}"
    );
    assert!(!trouble.contains("Cannot read"), "{trouble}");

    // Attempts as `hookrelay history` writes them: sub_down failing, sub_up fine.
    let pool = site.store.pool();
    let today = hookrelay::history::rows::day_of(std::time::SystemTime::now());
    sqlx::query(&hookrelay::history::rows::create_partition(
        "history_attempts",
        today,
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO history_attempts (envelope, tenant, subscription, attempt, status, error, \
         outcome, lane, at, stream_offset) VALUES \
         ('e1', 'acme', 'sub_down', 1, 503, NULL, 'retried', 'l', now() - interval '9 s', 0), \
         ('e1', 'acme', 'sub_down', 2, 503, NULL, 'retried', 'l', now() - interval '8 s', 1), \
         ('e1', 'acme', 'sub_down', 3, 500, '<b>boom</b>', 'exhausted', 'l', now() - interval '7 s', 2), \
         ('e2', 'acme', 'sub_down', 1, 204, NULL, 'delivered', 'l', now() - interval '6 s', 3), \
         ('e3', 'acme', 'sub_up', 1, 204, NULL, 'delivered', 'l', now() - interval '6 s', 4), \
         ('e4', 'acme', 'sub_old', 1, 503, NULL, 'exhausted', 'l', now() - interval '2 h', 5)",
    )
    .execute(pool)
    .await
    .unwrap();
    let (_, page) = get(&site, "/ui/", &cookie).await;
    let trouble = &page[page.find(r#"id="trouble""#).unwrap()..];
    assert!(!trouble.contains("Cannot read"), "{trouble}");
    let row = &trouble[trouble.find("sub_down").expect("failing")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains(r#"<td class="num">3</td><td class="num">1</td>"#),
        "3 failed, 1 delivered: {row}"
    );
    assert!(row.contains("500 &lt;b&gt;boom&lt;/b&gt;"), "{row}");
    assert!(
        !trouble.contains("sub_up") && !trouble.contains("sub_old"),
        "{trouble}"
    );
    // What went dead lately, by reason (the old one too: the window is a day).
    let (status, page) = get(&site, "/ui/dead", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("Cannot read history"), "{page}");
    assert!(
        page.contains(r#"<code>exhausted</code></td><td class="num">2</td>"#),
        "{page}"
    );
    site.stop().await;
}

#[tokio::test]
async fn quarantines_announced_on_the_events_exchange_are_listed_until_recovered() {
    let t = ladder("console-quarantine").await;
    let site = Site::start(Some(broker(&t))).await;
    let cookie = sign_in(&site).await;
    // Following once the list no longer says it may be incomplete.
    wait_page(&site, "/ui/", &cookie, |p| !p.contains("may be incomplete")).await;
    let announce = async |key: &str, endpoint: &str| {
        let body = json!({
            "event": key, "tenant": null, "subscription": null, "envelope": null,
            "endpoint": endpoint, "reason": "breaker",
            "detail": "circuit breaker open for 30s <img src=x>", "at": "2026-12-07T02:00:00Z"
        });
        t.channel
            .basic_publish(
                t.ladder.events_exchange().as_str().into(),
                key.into(),
                BasicPublishOptions::default(),
                &serde_json::to_vec(&body).unwrap(),
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    };
    announce("endpoint.quarantined", "down.example:443#ab12").await;
    announce("endpoint.quarantined", "flaky.example:443#cd34").await;
    let page = wait_page(&site, "/ui/", &cookie, |p| {
        p.contains("down.example:443#ab12") && p.contains("flaky.example:443#cd34")
    })
    .await;
    assert!(page.contains("open for 30s &lt;img src=x&gt;"), "{page}");
    announce("endpoint.recovered", "flaky.example:443#cd34").await;
    let page = wait_page(&site, "/ui/", &cookie, |p| !p.contains("flaky.example")).await;
    assert!(page.contains("down.example:443#ab12"), "{page}");
    site.stop().await;
}

/// The operator sees the catalog as producers declared it: each type, its mode, its newest
/// schema and example, the producer's text rendered as text.
#[tokio::test]
async fn the_catalog_of_event_types_is_on_its_page() {
    let site = Site::start(None).await;
    let cookie = sign_in(&site).await;
    let (_, empty) = get(&site, "/ui/event-types", &cookie).await;
    assert!(empty.contains("No event types are declared"), "{empty}");
    let answer = site
        .client
        .put(format!("{}/v1/event-types/order.paid", site.base))
        .bearer_auth(ADMIN)
        .json(&json!({"description": "Paid <b>now</b>", "mode": "warn",
            "schema": {"type": "object", "properties": {"id": {"type": "string"}}},
            "example": {"id": "<script>x</script>"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let (status, page) = get(&site, "/ui/event-types", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<code>order.paid</code>"), "{page}");
    assert!(page.contains("Paid &lt;b&gt;now&lt;/b&gt;"), "{page}");
    assert!(page.contains("Validation: <code>warn</code>"), "{page}");
    assert!(page.contains("&lt;script&gt;x&lt;/script&gt;"), "{page}");
    assert!(!page.contains("<script>x"), "{page}");
    site.stop().await;
}
