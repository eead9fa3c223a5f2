//! Natives: Rust functions Lua calls. Each is a C closure of [`native_trampoline`] whose only
//! upvalue is the native's index in its VM's [`Registry`]; the trampoline finds the VM's
//! [`NativeState`] from the `lua_State` (`per_vm.rs`), runs the native with a [`Call`], and
//! pushes what it staged once the native's frames are gone (rule 2 of `ffi.rs`).

use crate::bridge::error::NativeError;
use crate::bridge::ffi::{
    call_with, callback_handler, is_callable, push_value, run_job, scrub_above_top, to_value,
    userdata_ptr, Job, UserDataType,
};
use crate::bridge::per_vm::{PerVm, Registered};
use crate::bridge::value::{PlainData, Value};
use mlua_sys::{self as ffi, lua_State};
use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The boxed Rust function behind a native.
pub(crate) type NativeFn = Box<dyn Fn(&mut Call<'_>) -> Result<(), NativeError>>;

/// A native: a Rust function callable from Lua.
pub(crate) struct Native {
    pub name: String,
    pub f: NativeFn,
}

/// The natives and plain-data userdata types of one VM, which Lua's native closures and
/// userdata metatables refer to by index and identity.
///
/// Invariant: appended to only while no Lua code runs and no reference into the lists is
/// alive (registration takes `&mut Vm` and checks the VM is idle), and only until the registry
/// is [closed](Registry::close) by the first snapshot, so every snapshot sees the same lists
/// and a trampoline's `&Native` stays valid for its whole call. A registration that fails
/// takes back what it added, under the same conditions.
pub(crate) struct Registry {
    natives: UnsafeCell<Vec<Native>>,
    types: UnsafeCell<Vec<UserDataType>>,
    closed: Cell<bool>,
}

impl Registry {
    /// The registered userdata types.
    pub(crate) fn types(&self) -> &[UserDataType] {
        // SAFETY: the list changes only while no reference into it is alive (the type's
        // invariant), so none does while this borrow lives.
        unsafe { &*self.types.get() }
    }

    /// The native at `index`, if there is one.
    fn native(&self, index: usize) -> Option<&Native> {
        // SAFETY: as in `types`.
        unsafe { &*self.natives.get() }.get(index)
    }

    /// Natives registered.
    pub(crate) fn native_count(&self) -> usize {
        // SAFETY: as in `types`.
        unsafe { &*self.natives.get() }.len()
    }

    /// Whether a native of this name is registered.
    pub(crate) fn has_native(&self, name: &str) -> bool {
        // SAFETY: as in `types`.
        unsafe { &*self.natives.get() }
            .iter()
            .any(|n| n.name == name)
    }

    /// Whether a native is registered under `namespace.` (`host` for `host.roll`).
    pub(crate) fn has_namespace(&self, namespace: &str) -> bool {
        // SAFETY: as in `types`.
        unsafe { &*self.natives.get() }.iter().any(|n| {
            n.name
                .strip_prefix(namespace)
                .is_some_and(|rest| rest.starts_with('.'))
        })
    }

    /// Whether the registry is closed (a snapshot was taken).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Closes the registry: nothing may be registered after the first snapshot.
    pub(crate) fn close(&self) {
        self.closed.set(true);
    }

    /// Adds a native; returns its index.
    ///
    /// # Safety
    /// No Lua code runs and no reference into the registry is alive (the caller holds
    /// `&mut Vm`); the registry is open.
    pub(crate) unsafe fn add_native(&self, name: String, f: NativeFn) -> usize {
        debug_assert!(!self.closed.get());
        // SAFETY: no other reference into the list is alive (caller's contract).
        let natives = unsafe { &mut *self.natives.get() };
        natives.push(Native { name, f });
        natives.len() - 1
    }

    /// Forgets the natives from index `len` on (a failed registration's).
    ///
    /// # Safety
    /// As for [`add_native`](Registry::add_native).
    pub(crate) unsafe fn truncate_natives(&self, len: usize) {
        // SAFETY: as in `add_native`.
        unsafe { (*self.natives.get()).truncate(len) };
    }

    /// Adds a userdata type.
    ///
    /// # Safety
    /// As for [`add_native`](Registry::add_native).
    pub(crate) unsafe fn add_type(&self, t: UserDataType) {
        debug_assert!(!self.closed.get());
        // SAFETY: as in `add_native`.
        unsafe { (*self.types.get()).push(t) };
    }
}

/// What natives return and raise, staged outside the Lua stack until the native's frames are
/// gone (a `longjmp` must skip no Rust value with a destructor).
///
/// Invariant: empty whenever no Lua code runs (cleared after every host call into Lua). While
/// natives run, each trampoline call owns the results above the length it found on entry: a
/// native called by Lua code that another native's callback runs pushes above its caller's
/// part and truncates back to it before returning. The error message belongs to the innermost
/// trampoline, which reads it right before raising.
pub(crate) struct Staging {
    /// Results, as a stack. Boxed, so a value being pushed stays put if a finalizer run by that
    /// very push calls another native that grows the vector.
    #[allow(clippy::vec_box)]
    results: UnsafeCell<Vec<Box<Value>>>,
    /// The message of an error a native raised, until it is pushed.
    error: UnsafeCell<String>,
}

impl Staging {
    /// Drops what natives interrupted by errors left staged.
    ///
    /// # Safety
    /// No native is running.
    pub(crate) unsafe fn clear(&self) {
        // SAFETY: no trampoline holds a reference into the results (caller's contract).
        unsafe { (*self.results.get()).clear() };
    }
}

/// The natives' part of one VM, which the trampoline finds from a `lua_State`.
pub(crate) struct NativeState {
    pub(crate) registry: Registry,
    pub(crate) staging: Staging,
}

static STATE: PerVm<NativeState> = PerVm::new();

/// Registers the natives' state of the VM whose arena starts at `base` (nothing registered).
pub(crate) fn register(base: usize) -> Option<Registered<NativeState>> {
    install_quiet_panic_hook();
    STATE.register(
        base,
        NativeState {
            registry: Registry {
                natives: UnsafeCell::new(Vec::new()),
                types: UnsafeCell::new(Vec::new()),
                closed: Cell::new(false),
            },
            staging: Staging {
                results: UnsafeCell::new(Vec::new()),
                error: UnsafeCell::new(String::new()),
            },
        },
    )
}

/// The natives' state of the VM that owns `L`.
///
/// # Safety
/// `L` is a thread of a live VM built by this crate, on the thread that runs it; the reference
/// does not outlive the VM.
pub(crate) unsafe fn state_of<'a>(L: *mut lua_State) -> &'a NativeState {
    // SAFETY: every VM registers its natives' state when it is built (caller's contract).
    unsafe { STATE.of(L) }
}

/// The arguments and results of one native call. Reading arguments never calls a Lua API
/// that can raise an error, and results are staged until the native returns.
pub struct Call<'a> {
    L: *mut lua_State,
    state: &'a NativeState,
    nargs: usize,
    /// The last error value that was not a string, raised by a callback of
    /// [`call_function`](Call::call_function): kept at this stack index of the native's own
    /// frame, with the text the native got for it. Returning that error raises the value.
    kept_error: Option<(c_int, String)>,
    /// The last error message a callback of [`call_function`](Call::call_function) raised as
    /// a string. Returning that error raises its text with this native's name before it once
    /// (not again when it starts with it) and no position: the text names where it was
    /// raised, where a name and position added per native it passed through repeated.
    callback_error: Option<String>,
}

impl<'a> Call<'a> {
    /// Number of arguments passed.
    pub fn len(&self) -> usize {
        self.nargs
    }

    /// Whether no arguments were passed.
    pub fn is_empty(&self) -> bool {
        self.nargs == 0
    }

    fn index(&self, i: usize) -> Option<c_int> {
        (i < self.nargs).then_some(i as c_int + 1)
    }

    fn type_of(&self, i: usize) -> c_int {
        match self.index(i) {
            // SAFETY: the index is a valid argument slot of this call.
            Some(idx) => unsafe { ffi::lua_type(self.L, idx) },
            None => ffi::LUA_TNONE,
        }
    }

    fn bad(&self, i: usize, expected: &str) -> NativeError {
        let got = match self.type_of(i) {
            ffi::LUA_TNONE => "no value",
            // SAFETY: lua_typename returns a static string for any valid type tag.
            t => unsafe { CStr::from_ptr(ffi::lua_typename(self.L, t)) }
                .to_str()
                .unwrap_or("?"),
        };
        NativeError(format!(
            "bad argument #{} ({expected} expected, got {got})",
            i + 1
        ))
    }

    /// Argument `i` (from 0) as an integer; floats with an exact integer value are accepted.
    pub fn integer(&self, i: usize) -> Result<i64, NativeError> {
        let idx = self.index(i).ok_or_else(|| self.bad(i, "number"))?;
        let mut ok = 0;
        // SAFETY: valid slot; lua_tointegerx on a number or string never raises.
        let v = unsafe { ffi::lua_tointegerx(self.L, idx, &mut ok) };
        if ok != 0 && self.type_of(i) == ffi::LUA_TNUMBER {
            Ok(v)
        } else {
            Err(self.bad(i, "integer"))
        }
    }

    /// Argument `i` as a float.
    pub fn number(&self, i: usize) -> Result<f64, NativeError> {
        if self.type_of(i) != ffi::LUA_TNUMBER {
            return Err(self.bad(i, "number"));
        }
        // SAFETY: valid slot holding a number.
        Ok(unsafe { ffi::lua_tonumberx(self.L, i as c_int + 1, std::ptr::null_mut()) })
    }

    /// Argument `i`'s truthiness (absent counts as `nil`).
    pub fn boolean(&self, i: usize) -> bool {
        match self.index(i) {
            // SAFETY: valid slot.
            Some(idx) => unsafe { ffi::lua_toboolean(self.L, idx) != 0 },
            None => false,
        }
    }

    /// Argument `i` as string bytes (numbers are not converted).
    pub fn bytes(&self, i: usize) -> Result<&[u8], NativeError> {
        if self.type_of(i) != ffi::LUA_TSTRING {
            return Err(self.bad(i, "string"));
        }
        let mut len = 0;
        // SAFETY: the slot holds a string, so lua_tolstring neither converts nor allocates; the
        // string stays on the stack (alive) for the whole call.
        let p = unsafe { ffi::lua_tolstring(self.L, i as c_int + 1, &mut len) };
        // SAFETY: Lua guarantees len readable bytes at p.
        Ok(unsafe { std::slice::from_raw_parts(p.cast(), len) })
    }

    /// Argument `i` as UTF-8 text.
    pub fn str(&self, i: usize) -> Result<&str, NativeError> {
        std::str::from_utf8(self.bytes(i)?).map_err(|_| self.bad(i, "UTF-8 string"))
    }

    /// Argument `i` copied into a [`Value`] (tables deeply).
    pub fn value(&self, i: usize) -> Result<Value, NativeError> {
        match self.index(i) {
            // SAFETY: valid slot; to_value only uses non-raising API calls.
            Some(idx) => {
                unsafe { to_value(self.L, idx, self.state.registry.types()) }.map_err(NativeError)
            }
            None => Ok(Value::Nil),
        }
    }

    /// Argument `i` as a plain-data userdata of type `T`, mutable in place (it lives in the
    /// Lua heap and rolls back with it).
    pub fn userdata<T: PlainData>(&mut self, i: usize) -> Result<&mut T, NativeError> {
        let idx = self.index(i).ok_or_else(|| self.bad(i, T::NAME))?;
        // SAFETY: valid slot; userdata_ptr only uses non-raising calls.
        let p = unsafe {
            userdata_ptr(
                self.L,
                idx,
                self.state.registry.types(),
                T::NAME,
                std::mem::size_of::<T>(),
            )
        };
        match p {
            // SAFETY: the block is a userdata of exactly size_of::<T>() bytes whose metatable is
            // T's; Lua aligns userdata to at least 8 bytes and registration refused T with a
            // larger alignment; T is Pod, so any bytes are a valid T. `&mut self` prevents a
            // second live reference through this Call.
            Some(p) => Ok(unsafe { &mut *p.cast::<T>() }),
            None => Err(self.bad(i, T::NAME)),
        }
    }

    /// Calls argument `i` (a function, or a value with `__call`) with `args` and converts its
    /// results: comparators, event handlers and other callbacks passed in from Lua.
    ///
    /// The call is protected: an error inside it comes back as an `Err` (with Lua's message),
    /// which the native may handle or return (`?`) to raise it further. An error value that
    /// is not a string (`error({ code = 7 })`) reads `(error object is a table value)` here,
    /// and returning that error raises the original value, so Lua's `pcall` around the native
    /// gets the table as in plain Lua. The Lua code it runs
    /// may call natives in turn; it cannot yield across this call (Lua's rule for C calls
    /// without continuations) and, like any native, cannot snapshot the VM.
    ///
    /// ```
    /// # use luasnap_bridge::{Vm, VmError};
    /// let vm = Vm::builder()
    ///     .capacity(64 << 20)
    ///     .native("host.count_if", |call| {
    ///         let items: Vec<i64> = call.get(0)?;
    ///         let mut n = 0;
    ///         for x in items {
    ///             if call.call_function::<bool>(1, x)? {
    ///                 n += 1;
    ///             }
    ///         }
    ///         call.ret(n);
    ///         Ok(())
    ///     })
    ///     .build()?;
    /// let n: i64 = vm.exec("return host.count_if({1, 5, 7, 2}, function(x) return x > 3 end)", "t")?[0]
    ///     .as_integer().unwrap();
    /// assert_eq!(n, 2);
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn call_function<'h, R: crate::bridge::convert::FromLuaMulti>(
        &mut self,
        i: usize,
        args: impl crate::bridge::convert::IntoLuaMulti<'h>,
    ) -> Result<R, NativeError> {
        let idx = self.index(i).ok_or_else(|| self.bad(i, "function"))?;
        // SAFETY: valid slot; the check only reads the metatable.
        if !unsafe { is_callable(self.L, idx) } {
            return Err(self.bad(i, "function"));
        }
        let args = crate::bridge::convert::plain_args(args)?;
        let (L, types) = (self.L, self.state.registry.types());
        let mut body = |L: *mut lua_State| {
            // SAFETY: runs inside run_job under lua_pcallk with the callee at index 1; only
            // references live in this frame when Lua raises.
            unsafe { call_with(L, &args, types) }
        };
        let mut job = Job {
            body: &mut body,
            panic: None,
        };
        let mut kept: Option<(c_int, String)> = None;
        // SAFETY: this native's own stack. The pushes below do not allocate (light C
        // functions, a light userdata and a copy) and the stack is checked first; lua_pcallk
        // catches every error raised inside. Results are copied with non-raising calls, then
        // the stack is put back to where it was and the slots used are cleared (one held a
        // Rust stack address).
        unsafe {
            if ffi::lua_checkstack(L, 5) == 0 {
                return Err(NativeError::new("Lua stack overflow calling back into Lua"));
            }
            let base = ffi::lua_gettop(L);
            ffi::lua_pushcclosure(L, callback_handler, 0);
            ffi::lua_pushcclosure(L, run_job, 0);
            ffi::lua_pushlightuserdata(L, (&mut job as *mut Job<'_>).cast());
            ffi::lua_pushvalue(L, idx);
            let status = ffi::lua_pcallk(L, 2, ffi::LUA_MULTRET, base + 1, 0, None);
            let top = ffi::lua_gettop(L);
            let outcome = if status == ffi::LUA_OK {
                (base + 2..=top)
                    .map(|k| to_value(L, k, types).map_err(NativeError))
                    .collect::<Result<Vec<_>, _>>()
            } else {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                let text = if p.is_null() {
                    // Not a string: keep the value itself just above the native's stack
                    // (where the handler sat), so returning this error raises the value.
                    let tn = std::ffi::CStr::from_ptr(ffi::lua_typename(L, ffi::lua_type(L, -1)));
                    let text = format!("(error object is a {} value)", tn.to_string_lossy());
                    ffi::lua_copy(L, -1, base + 1);
                    kept = Some((base + 1, text.clone()));
                    text
                } else {
                    String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len))
                        .into_owned()
                };
                let message = match text.find("\nstack traceback:") {
                    Some(k) => text[..k].to_string(),
                    None => text,
                };
                Err(NativeError(match job.panic.take() {
                    Some(p) => format!("{message}: {p}"),
                    None => {
                        if kept.is_none() {
                            self.callback_error = Some(message.clone());
                        }
                        message
                    }
                }))
            };
            match kept {
                Some(_) => {
                    ffi::lua_settop(L, base + 1);
                    scrub_above_top(L, top - base + 2);
                }
                None => {
                    ffi::lua_settop(L, base);
                    scrub_above_top(L, top - base + 3);
                }
            }
            if kept.is_some() {
                self.kept_error = kept;
            }
            let values = outcome?;
            R::from_lua_multi(values, "callback result").map_err(NativeError::from)
        }
    }

    /// Argument `i` converted to `T` (see [`FromLua`](crate::FromLua)).
    pub fn get<T: crate::bridge::convert::FromLua>(&self, i: usize) -> Result<T, NativeError> {
        let v = self.value(i)?;
        T::from_lua(v)
            .map_err(|e| crate::bridge::convert::at(e, &format!("argument #{}", i + 1)))
            .map_err(NativeError::from)
    }

    /// Adds a result.
    pub fn ret(&mut self, value: impl Into<Value>) {
        // SAFETY: the staging area is only touched by the innermost running trampoline (this
        // call's).
        unsafe { (*self.state.staging.results.get()).push(Box::new(value.into())) };
    }
}

enum Outcome {
    Return(c_int),
    Raise,
    /// Raise the value at this index of the native's stack.
    RaiseValue(c_int),
    /// Raise the staged message without a position (a callback's error passing through).
    RaiseAsIs,
}

/// The C function behind every native. Upvalue 1 is the native's index.
pub(crate) unsafe extern "C-unwind" fn native_trampoline(L: *mut lua_State) -> c_int {
    // SAFETY: natives are only created by this crate, in VMs that registered their natives'
    // state, alive while their Lua code runs.
    let state = unsafe { STATE.of(L) };
    // SAFETY: upvalue 1 of every native closure is its integer index.
    let index =
        unsafe { ffi::lua_tointegerx(L, ffi::lua_upvalueindex(1), std::ptr::null_mut()) } as usize;
    // SAFETY: called by Lua with a valid stack.
    let nargs = unsafe { ffi::lua_gettop(L) } as usize;
    // All Rust values live inside `run` and are dropped when it returns: this frame is a plain
    // old frame when Lua raises below.
    // SAFETY: run only touches this call's own stack slots and the natives' state.
    match unsafe { run_native(L, state, index, nargs) } {
        // SAFETY: pushes the values staged; a memory error here unwinds a POF.
        Outcome::Return(base) => unsafe { push_results(L, state, base as usize) },
        // SAFETY: as above; lua_error never returns. Like `luaL_error` in a C function, the
        // message starts with the position of the Lua code that called the native (empty when
        // a C function such as `pcall` called it).
        Outcome::Raise => unsafe {
            ffi::luaL_where(L, 1);
            raise_staged_error_at(L, &state.staging)
        },
        // SAFETY: as for Raise, without the position.
        Outcome::RaiseAsIs => unsafe { raise_staged_error(L, &state.staging) },
        // SAFETY: the index holds the kept error value (call_function left a free slot above
        // it); pushing a copy does not allocate, and lua_error never returns.
        Outcome::RaiseValue(idx) => unsafe {
            ffi::lua_pushvalue(L, idx);
            ffi::lua_error(L)
        },
    }
}

unsafe fn run_native(
    L: *mut lua_State,
    state: &NativeState,
    index: usize,
    nargs: usize,
) -> Outcome {
    let staging = &state.staging;
    let Some(native) = state.registry.native(index) else {
        // SAFETY: the error is only written by the innermost trampoline.
        unsafe { *staging.error.get() = format!("native #{index} does not exist") };
        return Outcome::Raise;
    };
    // SAFETY: as above for results.
    let base = unsafe { (*staging.results.get()).len() };
    let mut call = Call {
        L,
        state,
        nargs,
        kept_error: None,
        callback_error: None,
    };
    IN_NATIVE.with(|n| n.set(n.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(|| (native.f)(&mut call)));
    IN_NATIVE.with(|n| n.set(n.get() - 1));
    let message = match result {
        Ok(Ok(())) => return Outcome::Return(base as c_int),
        Ok(Err(e)) => match call.kept_error.take() {
            // The callback's error value itself, not its text (as `pcall` in Lua gives it).
            Some((idx, text)) if text == e.0 => {
                // SAFETY: only this (innermost) trampoline touches these buffers now.
                unsafe { (*staging.results.get()).truncate(base) };
                return Outcome::RaiseValue(idx);
            }
            _ if call.callback_error.as_deref() == Some(e.0.as_str()) => {
                // Named by the native it passed through once, without a position: the message
                // has the place where it was raised.
                let named = format!("{}: ", native.name);
                let message = if e.0.starts_with(&named) {
                    e.0
                } else {
                    named + &e.0
                };
                // SAFETY: as above.
                unsafe {
                    (*staging.results.get()).truncate(base);
                    *staging.error.get() = message;
                }
                return Outcome::RaiseAsIs;
            }
            _ => format!("{}: {}", native.name, e.0),
        },
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            format!("{}: native panicked: {what}", native.name)
        }
    };
    // SAFETY: only this (innermost) trampoline touches these buffers now.
    unsafe {
        (*staging.results.get()).truncate(base);
        *staging.error.get() = message;
    }
    Outcome::Raise
}

thread_local! {
    /// Natives running on this thread (panics inside are reported as Lua errors).
    static IN_NATIVE: Cell<u32> = const { Cell::new(0) };
}

/// Installs (once per process) a panic hook that stays quiet for panics inside natives: they
/// become Lua errors carrying the panic message, so the default hook's report on stderr would
/// only be noise. Other panics, and all panics when `RUST_BACKTRACE` is set, go to the hook
/// that was installed before.
fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        let verbose = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
        std::panic::set_hook(Box::new(move |info| {
            if verbose || IN_NATIVE.with(|n| n.get()) == 0 {
                previous(info);
            }
        }));
    });
}

/// Pushes the results staged above `base`, then drops them.
unsafe fn push_results(L: *mut lua_State, state: &NativeState, base: usize) -> c_int {
    let results = state.staging.results.get();
    // SAFETY: results above base belong to this call; reading by index through the raw
    // pointer tolerates a finalizer run by an allocation below pushing (above our range) and
    // truncating back to its own base.
    unsafe {
        let n = (*results).len() - base;
        if ffi::lua_checkstack(L, n as c_int + 2) == 0 {
            (*results).truncate(base);
            *state.staging.error.get() = "too many results from a native".into();
            raise_staged_error(L, &state.staging);
        }
        for i in 0..n {
            let v: *const Value = &*(&(*results))[base + i];
            push_value(L, &*v, state.registry.types(), 0);
        }
        (*results).truncate(base);
        n as c_int
    }
}

unsafe fn raise_staged_error(L: *mut lua_State, staging: &Staging) -> ! {
    // SAFETY: pushes a copy of the staged message (Lua copies the bytes before any GC step),
    // then raises; no Rust value with a destructor is alive in this frame.
    unsafe {
        let msg = &*staging.error.get();
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_error(L)
    }
}

/// [`raise_staged_error`] after a position prefix that the caller pushed (`luaL_where`).
///
/// # Safety
/// As for [`raise_staged_error`], with one string pushed by the caller.
unsafe fn raise_staged_error_at(L: *mut lua_State, staging: &Staging) -> ! {
    // SAFETY: the prefix is on top; concatenating two strings only allocates (a memory error
    // unwinds plain old frames), then lua_error never returns.
    unsafe {
        let msg = &*staging.error.get();
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_concat(L, 2);
        ffi::lua_error(L)
    }
}
