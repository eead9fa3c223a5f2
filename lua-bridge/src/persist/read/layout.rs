//! Table layouts (format 5): the hash part of a table as it was saved, so `next` visits the
//! loaded table's entries in the saved order.
//!
//! ```text
//! Tag::Layout, then a blob: seed, node count (a power of two), lastfree, then per node:
//!   0                 free
//!   2, key            removed: its dead key (kind, then the key's payload)
//!   code >= 1, link   otherwise: the entry's code and its chain link (zigzag)
//! ```
//!
//! The decoders here only check the blob's shape (sizes, codes and links inside the node
//! count, every byte used); the C side (`luasnap_table_relayout`, or the build helper's
//! `LAYOUT` step) checks the layout against the table's entries and places nothing unless it
//! matches, so a forged layout can only make a load fail.

use super::csrc::{luasnap_relayout_scratch, luasnap_table_nodes, luasnap_table_relayout};
use super::dispatch::reserve;
use super::ids::push_obj;
use super::limits::COLLISIONS;
use super::{Fail, Loader};
use crate::persist::format::Reader;
use crate::persist::{kind, Slots};
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_void;

/// Why a layout's bytes are refused.
const BAD_LAYOUT: &str = "a table layout that is not one (bad sizes or links)";

/// Reads a layout's header (seed, node count, lastfree) and checks it against the blob
/// that holds it (every node takes at least one byte; sizes are powers of two below 2^31).
#[inline(always)]
pub(super) fn layout_header(r: &mut Reader<'_>, blob_len: usize) -> Option<(u32, u32, u32)> {
    let (seed, size, lastfree) = (r.varint()?, r.varint()?, r.varint()?);
    if seed > u32::MAX as u64
        || size < 2
        || !size.is_power_of_two()
        || size > (1 << 30)
        || size > blob_len as u64
        || lastfree > size
    {
        return None;
    }
    Some((seed as u32, size as u32, lastfree as u32))
}

/// Reads one node of a layout: its code and chain link (see `luasnap_table_layout`).
#[inline(always)]
fn layout_node(r: &mut Reader<'_>, size: u32) -> Option<(u32, i32)> {
    let c = r.varint().filter(|&c| c <= size as u64 + 2)?;
    if c == 0 {
        return Some((0, 0));
    }
    let z = r.varint()?;
    let v = ((z >> 1) as i64) ^ -((z & 1) as i64);
    if v.unsigned_abs() >= size as u64 {
        return None;
    }
    Some((c as u32, v as i32))
}

/// Decodes the nodes of a layout of `size` nodes (see `layout_node`) into `codes` and
/// `links` (one per node), refusing removed keys (code 2): the reader's position after them,
/// or None. Apart from the decoding loop, and by value, for registers of its own.
#[inline(never)]
pub(super) fn layout_nodes(
    mut r: Reader<'_>,
    size: u32,
    codes: &mut [u32],
    links: &mut [i32],
) -> Option<usize> {
    let size = size as u64;
    for (c, nx) in codes.iter_mut().zip(links) {
        let code = r.varint()?;
        if code > size + 2 || code == 2 {
            return None;
        }
        if code == 0 {
            (*c, *nx) = (0, 0);
            continue;
        }
        // The link, zigzag-coded: |link| = z / 2 + (z & 1), below the node count.
        let z = r.varint()?;
        if (z >> 1) + (z & 1) >= size {
            return None;
        }
        (*c, *nx) = (code as u32, (((z >> 1) as i64) ^ -((z & 1) as i64)) as i32);
    }
    Some(r.pos)
}

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
        let Some((seed, size, lastfree)) = layout_header(&mut r, blob.len()) else {
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
            let Some((c, nx)) = layout_node(r, size) else {
                return Err(self.malformed(BAD_LAYOUT));
            };
            if c == 2 {
                // SAFETY: callers' contract.
                unsafe { self.removed_key(L, r, &mut nkeys)? };
            }
            self.lay.push(c);
            self.laynx.push(nx);
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
        let Some(k) = r.varint() else {
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
        // SAFETY: a free slot (reserved with the keys table); each arm pushes one key (a
        // string is copied: may allocate, in the protected context).
        unsafe {
            match k {
                kind::FALSE | kind::TRUE => {
                    ffi::lua_pushboolean(L, (k == kind::TRUE) as std::ffi::c_int)
                }
                kind::INT => match r.varint() {
                    Some(z) => ffi::lua_pushinteger(L, ((z >> 1) as i64) ^ -((z & 1) as i64)),
                    None => return Err(self.malformed(BAD_LAYOUT)),
                },
                kind::FLOAT => match r.varint() {
                    Some(b) if !f64::from_bits(b).is_nan() => {
                        ffi::lua_pushnumber(L, f64::from_bits(b))
                    }
                    _ => return Err(self.malformed(BAD_LAYOUT)),
                },
                kind::STR => match r.bytes() {
                    Some(b) => {
                        ffi::lua_pushlstring(L, b.as_ptr().cast(), b.len());
                    }
                    None => return Err(self.malformed(BAD_LAYOUT)),
                },
                _ => return Err(self.malformed(BAD_LAYOUT)),
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

#[cfg(test)]
mod tests {
    use super::layout_nodes;
    use crate::persist::format::{Reader, Writer};

    #[test]
    fn layout_nodes_check_codes_and_links() {
        let enc = |nodes: &[(u64, i64)]| {
            let mut w = Writer::default();
            for &(c, l) in nodes {
                w.varint(c);
                if c != 0 {
                    w.i64(l);
                }
            }
            w.buf
        };
        let run = |bytes: &[u8], size: u32| {
            let (mut c, mut l) = (vec![9; size as usize], vec![9; size as usize]);
            layout_nodes(Reader::new(bytes), size, &mut c, &mut l).map(|end| (end, c, l))
        };
        let ok = enc(&[(0, 0), (3, -3), (5, 3), (1, 0)]);
        assert_eq!(
            run(&ok, 4),
            Some((ok.len(), vec![0, 3, 5, 1], vec![0, -3, 3, 0]))
        );
        // Links at the node count either way, codes past it, removed keys, truncation.
        assert_eq!(run(&enc(&[(3, 4), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(run(&enc(&[(3, -4), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(run(&enc(&[(7, 0), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(run(&enc(&[(2, 0), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(run(&ok[..ok.len() - 1], 4), None);
        // A link of i64::MIN (zigzag u64::MAX) is refused, not wrapped.
        let mut w = Writer::default();
        w.varint(3);
        w.varint(u64::MAX);
        assert_eq!(run(&w.buf, 1), None);
    }
}
