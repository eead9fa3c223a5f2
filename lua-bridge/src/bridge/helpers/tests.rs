//! Checks of the Rust side of the C interface against `csrc/luasnap.h`, and of the C files'
//! dependencies: both read the sources as text (the header's prototypes and this module's
//! declarations are written one way each, as rustfmt and the header's style keep them).

use std::collections::{BTreeMap, BTreeSet};

const HEADER: &str = include_str!("../../../csrc/luasnap.h");
const RUST: &str = include_str!("../helpers.rs");

/// A function or variable of the interface: its parameters' and result's types (Rust
/// spelling, no spaces), and whether it may raise.
#[derive(Debug, PartialEq, Eq)]
struct Decl {
    params: Vec<String>,
    result: String,
    raises: bool,
}

/// `text` without its C comments.
fn strip_c_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("*/").expect("a closed comment") + start + 2;
        out.push(' ');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A C type (`const void *const *`; with `named`, followed by the parameter's name) in Rust's
/// spelling.
fn rust_type(c: &str, named: bool, mirrors: &BTreeMap<String, String>) -> String {
    let spaced = c.replace('*', " * ");
    let mut words: Vec<&str> = spaced.split_whitespace().collect();
    if named {
        words.pop();
    }
    let first_star = words.iter().position(|w| *w == "*").unwrap_or(words.len());
    let base_words: Vec<&str> = words[..first_star]
        .iter()
        .copied()
        .filter(|w| *w != "const" && *w != "_Noreturn")
        .collect();
    let mut quals = vec![words[..first_star].contains(&"const")];
    for (i, w) in words.iter().enumerate().skip(first_star) {
        if *w == "*" {
            quals.push(words.get(i + 1) == Some(&"const"));
        }
    }
    let stars = quals.len() - 1;
    let base = match base_words.join(" ").as_str() {
        "void" if stars == 0 => if c.contains("_Noreturn") { "!" } else { "" }.to_string(),
        "void" => "c_void".to_string(),
        "int" => "c_int".to_string(),
        "char" => "c_char".to_string(),
        "size_t" => "usize".to_string(),
        "uint8_t" => "u8".to_string(),
        "int32_t" => "i32".to_string(),
        "uint32_t" => "u32".to_string(),
        "int64_t" => "i64".to_string(),
        "uint64_t" => "u64".to_string(),
        "luasnap_proto_fn" => "ProtoFn".to_string(),
        "luasnap_closure_fn" => "ClosureFn".to_string(),
        other => mirrors
            .get(other)
            .cloned()
            .unwrap_or_else(|| other.to_string()),
    };
    let mut rust = String::new();
    for i in (1..=stars).rev() {
        rust.push_str(if quals[i - 1] { "*const" } else { "*mut" });
    }
    rust + &base
}

/// The functions and variables luasnap.h declares.
fn header_decls() -> BTreeMap<String, Decl> {
    let mirrors: BTreeMap<String, String> = HEADER
        .lines()
        .filter_map(|l| l.trim().strip_prefix("LUASNAP_MIRROR("))
        .map(|rest| {
            let args: Vec<&str> = rest.split(',').map(str::trim).collect();
            (args[0].to_string(), args[1].to_string())
        })
        .collect();
    // Without preprocessor lines (and their continuations).
    let mut code = String::new();
    let mut directive = false;
    for line in strip_c_comments(HEADER).lines() {
        directive = directive || line.trim_start().starts_with('#');
        if !directive {
            code.push_str(line);
            code.push(' ');
        }
        directive = directive && line.ends_with('\\');
    }
    let mut decls = BTreeMap::new();
    for statement in code.split(';').map(str::trim) {
        let Some(at) = statement.find("luasnap_") else {
            continue;
        };
        // Types, structures and the layout assertions are not functions or variables.
        let declaration = !statement.starts_with("typedef")
            && !statement.contains(['{', '}'])
            && (!statement.starts_with("LUASNAP_") || statement.starts_with("LUASNAP_RAISES"));
        if !declaration {
            continue;
        }
        let name_end = at
            + statement[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(statement.len() - at);
        let name = &statement[at..name_end];
        let raises = statement.starts_with("LUASNAP_RAISES");
        let result_c = statement[..at]
            .trim_start_matches("LUASNAP_RAISES")
            .replace("extern", "");
        let after = statement[name_end..].trim();
        let params = if let Some(list) = after.strip_prefix('(') {
            let list = list
                .strip_suffix(')')
                .expect("a prototype's parameters end it");
            if list.trim() == "void" {
                Vec::new()
            } else {
                list.split(',')
                    .map(|p| rust_type(p, true, &mirrors))
                    .collect()
            }
        } else {
            vec!["static".to_string()]
        };
        decls.insert(
            name.to_string(),
            Decl {
                params,
                result: rust_type(&result_c, false, &mirrors),
                raises,
            },
        );
    }
    decls
}

/// Splits at the commas outside parentheses and angle brackets.
fn split_top(list: &str) -> Vec<String> {
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0i32, String::new());
    for ch in list.chars() {
        match ch {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.trim().is_empty() {
        parts.push(cur);
    }
    parts
}

/// The functions and variables this module declares, from its `extern` blocks.
fn rust_decls() -> BTreeMap<String, Decl> {
    let mut decls = BTreeMap::new();
    let mut rest = RUST;
    while let Some(start) = rest.find("\nunsafe extern \"C") {
        let raises = rest[start..].starts_with("\nunsafe extern \"C-unwind\" {");
        let open = start + rest[start..].find('{').expect("an extern block");
        let close = open + rest[open..].find("\n}").expect("an extern block's end");
        let block: String = rest[open + 1..close]
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            // `#[cfg(feature = ...)]` on a declaration: the declaration is checked either way.
            .filter(|l| !l.trim_start().starts_with("#["))
            .collect::<Vec<_>>()
            .join(" ");
        for item in block.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let item = item.trim().trim_start_matches("pub(crate)").trim();
            let squeeze = |s: &str| s.split_whitespace().collect::<String>();
            if let Some(var) = item.strip_prefix("static") {
                let (name, ty) = var.split_once(':').expect("a static's type");
                decls.insert(
                    name.trim().to_string(),
                    Decl {
                        params: vec!["static".into()],
                        result: squeeze(ty),
                        raises,
                    },
                );
                continue;
            }
            let f = item.strip_prefix("fn").expect("a function").trim();
            let (name, tail) = f.split_once('(').expect("parameters");
            let close = tail.rfind(')').expect("the parameters' end");
            let params = split_top(&tail[..close])
                .iter()
                .map(|p| squeeze(p.split_once(':').expect("a typed parameter").1))
                .collect();
            let result = tail[close + 1..].trim().trim_start_matches("->").trim();
            decls.insert(
                name.trim().to_string(),
                Decl {
                    params,
                    result: squeeze(result),
                    raises,
                },
            );
        }
        rest = &rest[close..];
    }
    decls
}

#[test]
fn every_declaration_matches_its_prototype() {
    let (c, rust) = (header_decls(), rust_decls());
    assert!(
        c.len() > 80,
        "the header's prototypes were not found: {c:?}"
    );
    let (cn, rn): (BTreeSet<_>, BTreeSet<_>) = (c.keys().collect(), rust.keys().collect());
    assert_eq!(
        cn.difference(&rn).collect::<Vec<_>>(),
        Vec::<&&String>::new(),
        "in luasnap.h, not declared in helpers.rs"
    );
    assert_eq!(
        rn.difference(&cn).collect::<Vec<_>>(),
        Vec::<&&String>::new(),
        "declared in helpers.rs, not in luasnap.h"
    );
    for (name, decl) in &c {
        let mut want = decl.params.clone();
        let got = &rust[name];
        let mut want_result = decl.result.clone();
        // A C function pointer may be NULL: Rust may declare it as an Option of the pointer.
        for (w, g) in want
            .iter_mut()
            .zip(&got.params)
            .chain([(&mut want_result, &got.result)])
        {
            if *g == format!("Option<{w}>") {
                *w = g.clone();
            }
        }
        assert_eq!(
            got.params, want,
            "{name}: parameter types (helpers.rs vs luasnap.h)"
        );
        assert_eq!(
            got.result, want_result,
            "{name}: result type (helpers.rs vs luasnap.h)"
        );
        assert_eq!(
            got.raises, decl.raises,
            "{name}: declared extern \"C-unwind\" exactly when luasnap.h marks it LUASNAP_RAISES"
        );
    }
}

/// The helper files (csrc/*.c and *.h, not Lua's), each as (name, text without comments).
fn c_files() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("csrc")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "c" || e == "h"))
        .map(|p| {
            let name = p
                .file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).expect("a readable helper file");
            (name, strip_c_comments(&text))
        })
        .collect();
    files.sort();
    files
}

/// The identifiers of luasnap's own functions and variables (`luasnap_*`, `ls_*`) in `text`.
fn own_identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("luasnap_") || w.starts_with("ls_"))
}

/// Which file defines each external function or variable (a .c file's definitions at column
/// 0 that are not static) or header-only inline function (`static inline` in a header): a
/// topic is a file name without its extension, so proto.c and proto.h are one.
fn definitions(files: &[(String, String)]) -> BTreeMap<String, String> {
    let mut defs = BTreeMap::new();
    for (name, text) in files {
        let topic = name.rsplit_once('.').expect("an extension").0;
        let header = name.ends_with(".h");
        let mut statement = String::new();
        for line in text.lines() {
            let starts = line.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
            if starts && statement.is_empty() {
                statement = line.to_string();
            } else if !statement.is_empty() {
                statement.push(' ');
                statement.push_str(line);
            }
            let Some(end) = statement.find(['{', ';', '=']) else {
                continue; // a declaration's head goes on on the next line
            };
            let head = &statement[..end];
            let type_definition = ["typedef", "struct", "union", "enum"]
                .iter()
                .any(|k| head.starts_with(k));
            let defines = match &statement[end..end + 1] {
                "{" | "=" if header => head.starts_with("static inline"),
                "{" | "=" => !head.starts_with("static") && !type_definition,
                _ => false,
            };
            if defines {
                let name = if head.contains('(') {
                    own_identifiers(&head[..head.find('(').expect("a parameter list")]).last()
                } else {
                    own_identifiers(head).last()
                };
                if let Some(name) = name {
                    defs.insert(name.to_string(), topic.to_string());
                }
            }
            statement.clear();
        }
    }
    defs
}

#[test]
fn the_c_files_depend_on_each_other_one_way() {
    let files = c_files();
    let defs = definitions(&files);
    assert!(defs.contains_key("luasnap_table_build") && defs.contains_key("ls_push_closure"));
    // topic -> the topics whose functions it uses
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, text) in &files {
        let topic = name.rsplit_once('.').expect("an extension").0.to_string();
        if topic == "luasnap" {
            continue; // the interface: it declares every function, and uses none
        }
        let used = uses.entry(topic.clone()).or_default();
        for id in own_identifiers(text) {
            if let Some(def) = defs.get(id).filter(|d| **d != topic) {
                used.insert(def.clone());
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit<'a>(
        t: &'a str,
        uses: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == t) {
            panic!(
                "C files that use each other: {}",
                path[i..].join(" -> ") + " -> " + t
            );
        }
        if done.contains(t) {
            return;
        }
        path.push(t);
        for u in uses.get(t).into_iter().flatten() {
            visit(u, uses, path, done);
        }
        path.pop();
        done.insert(t);
    }
    let mut done = BTreeSet::new();
    for t in uses.keys() {
        visit(t, &uses, &mut Vec::new(), &mut done);
    }
    // What the header's comment says, so it stays true.
    let expect = [
        ("chunks", "proto"),
        ("loaders", "chunks"),
        ("state", "chunks"),
        ("tscan", "tlayout"),
        ("tbuild", "tlayout"),
        ("tbuild", "proto"),
        ("framecheck", "loadmemo"),
        ("upvalcheck", "loadmemo"),
        ("coload", "framecheck"),
        ("corolib", "canonical"),
        ("tlayout", "cfids"),
        ("ident", "cfids"),
    ];
    for (from, to) in expect {
        assert!(
            uses[from].contains(to),
            "{from} no longer uses {to}: update luasnap.h's map"
        );
    }
    // lsint.h is the base every file that reaches into Lua's internals includes.
    let edges: usize = uses
        .values()
        .map(|u| u.iter().filter(|t| *t != "lsint").count())
        .sum();
    assert_eq!(
        edges,
        expect.len(),
        "a new dependency between C files: add it to luasnap.h's map and here: {uses:?}"
    );
}

#[test]
fn no_other_file_declares_a_helper() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.ends_with("bridge/helpers.rs")
            {
                let text = std::fs::read_to_string(&path).expect("a readable source file");
                let mut rest = text.as_str();
                while let Some(at) = rest.find("extern \"C") {
                    let block = &rest[at..];
                    let end = block.find("\n}").unwrap_or(block.len());
                    if block[..end].contains("fn luasnap_")
                        || block[..end].contains("static luasnap_")
                    {
                        found.push(path.display().to_string());
                    }
                    rest = &block[end..];
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "C helpers declared outside src/bridge/helpers.rs: {found:?}"
    );
}
