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
//! thread after every host call (`finish_host_call`, which also scrubs its free CallInfo records), a coroutine each time
//! `coroutine.resume`, a `coroutine.wrap` function or `coroutine.close` returns (this module
//! installs C versions of those three that do so; they behave exactly as Lua's own). The zeroing
//! compares before writing, so clean pages stay unwritten. A stack reallocated or freed while
//! its thread runs goes back to the allocator through [`scrubbing_alloc`], which zeroes the
//! light userdata in it. See `docs/determinism.md`.
//!
//! Not covered: a coroutine resumed with `lua_resume` by host code (natives cannot; the
//! persistence tests' own resumes settle nothing, which is harmless outside rollback).

use crate::bridge::allocator::{lua_alloc, lua_alloc_new};
use crate::bridge::helpers::{
    luasnap_co_close, luasnap_co_resume, luasnap_co_wrap, luasnap_has_light,
    luasnap_is_weak_removable, luasnap_min_stack_bytes, luasnap_scrub_light, luasnap_settle_thread,
};
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

/// The allocator given to Lua: the arena's ([`lua_alloc`]) behind a layer for
/// freed stacks. A thread's stack is reallocated while it runs (growing for a deep call,
/// shrinking in the collector's atomic phase or when `coroutine.close` resets it), and the old
/// block would go back to the allocator with whatever its slots held, live or dead: a
/// `luaL_Buffer` placeholder, or the light userdata a host call pushes, would stay in freed
/// arena memory. So a block that may be a stack (at least the smallest stack Lua makes) is
/// scrubbed of light userdata when freed, and, if it holds any, resized by
/// allocate-copy-scrub-free so the old block is scrubbed too (a block without any is resized
/// by the arena's allocator directly, in place where it can be). Scrubbing writes only slots tagged as light userdata; a freed block
/// is dead, so changing its bytes changes no behaviour.
///
/// # Safety
/// Lua's `lua_Alloc` contract, with `ud` as [`lua_alloc`] requires.
pub(crate) unsafe extern "C" fn scrubbing_alloc(
    ud: *mut c_void,
    ptr: *mut c_void,
    osize: usize,
    nsize: usize,
) -> *mut c_void {
    // SAFETY: forwards Lua's contract to the arena's allocator; the blocks scrubbed and copied
    // are live blocks of `osize` bytes (Lua passes the real size with a non-null pointer), and
    // the new block has `nsize` bytes.
    unsafe {
        // A null pointer is a new block (osize is then a type tag; Lua never asks for 0 bytes
        // there); small blocks are no stacks.
        if ptr.is_null() && nsize != 0 {
            return lua_alloc_new(ud, osize, nsize);
        }
        if ptr.is_null() || osize < luasnap_min_stack_bytes {
            return lua_alloc(ud, ptr, osize, nsize);
        }
        if nsize == 0 {
            luasnap_scrub_light(ptr, osize);
            return lua_alloc(ud, ptr, osize, 0);
        }
        // Nothing to scrub (most large blocks: strings, arrays, stacks of threads that made no
        // host call): the arena's allocator resizes it, in place where it can.
        if luasnap_has_light(ptr, osize) == 0 {
            return lua_alloc(ud, ptr, osize, nsize);
        }
        let n = lua_alloc(ud, std::ptr::null_mut(), 0, nsize);
        if n.is_null() {
            // Out of memory: growing fails as Lua expects; shrinking must not fail, so it
            // happens in place (the arena's allocator shrinks without moving), tail scrubbed.
            if nsize < osize {
                luasnap_scrub_light(ptr.cast::<u8>().add(nsize).cast(), osize - nsize);
            }
            return lua_alloc(ud, ptr, osize, nsize);
        }
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), n.cast::<u8>(), osize.min(nsize));
        luasnap_scrub_light(ptr, osize);
        lua_alloc(ud, ptr, osize, 0);
        n
    }
}

/// Settles a coroutine that has just stopped running (yielded, returned or failed): zeroes its
/// dead stack slots and resets its C-call counter, as `coroutine.resume` does here.
///
/// # Safety
/// `co` is a thread of a VM built by this crate that is not running.
pub(crate) unsafe fn settle_thread(co: *mut lua_State) {
    // SAFETY: an idle thread (caller's contract): every slot above its top is dead.
    unsafe { luasnap_settle_thread(co) };
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
