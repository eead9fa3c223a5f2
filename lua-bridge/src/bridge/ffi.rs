//! The FFI layer: values across the C API boundary, protected calls from the host, and the
//! stack helpers the rest of the bridge builds on.
//!
//! # Rules that keep rollback and `longjmp` safe
//!
//! 1. **Nothing outside the arena refers into it in a way that changes.** The only Rust data
//!    Lua can reach is the per-VM state its callbacks find by the arena's base address
//!    (`per_vm.rs`): the natives (append-only, closed at the first snapshot), staging buffers
//!    that are empty whenever Lua is idle, and the counters of the budget hooks.
//! 2. **Lua errors are `longjmp`s.** Lua raises them from any API call that allocates. A Rust
//!    frame that a `longjmp` skips must have no value with a destructor alive (it must be a
//!    "plain old frame"). So natives never call the Lua API themselves:
//!    [`Call`](crate::Call) reads arguments with calls that cannot raise, and results and
//!    error messages are staged (`natives.rs`) and pushed by the trampoline after the
//!    native's frames are gone.
//! 3. **Panics never cross C frames.** The trampoline and the protected-call shim catch them
//!    and turn them into Lua errors.
//! 4. **Every entry from the host is protected** (`lua_pcall`), so an error never reaches Lua's
//!    panic function.

use crate::bridge::error::LuaErrorKind;
use crate::bridge::helpers::{luasnap_reset_strcache, luasnap_scrub_idle_state};
use crate::bridge::value::{Table, UserDataValue, Value};
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Deepest table nesting converted between Lua and Rust.
pub(crate) const MAX_DEPTH: usize = 100;

/// A registered plain-data userdata type.
pub(crate) struct UserDataType {
    pub name: &'static str,
    pub size: usize,
    /// Identity of its metatable (`lua_topointer`). Metatables are created before the first
    /// snapshot and never collected, and Lua's collector never moves objects, so this stays
    /// valid across every rollback.
    pub metatable: *const c_void,
}

/// Sets the `n` slots above the top to nil with zeroed payloads. A dead stack slot keeps its
/// payload when only its type tag is set to nil, and the payload is arena bytes: a Rust stack
/// address, or whichever object a handle held, would make the arena depend on things other
/// than Lua's state.
///
/// # Safety
/// The `n` slots above the top exist (they were in use, or were checked). Does not raise.
pub(crate) unsafe fn scrub_above_top(L: *mut lua_State, n: c_int) {
    // SAFETY: callers' contract; pushing integers and nils does not allocate.
    unsafe {
        let top = ffi::lua_gettop(L);
        for _ in 0..n {
            ffi::lua_pushinteger(L, 0);
        }
        ffi::lua_settop(L, top);
        for _ in 0..n {
            ffi::lua_pushnil(L);
        }
        ffi::lua_settop(L, top);
    }
}

/// Whether the value at `idx` is a function or has a `__call` metamethod. Does not raise.
///
/// # Safety
/// Valid state and index, two free stack slots.
pub(crate) unsafe fn is_callable(L: *mut lua_State, idx: c_int) -> bool {
    // SAFETY: raw reads; pops what it pushes.
    unsafe {
        if ffi::lua_type(L, idx) == ffi::LUA_TFUNCTION {
            return true;
        }
        if ffi::lua_getmetatable(L, idx) == 0 {
            return false;
        }
        ffi::lua_pushstring(L, c"__call".as_ptr());
        ffi::lua_rawget(L, -2);
        let yes = ffi::lua_type(L, -1) == ffi::LUA_TFUNCTION;
        ffi::lua_settop(L, -3);
        yes
    }
}

/// Pointer to the payload of the userdata at `idx` if its metatable is the one registered
/// for `name` and its size is `size`.
pub(crate) unsafe fn userdata_ptr(
    L: *mut lua_State,
    idx: c_int,
    types: &[UserDataType],
    name: &str,
    size: usize,
) -> Option<*mut c_void> {
    let ty = types.iter().find(|t| t.name == name)?;
    // SAFETY: valid stack index; lua_getmetatable pushes at most one value (a C function has
    // LUA_MINSTACK free slots) and raises nothing.
    unsafe {
        if ffi::lua_type(L, idx) != ffi::LUA_TUSERDATA || ffi::lua_rawlen(L, idx) as usize != size {
            return None;
        }
        if ffi::lua_getmetatable(L, idx) == 0 {
            return None;
        }
        let mt = ffi::lua_topointer(L, -1);
        ffi::lua_settop(L, -2);
        (mt == ty.metatable).then(|| ffi::lua_touserdata(L, idx))
    }
}

// ----- values -----

/// Pushes `args` and calls the function below them with `LUA_MULTRET`; returns the new top.
///
/// # Safety
/// A valid state in a protected body, the function on top. May raise (the call's errors and
/// memory errors), so only plain frames may be live, as for [`push_value`].
pub(crate) unsafe fn call_with(L: *mut lua_State, args: &[Value], types: &[UserDataType]) -> c_int {
    // SAFETY: callers' contract; the stack is grown before the arguments are pushed.
    unsafe {
        ffi::luaL_checkstack(L, args.len() as c_int + 1, c"too many arguments".as_ptr());
        for a in args {
            push_value(L, a, types, 0);
        }
        ffi::lua_callk(L, args.len() as c_int, ffi::LUA_MULTRET, 0, None);
        ffi::lua_gettop(L)
    }
}

/// Pushes a Rust value. May raise a memory error (only call where a `longjmp` skips nothing
/// but plain old frames: inside the trampoline or a protected closure).
pub(crate) unsafe fn push_value(
    L: *mut lua_State,
    v: &Value,
    types: &[UserDataType],
    depth: usize,
) {
    // SAFETY: callers guarantee a valid state with room for a few values; every call below
    // follows the Lua API contract.
    unsafe {
        match v {
            Value::Nil => ffi::lua_pushnil(L),
            Value::Boolean(b) => ffi::lua_pushboolean(L, *b as c_int),
            Value::Integer(i) => ffi::lua_pushinteger(L, *i),
            Value::Number(n) => ffi::lua_pushnumber(L, *n),
            Value::String(s) => {
                ffi::lua_pushlstring(L, s.as_ptr().cast(), s.len());
            }
            Value::Table(t) => {
                if depth >= MAX_DEPTH {
                    push_error_str(L, "table nested too deeply to convert");
                }
                ffi::luaL_checkstack(L, 3, c"nested table".as_ptr());
                ffi::lua_createtable(L, 0, t.entries.len() as c_int);
                for (k, val) in &t.entries {
                    if matches!(k, Value::Nil) || matches!(k, Value::Number(f) if f.is_nan()) {
                        push_error_str(L, "table key is nil or NaN");
                    }
                    push_value(L, k, types, depth + 1);
                    push_value(L, val, types, depth + 1);
                    ffi::lua_rawset(L, -3);
                }
            }
            Value::UserData(u) => push_userdata(L, u, types),
            Value::Opaque(t) => {
                // Lua builds the message from the static type name: no Rust value with a
                // destructor is alive when it raises.
                ffi::lua_pushstring(L, c"a ".as_ptr());
                ffi::lua_pushlstring(L, t.as_ptr().cast(), t.len());
                ffi::lua_pushstring(
                    L,
                    c" value copied out of Lua cannot be passed back".as_ptr(),
                );
                ffi::lua_concat(L, 3);
                ffi::lua_error(L);
            }
        }
    }
}

unsafe fn push_error_str(L: *mut lua_State, msg: &'static str) -> ! {
    // SAFETY: a static message; raising skips only plain old frames (callers' contract).
    unsafe {
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_error(L)
    }
}

unsafe fn push_userdata(L: *mut lua_State, u: &UserDataValue, types: &[UserDataType]) {
    let Some(ty) = types.iter().find(|t| t.name == u.type_name) else {
        // SAFETY: raising from a context where only POFs are skipped (callers' contract).
        unsafe { push_error_str(L, "userdata type is not registered in this VM") };
    };
    if ty.size != u.bytes.len() {
        // SAFETY: as above.
        unsafe { push_error_str(L, "userdata value has the wrong size for its type") };
    }
    // SAFETY: allocates a userdata of the type's size (may raise: callers' contract), copies
    // the bytes in, and sets the type's metatable, found in the registry under its name.
    unsafe {
        let p = ffi::lua_newuserdatauv(L, ty.size, 0);
        std::ptr::copy_nonoverlapping(u.bytes.as_ptr(), p.cast::<u8>(), ty.size);
        ffi::lua_pushlightuserdata(L, ty.metatable.cast_mut());
        ffi::lua_rawget(L, ffi::LUA_REGISTRYINDEX);
        ffi::lua_setmetatable(L, -2);
    }
}

/// Copies the value at `idx` into Rust. Uses only API calls that cannot raise.
///
/// # Safety
/// `L` is a valid state of a VM built by this crate, `idx` a valid index in it, and `types`
/// that VM's registered userdata types.
pub(crate) unsafe fn to_value(
    L: *mut lua_State,
    idx: c_int,
    types: &[UserDataType],
) -> Result<Value, String> {
    // SAFETY: idx is valid (callers' contract); the conversion below only reads.
    unsafe {
        let idx = ffi::lua_absindex(L, idx);
        let mut c = CopyOut {
            types,
            seen: Vec::new(),
            left: MAX_COPY_VALUES,
        };
        to_value_at(L, idx, &mut c, 0)
    }
}

/// Most Lua values one [`to_value`] copies. A table shared by several others is copied once
/// per reference (a [`Value`] is a tree), so a small graph of shared tables can stand for an
/// exponential number of values: past this, the copy is refused instead of exhausting memory.
pub(crate) const MAX_COPY_VALUES: usize = 1_000_000;

/// The walk's state for [`to_value`]: the VM's userdata types, the tables on the path from
/// the root (cycles), and the values it may still copy.
struct CopyOut<'a> {
    types: &'a [UserDataType],
    seen: Vec<*const c_void>,
    left: usize,
}

/// Copies the value at the absolute index `idx`, `depth` tables below the root.
///
/// # Safety
/// `idx` is a valid absolute index of `L`. Calls only API functions that cannot raise.
unsafe fn to_value_at(
    L: *mut lua_State,
    idx: c_int,
    c: &mut CopyOut<'_>,
    depth: usize,
) -> Result<Value, String> {
    if c.left == 0 {
        return Err(format!("a value of more than {MAX_COPY_VALUES} Lua values (a table shared by others is copied once per reference); return a smaller value, or walk it from Lua"));
    }
    c.left -= 1;
    // SAFETY: idx is an absolute valid index (caller's contract); lua_tolstring is called on
    // actual strings only, so it neither converts nor allocates; the rest only reads.
    unsafe {
        Ok(match ffi::lua_type(L, idx) {
            ffi::LUA_TNIL | ffi::LUA_TNONE => Value::Nil,
            ffi::LUA_TBOOLEAN => Value::Boolean(ffi::lua_toboolean(L, idx) != 0),
            ffi::LUA_TNUMBER => {
                if ffi::lua_isinteger(L, idx) != 0 {
                    Value::Integer(ffi::lua_tointegerx(L, idx, std::ptr::null_mut()))
                } else {
                    Value::Number(ffi::lua_tonumberx(L, idx, std::ptr::null_mut()))
                }
            }
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, idx, &mut len);
                Value::String(std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec())
            }
            ffi::LUA_TTABLE => table_to_value(L, idx, c, depth)?,
            ffi::LUA_TUSERDATA => userdata_to_value(L, idx, c.types),
            ffi::LUA_TFUNCTION => Value::Opaque("function"),
            ffi::LUA_TTHREAD => Value::Opaque("thread"),
            ffi::LUA_TLIGHTUSERDATA => Value::Opaque("light userdata"),
            _ => Value::Opaque("unknown"),
        })
    }
}

/// [`to_value_at`] for the table at `idx`: its entries, copied deeply.
///
/// # Safety
/// As for [`to_value_at`], with a table at `idx`.
unsafe fn table_to_value(
    L: *mut lua_State,
    idx: c_int,
    c: &mut CopyOut<'_>,
    depth: usize,
) -> Result<Value, String> {
    // SAFETY: idx holds a table (caller's contract); lua_checkstack does not raise, and
    // lua_next on a table being traversed with the key it just returned does not either; the
    // stack is put back as it was on every path.
    unsafe {
        let ptr = ffi::lua_topointer(L, idx);
        if depth >= MAX_DEPTH {
            return Err("a table nested more than 100 deep".into());
        }
        if c.seen.contains(&ptr) {
            return Err("a table that contains itself (cycles cannot be copied out)".into());
        }
        if ffi::lua_checkstack(L, 3) == 0 {
            return Err("a table nested too deeply for the Lua stack".into());
        }
        c.seen.push(ptr);
        let mut t = Table::new();
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, idx) != 0 {
            let top = ffi::lua_gettop(L);
            let k = to_value_at(L, top - 1, c, depth + 1);
            let v = to_value_at(L, top, c, depth + 1);
            ffi::lua_settop(L, -2);
            match (k, v) {
                (Ok(k), Ok(v)) => t.entries.push((k, v)),
                (Err(e), _) | (_, Err(e)) => {
                    ffi::lua_settop(L, -2);
                    return Err(e);
                }
            }
        }
        c.seen.pop();
        Ok(Value::Table(t))
    }
}

/// [`to_value_at`] for the full userdata at `idx`: its bytes if it is of a registered type.
///
/// # Safety
/// As for [`to_value_at`], with a full userdata at `idx`.
unsafe fn userdata_to_value(L: *mut lua_State, idx: c_int, types: &[UserDataType]) -> Value {
    // SAFETY: idx holds a full userdata (caller's contract); its payload has lua_rawlen bytes,
    // copied out while it stays on the stack.
    unsafe {
        let size = ffi::lua_rawlen(L, idx) as usize;
        let found = types
            .iter()
            .find(|t| t.size == size && userdata_ptr(L, idx, types, t.name, t.size).is_some());
        match found {
            Some(t) => {
                let p = ffi::lua_touserdata(L, idx).cast::<u8>();
                Value::UserData(UserDataValue {
                    type_name: t.name,
                    bytes: std::slice::from_raw_parts(p, size).to_vec(),
                })
            }
            None => Value::Opaque("userdata"),
        }
    }
}

// ----- protected calls from the host -----

/// Lua's error report: kind, message, traceback, and the error object when it was neither a
/// string nor a number (`error({ code = 7 })`), copied out.
pub(crate) struct LuaFailure {
    pub kind: LuaErrorKind,
    pub message: String,
    pub traceback: Option<String>,
    pub value: Option<Value>,
}

/// Marks the table [`traceback_handler`] wraps a non-string error object in: its key (a light
/// userdata no Lua code can make) holds `true`, `[1]` the object, `[2]` the message with its
/// traceback.
static WRAPPED_ERROR: u8 = 0;

fn wrapped_error_key() -> *const c_void {
    std::ptr::addr_of!(WRAPPED_ERROR).cast()
}

/// The message [`traceback_handler`] gives an error object without a `__tostring`.
const NO_TEXT: &str = "(error object is a ";

/// Message handler of [`Call::call_function`](crate::Call::call_function): a traceback for string messages (dropped
/// later, as for [`traceback_handler`]); any other error value passes through unchanged so
/// the native can raise the value itself.
pub(crate) unsafe extern "C-unwind" fn callback_handler(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua as a message handler with the error object at index 1.
    unsafe {
        if ffi::lua_tolstring(L, 1, std::ptr::null_mut()).is_null() {
            ffi::lua_settop(L, 1);
            1
        } else {
            traceback_handler(L)
        }
    }
}

/// Message handler: appends a traceback to string messages, as the standalone `lua` does.
/// Any other error object (a table, a userdata) is kept whole for the host: the handler
/// returns a table marked with [`wrapped_error_key`] holding the object and its message (its
/// `__tostring`, as `lua` prints it, else a placeholder) with the traceback, and
/// [`protected`] copies the object out.
unsafe extern "C-unwind" fn traceback_handler(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua as a message handler with the error object at index 1. Every call
    // may raise (memory, a failing __tostring): Lua then reports an error in the handler; no
    // Rust value is alive here.
    unsafe {
        let msg = ffi::lua_tolstring(L, 1, std::ptr::null_mut());
        if !msg.is_null() {
            ffi::luaL_traceback(L, L, msg, 1);
            return 1;
        }
        let m = if ffi::luaL_callmeta(L, 1, c"__tostring".as_ptr()) != 0
            && ffi::lua_type(L, -1) == ffi::LUA_TSTRING
        {
            ffi::lua_tolstring(L, -1, std::ptr::null_mut())
        } else {
            let tn = ffi::lua_typename(L, ffi::lua_type(L, 1));
            ffi::lua_pushfstring(L, c"(error object is a %s value)".as_ptr(), tn)
        };
        ffi::luaL_traceback(L, L, m, 1);
        ffi::lua_createtable(L, 2, 1);
        ffi::lua_pushvalue(L, 1);
        ffi::lua_rawseti(L, -2, 1);
        ffi::lua_pushvalue(L, -2);
        ffi::lua_rawseti(L, -2, 2);
        ffi::lua_pushboolean(L, 1);
        ffi::lua_rawsetp(L, -2, wrapped_error_key());
        1
    }
}

/// The error object a failed [`protected`] call left on top of `L`, when
/// [`traceback_handler`] wrapped it: replaces the wrapper by its message (on top, where the
/// caller reads it) and returns the object copied out, or `None` when it was not wrapped or
/// cannot be copied (a table that contains itself: only the message is left then).
///
/// # Safety
/// `L` is the main thread of a VM built by this crate, its error object on top.
unsafe fn unwrap_error(L: *mut lua_State, types: &[UserDataType]) -> Option<Value> {
    // SAFETY: raw reads of the table on top with a light userdata or integer key do not
    // allocate or raise; to_value only reads; the stack keeps LUA_MINSTACK free slots, and
    // the message ends on top in place of the wrapper on every path.
    unsafe {
        if ffi::lua_type(L, -1) != ffi::LUA_TTABLE {
            return None;
        }
        let marked = ffi::lua_rawgetp(L, -1, wrapped_error_key()) == ffi::LUA_TBOOLEAN;
        ffi::lua_settop(L, -2);
        if !marked {
            return None;
        }
        ffi::lua_rawgeti(L, -1, 1);
        let value = to_value(L, -1, types).ok();
        ffi::lua_settop(L, -2);
        ffi::lua_rawgeti(L, -1, 2);
        ffi::lua_rotate(L, -2, 1);
        ffi::lua_settop(L, -2);
        value
    }
}

pub(crate) struct Job<'f> {
    pub body: &'f mut dyn FnMut(*mut lua_State) -> c_int,
    /// A message for a panic caught inside the body.
    pub panic: Option<String>,
}

pub(crate) unsafe extern "C-unwind" fn run_job(L: *mut lua_State) -> c_int {
    // SAFETY: index 1 is the light userdata pointing at the Job on the host's stack frame,
    // which is alive for the whole protected call.
    let job = unsafe { &mut *(ffi::lua_touserdata(L, 1) as *mut Job<'_>) };
    // SAFETY: valid state; removes the light userdata so the body sees an empty stack.
    unsafe { ffi::lua_rotate(L, 1, -1) };
    // SAFETY: as above.
    unsafe { ffi::lua_settop(L, -2) };
    let body = &mut *job.body;
    // If the body raises a Lua error, the longjmp crosses catch_unwind's frames. They hold
    // nothing with a destructor (the closure and result sit in ManuallyDrop), so they are
    // plain old frames; bodies themselves only raise with no destructor pending.
    match catch_unwind(AssertUnwindSafe(|| body(L))) {
        Ok(n) => n,
        Err(panic) => {
            job.panic = Some(
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into()),
            );
            drop(panic);
            // SAFETY: a static message; nothing with a destructor is alive in this frame.
            unsafe { push_error_str(L, "a Rust panic inside a protected call") }
        }
    }
}

/// Runs `body` in protected mode on the main thread with an empty stack. On success the
/// results it returned are left on the stack from index 2 (index 1 is the message handler) and
/// their count is returned; on failure the stack is emptied and the error returned.
///
/// `body` may raise Lua errors, but only while no Rust value with a destructor is alive in its
/// own frame.
///
/// # Safety
/// `L` must be the idle main thread of a VM built by this crate, `types` its userdata types.
pub(crate) unsafe fn protected(
    L: *mut lua_State,
    types: &[UserDataType],
    body: &mut dyn FnMut(*mut lua_State) -> c_int,
) -> Result<c_int, LuaFailure> {
    let mut job = Job { body, panic: None };
    // SAFETY: the stack is ours; these pushes do not allocate (light C functions and light
    // userdata) and the stack always has LUA_MINSTACK free slots.
    let status = unsafe {
        ffi::lua_settop(L, 0);
        ffi::lua_pushcclosure(L, traceback_handler, 0);
        ffi::lua_pushcclosure(L, run_job, 0);
        ffi::lua_pushlightuserdata(L, (&mut job as *mut Job<'_>).cast());
        ffi::lua_pcall(L, 1, ffi::LUA_MULTRET, 1)
    };
    if status == ffi::LUA_OK {
        // SAFETY: valid state.
        return Ok(unsafe { ffi::lua_gettop(L) } - 1);
    }
    // (On success the caller pops the results and clears; here the stack is emptied now.)
    let kind = match status {
        ffi::LUA_ERRSYNTAX => LuaErrorKind::Syntax,
        ffi::LUA_ERRMEM => LuaErrorKind::Memory,
        ffi::LUA_ERRERR => LuaErrorKind::Handler,
        _ => LuaErrorKind::Runtime,
    };
    // SAFETY: the error object is on top (L's contract); unwrap_error leaves a message there.
    let value = unsafe { unwrap_error(L, types) };
    // SAFETY: the error object is on top; reading a string does not allocate.
    let text = unsafe {
        let mut len = 0;
        let p = ffi::lua_tolstring(L, -1, &mut len);
        let t = if p.is_null() {
            "(error object is not a string)".to_string()
        } else {
            String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned()
        };
        finish_host_call(L);
        t
    };
    let (message, traceback) = match text.find("\nstack traceback:") {
        Some(i) => (text[..i].to_string(), Some(text[i + 1..].to_string())),
        None => (text, None),
    };
    let message = match job.panic {
        Some(p) => format!("{message}: {p}"),
        None => message,
    };
    // An object without `__tostring`: its contents say more than the placeholder.
    let message = match &value {
        Some(v) if message.starts_with(NO_TEXT) => crate::bridge::value::error_text(v),
        _ => message,
    };
    Err(LuaFailure {
        kind,
        message,
        traceback,
        value,
    })
}

/// Pushes the value at a dotted path of globals (`"a.b.c"`). May raise (it can run `__index`).
///
/// # Safety
/// Valid state inside a protected body; `path` was validated by
/// [`valid_path`](crate::bridge::path::valid_path).
pub(crate) unsafe fn push_path(L: *mut lua_State, path: &CStr) {
    let bytes = path.to_bytes();
    let mut first = true;
    for part in bytes.split(|&b| b == b'.') {
        // SAFETY: `part` points into `path`'s buffer; lua_pushlstring copies it. Raising skips
        // only this plain old frame.
        unsafe {
            if first {
                ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
                first = false;
            }
            ffi::lua_pushlstring(L, part.as_ptr().cast::<c_char>(), part.len());
            ffi::lua_gettable(L, -2);
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_settop(L, -2);
        }
    }
}

/// Empties the main thread's stack after a host call and scrubs what the call left in the
/// thread's unused parts: dead stack slots (one held a light userdata with a Rust stack
/// address) and free CallInfo records, and resets Lua's API string cache, whose slots depend on
/// host string addresses (`csrc/canonical.c`). Afterwards the idle arena depends on Lua's state
/// alone: a host read between two frames leaves it byte-identical to a run without the read.
///
/// # Safety
/// `L` is an idle main thread of a VM built by this crate.
pub(crate) unsafe fn finish_host_call(L: *mut lua_State) {
    // SAFETY: valid idle state; writes only slots above the (new) top and the string cache,
    // which it refills with the string Lua itself fills it with.
    unsafe {
        ffi::lua_settop(L, 0);
        luasnap_scrub_idle_state(L);
        luasnap_reset_strcache(L);
    }
}

/// The type name of the value at `idx`.
///
/// # Safety
/// Valid state and index.
pub(crate) unsafe fn type_name(L: *mut lua_State, idx: c_int) -> String {
    // SAFETY: lua_typename returns a static string.
    unsafe { CStr::from_ptr(ffi::lua_typename(L, ffi::lua_type(L, idx))) }
        .to_string_lossy()
        .into_owned()
}

/// Lua's panic function: only reached by an unprotected error, which this crate never makes.
pub(crate) unsafe extern "C-unwind" fn at_panic(L: *mut lua_State) -> c_int {
    // SAFETY: reading the error message, then aborting; nothing returns to Lua.
    let msg = unsafe { ffi::lua_tolstring(L, -1, std::ptr::null_mut()) };
    let text = if msg.is_null() {
        "(no message)".into()
    } else {
        // SAFETY: a NUL-terminated Lua string.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    };
    eprintln!("luasnap: unprotected Lua error (a bug in luasnap): {text}");
    std::process::abort()
}
