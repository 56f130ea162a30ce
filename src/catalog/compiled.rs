//! The catalog as a worker reads it: each type's newest schema compiled once when the catalog
//! changes, never per event, and swapped in whole so a delivery reads one version of it.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{EventType, ValidationMode, schema};

/// Where a payload breaks its schema, and the schema's word for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// A JSON pointer into the payload (`""`: the payload itself).
    pub pointer: String,
    pub message: String,
}

impl Violation {
    /// The first error the validator reports for `instance`, if any.
    pub fn first(validator: &jsonschema::Validator, instance: &serde_json::Value) -> Option<Self> {
        validator.validate(instance).err().map(|e| Violation {
            pointer: e.instance_path().as_str().to_owned(),
            message: e.to_string(),
        })
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {:?}: {}", self.pointer, self.message)
    }
}

/// What the catalog makes of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not validated: its mode is `off`.
    Unchecked,
    Valid,
    /// Refused by its schema, or, for a type the catalog does not list (`listed` false: its
    /// name is no bounded label), refused for that alone when `catalog.unlisted` validates.
    Invalid {
        mode: ValidationMode,
        listed: bool,
        violation: Violation,
    },
}

struct Entry {
    mode: ValidationMode,
    validator: Arc<jsonschema::Validator>,
}

/// Every listed type's newest schema, compiled, and the mode of types not listed.
pub struct Catalog {
    types: HashMap<String, Entry>,
    unlisted: ValidationMode,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("types", &self.types.len())
            .field("unlisted", &self.unlisted)
            .finish()
    }
}

impl Catalog {
    /// A catalog with no types: every event follows `unlisted`.
    pub fn empty(unlisted: ValidationMode) -> Self {
        Self {
            types: HashMap::new(),
            unlisted,
        }
    }

    /// Compiles each type's newest schema. A type whose schema no longer compiles (written by
    /// an older version, changed by hand) is returned apart and left out: its events follow
    /// `unlisted`, and the caller says so.
    pub fn compile(
        types: &[EventType],
        unlisted: ValidationMode,
    ) -> (Self, Vec<(String, schema::SchemaError)>) {
        let mut compiled = HashMap::with_capacity(types.len());
        let mut problems = Vec::new();
        for t in types {
            let Some(newest) = t.newest() else { continue };
            match schema::compile(&newest.schema) {
                Ok(validator) => {
                    compiled.insert(
                        t.name.clone(),
                        Entry {
                            mode: t.mode,
                            validator: Arc::new(validator),
                        },
                    );
                }
                Err(e) => problems.push((t.name.clone(), e)),
            }
        }
        (
            Self {
                types: compiled,
                unlisted,
            },
            problems,
        )
    }

    pub fn len(&self) -> usize {
        self.types.len()
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Whether `event_type` is listed: the only types a metric may name.
    pub fn lists(&self, event_type: &str) -> bool {
        self.types.contains_key(event_type)
    }

    /// Validates one payload (the envelope's body) against its type's newest schema, unless
    /// the type's mode (or, unlisted, the default) is `off`.
    pub fn check(&self, event_type: &str, body: &[u8]) -> Verdict {
        let (mode, validator, listed) = match self.types.get(event_type) {
            Some(e) => (e.mode, Some(&e.validator), true),
            None => (self.unlisted, None, false),
        };
        if mode == ValidationMode::Off {
            return Verdict::Unchecked;
        }
        let invalid = |violation| Verdict::Invalid {
            mode,
            listed,
            violation,
        };
        let payload: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return invalid(Violation {
                    pointer: String::new(),
                    message: format!("not JSON: {e}"),
                });
            }
        };
        let Some(validator) = validator else {
            return invalid(Violation {
                pointer: String::new(),
                message: format!("event type {event_type:?} is not in the catalog"),
            });
        };
        match Violation::first(validator, &payload) {
            None => Verdict::Valid,
            Some(v) => invalid(v),
        }
    }
}

/// The catalog in force, replaced whole when it changes. Readers take a snapshot per event
/// without locking.
#[derive(Debug)]
pub struct LiveCatalog {
    current: ArcSwap<Catalog>,
}

impl LiveCatalog {
    pub fn new(catalog: Catalog) -> Self {
        Self {
            current: ArcSwap::from_pointee(catalog),
        }
    }

    pub fn current(&self) -> Arc<Catalog> {
        self.current.load_full()
    }

    pub fn replace(&self, catalog: Catalog) {
        self.current.store(Arc::new(catalog));
    }
}

#[cfg(test)]
mod tests {
    use super::super::SchemaVersion;
    use super::*;
    use serde_json::json;

    fn order(mode: ValidationMode) -> EventType {
        EventType {
            name: "order.paid".into(),
            description: String::new(),
            mode,
            deprecated: false,
            versions: vec![
                SchemaVersion {
                    version: 1,
                    schema: json!({"type": "object"}),
                    example: json!({}),
                },
                SchemaVersion {
                    version: 2,
                    schema: json!({"type": "object", "required": ["amount"],
                        "properties": {"amount": {"type": "integer", "minimum": 0}}}),
                    example: json!({"amount": 1}),
                },
            ],
        }
    }

    #[test]
    fn the_newest_version_decides_by_the_types_mode() {
        let (c, problems) =
            Catalog::compile(&[order(ValidationMode::Enforce)], ValidationMode::Off);
        assert!(problems.is_empty());
        assert_eq!(c.check("order.paid", br#"{"amount":3}"#), Verdict::Valid);
        match c.check("order.paid", br#"{"amount":-3}"#) {
            Verdict::Invalid {
                mode: ValidationMode::Enforce,
                listed: true,
                violation,
            } => assert_eq!(violation.pointer, "/amount"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.check("order.other", b"[1"), Verdict::Unchecked);
        let (c, _) = Catalog::compile(&[order(ValidationMode::Off)], ValidationMode::Warn);
        assert_eq!(c.check("order.paid", b"{}"), Verdict::Unchecked);
        assert!(matches!(
            c.check("order.other", b"{}"),
            Verdict::Invalid {
                mode: ValidationMode::Warn,
                listed: false,
                ..
            }
        ));
    }

    #[test]
    fn a_type_that_no_longer_compiles_is_left_out_and_named() {
        let mut bad = order(ValidationMode::Enforce);
        bad.versions[1].schema = json!({"$ref": "https://example.invalid/x"});
        let (c, problems) = Catalog::compile(&[bad], ValidationMode::Off);
        assert!(c.is_empty());
        assert_eq!(problems[0].0, "order.paid");
    }
}
