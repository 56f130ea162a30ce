//! The catalog of event types: what a producer promises an event of each type looks like.
//! Each type has a description, a JSON Schema (draft 2020-12) per version, an example that
//! its schema accepts, a deprecated flag, and a validation mode that says what a worker does
//! with an event its newest schema refuses.
//!
//! - [`schema`]: a schema as written, checked for what would make it costly or reach outside
//!   (size, depth, enum size, references that are not local), and compiled.
//! - [`compiled`]: the catalog compiled once per change, as every delivery reads it, and its
//!   verdict on one event.
//! - [`file`]: the `[[event_type]]` section of the subscriptions file, for deployments without
//!   PostgreSQL.
//!
//! A leaf beside [`crate::units`]: the store, the API, the pages and the worker use it; it uses
//! none of them.

pub mod compiled;
pub mod file;
pub mod schema;

pub use compiled::{Catalog, LiveCatalog, Verdict, Violation};
pub use schema::SchemaError;

use serde::{Deserialize, Serialize};

/// What a worker does with an event its type's schema refuses.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ValidationMode {
    /// Dead-letter it `schema_invalid` before any endpoint sees it.
    Enforce,
    /// Deliver it, and count and report it.
    Warn,
    /// Do not validate.
    #[default]
    Off,
}

impl ValidationMode {
    pub const ALL: [ValidationMode; 3] = [
        ValidationMode::Enforce,
        ValidationMode::Warn,
        ValidationMode::Off,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ValidationMode::Enforce => "enforce",
            ValidationMode::Warn => "warn",
            ValidationMode::Off => "off",
        }
    }
}

impl std::str::FromStr for ValidationMode {
    type Err = CatalogError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| CatalogError::Mode(s.to_owned()))
    }
}

impl std::fmt::Display for ValidationMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest description kept.
pub const MAX_DESCRIPTION_CHARS: usize = 2_000;
/// The most versions one type keeps: each is compiled while it is the newest only, but all are
/// listed.
pub const MAX_VERSIONS: usize = 100;

/// One version of a type's schema, with its example.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaVersion {
    /// 1 for the first, one more for each later version.
    pub version: u32,
    pub schema: serde_json::Value,
    pub example: serde_json::Value,
}

/// One event type as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventType {
    pub name: String,
    pub description: String,
    pub mode: ValidationMode,
    pub deprecated: bool,
    /// Oldest first; never empty. Events are validated against the last.
    pub versions: Vec<SchemaVersion>,
}

impl EventType {
    /// The version events are validated against.
    pub fn newest(&self) -> Option<&SchemaVersion> {
        self.versions.last()
    }
}

/// Why an event type is refused on write. Each names what to change.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("name: {0}")]
    Name(crate::contract::envelope::InvalidEnvelope),
    #[error("mode: {0:?} is not one of enforce, warn, off")]
    Mode(String),
    #[error("description: longer than {MAX_DESCRIPTION_CHARS} characters")]
    Description,
    #[error("description: control characters are not allowed")]
    DescriptionControl,
    #[error("versions: a type keeps at most {MAX_VERSIONS}")]
    Versions,
    #[error("versions: a type has at least one (a schema and its example)")]
    NoVersion,
    #[error("schema: {0}")]
    Schema(#[from] SchemaError),
    #[error("example: not accepted by the schema: at {pointer:?}: {message}")]
    Example { pointer: String, message: String },
}

/// Checks a type's name: an event type as envelopes carry it (so not a `prefix.*` pattern).
pub fn check_name(name: &str) -> Result<(), CatalogError> {
    crate::contract::envelope::check_event_type(name).map_err(CatalogError::Name)
}

/// Checks everything a write gives except the name: the description's length, the schema (see
/// [`schema::check`]) and that the schema accepts the example.
pub fn check_version(
    description: &str,
    schema: &serde_json::Value,
    example: &serde_json::Value,
) -> Result<(), CatalogError> {
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(CatalogError::Description);
    }
    // PostgreSQL text holds no NUL; other control characters have no place in a label either.
    if description
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(CatalogError::DescriptionControl);
    }
    let validator = schema::compile(schema)?;
    if let Some(violation) = Violation::first(&validator, example) {
        return Err(CatalogError::Example {
            pointer: violation.pointer,
            message: violation.message,
        });
    }
    Ok(())
}

/// Checks a whole type (the file's entries, rows read back from the store).
pub fn check(event_type: &EventType) -> Result<(), CatalogError> {
    check_name(&event_type.name)?;
    if event_type.versions.is_empty() {
        return Err(CatalogError::NoVersion);
    }
    if event_type.versions.len() > MAX_VERSIONS {
        return Err(CatalogError::Versions);
    }
    for v in &event_type.versions {
        check_version(&event_type.description, &v.schema, &v.example)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_example_the_schema_refuses_is_refused_with_its_pointer() {
        let schema = json!({"type": "object", "properties": {"amount": {"type": "integer"}}});
        assert!(check_version("", &schema, &json!({"amount": 3})).is_ok());
        let err = check_version("", &schema, &json!({"amount": "3"})).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("example: not accepted by the schema: at \"/amount\""),
            "{err}"
        );
    }

    #[test]
    fn names_are_event_types_not_patterns() {
        assert!(check_name("order.paid").is_ok());
        assert!(check_name("order.*").is_err());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
    }

    #[test]
    fn modes_read_as_written() {
        for m in ValidationMode::ALL {
            assert_eq!(m.as_str().parse::<ValidationMode>().unwrap(), m);
        }
        assert!("strict".parse::<ValidationMode>().is_err());
    }
}
