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
    let site = Site::start(None).await;
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
        create(&site, ACME, body).await;
    }
    for url in [
        "https://hooks.globex.example/in",
        "https://crm.globex.example/events",
    ] {
        create(&site, GLOBEX, json!({"url": url})).await;
    }
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/images");
    let browser = Browser::start().await;

    open_portal(&browser, &link(&site, ACME, json!({})).await).await;
    assert_eq!(browser.count("main tbody tr").await, 3);
    browser.screenshot(&images.join("portal.png")).await;

    browser.open(&format!("{}/ui/login", site.base)).await;
    browser.fill("#token", ADMIN).await;
    browser.click("main form button[type=submit]").await;
    browser.wait_for_path("/ui/").await;
    browser
        .open(&format!("{}/ui/subscriptions", site.base))
        .await;
    browser.wait_for_text("hooks.globex.example").await;
    browser.screenshot(&images.join("console.png")).await;
    browser.close().await;
    site.stop().await;
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
