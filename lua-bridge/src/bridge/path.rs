//! Paths into the Lua globals: `world.players[1].hp`, `cfg["key with space"]`,
//! `world.player:hit` (a method).
//!
//! Grammar (whitespace is not allowed):
//!
//! ```text
//! path    := first segment* (':' name)?
//! first   := name | '[' key ']'
//! segment := '.' name | '[' key ']'
//! key     := integer | '"' chars '"' | '\'' chars '\''   (escapes: \\ \" \' \n \t \r \0)
//! name    := [A-Za-z_][A-Za-z0-9_]*
//! ```
//!
//! A trailing `:name` makes [`Vm::call`](crate::Vm::call) a method call: the value before the
//! colon is passed as the first argument (`self`).

use crate::bridge::error::VmError;
use mlua_sys::{self as ffi, lua_State};

/// Whether `path` is identifiers separated by dots.
pub(crate) fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('.').all(|p| {
            let mut c = p.chars();
            matches!(c.next(), Some(ch) if ch == '_' || ch.is_ascii_alphabetic())
                && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
        })
}

/// One key of a path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Key {
    /// A string key (`.name` or `["..."]`).
    Str(Vec<u8>),
    /// An integer key (`[1]`).
    Int(i64),
}

/// A parsed path. `ends[i]` is where key `i` ends in the source text, so error messages can
/// name the prefix that failed.
#[derive(Debug, Clone)]
pub(crate) struct Path {
    pub text: String,
    pub keys: Vec<Key>,
    pub ends: Vec<usize>,
    /// The method of a trailing `:name`.
    pub method: Option<Vec<u8>>,
}

fn bad(text: &str, at: usize, message: impl Into<String>) -> VmError {
    VmError::BadPath {
        path: text.into(),
        at: text[..at.min(text.len())].chars().count(),
        message: message.into(),
    }
}

fn is_name_start(b: u8) -> bool {
    b == b'_' || b.is_ascii_alphabetic()
}

fn is_name_char(b: u8) -> bool {
    b == b'_' || b.is_ascii_alphanumeric()
}

impl Path {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Path, VmError> {
        let b = text.as_bytes();
        let mut i = 0;
        let mut keys = Vec::new();
        let mut ends = Vec::new();
        let mut method = None;
        if b.is_empty() {
            return Err(bad(text, 0, "the path is empty"));
        }
        let name = |i: &mut usize| -> Result<Vec<u8>, VmError> {
            let start = *i;
            if *i >= b.len() || !is_name_start(b[*i]) {
                return Err(bad(text, *i, "expected a name (letters, digits, '_')"));
            }
            while *i < b.len() && is_name_char(b[*i]) {
                *i += 1;
            }
            Ok(b[start..*i].to_vec())
        };
        let mut first = true;
        while i < b.len() {
            match b[i] {
                b'[' => {
                    i += 1;
                    keys.push(Self::bracket(text, &mut i)?);
                }
                b'.' if !first => {
                    i += 1;
                    keys.push(Key::Str(name(&mut i)?));
                }
                b':' if !first => {
                    i += 1;
                    method = Some(name(&mut i)?);
                    if i < b.len() {
                        return Err(bad(text, i, "nothing may follow a method name"));
                    }
                    break;
                }
                c if first && is_name_start(c) => keys.push(Key::Str(name(&mut i)?)),
                _ if first => return Err(bad(text, i, "expected a name or '['")),
                _ => return Err(bad(text, i, "expected '.', '[' or ':'")),
            }
            if method.is_none() {
                ends.push(i);
            }
            first = false;
        }
        Ok(Path {
            text: text.into(),
            keys,
            ends,
            method,
        })
    }

    /// Parses a bracketed key; `i` is just after '['.
    fn bracket(text: &str, i: &mut usize) -> Result<Key, VmError> {
        let b = text.as_bytes();
        let key = match b.get(*i) {
            Some(&q @ (b'"' | b'\'')) => {
                *i += 1;
                let mut s = Vec::new();
                loop {
                    match b.get(*i) {
                        None => return Err(bad(text, *i, "unterminated string")),
                        Some(&c) if c == q => {
                            *i += 1;
                            break;
                        }
                        Some(b'\\') => {
                            let e = match b.get(*i + 1) {
                                Some(b'\\') => b'\\',
                                Some(b'"') => b'"',
                                Some(b'\'') => b'\'',
                                Some(b'n') => b'\n',
                                Some(b't') => b'\t',
                                Some(b'r') => b'\r',
                                Some(b'0') => 0,
                                _ => {
                                    return Err(bad(
                                        text,
                                        *i,
                                        "unknown escape (use \\\\ \\\" \\' \\n \\t \\r \\0)",
                                    ))
                                }
                            };
                            s.push(e);
                            *i += 2;
                        }
                        Some(&c) => {
                            s.push(c);
                            *i += 1;
                        }
                    }
                }
                Key::Str(s)
            }
            Some(c) if *c == b'-' || c.is_ascii_digit() => {
                let start = *i;
                *i += 1;
                while *i < b.len() && b[*i].is_ascii_digit() {
                    *i += 1;
                }
                let digits = &text[start..*i];
                match digits.parse::<i64>() {
                    Ok(n) => Key::Int(n),
                    Err(_) if digits == "-" => {
                        return Err(bad(text, *i, "expected digits after '-'"))
                    }
                    Err(_) => return Err(bad(text, start, "integer key out of range")),
                }
            }
            _ => {
                return Err(bad(
                    text,
                    *i,
                    "expected an integer or a quoted string inside '[...]'",
                ))
            }
        };
        if b.get(*i) != Some(&b']') {
            return Err(bad(text, *i, "expected ']'"));
        }
        *i += 1;
        Ok(key)
    }

    /// The source text of keys `..=n`.
    pub fn prefix(&self, n: usize) -> &str {
        &self.text[..self.ends[n]]
    }

    /// The path without its last key (and method), and that key; `None` for a method path or
    /// a path of one key.
    pub fn split_last(&self) -> Option<(Path, &Key)> {
        if self.method.is_some() || self.keys.len() < 2 {
            return None;
        }
        let n = self.keys.len() - 1;
        Some((
            Path {
                text: self.prefix(n - 1).into(),
                keys: self.keys[..n].to_vec(),
                ends: self.ends[..n].to_vec(),
                method: None,
            },
            &self.keys[n],
        ))
    }
}

/// Pushes key `k`. May raise a memory error.
///
/// # Safety
/// Protected context with a free stack slot.
pub(crate) unsafe fn push_key(L: *mut lua_State, k: &Key) {
    // SAFETY: callers' contract; lua_pushlstring copies the bytes.
    unsafe {
        match k {
            Key::Str(s) => {
                ffi::lua_pushlstring(L, s.as_ptr().cast(), s.len());
            }
            Key::Int(n) => ffi::lua_pushinteger(L, *n),
        }
    }
}

/// Whether the value at `idx` can be indexed: a table, or a value whose metatable has
/// `__index`. Does not raise.
///
/// # Safety
/// Valid state and index, two free stack slots.
pub(crate) unsafe fn indexable(L: *mut lua_State, idx: std::ffi::c_int) -> bool {
    // SAFETY: raw reads of the metatable; pops what it pushes.
    unsafe {
        if ffi::lua_type(L, idx) == ffi::LUA_TTABLE {
            return true;
        }
        if ffi::lua_getmetatable(L, idx) == 0 {
            return false;
        }
        ffi::lua_pushstring(L, c"__index".as_ptr());
        ffi::lua_rawget(L, -2);
        let yes = ffi::lua_type(L, -1) != ffi::LUA_TNIL;
        ffi::lua_settop(L, -3);
        yes
    }
}

/// Walks `keys` from the value on top, replacing it by each step's value (running `__index`).
/// Returns `Some(i)` if key `i` could not be applied because the value before it cannot be
/// indexed (that value is left on top); `None` when the whole walk succeeded.
///
/// # Safety
/// Protected context; only plain frames may be live (it may raise from `__index`).
pub(crate) unsafe fn walk(L: *mut lua_State, keys: &[Key]) -> Option<usize> {
    for (i, k) in keys.iter().enumerate() {
        // SAFETY: callers' contract; two free slots are ensured first.
        unsafe {
            ffi::luaL_checkstack(L, 3, c"path".as_ptr());
            if !indexable(L, -1) {
                return Some(i);
            }
            push_key(L, k);
            ffi::lua_gettable(L, -2);
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_settop(L, -2);
        }
    }
    None
}

/// Pushes the globals table and walks `path`'s keys (see [`walk`]).
///
/// # Safety
/// As for [`walk`].
pub(crate) unsafe fn push_path(L: *mut lua_State, path: &Path) -> Option<usize> {
    // SAFETY: callers' contract.
    unsafe {
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        walk(L, &path.keys)
    }
}

/// The error for a walk that stopped at key `i` with the offending value on top.
///
/// # Safety
/// Valid state with a value on top.
pub(crate) unsafe fn not_found(L: *mut lua_State, path: &Path, i: usize) -> VmError {
    let at = if i == 0 {
        "_G".to_string()
    } else {
        path.prefix(i - 1).to_string()
    };
    VmError::NotFound {
        path: at,
        expected: "table",
        // SAFETY: callers' contract (a value on top); lua_typename returns a static string.
        found: unsafe { std::ffi::CStr::from_ptr(ffi::lua_typename(L, ffi::lua_type(L, -1))) }
            .to_string_lossy()
            .into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let p = Path::parse(r#"world.players[1].hp"#).unwrap();
        assert_eq!(
            p.keys,
            vec![
                Key::Str(b"world".to_vec()),
                Key::Str(b"players".to_vec()),
                Key::Int(1),
                Key::Str(b"hp".to_vec())
            ]
        );
        assert_eq!(p.prefix(2), "world.players[1]");
        let p = Path::parse(r#"cfg["key with space"]['it\'s'][-3]:go"#).unwrap();
        assert_eq!(
            p.keys,
            vec![
                Key::Str(b"cfg".to_vec()),
                Key::Str(b"key with space".to_vec()),
                Key::Str(b"it's".to_vec()),
                Key::Int(-3)
            ]
        );
        assert_eq!(p.method.as_deref(), Some(&b"go"[..]));
        let p = Path::parse(r#"["a.b"]"#).unwrap();
        assert_eq!(p.keys, vec![Key::Str(b"a.b".to_vec())]);
    }

    #[test]
    fn errors_point_at_the_character() {
        for (text, at) in [
            ("", 0),
            ("a..b", 2),
            ("a.1", 2),
            ("a[1", 3),
            ("a[x]", 2),
            ("a[\"x]", 5),
            ("a b", 1),
            ("a:b.c", 3),
            ("1a", 0),
            ("a[99999999999999999999]", 2),
            ("a[\"\\q\"]", 3),
            (":m", 0),
            ("é.x", 0),
            ("x.é", 2),
        ] {
            match Path::parse(text) {
                Err(VmError::BadPath { at: got, .. }) => assert_eq!(got, at, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let msg = Path::parse("a..b").unwrap_err().to_string();
        assert!(msg.contains("a..b\n    ^"), "{msg}");
    }
}
