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

use super::super::format::{After, Final, Pending};
use super::super::slots::Slots;
use super::csrc::{
    luasnap_finalizer_list, luasnap_push_finalizable, LS_FINAL_MARKED, LS_FINAL_NONE,
};
use super::persister::{Fail, MarkOrder, Persister};
use mlua_sys::{self as ffi, lua_State};
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

impl Persister<'_> {
    /// After the root of a whole-game save: writes the objects awaiting finalization that the
    /// root did not reach ([`Pending`]: dropped since the last collection point, or separated
    /// for finalization and not yet finalized), in the collector's order; nothing if there are
    /// none. A userdata the writer could only refuse (neither plain data nor given a
    /// `__persist` field: a closed file handle the game dropped) is left out, as a save
    /// before format 9 left every such object out: its finalizer then runs in the saving
    /// process only.
    ///
    /// # Safety
    /// Protected (see the module docs of `write`), the root written (no frame left), the
    /// collector stopped (**Alive**).
    pub(super) unsafe fn pending_finalizers(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract: no Lua code runs while the lists are read.
        unsafe { self.marks.refresh(L) };
        let list = std::mem::take(&mut self.marks.list);
        // SAFETY: Protected: a table anchoring the objects to write, so that Lua code a
        // `__persist` function runs (a full collection it asks for) cannot free one.
        unsafe { ffi::lua_createtable(L, 0, 0) };
        let mut n = 0;
        for &o in &list {
            // SAFETY: o comes from the lists just read, with no Lua code run since (the
            // object is alive); room for the value pushed and, below, its metatable.
            if unsafe { luasnap_push_finalizable(L, o) } == 0 {
                continue;
            }
            // SAFETY: the object is on top.
            let p = unsafe { ffi::lua_topointer(L, -1) };
            // SAFETY: the object is on top; the table anchoring them below it.
            unsafe {
                if self.unwritten(p) && self.pending_writable(L) {
                    n += 1;
                    ffi::lua_rawseti(L, -2, n);
                } else {
                    ffi::lua_pop(L, 1);
                }
            }
        }
        self.marks.list = list;
        if n > 0 {
            self.w.buf.push(After::Pending as u8);
            Pending(n as u64).encode(&mut self.w);
        }
        for i in 1..=n {
            // SAFETY: Protected; the object anchored at i (a reference if written meanwhile,
            // as something an earlier one holds).
            unsafe {
                ffi::lua_rawgeti(L, -1, i);
                self.value(L, s)?;
                while !self.sc.frames.is_empty() {
                    self.advance(L, s)?;
                }
            }
        }
        // SAFETY: the anchoring table is on top.
        unsafe { ffi::lua_pop(L, 1) };
        Ok(())
    }

    /// Whether the table or userdata on top, awaiting finalization, goes in the save: a
    /// table always, a userdata if it is plain data of a registered type or its metatable
    /// has a `__persist` field (the ways the writer has to write one).
    ///
    /// # Safety
    /// Protected (pushes a string); a table or full userdata on top, room for two values.
    unsafe fn pending_writable(&mut self, L: *mut lua_State) -> bool {
        // SAFETY: callers' contract; what is pushed is popped.
        unsafe {
            if ffi::lua_type(L, -1) == ffi::LUA_TTABLE {
                return true;
            }
            if ffi::lua_getmetatable(L, -1) == 0 {
                return false;
            }
            let mt = ffi::lua_topointer(L, -1);
            let size = ffi::lua_rawlen(L, -2);
            let plain = self
                .types
                .iter()
                .any(|t| t.metatable == mt && t.size == size);
            ffi::lua_pushstring(L, self.spkey.as_ptr());
            let persist = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
            ffi::lua_pop(L, 2);
            plain || persist
        }
    }
}
