//! The pages in a real browser: Debian's headless Chromium, driven through its ChromeDriver
//! (tests/common/browser.rs; `browser/up` installs both). The same flows as tests/pages.rs, seen
//! the way a visitor sees them: scripts run (a portal link's form submits itself), cookies are
//! kept by the browser's own rules (HttpOnly, SameSite=Strict), markup in data is rendered or
//! not, and the keyboard alone reaches the sign-in.
//!
//! Each test has a browser and a site of its own. `screenshots` (ignored) renders the pages to
//! docs/images/: `cargo nextest run --test browser --run-ignored only`.

mod common;

use std::path::Path;
use std::time::Duration;

use fantoccini::key::Key;
use reqwest::StatusCode;
use serde_json::json;

use common::browser::Browser;
use common::site::{ACME, ADMIN, GLOBEX, Site};

/// The refusal of a spent or expired link (the 410 page).
const SPENT: &str = "This portal link was used already or has expired";
/// The refusal of a page without a session (the 401 page).
const ENDED: &str = "This portal session has ended or was revoked";

/// A subscription created through the API with `token`: its id.
async fn create(site: &Site, token: &str, body: serde_json::Value) -> String {
    let answer = site
        .client
        .post(format!("{}/v1/subscriptions", site.base))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let created: serde_json::Value = answer.json().await.unwrap();
    created["subscription"]["id"].as_str().unwrap().to_owned()
}

/// A one-time portal link's URL, asked for with `token`.
async fn link(site: &Site, token: &str, body: serde_json::Value) -> String {
    let (status, link) = site.portal_link(token, body).await;
    assert_eq!(status, 201, "{link}");
    link["url"].as_str().unwrap().to_owned()
}

/// Opens a portal link as a tenant does (the page's form submits itself) and waits for the
/// portal: its text.
async fn open_portal(browser: &Browser, url: &str) -> String {
    browser.open(url).await;
    browser.wait_for_path("/portal/").await;
    browser.wait_for_text("tenant ").await
}

#[tokio::test]
async fn a_portal_link_opens_the_portal_by_itself() {
    let site = Site::start(None).await;
    let id = create(
        &site,
        ACME,
        json!({"url": "https://hooks.acme.example/in", "description": "orders"}),
    )
    .await;
    let url = link(&site, ACME, json!({"expires_in": "10m"})).await;
    let browser = Browser::start().await;

    let text = open_portal(&browser, &url).await;
    assert!(text.contains("tenant acme"), "{text}");
    assert!(text.contains(&id), "{text}");
    assert!(text.contains("https://hooks.acme.example/in"), "{text}");
    // The session is the browser's: the cookie is HttpOnly, so the page's scripts never see it.
    let seen = browser
        .client()
        .execute("return document.cookie", vec![])
        .await
        .unwrap();
    assert_eq!(seen, json!(""), "a script reads the session cookie");
    // And it carries on: the portal again, without the link.
    browser.open(&format!("{}/portal/", site.base)).await;
    assert!(browser.text().await.contains("tenant acme"));
    browser.close().await;
    site.stop().await;
}

#[tokio::test]
async fn a_link_opened_again_is_refused() {
    let site = Site::start(None).await;
    create(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let url = link(&site, ACME, json!({})).await;
    let browser = Browser::start().await;
    open_portal(&browser, &url).await;

    // The same link again, in the same browser: the refusal, and no portal on it.
    browser.open(&url).await;
    let text = browser.wait_for_text(SPENT).await;
    assert!(!text.contains("tenant acme"), "{text}");
    assert!(!text.contains("hooks.acme.example"), "{text}");
    assert!(browser.try_find("nav").await.is_none(), "{text}");
    assert_eq!(browser.text_of("main h1").await, "Cannot do that");

    // Someone else with the link (a browser without the first one's cookie): refused too, and
    // the portal is closed to them.
    browser.client().delete_all_cookies().await.unwrap();
    browser.open(&url).await;
    browser.wait_for_text(SPENT).await;
    browser.open(&format!("{}/portal/", site.base)).await;
    let text = browser.text().await;
    assert!(text.contains(ENDED), "{text}");
    assert!(!text.contains("hooks.acme.example"), "{text}");
    browser.close().await;
    site.stop().await;
}

#[tokio::test]
async fn an_expired_link_is_refused() {
    let site = Site::start(None).await;
    create(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let url = link(&site, ACME, json!({"expires_in": "1s"})).await;
    let browser = Browser::start().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    browser.open(&url).await;
    let text = browser.wait_for_text(SPENT).await;
    assert!(!text.contains("tenant acme"), "{text}");
    browser.open(&format!("{}/portal/", site.base)).await;
    let text = browser.text().await;
    assert!(text.contains(ENDED), "{text}");
    assert!(!text.contains("hooks.acme.example"), "{text}");
    browser.close().await;
    site.stop().await;
}

#[tokio::test]
async fn another_tenant_sees_none_of_acmes_endpoints() {
    let site = Site::start(None).await;
    let acme = create(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let globex = create(
        &site,
        GLOBEX,
        json!({"url": "https://hooks.globex.example/in"}),
    )
    .await;
    let url = link(&site, GLOBEX, json!({})).await;
    let browser = Browser::start().await;

    let text = open_portal(&browser, &url).await;
    assert!(text.contains("tenant globex"), "{text}");
    assert!(text.contains(&globex), "{text}");
    assert!(!text.contains(&acme), "globex sees acme's endpoint: {text}");
    assert!(!text.contains("hooks.acme.example"), "{text}");
    assert_eq!(browser.count("main tbody tr").await, 1, "{text}");
    browser.close().await;
    site.stop().await;
}

#[tokio::test]
async fn markup_in_data_renders_as_text() {
    let site = Site::start(None).await;
    let hostile = r#"<script>alert(1)</script> "><img src=x onerror=alert(2)>"#;
    create(
        &site,
        ACME,
        json!({"url": "https://hooks.acme.example/in", "description": hostile}),
    )
    .await;
    let url = link(&site, ACME, json!({})).await;
    let browser = Browser::start().await;

    let text = open_portal(&browser, &url).await;
    assert!(
        text.contains(hostile),
        "the description is not shown as text: {text}"
    );
    assert_eq!(browser.count("img[src=x]").await, 0, "an img from data");
    assert_eq!(browser.count("img").await, 0);
    assert_eq!(
        browser.count("script:not([src])").await,
        0,
        "an inline script from data"
    );
    // Had either run, its alert would be open now (the session leaves dialogs open).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(browser.alert().await, None, "a dialog is open");
    browser.close().await;
    site.stop().await;
}

#[tokio::test]
async fn the_operator_signs_in_with_the_keyboard_alone() {
    let site = Site::start(None).await;
    create(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    create(
        &site,
        GLOBEX,
        json!({"url": "https://hooks.globex.example/in"}),
    )
    .await;
    let browser = Browser::start().await;
    // The console sends a visitor without a session to its sign-in.
    browser.open(&format!("{}/ui/", site.base)).await;
    assert_eq!(browser.path().await, "/ui/login");

    // From the page's start, Tab until the token's field has the focus: it must be reachable,
    // and soon (nothing before it takes a dozen stops).
    browser.tab_to("#token", 12).await;
    browser.type_keys(ADMIN).await;
    browser.press(Key::Enter).await;
    browser.wait_for_path("/ui/").await;
    assert!(browser.text().await.contains("operator"));

    // To the subscriptions by the header's navigation, still by keyboard.
    browser
        .tab_to(r#"nav a[href="/ui/subscriptions"]"#, 12)
        .await;
    browser.press(Key::Enter).await;
    browser.wait_for_path("/ui/subscriptions").await;
    let text = browser.wait_for_text("hooks.globex.example").await;
    assert!(text.contains("hooks.acme.example"), "{text}");
    let tenants: Vec<String> = {
        let mut tenants = Vec::new();
        for cell in browser.find_all("main tbody tr td:nth-child(2)").await {
            tenants.push(cell.text().await.unwrap());
        }
        tenants.sort();
        tenants
    };
    assert_eq!(tenants, ["acme", "globex"], "{text}");
    browser.close().await;
    site.stop().await;
}

#[tokio::test]
async fn signing_out_ends_the_portal_session() {
    let site = Site::start(None).await;
    create(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let url = link(&site, ACME, json!({})).await;
    let browser = Browser::start().await;
    open_portal(&browser, &url).await;

    // The header's form, with its CSRF field, as the browser sends it.
    browser.click("header form button[type=submit]").await;
    browser.wait_for_text("Signed out").await;
    browser.open(&format!("{}/portal/", site.base)).await;
    let text = browser.text().await;
    assert!(text.contains(ENDED), "{text}");
    assert!(!text.contains("hooks.acme.example"), "{text}");
    browser.close().await;
    site.stop().await;
}

/// Renders the portal (three endpoints) and the console to docs/images/, for the docs:
/// `cargo nextest run --test browser --run-ignored only`.
#[tokio::test]
#[ignore = "writes docs/images/; run on purpose"]
async fn screenshots() {
    let d = Delivering::start("browser-shots").await;
    let site = &d.site;
    for (url, description, types) in [
        (
            "https://hooks.acme.example/orders",
            "Order updates for the warehouse",
            json!(["order.created", "order.shipped"]),
        ),
        (
            "https://billing.acme.example/webhooks",
            "Invoices",
            json!(["invoice.paid"]),
        ),
        (
            "https://audit.acme.example/in",
            "Everything, for the audit log",
            serde_json::Value::Null,
        ),
    ] {
        let mut body = json!({"url": url, "description": description});
        if !types.is_null() {
            body["event_types"] = types;
        }
        create(site, ACME, body).await;
    }
    for url in [
        "https://hooks.globex.example/in",
        "https://crm.globex.example/events",
    ] {
        create(site, GLOBEX, json!({"url": url})).await;
    }
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/images");
    let browser = Browser::start().await;

    open_portal(&browser, &link(site, ACME, json!({})).await).await;
    assert_eq!(browser.count("main tbody tr").await, 3);
    browser.screenshot(&images.join("portal.png")).await;

    // The ladder with a backlog: events waiting in acme's lane (no worker runs).
    for n in 0..25 {
        let mut event = common::event(&format!("evt_shot_{n}"), "acme", "");
        event.subscription = None;
        d.t.publish(&event).await;
    }
    sign_in(&browser, site).await;
    let lane = d.t.ladder.first_lane();
    wait_for_figure(
        &browser,
        &format!(r#"tr[data-queue="{lane}"] td[data-depth]"#),
        25,
    )
    .await;
    browser.screenshot(&images.join("console.png")).await;
    browser.close().await;
    d.stop().await;
}

/// A tenant adds an endpoint through the form, copies its secret from the one answer that shows
/// it, rotates it (the new secret shown once too), and neither secret is on the endpoint's page
/// afterwards.
#[tokio::test]
async fn a_tenant_creates_an_endpoint_and_rotates_its_secret_each_shown_once() {
    let site = Site::start(None).await;
    let url = link(&site, ACME, json!({})).await;
    let browser = Browser::start().await;
    open_portal(&browser, &url).await;

    browser.click("a[href='/portal/endpoints/new']").await;
    browser.wait_for_path("/portal/endpoints/new").await;
    browser
        .fill("#url", "https://hooks.acme.example/from-the-browser")
        .await;
    browser.click("button[type=submit]:not(.secondary)").await;
    let created = browser.wait_for_text("Copy it now").await;
    let first = browser.text_of("code.secret").await;
    assert!(first.starts_with("whsec_"), "{created}");

    browser.click("p.actions a").await;
    let detail = browser.wait_for_text("Rotate the secret").await;
    assert!(detail.contains("from-the-browser"), "{detail}");
    assert!(
        !detail.contains(&first),
        "the secret is shown again: {detail}"
    );

    browser.click("a[href$='/rotate']").await;
    browser.wait_for_text("Rotate").await;
    browser.click("button[type=submit]:not(.secondary)").await;
    browser.wait_for_text("Rotated.").await;
    let second = browser.text_of("code.secret").await;
    assert!(second.starts_with("whsec_") && second != first, "{second}");

    browser.click("a[href='/portal/']").await;
    let list = browser.wait_for_text("from-the-browser").await;
    assert!(!list.contains(&first) && !list.contains(&second), "{list}");
    browser.close().await;
    site.stop().await;
}

/// The operator holds a tier and releases it from the console with the keyboard alone, and the
/// broker holds it in between.
#[tokio::test]
async fn the_operator_holds_and_releases_a_tier_by_keyboard() {
    let t = common::TestLadder::apply("browser-hold", &["1h"], &["1h"]).await;
    let broker = hookrelay::api::BrokerSetup {
        amqp_url: t.config.amqp.url.clone(),
        confirm_timeout: t.config.amqp.confirm_timeout,
        ladder: t.ladder.clone(),
        max_event_bytes: t.config.limits.max_body_bytes,
        resume_wait: Duration::from_millis(100),
        management: Some(common::management(&t.config)),
    };
    let site = Site::start(Some(broker)).await;
    let api = common::management(&t.config);
    let tier = t.ladder.tier(t.ladder.tier_at(0).unwrap()).name.clone();
    let held = async || {
        hookrelay::ops::tier::status(&api, &t.ladder)
            .await
            .unwrap()
            .iter()
            .any(|s| s.tier == tier && s.held)
    };
    let browser = Browser::start().await;
    browser.open(&format!("{}/ui/login", site.base)).await;
    browser.tab_to("#token", 12).await;
    browser.type_keys(ADMIN).await;
    browser.press(Key::Enter).await;
    browser.wait_for_path("/ui/").await;
    browser.wait_for_text(&format!("Hold {tier}")).await;

    let hold = format!(r#"form[action="/ui/tiers/{tier}/hold"] button"#);
    browser.tab_to(&hold, 80).await;
    browser.press(Key::Enter).await;
    browser.wait_for_text(&format!("Held {tier}")).await;
    assert!(held().await, "the broker does not hold {tier}");

    let release = format!(r#"form[action="/ui/tiers/{tier}/release"] button"#);
    browser.tab_to(&release, 80).await;
    browser.press(Key::Enter).await;
    browser.wait_for_text(&format!("Released {tier}")).await;
    assert!(!held().await, "the broker still holds {tier}");
    browser.close().await;
    site.stop().await;
}

/// What the portal runs on for a test with deliveries: a broker (with its management API) and a
/// history that materializes the attempt log into the site's database, as `hookrelay history`
/// does beside the workers.
struct Delivering {
    t: common::TestLadder,
    site: Site,
    history: tokio::task::JoinHandle<Result<(), hookrelay::history::materialize::HistoryError>>,
    stop_history: tokio_util::sync::CancellationToken,
}

impl Delivering {
    async fn start(name: &str) -> Self {
        use hookrelay::history::materialize::{self, HistoryMetrics, HistorySetup};
        let t = common::TestLadder::apply(name, &["300ms"], &["300ms"]).await;
        let broker = hookrelay::api::BrokerSetup {
            amqp_url: t.config.amqp.url.clone(),
            confirm_timeout: t.config.amqp.confirm_timeout,
            ladder: t.ladder.clone(),
            max_event_bytes: t.config.limits.max_body_bytes,
            resume_wait: Duration::from_millis(100),
            management: Some(common::management(&t.config)),
        };
        let site = Site::start_with(
            Some(broker),
            hookrelay::api::PagesSetup::default(),
            common::egress::allowing(&["127.0.0.0/8"]),
        )
        .await;
        let mut config = t.config.history.clone();
        config.flush = Duration::from_millis(50);
        let stop_history = tokio_util::sync::CancellationToken::new();
        let history = tokio::spawn(materialize::run(
            HistorySetup {
                pool: site.store.pool().clone(),
                amqp_url: t.config.amqp.url.clone(),
                ladder: t.ladder.clone(),
                config,
                metrics: HistoryMetrics::new(),
            },
            stop_history.clone(),
        ));
        Self {
            t,
            site,
            history,
            stop_history,
        }
    }

    async fn worker(&self) -> common::RunningWorker {
        self.site.worker(&self.t).await
    }

    async fn stop(self) {
        self.stop_history.cancel();
        let _ = self.history.await;
        self.site.stop().await;
    }
}

/// How long an attempt takes to show: the worker's delivery, the attempt log, history's flush,
/// the page's next poll.
const ARRIVAL: Duration = Duration::from_secs(30);

/// A tenant sends a test event from its endpoint's page and watches the attempt arrive in the
/// latest attempts (refreshed in place), opens the event's story from it, replays the event,
/// and watches the replay end; the receiver gets the event twice with one id.
#[tokio::test]
async fn a_tenant_sends_a_test_event_watches_it_arrive_and_replays_it() {
    use hookrelay_tools::receiver::{Receiver, Reply};
    let d = Delivering::start("browser-test-event").await;
    let receiver = Receiver::start(&[], |_| Reply::Status(204)).await.unwrap();
    let id = create(&d.site, ACME, json!({"url": receiver.url("/hook")})).await;
    let worker = d.worker().await;
    let browser = Browser::start().await;
    open_portal(&browser, &link(&d.site, ACME, json!({})).await).await;

    browser
        .click(&format!("a[href='/portal/endpoints/{id}']"))
        .await;
    browser
        .wait_for_path(&format!("/portal/endpoints/{id}"))
        .await;
    browser.wait_for_text("No attempts recorded.").await;
    browser
        .click(&format!(
            r#"form[action="/portal/endpoints/{id}/test"] button"#
        ))
        .await;
    let flashed = browser.wait_for_text("Test event evt_test_").await;
    let envelope = flashed
        .split("Test event ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    // The page is not reloaded: its latest attempts refresh themselves until the attempt is in.
    let latest = browser
        .wait_for_text_in("#latest", &envelope, ARRIVAL)
        .await;
    assert!(latest.contains("delivered"), "{latest}");
    assert_eq!(receiver.records_for(&envelope).len(), 1);

    browser
        .click(&format!("#latest a[href='/portal/events/{envelope}']"))
        .await;
    browser
        .wait_for_path(&format!("/portal/events/{envelope}"))
        .await;
    browser.wait_for_text("Replay this event").await;
    browser
        .click(&format!(
            r#"form[action="/portal/events/{envelope}/replay"] button"#
        ))
        .await;
    browser
        .wait_for_text_in("#progress", "finished", ARRIVAL)
        .await;
    assert!(browser.path().await.starts_with("/portal/replays/rpl_"));
    let progress = browser.text_of("#progress").await;
    let published = progress
        .split("Published again")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next());
    assert_eq!(published, Some("1"), "{progress}");
    assert!(
        receiver
            .wait_until(ARRIVAL, |r| r.records_for(&envelope).len() == 2)
            .await,
        "the replayed event did not arrive"
    );
    // One id across both: the receiver's deduplication key.
    assert!(
        receiver
            .records_for(&envelope)
            .iter()
            .all(|r| r.idempotency_key == envelope)
    );
    browser.close().await;
    worker.stop().await;
    d.stop().await;
}

/// Signs the operator in to the console (the form, filled).
async fn sign_in(browser: &Browser, site: &Site) {
    browser.open(&format!("{}/ui/login", site.base)).await;
    browser.fill("#token", ADMIN).await;
    browser.click("main form button[type=submit]").await;
    browser.wait_for_path("/ui/").await;
}

/// The number the element `css` shows, once it shows `want` (the pages refresh in place).
async fn wait_for_figure(browser: &Browser, css: &str, want: u32) {
    let started = std::time::Instant::now();
    loop {
        let now = match browser.try_find(css).await {
            Some(element) => element.text().await.unwrap_or_default(),
            None => String::new(),
        };
        if now.trim() == want.to_string() {
            return;
        }
        assert!(
            started.elapsed() < ARRIVAL,
            "{css} shows {now:?}, not {want}, after {ARRIVAL:?}:\n{}",
            browser.text().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An event spends its attempts on a failing endpoint and is dead-lettered; the operator sees
/// it in the sink's depth, redrives it from the console, sees the sink empty and the tenant's
/// lane hold it, and, once a worker runs again, the lane drain: every figure moving in place.
#[tokio::test]
async fn the_operator_redrives_a_dead_letter_and_sees_the_depths_move() {
    use std::sync::atomic::Ordering;
    let d = Delivering::start("browser-redrive").await;
    let healthy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let receiver = {
        let healthy = std::sync::Arc::clone(&healthy);
        hookrelay_tools::receiver::Receiver::start(&[], move |_| {
            hookrelay_tools::receiver::Reply::Status(if healthy.load(Ordering::SeqCst) {
                204
            } else {
                503
            })
        })
        .await
        .unwrap()
    };
    let id = create(&d.site, ACME, json!({"url": receiver.url("/hook")})).await;
    let worker = d.worker().await;
    d.t.publish(&common::event("evt_redriven", "acme", &id))
        .await;
    assert!(
        d.t.wait_dead(1, ARRIVAL).await,
        "the event was not dead-lettered"
    );
    worker.stop().await;
    healthy.store(true, Ordering::SeqCst);

    let browser = Browser::start().await;
    sign_in(&browser, &d.site).await;
    browser.open(&format!("{}/ui/dead", d.site.base)).await;
    wait_for_figure(&browser, "[data-figure=dead]", 1).await;
    browser.click("#reason option[value=exhausted]").await;
    browser.fill("#limit", "10").await;
    browser
        .click(r#"form[action="/ui/dead/redrive"] button"#)
        .await;
    let moved = browser.wait_for_text("moved 1 to").await;
    assert!(moved.contains("Examined 1 dead message(s)"), "{moved}");
    wait_for_figure(&browser, "[data-figure=dead]", 0).await;

    let lane = d.t.ladder.first_lane();
    browser.open(&format!("{}/ui/", d.site.base)).await;
    let depth = format!(r#"tr[data-queue="{lane}"] td[data-depth]"#);
    wait_for_figure(&browser, &depth, 1).await;
    let worker = d.worker().await;
    wait_for_figure(&browser, &depth, 0).await;
    assert!(
        receiver
            .wait_until(ARRIVAL, |r| r.delivered_count() == 1)
            .await
    );
    assert_eq!(receiver.records_for("evt_redriven").len(), 3);
    browser.close().await;
    worker.stop().await;
    d.stop().await;
}

/// Every link, button and field of every page, the portal's and the console's, is reached by
/// the Tab key alone (and Enter acts on what has the focus: the sign-in and hold tests above).
#[tokio::test]
async fn the_keyboard_alone_reaches_every_action_of_every_page() {
    let d = Delivering::start("browser-keyboard").await;
    let site = &d.site;
    let id = create(
        site,
        ACME,
        json!({"url": "http://127.0.0.1:9/in", "event_types": ["order.paid"],
               "filter": {"amount": {"$gt": 1}}}),
    )
    .await;
    // An event's story, as history records it, for its page.
    site.accepted("evt_keys", "order.paid", &id).await;
    // A declared type, for the catalog's schema and example (each behind a summary).
    let declared = site
        .client
        .put(format!("{}/v1/event-types/order.paid", site.base))
        .bearer_auth(ADMIN)
        .json(&json!({"description": "An order was paid", "mode": "warn",
            "schema": {"type": "object"}, "example": {"id": "o1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(declared.status(), StatusCode::CREATED);
    let browser = Browser::start().await;
    open_portal(&browser, &link(site, ACME, json!({})).await).await;
    let portal = [
        "/portal/".to_owned(),
        "/portal/endpoints/new".to_owned(),
        format!("/portal/endpoints/{id}"),
        format!("/portal/endpoints/{id}/edit"),
        format!("/portal/endpoints/{id}/rotate"),
        format!("/portal/endpoints/{id}/delete"),
        "/portal/attempts".to_owned(),
        format!("/portal/attempts?endpoint={id}"),
        "/portal/events/evt_keys".to_owned(),
        "/portal/event-types".to_owned(),
    ];
    let mut unreached = Vec::new();
    for path in &portal {
        for html in browser
            .unreached_by_tab(&format!("{}{path}", site.base), 200)
            .await
        {
            unreached.push(format!("{path}: {html}"));
        }
    }
    sign_in(&browser, site).await;
    for path in [
        "/ui/",
        "/ui/dead",
        "/ui/subscriptions",
        "/ui/replays",
        "/ui/event-types",
    ] {
        for html in browser
            .unreached_by_tab(&format!("{}{path}", site.base), 200)
            .await
        {
            unreached.push(format!("{path}: {html}"));
        }
    }
    assert!(
        unreached.is_empty(),
        "not reached by Tab:\n{}",
        unreached.join("\n")
    );
    browser.close().await;
    d.stop().await;
}
