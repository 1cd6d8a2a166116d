//! The shape of the code, checked: no two files of one crate import each
//! other, directly or round a circle. A circle means neither file can be
//! read, changed or tested without the other, and it is how the 12-file
//! circle of `engine/src` grew one convenient import at a time.
//!
//! Read from the source, as a reader would: every `use` and every inline
//! `crate::`/`super::`/`self::` path, resolved to the file that defines the
//! name (through the `pub use` of a `mod.rs` or `lib.rs` that only hands a
//! name on). Paths into other crates (`flashsale::` from the binary or the
//! bench) cannot close a circle: a library never imports its users.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One crate: the folder its module paths start from, and its files.
struct Crate {
    root: PathBuf,
    files: Vec<PathBuf>,
}

/// An import: the file that imports, the file it reaches, and the path.
#[derive(Debug, Clone)]
struct Arrow {
    from: PathBuf,
    to: PathBuf,
    path: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crates of the workspace whose files may import each other: the
/// engine's library, its binary (`main.rs` and `cli/`), the bench and the
/// test support library.
fn workspace_crates(workspace: &Path) -> Vec<Crate> {
    let engine = workspace.join("engine/src");
    let mut engine_files = Vec::new();
    rust_files(&engine, &mut engine_files);
    let (bin, lib): (Vec<_>, Vec<_>) = engine_files.into_iter().partition(|f| {
        f.starts_with(engine.join("cli")) || f.ends_with("main.rs") && f.parent() == Some(&engine)
    });
    let mut bench = Vec::new();
    rust_files(&workspace.join("bench/src"), &mut bench);
    let support_root = workspace.join("tests/src");
    let mut support = Vec::new();
    rust_files(&support_root, &mut support);
    // Each file under bin/ is a crate of one file.
    support.retain(|f| !f.starts_with(support_root.join("bin")));
    vec![
        Crate {
            root: engine.clone(),
            files: lib,
        },
        Crate {
            root: engine,
            files: bin,
        },
        Crate {
            root: workspace.join("bench/src"),
            files: bench,
        },
        Crate {
            root: support_root,
            files: support,
        },
    ]
}

/// A file's module path inside its crate: `lock/client.rs` is
/// `["lock", "client"]`, `lock/mod.rs` is `["lock"]`, the root is `[]`.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source with comments, string literals and inline test modules
/// taken out (a test module's `super::` is its own file, and what it
/// imports is the test's business).
fn code_of(text: &str) -> String {
    let code = strip(text);
    without_test_modules(&code)
}

/// `code` without its `#[cfg(test)] mod name { ... }` blocks.
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        let is_block = after.starts_with("mod ") && after.find('{') < after.find(';');
        if !is_block {
            out.push_str("#[cfg(test)]");
            rest = &rest[at + "#[cfg(test)]".len()..];
            continue;
        }
        let open = after.find('{').unwrap_or(0);
        let mut depth = 0;
        let mut end = after.len();
        for (i, ch) in after[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `text` with comments taken out and string and char literals emptied.
fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A char literal such as '{' (a lifetime has no closing quote).
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            // An escaped char literal: '\n', '\'', '\u{7f}'.
            i += 3;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
        } else {
            // Paths are ASCII: anything else is a space, so byte offsets
            // into the result stay on character boundaries.
            out.push(if b[i].is_ascii() { b[i] as char } else { ' ' });
            i += 1;
        }
    }
    out
}

/// The full paths a `use` tree names: `a::{b, c::{d, e as f}, g::*}` gives
/// `a::b`, `a::c::d`, `a::c::e` (the name it is known by is not needed
/// here), `a::g`.
fn expand_use(tree: &str) -> Vec<String> {
    // `x as y`: the path is `x`; what it is called here does not matter.
    let mut words = tree.split_whitespace().peekable();
    let mut bare = String::new();
    while let Some(w) = words.next() {
        if w == "as" {
            // The new name, with whatever punctuation follows it.
            let renamed = words.next().unwrap_or("");
            bare.extend(
                renamed
                    .chars()
                    .skip_while(|c| c.is_alphanumeric() || *c == '_'),
            );
        } else {
            bare.push_str(w);
        }
    }
    let tree = bare;
    let mut out = Vec::new();
    expand_into("", &tree, &mut out);
    out
}

fn expand_into(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let join = |p: &str, s: &str| {
        if p.is_empty() {
            s.to_string()
        } else if s.is_empty() {
            p.to_string()
        } else {
            format!("{p}::{s}")
        }
    };
    match tree.find('{') {
        Some(open) if tree.ends_with('}') => {
            let head = tree[..open].trim_end_matches("::");
            let inner = &tree[open + 1..tree.len() - 1];
            let mut depth = 0;
            let mut start = 0;
            for (i, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand_into(&join(prefix, head), &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand_into(&join(prefix, head), &inner[start..], out);
        }
        _ => {
            let name = tree.trim_end_matches("::*").trim_end_matches("::");
            if !name.is_empty() && name != "*" {
                out.push(join(prefix, name));
            }
        }
    }
}

/// Every `use` statement of `code` (with its `pub` if any), and every other
/// path that starts at `crate`, `super` or `self`.
fn paths_in(code: &str) -> (Vec<(bool, String)>, Vec<String>) {
    let mut uses = Vec::new();
    let mut rest = String::new();
    let mut cursor = 0;
    while let Some(found) = find_use(code, cursor) {
        let (start, tree_start, public) = found;
        rest.push_str(&code[cursor..start]);
        let end = code[tree_start..]
            .find(';')
            .map_or(code.len(), |e| tree_start + e);
        for path in expand_use(&code[tree_start..end]) {
            uses.push((public, path));
        }
        cursor = (end + 1).min(code.len());
    }
    rest.push_str(&code[cursor..]);
    let mut inline = Vec::new();
    let bytes = rest.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|s| rest[i..].starts_with(**s));
        if starts.is_some() && (i == 0 || !ident(bytes[i - 1]) && bytes[i - 1] != b':') {
            let mut j = i;
            while j < bytes.len() && (ident(bytes[j]) || bytes[j] == b':') {
                j += 1;
            }
            inline.push(rest[i..j].trim_end_matches(':').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    (uses, inline)
}

/// The next `use` at or after `from`: where the statement starts, where its
/// tree starts, and whether it is `pub` (any visibility).
fn find_use(code: &str, from: usize) -> Option<(usize, usize, bool)> {
    let bytes = code.as_bytes();
    let mut at = from;
    while let Some(found) = code[at..].find("use ") {
        let pos = at + found;
        let line_start = code[..pos]
            .rfind(['\n', ';', '{', '}'])
            .map_or(0, |p| p + 1);
        let before = code[line_start..pos].trim();
        let public = before.starts_with("pub");
        let fits = before.is_empty() || public && !before.contains(' ') || before == "pub(crate)";
        let word_start =
            pos == 0 || !(bytes[pos - 1].is_ascii_alphanumeric() || bytes[pos - 1] == b'_');
        if fits && word_start {
            let start = if before.is_empty() { pos } else { line_start };
            return Some((start, pos + 4, public));
        }
        at = pos + 4;
    }
    None
}

/// The files of one crate, by module path, with what each hands on by
/// `pub use` (name it is known by -> full path).
struct Modules<'a> {
    krate: &'a Crate,
    files: BTreeMap<Vec<String>, PathBuf>,
    handed_on: BTreeMap<PathBuf, BTreeMap<String, String>>,
}

impl<'a> Modules<'a> {
    fn new(krate: &'a Crate, sources: &BTreeMap<PathBuf, String>) -> Self {
        let files = krate
            .files
            .iter()
            .map(|f| (module_of(&krate.root, f), f.clone()))
            .collect();
        let mut handed_on = BTreeMap::new();
        for f in &krate.files {
            let (uses, _) = paths_in(&sources[f]);
            let names: BTreeMap<String, String> = uses
                .into_iter()
                .filter(|(public, _)| *public)
                .filter_map(|(_, p)| Some((p.rsplit("::").next()?.to_string(), p)))
                .collect();
            handed_on.insert(f.clone(), names);
        }
        Modules {
            krate,
            files,
            handed_on,
        }
    }

    /// The file that defines what `path` names, seen from `file`; None for
    /// paths out of the crate or into a file's own body.
    fn resolve(&self, file: &Path, path: &str, depth: usize) -> Option<PathBuf> {
        if depth > 8 {
            return None;
        }
        let here = module_of(&self.krate.root, file);
        let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
        let mut module: Vec<String> = match *segments.peek()? {
            "crate" => {
                segments.next();
                Vec::new()
            }
            "super" | "self" => {
                let mut m = here.clone();
                while let Some(s) = segments.peek() {
                    match *s {
                        "super" => {
                            m.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    segments.next();
                }
                m
            }
            // A path relative to the file's own module (`use client::X` in
            // a mod.rs): its first segment must name a child module.
            first => {
                let mut child = here.clone();
                child.push(first.to_string());
                if !self.files.contains_key(&child) {
                    return None;
                }
                here
            }
        };
        let mut name = None;
        for seg in segments {
            let mut next = module.clone();
            next.push(seg.to_string());
            if name.is_none() && self.files.contains_key(&next) {
                module = next;
            } else {
                name = Some(seg.to_string());
                break;
            }
        }
        let target = self.files.get(&module)?.clone();
        // A name the module only hands on: follow it to where it is made.
        if let Some(name) = name {
            if let Some(origin) = self.handed_on.get(&target).and_then(|h| h.get(&name)) {
                if let Some(found) = self.resolve(&target, origin, depth + 1) {
                    return Some(found);
                }
            }
        }
        Some(target)
    }
}

/// Every arrow between two files of `krate`.
fn arrows(krate: &Crate, sources: &BTreeMap<PathBuf, String>) -> Vec<Arrow> {
    let modules = Modules::new(krate, sources);
    let mut out = Vec::new();
    for file in &krate.files {
        let (uses, inline) = paths_in(&sources[file]);
        let here = module_of(&krate.root, file);
        let uses = uses.into_iter();
        for (public, path) in uses.chain(inline.into_iter().map(|p| (false, p))) {
            if let Some(to) = modules.resolve(file, &path, 0) {
                // A module handing on a name of its own submodule is its
                // face, not an import: the parent owns its children.
                let below = |to: &Path| {
                    let there = module_of(&krate.root, to);
                    there.len() > here.len() && there.starts_with(&here)
                };
                if &to != file && !(public && below(&to)) {
                    out.push(Arrow {
                        from: file.clone(),
                        to,
                        path,
                    });
                }
            }
        }
    }
    out
}

/// The circles among `arrows`: each a set of two or more files that all
/// reach each other (Tarjan's strongly connected components).
fn circles(arrows: &[Arrow]) -> Vec<BTreeSet<PathBuf>> {
    let mut next: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
    for a in arrows {
        next.entry(&a.from).or_default().insert(&a.to);
        next.entry(&a.to).or_default();
    }
    struct Walk<'a> {
        next: &'a BTreeMap<&'a PathBuf, BTreeSet<&'a PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<BTreeSet<PathBuf>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a PathBuf) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        w.on_stack.insert(v);
        for &u in &w.next[v] {
            if !w.index.contains_key(u) {
                visit(w, u);
                let lu = w.low[u];
                let lv = w.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lu);
            } else if w.on_stack.contains(u) {
                let iu = w.index[u];
                let lv = w.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iu);
            }
        }
        if w.low[v] == w.index[v] {
            let mut part = BTreeSet::new();
            while let Some(u) = w.stack.pop() {
                w.on_stack.remove(u);
                part.insert(u.clone());
                if u == v {
                    break;
                }
            }
            if part.len() > 1 {
                w.found.push(part);
            }
        }
    }
    let mut walk = Walk {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in next.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.found
}

/// The circles of `crates`, each told with the arrows that close it.
fn circles_told(crates: &[Crate]) -> Vec<String> {
    let mut told = Vec::new();
    for krate in crates {
        let sources: BTreeMap<PathBuf, String> = krate
            .files
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                (f.clone(), code_of(&text))
            })
            .collect();
        let arrows = arrows(krate, &sources);
        for circle in circles(&arrows) {
            let ties: Vec<String> = arrows
                .iter()
                .filter(|a| circle.contains(&a.from) && circle.contains(&a.to))
                .map(|a| format!("{} -> {} ({})", a.from.display(), a.to.display(), a.path))
                .collect();
            told.push(ties.join("\n  "));
        }
    }
    told
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

#[test]
fn no_two_files_of_a_crate_import_each_other_round_a_circle() {
    let crates = workspace_crates(&workspace());
    let files: usize = crates.iter().map(|c| c.files.len()).sum();
    assert!(files > 80, "the workspace's files were found: {files}");
    let told = circles_told(&crates);
    assert!(
        told.is_empty(),
        "import circles:\n  {}",
        told.join("\n\n  ")
    );
}

/// The lock module stands alone: it imports nothing of the inventory
/// side (its scripts, replies, keys, engine), only what both sides share:
/// the scripts' common shape (`lua.rs`), metrics, redaction of URLs, the
/// TLS files (`tls.rs`, which imports nothing of the crate), and the
/// planted-bug hooks. Anything else reached from `lock/` is named.
#[test]
fn the_lock_module_imports_nothing_of_the_inventory() {
    let crates = workspace_crates(&workspace());
    let lib = &crates[0];
    let lock = lib.root.join("lock");
    let shared =
        ["lua.rs", "metrics.rs", "redact.rs", "planted.rs", "tls.rs"].map(|f| lib.root.join(f));
    let sources: BTreeMap<PathBuf, String> = lib
        .files
        .iter()
        .map(|f| {
            (
                f.clone(),
                code_of(&std::fs::read_to_string(f).unwrap_or_default()),
            )
        })
        .collect();
    let all = arrows(lib, &sources);
    let from_lock: Vec<&Arrow> = all.iter().filter(|a| a.from.starts_with(&lock)).collect();
    assert!(
        from_lock.iter().any(|a| a.to.ends_with("lua.rs")),
        "the lock module's imports were read: {from_lock:?}"
    );
    let outside: Vec<String> = from_lock
        .iter()
        .filter(|a| {
            // By the file reached, and by the path's own words: a name the
            // inventory hands on (`crate::replies::BadReply`) is still
            // reached through it.
            let named = a.path.strip_prefix("crate::").map(|p| p.split("::").next());
            let named_outside = named.is_some_and(|m| {
                !matches!(
                    m,
                    Some("lock" | "lua" | "metrics" | "redact" | "planted" | "tls")
                )
            });
            named_outside || (!a.to.starts_with(&lock) && !shared.contains(&a.to))
        })
        .map(|a| format!("{} -> {} ({})", a.from.display(), a.to.display(), a.path))
        .collect();
    assert!(
        outside.is_empty(),
        "lock/ reaches the inventory:\n  {}",
        outside.join("\n  ")
    );
}

/// The check itself can fail: a crate written with a circle through a
/// `mod.rs` that hands a name on, and one through an inline path, are
/// both found; the same files without the back arrow are not.
#[test]
fn a_circle_through_a_handed_on_name_or_an_inline_path_is_found() {
    let dir = tempfile::TempDir::new().expect("dir");
    let root = dir.path();
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write("lib.rs", "mod lock;\nmod other;\npub use lock::Client;\n");
    write(
        "lock/mod.rs",
        "mod client;\nmod gate;\npub use client::{Client, Held as H};\n",
    );
    write(
        "lock/client.rs",
        "use super::gate::Gate;\n// use super::nothing::Here;\npub struct Client;\npub struct Held;\n",
    );
    write(
        "lock/gate.rs",
        "pub struct Gate(Option<super::Client>);\nfn f() { let s = \"crate::other::X\"; }\n",
    );
    write(
        "other.rs",
        "use crate::{lock::Client as C};\npub struct X;\n",
    );
    let krate = |root: &Path| {
        let mut files = Vec::new();
        rust_files(root, &mut files);
        Crate {
            root: root.to_path_buf(),
            files,
        }
    };
    let told = circles_told(&[krate(root)]);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains("gate.rs -> ") && told[0].contains("client.rs (super::Client)"),
        "the inline path through the handed-on name closes it: {told:?}"
    );
    assert!(!told[0].contains("other.rs"), "{told:?}");

    write("lock/gate.rs", "pub struct Gate;\n");
    assert!(circles_told(&[krate(root)]).is_empty());

    write(
        "lock/gate.rs",
        "use crate::lock::{client::{Held}, gate as _me};\npub struct Gate;\n",
    );
    let told = circles_told(&[krate(root)]);
    assert_eq!(told.len(), 1, "a nested use tree closes it too: {told:?}");

    write(
        "lock/gate.rs",
        "pub struct Gate;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn f() { let c = '{'; }\n}\nuse super::client::Passage;\n",
    );
    write(
        "lock/client.rs",
        "use super::gate::Gate;\npub struct Client;\npub struct Held;\npub struct Passage;\n",
    );
    let told = circles_told(&[krate(root)]);
    assert_eq!(
        told.len(),
        1,
        "an import after a test module, of a name with `as` in it, closes it: {told:?}"
    );
    assert!(told[0].contains("(super::client::Passage)"), "{told:?}");
}
