//! The endpoints in trouble, as the API process can know them: those the workers announced
//! quarantined (their breakers stayed open; [`super::quarantine`] follows the announcements),
//! the subscriptions hookrelay paused for an endpoint failing too long (the store's
//! `disabled_reason`), and the subscriptions whose attempts failed over the last 15 minutes
//! (the history database). Breakers open for less than `endpoints.quarantine_after` live only
//! in the workers' memory: they show here through the failures that opened them.

use std::time::Duration;

use maud::{Markup, html};

use crate::web::WebState;

/// How far back failing attempts are counted.
const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The most rows of each list.
const MOST: u32 = 50;

/// The overview's section.
pub async fn section(state: &WebState) -> Markup {
    let disabled = crate::store::subscriptions::disabled(&state.api.pool, MOST).await;
    let failing = match state.api.history_pool() {
        Some(pool) => Some(crate::history::health::failing(pool, WINDOW, MOST).await),
        None => None,
    };
    let (quarantined, partial) = state.quarantines.now();
    html! {
        h2 #trouble { "Endpoints in trouble" }
        h3 { "Quarantined (announced by the workers)" }
        @if let Some(why) = &partial { p.muted { "The list may be incomplete: " (why) "." } }
        @if quarantined.is_empty() { p.muted { "None." } }
        @else {
            table.quarantined {
                thead { tr { th { "Endpoint" } th { "Why" } th { "Since" } } }
                tbody {
                    @for q in &quarantined {
                        tr {
                            td.mono { (q.endpoint) }
                            td { (q.detail.as_deref().unwrap_or("")) }
                            td { (q.at) }
                        }
                    }
                }
            }
        }
        h3 { "Paused by hookrelay (failing too long)" }
        @match &disabled {
            Err(e) => p.flash.error role="alert" { "Cannot read the store: " (e) },
            Ok(rows) if rows.is_empty() => p.muted { "None." },
            Ok(rows) => table.disabled {
                thead { tr { th { "Subscription" } th { "Tenant" } th { "URL" } th { "Why" } } }
                tbody {
                    @for s in rows {
                        tr {
                            td { code { (s.id) } }
                            td { code { (s.tenant) } }
                            td.mono { (s.url) }
                            td { (s.disabled_reason.as_deref().unwrap_or("")) }
                        }
                    }
                }
            },
        }
        h3 { "Failing in the last 15 minutes (history)" }
        @match &failing {
            None => p.muted { "No history database: failing attempts are not shown." },
            Some(Err(e)) => p.flash.error role="alert" { "Cannot read history: " (e) },
            Some(Ok(rows)) if rows.is_empty() => p.muted { "None." },
            Some(Ok(rows)) => table.failing {
                thead { tr {
                    th { "Subscription" } th { "Tenant" } th.num { "Failed" } th.num { "Delivered" }
                    th { "Last failure" } th { "At" }
                } }
                tbody {
                    @for f in rows {
                        tr {
                            td { code { (f.subscription) } }
                            td { code { (f.tenant.as_deref().unwrap_or("-")) } }
                            td.num { (f.failures) }
                            td.num { (f.delivered) }
                            td.mono {
                                @if let Some(s) = f.last_status { (s) " " }
                                (f.last_error.as_deref().unwrap_or(""))
                            }
                            td { (f.last_at) }
                        }
                    }
                }
            },
        }
    }
}
