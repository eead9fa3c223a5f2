//! A save and a load as protected Lua calls (the Rust API's and `eris`'s), with the
//! permanents merged, the helper tables in their slots, the budgets begun and ended, and the
//! collector stopped and restored around them.

use super::budget::LoadBudget;
use super::error::{Accept, LoadError};
use super::format;
use super::options::{LoadOptions, PersistOptions, Trust};
use super::permanents::{key_name, CTORS_KEY, PERMS_KEY, UNPERMS_KEY};
use super::report::LoadReport;
use super::slots::Slots;
use super::{read, write};
use crate::bridge::ffi::{self as raw, Job};
use crate::bridge::helpers::{
    luasnap_gc_stopem, luasnap_key_counter, luasnap_proto, luasnap_raise_memerr,
};
use crate::bridge::natives;
use crate::bridge::per_vm;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, CStr};

/// The field of a whole-game save's root that holds the saving VM's key counter (format 7):
/// set by [`persist_protected`] once the collector is stopped, and continued by a load
/// (`vm.rs`, `game_key_counter`).
pub(super) const GAME_KEYS: &CStr = c"keys";

/// Persists the value on top of the stack at `base + 2`, with perms at `base + 1` (a table,
/// or nil for the VM's permanents). Runs protected. On success the file is left on the stack
/// as a string if `as_string`, else returned (and nil left). Returns the status, the
/// Persister's error (if it produced it) and the file. With `game_root`, the value is a
/// whole-game save's root (`push_game_root`), which gets the VM's key counter, and
/// `game_root` holds the code-1 nodes of `_G` and `package.loaded` its layouts describe.
pub(super) unsafe fn persist_protected(
    L: *mut lua_State,
    opts: &PersistOptions,
    as_string: bool,
    game_root: Option<&[write::GameRemovedNode]>,
) -> (c_int, Option<String>, Option<Vec<u8>>) {
    // SAFETY: a VM built by this crate, on its thread; the caller pushed perms and value.
    let (natives, base) = unsafe { (natives::state_of(L), per_vm::arena_base(L)) };
    let mut p = write::Persister::new(opts, natives.registry.types(), base);
    p.game = game_root.is_some();
    p.game_removed = game_root.unwrap_or_default().to_vec();
    let game_root = p.game;
    let mut out: Vec<u8> = Vec::new();
    // SAFETY: queries only.
    let running = unsafe { ffi::lua_gc(L, ffi::LUA_GCISRUNNING) } != 0;
    // SAFETY: reads a flag of the global state.
    let stopem = unsafe { luasnap_gc_stopem(L, -1) };
    let mut body = |L: *mut lua_State| -> c_int {
        // SAFETY: protected body; all Rust state lives in `p` and `out`, outside this frame.
        unsafe {
            // [perms|nil, value]
            ffi::lua_gc(L, ffi::LUA_GCSTOP);
            merge_permanents(L, PERMS_KEY);
            if game_root {
                // The key counter, read once the collector is stopped: no finalizer runs from
                // here to the end of the walk (one that ran while the root was built may have
                // keyed an object), so every identity the file gives is counted.
                ffi::lua_pushinteger(L, luasnap_key_counter(L) as ffi::lua_Integer);
                ffi::lua_setfield(L, -2, GAME_KEYS.as_ptr());
            }
            ffi::lua_createtable(L, 0, 0); // seen
            ffi::lua_createtable(L, 0, 0); // strs
            ffi::lua_rotate(L, 2, 2); // [perms, seen, strs, value]
            let s = Slots {
                perms: 1,
                seen: 2,
                objs: 2,
                keys: 3,
                strs: 3,
                protos: 3,
                inits: 3,
            };
            if p.run(L, s).is_err() {
                let msg = p.error.as_deref().unwrap_or("persist failed");
                ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
                ffi::lua_error(L);
            }
            let flags = if p.has_bytecode {
                format::FLAG_BYTECODE
            } else {
                0
            } | if p.has_source { format::FLAG_SOURCE } else { 0 }
                | format::FLAG_QUOTED_PLACES;
            out = std::mem::take(&mut p.w).finish(flags);
            if as_string {
                ffi::lua_pushlstring(L, out.as_ptr().cast(), out.len());
            } else {
                ffi::lua_pushnil(L);
            }
            1
        }
    };
    // SAFETY: perms and value are the two values on top (callers' contract).
    let st = unsafe { call_job(L, &mut body, running) };
    // Emergency collections as they were before (the persister stops them; a load around
    // this persist, if any, wants them stopped).
    // SAFETY: sets a flag of the global state.
    unsafe { luasnap_gc_stopem(L, stopem) };
    let file = (st == ffi::LUA_OK && !as_string).then_some(out);
    (st, p.error.take(), file)
}

/// Replaces stack slot 1 (the caller's permanents table, or nil) with the VM's permanents
/// under `key` plus the caller's: as in Eris, the caller's add to the standard library's and
/// win where both name the same value (or, loading, the same name). Raw reads only: a
/// metatable on the caller's table is not consulted.
///
/// # Safety
/// Protected context (allocates); slot 1 holds a table or nil.
unsafe fn merge_permanents(L: *mut lua_State, key: &CStr) {
    // SAFETY: callers' contract; balanced pushes.
    unsafe {
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, key.as_ptr());
        if ffi::lua_type(L, 1) != ffi::LUA_TTABLE {
            ffi::lua_replace(L, 1);
            return;
        }
        let builtin = ffi::lua_gettop(L);
        ffi::lua_createtable(L, 0, 512);
        let merged = builtin + 1;
        for src in [builtin, 1] {
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, src) != 0 {
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_rawset(L, merged);
            }
        }
        ffi::lua_replace(L, 1);
        ffi::lua_settop(L, builtin - 1);
    }
}

/// Runs `body` protected with the two values on top of the stack as its arguments; they are
/// replaced by its one result, or by the error object. With `restart_gc`, the collector (which
/// the body stops) is restarted. Returns the `lua_pcall` status.
///
/// # Safety
/// `L` is a VM of this crate with at least two values on its stack, in a context where Lua
/// may be called.
unsafe fn call_job(
    L: *mut lua_State,
    body: &mut dyn FnMut(*mut lua_State) -> c_int,
    restart_gc: bool,
) -> c_int {
    let mut job = Job { body, panic: None };
    // SAFETY: the job outlives the protected call that reads it through the light userdata;
    // the pushes need no allocation beyond LUA_MINSTACK.
    unsafe {
        let base = ffi::lua_gettop(L) - 2;
        ffi::lua_pushcclosure(L, raw::run_job, 0);
        ffi::lua_pushlightuserdata(L, (&mut job as *mut Job<'_>).cast());
        ffi::lua_rotate(L, base + 1, 2);
        let st = ffi::lua_pcall(L, 3, 1, 0);
        if restart_gc {
            ffi::lua_gc(L, ffi::LUA_GCRESTART);
        }
        st
    }
}

/// How a load ended: the `lua_pcall` status, the loader's error (if it produced it), what
/// would accept a refused save, and what the load did with the saved functions.
pub(super) struct LoadOutcome {
    pub(super) status: c_int,
    pub(super) error: Option<String>,
    pub(super) accept: Option<Accept>,
    pub(super) report: LoadReport,
    /// The highest identity the file gave an object (0: none; see `read/ident.rs`).
    pub(super) max_ident: u32,
    /// Whether the file gave an identity to two objects.
    pub(super) shared_ident: bool,
    /// Whether the heap grew past the load's cap ([`LoadBudget::was_over_cap`]).
    pub(super) over_cap: bool,
    /// The chunks whose saved code is this version's (`persist::added` adds none of their
    /// functions).
    pub(super) unchanged_chunks: std::collections::HashSet<Vec<u8>>,
    /// The removed keys the file gives the loading VM's own `_G` and `package.loaded` (a
    /// registry reference, only after a load that succeeded): see [`Self::take_game_removed`].
    game_removed: Option<c_int>,
}

impl LoadOutcome {
    /// Releases the list of removed keys the file gives `_G` and `package.loaded` (see
    /// `read::give_game_removed_keys`), first pushing it if `push` (nil if the file has
    /// none). Every taker of an outcome calls this once: a whole-game restore to give the
    /// keys, any other load to drop them.
    ///
    /// # Safety
    /// `L` a thread of the VM the load ran in, with a free slot if `push`; neither raises nor
    /// allocates (the reference's registry slot exists).
    pub(super) unsafe fn take_game_removed(&mut self, L: *mut lua_State, push: bool) {
        // SAFETY: callers' contract; the reference is this load's, released once.
        unsafe {
            match self.game_removed.take() {
                Some(r) => {
                    if push {
                        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, r as ffi::lua_Integer);
                    }
                    ffi::luaL_unref(L, ffi::LUA_REGISTRYINDEX, r);
                }
                None if push => ffi::lua_pushnil(L),
                None => {}
            }
        }
    }
}

/// Loads a file with unperms at `base + 1` (or nil): `opened` (from `format::open`), or else
/// the file that is a string on top, at `base + 2`.
pub(super) unsafe fn load_protected(
    L: *mut lua_State,
    opts: &LoadOptions,
    opened: Option<format::Opened<'_>>,
) -> LoadOutcome {
    // SAFETY: a VM built by this crate, on its thread.
    let (natives, limits) = unsafe { (natives::state_of(L), LoadBudget::of(L)) };
    let file = match opened {
        Some(x) => x,
        None => {
            let mut data: &[u8] = &[];
            // SAFETY: the file is a string on top; it stays on the stack (alive) during the load.
            unsafe {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                if !p.is_null() {
                    data = std::slice::from_raw_parts(p.cast::<u8>(), len);
                }
            }
            match format::open(data) {
                Ok(x) => x,
                Err(e) => {
                    return LoadOutcome {
                        status: ffi::LUA_ERRRUN,
                        error: Some(LoadError::from(e).to_string()),
                        accept: None,
                        report: LoadReport::default(),
                        max_ident: 0,
                        shared_ident: false,
                        over_cap: false,
                        unchanged_chunks: Default::default(),
                        game_removed: None,
                    }
                }
            }
        }
    };
    let mut loader = read::Loader::new(file, opts, natives.registry.types(), limits);
    // SAFETY: queries only.
    let running = unsafe { ffi::lua_gc(L, ffi::LUA_GCISRUNNING) } != 0;
    // Budgets. A load nested in a load-time call of another (eris.unpersist) gets at most
    // what the outer one has left, and gives the outer one its hook back: loaded code cannot
    // lift a budget by loading again.
    // SAFETY: a thread of this VM; `end` follows below.
    let outer = unsafe { limits.begin(L, opts) };
    let mut body = |L: *mut lua_State| -> c_int {
        // SAFETY: protected body; state lives in `loader`, outside this frame.
        unsafe {
            ffi::lua_gc(L, ffi::LUA_GCSTOP);
            merge_permanents(L, UNPERMS_KEY);
            // [unperms, data|nil]: a data string stays on the stack while the loader reads it.
            ffi::lua_settop(L, 2);
            // objs and strs presized from the body's length (every object and string takes
            // a few bytes of it): growing them by doubling costs a rehash each time.
            let (nobjs, nstrs) = loader.helper_sizes();
            ffi::lua_createtable(L, nobjs, 0);
            for _ in 0..3 {
                ffi::lua_createtable(L, 0, 0);
            }
            ffi::lua_createtable(L, nstrs, 0);
            let s = Slots {
                perms: 1,
                seen: 3,
                objs: 3,
                keys: 4,
                protos: 5,
                inits: 6,
                strs: 7,
            };
            if loader.run(L, s).is_err() {
                if loader.out_of_memory {
                    // As any allocation failing in the load: a memory error, not a bad file.
                    luasnap_raise_memerr(L);
                }
                let msg = loader.error.as_deref().unwrap_or("load failed");
                ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
                ffi::lua_error(L);
            }
            1
        }
    };
    // SAFETY: unperms and the file are the two values on top (callers' contract); the count
    // hook bounds Lua code run meanwhile.
    let st = unsafe { call_job(L, &mut body, running) };
    // SAFETY: L is a thread of this VM; the load is over.
    unsafe {
        if loader.end_nofinal(L) && running {
            ffi::lua_gc(L, ffi::LUA_GCRESTART); // ignored by call_job while the mark was on
        }
    }
    // SAFETY: L is a thread of this VM; emergency collections were stopped by the loader.
    unsafe {
        if limits.end(L, outer) {
            read::allow_emergency_gc(L);
        }
    }
    // The list of removed keys is for a load that succeeded only.
    let mut game_removed = loader.game_removed.take();
    if st != ffi::LUA_OK {
        if let Some(r) = game_removed.take() {
            // SAFETY: L is a thread of this VM; the reference is this load's.
            unsafe { ffi::luaL_unref(L, ffi::LUA_REGISTRYINDEX, r) };
        }
    }
    LoadOutcome {
        status: st,
        error: loader.error.take(),
        accept: loader.accept.take(),
        report: loader.take_report(),
        max_ident: loader.idents.max(),
        shared_ident: loader.idents.shared(),
        over_cap: limits.was_over_cap(),
        unchanged_chunks: loader.take_unchanged_chunks(),
        game_removed,
    }
}

/// Returns 1 (the value on top) when `st` is `LUA_OK`, else raises the error object on top.
///
/// # Safety
/// Called from a C function Lua is running, with the result or error object on top; nothing
/// with a destructor may be alive in the calling frames.
unsafe fn one_result_or_raise(L: *mut lua_State, st: c_int) -> c_int {
    if st != ffi::LUA_OK {
        // SAFETY: callers' contract: the error object is on top and nothing needs dropping.
        unsafe { ffi::lua_error(L) };
    }
    1
}

/// `raw_persist(perms|nil, value, path, debug, spkey)` behind `eris.persist`.
pub(super) unsafe extern "C-unwind" fn eris_persist(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with the documented arguments; the helper only raises its error.
    unsafe { one_result_or_raise(L, eris_persist_inner(L)) }
}

unsafe fn eris_persist_inner(L: *mut lua_State) -> c_int {
    // SAFETY: reads arguments without conversion, then persists protected.
    unsafe {
        let spkey = key_name(L, 5).unwrap_or_else(|| "__persist".into());
        let opts = PersistOptions {
            path: ffi::lua_toboolean(L, 3) != 0,
            code: true,
            bytecode: true,
            debug: ffi::lua_toboolean(L, 4) != 0,
            spkey,
        };
        ffi::lua_settop(L, 2);
        persist_protected(L, &opts, true, None).0
    }
}

/// `raw_unpersist(perms|nil, data, spkey, foreign, maxgrowth)` behind `eris.unpersist`.
pub(super) unsafe extern "C-unwind" fn eris_unpersist(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with the documented arguments; the helper only raises its error.
    unsafe { one_result_or_raise(L, eris_unpersist_inner(L)) }
}

unsafe fn eris_unpersist_inner(L: *mut lua_State) -> c_int {
    // SAFETY: reads arguments without conversion, then loads protected.
    unsafe {
        let spkey = key_name(L, 3).unwrap_or_else(|| "__persist".into());
        let trust = if ffi::lua_toboolean(L, 4) != 0 {
            Trust::Foreign
        } else {
            Trust::Own
        };
        let growth = ffi::lua_tonumberx(L, 5, std::ptr::null_mut());
        let opts = LoadOptions {
            spkey,
            // As Eris: an own save's bytecode (binary chunks) loads.
            bytecode: trust == Trust::Own,
            max_heap_growth: (growth.is_finite() && growth >= 0.0).then_some(growth as usize),
            ..LoadOptions::new(trust)
        };
        ffi::lua_settop(L, 2);
        let mut out = load_protected(L, &opts, None);
        // Not a whole-game load: nothing takes the keys of `_G` and `package.loaded`.
        out.take_game_removed(L, false);
        if out.status != ffi::LUA_OK {
            if let Some(mut msg) = out.error {
                if let Some(accept) = out.accept {
                    msg = format!("{msg}; {}", accept.lua());
                }
                ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
            }
        }
        out.status
    }
}

/// `raw_constructor(f)` behind `eris.constructor`.
pub(super) unsafe extern "C-unwind" fn eris_constructor(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with a function at 1 (checked by the prelude); mark_constructor
    // raises only Lua errors (memory), and nothing here needs dropping.
    unsafe {
        ffi::lua_settop(L, 1);
        mark_constructor(L);
    }
    0
}

/// Marks the function on top (popped) as a constructor foreign loads may call: the function
/// itself, and for a Lua function its prototype and every prototype nested in it (so the
/// rebuild closures a `__persist` function returns qualify when it is marked).
///
/// # Safety
/// Protected context (allocates); a function on top.
pub(super) unsafe fn mark_constructor(L: *mut lua_State) {
    unsafe extern "C" fn collect(p: *const std::ffi::c_void, ud: *mut std::ffi::c_void) {
        // SAFETY: ud is the Vec below, alive for the walk.
        unsafe { (*(ud as *mut Vec<*const std::ffi::c_void>)).push(p) };
    }
    // SAFETY: protected context (callers' contract); balanced pushes.
    unsafe {
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, CTORS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -3);
            return;
        }
        ffi::lua_rotate(L, -2, 1); // [ctors, f]
        ffi::lua_pushvalue(L, -1);
        ffi::lua_pushboolean(L, 1);
        ffi::lua_rawset(L, -4);
        let p = luasnap_proto(L, -1);
        if !p.is_null() {
            let mut protos: Vec<*const std::ffi::c_void> = Vec::new();
            read::proto_tree(p, collect, (&mut protos as *mut Vec<_>).cast());
            for q in protos {
                ffi::lua_pushlightuserdata(L, q.cast_mut());
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rawset(L, -4);
            }
        }
        ffi::lua_settop(L, -3);
    }
}
