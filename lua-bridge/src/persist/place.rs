//! Places: where a function is in its chunk, by name, so that a save loaded into a newer
//! version of the game finds "the same function" there (format 6; `read/rebind.rs`).
//!
//! A newer version of a chunk is another tree of prototypes: lines move and functions come
//! and go, so neither a function's position in the tree nor its fingerprint finds it. Its name
//! does: the name its enclosing function gives the closure it makes (`function Agent:work`,
//! `local function helper`, `M.f = function`), read from the enclosing function's code right
//! after the `OP_CLOSURE` that makes it (`luasnap_proto_child_name`, csrc/proto.c). A place is
//! the list of those names from the chunk's main function down: `["Agent.work"]`,
//! `["G.step", "turn"]`; the main function's place is empty.
//!
//! Names are unique among a function's children: the second child given the same name is
//! `name#2`, and so on in the order the functions appear in the source; a function given no
//! name (an argument, a return value, a positional table item) is `(function #k)`, counting
//! only the unnamed ones, so adding a named function does not move them.
//!
//! A key that is not a Lua name is written as Lua would quote it, `M["a.b"]` (`\"`, `\\`,
//! `\ddd` for bytes outside printable ASCII), so it is never read as a path of names, a
//! place's ` > ` or a `#k`. Saves written before this read `M["a.b"]` as `M.a.b`: a place is
//! therefore looked up among its *family*, the functions of one enclosing function whose names
//! read the same once quoted keys are unquoted and `#k` numbers dropped ([`family_key`]). A
//! family of one is the function itself; in a larger one the place is no proof of identity
//! (a new `M["a.b"]`, or a new `init` above an old one, takes over a saved name), so only the
//! saved function's own code, at its lines or moved, binds there (`read/rebind.rs`).
//!
//! Upvalues are matched by name too: the saved closure's upvalue `count` binds to the newer
//! function's upvalue `count` wherever it now is (the k-th of a name to the k-th).

use crate::bridge::helpers::{
    luasnap_proto_child, luasnap_proto_child_name, luasnap_proto_closure_pcs,
    luasnap_proto_nchildren, luasnap_proto_nupvalues, luasnap_proto_upvalue_name,
};
use std::ffi::{c_int, c_void};

/// Called for each prototype of a walk by place: `f(proto, its parent, its place)`.
pub(crate) type PlaceFn<'a> = dyn FnMut(*const c_void, *const c_void, &[Vec<u8>]) + 'a;

/// The longest name kept for one function (longer ones are cut: still deterministic).
const MAX_NAME: usize = 256;

/// The names a prototype gives its children, in child order, each unique among them.
///
/// # Safety
/// `p` is a live prototype.
pub(crate) unsafe fn child_names(p: *const c_void) -> Vec<Vec<u8>> {
    // SAFETY: callers' contract; reads only.
    let n = unsafe { luasnap_proto_nchildren(p) }.max(0) as usize;
    let mut pcs = vec![-1 as c_int; n];
    // SAFETY: callers' contract; the buffer holds n pcs.
    unsafe { luasnap_proto_closure_pcs(p, pcs.as_mut_ptr(), n as c_int) };
    let mut names: Vec<Vec<u8>> = Vec::with_capacity(n);
    let mut buf = [0u8; MAX_NAME];
    let mut anonymous = 0;
    for &pc in &pcs {
        // SAFETY: callers' contract; the buffer holds MAX_NAME bytes.
        let len =
            unsafe { luasnap_proto_child_name(p, pc, buf.as_mut_ptr().cast(), MAX_NAME as c_int) }
                .clamp(0, MAX_NAME as c_int) as usize;
        let name = if len == 0 {
            anonymous += 1;
            format!("(function #{anonymous})").into_bytes()
        } else {
            let base = &buf[..len];
            let seen = names
                .iter()
                .filter(|n| n.as_slice() == base || is_numbered(n, base))
                .count();
            if seen == 0 {
                base.to_vec()
            } else {
                let mut v = base.to_vec();
                v.extend_from_slice(format!("#{}", seen + 1).as_bytes());
                v
            }
        };
        names.push(name);
    }
    names
}

/// Whether `name` is `base#k` for some k (a later child given the same name as `base`).
fn is_numbered(name: &[u8], base: &[u8]) -> bool {
    name.len() > base.len() + 1
        && name.starts_with(base)
        && name[base.len()] == b'#'
        && name[base.len() + 1..].iter().all(u8::is_ascii_digit)
}

/// The names of a prototype's upvalues, in order (empty for one without debug information).
///
/// # Safety
/// `p` is a live prototype.
pub(crate) unsafe fn upvalue_names(p: *const c_void) -> Vec<Vec<u8>> {
    // SAFETY: callers' contract; reads only.
    let n = unsafe { luasnap_proto_nupvalues(p) }.max(0);
    (0..n)
        .map(|i| {
            let mut len = 0;
            // SAFETY: callers' contract; i + 1 is one of its upvalues (1-based).
            let s = unsafe { luasnap_proto_upvalue_name(p, i + 1, &mut len) };
            if s.is_null() {
                Vec::new()
            } else {
                // SAFETY: the name's bytes, alive with the prototype.
                unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) }.to_vec()
            }
        })
        .collect()
}

/// Calls `f(proto, parent, place)` for `main` and every prototype nested in it, pre-order
/// (the parent of `main` is null).
///
/// # Safety
/// `main` is a live prototype.
pub(crate) unsafe fn each_place(main: *const c_void, f: &mut PlaceFn<'_>) {
    let mut place = Vec::new();
    // SAFETY: callers' contract.
    unsafe { visit(main, std::ptr::null(), &mut place, f) };
}

/// # Safety
/// `p` is a live prototype.
unsafe fn visit(
    p: *const c_void,
    parent: *const c_void,
    place: &mut Vec<Vec<u8>>,
    f: &mut PlaceFn<'_>,
) {
    f(p, parent, place);
    // SAFETY: callers' contract.
    let names = unsafe { child_names(p) };
    for (i, name) in names.into_iter().enumerate() {
        // SAFETY: children of a live prototype are alive.
        let child = unsafe { luasnap_proto_child(p, i as c_int) };
        place.push(name);
        // SAFETY: as above.
        unsafe { visit(child, p, place, f) };
        place.pop();
    }
}

/// A place as people read it: `Agent.plan > (function #1)`, or `the main chunk`. A saved
/// place is the file's bytes: anything but printable text is escaped ([`printable`]).
pub(crate) fn display(place: &[Vec<u8>]) -> String {
    if place.is_empty() {
        return "the main chunk".into();
    }
    place
        .iter()
        .map(|n| printable(n))
        .collect::<Vec<_>>()
        .join(" > ")
}

/// Bytes a save-game provides (a place, a chunk name, an upvalue or permanent name) as text
/// safe to print: UTF-8 text as is, control characters and invalid bytes escaped (`\n`,
/// `\u{1b}`, `\x{ff}`), so a hostile file writes no line break or terminal escape into a
/// message.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_debug());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{{{b:02x}}}"));
        }
    }
    out
}

/// The name a save written before keys were quoted gives `name`: each `["k"]` as `.k` (`k`
/// first), its escapes undone.
fn unquoted(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < name.len() {
        if name[i..].starts_with(b"[\"") {
            if !out.is_empty() {
                out.push(b'.');
            }
            i += 2;
            while i < name.len() && name[i] != b'"' {
                if name[i] == b'\\' && i + 1 < name.len() {
                    let digits = name[i + 1..]
                        .iter()
                        .take(3)
                        .take_while(|b| b.is_ascii_digit());
                    let n = digits.count();
                    if n == 3 {
                        let d = &name[i + 1..i + 4];
                        out.push(d.iter().fold(0u32, |v, b| v * 10 + u32::from(b - b'0')) as u8);
                        i += 4;
                    } else {
                        out.push(name[i + 1]);
                        i += 2;
                    }
                } else {
                    out.push(name[i]);
                    i += 1;
                }
            }
            i += 2; // `"]`
        } else {
            out.push(name[i]);
            i += 1;
        }
    }
    out
}

/// A family (see the module doc): its enclosing function's place and its name, unquoted.
pub(crate) type Family = (Vec<Vec<u8>>, Vec<u8>);

/// The family a place's function is of (see the module doc): its enclosing function's place
/// and its own name, keys unquoted and the `#k` number dropped. None for the main function and
/// for unnamed functions (`(function #k)`, counted apart).
pub(crate) fn family_key(place: &[Vec<u8>]) -> Option<Family> {
    let (last, parent) = place.split_last()?;
    if last.starts_with(b"(function #") {
        return None;
    }
    let base = match last.iter().rposition(|&b| b == b'#') {
        Some(i) if is_numbered(last, &last[..i]) => &last[..i],
        _ => last.as_slice(),
    };
    Some((parent.iter().map(|n| unquoted(n)).collect(), unquoted(base)))
}

/// For each upvalue of the newer function (`target`, by name), the saved closure's upvalue
/// of that name (the k-th of a name to the k-th), if it has one.
pub(crate) fn upvalue_map(saved: &[Vec<u8>], target: &[Vec<u8>]) -> Vec<Option<usize>> {
    let mut used = vec![false; saved.len()];
    target
        .iter()
        .map(|name| {
            if name.is_empty() {
                return None;
            }
            let i = saved
                .iter()
                .enumerate()
                .position(|(i, s)| !used[i] && s == name)?;
            used[i] = true;
            Some(i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{display, family_key, is_numbered, printable, upvalue_map};

    fn names(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn upvalues_bind_by_name_the_kth_to_the_kth() {
        let saved = names(&["_ENV", "count", "x", "x"]);
        let target = names(&["x", "helper", "_ENV", "x", "x", ""]);
        assert_eq!(
            upvalue_map(&saved, &target),
            [Some(2), None, Some(0), Some(3), None, None]
        );
    }

    #[test]
    fn places_read_as_names_from_the_main_chunk_down() {
        assert_eq!(display(&[]), "the main chunk");
        assert_eq!(
            display(&names(&["Agent.plan", "(function #1)"])),
            "Agent.plan > (function #1)"
        );
        assert!(is_numbered(b"init#2", b"init"));
        assert!(!is_numbered(b"init#x", b"init"));
        assert!(!is_numbered(b"initial", b"init"));
    }

    #[test]
    fn quoted_keys_unquote_into_the_family_of_the_names_they_read_as() {
        let key = |v: &[&str]| family_key(&names(v)).unwrap();
        assert_eq!(key(&["M[\"a.b\"]"]), key(&["M.a.b"]));
        assert_eq!(key(&["M.a.b#2"]), key(&["M.a.b"]));
        assert_eq!(key(&["[\"x > y\"]"]).1, b"x > y");
        assert_eq!(key(&["t[\"q\\\"\\010\"]"]).1, b"t.q\"\n");
        assert_eq!(
            key(&["G.step", "turn#3"]),
            (names(&["G.step"]), b"turn".to_vec())
        );
        assert!(family_key(&names(&["(function #2)"])).is_none());
        assert!(family_key(&[]).is_none());
    }

    #[test]
    fn saved_names_print_without_control_characters() {
        assert_eq!(printable(b"\n\x1b[1;32mOK"), "\\n\\u{1b}[1;32mOK");
        assert_eq!(printable(b"a\xffb"), "a\\x{ff}b");
        assert_eq!(
            display(&names(&["Agent.plan", "M[\"a b\"]"])),
            "Agent.plan > M[\"a b\"]"
        );
    }
}
