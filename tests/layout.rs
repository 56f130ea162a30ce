//! The source layout stays as docs/architecture.md describes it: no file of `src/` holds more
//! than 700 lines before its tests, and no two top-level modules import each other (imports
//! point one way, down the layers).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MOST_LINES: usize = 700;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A file's text before its test module (`#[cfg(test)]` then `mod tests`); a test-only item
/// elsewhere is counted as code.
fn before_tests(text: &str) -> &str {
    text.find("\n#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

#[test]
fn no_file_holds_more_than_700_lines_before_its_tests() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut long: Vec<(usize, String)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let lines = before_tests(&text).lines().count();
            (lines, f.strip_prefix(src()).unwrap().display().to_string())
        })
        .filter(|(n, _)| *n > MOST_LINES)
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "split these by concept (lines before the tests): {long:?}"
    );
}

/// The top-level module a file of `src/` belongs to (`delivery` for `delivery/endpoint/mod.rs`).
fn top_module(file: &Path) -> Option<String> {
    let first = file.strip_prefix(src()).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?;
    let name = name.strip_suffix(".rs").unwrap_or(name);
    (name != "lib" && name != "main").then(|| name.to_owned())
}

/// The top-level modules `text` names as `crate::x`, in code (comments left out), including
/// the members of a `use crate::{...}` group.
fn named_modules(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code: String = before_tests(text)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = &group[..group.find('}').unwrap_or(group.len())];
            for part in inside.split(',') {
                let head: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                named.insert(head);
            }
        } else {
            let head: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            named.insert(head);
        }
    }
    named.retain(|m| modules.contains(m));
    named
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(f)).collect();
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let named = named_modules(&text, &modules);
        imports
            .entry(from.clone())
            .or_default()
            .extend(named.into_iter().filter(|m| *m != from));
    }
    let mut mutual = Vec::new();
    for (a, to) in &imports {
        for b in to {
            if a < b && imports.get(b).is_some_and(|back| back.contains(a)) {
                mutual.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(
        mutual.is_empty(),
        "imports must point one way, down the layers: {mutual:?}\n{imports:#?}"
    );
    // The check sees imports at all: the worker's part uses the contract.
    assert!(imports["delivery"].contains("contract"), "{imports:#?}");
}
