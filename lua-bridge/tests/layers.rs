//! The crate's layers, read from its sources: `bridge` below `persist` below `runtime`, below
//! the crate root's own modules (the umbrella error, the facade's re-exports), with no import
//! back up and no import circle among the source files at all.
//!
//! A file's imports are the paths it names in code (`use` trees and paths in expressions and
//! types; comments, doc links, string literals and `#[cfg(test)]` modules do not count)
//! that start at `crate::`, `super::`, `self::` or one of its own child modules. Each is
//! charged to the file that defines the longest module prefix of the path, so
//! `crate::persist::LoadError` is an import of `persist/mod.rs`, and a path through the crate
//! root's re-exports (`crate::Vm`) is an import of `lib.rs`, the top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first. A module's layer is its first path segment's; any other module
/// at the root (and the root itself) is above them all.
const LAYERS: [&str; 3] = ["bridge", "persist", "runtime"];

fn layer(module: &[String]) -> usize {
    module
        .first()
        .and_then(|m| LAYERS.iter().position(|l| l == m))
        .unwrap_or(LAYERS.len())
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "crate (lib.rs)".into()
    } else {
        module.join("::")
    }
}

/// Every `.rs` file under `src`, by module path (`src/a/mod.rs` and `src/a.rs` are `a`).
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            out.insert(module, std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

fn at(c: &[char], k: usize) -> char {
    c.get(k).copied().unwrap_or('\0')
}

/// Whether a string literal (`"`, `b"`, `c"`, `r"`, `r#"`, `br#"`, ...) starts at `i`: whether
/// it is raw, its number of `#`, and where its opening quote is.
fn literal_start(c: &[char], i: usize) -> Option<(bool, usize, usize)> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None; // inside an identifier
    }
    let mut j = i;
    while j < c.len() && matches!(c[j], 'b' | 'c' | 'r') && j - i < 2 {
        j += 1;
    }
    let prefix: String = c[i..j].iter().collect();
    if !matches!(prefix.as_str(), "" | "b" | "c" | "r" | "br" | "cr") {
        return None;
    }
    let raw = prefix.contains('r');
    let hashes = c[j..].iter().take_while(|&&h| h == '#').count();
    if hashes > 0 && !raw {
        return None;
    }
    (c.get(j + hashes) == Some(&'"')).then_some((raw, hashes, j + hashes))
}

/// The source with comments and string, byte-string, raw-string and char literals blanked
/// (newlines kept), so only code is left.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        if c[i] == '/' && at(&c, i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(&c, i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(&c, i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(&c, i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if let Some((raw, hashes, open)) = literal_start(&c, i) {
            let mut j = open + 1; // past the opening quote
            loop {
                if !raw && c[j] == '\\' {
                    j += 2;
                } else if c[j] == '"' && c[j + 1..].iter().take(hashes).all(|&h| h == '#') {
                    j += 1 + hashes;
                    break;
                } else {
                    j += 1;
                }
            }
            for &ch in &c[i..j] {
                blank(&mut out, ch);
            }
            i = j;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a), which stays.
            let end = if at(&c, i + 1) == '\\' {
                (i + 3..c.len()).find(|&k| c[k] == '\'')
            } else if at(&c, i + 2) == '\'' {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Cuts `#[cfg(test)] mod name { ... }` blocks out of code.
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(at) = out.find("#[cfg(test)]") {
        let after = &out[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod ");
        let Some(open) = after.find('{').filter(|_| is_mod) else {
            // Not a test module (a test-only item): blank the attribute only.
            out.replace_range(at..at + "#[cfg(test)]".len(), "            ");
            continue;
        };
        let start = at + "#[cfg(test)]".len() + open;
        let mut depth = 0;
        let mut end = start;
        for (k, ch) in out[start..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = start + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(at..end, "");
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path, // ::
    Open,
    Close,
    Comma,
    Star,
    Other(char),
}

fn tokens(code: &str) -> Vec<Tok> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_alphabetic() || ch == '_' {
            let s: String = c[i..]
                .iter()
                .take_while(|x| x.is_alphanumeric() || **x == '_')
                .collect();
            i += s.chars().count();
            out.push(Tok::Ident(s));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::Path);
            i += 2;
        } else {
            out.push(match ch {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                '*' => Tok::Star,
                _ if ch.is_whitespace() => {
                    i += 1;
                    continue;
                }
                _ => Tok::Other(ch),
            });
            i += 1;
        }
    }
    out
}

/// The paths of a `use` tree starting at `toks[*i]`, each as its segments.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i) {
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 2; // `as alias`
                break;
            }
            Some(Tok::Ident(s)) => {
                if s != "self" || path.is_empty() {
                    path.push(s.clone());
                }
                *i += 1;
                if toks.get(*i) == Some(&Tok::Path) {
                    *i += 1;
                    continue;
                }
                break;
            }
            Some(Tok::Open) => {
                *i += 1;
                while toks.get(*i) != Some(&Tok::Close) {
                    use_tree(toks, i, &path, out);
                    if toks.get(*i) == Some(&Tok::Comma) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Star) => {
                *i += 1;
                break;
            }
            _ => break,
        }
    }
    out.push(path);
}

/// Every path the code names, as written (not yet resolved).
fn paths(code: &str) -> Vec<Vec<String>> {
    let toks = tokens(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == Tok::Ident("use".into()) {
            i += 1;
            use_tree(&toks, &mut i, &[], &mut out);
            continue;
        }
        let starts_path = matches!(&toks[i], Tok::Ident(_))
            && toks.get(i + 1) == Some(&Tok::Path)
            && (i == 0 || toks[i - 1] != Tok::Path);
        if !starts_path {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        while let Some(Tok::Ident(s)) = toks.get(i) {
            path.push(s.clone());
            i += 1;
            if toks.get(i) != Some(&Tok::Path) {
                break;
            }
            i += 1;
            if toks.get(i) == Some(&Tok::Open) {
                // `a::b::{c, d}` in an expression cannot occur; in a use it was handled above.
                break;
            }
        }
        out.push(path);
    }
    out
}

/// The module a path written in `module` refers to (the longest module prefix), if it is one
/// of the crate's.
fn resolve(
    module: &[String],
    path: &[String],
    all: &BTreeMap<Vec<String>, String>,
) -> Option<Vec<String>> {
    let (mut base, mut rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
        "crate" => (vec![], &path[1..]),
        "self" => (module.to_vec(), &path[1..]),
        "super" => (
            module[..module.len().saturating_sub(1)].to_vec(),
            &path[1..],
        ),
        child => {
            let mut m = module.to_vec();
            m.push(child.to_string());
            if !all.contains_key(&m) {
                return None;
            }
            (module.to_vec(), path)
        }
    };
    while rest.first().map(String::as_str) == Some("super") {
        base.pop();
        rest = &rest[1..];
    }
    let full: Vec<String> = base.into_iter().chain(rest.iter().cloned()).collect();
    (0..=full.len())
        .rev()
        .map(|k| full[..k].to_vec())
        .find(|m| all.contains_key(m))
}

fn imports(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let all = modules(src);
    let mut graph = BTreeMap::new();
    for (module, text) in &all {
        let code = without_test_modules(&code_only(text));
        let targets: BTreeSet<Vec<String>> = paths(&code)
            .iter()
            .filter_map(|p| resolve(module, p, &all))
            .filter(|t| t != module)
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.found.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let graph = graph();
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(m, ts)| ts.iter().map(move |t| (m, t)))
        .filter(|(m, t)| layer(t) > layer(m))
        .map(|(m, t)| format!("{} imports {}", name(m), name(t)))
        .collect();
    assert!(
        upward.is_empty(),
        "imports from a higher layer (bridge < persist < runtime < the crate root):\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_import_circle_among_the_source_files() {
    let graph = graph();
    let found = circles(&graph);
    // Each circle with its imports inside it: one of them has to go.
    let text: Vec<String> = found
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(move |t| format!("  {} -> {}", name(m), name(t)))
                })
                .collect();
            format!("{} modules:\n{}", c.len(), edges.join("\n"))
        })
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", text.join("\n"));
}

/// The checker itself finds what it must: an upward import, a circle through a parent module,
/// an import through the root's re-exports; and it ignores comments, strings and test modules.
#[test]
fn the_checker_sees_imports_and_only_imports() {
    let all: BTreeMap<Vec<String>, String> = [
        (vec![], String::new()),
        (vec!["bridge".into()], String::new()),
        (vec!["bridge".into(), "vm".into()], String::new()),
        (vec!["persist".into()], String::new()),
        (vec!["persist".into(), "read".into()], String::new()),
    ]
    .into_iter()
    .collect();
    let m = |s: &str| -> Vec<String> { s.split("::").map(String::from).collect() };
    let code = r##"
        use crate::bridge::{vm::{self as v, Vm}, *};
        // crate::runtime::Nope
        /* crate::runtime::Nope /* nested */ */
        const S: &str = "crate::runtime::Nope"; const R: &str = r#"super::Nope"#;
        fn f<'a>(x: &'a u8) -> char { let _ = super::Thing::new(); 'x' }
        #[cfg(test)]
        mod tests { use crate::runtime::Nope; }
        fn g() { read::go(); crate::Vm::new(); }
    "##;
    let code = without_test_modules(&code_only(code));
    let got: BTreeSet<Vec<String>> = paths(&code)
        .iter()
        .filter_map(|p| resolve(&m("persist"), p, &all))
        .collect();
    let want: BTreeSet<Vec<String>> = [vec![], m("bridge"), m("bridge::vm"), m("persist::read")]
        .into_iter()
        .collect();
    assert_eq!(got, want, "from {code}");
    // `super` in persist/read.rs is persist; a circle through the parent is found.
    assert_eq!(
        resolve(&m("persist::read"), &m("super::Loader"), &all),
        Some(m("persist"))
    );
    let g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = [
        (m("persist"), [m("persist::read")].into_iter().collect()),
        (m("persist::read"), [m("persist")].into_iter().collect()),
    ]
    .into_iter()
    .collect();
    assert_eq!(circles(&g).len(), 1);
    assert!(layer(&m("runtime::x")) > layer(&m("persist")) && layer(&[]) > layer(&m("runtime")));
}
