//! The code's layout holds: no two files of a crate import each other in a circle, and each room of the node loop imports only the rooms its `//!` allows.
//!
//! Imports are read from the source text: every `crate::a::b` and `super::a` path outside
//! comments and test modules names the file it reaches (the longest module path that is a file).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside its crate, e.g. `["actual", "store"]`; the crate root is empty.
type Module = Vec<String>;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/ holds this crate").to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file under `src` is (`lib.rs`, `main.rs` and `mod.rs` name their directory).
fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).expect("file under src").with_extension("");
    let mut parts: Module = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|l| l == "lib" || l == "main" || l == "mod") {
        parts.pop();
    }
    parts
}

/// The source without comments and without its test module.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines()
        .map(|line| if line.trim_start().starts_with("//") { "" } else { line })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `a::b::c` identifiers following each occurrence of `prefix` in `code`, a use group
/// (`crate::{a, b::{c, d}}`) read as each of its paths.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        found.extend(paths_at(&code[at + prefix.len()..]));
    }
    found
}

/// The paths a use tree at the start of `rest` names: `a::b`, or a group `{…}` after it.
fn paths_at(rest: &str) -> Vec<Vec<&str>> {
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
    let head: Vec<&str> = rest[..end].split("::").filter(|p| !p.is_empty()).collect();
    let Some(group) = rest[end..].strip_prefix('{') else { return vec![head] };
    let mut out = Vec::new();
    let (mut depth, mut item_start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.extend(group_item(&head, &group[item_start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.extend(group_item(&head, &group[item_start..i]));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    out
}

/// One item of a use group, prefixed with the group's own path.
fn group_item<'a>(head: &[&'a str], item: &'a str) -> Vec<Vec<&'a str>> {
    let item = item.trim();
    if item.is_empty() || item == "self" {
        return vec![head.to_vec()];
    }
    paths_at(item).into_iter().map(|tail| head.iter().copied().chain(tail).collect()).collect()
}

/// Each file's module and the other files of its crate it imports.
fn imports(crate_dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let src = crate_dir.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        let code = code_of(&std::fs::read_to_string(file).expect("readable source"));
        let is_dir_module =
            file.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let parent: Module =
            if is_dir_module { module.clone() } else { module[..module.len().saturating_sub(1)].to_vec() };
        let mut targets = BTreeSet::new();
        let absolute =
            paths_after(&code, "crate::").into_iter().map(|p| p.iter().map(|s| s.to_string()).collect());
        let relative = paths_after(&code, "super::").into_iter().map(|p| {
            let base = if is_dir_module { &parent[..parent.len().saturating_sub(1)] } else { &parent[..] };
            base.iter().cloned().chain(p.iter().map(|s| s.to_string())).collect::<Module>()
        });
        for path in absolute.chain(relative) {
            let path: Module = path;
            let Some(target) =
                (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| modules.contains(m))
            else {
                continue;
            };
            // A file's own module, or a module containing it, is not an import of another file.
            if target != module && !module.starts_with(&target) {
                targets.insert(target);
            }
        }
        graph.insert(module, targets);
    }
    graph
}

/// The circles of `graph` (strongly connected parts of more than one file).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    // Reachability is enough at this size (a crate has tens of files).
    let reach = |from: &Module| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&Module, BTreeSet<Module>> = graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<Module>> = Vec::new();
    for (module, reach) in &reached {
        if !reach.contains(*module) {
            continue;
        }
        let mut circle: Vec<Module> =
            reach.iter().filter(|other| reached[other].contains(*module)).cloned().collect();
        circle.sort();
        if !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

fn workspace_crates() -> Vec<PathBuf> {
    let mut crates: Vec<PathBuf> = std::fs::read_dir(crates_dir())
        .expect("crates/ is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .collect();
    crates.sort();
    crates
}

#[test]
fn no_two_files_of_a_crate_import_each_other_in_a_circle() {
    let crates = workspace_crates();
    assert!(crates.len() >= 10, "found only {crates:?}");
    let mut found = Vec::new();
    for dir in &crates {
        for circle in circles(&imports(dir)) {
            let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
            found.push(format!(
                "{}: {}",
                dir.file_name().unwrap_or_default().to_string_lossy(),
                names.join(" ⇄ ")
            ));
        }
    }
    assert!(found.is_empty(), "file-level import circles:\n{}", found.join("\n"));
}

#[test]
fn the_circle_check_finds_a_circle_where_there_is_one() {
    // Two files that name each other, as the check reads them: if this finds nothing, the
    // check above proves nothing.
    let dir = tempfile::tempdir().expect("temporary directory");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("room")).expect("src/room");
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod room;\n").expect("lib.rs");
    std::fs::write(src.join("a.rs"), "use crate::room::b::Thing;\n// crate::nothing in a comment\n")
        .expect("a.rs");
    std::fs::write(src.join("room/mod.rs"), "pub mod b;\n").expect("mod.rs");
    std::fs::write(src.join("room/b.rs"), "pub struct Thing;\nfn f() { crate::a::g() }\n").expect("b.rs");
    let found = circles(&imports(dir.path()));
    let want: Vec<Module> = vec![vec!["a".into()], vec!["room".into(), "b".into()]];
    assert_eq!(found, vec![want]);
    // The same circle through use groups and a path call on the module a group brought in.
    std::fs::write(src.join("a.rs"), "use crate::{error, room::{self, b}};\nfn g() { b::Thing; }\n")
        .expect("a.rs");
    std::fs::write(src.join("room/b.rs"), "use crate::{a, error::E};\nfn f() { a::g() }\n").expect("b.rs");
    std::fs::write(src.join("error.rs"), "pub struct E;\n").expect("error.rs");
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod error;\npub mod room;\n").expect("lib.rs");
    assert_eq!(
        circles(&imports(dir.path())),
        vec![vec![vec!["a".to_string()], vec!["room".into(), "b".into()]]]
    );
}

/// The node loop's rooms (`kvol-node/src`) and the rooms each may import, as their `//!` says;
/// `model` and `config` are the vocabulary and settings every room may read.
const NODE_ROOMS: &[(&str, &[&str])] = &[
    ("sources", &[]),
    ("desired", &["sources", "reconciler"]),
    ("reconciler", &[]),
    ("executor", &["actual", "report"]),
    ("actual", &["sources", "desired", "executor"]),
    ("report", &["reconciler", "executor"]),
    ("runtime", &["report", "sources"]),
];

#[test]
fn each_room_of_the_node_loop_imports_only_what_it_may() {
    let graph = imports(&crates_dir().join("kvol-node"));
    let mut wrong = Vec::new();
    for (module, targets) in &graph {
        let Some(room) = module.first() else { continue };
        let Some((_, allowed)) = NODE_ROOMS.iter().find(|(name, _)| name == room) else { continue };
        for target in targets {
            let other = target.first().map(String::as_str).unwrap_or_default();
            let fine = other == room || ["model", "config"].contains(&other) || allowed.contains(&other);
            if !fine {
                wrong.push(format!("{} imports {}", module.join("::"), target.join("::")));
            }
        }
    }
    for (room, _) in NODE_ROOMS {
        assert!(
            graph.keys().any(|m| m.first().is_some_and(|f| f == room)),
            "no room {room} in kvol-node/src"
        );
    }
    assert!(wrong.is_empty(), "imports across rooms that the rooms' docs forbid:\n{}", wrong.join("\n"));
}

/// Each function of `code` (by its `fn` line and the closing brace at the same indent) and its
/// length in lines.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let signature = trimmed
            .trim_start_matches("pub ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("async ");
        let Some(rest) = signature.strip_prefix("fn ") else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i..].iter().position(|l| *l == close) {
            out.push((name, end + 1));
        }
    }
    out
}

#[test]
fn the_agents_hall_stays_small_each_file_under_800_lines_and_no_function_over_80() {
    let agent = crates_dir().join("kvol-node/src/agent");
    let mut files = Vec::new();
    rust_files(&agent, &mut files);
    assert!(files.len() >= 2, "the agent is a folder of rooms: {}", agent.display());
    let mut too_big = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        if text.lines().count() >= 800 {
            too_big.push(format!("{}: {} lines", file.display(), text.lines().count()));
        }
        for (name, length) in function_lengths(&code_of(&text)) {
            if length > 80 {
                too_big.push(format!("{}: fn {name} is {length} lines", file.display()));
            }
        }
    }
    assert!(too_big.is_empty(), "the hall grows again:\n{}", too_big.join("\n"));
    // The measure itself: a function of 3 lines is 3 lines long.
    assert_eq!(function_lengths("fn a() {\n    b();\n}\n"), vec![("a".to_string(), 3)]);
}
