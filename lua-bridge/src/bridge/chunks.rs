//! The chunk registry (`csrc/chunks.c`): every chunk the VM compiles from `load`, `loadfile`,
//! `dofile`, `require`'s Lua searcher or [`Vm::exec`](crate::Vm::exec) is recorded with its
//! source text, deduplicated by comparing the chunks, and collected with its last function.
//!
//! Chunks the host runs with [`Vm::exec`](crate::Vm::exec) are kept for the VM's life (once
//! per distinct chunk): saves name the game's functions even after the game dropped them.
//! Chunks compiled from Lua are collected with their last function, as in stock Lua.
//!
//! Each prototype of a chunk holds the chunk's record as a hidden trailing constant, so the
//! record lives exactly as long as some function of the chunk; `registry["luasnap.chunks"]`
//! (fingerprint -> record, weak values) only finds records. The loaders stay C functions with
//! the stock behaviour (hooks, `debug.getinfo`, messages and tracebacks as in `lua`), and
//! `string.dump` writes a function as if no record were attached.

use crate::bridge::error::{LuaErrorKind, VmError};
use crate::bridge::helpers::{luasnap_chunk_keep, luasnap_loadstring};
use mlua_sys::lua_State;
use std::ffi::{c_int, CString};

/// A host chunk's name as Lua takes it: `@file` and `=name` as given, any other name as
/// `=name`; a name with a NUL is a [`VmError::BadName`].
pub(crate) fn host_chunk_name(name: &str) -> Result<CString, VmError> {
    CString::new(if name.starts_with(['=', '@']) {
        name.to_string()
    } else {
        format!("={name}")
    })
    .map_err(|_| VmError::BadName { name: name.into() })
}

/// The outcome of a protected call that raised the message of a chunk that did not compile
/// (`syntax_error`: [`load_host_chunk`] said `LUA_ERRSYNTAX`) as the syntax error it is.
pub(crate) fn as_syntax_error<T>(
    outcome: Result<T, VmError>,
    syntax_error: bool,
) -> Result<T, VmError> {
    match outcome {
        Err(VmError::Lua {
            kind: LuaErrorKind::Runtime,
            message,
            traceback,
            value,
        }) if syntax_error => Err(VmError::Lua {
            kind: LuaErrorKind::Syntax,
            message,
            traceback,
            value,
        }),
        r => r,
    }
}

/// Compiles `source` as a text chunk named `chunkname` through the registry (so saves can carry
/// its text) and, if it compiled, keeps it for the VM's life as the host's own code. Leaves the
/// main function, or the error message, on top and returns `lua_load`'s status.
///
/// # Safety
/// Protected context (may raise a memory error) on a VM built by this crate, with a free slot.
pub(crate) unsafe fn load_host_chunk(
    L: *mut lua_State,
    source: &[u8],
    chunkname: &std::ffi::CStr,
) -> c_int {
    use mlua_sys as ffi;
    // SAFETY: callers' contract; the source string stays on the stack while it is compiled,
    // then is removed from under the result.
    unsafe {
        ffi::lua_pushlstring(L, source.as_ptr().cast(), source.len());
        let st = luasnap_loadstring(L, -1, chunkname.as_ptr(), c"t".as_ptr());
        ffi::lua_rotate(L, -2, 1);
        ffi::lua_settop(L, -2);
        if st == ffi::LUA_OK {
            luasnap_chunk_keep(L, -1);
        }
        st
    }
}
