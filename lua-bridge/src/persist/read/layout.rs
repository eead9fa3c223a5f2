//! Table layouts (format 5): the hash part of a table as it was saved, so `next` visits the
//! loaded table's entries in the saved order. The blob's records (`LayoutHeader`,
//! `LayoutNode`, `RemovedKey`) are in `format/layout.rs`, with the batch decoder's
//! `layout_nodes`.
//!
//! The decoders only check the blob's shape (sizes, codes and links inside the node count,
//! every byte used); the C side (`luasnap_table_relayout`, or the build helper's `LAYOUT`
//! step) checks the layout against the table's entries and places nothing unless it matches,
//! so a forged layout can only make a load fail.

use super::csrc::reserve;
use super::csrc::{luasnap_relayout_scratch, luasnap_table_nodes, luasnap_table_relayout};
use super::ids::push_obj;
use super::limits::COLLISIONS;
use super::loader::{Fail, Loader};
use crate::persist::format::{LayoutHeader, LayoutNode, Reader, RemovedKey, BAD_LAYOUT};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_void;

impl Loader<'_> {
    /// Scratch for placing a layout of `size` nodes, for the C side (grown, never shrunk).
    pub(super) fn scratch_for(&mut self, size: u32) -> *mut c_void {
        // SAFETY: a pure size computation.
        let words = unsafe { luasnap_relayout_scratch(size) }.div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        self.scratch.as_mut_ptr().cast()
    }

    /// Reads a table's layout (after `Tag::Layout`) and puts the entries of the table
    /// objs[id], complete now, into the nodes it gives (`luasnap_table_relayout`, which
    /// checks it against the table), so `next` visits them in the saved order.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots; objs[id] is a table.
    pub(super) unsafe fn apply_layout(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
    ) -> Result<(), Fail> {
        let Some(blob) = self.r.bytes() else {
            return Err(self.malformed("truncated table layout"));
        };
        let mut r = Reader::new(blob);
        let Some(LayoutHeader {
            seed,
            size,
            lastfree,
        }) = LayoutHeader::decode(&mut r, blob.len())
        else {
            return Err(self.malformed(BAD_LAYOUT));
        };
        // A layout for another node count does not apply (the table keeps the order its
        // insertions gave it, as luasnap_table_relayout would decide): skipped before its
        // nodes are read into host memory (about 60 bytes a node with the scratch), so that
        // memory is bounded by the heap the table takes (under the load's growth cap), not
        // by what the file claims (an attacker's 4 MB file took 273 MB outside the cap).
        // SAFETY: callers' contract.
        if unsafe { table_nodes(L, s, id) } != size {
            return Ok(());
        }
        // SAFETY: callers' contract.
        let nkeys = unsafe { self.read_nodes(L, &mut r, size)? };
        if r.pos != blob.len() {
            return Err(self.malformed(BAD_LAYOUT));
        }
        let scratch = self.scratch_for(size);
        // SAFETY: protected context; objs[id] is the table (callers' contract); lay and laynx
        // hold `size` entries, scratch the bytes the C side asks for, the memo is the
        // loader's; the keys table (if any) is on top. The C side checks everything else and
        // neither allocates nor raises. Pops the table and the keys.
        let rc = unsafe {
            reserve(L, 3);
            push_obj(L, s, id);
            let rc = luasnap_table_relayout(
                L,
                -1,
                self.lay.as_ptr(),
                self.laynx.as_ptr(),
                size,
                lastfree,
                seed,
                if nkeys > 0 { -2 } else { 0 },
                scratch,
                self.memo.as_mut_ptr().cast(),
            );
            ffi::lua_settop(L, if nkeys > 0 { -3 } else { -2 });
            rc
        };
        if rc < 0 && self.collisions_over() {
            return Err(self.fail(COLLISIONS));
        }
        if rc < 0 {
            return Err(self.malformed(
                "a table's layout does not match its entries (a damaged or forged file; \
                 nothing was placed)",
            ));
        }
        Ok(())
    }

    /// Reads a layout's `size` nodes into `lay`/`laynx`; the removed entries' keys go to a
    /// table (keys[1..]) for the C side, left on top if there are any. Returns their number.
    ///
    /// # Safety
    /// Protected context.
    unsafe fn read_nodes(
        &mut self,
        L: *mut lua_State,
        r: &mut Reader<'_>,
        size: u32,
    ) -> Result<ffi::lua_Integer, Fail> {
        self.lay.clear();
        self.laynx.clear();
        let mut nkeys = 0;
        for _ in 0..size {
            let Some(node) = LayoutNode::decode(r, size) else {
                return Err(self.malformed(BAD_LAYOUT));
            };
            if node.code == LayoutNode::REMOVED {
                // SAFETY: callers' contract.
                unsafe { self.removed_key(L, r, &mut nkeys)? };
            }
            self.lay.push(node.code);
            self.laynx.push(node.link);
        }
        Ok(nkeys)
    }

    /// A removed node's dead key (after its code): appended to the keys table on top, made
    /// at the first one (`nkeys` 0).
    ///
    /// # Safety
    /// Protected context; the keys table on top if `nkeys` > 0.
    unsafe fn removed_key(
        &mut self,
        L: *mut lua_State,
        r: &mut Reader<'_>,
        nkeys: &mut ffi::lua_Integer,
    ) -> Result<(), Fail> {
        let Some(k) = RemovedKey::kind(r) else {
            return Err(self.malformed(BAD_LAYOUT));
        };
        if *nkeys == 0 {
            // SAFETY: protected context: room for the keys table, a key and the relayout's
            // pushes, then the keys table.
            unsafe {
                reserve(L, 4);
                ffi::lua_createtable(L, 0, 0);
            }
        }
        let Some(key) = RemovedKey::payload(k, r) else {
            return Err(self.malformed(BAD_LAYOUT));
        };
        // SAFETY: a free slot (reserved with the keys table); each arm pushes one key (a
        // string is copied: may allocate, in the protected context).
        unsafe {
            match key {
                RemovedKey::False => ffi::lua_pushboolean(L, 0),
                RemovedKey::True => ffi::lua_pushboolean(L, 1),
                RemovedKey::Int(i) => ffi::lua_pushinteger(L, i),
                RemovedKey::Float(bits) => ffi::lua_pushnumber(L, f64::from_bits(bits)),
                RemovedKey::Str(b) => {
                    ffi::lua_pushlstring(L, b.as_ptr().cast(), b.len());
                }
            }
        }
        *nkeys += 1;
        // SAFETY: the key on top of the keys table: stored (may allocate: protected context).
        unsafe { ffi::lua_rawseti(L, -2, *nkeys) };
        Ok(())
    }
}

/// The node count of the hash part of the table objs[id].
///
/// # Safety
/// Protected context; `s` this load's slots; objs[id] is a table (registered when it was
/// read).
unsafe fn table_nodes(L: *mut lua_State, s: Slots, id: u32) -> u32 {
    // SAFETY: callers' contract; pushes the table (room made) and pops it.
    unsafe {
        reserve(L, 1);
        push_obj(L, s, id);
        let n = luasnap_table_nodes(L, -1);
        ffi::lua_settop(L, -2);
        n
    }
}
