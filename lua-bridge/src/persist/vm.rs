//! The save-game methods of [`Vm`]: a value at a global path or the whole game, to bytes and
//! back.

use super::error::{Accept, LoadError, SaveError};
use super::format;
use super::options::{LoadOptions, PersistOptions, Trust};
use super::permanents::{add_permanent, PERMS_KEY, UNPERMS_KEY};
use super::protected::{load_protected, mark_constructor, persist_protected};
use super::report::LoadReport;
use crate::bridge::error::VmError;
use crate::bridge::ffi as raw;
use crate::bridge::vm::Vm;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, CStr, CString};

/// What the root of a persist is.
enum Root<'a> {
    Path(&'a CStr),
    Game,
}

impl Vm {
    fn persist_root(&self, root: Root<'_>, opts: &PersistOptions) -> Result<Vec<u8>, SaveError> {
        let mut staged: Option<String> = None;
        let mut result: Option<Vec<u8>> = None;
        let r = self.run(
            &mut |L| {
                // SAFETY: protected body; builds the root, then persists it in a nested
                // protected call so the Persister's state is dropped before errors propagate.
                unsafe {
                    ffi::lua_pushnil(L);
                    match &root {
                        Root::Path(p) => raw::push_path(L, p),
                        Root::Game => push_game_root(L),
                    }
                    let (st, err, file) = persist_protected(L, opts, false);
                    staged = err;
                    if st != ffi::LUA_OK {
                        ffi::lua_error(L);
                    }
                    result = file;
                    0
                }
            },
            |_, _| (),
        );
        match (r, staged, result) {
            (Ok(()), _, Some(bytes)) => Ok(bytes),
            (Err(VmError::Lua { message, .. }), Some(staged), _) if message.contains(&staged) => {
                Err(SaveError::Unpersistable { message: staged })
            }
            (Err(e), _, _) => Err(SaveError::Lua(e)),
            (Ok(()), _, None) => Err(SaveError::Unpersistable {
                message: "nothing was written".into(),
            }),
        }
    }

    /// Persists the value at a dotted global path (and everything reachable from it).
    pub fn persist(&self, path: &str) -> Result<Vec<u8>, SaveError> {
        self.persist_with(path, &PersistOptions::default())
    }

    /// Like [`persist`](Vm::persist), with options.
    pub fn persist_with(&self, path: &str, opts: &PersistOptions) -> Result<Vec<u8>, SaveError> {
        let p = self.checked_path(path).map_err(SaveError::Lua)?;
        self.persist_root(Root::Path(&p), opts)
    }

    /// Saves the whole game: the globals and `package.loaded` (library tables and functions go
    /// by name, as permanents).
    pub fn save_game(&self) -> Result<Vec<u8>, SaveError> {
        // math.random's state is not a Lua value: copied where the root includes it.
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { crate::bridge::random_state::stage(L) };
                0
            },
            |_, _| (),
        )
        .map_err(SaveError::Lua)?;
        self.persist_root(Root::Game, &PersistOptions::default())
    }

    fn load_root(
        &mut self,
        data: &[u8],
        opts: &LoadOptions,
        store: Option<&CStr>,
    ) -> Result<LoadReport, LoadError> {
        // Refuse bad headers before touching the VM.
        let opened = format::open(data).map_err(LoadError::from)?;
        self.check_idle("load a save-game")
            .map_err(LoadError::Lua)?;
        let old_limit = self.arena.stats().limit_bytes as usize;
        if let Some(growth) = opts.max_heap_growth {
            // The arena's limit bounds the bytes of live blocks.
            let cap = (self.arena.stats().bytes_allocated as usize)
                .saturating_add(growth)
                .min(old_limit);
            let _ = self.arena.set_limit(
                cap.next_multiple_of(luasnap_alloc::PAGE_SIZE)
                    .min(old_limit),
            );
        }
        let mut staged: Option<String> = None;
        let mut accept: Option<Accept> = None;
        let mut report = LoadReport::default();
        let r = self.run(
            &mut |L| {
                // SAFETY: protected body; the load itself runs in a nested protected call.
                unsafe {
                    ffi::lua_pushnil(L);
                    ffi::lua_pushnil(L); // the file is read from `data`, not copied into Lua
                    let out = load_protected(L, opts, Some(opened));
                    (staged, accept, report) = (out.error, out.accept, out.report);
                    if out.status != ffi::LUA_OK {
                        ffi::lua_error(L);
                    }
                    match store {
                        Some(path) => store_at_path(L, path),
                        None => restore_game(L),
                    }
                    0
                }
            },
            |_, _| (),
        );
        let _ = self.arena.set_limit(old_limit);
        match (r, staged) {
            (Ok(()), _) => Ok(report),
            (Err(VmError::Lua { message, .. }), Some(staged)) if message.contains(&staged) => {
                Err(match accept {
                    Some(accept) => LoadError::Refused {
                        message: staged,
                        accept,
                    },
                    None => LoadError::Invalid { message: staged },
                })
            }
            (Err(e), _) => Err(LoadError::Lua(e)),
        }
    }

    /// Loads a save-game written by `trust` (with that level's default options) and stores
    /// the value at a dotted global path.
    pub fn unpersist(&mut self, data: &[u8], path: &str, trust: Trust) -> Result<(), LoadError> {
        self.unpersist_with(data, path, &LoadOptions::new(trust))
    }

    /// Like [`unpersist`](Vm::unpersist), with options.
    pub fn unpersist_with(
        &mut self,
        data: &[u8],
        path: &str,
        opts: &LoadOptions,
    ) -> Result<(), LoadError> {
        self.unpersist_reporting(data, path, opts).map(drop)
    }

    /// Like [`unpersist_with`](Vm::unpersist_with), returning what the load did with the
    /// saved functions (see [`FunctionBinding`](super::FunctionBinding)).
    pub fn unpersist_reporting(
        &mut self,
        data: &[u8],
        path: &str,
        opts: &LoadOptions,
    ) -> Result<LoadReport, LoadError> {
        let p = self.checked_path(path).map_err(LoadError::Lua)?;
        self.load_root(data, opts, Some(&p))
    }

    /// Loads a whole-game save written by `trust`: restores the globals and
    /// `package.loaded` in place (entries not in the save are removed, `_G` itself stays the
    /// same table).
    pub fn load_game(&mut self, data: &[u8], trust: Trust) -> Result<(), LoadError> {
        self.load_game_with(data, &LoadOptions::new(trust))
    }

    /// Like [`load_game`](Vm::load_game), with options.
    pub fn load_game_with(&mut self, data: &[u8], opts: &LoadOptions) -> Result<(), LoadError> {
        self.load_game_reporting(data, opts).map(drop)
    }

    /// Like [`load_game_with`](Vm::load_game_with), returning what the load did with the
    /// saved functions (see [`FunctionBinding`](super::FunctionBinding)).
    pub fn load_game_reporting(
        &mut self,
        data: &[u8],
        opts: &LoadOptions,
    ) -> Result<LoadReport, LoadError> {
        let report = self.load_root(data, opts, None)?;
        // The loaded copy of math.random's state goes back into the generator.
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { crate::bridge::random_state::unstage(L) };
                0
            },
            |_, _| (),
        )
        .map_err(LoadError::Lua)?;
        Ok(report)
    }

    /// Marks the function at a dotted global path as a constructor: loads of foreign saves
    /// may call it at load time (as a `__persist` rebuild, create or init function), and
    /// closures of the functions defined inside it (the rebuild closures a `__persist`
    /// function returns). Nothing else runs while a foreign save loads.
    pub fn register_constructor(&mut self, path: &str) -> Result<(), VmError> {
        let p = self.checked_path(path)?;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    raw::push_path(L, &p);
                    if ffi::lua_type(L, -1) != ffi::LUA_TFUNCTION {
                        ffi::lua_pushstring(
                            L,
                            c"register_constructor: the value at that path is not a function"
                                .as_ptr(),
                        );
                        ffi::lua_error(L);
                    }
                    mark_constructor(L);
                }
                0
            },
            |_, _| (),
        )
    }

    /// Makes the value at a dotted global path a permanent under `name`: saves refer to it by
    /// name instead of persisting it, and loads take it from the loading VM.
    pub fn register_permanent(&mut self, name: &str, path: &str) -> Result<(), VmError> {
        let p = self.checked_path(path)?;
        let n = CString::new(name).map_err(|_| VmError::BadName { name: name.into() })?;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    raw::push_path(L, &p);
                    add_permanent(L, &n);
                }
                0
            },
            |_, _| (),
        )
    }
}

/// Pushes `{ globals = copy of _G, loaded = copy of package.loaded }`.
unsafe fn push_game_root(L: *mut lua_State) {
    // SAFETY: protected context.
    unsafe {
        ffi::lua_createtable(L, 0, 4);
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        shallow_copy_keeping(L);
        ffi::lua_setfield(L, -3, c"globals_kept".as_ptr());
        ffi::lua_setfield(L, -2, c"globals".as_ptr());
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr()) == ffi::LUA_TTABLE {
            shallow_copy_keeping(L);
            ffi::lua_setfield(L, -3, c"loaded_kept".as_ptr());
            ffi::lua_setfield(L, -2, c"loaded".as_ptr());
        } else {
            ffi::lua_settop(L, -2);
        }
    }
}

/// Replaces the table on top with a raw shallow copy of it without its "own bindings" (a
/// string key `N` whose value is the permanent named `N`, such as `_G.os == os`), and pushes
/// the array of those names: [.., t] -> [.., copy, names]. A game save writes the names
/// instead of the permanents, and a load keeps the loading VM's own binding for each (see
/// `restore_kept`), so a foreign load, which denies `os` and the like, still restores an
/// ordinary game while refusing such a permanent anywhere else.
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

/// [.., saved, live] -> for each name in the root's field `field` (written by
/// `shallow_copy_keeping`), sets `saved[name]` to `live[name]` if that is the loading VM's
/// own permanent named `name`; otherwise the name stays absent (a host that removed `os`
/// from its globals keeps it removed). Raises on a malformed list. Leaves the stack as is.
unsafe fn restore_kept(L: *mut lua_State, root: c_int, field: &CStr) {
    // SAFETY: protected context; two tables on top, the game root at `root`.
    unsafe {
        let live = ffi::lua_gettop(L);
        let saved = live - 1;
        match raw_field(L, root, field) {
            ffi::LUA_TNIL => {
                ffi::lua_settop(L, live);
                return;
            }
            ffi::LUA_TTABLE => {}
            _ => malformed_game(L),
        }
        let names = live + 1;
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
        let unperms = live + 2;
        let n = ffi::lua_rawlen(L, names);
        // Only the array 1..n: anything else in the list is refused.
        ffi::lua_pushnil(L);
        let mut count = 0usize;
        while ffi::lua_next(L, names) != 0 {
            count += 1;
            ffi::lua_settop(L, -2);
        }
        if count != n {
            malformed_game(L);
        }
        for i in 1..=n {
            if ffi::lua_rawgeti(L, names, i as ffi::lua_Integer) != ffi::LUA_TSTRING {
                malformed_game(L);
            }
            // [.., name]
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawget(L, live);
            ffi::lua_pushvalue(L, -2);
            let own = ffi::lua_type(L, unperms) == ffi::LUA_TTABLE
                && ffi::lua_rawget(L, unperms) != ffi::LUA_TNIL
                && ffi::lua_rawequal(L, -1, -2) != 0;
            ffi::lua_settop(L, -2);
            // [.., name, live[name]]
            if own {
                ffi::lua_rawset(L, saved);
            } else {
                ffi::lua_settop(L, -3);
            }
        }
        ffi::lua_settop(L, live);
    }
}

/// Raises the error for a game root whose list of kept bindings is not an array of names.
unsafe fn malformed_game(L: *mut lua_State) -> ! {
    // SAFETY: protected context.
    unsafe {
        ffi::lua_pushstring(
            L,
            c"malformed game save: its list of kept library bindings is not an array of names"
                .as_ptr(),
        );
        ffi::lua_error(L)
    }
}

/// Stores the loaded value (on top) at the global path.
unsafe fn store_at_path(L: *mut lua_State, path: &CStr) {
    // SAFETY: protected context; the value is on top.
    unsafe {
        let bytes = path.to_bytes();
        match bytes.iter().rposition(|&b| b == b'.') {
            Some(dot) => {
                let parent = CString::new(&bytes[..dot]).expect("from a CStr");
                raw::push_path(L, &parent);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_pushlstring(L, bytes[dot + 1..].as_ptr().cast(), bytes.len() - dot - 1);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_settable(L, -3);
                ffi::lua_settop(L, -2);
            }
            None => ffi::lua_setglobal(L, path.as_ptr()),
        }
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

/// Restores `_G` and `package.loaded` from a loaded game root (on top) in place.
unsafe fn restore_game(L: *mut lua_State) {
    // SAFETY: protected context; raises a clear error if the root is not a game save.
    unsafe {
        let root = ffi::lua_gettop(L);
        if ffi::lua_type(L, root) != ffi::LUA_TTABLE
            || raw_field(L, root, c"globals") != ffi::LUA_TTABLE
        {
            ffi::lua_pushstring(
                L,
                c"not a whole-game save (no globals table); use unpersist for single values"
                    .as_ptr(),
            );
            ffi::lua_error(L);
        }
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        restore_kept(L, root, c"globals_kept");
        replace_contents(L);
        if raw_field(L, root, c"loaded") == ffi::LUA_TTABLE
            && ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr()) == ffi::LUA_TTABLE
        {
            restore_kept(L, root, c"loaded_kept");
            replace_contents(L);
        }
        ffi::lua_settop(L, root - 1);
    }
}

/// [.., saved, live] -> makes `live` hold exactly `saved`'s entries; pops both.
unsafe fn replace_contents(L: *mut lua_State) {
    // SAFETY: protected context; two tables on top.
    unsafe {
        let live = ffi::lua_gettop(L);
        let saved = live - 1;
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, live) != 0 {
            ffi::lua_settop(L, -2);
            ffi::lua_pushvalue(L, -1);
            if ffi::lua_rawget(L, saved) == ffi::LUA_TNIL {
                ffi::lua_pushvalue(L, -2);
                ffi::lua_pushnil(L);
                ffi::lua_rawset(L, live);
            }
            ffi::lua_settop(L, -2);
        }
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, saved) != 0 {
            ffi::lua_pushvalue(L, -2);
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_rawset(L, live);
        }
        ffi::lua_settop(L, saved - 1);
    }
}
