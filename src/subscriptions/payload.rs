//! Payload filters: which events of the types it receives a subscription is sent, by what their
//! payload holds (`{"data.amount": {"$gt": 100}, "data.country": {"$in": ["DE", "FR"]}}`).
//!
//! The language, small on purpose (docs/subscriptions.md is its manual):
//!
//! - A filter is a JSON object; every one of its members must hold (`{}` holds for everything).
//! - `"$and": [filter, ...]`, `"$or": [filter, ...]` (at least one) and `"$not": filter`.
//! - Any other member names a path into the payload, dot-separated (`data.items.0.sku`: a segment
//!   of digits also indexes an array), and says what must hold there: a value (equal to it), or an
//!   object of operators, all of which must hold: `$eq`, `$neq`, `$in`, `$nin` (a list),
//!   `$gt`, `$gte`, `$lt`, `$lte` (a number or a string: numbers compare as numbers, strings by
//!   their bytes, anything else never compares), `$exists` (true or false).
//! - A path the payload does not have is not equal to anything: `$neq` and `$nin` hold there,
//!   every other test but `$exists: false` fails. `null` is a value: `$exists` holds for it.
//! - Numbers are equal by value (`1` equals `1.0`).
//!
//! A filter is checked and compiled once, when the subscription is written or read; evaluating it
//! walks the payload along its paths and nothing else: no regular expressions, bounded depth,
//! size and count of tests ([`MAX_DEPTH`], [`MAX_TESTS`], [`MAX_LIST`], [`MAX_BYTES`]).

use serde_json::Value;

/// The deepest nesting of `$and`, `$or`, `$not` and operator objects.
pub const MAX_DEPTH: usize = 8;
/// The most tests (a path and one operator) in one filter.
pub const MAX_TESTS: usize = 64;
/// The most values in one `$in` or `$nin` list, and filters in one `$and` or `$or`.
pub const MAX_LIST: usize = 256;
/// The most bytes of a filter, as compact JSON.
pub const MAX_BYTES: usize = 8 * 1024;
/// The most segments of one path.
pub const MAX_SEGMENTS: usize = 16;

/// Why a filter is refused: where in it (`$and[1].data.amount.$gt`), and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{problem}", if at.is_empty() { String::new() } else { format!("at {at}: ") })]
pub struct PayloadFilterError {
    /// The place in the filter, empty for the whole.
    pub at: String,
    pub problem: String,
}

fn refuse(at: &str, problem: impl Into<String>) -> PayloadFilterError {
    PayloadFilterError {
        at: at.to_owned(),
        problem: problem.into(),
    }
}

/// A filter, checked and compiled, with the JSON it was written as (stored and shown as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadFilter {
    written: Value,
    root: Node,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    All(Vec<Node>),
    Any(Vec<Node>),
    Not(Box<Node>),
    Test { path: Vec<String>, op: Op },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(Value),
    Neq(Value),
    In(Vec<Value>),
    Nin(Vec<Value>),
    Cmp(Cmp, Value),
    Exists(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Gt,
    Gte,
    Lt,
    Lte,
}

/// Counts what a filter spends of its bounds while it is compiled.
struct Budget {
    tests: usize,
}

impl PayloadFilter {
    /// Checks and compiles `written`.
    pub fn compile(written: &Value) -> Result<Self, PayloadFilterError> {
        let bytes = serde_json::to_vec(written).map_or(usize::MAX, |b| b.len());
        if bytes > MAX_BYTES {
            return Err(refuse(
                "",
                format!("{bytes} bytes; a filter is at most {MAX_BYTES}"),
            ));
        }
        // PostgreSQL's jsonb cannot hold U+0000, and no payload hookrelay stores can either.
        if holds_nul(written) {
            return Err(refuse("", "a filter may not hold the character U+0000"));
        }
        let mut budget = Budget { tests: 0 };
        let root = filter(written, "", 0, &mut budget)?;
        Ok(Self {
            written: written.clone(),
            root,
        })
    }

    /// The filter as written.
    pub fn as_json(&self) -> &Value {
        &self.written
    }

    /// Whether `payload` passes.
    pub fn matches(&self, payload: &Value) -> bool {
        self.root.holds(payload)
    }
}

fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(members) => members
            .iter()
            .any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

fn place(at: &str, next: &str) -> String {
    if at.is_empty() {
        next.to_owned()
    } else if next.starts_with('[') {
        format!("{at}{next}")
    } else {
        format!("{at}.{next}")
    }
}

fn filter(
    value: &Value,
    at: &str,
    depth: usize,
    budget: &mut Budget,
) -> Result<Node, PayloadFilterError> {
    if depth >= MAX_DEPTH {
        return Err(refuse(at, format!("nested deeper than {MAX_DEPTH} levels")));
    }
    let Value::Object(members) = value else {
        return Err(refuse(
            at,
            "a filter is a JSON object of paths and $and, $or, $not",
        ));
    };
    let mut all = Vec::with_capacity(members.len());
    for (key, inner) in members {
        let here = place(at, key);
        let node = match key.as_str() {
            "$and" | "$or" => {
                let Value::Array(list) = inner else {
                    return Err(refuse(&here, "expects a list of filters"));
                };
                if list.is_empty() || list.len() > MAX_LIST {
                    return Err(refuse(
                        &here,
                        format!("expects 1 to {MAX_LIST} filters, not {}", list.len()),
                    ));
                }
                let nodes = list
                    .iter()
                    .enumerate()
                    .map(|(i, f)| filter(f, &format!("{here}[{i}]"), depth + 1, budget))
                    .collect::<Result<Vec<_>, _>>()?;
                if key == "$and" {
                    Node::All(nodes)
                } else {
                    Node::Any(nodes)
                }
            }
            "$not" => Node::Not(Box::new(filter(inner, &here, depth + 1, budget)?)),
            op if op.starts_with('$') => {
                return Err(refuse(
                    &here,
                    "unknown here: a filter's members are paths, $and, $or and $not",
                ));
            }
            path => {
                let path = parse_path(path, &here)?;
                tests(path, inner, &here, depth + 1, budget)?
            }
        };
        all.push(node);
    }
    Ok(match all.len() {
        1 => all.pop().unwrap_or(Node::All(Vec::new())),
        _ => Node::All(all),
    })
}

fn parse_path(path: &str, at: &str) -> Result<Vec<String>, PayloadFilterError> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    if segments.iter().any(String::is_empty) {
        return Err(refuse(
            at,
            "a path is dot-separated names, none empty (data.amount)",
        ));
    }
    if segments.len() > MAX_SEGMENTS {
        return Err(refuse(
            at,
            format!("a path has at most {MAX_SEGMENTS} segments"),
        ));
    }
    Ok(segments)
}

/// What must hold at `path`: a value, or an object of operators.
fn tests(
    path: Vec<String>,
    value: &Value,
    at: &str,
    depth: usize,
    budget: &mut Budget,
) -> Result<Node, PayloadFilterError> {
    let operators = match value {
        Value::Object(m) if m.keys().any(|k| k.starts_with('$')) => m,
        // A value, objects and lists included: equal to it.
        other => return test(path, Op::Eq(other.clone()), at, budget),
    };
    if depth >= MAX_DEPTH {
        return Err(refuse(at, format!("nested deeper than {MAX_DEPTH} levels")));
    }
    let mut nodes = Vec::with_capacity(operators.len());
    for (name, operand) in operators {
        let here = place(at, name);
        let op = match name.as_str() {
            "$eq" => Op::Eq(operand.clone()),
            "$neq" => Op::Neq(operand.clone()),
            "$in" | "$nin" => {
                let Value::Array(list) = operand else {
                    return Err(refuse(&here, "expects a list of values"));
                };
                if list.len() > MAX_LIST {
                    return Err(refuse(
                        &here,
                        format!("at most {MAX_LIST} values, not {}", list.len()),
                    ));
                }
                if name == "$in" {
                    Op::In(list.clone())
                } else {
                    Op::Nin(list.clone())
                }
            }
            "$gt" | "$gte" | "$lt" | "$lte" => {
                if !(operand.is_number() || operand.is_string()) {
                    return Err(refuse(&here, "expects a number or a string"));
                }
                let cmp = match name.as_str() {
                    "$gt" => Cmp::Gt,
                    "$gte" => Cmp::Gte,
                    "$lt" => Cmp::Lt,
                    _ => Cmp::Lte,
                };
                Op::Cmp(cmp, operand.clone())
            }
            "$exists" => match operand {
                Value::Bool(b) => Op::Exists(*b),
                _ => return Err(refuse(&here, "expects true or false")),
            },
            other if other.starts_with('$') => {
                return Err(refuse(
                    &here,
                    "unknown operator; known: $eq, $neq, $in, $nin, $gt, $gte, $lt, $lte, $exists",
                ));
            }
            _ => {
                return Err(refuse(
                    &here,
                    "an object of operators holds operators only ($eq, $in, ...); to compare \
                     with an object, write {\"$eq\": {...}}",
                ));
            }
        };
        nodes.push(test(path.clone(), op, &here, budget)?);
    }
    Ok(match nodes.len() {
        1 => nodes.pop().unwrap_or(Node::All(Vec::new())),
        _ => Node::All(nodes),
    })
}

fn test(
    path: Vec<String>,
    op: Op,
    at: &str,
    budget: &mut Budget,
) -> Result<Node, PayloadFilterError> {
    budget.tests += 1;
    if budget.tests > MAX_TESTS {
        return Err(refuse(
            at,
            format!("a filter makes at most {MAX_TESTS} tests"),
        ));
    }
    Ok(Node::Test { path, op })
}

impl Node {
    fn holds(&self, payload: &Value) -> bool {
        match self {
            Node::All(nodes) => nodes.iter().all(|n| n.holds(payload)),
            Node::Any(nodes) => nodes.iter().any(|n| n.holds(payload)),
            Node::Not(node) => !node.holds(payload),
            Node::Test { path, op } => op.holds(lookup(payload, path)),
        }
    }
}

/// The value at `path`: an object's member, or an array's element for a segment of digits.
fn lookup<'a>(payload: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut here = payload;
    for segment in path {
        here = match here {
            Value::Object(members) => members.get(segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(here)
}

impl Op {
    fn holds(&self, found: Option<&Value>) -> bool {
        match (self, found) {
            (Op::Exists(want), found) => found.is_some() == *want,
            (Op::Neq(v), found) => !found.is_some_and(|f| equal(f, v)),
            (Op::Nin(list), found) => !found.is_some_and(|f| list.iter().any(|v| equal(f, v))),
            (_, None) => false,
            (Op::Eq(v), Some(f)) => equal(f, v),
            (Op::In(list), Some(f)) => list.iter().any(|v| equal(f, v)),
            (Op::Cmp(cmp, v), Some(f)) => compare(f, v).is_some_and(|order| match cmp {
                Cmp::Gt => order.is_gt(),
                Cmp::Gte => order.is_ge(),
                Cmp::Lt => order.is_lt(),
                Cmp::Lte => order.is_le(),
            }),
        }
    }
}

/// JSON equality with numbers equal by value.
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(_), Value::Number(_)) => compare(a, b).is_some_and(|o| o.is_eq()),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| equal(a, b)))
        }
        _ => a == b,
    }
}

/// Two numbers by value (whole numbers exactly), two strings by their bytes; else none.
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                return Some(x.cmp(&y));
            }
            if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                return Some(x.cmp(&y));
            }
            x.as_f64()?.partial_cmp(&y.as_f64()?)
        }
        (Value::String(x), Value::String(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        _ => None,
    }
}

/// An event's payload, parsed once, and only when a filter asks for it.
pub struct Payload<'a> {
    body: &'a [u8],
    parsed: std::cell::OnceCell<Option<Value>>,
}

impl<'a> Payload<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Self {
            body,
            parsed: std::cell::OnceCell::new(),
        }
    }

    /// Whether `filter` (none: everything) lets the payload through. A payload that is not
    /// JSON passes no filter.
    pub fn passes(&self, filter: Option<&PayloadFilter>) -> bool {
        let Some(filter) = filter else {
            return true;
        };
        self.parsed
            .get_or_init(|| serde_json::from_slice(self.body).ok())
            .as_ref()
            .is_some_and(|payload| filter.matches(payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn passes(filter: Value, payload: Value) -> bool {
        PayloadFilter::compile(&filter).unwrap().matches(&payload)
    }

    #[test]
    fn the_operators_do_what_the_manual_says() {
        let order = json!({"data": {"amount": 120, "country": "DE", "tags": ["a", "b"],
            "items": [{"sku": "x1"}], "note": null}});
        for (filter, want) in [
            (json!({}), true),
            (json!({"data.amount": 120}), true),
            (json!({"data.amount": 120.0}), true),
            (json!({"data.amount": {"$gt": 100}}), true),
            (json!({"data.amount": {"$gt": 100, "$lte": 119}}), false),
            (json!({"data.amount": {"$gte": 120, "$lt": 121.5}}), true),
            (json!({"data.country": {"$in": ["DE", "FR"]}}), true),
            (json!({"data.country": {"$nin": ["DE", "FR"]}}), false),
            (json!({"data.country": {"$gt": "CH"}}), true),
            (json!({"data.country": {"$gt": 5}}), false),
            (json!({"data.missing": {"$neq": 1}}), true),
            (json!({"data.missing": {"$nin": [1]}}), true),
            (json!({"data.missing": {"$eq": null}}), false),
            (json!({"data.note": {"$eq": null}}), true),
            (json!({"data.note": {"$exists": true}}), true),
            (json!({"data.missing": {"$exists": false}}), true),
            (json!({"data.items.0.sku": "x1"}), true),
            (json!({"data.items.1.sku": {"$exists": true}}), false),
            (json!({"data.tags": ["a", "b"]}), true),
            (json!({"data.amount.x": {"$exists": true}}), false),
            (
                json!({"$or": [{"data.amount": 1}, {"data.country": "DE"}]}),
                true,
            ),
            (
                json!({"$and": [{"data.amount": 120}, {"data.country": "FR"}]}),
                false,
            ),
            (json!({"$not": {"data.country": "FR"}}), true),
        ] {
            assert_eq!(passes(filter.clone(), order.clone()), want, "{filter}");
        }
    }

    #[test]
    fn a_bad_filter_is_refused_naming_where() {
        for (filter, said) in [
            (json!([1]), "a filter is a JSON object"),
            (json!({"$or": []}), "at $or: expects 1 to 256 filters"),
            (
                json!({"$and": [{"a": 1}, {"b": {"$gt": true}}]}),
                "at $and[1].b.$gt: expects a number or a string",
            ),
            (
                json!({"a": {"$regex": "x"}}),
                "at a.$regex: unknown operator",
            ),
            (json!({"a..b": 1}), "at a..b: a path is dot-separated"),
            (json!({"$where": "x"}), "at $where: unknown here"),
            (json!({"a": {"$in": 3}}), "at a.$in: expects a list"),
            (
                json!({"a": {"$exists": 1}}),
                "at a.$exists: expects true or false",
            ),
            (
                json!({"a": {"$eq": 1, "b": 2}}),
                "at a.b: an object of operators",
            ),
        ] {
            let error = PayloadFilter::compile(&filter).unwrap_err().to_string();
            assert!(error.starts_with(said), "{filter}: {error}");
        }
    }

    #[test]
    fn hostile_filters_are_bounded() {
        let mut deep = json!({"a": 1});
        for _ in 0..MAX_DEPTH {
            deep = json!({ "$not": deep });
        }
        assert!(
            PayloadFilter::compile(&deep)
                .unwrap_err()
                .problem
                .contains("nested deeper")
        );
        let many: serde_json::Map<String, Value> = (0..=MAX_TESTS)
            .map(|i| (format!("k{i}"), json!(i)))
            .collect();
        assert!(
            PayloadFilter::compile(&Value::Object(many))
                .unwrap_err()
                .problem
                .contains("at most 64 tests")
        );
        let long = json!({"a": {"$in": (0..=MAX_LIST).collect::<Vec<_>>()}});
        assert!(PayloadFilter::compile(&long).is_err());
        let big = json!({"a": "x".repeat(MAX_BYTES)});
        assert!(
            PayloadFilter::compile(&big)
                .unwrap_err()
                .problem
                .contains("bytes")
        );
        for nul in [json!({"a\u{0}b": 1}), json!({"a": {"$in": ["x", "\u{0}"]}})] {
            assert!(
                PayloadFilter::compile(&nul)
                    .unwrap_err()
                    .problem
                    .contains("U+0000"),
                "{nul}"
            );
        }
        let mut path = serde_json::Map::new();
        path.insert(vec!["a"; MAX_SEGMENTS + 1].join("."), json!(1));
        assert!(PayloadFilter::compile(&Value::Object(path)).is_err());
    }

    #[test]
    fn a_payload_that_is_not_json_passes_no_filter_but_passes_none() {
        let filter = PayloadFilter::compile(&json!({"$not": {"a": 1}})).unwrap();
        let payload = Payload::new(b"not json");
        assert!(!payload.passes(Some(&filter)));
        assert!(payload.passes(None));
    }

    // The reference: the written filter read directly, as the manual says, with no compiling.
    fn reference(filter: &Value, payload: &Value) -> bool {
        let Value::Object(members) = filter else {
            unreachable!()
        };
        members.iter().all(|(key, inner)| match key.as_str() {
            "$and" => inner
                .as_array()
                .unwrap()
                .iter()
                .all(|f| reference(f, payload)),
            "$or" => inner
                .as_array()
                .unwrap()
                .iter()
                .any(|f| reference(f, payload)),
            "$not" => !reference(inner, payload),
            path => {
                let mut found = Some(payload);
                for segment in path.split('.') {
                    found = match found {
                        Some(Value::Object(m)) => m.get(segment),
                        Some(Value::Array(a)) => {
                            segment.parse::<usize>().ok().and_then(|i| a.get(i))
                        }
                        _ => None,
                    };
                }
                let ops = match inner {
                    Value::Object(m) if m.keys().any(|k| k.starts_with('$')) => m.clone(),
                    other => [("$eq".to_owned(), other.clone())].into_iter().collect(),
                };
                ops.iter().all(|(op, v)| reference_op(op, v, found))
            }
        })
    }

    fn num(v: &Value) -> Option<f64> {
        v.as_f64()
    }

    fn same(a: &Value, b: &Value) -> bool {
        match (num(a), num(b)) {
            (Some(x), Some(y)) => x == y,
            _ => match (a, b) {
                (Value::Array(x), Value::Array(y)) => {
                    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
                }
                (Value::Object(x), Value::Object(y)) => {
                    x.len() == y.len()
                        && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same(a, b)))
                }
                _ => a == b,
            },
        }
    }

    fn reference_op(op: &str, v: &Value, found: Option<&Value>) -> bool {
        match op {
            "$exists" => found.is_some() == v.as_bool().unwrap(),
            "$eq" => found.is_some_and(|f| same(f, v)),
            "$neq" => !found.is_some_and(|f| same(f, v)),
            "$in" => found.is_some_and(|f| v.as_array().unwrap().iter().any(|x| same(f, x))),
            "$nin" => !found.is_some_and(|f| v.as_array().unwrap().iter().any(|x| same(f, x))),
            cmp => {
                let Some(f) = found else { return false };
                let order = match (f, v) {
                    (Value::String(a), Value::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
                    _ => match (num(f), num(v)) {
                        (Some(a), Some(b)) => a.partial_cmp(&b),
                        _ => None,
                    },
                };
                order.is_some_and(|o| match cmp {
                    "$gt" => o.is_gt(),
                    "$gte" => o.is_ge(),
                    "$lt" => o.is_lt(),
                    _ => o.is_le(),
                })
            }
        }
    }

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-5i64..5).prop_map(|n| json!(n)),
            (-5i64..5).prop_map(|n| json!(n as f64 + 0.5)),
            (-5i64..5).prop_map(|n| json!(n as f64)),
            prop::sample::select(vec!["DE", "FR", "US", "", "de"]).prop_map(|s| json!(s)),
        ]
    }

    fn payload() -> impl Strategy<Value = Value> {
        scalar().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec!["a", "b", "c", "0"]).prop_map(str::to_owned),
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "0", "1"]), 1..4)
            .prop_map(|s| s.join("."))
    }

    fn operator() -> impl Strategy<Value = (String, Value)> {
        prop_oneof![
            scalar().prop_map(|v| ("$eq".to_owned(), v)),
            scalar().prop_map(|v| ("$neq".to_owned(), v)),
            prop::collection::vec(scalar(), 0..3).prop_map(|v| ("$in".to_owned(), json!(v))),
            prop::collection::vec(scalar(), 0..3).prop_map(|v| ("$nin".to_owned(), json!(v))),
            (
                prop::sample::select(vec!["$gt", "$gte", "$lt", "$lte"]),
                prop_oneof![
                    (-5i64..5).prop_map(|n| json!(n)),
                    (-5i64..5).prop_map(|n| json!(n as f64 + 0.5)),
                    prop::sample::select(vec!["DE", "FR", "e"]).prop_map(|s| json!(s)),
                ]
            )
                .prop_map(|(op, v)| (op.to_owned(), v)),
            any::<bool>().prop_map(|b| ("$exists".to_owned(), json!(b))),
        ]
    }

    fn test_member() -> impl Strategy<Value = (String, Value)> {
        prop_oneof![
            (path(), scalar()),
            (
                path(),
                prop::collection::vec(operator(), 1..3)
                    .prop_map(|ops| Value::Object(ops.into_iter().collect()))
            ),
        ]
    }

    fn filter_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop::collection::vec(test_member(), 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect()));
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 1..3).prop_map(|l| json!({"$and": l})),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|l| json!({"$or": l})),
                inner.prop_map(|f| json!({"$not": f})),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn the_compiled_filter_agrees_with_the_reference(
            filter in filter_strategy(),
            payload in payload(),
        ) {
            let compiled = PayloadFilter::compile(&filter).unwrap();
            prop_assert_eq!(compiled.matches(&payload), reference(&filter, &payload), "{} on {}", filter, payload);
        }
    }
}
