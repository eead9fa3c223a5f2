//! The instruction budget of [`Vm::call_with_budget`](crate::Vm::call_with_budget): a counter
//! Lua's VM charges as Lua code calls, loops and returns (`csrc/lua-5.5.1/lvm.h`, patch 6 of
//! `LUASNAP-PATCHES.md`), kept by `csrc/budget.c` in the OS thread, not in the arena.

use crate::bridge::helpers::{luasnap_budget_begin, luasnap_budget_end};
use std::ffi::{c_char, CStr};

/// The Lua error a spent budget raises in the code it stops: what stopped it and what to do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent(&'static CStr);

/// The budget of [`Vm::call_with_budget`](crate::Vm::call_with_budget).
pub(crate) const CALL: Spent = Spent(c"instruction budget spent (Vm::call_with_budget)");

/// The close budget of a dropped VM ([`CLOSE_BUDGET`](crate::CLOSE_BUDGET)).
pub(crate) const CLOSE: Spent = Spent(
    c"instruction budget spent: a dropped VM's finalizers and __close handlers may run \
CLOSE_BUDGET Lua instructions in all; a finalizer that needs more (or never ends) \
must run before the drop, under a budget you choose: clear the references to its object and \
collect the garbage in a budgeted call",
);

/// What a budgeted call left: whether it spent its budget, how much it charged, and where
/// Lua code was when the budget ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The call used up its budget (even if a `pcall` in the callee swallowed the error it
    /// raised): what the call did is incomplete.
    pub spent: bool,
    /// Instructions charged, as `lvm.h` counts them; at most the budget.
    pub used: u64,
    /// `chunk:line` of the first stop, if the budget was spent inside Lua code.
    pub location: Option<String>,
}

/// The budget running on this OS thread, from [`RunningBudget::begin`] to
/// [`RunningBudget::end`].
///
/// Invariant: at most one per OS thread (`luasnap_budget_begin` refuses a second), and it is
/// always ended, by `end` or when dropped (a panic out of the call cannot leave the thread's
/// Lua code charged against a budget nobody reads).
pub(crate) struct RunningBudget {
    budget: u64,
    ended: bool,
}

impl RunningBudget {
    /// Starts a budget of `budget` instructions for all Lua code this OS thread runs, whose
    /// error names what stopped the code ([`CALL`], [`CLOSE`]); `None` if one is running
    /// already (a budgeted call from inside another).
    pub(crate) fn begin(budget: u64, spent: Spent) -> Option<RunningBudget> {
        // SAFETY: changes only the calling thread's budget state in the C helpers; the
        // message is a static string, alive after the budget ends.
        let started = unsafe { luasnap_budget_begin(budget, spent.0.as_ptr()) } != 0;
        started.then_some(RunningBudget {
            budget,
            ended: false,
        })
    }

    /// Ends the budget; the thread's Lua code runs unbounded again.
    pub(crate) fn end(mut self) -> Outcome {
        self.finish()
    }

    fn finish(&mut self) -> Outcome {
        self.ended = true;
        let mut used = 0u64;
        let mut place = [0 as c_char; 96];
        // SAFETY: `place` is writable for its length and `used` for a u64; this thread's
        // budget was begun by `begin` with the same `budget` and not ended yet.
        let spent =
            unsafe { luasnap_budget_end(self.budget, &mut used, place.as_mut_ptr(), place.len()) }
                != 0;
        // SAFETY: luasnap_budget_end writes a NUL-terminated string within the length given.
        let place = unsafe { CStr::from_ptr(place.as_ptr()) }.to_string_lossy();
        Outcome {
            spent,
            used,
            location: (spent && !place.is_empty()).then(|| place.into_owned()),
        }
    }
}

impl Drop for RunningBudget {
    fn drop(&mut self) {
        if !self.ended {
            self.finish();
        }
    }
}
