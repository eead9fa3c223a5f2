//! The permanents: values saved by name (the standard library as loaded, natives,
//! constructors), the registry tables that hold them, and the names the loader treats
//! specially.

use crate::bridge::helpers::luasnap_name_identity;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, CStr};

/// Registry key: value -> name, the permanents used when persisting.
pub(crate) const PERMS_KEY: &CStr = c"luasnap.perms";
/// Registry key: name -> value, the permanents used when loading.
pub(crate) const UNPERMS_KEY: &CStr = c"luasnap.unperms";

/// Registry key: the constructors foreign loads may call (function -> true; a Lua function's
/// prototype and those nested in it, as light userdata -> the function, which anchors them).
pub(crate) const CTORS_KEY: &CStr = c"luasnap.ctors";
/// The name of `coroutine.wrap`'s helper among the permanents: its closures (one upvalue, a
/// coroutine) are the only C closures with upvalues a load rebuilds.
pub(crate) const WRAP_AUX: &CStr = c"coroutine.wrap#aux";
/// The name of `string.gmatch`'s helper: its closures keep a match state with raw pointers,
/// so they are never saved or loaded.
pub(crate) const GMATCH_AUX: &CStr = c"string.gmatch#aux";

/// The name of pcall/xpcall's continuation among the permanents.
pub(crate) const PCALL_K: &CStr = c"pcall#k";
/// The permanents that are continuations (C functions a suspended coroutine's C frame resumes
/// through). A loaded frame may only name one of these, looked up in the VM's own permanents.
pub(crate) const CONTINUATIONS: [&CStr; 1] = [PCALL_K];

/// Pushes a stand-in's metatable: a new table whose `__name` is `name`.
///
/// # Safety
/// Protected context (may raise a memory error), two free slots.
pub(crate) unsafe fn push_stand_in_metatable(L: *mut lua_State, name: &[u8]) {
    // SAFETY: callers' contract: [] -> [mt].
    unsafe {
        ffi::lua_createtable(L, 0, 1);
        ffi::lua_pushlstring(L, name.as_ptr().cast(), name.len());
        ffi::lua_setfield(L, -2, c"__name".as_ptr());
    }
}

/// Records the value on top (popped) as a permanent under `name`.
///
/// # Safety
/// Protected context (may allocate).
pub(crate) unsafe fn add_permanent(L: *mut lua_State, name: &CStr) {
    // SAFETY: protected context; the two registry tables exist once `install` ran (it runs
    // when the libraries open, before any native is registered).
    unsafe {
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, PERMS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -3);
            return;
        }
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
        // [v, perms, unperms]
        ffi::lua_pushvalue(L, -3);
        ffi::lua_rawget(L, -3);
        let known = ffi::lua_type(L, -1) != ffi::LUA_TNIL;
        ffi::lua_settop(L, -2);
        if !known {
            // An object's identity as a key comes from its name (unless it has one already):
            // the same in every VM, whatever each registered before, so a table a save keys by
            // a permanent is laid out alike where it loads (csrc/ident.c); and keying the
            // permanents table by it below takes no number of the VM's counter.
            let bytes = name.to_bytes();
            luasnap_name_identity(L, -3, bytes.as_ptr().cast(), bytes.len());
            ffi::lua_pushvalue(L, -3);
            ffi::lua_pushstring(L, name.as_ptr());
            ffi::lua_rawset(L, -4);
            ffi::lua_pushstring(L, name.as_ptr());
            ffi::lua_pushvalue(L, -4);
            ffi::lua_rawset(L, -3);
        }
        ffi::lua_settop(L, -4);
    }
}

/// The string at `idx` if it is one and valid UTF-8 (no conversion).
///
/// # Safety
/// `idx` is a valid index of `L`.
pub(crate) unsafe fn key_name(L: *mut lua_State, idx: c_int) -> Option<String> {
    // SAFETY: reads a string key without conversion.
    unsafe {
        if ffi::lua_type(L, idx) != ffi::LUA_TSTRING {
            return None;
        }
        let mut len = 0;
        let p = ffi::lua_tolstring(L, idx, &mut len);
        std::str::from_utf8(std::slice::from_raw_parts(p.cast::<u8>(), len))
            .ok()
            .map(str::to_string)
    }
}

/// Whether the value at absolute index `idx` is one of the VM's permanents (the standard
/// library's tables and functions, registered ones): those belong to the loading VM, and a
/// save names them only as values.
///
/// # Safety
/// Protected context; `idx` an absolute index.
pub(crate) unsafe fn is_permanent(L: *mut lua_State, idx: c_int) -> bool {
    // SAFETY: raw reads of a registry table; balanced pushes.
    unsafe {
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, PERMS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -2);
            return false;
        }
        ffi::lua_pushvalue(L, idx);
        let known = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
        ffi::lua_settop(L, -3);
        known
    }
}
