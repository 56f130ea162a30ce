//! A schema as an administrator writes it: checked before anything compiles it, then compiled
//! with nothing that could reach outside the process or run without bound.
//!
//! Refused on write: a schema over [`MAX_SCHEMA_BYTES`] or nested deeper than [`MAX_DEPTH`], an
//! `enum` of more than [`MAX_ENUM`] values, a `$schema` other than draft 2020-12, and any
//! `$ref`/`$dynamicRef` that is not a fragment of the same document (`#...`): a worker never
//! fetches a schema, so a remote one could never be followed anyway. The compiler is also told
//! not to fetch ([`jsonschema::ValidationOptions::offline`]; the crate is built without its
//! HTTP and file resolvers), and patterns run on the `regex` engine, whose time is linear in
//! the input, not on a backtracking one.

use serde_json::Value;

/// The largest schema accepted, as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The deepest nesting of objects and arrays in a schema document.
pub const MAX_DEPTH: usize = 32;
/// The most values one `enum` lists.
pub const MAX_ENUM: usize = 1_000;
/// The approximate compiled size of one `pattern`.
const MAX_PATTERN_BYTES: usize = 256 * 1024;
const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Why a schema is refused. The JSON pointer is into the schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("{size} bytes, over the {MAX_SCHEMA_BYTES}-byte limit")]
    TooLarge { size: usize },
    #[error("nested deeper than {MAX_DEPTH} levels at {pointer:?}")]
    TooDeep { pointer: String },
    #[error("enum at {pointer:?} lists {count} values, over the limit of {MAX_ENUM}")]
    HugeEnum { pointer: String, count: usize },
    #[error(
        "{keyword} at {pointer:?} is {target:?}: only references within the schema (\"#...\") \
         are followed; put what it names under $defs"
    )]
    RemoteRef {
        keyword: &'static str,
        pointer: String,
        target: String,
    },
    #[error("$schema is {0:?}: the catalog takes draft 2020-12 ({DRAFT_2020_12}) only")]
    Draft(String),
    #[error("a schema is a JSON object or a boolean")]
    NotASchema,
    #[error("does not compile: {0}")]
    Invalid(String),
}

/// Checks a schema's shape before compiling it.
pub fn check(schema: &Value) -> Result<(), SchemaError> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(SchemaError::NotASchema);
    }
    let size = serde_json::to_vec(schema).map_or(usize::MAX, |b| b.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(SchemaError::TooLarge { size });
    }
    if let Some(draft) = schema.get("$schema") {
        let given = draft.as_str().unwrap_or_default();
        if given.trim_end_matches('#') != DRAFT_2020_12 {
            return Err(SchemaError::Draft(draft.to_string()));
        }
    }
    walk(schema, &mut String::new(), 0)
}

/// Visits every node. Iterative in spirit, recursive in fact: the depth is bounded first.
fn walk(node: &Value, pointer: &mut String, depth: usize) -> Result<(), SchemaError> {
    if depth > MAX_DEPTH {
        return Err(SchemaError::TooDeep {
            pointer: pointer.clone(),
        });
    }
    match node {
        Value::Object(map) => {
            for keyword in ["$ref", "$dynamicRef"] {
                if let Some(Value::String(target)) = map.get(keyword)
                    && !target.starts_with('#')
                {
                    return Err(SchemaError::RemoteRef {
                        keyword,
                        pointer: pointer.clone(),
                        target: target.clone(),
                    });
                }
            }
            if let Some(Value::Array(values)) = map.get("enum")
                && values.len() > MAX_ENUM
            {
                return Err(SchemaError::HugeEnum {
                    pointer: format!("{pointer}/enum"),
                    count: values.len(),
                });
            }
            for (key, value) in map {
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                walk(value, pointer, depth + 1)?;
                pointer.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                let len = pointer.len();
                pointer.push_str(&format!("/{i}"));
                walk(value, pointer, depth + 1)?;
                pointer.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks and compiles a schema for draft 2020-12, offline, with linear-time patterns.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, SchemaError> {
    check(schema)?;
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .offline()
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(MAX_PATTERN_BYTES))
        .build(schema)
        .map_err(|e| SchemaError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(depth: usize) -> Value {
        let mut schema = json!({"type": "string"});
        for _ in 0..depth {
            schema = json!({"type": "object", "properties": {"a": schema}});
        }
        schema
    }

    #[test]
    fn hostile_schemas_are_refused_before_compiling() {
        assert!(compile(&nested(10)).is_ok());
        assert!(matches!(
            compile(&nested(40)),
            Err(SchemaError::TooDeep { .. })
        ));
        let huge: Vec<u32> = (0..5_000).collect();
        assert!(matches!(
            compile(&json!({"enum": huge})),
            Err(SchemaError::HugeEnum { count: 5000, .. })
        ));
        for target in [
            "https://example.invalid/s.json",
            "other.json#/x",
            "file:///etc/passwd",
        ] {
            let e = compile(&json!({"properties": {"a": {"$ref": target}}})).unwrap_err();
            assert!(matches!(e, SchemaError::RemoteRef { .. }), "{e}");
            assert!(e.to_string().contains("/properties/a"), "{e}");
        }
        assert!(matches!(
            compile(&json!({"$schema": "http://json-schema.org/draft-04/schema#"})),
            Err(SchemaError::Draft(_))
        ));
        let big = "x".repeat(MAX_SCHEMA_BYTES);
        assert!(matches!(
            compile(&json!({"description": big})),
            Err(SchemaError::TooLarge { .. })
        ));
        assert!(matches!(compile(&json!(3)), Err(SchemaError::NotASchema)));
        assert!(matches!(
            compile(&json!({"type": "nope"})),
            Err(SchemaError::Invalid(_))
        ));
    }

    #[test]
    fn local_references_and_recursion_compile_and_terminate() {
        let schema = json!({
            "$schema": DRAFT_2020_12,
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node"
        });
        let v = compile(&schema).unwrap();
        assert!(v.is_valid(&json!({"next": {"next": {}}})));
        assert!(!v.is_valid(&json!({"next": 3})));
        // A reference to itself and nothing else: compiles, and validating ends.
        let v = compile(&json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}));
        if let Ok(v) = v {
            let _ = v.is_valid(&json!({}));
        }
    }

    #[test]
    fn patterns_that_would_backtrack_are_refused_or_linear() {
        // Backreferences need a backtracking engine: refused, not run.
        assert!(compile(&json!({"pattern": "^(a+)\\1$"})).is_err());
        let v = compile(&json!({"pattern": "^(a+)+$"})).unwrap();
        let long = format!("{}!", "a".repeat(10_000));
        assert!(!v.is_valid(&json!(long)));
    }
}
