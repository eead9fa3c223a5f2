//! Per-VM state that C callbacks find from a `lua_State`.
//!
//! Lua calls back into Rust (a native's trampoline, a count hook, the warn function) with a
//! `lua_State` and nothing else, so the Rust state such a callback needs must be found from
//! it. Nothing VM-specific from the Rust heap may be stored in the Lua heap: a Rust address
//! would make two otherwise identical VMs differ byte for byte. The key is therefore the VM's
//! arena base address, which Lua already holds as its allocator's `ud`.
//!
//! Each module whose callbacks need state keeps a [`PerVm`] table of its own: the natives
//! (`natives.rs`), the instruction budget (`budget.rs`), the warn function (`warn.rs`), the
//! save-game loader's budget (`persist/budget.rs`). So each part is owned by its module, which
//! states its invariant at its type, and no module reaches another's part.

use mlua_sys::{self as ffi, lua_State};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// VMs alive at once in a process.
pub(crate) const MAX_VMS: usize = 4096;

/// One state of type `T` per live VM, found by the VM's arena base.
///
/// Invariant: a slot whose `base` is neither 0 (free) nor `usize::MAX` (being claimed or
/// released) points to a `T` that lives until the slot is released, which only the
/// [`Registered`] guard owning that `T` does, when it is dropped.
pub(crate) struct PerVm<T: 'static> {
    slots: [Slot<T>; MAX_VMS],
}

struct Slot<T> {
    base: AtomicUsize,
    state: AtomicPtr<T>,
}

impl<T> PerVm<T> {
    /// An empty table (for a `static`).
    pub(crate) const fn new() -> Self {
        PerVm {
            slots: [const {
                Slot {
                    base: AtomicUsize::new(0),
                    state: AtomicPtr::new(std::ptr::null_mut()),
                }
            }; MAX_VMS],
        }
    }

    /// Registers `state` for the VM whose arena starts at `base`, until the returned guard is
    /// dropped. `None` when [`MAX_VMS`] VMs are registered already.
    ///
    /// Panics if a state is registered for `base` already: a VM must release its registrations
    /// before its arena is unmapped (a new VM may be mapped at the same base at once), or the
    /// new VM's callbacks would find the old VM's state.
    pub(crate) fn register(&'static self, base: usize, state: T) -> Option<Registered<T>> {
        assert!(
            !self
                .slots
                .iter()
                .any(|s| s.base.load(Ordering::Acquire) == base),
            "a VM at {base:#x} is registered already: its arena was unmapped before its registrations were released"
        );
        let slot = self.slots.iter().position(|s| {
            s.base
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let state = Box::into_raw(Box::new(state));
        self.slots[slot].state.store(state, Ordering::Release);
        self.slots[slot].base.store(base, Ordering::Release);
        Some(Registered {
            table: self,
            slot,
            state,
        })
    }

    /// The state of the VM whose arena starts at `base`.
    ///
    /// # Safety
    /// That VM registered its state here, and its guard lives for `'a`; the caller runs on the
    /// thread that runs the VM (a `Vm` is not `Send`).
    pub(crate) unsafe fn by_base<'a>(&self, base: usize) -> &'a T {
        for s in &self.slots {
            if s.base.load(Ordering::Acquire) == base {
                // SAFETY: a registered slot points to its live state (the type's invariant),
                // which lives for 'a (caller's contract).
                return unsafe { &*s.state.load(Ordering::Acquire) };
            }
        }
        unreachable!("a luasnap VM registers its state before it runs Lua")
    }

    /// The state of the VM that owns `L`.
    ///
    /// # Safety
    /// `L` is a thread of a VM built by this crate that registered its state here; as for
    /// [`by_base`](PerVm::by_base).
    pub(crate) unsafe fn of<'a>(&self, L: *mut lua_State) -> &'a T {
        // SAFETY: forwarded from the caller.
        unsafe { self.by_base(arena_base(L)) }
    }
}

/// The arena base of the VM that owns `L` (the `ud` of its allocator).
///
/// # Safety
/// `L` is a thread of a VM built by this crate.
pub(crate) unsafe fn arena_base(L: *mut lua_State) -> usize {
    let mut ud = std::ptr::null_mut();
    // SAFETY: reads the allocator's ud from a valid state.
    unsafe { ffi::lua_getallocf(L, &mut ud) };
    ud as usize
}

/// A state registered in a [`PerVm`] table. It owns the state (on the heap, so its address
/// never changes) and releases the slot when dropped: drop it only after the VM's Lua state is
/// closed, when no callback can run any more.
pub(crate) struct Registered<T: 'static> {
    table: &'static PerVm<T>,
    slot: usize,
    /// From `Box::into_raw`; freed in `drop`. Kept as a raw pointer, not a `Box`, because
    /// callbacks hold references to it that a `Box`'s uniqueness would not allow.
    state: *mut T,
}

impl<T> std::ops::Deref for Registered<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the state lives until `drop`; only shared references are ever made to it.
        unsafe { &*self.state }
    }
}

impl<T> Drop for Registered<T> {
    fn drop(&mut self) {
        let s = &self.table.slots[self.slot];
        s.base.store(usize::MAX, Ordering::Release);
        s.state.store(std::ptr::null_mut(), Ordering::Release);
        s.base.store(0, Ordering::Release);
        // SAFETY: from Box::into_raw in `register`; the slot no longer points to it, and the
        // VM's Lua state is closed (this type's contract), so no reference to it remains.
        drop(unsafe { Box::from_raw(self.state) });
    }
}
