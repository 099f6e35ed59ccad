//! The broker's module graph, read from its source: the top-level modules of
//! `host-broker/src` form a DAG (no module reaches back into one that
//! depends on it), and the owner and the lifecycle verbs name no engine.
//!
//! A use is any `crate::<module>` path outside comments and outside the
//! unit tests (`#[cfg(test)] mod tests` and `src/owner/tests/`), which may
//! reach anywhere.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, unit-test directories left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its unit tests and without comments.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file belongs to (`owner` for `src/owner.rs` and
/// `src/owner/ops.rs`); `None` for the crate root and the binaries.
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "bin").then_some(name)
}

/// The modules `code` names with `crate::…`, including `use crate::{a, b}`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                found.insert(ident(part.trim()));
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = module_of(file) else {
            continue;
        };
        for to in uses(&code(file)) {
            if to != from && modules.contains(&to) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// A cycle through `node`, if the walk from it finds one.
fn cycle_from(
    node: &str,
    edges: &BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|n| n == node) {
        let mut cycle = path[at..].to_vec();
        cycle.push(node.to_owned());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_owned());
    for next in edges.get(node).into_iter().flatten() {
        if let Some(cycle) = cycle_from(next, edges, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(node.to_owned());
    None
}

#[test]
fn the_top_level_modules_form_a_dag() {
    let edges = graph();
    assert!(
        edges
            .get("owner")
            .is_some_and(|to| to.contains("lifecycle")),
        "the reader finds no uses at all: {edges:?}"
    );
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(cycle) = cycle_from(node, &edges, &mut Vec::new(), &mut done) {
            panic!("module cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_reader_sees_a_cycle_when_there_is_one() {
    let edges = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    let cycle = cycle_from("a", &edges, &mut Vec::new(), &mut BTreeSet::new());
    assert_eq!(cycle.unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(
        uses("use crate::{engine::Backend, store};\nlet x = crate::guest::call();"),
        BTreeSet::from(["engine".into(), "store".into(), "guest".into()])
    );
}

#[test]
fn the_owner_and_the_lifecycle_name_no_engine() {
    let mut files = vec![src().join("owner.rs")];
    sources(&src().join("owner"), &mut files);
    sources(&src().join("lifecycle"), &mut files);
    for file in files {
        let code = code(&file);
        for word in ["docker", "Docker", "container_name", "bollard"] {
            assert!(
                !code.contains(word),
                "{} names {word}",
                file.strip_prefix(src()).unwrap().display()
            );
        }
    }
}
