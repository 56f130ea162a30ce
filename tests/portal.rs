//! The tenant portal over HTTP (the browser tests drive it in Chromium): a tenant creates,
//! edits, pauses, resumes and deletes its endpoints, rotates a secret shown once, reads its
//! attempts newest first and an event's story from history, sends a test event that arrives;
//! another tenant reaches none of it, every POST needs the session's CSRF token, a read-only
//! session changes nothing, and data renders as text.

mod common;

use std::time::Duration;

use hookrelay::api::BrokerSetup;
use hookrelay::api::PagesSetup;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};

use common::TestLadder;
use common::site::{ACME, GLOBEX, Site};

const FORM: &str = "application/x-www-form-urlencoded";
const WAIT: Duration = Duration::from_secs(20);

/// A tenant's portal session: its cookie, and the CSRF token its forms carry.
struct Session {
    cookie: String,
    csrf: String,
}

async fn session(site: &Site, token: &str, body: Value) -> Session {
    let (status, link) = site.portal_link(token, body).await;
    assert_eq!(status, 201, "{link}");
    let opened = site
        .client
        .post(link["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), StatusCode::SEE_OTHER);
    let cookie = opened.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let mut session = Session {
        cookie,
        csrf: String::new(),
    };
    let (_, body) = get(site, "/portal/", &session).await;
    session.csrf = body
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF field")
        .to_owned();
    session
}

async fn get(site: &Site, path: &str, s: &Session) -> (StatusCode, String) {
    let answer = site
        .client
        .get(format!("{}{path}", site.base))
        .header(COOKIE, &s.cookie)
        .send()
        .await
        .unwrap();
    (answer.status(), answer.text().await.unwrap())
}

/// POSTs a form with the session's CSRF token added: (status, Location, body).
async fn post(
    site: &Site,
    path: &str,
    s: &Session,
    fields: &[(&str, &str)],
) -> (StatusCode, String, String) {
    let mut all = vec![("csrf", s.csrf.as_str())];
    all.extend_from_slice(fields);
    post_raw(site, path, s, &all).await
}

async fn post_raw(
    site: &Site,
    path: &str,
    s: &Session,
    fields: &[(&str, &str)],
) -> (StatusCode, String, String) {
    let answer = site
        .client
        .post(format!("{}{path}", site.base))
        .header(COOKIE, &s.cookie)
        .header("content-type", FORM)
        .body(serde_urlencoded::to_string(fields).unwrap())
        .send()
        .await
        .unwrap();
    let location = answer
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (answer.status(), location, answer.text().await.unwrap())
}

async fn api(site: &Site, token: &str, path: &str) -> (StatusCode, Value) {
    let answer = site
        .client
        .get(format!("{}{path}", site.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (answer.status(), answer.json().await.unwrap_or_default())
}

async fn create_by_api(site: &Site, token: &str, body: Value) -> String {
    let answer = site
        .client
        .post(format!("{}/v1/subscriptions", site.base))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let created: Value = answer.json().await.unwrap();
    created["subscription"]["id"].as_str().unwrap().to_owned()
}

/// The one endpoint of the tenant `token` holds.
async fn only_endpoint(site: &Site, token: &str) -> Value {
    let (_, list) = api(site, token, "/v1/subscriptions").await;
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{list}");
    data[0].clone()
}

/// The `whsec_...` in a page, if any.
fn whsec(body: &str) -> Option<String> {
    let at = body.find("whsec_")?;
    Some(
        body[at..]
            .chars()
            .take_while(|c| !matches!(c, '<' | '"' | ' '))
            .collect(),
    )
}

#[tokio::test]
async fn a_tenant_creates_edits_pauses_resumes_and_deletes_an_endpoint() {
    let site = Site::start(None).await;
    let acme = session(&site, ACME, json!({})).await;
    let (status, form) = get(&site, "/portal/endpoints/new", &acme).await;
    assert_eq!(status, StatusCode::OK, "{form}");
    assert!(form.contains(r#"action="/portal/endpoints""#), "{form}");

    let (status, _, created) = post(
        &site,
        "/portal/endpoints",
        &acme,
        &[
            ("url", "https://hooks.acme.example/in"),
            ("description", "orders"),
            ("event_types", "order.paid, invoice.*  refund.created"),
            ("signatures", "v1"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let secret = whsec(&created).expect("the new secret, once");
    let sub = only_endpoint(&site, ACME).await;
    let id = sub["id"].as_str().unwrap().to_owned();
    assert_eq!(
        sub["event_types"],
        json!(["order.paid", "invoice.*", "refund.created"])
    );
    assert_eq!(sub["description"], "orders");
    let (_, list) = get(&site, "/portal/", &acme).await;
    assert!(list.contains(&id) && list.contains("hooks.acme.example/in"));
    let (status, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!detail.contains(&secret), "the secret is shown again");
    assert!(detail.contains("invoice.*"), "{detail}");

    // Refused by the API: the form again, with why, and nothing made.
    let (status, _, refused) = post(
        &site,
        "/portal/endpoints",
        &acme,
        &[("url", "ftp://hooks.acme.example/in"), ("signatures", "v1")],
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(refused.contains("ftp://hooks.acme.example/in"), "{refused}");
    only_endpoint(&site, ACME).await;

    let (status, form) = get(&site, &format!("/portal/endpoints/{id}/edit"), &acme).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        form.contains("order.paid, invoice.*, refund.created"),
        "{form}"
    );
    let (status, location, _) = post(
        &site,
        &format!("/portal/endpoints/{id}/edit"),
        &acme,
        &[
            ("url", "https://hooks.acme.example/v2"),
            ("description", "orders, v2"),
            ("event_types", ""),
            ("rate", "20/s"),
            ("max_concurrent", "3"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(location, format!("/portal/endpoints/{id}?done=Saved."));
    let sub = only_endpoint(&site, ACME).await;
    assert_eq!(sub["url"], "https://hooks.acme.example/v2");
    assert_eq!(sub["description"], "orders, v2");
    assert!(sub.get("event_types").is_none(), "{sub}");
    assert_eq!(sub["rate"], "20/s");
    assert_eq!(sub["max_concurrent"], 3);
    let (_, detail) = get(&site, &location, &acme).await;
    assert!(detail.contains("Saved."), "the flash: {detail}");

    let (status, _, _) = post(&site, &format!("/portal/endpoints/{id}/pause"), &acme, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(only_endpoint(&site, ACME).await["paused"], true);
    let (_, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert!(detail.contains(&format!(r#"action="/portal/endpoints/{id}/resume""#)));
    let (status, _, _) = post(&site, &format!("/portal/endpoints/{id}/resume"), &acme, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(only_endpoint(&site, ACME).await["paused"], false);

    // Deleted only once confirmed.
    let (status, confirm) = get(&site, &format!("/portal/endpoints/{id}/delete"), &acme).await;
    assert_eq!(status, StatusCode::OK);
    assert!(confirm.contains(r#"name="confirm""#), "{confirm}");
    let delete = format!("/portal/endpoints/{id}/delete");
    let (status, _, _) = post(&site, &delete, &acme, &[]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    only_endpoint(&site, ACME).await;
    let (status, location, _) = post(&site, &delete, &acme, &[("confirm", "yes")]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.starts_with("/portal/?done="), "{location}");
    let (status, _) = api(&site, ACME, &format!("/v1/subscriptions/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    site.stop().await;
}

#[tokio::test]
async fn a_tenant_adds_an_endpoint_that_publishes_into_its_own_rabbitmq() {
    let site = Site::start(None).await;
    let acme = session(&site, ACME, json!({})).await;
    let (_, form) = get(&site, "/portal/endpoints/new", &acme).await;
    for field in ["exchange", "routing_key", "username", "password"] {
        assert!(
            form.contains(&format!(r#"name="{field}""#)),
            "{field}: {form}"
        );
    }
    const PASSWORD: &str = "pw-never-shown-7c1";
    // An exchange named for an HTTP URL is refused with why, and the password not echoed.
    let (status, _, refused) = post(
        &site,
        "/portal/endpoints",
        &acme,
        &[
            ("url", "https://hooks.acme.example/in"),
            ("exchange", "partner.webhooks"),
            ("username", "relay"),
            ("password", PASSWORD),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(refused.contains("amqp"), "{refused}");
    assert!(
        refused.contains("partner.webhooks"),
        "the form comes back filled"
    );
    assert!(!refused.contains(PASSWORD), "{refused}");

    let (status, _, created) = post(
        &site,
        "/portal/endpoints",
        &acme,
        &[
            ("url", "amqps://broker.acme.example/orders"),
            ("exchange", "partner.webhooks"),
            ("routing_key", ""),
            ("username", "relay"),
            ("password", PASSWORD),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert!(!created.contains(PASSWORD));
    let sub = only_endpoint(&site, ACME).await;
    assert_eq!(sub["url"], "amqps://broker.acme.example/orders");
    assert_eq!(
        sub["amqp"],
        json!({ "exchange": "partner.webhooks" }),
        "{sub}"
    );
    assert_eq!(sub["basic_auth"]["username"], "relay", "{sub}");
    assert!(!sub.to_string().contains(PASSWORD), "{sub}");
    let id = sub["id"].as_str().unwrap();
    let (_, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert!(detail.contains("partner.webhooks"), "{detail}");
    assert!(detail.contains("the event type"), "{detail}");
    assert!(!detail.contains(PASSWORD));
    site.stop().await;
}

#[tokio::test]
async fn a_rotated_secret_is_shown_once_on_the_answer_and_never_after() {
    let site = Site::start(None).await;
    let id = create_by_api(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let acme = session(&site, ACME, json!({})).await;
    let (status, form) = get(&site, &format!("/portal/endpoints/{id}/rotate"), &acme).await;
    assert_eq!(status, StatusCode::OK);
    assert!(form.contains(r#"value="v1a""#), "{form}");

    let rotate = format!("/portal/endpoints/{id}/rotate");
    let fields = [("signatures", "both"), ("expire_old_after", "1h")];
    let (status, location, answer) = post(&site, &rotate, &acme, &fields).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an answer, not a redirect: {answer}"
    );
    assert!(location.is_empty());
    let secret = whsec(&answer).expect("the new secret");
    assert!(answer.contains("whpk_"), "the v1a key: {answer}");
    assert!(answer.contains("not shown again"), "{answer}");
    let (_, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert!(!detail.contains(&secret), "shown again: {detail}");
    assert!(
        detail.contains("signs until"),
        "the old one's end: {detail}"
    );
    let (_, sub) = api(&site, ACME, &format!("/v1/subscriptions/{id}")).await;
    // The first secret, and the new v1 and v1a ones.
    assert_eq!(sub["secrets"].as_array().unwrap().len(), 3, "{sub}");

    // Moving to v1a alone: a public key, and no whsec_ at all.
    let (status, _, answer) = post(&site, &rotate, &acme, &[("signatures", "v1a")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        answer.contains("whpk_") && whsec(&answer).is_none(),
        "{answer}"
    );
    site.stop().await;
}

/// Every POST route of the portal on endpoint `id`, with a form that would pass.
fn posts(id: &str) -> Vec<(String, Vec<(&'static str, &'static str)>)> {
    let on = |what: &str| format!("/portal/endpoints/{id}/{what}");
    vec![
        (
            "/portal/endpoints".to_owned(),
            vec![
                ("url", "https://hooks.acme.example/x"),
                ("signatures", "v1"),
            ],
        ),
        (
            on("edit"),
            vec![("url", "https://hooks.acme.example/changed")],
        ),
        (on("pause"), vec![]),
        (on("resume"), vec![]),
        (on("rotate"), vec![]),
        (on("test"), vec![]),
        (on("replay"), vec![("from", "1h")]),
        (on("delete"), vec![("confirm", "yes")]),
    ]
}

#[tokio::test]
async fn another_tenant_reaches_nothing_of_an_endpoint() {
    let site = Site::start(None).await;
    let id = create_by_api(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let acme = session(&site, ACME, json!({})).await;
    let globex = session(&site, GLOBEX, json!({})).await;
    put_history(&site, &id).await;
    for path in [
        format!("/portal/endpoints/{id}"),
        format!("/portal/endpoints/{id}/edit"),
        format!("/portal/endpoints/{id}/delete"),
        format!("/portal/endpoints/{id}/rotate"),
        format!("/portal/endpoints/{id}/latest"),
        format!("/portal/attempts?endpoint={id}"),
        "/portal/events/evt_a".to_owned(),
    ] {
        let (status, body) = get(&site, &path, &globex).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(!body.contains("hooks.acme.example"), "{path}: {body}");
        let (status, _) = get(&site, &path, &acme).await;
        assert_eq!(status, StatusCode::OK, "{path}, to its tenant");
    }
    // The create route is globex's own: left out.
    for (path, fields) in posts(&id).into_iter().skip(1) {
        let (status, _, body) = post(&site, &path, &globex, &fields).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let sub = only_endpoint(&site, ACME).await;
    assert_eq!(sub["url"], "https://hooks.acme.example/in");
    assert_eq!(sub["paused"], false);
    assert_eq!(sub["secrets"].as_array().unwrap().len(), 1, "{sub}");
    site.stop().await;
}

#[tokio::test]
async fn every_post_needs_the_csrf_token_and_a_read_only_session_changes_nothing() {
    let site = Site::start(None).await;
    let id = create_by_api(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    let acme = session(&site, ACME, json!({})).await;
    for (path, fields) in posts(&id) {
        let (status, _, _) = post_raw(&site, &path, &acme, &fields).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path} without a token");
        let mut wrong = vec![("csrf", "0123456789abcdef")];
        wrong.extend(fields.iter().copied());
        let (status, _, _) = post_raw(&site, &path, &acme, &wrong).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path} with another token");
    }

    let reader = session(&site, ACME, json!({"read_only": true})).await;
    let (_, list) = get(&site, "/portal/", &reader).await;
    assert!(list.contains("read-only"), "{list}");
    assert!(!list.contains("/portal/endpoints/new"), "{list}");
    let (status, detail) = get(&site, &format!("/portal/endpoints/{id}"), &reader).await;
    assert_eq!(status, StatusCode::OK);
    for action in ["pause", "rotate", "delete", "test", "replay", "edit"] {
        assert!(
            !detail.contains(&format!("/portal/endpoints/{id}/{action}")),
            "a read-only session sees {action}: {detail}"
        );
    }
    // The same page to a session that may act has them: the check above can fail.
    let (_, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert!(detail.contains(&format!("/portal/endpoints/{id}/pause")));
    for (path, fields) in posts(&id) {
        let (status, _, _) = post(&site, &path, &reader, &fields).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{path} by a read-only session"
        );
    }
    let sub = only_endpoint(&site, ACME).await;
    assert_eq!(sub["url"], "https://hooks.acme.example/in");
    assert_eq!(sub["paused"], false);
    assert_eq!(sub["secrets"].as_array().unwrap().len(), 1, "{sub}");
    site.stop().await;
}

#[tokio::test]
async fn hostile_values_render_as_text_on_the_endpoint_pages() {
    let site = Site::start(None).await;
    let hostile = r#"<script>alert(1)</script> "><img src=x onerror=alert(2)>"#;
    let id = create_by_api(
        &site,
        ACME,
        json!({
            "url": r#"https://hooks.acme.example/in?q="><img/src/onerror=alert(3)>"#,
            "description": hostile,
            "event_types": ["order.paid"],
        }),
    )
    .await;
    let acme = session(&site, ACME, json!({})).await;
    for path in [
        format!("/portal/endpoints/{id}"),
        format!("/portal/endpoints/{id}/edit"),
        format!("/portal/endpoints/{id}/delete"),
        "/portal/event-types".to_owned(),
    ] {
        let (status, body) = get(&site, &path, &acme).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        for raw in ["<script>alert", "<img src=x", "<img/src", r#""><img"#] {
            assert!(!body.contains(raw), "{path}: {raw} is markup: {body}");
        }
    }
    let (_, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert!(
        detail.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{detail}"
    );
    // Typed into the form, refused event types come back as text too.
    let (status, _, refused) = post(
        &site,
        "/portal/endpoints",
        &acme,
        &[
            ("url", "https://hooks.acme.example/x"),
            ("event_types", r#"<script>x</script> "><img onerror=y>"#),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        !refused.contains("<script>x") && !refused.contains("<img onerror"),
        "{refused}"
    );
    site.stop().await;
}

/// History rows for endpoint `id` of acme, as `hookrelay history` writes them: `evt_a` retried
/// twice then delivered, then `evt_b` failing twice; and one of globex's.
async fn put_history(site: &Site, id: &str) {
    let pool = site.store.pool();
    let today = hookrelay::history::rows::day_of(std::time::SystemTime::now());
    for table in ["history_events", "history_attempts"] {
        sqlx::query(&hookrelay::history::rows::create_partition(table, today))
            .execute(pool)
            .await
            .unwrap();
    }
    sqlx::query(
        "INSERT INTO history_events (id, tenant, event_type, accepted_at, stream_offset) VALUES \
         ('evt_a', 'acme', 'order.paid', now() - interval '10 s', 0), \
         ('evt_b', 'acme', 'order.paid', now() - interval '5 s', 1), \
         ('evt_g', 'globex', 'order.paid', now() - interval '10 s', 2)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO history_attempts (envelope, tenant, subscription, attempt, status, error, \
         latency_ms, outcome, tier, lane, at, stream_offset) VALUES \
         ('evt_a', 'acme', $1, 1, 503, 'HTTP 503', 40, 'retried', 'retry-1s', 'l', now() - interval '9 s', 0), \
         ('evt_a', 'acme', $1, 2, 503, 'HTTP 503', 41, 'retried', 'retry-2s', 'l', now() - interval '8 s', 1), \
         ('evt_a', 'acme', $1, 3, 204, NULL, 42, 'delivered', NULL, 'l', now() - interval '6 s', 2), \
         ('evt_b', 'acme', $1, 1, 500, 'HTTP 500', 43, 'retried', 'retry-1s', 'l', now() - interval '4 s', 3), \
         ('evt_b', 'acme', $1, 2, 500, 'HTTP 500', 44, 'retried', 'retry-2s', 'l', now() - interval '3 s', 4), \
         ('evt_g', 'globex', 'sub_g', 1, 204, NULL, 45, 'delivered', NULL, 'l', now() - interval '9 s', 5)",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn attempts_show_newest_first_filtered_with_the_health_and_the_story() {
    let site = Site::start(None).await;
    let id = create_by_api(&site, ACME, json!({"url": "https://hooks.acme.example/in"})).await;
    put_history(&site, &id).await;
    let acme = session(&site, ACME, json!({})).await;

    // The API's order: newest first when asked, oldest first by default.
    let latencies = |page: &Value| -> Vec<i64> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["latency_ms"].as_i64().unwrap())
            .collect()
    };
    let attempts = format!("/v1/subscriptions/{id}/attempts");
    let (_, oldest) = api(&site, ACME, &attempts).await;
    assert_eq!(latencies(&oldest), [40, 41, 42, 43, 44]);
    let (_, newest) = api(&site, ACME, &format!("{attempts}?order=newest&limit=2")).await;
    assert_eq!(latencies(&newest), [44, 43]);
    let cursor = newest["next_cursor"].as_str().unwrap();
    let (_, next) = api(
        &site,
        ACME,
        &format!("{attempts}?order=newest&limit=2&cursor={cursor}"),
    )
    .await;
    assert_eq!(latencies(&next), [42, 41]);
    let (status, _) = api(&site, ACME, &format!("{attempts}?order=sideways")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // The page: newest first, every column.
    let (status, page) = get(&site, &format!("/portal/attempts?endpoint={id}"), &acme).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let at = |ms: &str| page.find(&format!("{ms} ms")).expect(ms);
    assert!(at("44") < at("43") && at("43") < at("42") && at("41") < at("40"));
    for shown in [
        "retry-2s",
        "HTTP 500",
        "delivered",
        "503",
        "/portal/events/evt_b",
    ] {
        assert!(page.contains(shown), "{shown}: {page}");
    }
    let (_, delivered) = get(
        &site,
        &format!("/portal/attempts?endpoint={id}&outcome=delivered&since=1h"),
        &acme,
    )
    .await;
    assert!(delivered.contains("42 ms") && !delivered.contains("44 ms"));
    let (_, later) = get(
        &site,
        &format!("/portal/attempts?endpoint={id}&since=5s"),
        &acme,
    )
    .await;
    assert!(
        later.contains("44 ms") && !later.contains("40 ms"),
        "{later}"
    );
    let (_, chooser) = get(&site, "/portal/attempts", &acme).await;
    assert!(chooser.contains(&format!(r#"value="{id}""#)), "{chooser}");

    // The endpoint's health, said as history's, and its latest attempts, polled.
    let (_, detail) = get(&site, &format!("/portal/endpoints/{id}"), &acme).await;
    assert!(
        detail.contains("What the history database says"),
        "{detail}"
    );
    assert!(
        detail.contains(r#"<dt>Failures in a row</dt><dd class="bad">2</dd>"#),
        "{detail}"
    );
    assert!(detail.contains(&format!(r#"hx-get="/portal/endpoints/{id}/latest""#)));
    let (status, fragment) = get(&site, &format!("/portal/endpoints/{id}/latest"), &acme).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        fragment.contains("44 ms") && !fragment.contains("<html"),
        "{fragment}"
    );

    // An event's story.
    let (status, story) = get(&site, "/portal/events/evt_a", &acme).await;
    assert_eq!(status, StatusCode::OK, "{story}");
    assert!(story.contains("order.paid") && story.contains("42 ms") && !story.contains("43 ms"));
    let (status, _) = get(&site, "/portal/events/evt_g", &acme).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "globex's event");
    site.stop().await;
}

#[tokio::test]
async fn the_event_types_page_is_the_union_or_all() {
    let site = Site::start(None).await;
    let acme = session(&site, ACME, json!({})).await;
    let (_, none) = get(&site, "/portal/event-types", &acme).await;
    assert!(none.contains("No endpoints"), "{none}");
    create_by_api(
        &site,
        ACME,
        json!({"url": "https://hooks.acme.example/a", "event_types": ["order.paid", "invoice.*"]}),
    )
    .await;
    create_by_api(
        &site,
        ACME,
        json!({"url": "https://hooks.acme.example/b", "event_types": ["order.paid", "refund.created"]}),
    )
    .await;
    create_by_api(
        &site,
        GLOBEX,
        json!({"url": "https://hooks.globex.example/a", "event_types": ["globex.only"]}),
    )
    .await;
    let (_, union) = get(&site, "/portal/event-types", &acme).await;
    for t in ["order.paid", "invoice.*", "refund.created"] {
        assert!(
            union.contains(&format!("<li><code>{t}</code></li>")),
            "{t}: {union}"
        );
    }
    assert!(!union.contains("globex.only") && !union.contains("<strong>all</strong>"));
    create_by_api(&site, ACME, json!({"url": "https://hooks.acme.example/c"})).await;
    let (_, all) = get(&site, "/portal/event-types", &acme).await;
    assert!(all.contains("<strong>all</strong>"), "{all}");
    site.stop().await;
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

/// With a broker and a worker: a test event sent from the portal reaches the endpoint, signed
/// with the secret the portal showed. (Its attempt showing in the portal needs `hookrelay
/// history` running; the browser test watches that, the test above reads history's rows.)
#[tokio::test]
async fn a_test_event_sent_from_the_portal_arrives_and_a_replay_shows_its_job() {
    use hookrelay_tools::receiver::{Receiver, Reply};
    let t = TestLadder::apply("portal-test-event", &["300ms"], &["300ms"]).await;
    let policy = common::egress::allowing(&["127.0.0.0/8"]);
    let site = Site::start_with(Some(broker(&t)), PagesSetup::default(), policy).await;
    let receiver = Receiver::start(&[], |_| Reply::Status(204)).await.unwrap();
    let acme = session(&site, ACME, json!({})).await;
    let url = receiver.url("/hook");
    let (status, _, created) = post(
        &site,
        "/portal/endpoints",
        &acme,
        &[("url", url.as_str()), ("signatures", "v1")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let secret = whsec(&created).unwrap();
    let id = only_endpoint(&site, ACME).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let worker = site.worker(&t).await;
    let (status, location, _) =
        post(&site, &format!("/portal/endpoints/{id}/test"), &acme, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, detail) = get(&site, &location, &acme).await;
    let envelope = detail
        .split("Test event ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .expect("the flash names the test event")
        .to_owned();
    assert!(envelope.starts_with("evt_test_"), "{detail}");
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    // A second event in the same minute, for the one-event replay below to leave out.
    let (status, _, _) = post(&site, &format!("/portal/endpoints/{id}/test"), &acme, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    worker.stop().await;
    let record = receiver
        .records()
        .into_iter()
        .find(|r| r.id == envelope)
        .unwrap();
    assert_eq!(record.id, envelope);
    let mut headers = reqwest::header::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        headers.insert(name, record.headers[name].clone());
    }
    standardwebhooks::Webhook::new(&secret)
        .unwrap()
        .verify(&record.body, &headers)
        .unwrap();

    // A replay of the endpoint's window: its job's page, polled while it runs; another
    // tenant's session does not see it.
    let (status, location, body) = post(
        &site,
        &format!("/portal/endpoints/{id}/replay"),
        &acme,
        &[("from", "10m"), ("only_undelivered", "true")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.starts_with("/portal/replays/rpl_"), "{location}");
    let (status, job) = get(&site, &location, &acme).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert!(
        job.contains("Published again") && job.contains(&id),
        "{job}"
    );
    let path = location.split('?').next().unwrap();
    let globex = session(&site, GLOBEX, json!({})).await;
    assert_eq!(get(&site, path, &globex).await.0, StatusCode::NOT_FOUND);
    let (status, progress) = get(&site, &format!("{path}/progress"), &acme).await;
    assert_eq!(status, StatusCode::OK);
    assert!(progress.contains(r#"id="progress""#) && !progress.contains("<html"));

    // One replay at a time per tenant (api.replays_per_tenant): the window's is cancelled.
    let window = path.trim_start_matches("/portal/replays/");
    let cancelled = site
        .client
        .post(format!("{}/v1/replays/{window}/cancel", site.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success() || cancelled.status() == StatusCode::CONFLICT);

    // One event, from its story: history says when it was accepted; the replay reads the
    // archive around then and publishes that event alone, not its neighbour.
    site.accepted(&envelope, "hookrelay.test", &id).await;
    let (_, story) = get(&site, &format!("/portal/events/{envelope}"), &acme).await;
    assert!(story.contains("Replay this event"), "{story}");
    let (status, location, body) = post(
        &site,
        &format!("/portal/events/{envelope}/replay"),
        &acme,
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let replay = location
        .trim_start_matches("/portal/replays/")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let mut job = Value::Null;
    for _ in 0..100 {
        job = api(&site, ACME, &format!("/v1/replays/{replay}")).await.1;
        if job["state"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(job["state"], "finished", "{job}");
    assert_eq!(job["event"], envelope.as_str(), "{job}");
    assert!(
        job["read"].as_u64().unwrap() >= 2,
        "both events were read: {job}"
    );
    assert_eq!(job["matched"], 1, "only the one event: {job}");
    assert_eq!(job["published"], 1, "{job}");
    // Another tenant's story, and so its replay, is not there.
    let (status, _, _) = post(
        &site,
        &format!("/portal/events/{envelope}/replay"),
        &globex,
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    site.stop().await;
}

/// The endpoint's page says what the workers announced of it (quarantined, from the events
/// exchange) and, while it is paused, how many events wait for it in the broker.
#[tokio::test]
async fn the_endpoint_page_shows_its_quarantine_and_its_paused_backlog() {
    use lapin::BasicProperties;
    use lapin::options::BasicPublishOptions;
    let t = TestLadder::apply("portal-health", &["1h"], &["1h"]).await;
    let mut setup = broker(&t);
    setup.management = Some(common::management(&t.config));
    let site = Site::start(Some(setup)).await;
    let url = "https://down.acme.example/in?key=abc";
    let id = create_by_api(&site, ACME, json!({ "url": url })).await;
    let acme = session(&site, ACME, json!({})).await;
    let page = format!("/portal/endpoints/{id}");
    let label =
        hookrelay::delivery::endpoint::EndpointKey::of(&reqwest::Url::parse(url).unwrap()).label();
    let publish = async |exchange: &str, key: &str, body: Vec<u8>| {
        t.channel
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    };
    let shows = async |needle: &str| {
        for _ in 0..60 {
            let (status, body) = get(&site, &page, &acme).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if body.contains(needle) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("{page} never showed {needle:?}");
    };
    // Not quarantined, and following (the list is complete from here on).
    shows("not quarantined</dd>").await;
    let announcement = json!({
        "event": "endpoint.quarantined", "tenant": null, "subscription": null, "envelope": null,
        "endpoint": label, "reason": "breaker",
        "detail": "circuit breaker open for 30s", "at": "2026-12-07T02:00:00Z"
    });
    publish(
        &t.ladder.events_exchange(),
        "endpoint.quarantined",
        serde_json::to_vec(&announcement).unwrap(),
    )
    .await;
    let body = shows("quarantined</span> since").await;
    assert!(body.contains("circuit breaker open for 30s"), "{body}");
    assert!(!body.contains("Waiting while paused"), "not paused: {body}");

    let (status, _, _) = post(&site, &format!("{page}/pause"), &acme, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // What a worker does with the endpoint's deliveries while it is paused: parks them.
    t.ladder
        .declare_paused_queue(&t.channel, &id)
        .await
        .unwrap();
    for n in 0..3 {
        publish(
            "",
            &t.ladder.paused_queue(&id),
            format!(r#"{{"n":{n}}}"#).into_bytes(),
        )
        .await;
    }
    // The management API's figures trail the queue by its statistics interval.
    let body = shows("3 event(s), delivered in order on resume").await;
    assert!(body.contains("Waiting while paused"), "{body}");
    site.stop().await;
}

/// The endpoint's page shows its payload filter as written (escaped), tries it against a pasted
/// payload, and the edit form changes it, refusing a bad one with where it is wrong.
#[tokio::test]
async fn the_payload_filter_is_shown_tried_and_edited() {
    let site = Site::start(None).await;
    let filter = json!({"data.amount": {"$gt": 100}, "<script>x</script>": {"$exists": false}});
    let id = create_by_api(
        &site,
        ACME,
        json!({"url": "https://hooks.acme.example/f", "filter": filter}),
    )
    .await;
    let acme = session(&site, ACME, json!({})).await;
    let page = format!("/portal/endpoints/{id}");
    let (_, body) = get(&site, &page, &acme).await;
    assert!(body.contains("&lt;script&gt;x&lt;/script&gt;"), "{body}");
    assert!(!body.contains("<script>x"), "{body}");
    assert!(body.contains("&quot;$gt&quot;: 100"), "{body}");

    let try_it = |payload: &'static str| {
        let path = format!("{page}/filter");
        let acme = &acme;
        let site = &site;
        async move { post(site, &path, acme, &[("payload", payload)]).await }
    };
    let (status, _, body) = try_it(r#"{"data": {"amount": 150}}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("lets this payload through"), "{body}");
    let (status, _, body) = try_it(r#"{"data": {"amount": 5}}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("leaves this payload out"), "{body}");
    let (status, _, body) = try_it("{not json").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.contains("Not JSON"), "{body}");

    let edit = format!("{page}/edit");
    let (_, form) = get(&site, &edit, &acme).await;
    assert!(form.contains("&quot;data.amount&quot;"), "{form}");
    let fields =
        |filter: &'static str| vec![("url", "https://hooks.acme.example/f"), ("filter", filter)];
    let (status, _, body) = post(&site, &edit, &acme, &fields(r#"{"a": {"$near": 1}}"#)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.contains("at a.$near: unknown operator"), "{body}");
    let (status, _, body) = post(&site, &edit, &acme, &fields("{oops")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body.contains("not JSON"), "{body}");
    let (status, _, _) = post(&site, &edit, &acme, &fields(r#"{"kind": "refund"}"#)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        only_endpoint(&site, ACME).await["filter"],
        json!({"kind": "refund"})
    );
    let (status, _, _) = post(&site, &edit, &acme, &fields("")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(only_endpoint(&site, ACME).await.get("filter"), None);
    let (_, body) = get(&site, &page, &acme).await;
    assert!(
        body.contains("None: every event of its types is sent"),
        "{body}"
    );
    site.stop().await;
}
