//! The instruction budget of [`Vm::call_with_budget`](crate::Vm::call_with_budget): a count
//! hook charges every thread the call runs, and stops it once the budget is spent.

use crate::bridge::helpers::luasnap_register_step_hook;
use crate::bridge::per_vm::{PerVm, Registered};
use mlua_sys::{self as ffi, lua_State};
use std::cell::{Cell, UnsafeCell};
use std::ffi::c_int;

/// Instructions of one thread between two calls of the instruction-budget hook
/// ([`Vm::call_with_budget`](crate::Vm::call_with_budget)).
pub const BUDGET_HOOK_PERIOD: u64 = 1000;

/// The budget of the call running under `call_with_budget` in one VM, which the hook charges.
///
/// Invariant: `active` is set only for the duration of such a call, by [`StepBudget::begin`]
/// and [`StepBudget::end`] (no budgeted call runs inside another: natives cannot reach the
/// VM); the hook writes `spent` and `location` only while it is set, and the host reads
/// `location` only after the call, so no two references to it are ever alive.
pub(crate) struct StepBudget {
    active: Cell<bool>,
    /// Instructions the call may still run.
    left: Cell<u64>,
    /// Whether the call used up its budget (set by the hook).
    spent: Cell<bool>,
    /// Where Lua code was when the budget ran out (`chunk:line`), set with `spent`.
    location: UnsafeCell<Option<String>>,
}

/// The hook the budgeted call replaced on the main thread, put back by [`StepBudget::end`].
pub(crate) struct SavedHook(Option<ffi::lua_Hook>, c_int, c_int);

static BUDGETS: PerVm<StepBudget> = PerVm::new();

/// Registers the budget state of the VM whose arena starts at `base`.
pub(crate) fn register(base: usize) -> Option<Registered<StepBudget>> {
    BUDGETS.register(
        base,
        StepBudget {
            active: Cell::new(false),
            left: Cell::new(0),
            spent: Cell::new(false),
            location: UnsafeCell::new(None),
        },
    )
}

impl StepBudget {
    /// Starts a budgeted call of `budget` instructions on the idle main thread `L`: puts the
    /// hook on it and returns the hook it replaced.
    ///
    /// # Safety
    /// `L` is the idle main thread of the VM this state belongs to; [`end`](StepBudget::end)
    /// follows once the call returned.
    pub(crate) unsafe fn begin(&self, L: *mut lua_State, budget: u64) -> SavedHook {
        // SAFETY: registers a function that lives as long as the program; the main thread is
        // idle, so its hook may change (the old one goes back in `end`).
        let saved = unsafe {
            luasnap_register_step_hook(Some(step_hook));
            let saved = SavedHook(
                ffi::lua_gethook(L),
                ffi::lua_gethookmask(L),
                ffi::lua_gethookcount(L),
            );
            ffi::lua_sethook(
                L,
                Some(step_hook),
                ffi::LUA_MASKCOUNT,
                BUDGET_HOOK_PERIOD as c_int,
            );
            saved
        };
        self.left.set(budget);
        self.spent.set(false);
        // SAFETY: no Lua code runs, so the hook holds no reference to the location.
        unsafe { *self.location.get() = None };
        self.active.set(true);
        saved
    }

    /// Ends the budgeted call: puts the main thread's own hook back. `Some(location)` if the
    /// budget was spent (even if a `pcall` in the callee swallowed the error it raised):
    /// what the call did is incomplete.
    ///
    /// # Safety
    /// After [`begin`](StepBudget::begin) with the same `L`, once the call returned.
    pub(crate) unsafe fn end(&self, L: *mut lua_State, saved: SavedHook) -> Option<Option<String>> {
        self.active.set(false);
        // SAFETY: the call is over; the idle main thread gets its own hook back.
        unsafe { ffi::lua_sethook(L, saved.0, saved.1, saved.2) };
        if !self.spent.replace(false) {
            return None;
        }
        // SAFETY: the call is over; nothing else refers to the location.
        Some(unsafe { (*self.location.get()).take() })
    }
}

/// The instruction-budget hook: called every [`BUDGET_HOOK_PERIOD`] instructions of a thread;
/// fails once the call's budget is spent, then at every instruction (a `pcall` catches one
/// error, not one per instruction outside it). Left on a coroutine after its budgeted call
/// ended, it removes itself.
unsafe extern "C-unwind" fn step_hook(L: *mut lua_State, ar: *mut ffi::lua_Debug) {
    // SAFETY: installed only on threads of VMs built by this crate, which registered their
    // budget state and are alive while their Lua code runs.
    let step = unsafe { BUDGETS.of(L) };
    if !step.active.get() {
        // SAFETY: removing the running thread's hook from inside it is allowed.
        unsafe { ffi::lua_sethook(L, None, 0, 0) };
        return;
    }
    let left = step.left.get();
    if left >= BUDGET_HOOK_PERIOD && !step.spent.get() {
        step.left.set(left - BUDGET_HOOK_PERIOD);
        return;
    }
    if !step.spent.replace(true) {
        // Where the budget ran out: the loop itself, which a later error (raised outside a
        // pcall that caught this one) would not show.
        // SAFETY: `ar` is the hook's activation record, valid for lua_getinfo inside the hook;
        // "Sl" fills `short_src` (NUL-terminated) and `currentline` without allocating.
        let place = unsafe {
            ffi::lua_getinfo(L, c"Sl".as_ptr(), ar);
            let src = std::ffi::CStr::from_ptr((*ar).short_src.as_ptr()).to_string_lossy();
            format!("{src}:{}", (*ar).currentline)
        };
        // SAFETY: no other reference to the location is alive (hooks do not nest, and the
        // host reads it only after the call).
        unsafe { *step.location.get() = Some(place) };
    }
    // SAFETY: raising from a count hook is allowed (Lua's pcalls restore `allowhook`); this
    // frame holds nothing with a destructor, so the longjmp skips a plain old frame.
    unsafe {
        ffi::lua_sethook(L, Some(step_hook), ffi::LUA_MASKCOUNT, 1);
        ffi::lua_pushstring(
            L,
            c"instruction budget spent (Vm::call_with_budget)".as_ptr(),
        );
        ffi::lua_error(L);
    }
}
