//! The catalog in the subscriptions file, for deployments without PostgreSQL: a section of its
//! own, one `[[event_type]]` table per type with its versions oldest first. Schemas and
//! examples are JSON text, so what is written is what is validated (TOML has no null).
//!
//! ```toml
//! [[event_type]]
//! name = "order.paid"
//! description = "An order was paid in full."
//! mode = "enforce"              # enforce, warn or off (default off)
//! deprecated = false
//!
//! [[event_type.version]]
//! schema = '''{"type": "object", "required": ["order_id"]}'''
//! example = '''{"order_id": "ord_1"}'''
//! ```

use serde::Deserialize;

use super::{CatalogError, EventType, SchemaVersion, ValidationMode};

/// A problem in the file's catalog section, by type.
#[derive(Debug, thiserror::Error)]
pub enum CatalogFileError {
    #[error("{0}")]
    Toml(String),
    #[error("event_type {name:?}: {field}: not JSON: {error}")]
    Json {
        name: String,
        field: &'static str,
        error: serde_json::Error,
    },
    #[error("event_type {name:?}: {error}")]
    Invalid { name: String, error: CatalogError },
    #[error("event_type {0:?}: listed twice")]
    Duplicate(String),
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    event_type: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    mode: ValidationMode,
    #[serde(default)]
    deprecated: bool,
    #[serde(default)]
    version: Vec<VersionEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionEntry {
    schema: String,
    example: String,
}

/// Reads the `[[event_type]]` tables of a subscriptions file (none: an empty catalog). The
/// rest of the file is the subscriptions parser's.
pub fn parse(text: &str) -> Result<Vec<EventType>, CatalogFileError> {
    let file: File = toml::from_str(text).map_err(|e| CatalogFileError::Toml(e.to_string()))?;
    let mut types: Vec<EventType> = Vec::with_capacity(file.event_type.len());
    for entry in file.event_type {
        if types.iter().any(|t| t.name == entry.name) {
            return Err(CatalogFileError::Duplicate(entry.name));
        }
        let json = |field, text: &str| {
            serde_json::from_str(text).map_err(|error| CatalogFileError::Json {
                name: entry.name.clone(),
                field,
                error,
            })
        };
        let mut versions = Vec::with_capacity(entry.version.len());
        for (i, v) in entry.version.iter().enumerate() {
            versions.push(SchemaVersion {
                version: u32::try_from(i + 1).unwrap_or(u32::MAX),
                schema: json("schema", &v.schema)?,
                example: json("example", &v.example)?,
            });
        }
        let event_type = EventType {
            name: entry.name,
            description: entry.description,
            mode: entry.mode,
            deprecated: entry.deprecated,
            versions,
        };
        super::check(&event_type).map_err(|error| CatalogFileError::Invalid {
            name: event_type.name.clone(),
            error,
        })?;
        types.push(event_type);
    }
    Ok(types)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_reads_beside_subscriptions() {
        let text = r#"
[[subscription]]
id = "s"

[[event_type]]
name = "order.paid"
mode = "enforce"

[[event_type.version]]
schema = '''{"type": "object", "required": ["id"]}'''
example = '''{"id": 1}'''
"#;
        let types = parse(text).unwrap();
        assert_eq!(types[0].mode, ValidationMode::Enforce);
        assert_eq!(types[0].versions[0].version, 1);
        assert!(parse("").unwrap().is_empty());
        let bad = text.replace(r#"{"id": 1}"#, "{}");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("example: not accepted"), "{e}");
    }
}
