//! The FFI layer: everything that touches `lua_State` directly.
//!
//! # Rules that keep rollback and `longjmp` safe
//!
//! 1. **Nothing outside the arena refers into it in a way that changes.** The only Rust data
//!    Lua can reach is [`Shared`], through a pointer stored once in the main thread's extra space
//!    (copied into every coroutine). It holds the natives (append-only, sealed at the first
//!    snapshot) and scratch buffers that are empty whenever Lua is idle.
//! 2. **Lua errors are `longjmp`s.** Lua raises them from any API call that allocates. A Rust
//!    frame that a `longjmp` skips must have no value with a destructor alive (it must be a
//!    "plain old frame"). So natives never call the Lua API themselves: [`Call`] reads
//!    arguments with calls that cannot raise, and results and error messages are staged in
//!    `Shared` and pushed by the trampoline after the native's frames are gone.
//! 3. **Panics never cross C frames.** The trampoline and the protected-call shim catch them
//!    and turn them into Lua errors.
//! 4. **Every entry from the host is protected** (`lua_pcall`), so an error never reaches Lua's
//!    panic function.

use crate::bridge::error::{LuaErrorKind, NativeError};
use crate::bridge::helpers::{luasnap_reset_strcache, luasnap_scrub_idle_state};
use crate::bridge::value::PlainData;
use crate::bridge::value::{Table, UserDataValue, Value};
use mlua_sys::{self as ffi, lua_State};
use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Deepest table nesting converted between Lua and Rust.
pub(crate) const MAX_DEPTH: usize = 100;

/// The boxed Rust function behind a native.
pub(crate) type NativeFn = Box<dyn Fn(&mut Call<'_>) -> Result<(), NativeError>>;

/// A native: a Rust function callable from Lua.
pub(crate) struct Native {
    pub name: String,
    pub f: NativeFn,
}

/// A registered plain-data userdata type.
pub(crate) struct UserDataType {
    pub name: &'static str,
    pub size: usize,
    /// Identity of its metatable (`lua_topointer`). Metatables are created before the first
    /// snapshot and never collected, and Lua's collector never moves objects, so this stays
    /// valid across every rollback.
    pub metatable: *const c_void,
}

/// The Rust-side state Lua can reach. Owned by the VM in a `Box` whose address never changes.
pub(crate) struct Shared {
    pub natives: UnsafeCell<Vec<Native>>,
    pub userdata: UnsafeCell<Vec<UserDataType>>,
    /// Results of natives, as a stack: each trampoline call uses the part above its base.
    /// Boxed, so a value being pushed stays put if a finalizer run by that very push calls
    /// another native that grows the vector (which only ever adds and removes above our part).
    #[allow(clippy::vec_box)]
    pub results: UnsafeCell<Vec<Box<Value>>>,
    /// The message of an error a native raised, until it is pushed.
    pub error: UnsafeCell<String>,
    /// Host calls into Lua currently running.
    pub depth: Cell<u32>,
    /// Instructions Lua code may still run during a save-game load.
    pub budget: Cell<u64>,
    /// Save-game loads in progress (nested through `eris.unpersist` in a load-time call).
    pub loading: Cell<u32>,
    /// Whether a call under an instruction budget ([`crate::Vm::call_with_budget`]) runs.
    pub step_active: Cell<bool>,
    /// Instructions that call may still run.
    pub step_left: Cell<u64>,
    /// Whether that call used up its budget (set by the hook; read when the call fails).
    pub step_spent: Cell<bool>,
    /// Where Lua code was when the budget ran out (`chunk:line`), set with `step_spent`.
    pub step_where: UnsafeCell<Option<String>>,
    /// During a load: the heap size (bytes) past which the load fails (`u64::MAX`: none).
    pub heap_cap: Cell<u64>,
    /// Warn-function state: bit 0 on, bit 1 continuing a message.
    pub warn: Cell<u8>,
    /// Where the VM's arena starts (every Lua object lives in it).
    pub arena_base: usize,
    /// The anchor thread holding the Lua objects of live handles (see `handle.rs`); set once
    /// at build, never collected (the registry holds it).
    pub anchors: Cell<*mut lua_State>,
    /// Anchor slots freed while other handles are alive (empty when none is).
    pub anchor_free: UnsafeCell<Vec<c_int>>,
    /// Handles alive.
    pub anchor_live: Cell<usize>,
}

impl Shared {
    pub(crate) fn new(arena_base: usize) -> Shared {
        install_quiet_panic_hook();
        Shared {
            natives: UnsafeCell::new(Vec::new()),
            userdata: UnsafeCell::new(Vec::new()),
            results: UnsafeCell::new(Vec::new()),
            error: UnsafeCell::new(String::new()),
            depth: Cell::new(0),
            budget: Cell::new(0),
            loading: Cell::new(0),
            step_active: Cell::new(false),
            step_left: Cell::new(0),
            step_spent: Cell::new(false),
            step_where: UnsafeCell::new(None),
            heap_cap: Cell::new(u64::MAX),
            warn: Cell::new(0),
            arena_base,
            anchors: Cell::new(std::ptr::null_mut()),
            anchor_free: UnsafeCell::new(Vec::new()),
            anchor_live: Cell::new(0),
        }
    }

    pub(crate) fn userdata_types(&self) -> &[UserDataType] {
        // SAFETY: the userdata list is only appended to while no Lua code runs (registration
        // takes `&mut Vm`), so no `&mut` to it exists while this shared borrow lives.
        unsafe { &*self.userdata.get() }
    }
}

/// VMs alive in this process: (arena base, Shared). Lua finds its VM's `Shared` through the
/// allocator's `ud`, which is the arena's base address. Nothing VM-specific from the Rust heap
/// is stored in the Lua heap: a Rust address would differ between two otherwise identical VMs
/// and make their arenas differ byte for byte.
const MAX_VMS: usize = 4096;
struct VmSlot {
    base: AtomicUsize,
    shared: AtomicPtr<Shared>,
}
static SLOTS: [VmSlot; MAX_VMS] = [const {
    VmSlot {
        base: AtomicUsize::new(0),
        shared: AtomicPtr::new(std::ptr::null_mut()),
    }
}; MAX_VMS];

/// Registers the VM whose arena starts at `base`; `shared` must stay at this address until
/// [`release_slot`]. Returns the slot.
pub(crate) fn claim_slot(base: usize, shared: *const Shared) -> Option<usize> {
    let slot = SLOTS.iter().position(|s| {
        s.base
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    SLOTS[slot]
        .shared
        .store(shared.cast_mut(), Ordering::Release);
    SLOTS[slot].base.store(base, Ordering::Release);
    Some(slot)
}

/// Frees a slot claimed by [`claim_slot`].
pub(crate) fn release_slot(slot: usize) {
    SLOTS[slot].base.store(usize::MAX, Ordering::Release);
    SLOTS[slot]
        .shared
        .store(std::ptr::null_mut(), Ordering::Release);
    SLOTS[slot].base.store(0, Ordering::Release);
}

fn shared_by_base<'a>(base: usize) -> &'a Shared {
    for s in &SLOTS {
        if s.base.load(Ordering::Acquire) == base {
            // SAFETY: a registered slot's pointer is the live VM's boxed Shared.
            return unsafe { &*s.shared.load(Ordering::Acquire) };
        }
    }
    unreachable!("a luasnap VM always registers its arena before running Lua")
}

/// The `Shared` of the VM that owns `L`.
///
/// # Safety
/// `L` must be a thread of a VM built by this crate whose `Vm` is alive.
pub(crate) unsafe fn shared_of<'a>(L: *mut lua_State) -> &'a Shared {
    let mut ud = std::ptr::null_mut();
    // SAFETY: reads the allocator's ud (the arena base) from the state.
    unsafe { ffi::lua_getallocf(L, &mut ud) };
    shared_by_base(ud as usize)
}

// ----- natives -----

/// The arguments and results of one native call. Reading arguments never calls a Lua API
/// that can raise an error, and results are staged until the native returns.
pub struct Call<'a> {
    L: *mut lua_State,
    shared: &'a Shared,
    nargs: usize,
    /// The last error value that was not a string, raised by a callback of
    /// [`call_function`](Call::call_function): kept at this stack index of the native's own
    /// frame, with the text the native got for it. Returning that error raises the value.
    kept_error: Option<(c_int, String)>,
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
            Some(idx) => unsafe { to_value(self.L, idx, self.shared) }.map_err(NativeError),
            None => Ok(Value::Nil),
        }
    }

    /// Argument `i` as a plain-data userdata of type `T`, mutable in place (it lives in the
    /// Lua heap and rolls back with it).
    pub fn userdata<T: PlainData>(&mut self, i: usize) -> Result<&mut T, NativeError> {
        let idx = self.index(i).ok_or_else(|| self.bad(i, T::NAME))?;
        // SAFETY: valid slot; userdata_ptr only uses non-raising calls.
        let p =
            unsafe { userdata_ptr(self.L, idx, self.shared, T::NAME, std::mem::size_of::<T>()) };
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
        let (L, shared) = (self.L, self.shared);
        let mut body = |L: *mut lua_State| {
            // SAFETY: runs inside run_job under lua_pcallk with the callee at index 1; only
            // references live in this frame when Lua raises.
            unsafe { call_with(L, &args, shared) }
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
                    .map(|k| to_value(L, k, shared).map_err(NativeError))
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
                    None => message,
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
        // SAFETY: results is only touched by the innermost running trampoline (this one).
        unsafe { (*self.shared.results.get()).push(Box::new(value.into())) };
    }
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
unsafe fn userdata_ptr(
    L: *mut lua_State,
    idx: c_int,
    shared: &Shared,
    name: &str,
    size: usize,
) -> Option<*mut c_void> {
    let ty = shared.userdata_types().iter().find(|t| t.name == name)?;
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

enum Outcome {
    Return(c_int),
    Raise,
    /// Raise the value at this index of the native's stack.
    RaiseValue(c_int),
}

/// The C function behind every native. Upvalue 1 is the native's index.
pub(crate) unsafe extern "C-unwind" fn native_trampoline(L: *mut lua_State) -> c_int {
    // SAFETY: natives are only created by this crate, in VMs whose extra space holds Shared.
    let shared = unsafe { shared_of(L) };
    // SAFETY: upvalue 1 of every native closure is its integer index.
    let index =
        unsafe { ffi::lua_tointegerx(L, ffi::lua_upvalueindex(1), std::ptr::null_mut()) } as usize;
    // SAFETY: called by Lua with a valid stack.
    let nargs = unsafe { ffi::lua_gettop(L) } as usize;
    // All Rust values live inside `run` and are dropped when it returns: this frame is a plain
    // old frame when Lua raises below.
    // SAFETY: run only touches this call's own stack slots and Shared.
    match unsafe { run_native(L, shared, index, nargs) } {
        // SAFETY: pushes values staged in Shared; a memory error here unwinds a POF.
        Outcome::Return(base) => unsafe { push_results(L, shared, base as usize) },
        // SAFETY: as above; lua_error never returns. Like `luaL_error` in a C function, the
        // message starts with the position of the Lua code that called the native (empty when
        // a C function such as `pcall` called it).
        Outcome::Raise => unsafe {
            ffi::luaL_where(L, 1);
            raise_staged_error_at(L, shared)
        },
        // SAFETY: the index holds the kept error value (call_function left a free slot above
        // it); pushing a copy does not allocate, and lua_error never returns.
        Outcome::RaiseValue(idx) => unsafe {
            ffi::lua_pushvalue(L, idx);
            ffi::lua_error(L)
        },
    }
}

unsafe fn run_native(L: *mut lua_State, shared: &Shared, index: usize, nargs: usize) -> Outcome {
    // SAFETY: natives is append-only and only appended while Lua is idle.
    let natives = unsafe { &*shared.natives.get() };
    let Some(native) = natives.get(index) else {
        // SAFETY: error is only written by the innermost trampoline.
        unsafe { *shared.error.get() = format!("native #{index} does not exist") };
        return Outcome::Raise;
    };
    // SAFETY: as above for results.
    let base = unsafe { (*shared.results.get()).len() };
    let mut call = Call {
        L,
        shared,
        nargs,
        kept_error: None,
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
                unsafe { (*shared.results.get()).truncate(base) };
                return Outcome::RaiseValue(idx);
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
        (*shared.results.get()).truncate(base);
        *shared.error.get() = message;
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
unsafe fn push_results(L: *mut lua_State, shared: &Shared, base: usize) -> c_int {
    let results = shared.results.get();
    // SAFETY: results above base belong to this call; reading by index through the raw
    // pointer tolerates a finalizer run by an allocation below pushing (above our range) and
    // truncating back to its own base.
    unsafe {
        let n = (*results).len() - base;
        if ffi::lua_checkstack(L, n as c_int + 2) == 0 {
            (*results).truncate(base);
            *shared.error.get() = "too many results from a native".into();
            raise_staged_error(L, shared);
        }
        for i in 0..n {
            let v: *const Value = &*(&(*results))[base + i];
            push_value(L, &*v, shared, 0);
        }
        (*results).truncate(base);
        n as c_int
    }
}

unsafe fn raise_staged_error(L: *mut lua_State, shared: &Shared) -> ! {
    // SAFETY: pushes a copy of the staged message (Lua copies the bytes before any GC step),
    // then raises; no Rust value with a destructor is alive in this frame.
    unsafe {
        let msg = &*shared.error.get();
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_error(L)
    }
}

/// [`raise_staged_error`] after a position prefix that the caller pushed (`luaL_where`).
///
/// # Safety
/// As for [`raise_staged_error`], with one string pushed by the caller.
unsafe fn raise_staged_error_at(L: *mut lua_State, shared: &Shared) -> ! {
    // SAFETY: the prefix is on top; concatenating two strings only allocates (a memory error
    // unwinds plain old frames), then lua_error never returns.
    unsafe {
        let msg = &*shared.error.get();
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_concat(L, 2);
        ffi::lua_error(L)
    }
}

// ----- values -----

/// Pushes `args` and calls the function below them with `LUA_MULTRET`; returns the new top.
///
/// # Safety
/// A valid state in a protected body, the function on top. May raise (the call's errors and
/// memory errors), so only plain frames may be live, as for [`push_value`].
pub(crate) unsafe fn call_with(L: *mut lua_State, args: &[Value], shared: &Shared) -> c_int {
    // SAFETY: callers' contract; the stack is grown before the arguments are pushed.
    unsafe {
        ffi::luaL_checkstack(L, args.len() as c_int + 1, c"too many arguments".as_ptr());
        for a in args {
            push_value(L, a, shared, 0);
        }
        ffi::lua_callk(L, args.len() as c_int, ffi::LUA_MULTRET, 0, None);
        ffi::lua_gettop(L)
    }
}

/// Pushes a Rust value. May raise a memory error (only call where a `longjmp` skips nothing
/// but plain old frames: inside the trampoline or a protected closure).
pub(crate) unsafe fn push_value(L: *mut lua_State, v: &Value, shared: &Shared, depth: usize) {
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
                    push_value(L, k, shared, depth + 1);
                    push_value(L, val, shared, depth + 1);
                    ffi::lua_rawset(L, -3);
                }
            }
            Value::UserData(u) => push_userdata(L, u, shared),
            Value::Opaque(t) => {
                let msg = format!("a {t} value copied out of Lua cannot be passed back");
                // The String is dropped before raising: copy into the staging buffer.
                *shared.error.get() = msg;
                raise_staged_error(L, shared)
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

unsafe fn push_userdata(L: *mut lua_State, u: &UserDataValue, shared: &Shared) {
    let Some(ty) = shared
        .userdata_types()
        .iter()
        .find(|t| t.name == u.type_name)
    else {
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
/// `L` is a valid state of a VM built by this crate, `idx` a valid index in it, and `shared`
/// that VM's shared state.
pub(crate) unsafe fn to_value(
    L: *mut lua_State,
    idx: c_int,
    shared: &Shared,
) -> Result<Value, String> {
    // SAFETY: idx is valid (callers' contract); the conversion below only reads.
    unsafe {
        let idx = ffi::lua_absindex(L, idx);
        let mut seen = Vec::new();
        let mut left = MAX_COPY_VALUES;
        to_value_at(L, idx, shared, 0, &mut seen, &mut left)
    }
}

/// Most Lua values one [`to_value`] copies. A table shared by several others is copied once
/// per reference (a [`Value`] is a tree), so a small graph of shared tables can stand for an
/// exponential number of values: past this, the copy is refused instead of exhausting memory.
pub(crate) const MAX_COPY_VALUES: usize = 1_000_000;

unsafe fn to_value_at(
    L: *mut lua_State,
    idx: c_int,
    shared: &Shared,
    depth: usize,
    seen: &mut Vec<*const c_void>,
    left: &mut usize,
) -> Result<Value, String> {
    if *left == 0 {
        return Err(format!("a value of more than {MAX_COPY_VALUES} Lua values (a table shared by others is copied once per reference); return a smaller value, or walk it from Lua"));
    }
    *left -= 1;
    // SAFETY: idx is an absolute valid index; every call here is non-raising: lua_next on a
    // table being traversed with a key it just returned, lua_tolstring on actual strings.
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
            ffi::LUA_TTABLE => {
                let ptr = ffi::lua_topointer(L, idx);
                if depth >= MAX_DEPTH {
                    return Err("a table nested more than 100 deep".into());
                }
                if seen.contains(&ptr) {
                    return Err("a table that contains itself (cycles cannot be copied out)".into());
                }
                if ffi::lua_checkstack(L, 3) == 0 {
                    return Err("a table nested too deeply for the Lua stack".into());
                }
                seen.push(ptr);
                let mut t = Table::new();
                ffi::lua_pushnil(L);
                while ffi::lua_next(L, idx) != 0 {
                    let top = ffi::lua_gettop(L);
                    let k = to_value_at(L, top - 1, shared, depth + 1, seen, left);
                    let v = to_value_at(L, top, shared, depth + 1, seen, left);
                    ffi::lua_settop(L, -2);
                    match (k, v) {
                        (Ok(k), Ok(v)) => t.entries.push((k, v)),
                        (Err(e), _) | (_, Err(e)) => {
                            ffi::lua_settop(L, -2);
                            return Err(e);
                        }
                    }
                }
                seen.pop();
                Value::Table(t)
            }
            ffi::LUA_TUSERDATA => {
                let size = ffi::lua_rawlen(L, idx) as usize;
                let found = shared.userdata_types().iter().find(|t| {
                    t.size == size && userdata_ptr(L, idx, shared, t.name, t.size).is_some()
                });
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
            ffi::LUA_TFUNCTION => Value::Opaque("function"),
            ffi::LUA_TTHREAD => Value::Opaque("thread"),
            ffi::LUA_TLIGHTUSERDATA => Value::Opaque("light userdata"),
            _ => Value::Opaque("unknown"),
        })
    }
}

// ----- protected calls from the host -----

/// Lua's error report: kind, message and traceback.
pub(crate) struct LuaFailure {
    pub kind: LuaErrorKind,
    pub message: String,
    pub traceback: Option<String>,
}

/// Message handler of [`Call::call_function`]: a traceback for string messages (dropped
/// later, as for [`traceback_handler`]); any other error value passes through unchanged so
/// the native can raise the value itself.
unsafe extern "C-unwind" fn callback_handler(L: *mut lua_State) -> c_int {
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
unsafe extern "C-unwind" fn traceback_handler(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua as a message handler with the error object at index 1.
    unsafe {
        let msg = ffi::lua_tolstring(L, 1, std::ptr::null_mut());
        if msg.is_null() {
            // No Rust value may be alive when Lua raises here, so let Lua format the text.
            let tn = ffi::lua_typename(L, ffi::lua_type(L, 1));
            let m = ffi::lua_pushfstring(L, c"(error object is a %s value)".as_ptr(), tn);
            ffi::luaL_traceback(L, L, m, 1);
        } else {
            ffi::luaL_traceback(L, L, msg, 1);
        }
        1
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
/// `L` must be the idle main thread of a VM built by this crate.
pub(crate) unsafe fn protected(
    L: *mut lua_State,
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
    Err(LuaFailure {
        kind,
        message,
        traceback,
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

/// A warn function that prints to stderr like the standalone `lua` (`@on` / `@off`).
pub(crate) unsafe extern "C-unwind" fn warn_to_stderr(
    ud: *mut c_void,
    msg: *const c_char,
    tocont: c_int,
) {
    // ud is the arena base, registered while the VM lives.
    let state = &shared_by_base(ud as usize).warn;
    // SAFETY: as above.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    // state: bit 0 = on, bit 1 = continuing a message
    let s = state.get();
    // A control message is a whole message (not a piece of a longer one), as in lauxlib.
    if s & 2 == 0 && tocont == 0 && text.starts_with('@') {
        match &*text {
            "@on" => state.set(s | 1),
            "@off" => state.set(s & !1),
            _ => {}
        }
        return;
    }
    // Bits 2-3 follow lua's "error in __gc (not enough memory)" warning, sent in pieces: a
    // finalizer lost to a memory error makes the next allocation fail, so code waiting for
    // that finalizer ends with "not enough memory" instead of waiting forever.
    let stage = (s >> 2) & 3;
    let next = match (stage, &*text) {
        (_, "error in ") if s & 2 == 0 => 1,
        (1, "__gc") => 2,
        (2, " (") => 3,
        (3, "not enough memory") => {
            // SAFETY: ud is the base of this VM's live arena (registered with the warn function,
            // from `Arena::raw`), and Lua, running this function, is its only user now.
            unsafe { luasnap_alloc::RawArena::from_ptr(ud).refuse_next_growth() };
            0
        }
        _ => 0,
    };
    state.set((s & !12) | (next << 2));
    let s = state.get();
    if s & 1 != 0 {
        if s & 2 == 0 {
            eprint!("Lua warning: ");
        }
        eprint!("{text}");
        if tocont == 0 {
            eprintln!();
        }
    }
    state.set(if tocont != 0 {
        state.get() | 2
    } else {
        state.get() & !2
    });
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
