//! The catalog of event types as the producer declares it: each type's description, mode,
//! newest schema and example, shown the same on the portal's and the console's pages. Schemas
//! and examples are the producer's text, escaped like everything else.

use maud::{Markup, html};

use crate::api::event_types::EventTypeList;

/// The catalog's section of a page.
pub fn section(catalog: &EventTypeList) -> Markup {
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    html! {
        h2 { "Catalog" }
        @if catalog.data.is_empty() {
            p.muted { "No event types are declared: payloads are not described here." }
        }
        @for t in &catalog.data {
            section.event-type {
                h3 {
                    code { (t.name) }
                    @if t.deprecated { " " strong { "deprecated" } }
                }
                @if !t.description.is_empty() { p { (t.description) } }
                p.muted {
                    "Validation: " code { (t.mode.as_str()) }
                    @if let Some(v) = t.versions.last() { ", schema version " (v.version) }
                }
                @if let Some(v) = t.versions.last() {
                    details {
                        summary { "Schema" }
                        pre { code { (pretty(&v.schema)) } }
                    }
                    details {
                        summary { "Example" }
                        pre { code { (pretty(&v.example)) } }
                    }
                }
            }
        }
    }
}
