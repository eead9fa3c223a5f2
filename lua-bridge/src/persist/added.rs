//! Functions new in this version, added to the saved module tables on an update load
//! ([`FunctionBinding::Current`](super::FunctionBinding::Current)).
//!
//! Module and class tables are data: a save of version 1 holds version 1's `W`, with the
//! methods it had. A method version 2 adds (`function W:bonus()`) is in this VM's own `W`
//! only, and the saved `W` replaces it. Before the restore, the loading VM's module tables
//! (`package.loaded`'s values and the tables reachable from them by string keys, at most
//! [`MAX_DEPTH`] deep) are walked in parallel with the saved tables at the same paths; a
//! function field this version has and the saved table lacks (nil there) is set to this
//! version's function. Nothing else is written: no data field, no saved value replaced, no
//! permanent (a library table) touched.
//!
//! Only a function of a chunk this version changed is new: when the save holds functions of
//! the same chunk with this version's very code (the loader finds its fingerprint equal), a
//! function of it that the saved table lacks was there in the saved game too, and the game
//! removed it (`M.listeners.on_tick = nil`, `Vec.__add = nil`); putting it back would make a
//! game continued from its own save run differently from the straight run. A chunk the save
//! holds no function of is not known to be unchanged: its functions are added as before.
//!
//! The rule for upvalues (a function's module locals), each in turn: `_ENV` holding the
//! globals stays (they are restored in place); an upvalue of a name that a saved function of
//! the same table (or of a table above it on the path) holds is shared with it (the saved
//! game's variable, as rebinding shares upvalues by name); one holding a table the walk
//! pairs with a saved one (the module or class table itself) is set to the saved table;
//! anything else (a module local no saved function of those tables holds: a constant, a new
//! local helper) stays this version's, as a rebound function's new upvalues do.

use super::permanents::is_permanent;
use mlua_sys::{self as ffi, lua_State};
use std::collections::HashSet;
use std::ffi::{c_int, c_void, CStr};

/// How deep below a module table the walk goes.
const MAX_DEPTH: usize = 8;

/// What the walk added, and what it could not.
#[derive(Default)]
pub(super) struct Added {
    /// `module.path.name (chunk:line)` of each function added.
    pub added: Vec<String>,
    /// Functions new in this version not added (too many upvalues for the stack).
    pub not_added: Vec<String>,
}

/// How one upvalue of a new function is bound.
enum Bind {
    /// Left as it is (`_ENV` holding the globals).
    Keep,
    /// Joined to upvalue `n` of the saved function at absolute index `at`.
    Join(c_int, c_int),
    /// Set to the saved table at absolute index `at`.
    Set(c_int),
}

/// With the saved `package.loaded` at `saved` and the live one at `live` (absolute indices):
/// adds this version's new functions to the saved module tables (see the module docs), none
/// of the `unchanged` chunks (names as Lua gives them: `@M.lua`).
///
/// # Safety
/// Protected context; `saved` and `live` tables; 20 free slots plus 4 a level.
pub(super) unsafe fn add_new_functions(
    L: *mut lua_State,
    saved: c_int,
    live: c_int,
    unchanged: &HashSet<Vec<u8>>,
) -> Added {
    let mut out = Added::default();
    let mut seen = HashSet::new();
    let mut walk_state = Walk {
        seen: &mut seen,
        unchanged,
        out: &mut out,
    };
    // SAFETY: protected context; balanced pushes.
    unsafe {
        let top = ffi::lua_gettop(L);
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, live) != 0 {
            // [.., key, live module]
            let module = ffi::lua_gettop(L);
            if ffi::lua_type(L, module - 1) == ffi::LUA_TSTRING
                && ffi::lua_type(L, module) == ffi::LUA_TTABLE
            {
                let name = key_string(L, module - 1);
                ffi::lua_pushvalue(L, module - 1);
                if ffi::lua_rawget(L, saved) == ffi::LUA_TTABLE {
                    let mut path = vec![(module + 1, module)];
                    walk(L, &mut path, &name, 0, &mut walk_state);
                }
            }
            ffi::lua_settop(L, module - 1);
        }
        ffi::lua_settop(L, top);
    }
    out
}

/// The string key at `idx`, lossy.
///
/// # Safety
/// A string at `idx`.
unsafe fn key_string(L: *mut lua_State, idx: c_int) -> String {
    let mut len = 0;
    // SAFETY: a string value: lua_tolstring does not convert it in place.
    let p = unsafe { ffi::lua_tolstring(L, idx, &mut len) };
    // SAFETY: p points to len bytes the string keeps alive.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }).into_owned()
}

/// What a walk carries: the saved tables walked, the chunks whose functions are not new, and
/// what it added.
struct Walk<'a> {
    seen: &'a mut HashSet<*const c_void>,
    unchanged: &'a HashSet<Vec<u8>>,
    out: &'a mut Added,
}

/// Walks the pair on top of `path` ((saved, live) absolute indices): adds new functions to
/// the saved table, recurses into tables both have.
///
/// # Safety
/// Protected context; as [`add_new_functions`].
unsafe fn walk(
    L: *mut lua_State,
    path: &mut Vec<(c_int, c_int)>,
    name: &str,
    depth: usize,
    w: &mut Walk<'_>,
) {
    let (saved, live) = *path.last().expect("a pair");
    // SAFETY: protected context; balanced pushes.
    unsafe {
        if ffi::lua_rawequal(L, saved, live) != 0
            || is_permanent(L, saved)
            || !w.seen.insert(ffi::lua_topointer(L, saved))
        {
            return;
        }
        let top = ffi::lua_gettop(L);
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, live) != 0 {
            // [.., key, live value]
            let v = ffi::lua_gettop(L);
            if ffi::lua_type(L, v - 1) != ffi::LUA_TSTRING {
                ffi::lua_settop(L, v - 1);
                continue;
            }
            let field = format!("{name}.{}", key_string(L, v - 1));
            ffi::lua_pushvalue(L, v - 1);
            let there = ffi::lua_rawget(L, saved); // at v + 1
            match (ffi::lua_type(L, v), there) {
                (ffi::LUA_TFUNCTION, ffi::LUA_TNIL) if !of_chunk_in(L, v, w.unchanged) => {
                    add_one(L, path, v, &field, w.out);
                }
                (ffi::LUA_TTABLE, ffi::LUA_TTABLE) if depth < MAX_DEPTH => {
                    path.push((v + 1, v));
                    walk(L, path, &field, depth + 1, w);
                    path.pop();
                }
                _ => {}
            }
            ffi::lua_settop(L, v - 1);
        }
        ffi::lua_settop(L, top);
    }
}

/// Adds the function at `f` as `field` of the saved table on top of `path`, if its upvalues
/// resolve.
///
/// # Safety
/// Protected context; `f` absolute, the key just below it.
unsafe fn add_one(
    L: *mut lua_State,
    path: &[(c_int, c_int)],
    f: c_int,
    field: &str,
    out: &mut Added,
) {
    // SAFETY: protected context; balanced pushes.
    unsafe {
        let top = ffi::lua_gettop(L);
        let shown = shown(L, f, field);
        let mut binds = Vec::new();
        let mut n = 1;
        loop {
            // Each upvalue's value (and the saved function it joins) stays on the stack
            // until the binds are made.
            if ffi::lua_checkstack(L, 8) == 0 {
                ffi::lua_settop(L, top);
                out.not_added.push(shown);
                return;
            }
            let up = ffi::lua_getupvalue(L, f, n);
            if up.is_null() {
                break;
            }
            match resolve(L, path, CStr::from_ptr(up), ffi::lua_gettop(L)) {
                Some(b) => binds.push((n, b)),
                None => {
                    ffi::lua_settop(L, top);
                    out.not_added.push(shown);
                    return;
                }
            }
            n += 1;
        }
        for (n, b) in binds {
            match b {
                Bind::Keep => {}
                Bind::Join(at, m) => ffi::lua_upvaluejoin(L, f, n, at, m),
                Bind::Set(at) => {
                    ffi::lua_pushvalue(L, at);
                    ffi::lua_setupvalue(L, f, n);
                }
            }
        }
        let saved = path.last().expect("a pair").0;
        ffi::lua_pushvalue(L, f - 1);
        ffi::lua_pushvalue(L, f);
        ffi::lua_rawset(L, saved);
        out.added.push(shown);
        ffi::lua_settop(L, top);
    }
}

/// Whether the function at `f` is a Lua function of a chunk named in `chunks`.
///
/// # Safety
/// Protected context; a function at `f`.
unsafe fn of_chunk_in(L: *mut lua_State, f: c_int, chunks: &HashSet<Vec<u8>>) -> bool {
    if chunks.is_empty() {
        return false;
    }
    // SAFETY: lua_getinfo with '>' pops the function pushed; `source` is the function's
    // chunk name, alive while the function is (it stays at `f`).
    unsafe {
        let mut ar: ffi::lua_Debug = std::mem::zeroed();
        ffi::lua_pushvalue(L, f);
        if ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar) == 0 || ar.source.is_null() {
            return false;
        }
        let source = std::slice::from_raw_parts(ar.source.cast::<u8>(), ar.srclen);
        chunks.contains(source)
    }
}

/// `field (chunk:line)` of the function at `f`.
///
/// # Safety
/// Protected context; a function at `f`.
unsafe fn shown(L: *mut lua_State, f: c_int, field: &str) -> String {
    // SAFETY: lua_getinfo with '>' pops the function pushed; the strings it fills are
    // the function's (alive while it is on the stack).
    unsafe {
        let mut ar: ffi::lua_Debug = std::mem::zeroed();
        ffi::lua_pushvalue(L, f);
        if ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar) == 0 || ar.what.is_null() {
            return field.to_string();
        }
        if CStr::from_ptr(ar.what).to_bytes() != b"Lua" {
            return field.to_string();
        }
        let src = CStr::from_ptr(ar.short_src.as_ptr()).to_string_lossy();
        format!("{field} ({src}:{})", ar.linedefined)
    }
}

/// How upvalue `name` (its value at `v`) of a new function is bound, or None.
///
/// # Safety
/// Protected context; `v` absolute.
unsafe fn resolve(
    L: *mut lua_State,
    path: &[(c_int, c_int)],
    name: &CStr,
    v: c_int,
) -> Option<Bind> {
    // SAFETY: protected context; balanced pushes.
    unsafe {
        if name.to_bytes() == b"_ENV" {
            ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
            let globals = ffi::lua_rawequal(L, -1, v) != 0;
            ffi::lua_settop(L, -2);
            if globals {
                return Some(Bind::Keep);
            }
        }
        // A saved function of a table on the path holding an upvalue of that name.
        for &(saved, _) in path.iter().rev() {
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, saved) != 0 {
                let g = ffi::lua_gettop(L);
                if ffi::lua_type(L, g) == ffi::LUA_TFUNCTION && ffi::lua_iscfunction(L, g) == 0 {
                    let mut m = 1;
                    loop {
                        let up = ffi::lua_getupvalue(L, g, m);
                        if up.is_null() {
                            break;
                        }
                        ffi::lua_settop(L, g);
                        if CStr::from_ptr(up) == name {
                            // The saved function stays on the stack (the key below it
                            // dropped) until the caller has joined to it.
                            ffi::lua_rotate(L, g - 1, 1); // [.., fn, key]
                            ffi::lua_settop(L, g - 1); // [.., fn]
                            return Some(Bind::Join(g - 1, m));
                        }
                        m += 1;
                    }
                }
                ffi::lua_settop(L, g - 1);
            }
        }
        // The module or class table itself (a table the walk pairs).
        for &(saved, live) in path.iter().rev() {
            if ffi::lua_rawequal(L, live, v) != 0 {
                return Some(Bind::Set(saved));
            }
        }
        // A module local no saved function holds (new in this version): this version's, as
        // rebinding gives a rebound function's new upvalues.
        Some(Bind::Keep)
    }
}
