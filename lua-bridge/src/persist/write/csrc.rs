//! Every C helper the writer calls (csrc/internals.c, csrc/chunks.c), in one place: those only
//! the writer uses are declared here, the ones it shares with the loader are re-exported from
//! where they are declared. The rest of `write/` imports C from here and nowhere else.
//!
//! None of these raises a Lua error unless it says so. Pointers to Lua objects (`t`, `f`,
//! `p`, `ts`, `mt`) are identities as `lua_topointer` or a scan gives them, of live objects
//! (see **Alive** in the module docs of `write`).

use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_char, c_int, c_void};

pub(super) use super::super::{
    kind, luasnap_checkstack, luasnap_chunk_describe, luasnap_gc_stopem, luasnap_proto,
    luasnap_proto_child, luasnap_proto_hash, luasnap_proto_nchildren, luasnap_proto_nupvalues,
    luasnap_thread_cis, luasnap_thread_info, luasnap_thread_push_slot, luasnap_upval_open,
    ChunkDesc, CiRecord, RawVal,
};
pub(super) use crate::bridge::chunks::luasnap_dump;

unsafe extern "C" {
    /// Pushes the value, then the key, of the first entry at position `*pos` or after of the
    /// table `t`, and sets `*pos` past it; 0, pushing nothing, after the last entry. Needs
    /// stack room for 2 values.
    pub(super) fn luasnap_table_next(L: *mut lua_State, t: *const c_void, pos: *mut u32) -> c_int;
    /// Pushes the key (`what` 0) or the value (1) of the entry at position `pos` of the table
    /// `t`; 0, pushing nothing, if there is no such entry (any more).
    pub(super) fn luasnap_table_entry(
        L: *mut lua_State,
        t: *const c_void,
        pos: u32,
        what: c_int,
    ) -> c_int;
    /// Describes up to `max` entries of the table `t` from position `pos` on into `out`;
    /// returns how many (fewer than `max` only when it reached the last entry). Reads only.
    pub(super) fn luasnap_table_scan(
        L: *mut lua_State,
        t: *const c_void,
        pos: u32,
        out: *mut ScanEntry,
        max: c_int,
    ) -> c_int;
    /// The bytes and length of the string `ts`.
    pub(super) fn luasnap_string_bytes(ts: *const c_void, len: *mut usize) -> *const c_char;
    /// The sizes of the array and hash parts of the table `t` and its metatable (null if
    /// none); whether that metatable has a non-nil field `key` (null: no lookup, 0).
    pub(super) fn luasnap_table_info(
        t: *const c_void,
        key: *const c_void,
        narr: *mut u32,
        nhash: *mut u32,
        mt: *mut *const c_void,
    ) -> c_int;
    /// Stores the objects `ps[0..n)` in the table at the absolute index `idx`, at `keys[i]`
    /// (or at `first + i` if `keys` is null). Allocates: may raise a memory error.
    pub(super) fn luasnap_anchor(
        L: *mut lua_State,
        idx: c_int,
        ps: *const *const c_void,
        keys: *const ffi::lua_Integer,
        n: c_int,
        first: ffi::lua_Integer,
    );
    /// Pushes the metatable of the table `t`, or nil.
    pub(super) fn luasnap_push_metatable(L: *mut lua_State, t: *const c_void);
    /// Whether the metatable `mt` has a non-nil field `key` (a live string).
    pub(super) fn luasnap_meta_has(mt: *const c_void, key: *const c_void) -> c_int;
    /// The layout of the hash part of the table `t` (see csrc/internals.c: codes, chain
    /// offsets and the rest for up to `cap` nodes; `*nodes` the node count, `*way` how the
    /// layout cache `cache` took part). Reads only the table.
    pub(super) fn luasnap_table_layout(
        L: *mut lua_State,
        t: *const c_void,
        codes: *mut u32,
        nexts: *mut i32,
        idx: *mut u32,
        cap: u32,
        lastfree: *mut u32,
        seed: *mut u32,
        cache: *mut c_void,
        nodes: *mut u32,
        way: *mut c_int,
        kept: u64,
    ) -> u32;
    /// Bytes of a layout cache (zeroed bytes are an empty cache).
    pub(super) fn luasnap_layout_cache_size() -> usize;
    /// Forgets every layout of the cache `cache` (`luasnap_layout_cache_size` bytes).
    pub(super) fn luasnap_layout_cache_reset(cache: *mut c_void);
    /// The fingerprints of the prototype `p`'s tree in pre-order into `hs[0..max)`; returns
    /// how many prototypes the tree has, or -1 if it nests too deep (then hash each alone).
    pub(super) fn luasnap_proto_tree_hashes(p: *const c_void, hs: *mut u64, max: c_int) -> c_int;
    /// Describes the key of node `i` (below its node count) of the table `t`.
    pub(super) fn luasnap_node_key(L: *mut lua_State, t: *const c_void, i: u32, out: *mut RawVal);
    /// Stores up to `max` stack offsets of the pending to-be-closed variables of `co` in
    /// `out`, oldest first; returns how many there are.
    pub(super) fn luasnap_thread_tbc(co: *mut lua_State, out: *mut i32, max: c_int) -> c_int;
    /// The prototype of the Lua closure `f` and, for each of its upvalues (at most `max`), the
    /// upvalue's identity and a description of its value. Returns the upvalue count, or -1 if
    /// there are more than `max` or one is still open.
    pub(super) fn luasnap_closure_scan(
        f: *const c_void,
        proto: *mut *const c_void,
        uids: *mut *const c_void,
        vals: *mut RawVal,
        max: c_int,
    ) -> c_int;
}

/// A table entry described by `luasnap_table_scan` (mirrors `luasnap_sentry`): each side's
/// [`kind`] and bits (see `plain::full_val`); strings by identity alone.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ScanEntry {
    pub kbits: u64,
    pub vbits: u64,
    /// The entry's position plus one.
    pub pos: u32,
    pub kkind: u8,
    pub vkind: u8,
}

// The C side checks the same size for `luasnap_sentry`.
const _: () = assert!(std::mem::size_of::<ScanEntry>() == 24);
