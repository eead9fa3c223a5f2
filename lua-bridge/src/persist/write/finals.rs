//! Finalization marks (format 8: [`Final`]): for each table or userdata from bytes that the
//! saving VM had marked for finalization, its place in the order of marking; for each one not
//! marked whose metatable has `__gc` (finalized already and still reachable, or given its
//! `__gc` after `setmetatable`), that it is not. A load marks exactly the objects marked, in
//! that order, so a game continued from a save finalizes the objects the saving process would,
//! in the same order (Lua runs finalizers in the reverse order of marking).
//!
//! The order numbers come from the collector's lists (`luasnap_finalizer_list`), read once at
//! the first marked object written: counted from the object marked first, so an object marked
//! while the save runs (by a `__persist` function) is numbered after the others when the lists
//! are read again, and the numbers given so far stay.

use super::super::format::Final;
use super::csrc::{luasnap_finalizer_list, LS_FINAL_MARKED, LS_FINAL_NONE};
use super::persister::{MarkOrder, Persister};
use mlua_sys::lua_State;
use std::ffi::{c_int, c_void};

impl MarkOrder {
    /// Reads the collector's lists again and numbers the objects it did not know, from the
    /// last marked (the tail of the finalization order) to the first.
    ///
    /// # Safety
    /// `L` is the saving VM's thread; no Lua code runs meanwhile.
    unsafe fn refresh(&mut self, L: *mut lua_State) {
        loop {
            let cap = self.list.capacity();
            // SAFETY: reads the collector's lists into the first `cap` slots of `list`'s
            // buffer (C writes at most cap pointers; none is read before the length is set).
            let n = unsafe { luasnap_finalizer_list(L, self.list.as_mut_ptr(), cap) };
            if n <= cap {
                // SAFETY: the first n slots were written above.
                unsafe { self.list.set_len(n) };
                break;
            }
            self.list.clear();
            self.list.reserve(n);
        }
        for &o in self.list.iter().rev() {
            if let std::collections::hash_map::Entry::Vacant(e) = self.numbers.entry(o) {
                e.insert(self.next);
                self.next += 1;
            }
        }
    }
}

impl Persister<'_> {
    /// Writes the finalization record of the object `o` (a table, or a userdata's header)
    /// whose state `luasnap_final_state` gave as `state`, if it needs one.
    ///
    /// # Safety
    /// `L` is the saving VM's thread, `o` alive; no Lua code runs meanwhile.
    #[inline]
    pub(super) unsafe fn final_record(
        &mut self,
        L: *mut lua_State,
        o: *const c_void,
        state: c_int,
    ) {
        if state == LS_FINAL_NONE {
            return;
        }
        if state != LS_FINAL_MARKED {
            Final(None).encode(&mut self.w);
            return;
        }
        let marks = &mut self.marks;
        if !marks.numbers.contains_key(&o) {
            // SAFETY: callers' contract.
            unsafe { marks.refresh(L) };
        }
        // A marked object is on one of the lists read; should it not be, it is numbered as
        // marked after every other (the loader marks it then), never left unmarked.
        let n = *marks.numbers.entry(o).or_insert_with(|| {
            marks.next += 1;
            marks.next - 1
        });
        Final(Some(n)).encode(&mut self.w);
    }
}
