//! The end of a table's record: the layout of its hash part, so that a load keeps `next`'s
//! order (`Tag::Layout`), or `Tag::Nil` when its keys allow none.
//!
//! `luasnap_table_layout` (csrc/tscan.c) computes a layout and keeps the last few in a
//! cache by shape; tables built alike (one constructor) hit it. For a hit the bytes written
//! for the table that filled the cache entry are written again, unless that table had removed
//! keys (whose values the cache does not compare).

use super::super::format::{LayoutHeader, LayoutNode, RemovedKey, Tag, Writer};
use super::csrc::{
    kind, luasnap_layout_cache_reset, luasnap_layout_cache_size, luasnap_node_key,
    luasnap_table_layout, RawVal, LAYOUT_WAYS,
};
use super::persister::Persister;
use super::scratch::LayoutBufs;
use mlua_sys::lua_State;
use std::ffi::c_void;

/// A layout as `luasnap_table_layout` gives it (the codes and chain offsets in the buffers).
struct Layout {
    /// Nodes described (0: no layout to write).
    n: usize,
    lastfree: u32,
    seed: u32,
    /// How the cache took part: -1 not at all, `w` computed and stored in entry `w`,
    /// `LAYOUT_WAYS + w` copied from entry `w`.
    way: i32,
}

impl LayoutBufs {
    /// Starts a new epoch of the layout cache: Lua code may run next, or a new persist
    /// starts (either may free a string and give its address to another).
    pub fn forget_layouts(&mut self) {
        if self.cache.is_empty() {
            // SAFETY: a size query, no arguments.
            let bytes = unsafe { luasnap_layout_cache_size() };
            self.cache = vec![0; bytes.div_ceil(8)];
        }
        // SAFETY: the cache has luasnap_layout_cache_size() bytes, 8-byte aligned.
        unsafe { luasnap_layout_cache_reset(self.cache.as_mut_ptr().cast()) };
        for w in &mut self.written {
            w.clear();
        }
        self.kept = 0;
        self.kept_dead = 0;
    }

    /// Bytes it holds.
    pub fn footprint(&self) -> usize {
        fn bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        bytes(&self.codes)
            + bytes(&self.nexts)
            + bytes(&self.idx)
            + bytes(&self.blob.buf)
            + bytes(&self.cache)
            + self.written.iter().map(bytes).sum::<usize>()
    }

    /// The layout of the table `t`, its codes and chain offsets in `codes` and `nexts`
    /// (grown until they hold every node).
    ///
    /// # Safety
    /// `t` is a live table.
    #[inline(always)]
    unsafe fn query(&mut self, L: *mut lua_State, t: *const c_void) -> Layout {
        let (mut lastfree, mut seed, mut nodes, mut way) = (0u32, 0u32, 0u32, -1i32);
        // No cache (a layout computed once: `layout_blob`) until `forget_layouts` made one.
        let cache = if self.cache.is_empty() {
            std::ptr::null_mut()
        } else {
            self.cache.as_mut_ptr().cast()
        };
        loop {
            let cap = self.codes.len();
            // SAFETY: the buffers hold `cap` entries each, the cache is null or its size (type
            // invariant); t is live (callers' contract); reads only the table.
            let n = unsafe {
                luasnap_table_layout(
                    L,
                    t,
                    self.codes.as_mut_ptr(),
                    self.nexts.as_mut_ptr(),
                    self.idx.as_mut_ptr(),
                    cap as u32,
                    &mut lastfree,
                    &mut seed,
                    cache,
                    &mut nodes,
                    &mut way,
                    self.kept,
                )
            } as usize;
            let size = nodes as usize;
            if size < 2 || size <= cap {
                return Layout {
                    n,
                    lastfree,
                    seed,
                    way,
                };
            }
            self.codes.resize(size, 0);
            self.nexts.resize(size, 0);
            self.idx.resize(size, 0);
        }
    }

    /// The bytes written for the table that filled the cache entry `lay` hit, if kept, and
    /// whether that layout has code-1 nodes.
    #[inline(always)]
    fn hit(&self, lay: &Layout) -> Option<(&[u8], bool)> {
        let w = lay.way.checked_sub(LAYOUT_WAYS as i32)?;
        let bytes = self.written.get(w as usize).filter(|b| !b.is_empty())?;
        Some((bytes, (self.kept_dead >> w) & 1 != 0))
    }

    /// Encodes `lay` (of the table `t`) into `blob`; returns whether it has removed keys it
    /// writes (code 2), and whether it has removed keys it does not (code 1: see
    /// `Persister::removed_keys`).
    ///
    /// # Safety
    /// `t` is the live table `lay` describes; no Lua code ran since.
    unsafe fn encode(&mut self, L: *mut lua_State, t: *const c_void, lay: &Layout) -> (bool, bool) {
        let blob = &mut self.blob;
        blob.buf.clear();
        let header = LayoutHeader {
            seed: lay.seed,
            size: lay.n as u32,
            lastfree: lay.lastfree,
        };
        header.encode(blob);
        let mut removed_keys = false;
        let mut unwritten_keys = false;
        let entries = self.codes[..lay.n].iter().zip(&self.nexts[..lay.n]);
        for (i, (&code, &link)) in entries.enumerate() {
            LayoutNode { code, link }.encode(blob);
            unwritten_keys |= code == LayoutNode::KEY_ELSEWHERE;
            if code == LayoutNode::REMOVED {
                removed_keys = true;
                // SAFETY: i is below the node count; t is live (callers' contract).
                unsafe { put_removed_key(blob, L, t, i as u32) };
            }
        }
        (removed_keys, unwritten_keys)
    }

    /// Keeps the bytes `out[start..]` written for a layout that filled a cache entry (`way`
    /// below `LAYOUT_WAYS`), for the tables that hit it, and whether it has code-1 nodes;
    /// forgets that entry's old bytes.
    fn keep(&mut self, way: i32, out: &[u8], removed_keys: bool, unwritten_keys: bool) {
        let Some(w) = usize::try_from(way).ok().filter(|&w| w < LAYOUT_WAYS) else {
            return;
        };
        if self.written.len() < LAYOUT_WAYS {
            self.written.resize_with(LAYOUT_WAYS, Vec::new);
        }
        let keep = &mut self.written[w];
        keep.clear();
        self.kept &= !(1 << w);
        self.kept_dead &= !(1 << w);
        if !removed_keys {
            keep.extend_from_slice(out);
            self.kept |= 1 << w;
            self.kept_dead |= (unwritten_keys as u64) << w;
        }
    }
}

/// Puts into `out` the layout blob of the table `t` (what a table's record ends with after
/// `Tag::Layout`) and returns true, or returns false when its keys allow none or need none.
/// For the tables a whole-game save does not write as such: `_G` and `package.loaded`, whose
/// entries a load sets into the loading VM's own tables (`persist::game`).
///
/// # Safety
/// `t` is a live table; no Lua code runs meanwhile.
pub(crate) unsafe fn layout_blob(L: *mut lua_State, t: *const c_void, out: &mut Vec<u8>) -> bool {
    let mut bufs = LayoutBufs::default();
    // SAFETY: t is live (callers' contract).
    let lay = unsafe { bufs.query(L, t) };
    if lay.n == 0 {
        return false;
    }
    // SAFETY: lay describes t, live, and nothing ran since (callers' contract).
    unsafe { bufs.encode(L, t, &lay) };
    *out = std::mem::take(&mut bufs.blob.buf);
    true
}

/// Appends the key of node `i` of the table `t`, a removed entry's (a number, boolean or
/// string: `luasnap_table_layout` gives code 2 to no other), as a [`RemovedKey`].
///
/// # Safety
/// `t` is a live table and `i` below its node count.
unsafe fn put_removed_key(blob: &mut Writer, L: *mut lua_State, t: *const c_void, i: u32) {
    let mut k = RawVal::EMPTY;
    // SAFETY: callers' contract; reads only.
    unsafe { luasnap_node_key(L, t, i, &mut k) };
    let key = match k.kind {
        kind::FALSE => RemovedKey::False,
        kind::TRUE => RemovedKey::True,
        kind::INT => RemovedKey::Int(k.bits as i64),
        kind::FLOAT => RemovedKey::Float(k.bits),
        kind::STR => {
            // SAFETY: luasnap_node_key gave the live string's bytes and length.
            let b = unsafe { std::slice::from_raw_parts(k.s.cast::<u8>(), k.len as usize) };
            RemovedKey::Str(b)
        }
        // No other kind gets code 2 (see above); its kind alone, which a load refuses.
        other => return blob.varint(other),
    };
    key.encode(blob);
}

impl Persister<'_> {
    /// Ends a table's entries: with its hash part's layout (`Tag::Layout`) when its keys
    /// allow one (see `luasnap_table_layout`), else with `Tag::Nil`.
    ///
    /// # Safety
    /// `t` is a live table; no Lua code runs meanwhile.
    #[inline(always)]
    pub(super) unsafe fn end_table(&mut self, L: *mut lua_State, t: *const c_void) {
        let bufs = &mut self.sc.layout;
        let w = &mut self.w;
        // SAFETY: t is live (callers' contract).
        let lay = unsafe { bufs.query(L, t) };
        if lay.n == 0 {
            w.tag(Tag::Nil);
            return;
        }
        // A table laid out like the one that filled this cache entry: the same bytes.
        if let Some((b, unwritten_keys)) = bufs.hit(&lay) {
            w.buf.extend_from_slice(b);
            if unwritten_keys {
                self.sc.removed_tables.push(t);
            }
            return;
        }
        // SAFETY: lay describes t, live (callers' contract), and nothing ran since.
        unsafe { self.new_layout(L, t, &lay) };
    }

    /// `end_table` for a layout the cache had no bytes for.
    ///
    /// # Safety
    /// As for `end_table`; `lay` describes `t`.
    #[inline(never)]
    unsafe fn new_layout(&mut self, L: *mut lua_State, t: *const c_void, lay: &Layout) {
        let bufs = &mut self.sc.layout;
        let w = &mut self.w;
        // SAFETY: callers' contract.
        let (removed_keys, unwritten_keys) = unsafe { bufs.encode(L, t, lay) };
        let start = w.buf.len();
        w.tag(Tag::Layout);
        w.bytes(&bufs.blob.buf);
        bufs.keep(lay.way, &w.buf[start..], removed_keys, unwritten_keys);
        if unwritten_keys {
            self.sc.removed_tables.push(t);
        }
    }
}
