//! Finalization marks (format 8: [`Final`]): which objects the load marks for finalization,
//! and in what order. A file of format 8 says, for each table or userdata from bytes that the
//! saving VM had marked, where it stood in the order of marking, and for each one not marked
//! whose metatable has `__gc`, that it is not; the load marks exactly the objects marked, in
//! that order, when it ends (`luasnap_finalizers_restore`, Lua patch 8's
//! `luaC_markfinalizers`), and sets every metatable from the file without marking anything
//! (`luasnap_setmetatable_unmarked`, `LS_BUILD_UNMARKED`). So an object finalized already
//! (resurrected, still held) or whose metatable got its `__gc` after `setmetatable` is not
//! finalized after the load, as it is not in the saving VM, and finalizers run in the saving
//! VM's order. Objects the game's own code builds during the load (a `__persist` rebuild),
//! which no record describes, are marked when their metatable has `__gc` when the load ends,
//! as every object was before format 8.
//!
//! Checked as every field of a file is: a record precedes a new table or userdata from bytes
//! (`Final::decode`, and [`Loader::register`] refuses one left for another object), once per
//! object, its order numbers distinct; a load that refuses finalizers refuses a record that
//! marks. A record that marks an object whose metatable has no `__gc`, or has none, is a
//! state Lua itself reaches (an object keeps its mark when its metatable loses `__gc`; Lua
//! then calls nothing): such an object is marked, and finalizing it calls nothing unless the
//! game gives its metatable a `__gc` later.
//!
//! Invariant: `Finals::next` is `Some` only between a `Final` record and the table or
//! userdata it precedes, taken when that object is made ([`Loader::take_final`]).

use super::csrc::luasnap_finalizers_restore;
use super::loader::{Fail, Loader};
use super::meta::NO_FINALIZERS;
use crate::persist::format::{Final, Pending};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

impl Loader<'_> {
    /// A finalization record (after `Tag::Final`), for the new table or userdata whose tag
    /// comes next (after its identity, if it has one): checked and kept until it is made.
    pub(super) fn final_mark(&mut self) -> Result<(), Fail> {
        if self.format < 8 {
            return Err(self.malformed("a finalization mark in a file of format 7 or older"));
        }
        if self.finals.next.is_some() {
            return Err(self.malformed("a finalization mark before a finalization mark"));
        }
        let decoded = Final::decode(&mut self.r);
        let mark = self.record(decoded)?;
        if mark.0.is_some() && self.refuses_finalizers() {
            return Err(self.fail(NO_FINALIZERS));
        }
        self.finals.next = Some(mark);
        Ok(())
    }

    /// The objects awaiting finalization after the root ([`Pending`], format 9 on): each read
    /// as a value (anchored, as every object read, in the objects table until the load
    /// ends), checked to be a table or userdata, and dropped, so that nothing but the
    /// collector's lists reaches it after the load. Their marks come from their `Final`
    /// records (`restore_finalizers`). One that is not marked, or one written already (a
    /// reference), changes nothing: the first is garbage, the second is reachable anyway.
    ///
    /// # Safety
    /// As [`Loader::run`], with the root on top.
    pub(super) unsafe fn pending_finalizers(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let decoded = Pending::decode(&mut self.r);
        let Pending(n) = self.record(decoded)?;
        for _ in 0..n {
            // SAFETY: callers' contract; the value read is left on top, and popped.
            unsafe {
                self.walk(L, s)?;
                let t = ffi::lua_type(L, -1);
                ffi::lua_settop(L, -2);
                if t != ffi::LUA_TTABLE && t != ffi::LUA_TUSERDATA {
                    return Err(self.malformed(
                        "an object awaiting finalization that is not a table or userdata",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The table or userdata `id`, just made, takes the record before it, if any.
    pub(super) fn take_final(&mut self, id: u32) {
        match self.finals.next.take() {
            Some(Final(Some(n))) => self.finals.marked.push((n, id)),
            Some(Final(None)) => self.finals.unmarked.push(id),
            None => {}
        }
    }

    /// Whether a record waits for an object (one that is not a table or userdata from bytes
    /// must not take it: see [`Loader::register`]).
    pub(super) fn final_waiting(&self) -> bool {
        self.finals.next.is_some()
    }

    /// The flags of `luasnap_table_build` for this load (csrc/luasnap.h: `LS_BUILD_NOFINAL`,
    /// `LS_BUILD_UNMARKED`).
    pub(super) fn build_finals(&self) -> c_int {
        let refuse = self.refuses_finalizers() as c_int;
        let unmarked = (self.format >= 8) as c_int;
        refuse | (unmarked << 1)
    }

    /// When a load of format 8 that allows finalizers ends well: marks the objects the file
    /// marks, in its order, then those the game's code built during the load whose metatable
    /// has `__gc` now (see the module docs).
    ///
    /// # Safety
    /// Protected context, a free slot; `s` this load's slots; the walk and the initializers
    /// are over.
    pub(super) unsafe fn restore_finalizers(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let mut marked = std::mem::take(&mut self.finals.marked);
        let unmarked = std::mem::take(&mut self.finals.unmarked);
        marked.sort_unstable();
        if marked.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(self.malformed("two objects in one place of the order of finalization"));
        }
        let ids: Vec<u32> = marked.iter().map(|&(_, id)| id).collect();
        let mut scratch: Vec<*mut c_void> =
            vec![std::ptr::null_mut(); ids.len().max(unmarked.len())];
        // SAFETY: callers' contract: s.objs holds every object read, anchored at s.objs (the
        // load's first table); the id lists name objects read (taken as each was made);
        // scratch has room for the longer list; clears the no-finalizer bit only if this load
        // set it.
        let ok = unsafe {
            luasnap_finalizers_restore(
                L,
                s.objs,
                s.objs,
                ids.as_ptr(),
                ids.len() as c_int,
                unmarked.as_ptr(),
                unmarked.len() as c_int,
                self.nofinal_marked as c_int,
                scratch.as_mut_ptr(),
            )
        };
        if ok == 0 {
            // A game function the load ran (a rebuild, an initializer) marked an object the
            // file marks, or gave it to the collector's lists otherwise.
            return Err(self.fail(
                "the save-game marks an object for finalization that the load cannot mark (the game's code run by the load marked it already)",
            ));
        }
        Ok(())
    }
}
