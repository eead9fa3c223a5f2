//! The instruction budget and heap-growth cap of the Lua code a save-game load runs (`__persist`
//! rebuild and init functions, constructors): per VM, charged by a count hook, and shared by
//! loads nested through `eris.unpersist` in a load-time call.

use super::options::LoadOptions;
use crate::bridge::error::VmError;
use crate::bridge::helpers::{luasnap_heap_bytes, luasnap_register_load_hook};
use crate::bridge::per_vm::PerVm;
use crate::bridge::vm::Vm;
use mlua_sys::{self as ffi, lua_State};
use std::cell::Cell;

/// Instructions between two calls of the budget hook.
const PERIOD: u64 = 1000;

/// The limits of the loads running in one VM.
///
/// Invariant: `loading` counts the loads in progress. While it is 0 the hook removes itself
/// and `heap_cap` is `u64::MAX`. A nested load starts with at most what the outer load has
/// left, of both budget and cap, and when it ends the outer load gets its hook and what is
/// left back: loaded code cannot lift a limit by loading again. Changed only by
/// [`LoadBudget::begin`] and [`LoadBudget::end`] around a load, and by the hook.
pub(crate) struct LoadBudget {
    /// Instructions Lua code may still run during the load.
    budget: Cell<u64>,
    /// Loads in progress.
    loading: Cell<u32>,
    /// The heap size (bytes) past which the load fails (`u64::MAX`: none).
    heap_cap: Cell<u64>,
    /// Whether the heap grew past `heap_cap` since the outermost load began (what failed
    /// the load, typed as [`LoadError::NeedsMoreMemory`](super::LoadError::NeedsMoreMemory)).
    over_cap: Cell<bool>,
}

/// What [`LoadBudget::end`] restores: the limits of the load around this one, if any.
pub(crate) struct Outer {
    loads: u32,
    budget: u64,
    heap_cap: u64,
    /// The budget this load started with.
    given: u64,
}

static BUDGETS: PerVm<LoadBudget> = PerVm::new();

/// Registers the loads' limits of `vm` (the save-game extension's install), kept until the
/// VM is dropped.
pub(crate) fn register(vm: &mut Vm) -> Result<(), VmError> {
    let part = BUDGETS
        .register(
            vm.arena_base(),
            LoadBudget {
                budget: Cell::new(0),
                loading: Cell::new(0),
                heap_cap: Cell::new(u64::MAX),
                over_cap: Cell::new(false),
            },
        )
        .ok_or_else(|| VmError::Conversion {
            what: "a new VM: too many VMs alive in this process (4096); drop some first".into(),
        })?;
    vm.keep(Box::new(part));
    Ok(())
}

impl LoadBudget {
    /// The loads' limits of the VM that owns `L`.
    ///
    /// # Safety
    /// `L` is a thread of a live VM built by this crate, on the thread that runs it; the
    /// reference does not outlive the VM.
    pub(crate) unsafe fn of<'a>(L: *mut lua_State) -> &'a LoadBudget {
        // SAFETY: every VM with save-games registers its limits when it is built (caller's
        // contract).
        unsafe { BUDGETS.of(L) }
    }

    /// The heap size past which the running load fails.
    pub(crate) fn heap_cap(&self) -> u64 {
        self.heap_cap.get()
    }

    /// Notes that the heap grew past the load's cap (the load fails for it).
    pub(crate) fn note_over_cap(&self) {
        self.over_cap.set(true);
    }

    /// Whether the heap grew past a load's cap since the outermost load began.
    pub(crate) fn was_over_cap(&self) -> bool {
        self.over_cap.get()
    }

    /// Charges `n` instructions of work done outside Lua code (compiling a save's text) to
    /// the running load's budget; false, with the budget spent, if it had less left.
    pub(crate) fn charge(&self, n: u64) -> bool {
        let left = self.budget.get();
        self.budget.set(left.saturating_sub(n));
        left >= n
    }

    /// Starts a load with `opts`'s limits, within what an outer load has left, and puts the
    /// hook on `L`.
    ///
    /// # Safety
    /// `L` is the loading thread of this VM; [`end`](LoadBudget::end) follows the load.
    pub(crate) unsafe fn begin(&self, L: *mut lua_State, opts: &LoadOptions) -> Outer {
        let loads = self.loading.get();
        let (outer_budget, outer_cap) = (self.budget.get(), self.heap_cap.get());
        let budget = if loads > 0 {
            outer_budget.min(opts.instruction_budget)
        } else {
            opts.instruction_budget
        };
        // SAFETY: reads counters of the global state.
        let start = unsafe { luasnap_heap_bytes(L) };
        let cap = opts
            .max_heap_growth
            .map_or(u64::MAX, |g| start.saturating_add(g as u64));
        if loads == 0 {
            self.over_cap.set(false);
        }
        self.loading.set(loads + 1);
        self.budget.set(budget);
        self.heap_cap
            .set(if loads > 0 { cap.min(outer_cap) } else { cap });
        // SAFETY: a thread of this VM (caller's contract).
        unsafe { install_budget_hook(L) };
        Outer {
            loads,
            budget: outer_budget,
            heap_cap: outer_cap,
            given: budget,
        }
    }

    /// Ends a load: the outer load (if any) gets its hook back with what it had left minus
    /// what this load used; after the outermost load, the hook goes. Returns whether this was
    /// the outermost load.
    ///
    /// # Safety
    /// After [`begin`](LoadBudget::begin) with the same `L`, once the load is over.
    pub(crate) unsafe fn end(&self, L: *mut lua_State, outer: Outer) -> bool {
        let used = outer.given - self.budget.get().min(outer.given);
        self.loading.set(outer.loads);
        if outer.loads > 0 {
            self.budget.set(outer.budget.saturating_sub(used));
            self.heap_cap.set(outer.heap_cap);
            // SAFETY: a thread of this VM (caller's contract).
            unsafe { install_budget_hook(L) };
            false
        } else {
            self.heap_cap.set(u64::MAX);
            // SAFETY: as above; removing the hook the load put on.
            unsafe { ffi::lua_sethook(L, None, 0, 0) };
            true
        }
    }
}

/// Budget hook: every [`PERIOD`] instructions of Lua code during a load. Left on a thread after
/// its load ended (a coroutine created during the load inherits it), it removes itself.
unsafe extern "C-unwind" fn budget_hook(L: *mut lua_State, _ar: *mut ffi::lua_Debug) {
    // SAFETY: installed only on VMs built by this crate, which registered their limits.
    let limits = unsafe { LoadBudget::of(L) };
    if limits.loading.get() == 0 {
        // SAFETY: removing the running thread's hook from inside it is allowed.
        unsafe { ffi::lua_sethook(L, None, 0, 0) };
        return;
    }
    let left = limits.budget.get();
    if left < PERIOD {
        // From now on, fail at every instruction: Lua code can catch one error (a loop of
        // pcalls would go on for ever), but not one at each instruction outside its pcalls.
        // SAFETY: raising from a count hook is allowed; nothing to drop here.
        unsafe {
            ffi::lua_sethook(L, Some(budget_hook), ffi::LUA_MASKCOUNT, 1);
            ffi::lua_pushstring(L, c"save-game load exceeded its instruction budget (a __persist rebuild or init function runs too long)".as_ptr());
            ffi::lua_error(L);
        }
    }
    limits.budget.set(left - PERIOD);
    // SAFETY: reads two counters of the global state.
    if unsafe { luasnap_heap_bytes(L) } > limits.heap_cap.get() {
        limits.budget.set(0); // and fail at every instruction from now on
        limits.note_over_cap();
        // SAFETY: as above.
        unsafe {
            ffi::lua_sethook(L, Some(budget_hook), ffi::LUA_MASKCOUNT, 1);
            ffi::lua_pushstring(L, c"save-game load exceeded its heap-growth cap (LoadOptions::max_heap_growth, eris.settings(\"maxgrowth\"))".as_ptr());
            ffi::lua_error(L);
        }
    }
}

/// Whether the budget hook is still installed on `L` as a load installs it.
///
/// # Safety
/// `L` is a valid thread.
pub(crate) unsafe fn budget_hook_intact(L: *mut lua_State) -> bool {
    // SAFETY: queries only.
    unsafe {
        ffi::lua_gethook(L).map(|h| h as *const () as usize)
            == Some(budget_hook as *const () as usize)
            && ffi::lua_gethookmask(L) == ffi::LUA_MASKCOUNT
            && matches!(ffi::lua_gethookcount(L), 1 | 1000)
    }
}

/// Installs the budget hook on `L`.
///
/// # Safety
/// `L` is a valid thread of a VM of this crate.
unsafe fn install_budget_hook(L: *mut lua_State) {
    // SAFETY: callers' contract; the hook is a function that lives as long as the program
    // (registered so that finalizers run under it: csrc/budget.c, Lua patch 8).
    unsafe {
        luasnap_register_load_hook(Some(budget_hook));
        ffi::lua_sethook(L, Some(budget_hook), ffi::LUA_MASKCOUNT, PERIOD as i32)
    };
}
