//! The pages over HTTP (the browser tests drive them in Chromium): portal links open one
//! session once, sessions are scoped and revocable, forms need their CSRF token, every answer
//! carries the strict headers, and data renders as text.

mod common;

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, COOKIE, LOCATION, SET_COOKIE};
use serde_json::json;

use common::site::{ACME, ADMIN, GLOBEX, Site};

const FORM: &str = "application/x-www-form-urlencoded";

/// The session cookie of a `Set-Cookie` answer, as `name=value`.
fn session_cookie(answer: &reqwest::Response) -> String {
    let set = answer
        .headers()
        .get(SET_COOKIE)
        .expect("a Set-Cookie")
        .to_str()
        .unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// Opens `url` as a browser would (the page, then its form): the answer to the POST.
async fn open(site: &Site, url: &str) -> reqwest::Response {
    let page = site.client.get(url).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("Open the portal"));
    site.client.post(url).send().await.unwrap()
}

async fn page(site: &Site, path: &str, cookie: &str) -> (StatusCode, String) {
    let answer = site
        .client
        .get(format!("{}{path}", site.base))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    (answer.status(), answer.text().await.unwrap())
}

async fn portal_session(site: &Site, token: &str, body: serde_json::Value) -> String {
    let (status, link) = site.portal_link(token, body).await;
    assert_eq!(status, 201, "{link}");
    let opened = open(site, link["url"].as_str().unwrap()).await;
    assert_eq!(opened.status(), StatusCode::SEE_OTHER);
    session_cookie(&opened)
}

async fn create(site: &Site, token: &str, body: serde_json::Value) -> serde_json::Value {
    let answer = site
        .client
        .post(format!("{}/v1/subscriptions", site.base))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    answer.json().await.unwrap()
}

#[tokio::test]
async fn a_portal_link_opens_one_session_once() {
    let site = Site::start(None).await;
    let (status, link) = site.portal_link(ACME, json!({"expires_in": "10m"})).await;
    assert_eq!(status, 201, "{link}");
    assert_eq!(link["tenant"], "acme");
    let url = link["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/portal/open/", site.base)),
        "{url}"
    );

    // Looking at the link's page spends nothing; its form does.
    let opened = open(&site, url).await;
    assert_eq!(opened.status(), StatusCode::SEE_OTHER);
    assert_eq!(opened.headers()[LOCATION], "/portal/");
    let set = opened.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/portal"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "not over TLS: {set}");
    let cookie = session_cookie(&opened);
    let (status, body) = page(&site, "/portal/", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("tenant <code>acme</code>"), "{body}");

    // Twice: refused.
    let again = site.client.post(url).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::GONE);
    assert!(again.headers().get(SET_COOKIE).is_none());
    site.stop().await;
}

#[tokio::test]
async fn an_expired_or_unknown_link_is_refused() {
    let site = Site::start(None).await;
    let (_, link) = site.portal_link(ACME, json!({"expires_in": "1s"})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = site
        .client
        .post(link["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), StatusCode::GONE);
    let unknown = site
        .client
        .post(format!("{}/portal/open/{}", site.base, "0".repeat(64)))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::GONE);
    // Opened from another site's page: refused before the link is spent.
    let (_, link) = site.portal_link(ACME, json!({})).await;
    let url = link["url"].as_str().unwrap();
    let cross = site
        .client
        .post(url)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    assert_eq!(open(&site, url).await.status(), StatusCode::SEE_OTHER);
    site.stop().await;
}

#[tokio::test]
async fn who_may_ask_for_a_link_and_for_how_long() {
    let site = Site::start(None).await;
    let (status, answer) = site.portal_link(ACME, json!({"tenant": "globex"})).await;
    assert_eq!(status, 422, "{answer}");
    let (status, answer) = site.portal_link(ADMIN, json!({})).await;
    assert_eq!(status, 422, "an admin names the tenant: {answer}");
    let (status, answer) = site.portal_link(ADMIN, json!({"tenant": "globex"})).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = site.portal_link(ACME, json!({"expires_in": "25h"})).await;
    assert_eq!(status, 422, "at most a day: {answer}");
    let (status, _) = site.portal_link("not-a-token-0123456789", json!({})).await;
    assert_eq!(status, 401);
    site.stop().await;
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_and_data_renders_as_text() {
    let site = Site::start(None).await;
    let hostile = r#"<script>alert(1)</script> "><img src=x onerror=alert(2)>"#;
    let acme = create(
        &site,
        ACME,
        json!({"url": "https://hooks.acme.example/in", "description": hostile}),
    )
    .await;
    let id = acme["subscription"]["id"].as_str().unwrap().to_owned();
    let acme_cookie = portal_session(&site, ACME, json!({})).await;
    let globex_cookie = portal_session(&site, GLOBEX, json!({})).await;

    let (_, body) = page(&site, "/portal/", &acme_cookie).await;
    assert!(body.contains(&id));
    assert!(!body.contains("<script>alert"), "{body}");
    assert!(!body.contains("<img src=x"), "{body}");
    assert!(
        body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{body}"
    );

    let (status, body) = page(&site, "/portal/", &globex_cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains(&id), "globex sees acme's endpoint: {body}");
    site.stop().await;
}

#[tokio::test]
async fn forms_need_the_sessions_csrf_token_and_sessions_end() {
    let site = Site::start(None).await;
    let cookie = portal_session(&site, ACME, json!({})).await;
    let (_, body) = page(&site, "/portal/", &cookie).await;
    let csrf = body
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF field")
        .to_owned();

    let logout = |csrf: String| {
        site.client
            .post(format!("{}/portal/logout", site.base))
            .header(COOKIE, &cookie)
            .header("content-type", FORM)
            .body(serde_urlencoded::to_string([("csrf", csrf)]).unwrap())
            .send()
    };
    assert_eq!(
        logout("wrong".into()).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(page(&site, "/portal/", &cookie).await.0, StatusCode::OK);
    assert_eq!(logout(csrf).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        page(&site, "/portal/", &cookie).await.0,
        StatusCode::UNAUTHORIZED
    );

    // Revoked through the API: every session of the tenant ends.
    let first = portal_session(&site, ACME, json!({})).await;
    let other = portal_session(&site, GLOBEX, json!({})).await;
    let revoked: serde_json::Value = site
        .client
        .post(format!("{}/v1/portal-sessions/revoke", site.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(revoked["sessions"], 1, "{revoked}");
    assert_eq!(
        page(&site, "/portal/", &first).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(page(&site, "/portal/", &other).await.0, StatusCode::OK);
    site.stop().await;
}

/// Whether `html` has an inline event handler attribute (` onclick=`, ` onerror=`...).
fn has_handler(html: &str) -> bool {
    html.match_indices(" on").any(|(at, _)| {
        let rest = &html[at + 3..];
        let name_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        name_len > 0 && rest[name_len..].starts_with('=')
    })
}

#[test]
fn the_handler_check_sees_handlers() {
    assert!(has_handler(r#"<img src=x onerror=alert(1)>"#));
    assert!(!has_handler("signed in on the console"));
}

#[tokio::test]
async fn every_page_carries_a_strict_policy() {
    let site = Site::start(None).await;
    for path in ["/ui/login", "/portal/", "/portal/open/abc"] {
        let answer = site
            .client
            .get(format!("{}{path}", site.base))
            .send()
            .await
            .unwrap();
        let csp = answer.headers()[CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(answer.headers()["cache-control"], "no-store", "{path}");
        let body = answer.text().await.unwrap();
        assert!(
            !body.contains("<script>"),
            "{path}: an inline script: {body}"
        );
        assert!(!has_handler(&body), "{path}: an inline handler: {body}");
    }
    site.stop().await;
}

#[tokio::test]
async fn the_console_takes_an_admin_token_and_no_portal_session() {
    let site = Site::start(None).await;
    create(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    create(
        &site,
        GLOBEX,
        json!({"url": "https://hooks.globex.example/in"}),
    )
    .await;
    let away = site
        .client
        .get(format!("{}/ui/", site.base))
        .send()
        .await
        .unwrap();
    assert_eq!(away.status(), StatusCode::SEE_OTHER);
    assert_eq!(away.headers()[LOCATION], "/ui/login");

    let login = |token: &'static str| {
        site.client
            .post(format!("{}/ui/login", site.base))
            .header("content-type", FORM)
            .body(serde_urlencoded::to_string([("token", token)]).unwrap())
            .send()
    };
    assert_eq!(login(ACME).await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(
        login("wrong-token-0123456789").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let admin = login(ADMIN).await.unwrap();
    assert_eq!(admin.status(), StatusCode::SEE_OTHER);
    let cookie = session_cookie(&admin);
    let (status, body) = page(&site, "/ui/subscriptions", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("hooks.acme.example") && body.contains("hooks.globex.example"));

    // A tenant's portal session, presented as a console cookie, opens nothing.
    let portal = portal_session(&site, ACME, json!({})).await;
    let token = portal.split_once('=').unwrap().1;
    let (status, _) = page(
        &site,
        "/ui/subscriptions",
        &format!("hookrelay_console={token}"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    site.stop().await;
}
