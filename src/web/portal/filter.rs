//! An endpoint's payload filter on its page, and the box that tries it against a payload the
//! tenant pastes: whether the endpoint would be sent that event (nothing is sent or stored).

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::api::auth::Scope;
use crate::api::model::SubscriptionView;
use crate::subscriptions::PayloadFilter;

use super::endpoint::read;
use crate::web::WebState;
use crate::web::page::{PageError, Site, layout};
use crate::web::session::{Form, Visitor};

/// The largest payload the box tries (a page form, not a delivery).
const MOST: usize = 64 * 1024;

/// What a try found: the payload as sent, and whether the filter lets it through (or why it
/// could not tell).
pub struct Tried<'a> {
    payload: &'a str,
    verdict: Result<bool, String>,
}

/// The filter as written (pretty), and the box to try it.
pub fn card(visitor: &Visitor, view: &SubscriptionView, tried: Option<&Tried<'_>>) -> Markup {
    let shown = view
        .filter
        .as_ref()
        .and_then(|f| serde_json::to_string_pretty(f).ok());
    html! {
        div.card #filter {
            h2 { "Payload filter" }
            @match &shown {
                None => p.muted { "None: every event of its types is sent. Set one with Edit." },
                Some(json) => pre { code { (json) } },
            }
            @if shown.is_some() && !visitor.read_only {
                form method="post" action=(format!("/portal/endpoints/{}/filter", view.id)) {
                    (visitor.csrf_field())
                    label for="payload" { "Test against this payload (JSON; nothing is sent)" }
                    textarea #payload name="payload" required { (tried.map_or("", |t| t.payload)) }
                    p.actions { button.secondary type="submit" { "Test the filter" } }
                }
            }
            @if let Some(t) = tried {
                @match &t.verdict {
                    Ok(true) => p.flash role="status" { span.badge.good { "sent" } " The filter lets this payload through." },
                    Ok(false) => p.flash role="status" { span.badge.warn { "left out" } " The filter leaves this payload out: the endpoint would not be sent it." },
                    Err(why) => p.flash.error role="alert" { (why) },
                }
            }
        }
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct TryForm {
    #[serde(default)]
    payload: String,
}

/// `POST /portal/endpoints/{id}/filter`: the endpoint's filter tried against a payload.
pub async fn try_payload(
    State(state): State<WebState>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    form: Form<TryForm>,
) -> Result<Response, PageError> {
    let Form { visitor, value } = form;
    let view = read(&state, scope, &id).await?;
    let verdict = verdict(view.filter.as_ref(), &value.payload);
    let status = match verdict {
        Err(_) => StatusCode::UNPROCESSABLE_ENTITY,
        Ok(_) => StatusCode::OK,
    };
    let tried = Tried {
        payload: &value.payload,
        verdict,
    };
    let body = html! {
        (card(&visitor, &view, Some(&tried)))
        p { a href=(format!("/portal/endpoints/{id}")) { "Back to the endpoint" } }
    };
    let title = format!("Filter of {id}");
    Ok((status, layout(Site::Portal, Some(&visitor), &title, body)).into_response())
}

fn verdict(filter: Option<&serde_json::Value>, payload: &str) -> Result<bool, String> {
    let Some(filter) = filter else {
        return Ok(true);
    };
    if payload.len() > MOST {
        return Err(format!("The payload is over {} KiB.", MOST / 1024));
    }
    let payload: serde_json::Value =
        serde_json::from_str(payload).map_err(|e| format!("Not JSON: {e}."))?;
    let filter = PayloadFilter::compile(filter).map_err(|e| format!("The filter: {e}."))?;
    Ok(filter.matches(&payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_verdict_says_sent_left_out_or_why_not() {
        let filter = json!({"amount": {"$gt": 100}});
        assert_eq!(verdict(Some(&filter), r#"{"amount": 101}"#), Ok(true));
        assert_eq!(verdict(Some(&filter), r#"{"amount": 1}"#), Ok(false));
        assert!(
            verdict(Some(&filter), "{")
                .unwrap_err()
                .starts_with("Not JSON")
        );
        assert_eq!(verdict(None, "anything"), Ok(true));
        let big = format!(r#"{{"a": "{}"}}"#, "x".repeat(MOST));
        assert!(verdict(Some(&filter), &big).unwrap_err().contains("KiB"));
    }
}
