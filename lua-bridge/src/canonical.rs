//! Canonical arena bytes: after any call from the host into Lua, the arena's bytes depend on
//! the Lua state alone, not on host stack addresses or the host's call path.
//!
//! Lua leaves two host-dependent things in the heap when a thread stops running:
//! - **dead stack slots** (at or above the top) keep the last values stored there, among them
//!   the light userdata `luaL_buffinit` pushes as a placeholder: the address of a `luaL_Buffer`
//!   on the C stack, which moves with the depth of the host's call chain. Every library
//!   function that builds a string through a buffer leaves one (`string.format`, `rep`, `gsub`,
//!   `upper`, `table.concat`, `tostring` of some values, ...);
//! - a coroutine's C-call counter keeps the depth of whoever resumed it last.
//!
//! Every thread that ran is settled (dead slots zeroed, counter reset) when it stops: the main
//! thread after every host call ([`settle_main`], from `Vm::run`), a coroutine each time
//! `coroutine.resume`, a `coroutine.wrap` function or `coroutine.close` returns (this module
//! installs C versions of those three that do so; they behave exactly as Lua's own). The zeroing
//! compares before writing, so clean pages stay unwritten. A stack reallocated or freed while
//! its thread runs goes back to the allocator through [`scrubbing_alloc`], which zeroes the
//! light userdata in it. See `docs/determinism.md`.
//!
//! Not covered: a coroutine resumed with `lua_resume` by host code (natives cannot; the
//! persistence tests' own resumes settle nothing, which is harmless outside rollback).

use mlua::ffi::{self, lua_State};
use std::ffi::c_int;

unsafe extern "C" {
    fn luasnap_set_inner_alloc(f: luasnap_alloc::LuaAllocFn);
    fn luasnap_scrubbing_alloc(
        ud: *mut std::ffi::c_void,
        ptr: *mut std::ffi::c_void,
        osize: usize,
        nsize: usize,
    ) -> *mut std::ffi::c_void;
    fn luasnap_settle_thread(L: *mut lua_State) -> c_int;
    fn luasnap_is_weak_removable(L: *mut lua_State, idx: c_int) -> c_int;
}

// Lua C functions: they may raise (longjmp through no Rust frame).
unsafe extern "C-unwind" {
    fn luasnap_co_resume(L: *mut lua_State) -> c_int;
    fn luasnap_co_wrap(L: *mut lua_State) -> c_int;
    fn luasnap_co_close(L: *mut lua_State) -> c_int;
}

/// The allocator to give Lua: `inner` (the arena's) behind a layer that scrubs light userdata
/// out of freed blocks that may be stacks (`csrc/internals.c`, "Freed stacks").
pub(crate) fn scrubbing_alloc(inner: luasnap_alloc::LuaAllocFn) -> luasnap_alloc::LuaAllocFn {
    // SAFETY: stores a function pointer; every arena of the process has the same allocator
    // function, so a second call stores the same value.
    unsafe { luasnap_set_inner_alloc(inner) };
    luasnap_scrubbing_alloc
}

/// Zeroes the dead stack slots of the idle main thread `L`; returns how many it wrote.
///
/// # Safety
/// `L` is a main thread of a VM built by this crate and nothing runs on it.
pub(crate) unsafe fn settle_main(L: *mut lua_State) -> c_int {
    // SAFETY: idle thread (caller's contract): every slot above its top is dead.
    unsafe { luasnap_settle_thread(L) }
}

/// Replaces `coroutine.resume`, `coroutine.wrap` and `coroutine.close` (if the coroutine
/// library is open) with versions that settle the coroutine whenever it stops running.
///
/// # Safety
/// Protected context (may raise a memory error), before any save-game permanents are recorded.
pub(crate) unsafe fn install(L: *mut lua_State) {
    // SAFETY: protected context; balanced pushes.
    unsafe {
        if ffi::lua_getglobal(L, c"coroutine".as_ptr()) == ffi::LUA_TTABLE {
            let funcs: [(&std::ffi::CStr, ffi::lua_CFunction); 3] = [
                (c"resume", luasnap_co_resume),
                (c"wrap", luasnap_co_wrap),
                (c"close", luasnap_co_close),
            ];
            for (name, f) in funcs {
                ffi::lua_pushcclosure(L, f, 0);
                ffi::lua_setfield(L, -2, name.as_ptr());
            }
        }
        ffi::lua_settop(L, -2);
    }
}

/// Whether the value at the absolute index `idx` is one the collector can remove from a weak
/// table (a table, full userdata, Lua or C closure, or thread; not a string or light value).
///
/// # Safety
/// `idx` is a valid absolute (positive) index of the running frame.
pub(crate) unsafe fn is_weak_removable(L: *mut lua_State, idx: c_int) -> bool {
    // SAFETY: a valid index (caller's contract); reads only.
    unsafe { luasnap_is_weak_removable(L, idx) != 0 }
}
