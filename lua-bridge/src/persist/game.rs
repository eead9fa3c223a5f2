//! Whole-game saves: the root a save writes (`globals`, `loaded` and their kept-name lists) and
//! how a load restores it into the live `_G` and `package.loaded`.
//!
//! A game save does not write the library's own bindings (`_G.os == os`, `loaded.string`):
//! each is a name in a "kept" list, and the load keeps the loading VM's own binding there. So a
//! foreign load, which denies `os` and the like, still restores an ordinary game while refusing
//! such a permanent anywhere else.
//!
//! Invariant of a restore: it writes only into the live `_G` and `package.loaded`, never into
//! a table the file chose. The file decides what `root.globals` and `root.loaded` are; both are
//! only read (raw), and must be tables the load built, not permanents. A kept name only keeps
//! the live table's binding where it is: the restore never copies a permanent anywhere. (It
//! used to set `saved[name] = live[name]` in whatever table the file put at `root.loaded`: a
//! game table then got `os`, `io` and `debug`, the `string` library got `_G`.)

use super::added::{add_new_functions, Added};
use super::format::GameTable;
use super::permanents::{is_permanent, PERMS_KEY, UNPERMS_KEY};
use super::write::GameRemovedNode;
use mlua_sys::{self as ffi, lua_State};
use std::collections::HashSet;
use std::ffi::{c_int, CStr};

/// Host memory the build of a game root uses, owned by the caller outside the protected call
/// (a Lua error raised while the root is built unwinds no Rust frame that owns memory): the
/// last layout's bytes, and the code-1 nodes of `_G` and `package.loaded` described with
/// their layouts, for the writer (`write::GameRemovedNode`).
#[derive(Default)]
pub(super) struct GameRootParts {
    blob: Vec<u8>,
    pub(super) removed: Vec<GameRemovedNode>,
}

/// Pushes `{ globals = copy of _G, loaded = copy of package.loaded }` with their kept-name
/// lists and layouts.
///
/// # Safety
/// Protected context.
pub(super) unsafe fn push_game_root(L: *mut lua_State, parts: &mut GameRootParts) {
    // SAFETY: protected context.
    unsafe {
        ffi::lua_createtable(L, 0, 7); // and `keys`, set by persist_protected
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        push_layout(L, -2, c"globals_layout", GameTable::Globals, parts);
        shallow_copy_keeping(L);
        ffi::lua_setfield(L, -3, c"globals_kept".as_ptr());
        ffi::lua_setfield(L, -2, c"globals".as_ptr());
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr()) == ffi::LUA_TTABLE {
            push_layout(L, -2, c"loaded_layout", GameTable::Loaded, parts);
            shallow_copy_keeping(L);
            ffi::lua_setfield(L, -3, c"loaded_kept".as_ptr());
            ffi::lua_setfield(L, -2, c"loaded".as_ptr());
        } else {
            ffi::lua_settop(L, -2);
        }
    }
}

/// Sets `root[field]` (the root at `root`, a relative index from before the call) to the
/// layout of the table on top (`write::layout_blob`), a byte string, if it has one: a load
/// puts the entries it sets into its own `_G` and `package.loaded` in the saved nodes, so
/// that `pairs(_G)` visits them in the saving process's order (format 10 on; a load of an
/// older file, or one that cannot apply it, keeps the order its insertions give). The
/// layout's code-1 nodes (`which` of the two tables) go to `parts.removed` at the same time,
/// so that their indices match the layout (format 11).
///
/// # Safety
/// Protected context; a table on top, the root a table at `root` (below it).
unsafe fn push_layout(
    L: *mut lua_State,
    root: c_int,
    field: &CStr,
    which: GameTable,
    parts: &mut GameRootParts,
) {
    // SAFETY: protected context; the table on top is live and no Lua code runs while its
    // layout and code-1 nodes are read (host memory only); the string pushed is stored in the
    // root (may allocate).
    unsafe {
        let root = ffi::lua_absindex(L, root);
        let t = ffi::lua_topointer(L, -1);
        if !super::write::layout_blob(L, t, &mut parts.blob) {
            return;
        }
        super::write::game_removed_nodes(t, which, &mut parts.removed);
        ffi::lua_pushlstring(L, parts.blob.as_ptr().cast(), parts.blob.len());
        ffi::lua_setfield(L, root, field.as_ptr());
    }
}

/// Puts the entries of the live table at `live` into the nodes of the layout at
/// `root[field]`, if the root has one and it applies (see `read::relayout_blob`; where it does
/// not, the layout's removed keys go in by insertion), then gives the table the removed keys
/// the file names for it after its root (`which`, in the list at `list`, or none if `list`
/// holds nil: see `read::give_game_removed_keys`), and seals the entries inserted as removed.
/// So a coroutine suspended in a `pairs()` loop over `_G` or `package.loaded` that cleared its
/// current entry finds that entry's key again (docs/save-games.md, "Iteration order").
///
/// # Safety
/// Protected context; `root`, `live` and `list` absolute indices, of tables but for `list`
/// (a table `Loader::game_removed_keys` filled, or nil).
unsafe fn apply_layout(
    L: *mut lua_State,
    root: c_int,
    field: &CStr,
    live: c_int,
    list: c_int,
    which: GameTable,
) {
    // SAFETY: protected context; the field is read raw and popped; a string's bytes stay
    // valid while it is on the stack.
    unsafe {
        let mut laid = false;
        if raw_field(L, root, field) == ffi::LUA_TSTRING {
            let mut len = 0usize;
            let p = ffi::lua_tolstring(L, -1, &mut len);
            let blob = std::slice::from_raw_parts(p.cast::<u8>(), len);
            laid = super::read::relayout_blob(L, live, blob);
        }
        ffi::lua_settop(L, -2);
        if ffi::lua_type(L, list) == ffi::LUA_TTABLE {
            super::read::give_game_removed_keys(L, live, list, which, laid);
        }
        super::read::seal_game_table(L, live);
    }
}

/// Replaces the table on top with a raw shallow copy of it without its "own bindings" (a
/// string key `N` whose value is the permanent named `N`, such as `_G.os == os`), and pushes
/// the array of those names: [.., t] -> [.., copy, names].
///
/// # Safety
/// Protected context; a table on top.
unsafe fn shallow_copy_keeping(L: *mut lua_State) {
    // SAFETY: protected context; a table on top.
    unsafe {
        let src = ffi::lua_gettop(L);
        ffi::lua_createtable(L, 0, 64); // src + 1: the copy
        ffi::lua_createtable(L, 16, 0); // src + 2: the names
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, PERMS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -2);
            ffi::lua_createtable(L, 0, 0);
        }
        let perms = src + 3;
        let mut kept = 0;
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, src) != 0 {
            // [.., k, v]
            let mut own = false;
            if ffi::lua_type(L, -2) == ffi::LUA_TSTRING {
                ffi::lua_pushvalue(L, -1);
                if ffi::lua_rawget(L, perms) == ffi::LUA_TSTRING {
                    own = ffi::lua_rawequal(L, -1, -3) != 0;
                }
                ffi::lua_settop(L, -2);
            }
            if own {
                kept += 1;
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rawseti(L, src + 2, kept);
                ffi::lua_settop(L, -2);
            } else {
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_rawset(L, src + 1);
            }
        }
        ffi::lua_settop(L, src + 2);
        ffi::lua_rotate(L, src, -1);
        ffi::lua_settop(L, -2);
    }
}

/// Raises a Lua error with `msg`.
///
/// # Safety
/// Protected context.
unsafe fn refuse(L: *mut lua_State, msg: &CStr) -> ! {
    // SAFETY: protected context (callers' contract).
    unsafe {
        ffi::lua_pushstring(L, msg.as_ptr());
        ffi::lua_error(L)
    }
}

/// Pushes `t[name]` for the table at absolute index `t`, without metamethods, and returns its
/// type. The game root comes from the file: a metatable with `__index` there would run a
/// function the file names after the load's budget and constructor rules ended.
///
/// # Safety
/// A protected context of a VM built by this crate; `t` is the absolute index of a table.
unsafe fn raw_field(L: *mut lua_State, t: c_int, name: &CStr) -> c_int {
    // SAFETY: protected context (the push may raise a memory error); `t` is a table.
    unsafe {
        ffi::lua_pushstring(L, name.as_ptr());
        ffi::lua_rawget(L, t)
    }
}

/// Restores `_G` and `package.loaded` from a loaded game root (on top, popped) in place. Every
/// check comes before the first write: a refused root leaves both as they were.
///
/// With `add` (an update load), first adds the functions new in this version to the saved
/// module tables (see `persist::added`; none of the `unchanged` chunks) and returns what it
/// added.
///
/// `list` is the absolute index of the removed keys the file gives `_G` and
/// `package.loaded` (nil if none: `LoadOutcome::take_game_removed`), given once their
/// entries are set and their layouts applied.
///
/// # Safety
/// Protected context; raises a clear error if the root is not a game save.
pub(super) unsafe fn restore_game(
    L: *mut lua_State,
    add: bool,
    unchanged: &HashSet<Vec<u8>>,
    list: c_int,
) -> Added {
    // SAFETY: protected context (callers' contract); balanced pushes.
    unsafe {
        let root = ffi::lua_gettop(L);
        if ffi::lua_type(L, root) != ffi::LUA_TTABLE
            || raw_field(L, root, c"globals") != ffi::LUA_TTABLE
        {
            refuse(
                L,
                c"not a whole-game save (no globals table); use unpersist for single values",
            );
        }
        // [root, saved globals, live _G, keep]
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        checked_pair(L, root, c"globals_kept");
        // [.., saved loaded, live package.loaded, keep], if both are tables
        let loaded = raw_field(L, root, c"loaded") == ffi::LUA_TTABLE
            && ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr()) == ffi::LUA_TTABLE;
        if loaded {
            checked_pair(L, root, c"loaded_kept");
        }
        let added = if loaded && add {
            add_new_functions(L, root + 4, root + 5, unchanged)
        } else {
            Added::default()
        };
        restore_into(L, root + 1);
        apply_layout(
            L,
            root,
            c"globals_layout",
            root + 2,
            list,
            GameTable::Globals,
        );
        if loaded {
            restore_into(L, root + 4);
            apply_layout(L, root, c"loaded_layout", root + 5, list, GameTable::Loaded);
        }
        ffi::lua_settop(L, root - 1);
        added
    }
}

/// [.., saved, live] -> [.., saved, live, keep]: checks that `saved` is a table the load built
/// (not a permanent) and pushes the set of names in the root's list `field` to keep in
/// `live` (see [`kept_names`]).
///
/// # Safety
/// Protected context; two tables on top, the game root at `root`.
unsafe fn checked_pair(L: *mut lua_State, root: c_int, field: &CStr) {
    // SAFETY: protected context; balanced pushes.
    unsafe {
        let live = ffi::lua_gettop(L);
        if is_permanent(L, live - 1) {
            refuse(
                L,
                c"malformed game save: its globals or loaded modules are a table of the loading VM (a permanent such as string), not one the save built",
            );
        }
        kept_names(L, root, field, live);
    }
}

/// With `saved`, `live` and `keep` at `at`, `at + 1`, `at + 2` (from [`checked_pair`]):
/// makes `live` hold exactly `saved`'s entries, except that each name in `keep` keeps
/// `live`'s own binding (a host that removed `os` from its globals keeps it removed, and the
/// host's own binding is never replaced by the file's). Reads `saved` raw and writes only
/// `live`.
///
/// # Safety
/// Protected context; the three tables at `at..at + 3`.
unsafe fn restore_into(L: *mut lua_State, at: c_int) {
    let (saved, live, keep) = (at, at + 1, at + 2);
    // SAFETY: protected context; balanced pushes.
    unsafe {
        let top = ffi::lua_gettop(L);
        // Entries of `live` the save lacks go, unless kept.
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, live) != 0 {
            ffi::lua_settop(L, -2);
            ffi::lua_pushvalue(L, -1);
            let absent = ffi::lua_rawget(L, saved) == ffi::LUA_TNIL;
            ffi::lua_settop(L, -2);
            ffi::lua_pushvalue(L, -1);
            let kept = ffi::lua_rawget(L, keep) != ffi::LUA_TNIL;
            ffi::lua_settop(L, -2);
            if absent && !kept {
                ffi::lua_pushvalue(L, -1);
                ffi::lua_pushnil(L);
                ffi::lua_rawset(L, live);
            }
        }
        // The save's entries, except where a kept binding stays.
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, saved) != 0 {
            ffi::lua_pushvalue(L, -2);
            if ffi::lua_rawget(L, keep) != ffi::LUA_TNIL {
                ffi::lua_settop(L, -3);
                continue;
            }
            ffi::lua_settop(L, -2);
            ffi::lua_pushvalue(L, -2);
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_rawset(L, live);
        }
        ffi::lua_settop(L, top);
    }
}

/// Pushes a new set `{ [name] = true }` of the names in the root's list `field` (written by
/// `shallow_copy_keeping`) that `live` binds to the loading VM's own permanent of that name.
/// Raises on a malformed list.
///
/// # Safety
/// Protected context; `root` and `live` absolute indices of tables.
unsafe fn kept_names(L: *mut lua_State, root: c_int, field: &CStr, live: c_int) {
    // SAFETY: protected context; balanced pushes, the set left on top.
    unsafe {
        let malformed =
            c"malformed game save: its list of kept library bindings is not an array of names";
        let top = ffi::lua_gettop(L);
        ffi::lua_createtable(L, 0, 0);
        let keep = top + 1;
        match raw_field(L, root, field) {
            ffi::LUA_TNIL => {
                ffi::lua_settop(L, keep);
                return;
            }
            ffi::LUA_TTABLE => {}
            _ => refuse(L, malformed),
        }
        let names = keep + 1;
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
        let unperms = keep + 2;
        let n = ffi::lua_rawlen(L, names);
        // Only the array 1..n: anything else in the list is refused.
        ffi::lua_pushnil(L);
        let mut count = 0usize;
        while ffi::lua_next(L, names) != 0 {
            count += 1;
            ffi::lua_settop(L, -2);
        }
        if count != n as usize {
            refuse(L, malformed);
        }
        for i in 1..=n {
            if ffi::lua_rawgeti(L, names, i as ffi::lua_Integer) != ffi::LUA_TSTRING {
                refuse(L, malformed);
            }
            // [.., name]: kept if live[name] is the permanent named name.
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawget(L, live);
            ffi::lua_pushvalue(L, -2);
            let own = ffi::lua_type(L, unperms) == ffi::LUA_TTABLE
                && ffi::lua_rawget(L, unperms) != ffi::LUA_TNIL
                && ffi::lua_rawequal(L, -1, -2) != 0;
            ffi::lua_settop(L, -3);
            if own {
                ffi::lua_pushboolean(L, 1);
                ffi::lua_rawset(L, keep);
            } else {
                ffi::lua_settop(L, -2);
            }
        }
        ffi::lua_settop(L, keep);
    }
}
