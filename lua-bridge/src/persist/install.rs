//! What the save-game layer adds to every VM: the permanents tables (the standard library as
//! loaded, by name) and the `eris` module, installed when the VM is built, and each native
//! recorded as a permanent when it is registered. The bridge knows nothing of save-games: it
//! runs the `Extension` that [`Vm::builder`] gives every builder.

use super::options::DEFAULT_OWN_HEAP_GROWTH;
use super::permanents::{add_permanent, key_name, CTORS_KEY, PCALL_K, PERMS_KEY, UNPERMS_KEY};
use super::protected::{eris_constructor, eris_persist, eris_unpersist};
use crate::bridge::error::VmError;
use crate::bridge::helpers::{
    luasnap_cfunction_name, luasnap_light_cfunction, luasnap_name_identity, luasnap_thread_k,
};
use crate::bridge::vm::{Extension, Vm, VmBuilder};
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{CStr, CString};

/// Save-games, as an extension of the bridge's VM.
const SAVE_GAMES: Extension = Extension {
    install,
    native_added: add_permanent,
};

impl Vm {
    /// Starts building a VM. (Defined by the save-game layer: every VM carries save-games, and
    /// the bridge, below it, builds them through an `Extension`.)
    pub fn builder() -> VmBuilder {
        VmBuilder::bare().extension(SAVE_GAMES)
    }
}

const ERIS_PRELUDE: &str = r##"
local raw_persist, raw_unpersist, raw_constructor, own_growth = ...
local defaults = { debug = true, maxrec = 10000, path = false, spio = false, spkey = "__persist",
                   trust = "own", maxgrowth = own_growth }
local kinds = { debug = "boolean", maxrec = "number", path = "boolean", spio = "boolean", spkey = "string",
                trust = "string", maxgrowth = "number" }
local settings = {}
for k, v in pairs(defaults) do settings[k] = v end
local select, type, error, tostring = select, type, error, tostring
local eris = {}
-- eris.settings(name) reads a setting; eris.settings(name, value) sets it (nil: the default).
-- 'maxrec' is kept for compatibility: persisting is not recursive, there is no depth limit.
-- 'spio' is accepted and ignored: special persistence functions get no I/O object.
-- 'trust' ("own" or "foreign") is who wrote the files eris.unpersist loads (see
-- docs/save-games.md); 'maxgrowth' caps how many bytes the heap may grow during a load.
function eris.settings(name, ...)
  local kind = kinds[name]
  if not kind then error("bad argument #1 to 'settings' (unknown setting '" .. tostring(name) .. "')", 2) end
  if select("#", ...) == 0 then return settings[name] end
  local v = ...
  if v == nil then v = defaults[name]
  elseif type(v) ~= kind then
    error("bad argument #2 to 'settings' (" .. kind .. " expected, got " .. type(v) .. ")", 2)
  elseif name == "trust" and v ~= "own" and v ~= "foreign" then
    error("bad argument #2 to 'settings' (\"own\" or \"foreign\" expected)", 2)
  elseif name == "maxgrowth" and not (v >= 0) then
    error("bad argument #2 to 'settings' (a number of bytes expected)", 2)
  end
  settings[name] = v
end
function eris.persist(...)
  local n = select("#", ...)
  if n == 0 then error("bad argument #1 to 'persist' (value expected)", 2) end
  local perms, value
  if n >= 2 then perms, value = ... else value = ... end
  if perms ~= nil and type(perms) ~= "table" then
    error("bad argument #1 to 'persist' (table expected, got " .. type(perms) .. ")", 2)
  end
  return raw_persist(perms, value, settings.path, settings.debug, settings.spkey)
end
function eris.unpersist(...)
  local n = select("#", ...)
  local perms, data
  if n >= 2 then perms, data = ... else data = ... end
  if type(data) ~= "string" then
    error("bad argument #" .. (n >= 2 and 2 or 1) .. " to 'unpersist' (string expected, got " .. type(data) .. ")", 2)
  end
  if perms ~= nil and type(perms) ~= "table" then
    error("bad argument #1 to 'unpersist' (table expected, got " .. type(perms) .. ")", 2)
  end
  return raw_unpersist(perms, data, settings.spkey, settings.trust == "foreign", settings.maxgrowth)
end
-- eris.constructor(f): foreign saves may call f (and closures of the functions defined
-- inside it) at load time, as a __persist rebuild, create or init function.
function eris.constructor(f)
  if type(f) ~= "function" then
    error("bad argument #1 to 'constructor' (function expected, got " .. type(f) .. ")", 2)
  end
  raw_constructor(f)
  return f
end
eris.FORMAT = "luasnap"
return eris
"##;

/// Creates the `eris` module and the permanents tables: the standard library as loaded now,
/// plus the continuation and helper C functions Lua hands out without naming them.
fn install(vm: &mut Vm) -> Result<(), VmError> {
    super::budget::register(vm)?;
    vm.run(
        &mut |L| {
            // SAFETY: protected body; each step balances its pushes.
            unsafe {
                create_eris(L);
                ffi::lua_createtable(L, 0, 256);
                ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, PERMS_KEY.as_ptr());
                ffi::lua_createtable(L, 0, 256);
                ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
                ffi::lua_createtable(L, 0, 0);
                ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, CTORS_KEY.as_ptr());
                add_globals(L);
                add_pcall_continuation(L);
                add_unnamed_functions(L);
                name_main_thread(L);
            }
            0
        },
        |_, _| (),
    )
}

/// `eris = (prelude)(raw_persist, raw_unpersist, raw_constructor, own_growth)`, also at
/// `package.loaded.eris`.
///
/// # Safety
/// Protected context with an empty stack; leaves it empty.
unsafe fn create_eris(L: *mut lua_State) {
    // SAFETY: protected context (caller's contract); balanced pushes.
    unsafe {
        let st = ffi::luaL_loadbufferx(
            L,
            ERIS_PRELUDE.as_ptr().cast(),
            ERIS_PRELUDE.len(),
            c"=luasnap.eris".as_ptr(),
            c"t".as_ptr(),
        );
        if st != ffi::LUA_OK {
            ffi::lua_error(L);
        }
        ffi::lua_pushcclosure(L, eris_persist, 0);
        ffi::lua_pushcclosure(L, eris_unpersist, 0);
        ffi::lua_pushcclosure(L, eris_constructor, 0);
        ffi::lua_pushnumber(L, DEFAULT_OWN_HEAP_GROWTH as f64);
        ffi::lua_callk(L, 4, 1, 0, None);
        ffi::lua_setglobal(L, c"eris".as_ptr());
        if ffi::lua_getglobal(L, c"package".as_ptr()) == ffi::LUA_TTABLE {
            ffi::lua_getfield(L, -1, c"loaded".as_ptr());
            ffi::lua_getglobal(L, c"eris".as_ptr());
            ffi::lua_setfield(L, -2, c"eris".as_ptr());
        }
        ffi::lua_settop(L, 0);
    }
}

/// Makes `_G` and every function and library table in it, one level deep, permanents under
/// their names (`string`, `string.format`).
///
/// # Safety
/// Protected context with an empty stack, the permanents tables created; leaves it empty.
unsafe fn add_globals(L: *mut lua_State) {
    // SAFETY: protected context (caller's contract); lua_next walks a table it does not
    // change (add_permanent writes the permanents tables only); balanced pushes.
    unsafe {
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        let g = ffi::lua_gettop(L);
        // Their light C functions get their identities as keys first: the permanents tables
        // are keyed by them, and a key keeps the position it was put at.
        name_library_cfunctions(L, g);
        ffi::lua_pushvalue(L, g);
        add_permanent(L, c"_G");
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, g) != 0 {
            let t = ffi::lua_type(L, -1);
            if let Some(name) = key_name(L, -2) {
                if t == ffi::LUA_TTABLE && name != "_G" {
                    add_library(L, &name);
                }
                if matches!(t, ffi::LUA_TFUNCTION | ffi::LUA_TTABLE) {
                    let cname = CString::new(name).expect("names have no NUL");
                    ffi::lua_pushvalue(L, -1);
                    add_permanent(L, &cname);
                }
            }
            ffi::lua_settop(L, -2);
        }
        ffi::lua_settop(L, 0);
    }
}

/// Makes the functions and tables of the library table on top permanents under
/// `library.name`.
///
/// # Safety
/// Protected context, a table on top (left there).
unsafe fn add_library(L: *mut lua_State, library: &str) {
    // SAFETY: protected context (caller's contract); lua_next walks a table it does not
    // change; balanced pushes.
    unsafe {
        let lib = ffi::lua_gettop(L);
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, lib) != 0 {
            if let Some(fname) = key_name(L, -2) {
                if matches!(ffi::lua_type(L, -1), ffi::LUA_TFUNCTION | ffi::LUA_TTABLE) {
                    let full =
                        CString::new(format!("{library}.{fname}")).expect("names have no NUL");
                    ffi::lua_pushvalue(L, -1);
                    add_permanent(L, &full);
                }
            }
            ffi::lua_settop(L, -2);
        }
    }
}

/// pcall/xpcall's continuation, found in a coroutine suspended inside pcall: it is the one
/// continuation a suspended coroutine commonly holds.
///
/// # Safety
/// Protected context with an empty stack; leaves it empty.
unsafe fn add_pcall_continuation(L: *mut lua_State) {
    let probe = b"local co = coroutine.create(function() pcall(coroutine.yield) end) coroutine.resume(co) return co";
    // SAFETY: protected context (caller's contract); the probe runs protected; the coroutine
    // stays on the stack (alive) while its frames are read.
    unsafe {
        if ffi::luaL_loadbufferx(
            L,
            probe.as_ptr().cast(),
            probe.len(),
            c"=probe".as_ptr(),
            c"t".as_ptr(),
        ) == ffi::LUA_OK
            && ffi::lua_pcallk(L, 0, 1, 0, 0, None) == ffi::LUA_OK
            && ffi::lua_type(L, -1) == ffi::LUA_TTHREAD
        {
            let co = ffi::lua_tothread(L, -1);
            for level in 0..3 {
                let k = luasnap_thread_k(co, level);
                if !k.is_null() {
                    ffi::lua_pushlightuserdata(L, k.cast_mut());
                    add_permanent(L, PCALL_K);
                    break;
                }
            }
        }
        ffi::lua_settop(L, 0);
    }
}

/// C functions the standard library hands out without naming them (iterators, a wrapped
/// coroutine's function), as permanents under made-up names.
///
/// # Safety
/// Protected context with an empty stack; leaves it empty.
unsafe fn add_unnamed_functions(L: *mut lua_State) {
    let aux: [(&CStr, &[u8]); 5] = [
        (
            c"coroutine.wrap#aux",
            b"return coroutine.wrap(function() end)",
        ),
        (c"string.gmatch#aux", b"return ('').gmatch('', '')"),
        (c"ipairs#aux", b"return (ipairs({}))"),
        // utf8.codes's iterators (strict and lax): plain C functions that check their
        // arguments, so a loop suspended in a coroutine persists.
        (c"utf8.codes#aux", b"return (utf8.codes(''))"),
        (c"utf8.codes#auxlax", b"return (utf8.codes('', true))"),
    ];
    for (name, src) in aux {
        // SAFETY: protected context (caller's contract); each probe runs protected and the
        // stack is emptied after it.
        unsafe {
            if ffi::luaL_loadbufferx(
                L,
                src.as_ptr().cast(),
                src.len(),
                c"=aux".as_ptr(),
                c"t".as_ptr(),
            ) == ffi::LUA_OK
                && ffi::lua_pcallk(L, 0, 1, 0, 0, None) == ffi::LUA_OK
            {
                if let Some(f) = ffi::lua_tocfunction(L, -1) {
                    ffi::lua_pushcclosure(L, f, 0);
                    name_cfunction(f, name);
                    add_permanent(L, name);
                }
            }
            ffi::lua_settop(L, 0);
        }
    }
}

/// Gives the main thread an identity as a key from a name, as the permanents have (a save
/// writes it by name, `Tag::MainThread`, and a table keyed by it is laid out by its identity).
///
/// # Safety
/// Protected context, stack room for one value.
unsafe fn name_main_thread(L: *mut lua_State) {
    const NAME: &[u8] = b"#main thread";
    // SAFETY: pushes the registry's main thread, sets a field of it, pops it.
    unsafe {
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_MAINTHREAD);
        luasnap_name_identity(L, -1, NAME.as_ptr().cast(), NAME.len());
        ffi::lua_settop(L, -2);
    }
}

/// Gives each light C function of the library (in `_G` at the absolute index `g` and in the
/// tables in it, one level deep, as `install` names them) its identity as a table key, which
/// is the same in every process (csrc/cfids.c). A function with several names gets its least
/// name, so the choice does not depend on the order of the walk (the hash seed's).
/// Allocates nothing in Lua, so the VM's build is unchanged.
///
/// # Safety
/// `g` is the absolute index of a table; stack room for 4 values.
unsafe fn name_library_cfunctions(L: *mut ffi::lua_State, g: std::ffi::c_int) {
    let mut found: Vec<(usize, CString, ffi::lua_CFunction)> = Vec::new();
    let mut note = |L: *mut ffi::lua_State, name: String| {
        // SAFETY: a value on top (the walks below).
        if let Some(f) = unsafe { luasnap_light_cfunction(L, -1) } {
            let name = CString::new(name).expect("names have no NUL");
            found.push((f as usize, name, f));
        }
    };
    // SAFETY: raw walks of tables with lua_next, which neither allocates nor raises for keys
    // taken from the table; balanced pushes.
    unsafe {
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, g) != 0 {
            if let Some(name) = key_name(L, -2) {
                if ffi::lua_type(L, -1) == ffi::LUA_TTABLE && name != "_G" {
                    let lib = ffi::lua_gettop(L);
                    ffi::lua_pushnil(L);
                    while ffi::lua_next(L, lib) != 0 {
                        if let Some(fname) = key_name(L, -2) {
                            note(L, format!("{name}.{fname}"));
                        }
                        ffi::lua_settop(L, -2);
                    }
                }
                note(L, name);
            }
            ffi::lua_settop(L, -2);
        }
    }
    found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    found.dedup_by_key(|e| e.0);
    for (_, name, f) in found {
        name_cfunction(f, &name);
    }
}

/// Makes `name` the identity of the light C function `f` as a table key (if it has none).
fn name_cfunction(f: ffi::lua_CFunction, name: &CStr) {
    let bytes = name.to_bytes();
    // SAFETY: a name of `bytes.len()` bytes; the map keeps only its hash.
    unsafe { luasnap_cfunction_name(f, bytes.as_ptr().cast(), bytes.len()) };
}
