//! Every C helper the loader calls, in one place: every file of the loader imports its C
//! interface from here. All are declared in `crate::bridge::helpers` (the Rust side of
//! csrc/luasnap.h, whose prototypes state each one's contract); this is the loader's list.
//!
//! Helpers that take a `memo` or `scratch` take memory the loader owns and sizes with the
//! matching `_size` query.

pub(super) use crate::bridge::helpers::luasnap_set_identity;
pub(super) use crate::bridge::helpers::{
    kind, luasnap_checkstack, luasnap_chunk_find, luasnap_chunks_each_proto, luasnap_each_proto,
    luasnap_finalizers_foreign, luasnap_finalizers_mark, luasnap_finalizers_restore,
    luasnap_gc_nofinal, luasnap_gc_stopem, luasnap_hash_seed, luasnap_heap_bytes,
    luasnap_loadstring, luasnap_loadstring_from_save, luasnap_open_upval_check, luasnap_proto,
    luasnap_proto_child, luasnap_proto_hash, luasnap_proto_nupvalues, luasnap_proto_tree,
    luasnap_proto_upvalue_name, luasnap_push_closure, luasnap_rawset_charged,
    luasnap_relayout_memo_limit, luasnap_relayout_memo_over, luasnap_relayout_memo_size,
    luasnap_relayout_scratch, luasnap_removed_key_kind, luasnap_setmetatable_unmarked,
    luasnap_table_add_removed, luasnap_table_build, luasnap_table_nodes, luasnap_table_relayout,
    luasnap_table_removed_key, luasnap_table_resize_nodes, luasnap_table_seal_removed,
    luasnap_thread_building, luasnap_thread_frames, luasnap_thread_hold, luasnap_thread_put,
    luasnap_thread_restore, luasnap_thread_set_tbc, luasnap_upmemo_free, luasnap_upmemo_reads,
    luasnap_upmemo_size, luasnap_upmemo_walks, luasnap_upval_join_at, luasnap_upval_shareable,
    CiRecord, ProtoFn, RawVal, BUILD_DEPTH,
};
pub(super) use crate::bridge::helpers::{
    luasnap_chunk_current, luasnap_closure_rebind, luasnap_closure_trim, luasnap_each_lclosure,
    luasnap_proto_hash_shifted, luasnap_proto_line, luasnap_proto_same_code,
    luasnap_proto_tree_retire, luasnap_proto_upvalue_desc, luasnap_push_closure_n,
    luasnap_push_lclosure, luasnap_thread_slot_lclosure, luasnap_upval_closed_slot,
    luasnap_upval_join_slot, luasnap_upval_set_slot,
};

/// Makes sure of `n` free slots on the loading thread's stack (a memory error if it cannot
/// grow for want of memory).
///
/// # Safety
/// Protected context.
#[inline(always)]
pub(super) unsafe fn reserve(L: *mut mlua_sys::lua_State, n: std::ffi::c_int) {
    // SAFETY: callers' contract: raises in the load's protected call if the stack cannot grow.
    unsafe { luasnap_checkstack(L, n, c"load".as_ptr()) };
}
