//! `math.random`'s generator state in save-games.
//!
//! The state (Lua 5.5: xoshiro256**, four 64-bit words) lives in a full userdata that is the
//! first upvalue of `math.random` and `math.randomseed`. Both are permanents in save-games
//! (saved by name, never by value), so the state would not travel: a game seeded in `G.init`
//! continued differently after a load. So:
//! - at build, the userdata is anchored at `registry["luasnap.random"]` (whatever the game does
//!   to `math.random` later) and a holder table `package.loaded["luasnap.random_state"]` is
//!   created, which the whole-game save root includes;
//! - [`Vm::save_game`](crate::Vm::save_game) first copies the state's words into the holder
//!   (integer fields 1..=4 of an existing table: no allocation);
//! - [`Vm::load_game`](crate::Vm::load_game) copies the loaded holder's words back into the
//!   generator. A save without a holder (written before this existed) leaves the generator as
//!   it is.

use mlua_sys::{self as ffi, lua_State};

const HOLDER: &std::ffi::CStr = c"luasnap.random_state";
const ANCHOR: &std::ffi::CStr = c"luasnap.random";

/// Anchors the generator state and creates the holder, if `math.random` is the library's.
///
/// # Safety
/// Protected context, right after the libraries are opened.
pub(crate) unsafe fn install(L: *mut lua_State) {
    // SAFETY: protected context; balanced pushes.
    unsafe {
        let top = ffi::lua_gettop(L);
        if ffi::lua_getglobal(L, c"math".as_ptr()) == ffi::LUA_TTABLE
            && ffi::lua_getfield(L, -1, c"random".as_ptr()) == ffi::LUA_TFUNCTION
            && ffi::lua_iscfunction(L, -1) != 0
            && !ffi::lua_getupvalue(L, -1, 1).is_null()
            && ffi::lua_type(L, -1) == ffi::LUA_TUSERDATA
        {
            ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, ANCHOR.as_ptr());
            ffi::luaL_getsubtable(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr());
            ffi::lua_createtable(L, 4, 0);
            for i in 1..=4 {
                ffi::lua_pushinteger(L, 0);
                ffi::lua_rawseti(L, -2, i);
            }
            ffi::lua_setfield(L, -2, HOLDER.as_ptr());
        }
        ffi::lua_settop(L, top);
    }
}

/// The generator's state words, read from the anchored userdata (None without one).
///
/// # Safety
/// Valid state; reads only (pushes and pops one value).
unsafe fn state_words(L: *mut lua_State) -> Option<*mut [u8; 32]> {
    // SAFETY: reads a registry field; the userdata stays anchored after the pop.
    unsafe {
        let t = ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, ANCHOR.as_ptr());
        let p = ffi::lua_touserdata(L, -1);
        let len = ffi::lua_rawlen(L, -1);
        ffi::lua_settop(L, -2);
        (t == ffi::LUA_TUSERDATA && !p.is_null() && len == 32).then_some(p.cast())
    }
}

/// Copies `math.random`'s state into the holder the save root includes.
///
/// # Safety
/// Protected context (a body run by `Vm::run`); writes integer fields of an existing table.
pub(crate) unsafe fn stage(L: *mut lua_State) {
    // SAFETY: protected context (caller's contract); writes integer fields of an existing
    // table.
    unsafe {
        let Some(words) = state_words(L) else {
            return;
        };
        let words = *words;
        ffi::luaL_getsubtable(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr());
        if ffi::lua_getfield(L, -1, HOLDER.as_ptr()) == ffi::LUA_TTABLE {
            for (i, w) in words.chunks_exact(8).enumerate() {
                let v = i64::from_le_bytes(w.try_into().expect("8 bytes"));
                ffi::lua_pushinteger(L, v);
                ffi::lua_rawseti(L, -2, i as ffi::lua_Integer + 1);
            }
        }
    }
}

/// After a load: copies the loaded holder's words into `math.random`'s state. A holder that
/// is missing or malformed leaves the state as it is. Then a fresh holder (the state's words)
/// replaces the loaded one: that one is whatever table the file put there (a game table, or
/// a permanent such as `string`), and [`stage`] writes into the holder. Where the loaded
/// `package.loaded` has no holder (the game removed it, so the saving VM had none either),
/// none is added: an entry added there would be one a straight run lacks, which a suspended
/// `pairs()` loop over `package.loaded` would meet (`tests/attack11.rs`).
///
/// # Safety
/// Protected context (a body run by `Vm::run`).
pub(crate) unsafe fn unstage(L: *mut lua_State) {
    // SAFETY: protected context (caller's contract); reads integers, writes 32 bytes of the
    // anchored userdata (exactly its size, checked by `state_words`); balanced pushes.
    unsafe {
        let Some(words) = state_words(L) else {
            return;
        };
        ffi::luaL_getsubtable(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr());
        let loaded = ffi::lua_gettop(L);
        ffi::lua_pushstring(L, HOLDER.as_ptr());
        match ffi::lua_rawget(L, loaded) {
            ffi::LUA_TNIL => {
                ffi::lua_settop(L, loaded - 1);
                return;
            }
            ffi::LUA_TTABLE => {
                if let Some(out) = holder_words(L) {
                    *words = out;
                }
            }
            _ => {}
        }
        ffi::lua_settop(L, loaded);
        ffi::lua_createtable(L, 4, 0);
        for (i, w) in (*words).chunks_exact(8).enumerate() {
            let v = i64::from_le_bytes(w.try_into().expect("8 bytes"));
            ffi::lua_pushinteger(L, v);
            ffi::lua_rawseti(L, -2, i as ffi::lua_Integer + 1);
        }
        ffi::lua_pushstring(L, HOLDER.as_ptr());
        ffi::lua_rotate(L, -2, 1);
        ffi::lua_rawset(L, loaded);
        ffi::lua_settop(L, loaded - 1);
    }
}

/// The four integers of the holder on top, as the state's bytes (None if it does not hold
/// them).
///
/// # Safety
/// A table on top and a free slot; leaves the stack as it was.
unsafe fn holder_words(L: *mut lua_State) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    for i in 0..4 {
        // SAFETY: raw reads of the table on top (callers' contract), each popped.
        unsafe {
            let t = ffi::lua_rawgeti(L, -1, i as ffi::lua_Integer + 1);
            let int = ffi::lua_isinteger(L, -1) != 0;
            let v = ffi::lua_tointegerx(L, -1, std::ptr::null_mut());
            ffi::lua_settop(L, -2);
            if t != ffi::LUA_TNUMBER || !int {
                return None;
            }
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    Some(out)
}
