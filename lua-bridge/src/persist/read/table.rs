//! Tables on the general path: a table's header, then its parts (`TablePart`): its
//! metatable, then key-value pairs until `Nil` or `Tag::Layout` in key position. Runs of plain entries go through batches
//! instead (`build.rs`); the layout that ends a table is placed by `layout.rs`.
//!
//! Invariant: a table frame with `at > 0` has its table at stack index `at` and its current
//! key at `at + 1`, with the values of the frames above it stacked after them; so a frame's
//! table is always on the stack while its entries arrive, and a frame past `STACK_FRAMES`
//! (`at == 0`) uses the id tables instead, so deep nesting never exhausts the Lua stack.

use super::csrc::luasnap_rawset_charged;
use super::frame::Frame;
use super::ids::push_obj;
use super::limits::{COLLISIONS, STACK_FRAMES};
use super::loader::{Fail, Loader};
use crate::persist::format::{TableHeader, TablePart, Tag};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

impl Loader<'_> {
    /// A table (after `Tag::Table`): made at its hinted sizes (capped: see
    /// [`Loader::table_sizes`]), registered, and its frame pushed. Returns false (a frame).
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn table(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        let id = self.id();
        self.take_final(id);
        let header = TableHeader::decode(&mut self.r);
        let TableHeader { narr, nhash } = self.record(header)?;
        let (narr, nhash) = self.table_sizes(narr, nhash);
        // SAFETY: callers' contract; the sizes are within the load's preallocation budget.
        unsafe { ffi::lua_createtable(L, narr, nhash) };
        // SAFETY: callers' contract; the table is on top.
        unsafe { self.register(L, s, id)? };
        let at = if self.frames.len() < STACK_FRAMES {
            // SAFETY: a free slot (callers' contract): the key slot, above the table.
            unsafe {
                ffi::lua_pushnil(L);
                ffi::lua_gettop(L) - 1
            }
        } else {
            // SAFETY: pops the table, kept in objs only.
            unsafe { ffi::lua_settop(L, -2) };
            0
        };
        self.frames.push(Frame::Table {
            id,
            stage: TablePart::Metatable,
            at,
        });
        Ok(false)
    }

    /// Moves a table frame on (`id`, at `stage`, `at` as in [`Frame::Table`]): between
    /// entries, a batch of plain entries, or the end marker (with its layout); else the next
    /// child through the general path.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots; the table's frame on top of the frame stack.
    #[inline(always)]
    pub(super) unsafe fn advance_table(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        stage: TablePart,
        at: c_int,
    ) -> Result<bool, Fail> {
        if stage == TablePart::Key {
            // SAFETY: callers' contract; the frame is between entries, its table at `at`.
            if at > 0 && unsafe { self.plain_entries(L, s, at)? } {
                // Frames may have been pushed: on from the top one.
                return Ok(false);
            }
            // End of entries (with the hash part's layout, or without)?
            let end = self.r.peek();
            if end == Some(Tag::Nil as u8) || end == Some(Tag::Layout as u8) {
                self.r.pos += 1;
                if end == Some(Tag::Layout as u8) {
                    if self.format < 5 {
                        return Err(self.malformed("a table layout (format 5) in an older file"));
                    }
                    // SAFETY: callers' contract; objs[id] is this table, all its entries set.
                    unsafe { self.apply_layout(L, s, id)? };
                }
                if at > 0 {
                    self.frames.pop();
                    // SAFETY: drops the key slot: the table at `at` is the completed value.
                    unsafe { ffi::lua_settop(L, at) };
                    return Ok(true);
                }
                // SAFETY: callers' contract; objs[id] is this table.
                return Ok(unsafe { self.finish(L, s, id) });
            }
        }
        // SAFETY: callers' contract.
        unsafe { self.value(L, s) }
    }

    /// The child on top is the table's metatable, key or value (`was`: what the frame
    /// expected); `depth` is the frame's depth (its key's slot in `keys` if `at` is 0).
    ///
    /// # Safety
    /// Protected context, two free slots; the child on top (popped); `s` this load's slots.
    pub(super) unsafe fn accept_table(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        was: TablePart,
        at: c_int,
        depth: usize,
    ) -> Result<(), Fail> {
        match was {
            // SAFETY: callers' contract.
            TablePart::Metatable => unsafe { self.table_metatable(L, s, id, at) },
            TablePart::Key if at > 0 => {
                // SAFETY: the key slot of the frame is at `at + 1` (see the file's invariant).
                unsafe { ffi::lua_replace(L, at + 1) };
                Ok(())
            }
            TablePart::Key => {
                // SAFETY: s.keys is the keys table; stores the key (may allocate: protected).
                unsafe { ffi::lua_rawseti(L, s.keys, depth as ffi::lua_Integer) };
                Ok(())
            }
            // SAFETY: callers' contract.
            TablePart::Value => unsafe { self.set_entry(L, s, id, at, depth) },
        }
    }

    /// Sets the entry whose value is on top (popped) and whose key is the frame's.
    ///
    /// # Safety
    /// As [`Loader::accept_table`].
    unsafe fn set_entry(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        at: c_int,
        depth: usize,
    ) -> Result<(), Fail> {
        let memo = self.memo.as_mut_ptr().cast();
        if at > 0 {
            // SAFETY: [.., v] -> [.., k, v] with the key from the frame's slot; the charged
            // rawset raises on a nil or NaN key (a malformed file, in the protected call) and
            // pops both; the memo is the loader's (luasnap_relayout_memo_size() bytes).
            let rc = unsafe {
                ffi::lua_pushvalue(L, at + 1);
                ffi::lua_rotate(L, -2, 1);
                luasnap_rawset_charged(L, at, memo)
            };
            if rc < 0 {
                return Err(self.fail(COLLISIONS));
            }
            return Ok(());
        }
        // SAFETY: as above, with the table and key from the id tables: [.., v] -> [t, k, v],
        // then the table popped.
        let rc = unsafe {
            push_obj(L, s, id);
            ffi::lua_rawgeti(L, s.keys, depth as ffi::lua_Integer);
            ffi::lua_rotate(L, -3, -1);
            let rc = luasnap_rawset_charged(L, -3, memo);
            ffi::lua_settop(L, -2);
            rc
        };
        if rc < 0 {
            return Err(self.fail(COLLISIONS));
        }
        Ok(())
    }
}
