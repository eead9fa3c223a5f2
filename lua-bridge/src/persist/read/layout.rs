//! Table layouts (format 5): the hash part of a table as it was saved, so `next` visits the
//! loaded table's entries in the saved order. The blob's records (`LayoutHeader`,
//! `LayoutNode`, `RemovedKey`) are in `format/layout.rs`, with the batch decoder's
//! `layout_nodes`.
//!
//! The decoders only check the blob's shape (sizes, codes and links inside the node count,
//! every byte used); the C side (`luasnap_table_relayout`, or the build helper's `LAYOUT`
//! step) checks the layout against the table's entries and places nothing unless it matches,
//! so a forged layout can only make a load fail.

use super::csrc::{luasnap_hash_seed, luasnap_table_add_removed, reserve};
use super::csrc::{
    luasnap_relayout_memo_limit, luasnap_relayout_memo_size, luasnap_table_resize_nodes,
};
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
        // Its removed entries' keys are still read (into the heap, under the cap), to go in
        // by insertion.
        // SAFETY: callers' contract.
        let applies = unsafe { table_nodes(L, s, id) } == size;
        // SAFETY: callers' contract.
        let nkeys = unsafe { self.read_nodes(L, &mut r, size, applies)? };
        if r.pos != blob.len() {
            return Err(self.malformed(BAD_LAYOUT));
        }
        if !applies {
            // SAFETY: callers' contract; the keys table (if any) on top, popped.
            unsafe { self.unlaid_keys(L, s, id, nkeys) };
            return Ok(());
        }
        let scratch = self.scratch_for(size);
        // SAFETY: protected context; objs[id] is the table (callers' contract); lay and laynx
        // hold `size` entries, scratch the bytes the C side asks for, the memo is the
        // loader's; the keys table (if any) is on top. The C side checks everything else and
        // neither allocates nor raises. Pops the table, and the keys unless the layout did
        // not apply.
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
            ffi::lua_settop(L, if nkeys > 0 && rc != 1 { -3 } else { -2 });
            rc
        };
        if rc == 1 {
            // SAFETY: callers' contract; the keys table (if any) on top, popped.
            unsafe { self.unlaid_keys(L, s, id, nkeys) };
        }
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

    /// Reads a layout's `size` nodes, into `lay`/`laynx` if `keep`; the removed entries' keys
    /// go to a table (keys[1..]) for the C side, left on top if there are any. Returns their
    /// number.
    ///
    /// # Safety
    /// Protected context.
    unsafe fn read_nodes(
        &mut self,
        L: *mut lua_State,
        r: &mut Reader<'_>,
        size: u32,
        keep: bool,
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
            if keep {
                self.lay.push(node.code);
                self.laynx.push(node.link);
            }
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
        // SAFETY: a free slot (reserved with the keys table), the protected context.
        unsafe { push_removed_key(L, key) };
        *nkeys += 1;
        // SAFETY: the key on top of the keys table: stored (may allocate: protected context).
        unsafe { ffi::lua_rawseti(L, -2, *nkeys) };
        Ok(())
    }
}

/// Pushes a removed entry's key.
///
/// # Safety
/// A protected context (a string is copied: may allocate) and a free slot.
unsafe fn push_removed_key(L: *mut lua_State, key: RemovedKey<&[u8]>) {
    // SAFETY: callers' contract; each arm pushes one key.
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
}

/// Collision-chain nodes a layout applied by [`relayout_blob`] may walk, per node of its
/// hash part (a forged blob's chains cannot make it walk more).
const BLOB_STEPS_PER_NODE: u64 = 64;

/// Puts the entries of the table at the absolute index `idx` into the nodes of the layout
/// `blob` (as a table's record ends with; `write::layout_blob`), resizing its hash part to
/// the layout's node count first. For the tables whose entries a whole-game load sets into
/// the loading VM's own (`_G`, `package.loaded`), so that `next` visits them in the saved
/// order. Returns whether it did: a blob that is not one, is implausible for the table (its
/// nodes in use under a quarter of its node count: Lua's hash parts are at least half used
/// after each resize, and removed entries keep their nodes), or does not match the table's
/// entries (another hash seed, a library the loading VM has and the saving one had not)
/// changes nothing but perhaps the hash part's size.
///
/// Where the layout did not apply, the removed entries' keys the blob holds go in by
/// insertion, as entries being removed (`luasnap_table_add_removed`), and the caller seals
/// them (`luasnap_table_seal_removed`) once the keys the file gives after its root
/// (`give_game_removed_keys`) went in too. So that they find free nodes without a rehash, the
/// hash part first grows, if it must, to hold the table's entries and every removed entry the
/// layout has (its codes 1 and 2): at most the layout's node count more than the entries.
///
/// # Safety
/// A protected context of a VM built by this crate (a resize may raise a memory error);
/// `idx` the absolute index of a table.
pub(crate) unsafe fn relayout_blob(L: *mut lua_State, idx: std::ffi::c_int, blob: &[u8]) -> bool {
    let mut r = Reader::new(blob);
    let Some(h) = LayoutHeader::decode(&mut r, blob.len()) else {
        return false;
    };
    // SAFETY: protected context (callers' contract): room for the keys table, a key and the
    // two slots luasnap_table_add_removed takes.
    let top = unsafe {
        reserve(L, 5);
        ffi::lua_gettop(L)
    };
    let (mut codes, mut links) = (Vec::new(), Vec::new());
    let mut nkeys = 0;
    for _ in 0..h.size {
        let Some(node) = LayoutNode::decode(&mut r, h.size) else {
            break;
        };
        if node.code == LayoutNode::REMOVED {
            let key = RemovedKey::kind(&mut r).and_then(|k| RemovedKey::payload(k, &mut r));
            let Some(key) = key else {
                break;
            };
            // SAFETY: protected context, room reserved; the keys table made at the first.
            unsafe {
                if nkeys == 0 {
                    ffi::lua_createtable(L, 0, 0);
                }
                push_removed_key(L, key);
                nkeys += 1;
                ffi::lua_rawseti(L, top + 1, nkeys);
            }
        }
        codes.push(node.code);
        links.push(node.link);
    }
    let used = codes.iter().filter(|&&c| c != 0).count() as u64;
    let removed = codes
        .iter()
        .filter(|&&c| c == LayoutNode::KEY_ELSEWHERE || c == LayoutNode::REMOVED)
        .count() as u64;
    let whole = codes.len() == h.size as usize && r.pos == blob.len();
    // SAFETY: protected context; idx is a table (callers' contract).
    let (entries, nodes, seed) = unsafe {
        (
            entries(L, idx),
            luasnap_table_nodes(L, idx),
            luasnap_hash_seed(L),
        )
    };
    // Resized only to hold every entry (a hash part smaller than its entries drops some as
    // they are reinserted: an outside tester's forged 2-node layout emptied `_G`), and back
    // if the layout is then refused; not at all under another hash seed, where the C side
    // refuses the layout first.
    let fits = entries <= h.size as u64;
    // SAFETY: protected context; idx is a table (callers' contract). The C side checks the
    // layout against the table, neither allocates nor raises, and walks at most the memo's
    // limit of chain nodes.
    let rc = unsafe {
        if whole && fits && used * 4 >= h.size as u64 && h.seed == seed {
            if nodes != h.size {
                luasnap_table_resize_nodes(L, idx, h.size);
            }
            let mut scratch = vec![0u64; luasnap_relayout_scratch(h.size).div_ceil(8)];
            let mut memo = vec![0u64; luasnap_relayout_memo_size().div_ceil(8)];
            luasnap_relayout_memo_limit(
                memo.as_mut_ptr().cast(),
                h.size as u64 * BLOB_STEPS_PER_NODE,
            );
            let rc = luasnap_table_relayout(
                L,
                idx,
                codes.as_ptr(),
                links.as_ptr(),
                h.size,
                h.lastfree,
                h.seed,
                if nkeys > 0 { top + 1 } else { 0 },
                scratch.as_mut_ptr().cast(),
                memo.as_mut_ptr().cast(),
            );
            if rc != 0 && nodes != h.size {
                luasnap_table_resize_nodes(L, idx, nodes);
            }
            rc
        } else {
            -1
        }
    };
    if rc != 0 && removed > 0 {
        // Room for the removed keys (the blob's and those after the root, one per code-1
        // node): Lua's insertion without a rehash needs a free node for each. Bounded by the
        // blob's node count, itself at most the blob's length.
        let need = entries + removed;
        if need > nodes as u64 && need <= 1 << 30 {
            // SAFETY: protected context (a memory error is raised there); idx a table.
            unsafe { luasnap_table_resize_nodes(L, idx, (need as u32).next_power_of_two()) };
        }
    }
    // Where the layout did not apply, the blob's removed entries' keys go in by insertion.
    // SAFETY: protected context, room reserved; the keys table at top + 1, idx a table
    // (callers' contract); luasnap_table_add_removed neither allocates nor raises.
    unsafe {
        if rc != 0 && nkeys > 0 {
            for i in 1..=nkeys {
                ffi::lua_rawgeti(L, top + 1, i);
                luasnap_table_add_removed(L, idx, -1, 0);
                ffi::lua_settop(L, -2);
            }
        }
    }
    // SAFETY: pops the keys table, if made.
    unsafe { ffi::lua_settop(L, top) };
    rc == 0
}

/// How many entries the table at the absolute index `idx` holds (raw `next`).
///
/// # Safety
/// A protected context with a free slot pair; `idx` the absolute index of a table.
unsafe fn entries(L: *mut lua_State, idx: std::ffi::c_int) -> u64 {
    let mut n = 0;
    // SAFETY: callers' contract; lua_next over a table nothing changes meanwhile, each turn
    // pops the value and keeps the key for the next.
    unsafe {
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, idx) != 0 {
            ffi::lua_settop(L, -2);
            n += 1;
        }
    }
    n
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
