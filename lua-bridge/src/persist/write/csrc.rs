//! Every C helper the writer calls, in one place: the rest of `write/` imports C from here and
//! nowhere else. All are declared in `crate::bridge::helpers` (the Rust side of csrc/luasnap.h, whose
//! prototypes state each one's contract); this is the writer's list of them.
//!
//! Pointers to Lua objects (`t`, `f`, `p`, `ts`, `mt`) are identities as `lua_topointer` or a
//! scan gives them, of live objects (see **Alive** in the module docs of `write`).

pub(super) use crate::bridge::helpers::{
    kind, luasnap_anchor, luasnap_checkstack, luasnap_chunk_describe, luasnap_closure_scan,
    luasnap_dump, luasnap_final_state, luasnap_final_state_at, luasnap_finalizer_list,
    luasnap_gc_stopem, luasnap_identity, luasnap_identity_at, luasnap_layout_cache_reset,
    luasnap_layout_cache_size, luasnap_meta_has, luasnap_node_key, luasnap_proto,
    luasnap_proto_child, luasnap_proto_hash, luasnap_proto_nupvalues, luasnap_proto_tree_hashes,
    luasnap_push_finalizable, luasnap_push_metatable, luasnap_push_node_key, luasnap_string_bytes,
    luasnap_table_entry, luasnap_table_info, luasnap_table_layout, luasnap_table_next,
    luasnap_table_removed_keys, luasnap_table_scan, luasnap_thread_cis, luasnap_thread_info,
    luasnap_thread_push_slot, luasnap_thread_tbc, luasnap_upval_open, ChunkDesc, CiRecord, RawVal,
    ScanEntry, LAYOUT_WAYS,
};

/// The finalization states `luasnap_final_state` reports (csrc/luasnap.h).
pub(super) const LS_FINAL_NONE: std::ffi::c_int = 0;
/// Marked for finalization (on one of the collector's lists).
pub(super) const LS_FINAL_MARKED: std::ffi::c_int = 2;
