//! The anchor thread: where the Lua objects of live handles ([`LuaRef`](crate::LuaRef),
//! [`LuaTable`](crate::LuaTable), ...) are kept, so the collector sees them while Rust holds
//! them. `handle.rs` explains why this is rollback-safe.

use crate::bridge::ffi::scrub_above_top;
use mlua_sys::{self as ffi, lua_State};
use std::cell::{Cell, UnsafeCell};
use std::ffi::c_int;

const ANCHORS_KEY: &std::ffi::CStr = c"luasnap.anchors";

/// Slots of the anchor stack scrubbed when it is created (within its initial size, so no
/// reallocation).
const SCRUBBED_AT_START: c_int = 32;

/// The anchor thread of one VM and its slots.
///
/// Invariant: `live` counts the handles alive, each owning one slot of the thread's stack; a
/// free slot below the top is in `free`. When `live` drops to 0 the stack is emptied and its
/// slots scrubbed and `free` cleared, so every snapshot (never taken while a handle lives)
/// sees the same anchor stack, and no slot number survives a rollback. The thread always
/// keeps a spare slot above its top. Used only from the thread that owns the `Vm` (which is
/// not `Send`), never from Lua.
pub(crate) struct Anchors {
    /// Set once when the VM is built, never collected (the registry holds it).
    thread: Cell<*mut lua_State>,
    free: UnsafeCell<Vec<c_int>>,
    live: Cell<usize>,
}

/// Raises a static message. Only plain frames may be skipped (callers' contract).
unsafe fn raise(L: *mut lua_State, msg: &'static str) -> ! {
    // SAFETY: callers' contract; the message is static.
    unsafe {
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_error(L)
    }
}

impl Anchors {
    /// No thread yet: [`install`](Anchors::install) creates it.
    pub(crate) fn new() -> Anchors {
        Anchors {
            thread: Cell::new(std::ptr::null_mut()),
            free: UnsafeCell::new(Vec::new()),
            live: Cell::new(0),
        }
    }

    /// Creates the anchor thread (at build, before any snapshot).
    ///
    /// # Safety
    /// Protected context on the VM's main thread; may raise a memory error.
    pub(crate) unsafe fn install(&self, L: *mut lua_State) {
        // SAFETY: protected context; the registry keeps the thread alive for the VM's life
        // (nothing removes it), and Lua's collector never moves objects.
        unsafe {
            let thread = ffi::lua_newthread(L);
            if ffi::lua_checkstack(thread, SCRUBBED_AT_START) == 0 {
                raise(L, "not enough memory for the anchor thread");
            }
            scrub_above_top(thread, SCRUBBED_AT_START);
            ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, ANCHORS_KEY.as_ptr());
            self.thread.set(thread);
        }
    }

    /// The anchor thread: also the identity of its VM for the handles' arguments.
    pub(crate) fn thread(&self) -> *mut lua_State {
        self.thread.get()
    }

    /// Moves the value on top of `L` into a free anchor slot and returns the slot.
    ///
    /// # Safety
    /// Protected context on a thread of this VM; may raise a memory error.
    pub(crate) unsafe fn anchor_top(&self, L: *mut lua_State) -> c_int {
        let A = self.thread.get();
        // SAFETY: A is the VM's anchor thread (set at build); lua_checkstack does not raise.
        // The free list is only touched by the thread that owns the Vm (Vm is !Send).
        unsafe {
            if ffi::lua_checkstack(A, 2) == 0 {
                raise(L, "not enough memory to anchor a handle");
            }
            ffi::lua_xmove(L, A, 1);
            let free = &mut *self.free.get();
            let slot = match free.pop() {
                Some(slot) => {
                    ffi::lua_copy(A, -1, slot);
                    ffi::lua_settop(A, -2);
                    slot
                }
                None => ffi::lua_gettop(A),
            };
            self.live.set(self.live.get() + 1);
            slot
        }
    }

    /// Pushes the anchored value at `slot` onto `L`.
    ///
    /// # Safety
    /// A live slot of this VM; `L` is a thread of it with a free stack slot. Does not raise.
    pub(crate) unsafe fn push(&self, L: *mut lua_State, slot: c_int) {
        let A = self.thread.get();
        // SAFETY: the anchor thread always keeps a spare slot above its top (checked when the
        // last value was anchored, and its top only shrinks in between).
        unsafe {
            ffi::lua_pushvalue(A, slot);
            ffi::lua_xmove(A, L, 1);
        }
    }

    /// Releases an anchor slot. When no handle is left, the anchor stack is emptied and its
    /// slots cleared, so every snapshot (taken only when no handle exists) sees it in the same
    /// state.
    pub(crate) fn release(&self, slot: c_int) {
        let A = self.thread.get();
        // SAFETY: a live slot; nothing here allocates or raises (a spare slot exists above the
        // top, see `push`). Lua code may be running on the main thread (a handle dropped
        // from a native holding a leaked VM), but never on the anchor thread.
        unsafe {
            ffi::lua_pushnil(A);
            ffi::lua_copy(A, -1, slot);
            ffi::lua_settop(A, -2);
            let live = self.live.get() - 1;
            self.live.set(live);
            let free = &mut *self.free.get();
            if live == 0 {
                // `top` is the high-water mark since the stack was last empty; one more slot
                // was used by `push`.
                let top = ffi::lua_gettop(A);
                ffi::lua_settop(A, 0);
                scrub_above_top(A, top + 1);
                free.clear();
            } else {
                free.push(slot);
            }
        }
    }
}
