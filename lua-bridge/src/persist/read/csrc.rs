//! Every C helper the loader calls (csrc/internals.c, csrc/chunks.c), declared in one place:
//! the loader's own here, and those it shares with the writer and the VM re-exported from
//! where they are declared, so every file of the loader imports its C interface from here.
//!
//! Each helper's contract is stated where the loader calls it. Helpers that take a `memo`
//! or `scratch` take memory the loader owns and sizes with the matching `_size` query.

use crate::persist::RawVal;
use mlua_sys::lua_State;
use std::ffi::{c_char, c_int, c_void};

pub(super) use crate::bridge::chunks::{luasnap_chunks_each_proto, luasnap_loadstring};
pub(super) use crate::persist::{
    luasnap_checkstack, luasnap_chunk_find, luasnap_gc_stopem, luasnap_heap_bytes, luasnap_proto,
    luasnap_proto_child, luasnap_proto_hash, luasnap_proto_nupvalues, luasnap_thread_restore,
};

/// Calls `f(q, ud)` for a prototype and every prototype nested in it.
pub(super) type ProtoVisitor = unsafe extern "C" fn(*const c_void, *mut c_void);

unsafe extern "C" {
    pub(super) fn luasnap_push_closure(L: *mut lua_State, p: *const c_void);
    pub(super) fn luasnap_each_proto(L: *mut lua_State, f: ProtoVisitor, ud: *mut c_void);
    pub(super) fn luasnap_proto_tree(p: *const c_void, f: ProtoVisitor, ud: *mut c_void);
    pub(super) fn luasnap_gc_nofinal(L: *mut lua_State, on: c_int) -> c_int;
    pub(super) fn luasnap_thread_building(co: *mut lua_State, on: c_int) -> c_int;
    pub(super) fn luasnap_thread_hold(co: *mut lua_State, on: c_int) -> c_int;
    pub(super) fn luasnap_thread_put(L: *mut lua_State, co: *mut lua_State, i: c_int) -> c_int;
    pub(super) fn luasnap_thread_frames(
        co: *mut lua_State,
        out: *mut *const c_void,
        max: c_int,
    ) -> c_int;
    pub(super) fn luasnap_upval_join_at(
        L: *mut lua_State,
        idx: c_int,
        n: c_int,
        co: *mut lua_State,
        level: c_int,
        aidx: c_int,
        an: c_int,
    ) -> *mut c_void;
    pub(super) fn luasnap_upval_shareable(L: *mut lua_State, idx: c_int, n: c_int) -> c_int;
    pub(super) fn luasnap_upmemo_size() -> usize;
    pub(super) fn luasnap_upmemo_free(memo: *mut c_void);
    pub(super) fn luasnap_upmemo_walks(memo: *const c_void) -> usize;
    pub(super) fn luasnap_upmemo_reads(memo: *const c_void) -> usize;
    pub(super) fn luasnap_open_upval_check(
        L: *mut lua_State,
        idx: c_int,
        n: c_int,
        co: *mut lua_State,
        level: c_int,
        frames: *const *const c_void,
        nframes: c_int,
        strict: c_int,
        memo: *mut c_void,
    ) -> *const c_char;
    pub(super) fn luasnap_thread_set_tbc(
        co: *mut lua_State,
        slots: *const i32,
        n: c_int,
    ) -> *const c_char;
    pub(super) fn luasnap_table_nodes(L: *mut lua_State, idx: c_int) -> u32;
    pub(super) fn luasnap_table_relayout(
        L: *mut lua_State,
        idx: c_int,
        codes: *const u32,
        nexts: *const i32,
        size: u32,
        lastfree: u32,
        seed: u32,
        keys: c_int,
        scratch: *mut c_void,
        memo: *mut c_void,
    ) -> c_int;
    pub(super) fn luasnap_relayout_scratch(size: u32) -> usize;
    pub(super) fn luasnap_relayout_memo_limit(memo: *mut c_void, limit: u64);
    pub(super) fn luasnap_relayout_memo_over(memo: *const c_void) -> c_int;
    pub(super) fn luasnap_rawset_charged(L: *mut lua_State, idx: c_int, memo: *mut c_void)
        -> c_int;
    pub(super) fn luasnap_hash_seed(L: *mut lua_State) -> u32;
    pub(super) fn luasnap_table_build(
        L: *mut lua_State,
        strs: c_int,
        objs: c_int,
        ops: *const RawVal,
        n: c_int,
        nofinal: c_int,
        lay: *const u32,
        laynx: *const i32,
        scratch: *mut c_void,
        memo: *mut c_void,
    ) -> c_int;
    pub(super) fn luasnap_relayout_memo_size() -> usize;
    pub(super) fn luasnap_recheck_finalizer(L: *mut lua_State);
}
