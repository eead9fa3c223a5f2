//! The C helpers (`lua-bridge/csrc`), as Rust sees them: the one place that declares what
//! `csrc/luasnap.h` declares, the functions Rust calls, the structures both sides fill and the
//! constants both sides use. Everything else in the crate imports from here.
//!
//! The helpers reach into Lua 5.5.1's internals for what the C API cannot do (see the header).
//! This module is checked against the header three ways, so a change on one side cannot drift
//! silently from the other:
//! - **structures**, at build time on both sides: the header's `LUASNAP_MIRROR` and
//!   `LUASNAP_FIELD` lines are C `_Static_assert`s on the C structure, and `build.rs` turns the
//!   same lines into the `const` assertions on the Rust mirror included below (its size, and each
//!   field's offset and size);
//! - **constants**, defined once: [`kind`], [`LAYOUT_WAYS`] and [`BUILD_DEPTH`] are generated
//!   from the header by `build.rs`;
//! - **signatures**, by this module's tests: every prototype of the header has a declaration
//!   here and every declaration here a prototype there, with the same types (`int` is
//!   [`c_int`], `uint32_t` is `u32`, a `const T *` is `*const T`, ...), and a function is
//!   declared `extern "C-unwind"` exactly when the header marks it `LUASNAP_RAISES` (it may raise
//!   a Lua error). The tests also check that the C files call each other one way, no circle.
//!
//! The functions are `unsafe`: each needs a valid `lua_State` (or the pointers the header names)
//! and, for a raising one, a protected context. Their contracts are in the header.
#![allow(missing_docs)] // each declaration's contract is its prototype's, in csrc/luasnap.h

use mlua_sys::{lua_CFunction, lua_Hook, lua_Integer, lua_State, lua_Writer};
use std::ffi::{c_char, c_int, c_void};

/// Called for each prototype of a walk: `f(p, ud)` (`luasnap_proto_fn`).
pub(crate) type ProtoFn = unsafe extern "C" fn(*const c_void, *mut c_void);
/// Called for each Lua closure of a walk: `f(closure, its prototype, ud)` (`luasnap_closure_fn`).
pub(crate) type ClosureFn = unsafe extern "C" fn(*const c_void, *const c_void, *mut c_void);

/// A value as the table helpers describe it (`luasnap_val`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawVal {
    /// One of the [`kind`] constants (a whole word: copies of the struct move whole words).
    pub kind: u64,
    /// Length of a string's bytes.
    pub len: u64,
    /// The integer, the float's bits, an identity, or an id (see [`kind`]).
    pub bits: u64,
    /// A string's bytes.
    pub s: *const c_char,
}

impl RawVal {
    pub const EMPTY: RawVal = RawVal {
        kind: 0,
        len: 0,
        bits: 0,
        s: std::ptr::null(),
    };
}

/// A table entry described by `luasnap_table_scan` (`luasnap_sentry`): each side's [`kind`]
/// and bits; strings by identity alone.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ScanEntry {
    pub kbits: u64,
    pub vbits: u64,
    /// The entry's position plus one.
    pub pos: u32,
    pub kkind: u8,
    pub vkind: u8,
}

/// A call frame of a suspended coroutine, in stack-slot offsets (`luasnap_ci`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CiRecord {
    pub func: i32,
    pub top: i32,
    pub callstatus: u32,
    pub u2: i32,
    pub pc: i32,
    pub nextraargs: i32,
    pub old_errfunc: i64,
    pub ctx: i64,
    pub k: *const c_void,
}

/// A prototype's chunk as `luasnap_chunk_describe` gives it (`luasnap_chunk_desc`). The pointers
/// stay valid while the prototype is alive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkDesc {
    /// The chunk record (identifies the chunk's text).
    pub rec: *const c_void,
    /// The main prototype of the record's first tree.
    pub main: *const c_void,
    pub src: *const c_char,
    pub srclen: usize,
    /// The chunk name (null if none).
    pub name: *const c_char,
    pub namelen: usize,
}

impl ChunkDesc {
    pub const EMPTY: ChunkDesc = ChunkDesc {
        rec: std::ptr::null(),
        main: std::ptr::null(),
        src: std::ptr::null(),
        srclen: 0,
        name: std::ptr::null(),
        namelen: 0,
    };
}

/// The size of a field, for the generated layout checks.
const fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    std::mem::size_of::<F>()
}

// `kind`, `LAYOUT_WAYS`, `BUILD_DEPTH` and the layout checks of the four structures above.
include!(concat!(env!("OUT_DIR"), "/luasnap_h.rs"));

// proto.c: prototypes and their fingerprints.
unsafe extern "C" {
    pub(crate) fn luasnap_proto(L: *mut lua_State, idx: c_int) -> *const c_void;
    pub(crate) fn luasnap_light_cfunction(L: *mut lua_State, idx: c_int) -> Option<lua_CFunction>;
    pub(crate) fn luasnap_proto_nupvalues(p: *const c_void) -> c_int;
    pub(crate) fn luasnap_proto_upvalue_name(
        p: *const c_void,
        i: c_int,
        len: *mut usize,
    ) -> *const c_char;
    pub(crate) fn luasnap_proto_nchildren(p: *const c_void) -> c_int;
    pub(crate) fn luasnap_proto_child(p: *const c_void, i: c_int) -> *const c_void;
    pub(crate) fn luasnap_proto_hash(p: *const c_void) -> u64;
    pub(crate) fn luasnap_proto_hash_shifted(p: *const c_void, shift: i64) -> u64;
    pub(crate) fn luasnap_proto_line(p: *const c_void) -> c_int;
    pub(crate) fn luasnap_proto_same_code(a: *const c_void, b: *const c_void) -> c_int;
    pub(crate) fn luasnap_proto_tree_retire(p: *const c_void);
    pub(crate) fn luasnap_proto_tree_hashes(p: *const c_void, hs: *mut u64, max: c_int) -> c_int;
    pub(crate) fn luasnap_each_proto(L: *mut lua_State, f: ProtoFn, ud: *mut c_void);
    pub(crate) fn luasnap_proto_tree(p: *const c_void, f: ProtoFn, ud: *mut c_void);
    pub(crate) fn luasnap_proto_closure_pcs(p: *const c_void, pcs: *mut c_int, n: c_int);
    pub(crate) fn luasnap_proto_child_name(
        p: *const c_void,
        pc: c_int,
        buf: *mut c_char,
        cap: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_proto_upvalue_desc(
        p: *const c_void,
        i: c_int,
        local: *mut c_int,
    ) -> c_int;
    pub(crate) fn luasnap_upval_set_slot(L: *mut lua_State, idx: c_int, slot: c_int) -> c_int;
    pub(crate) fn luasnap_upval_join_slot(
        L: *mut lua_State,
        aidx: c_int,
        aslot: c_int,
        bidx: c_int,
        bslot: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_upval_closed_slot(L: *mut lua_State, idx: c_int, slot: c_int) -> c_int;
    pub(crate) fn luasnap_each_lclosure(L: *mut lua_State, f: ClosureFn, ud: *mut c_void);
    pub(crate) fn luasnap_push_lclosure(L: *mut lua_State, cl: *const c_void);
}

unsafe extern "C-unwind" {
    pub(crate) fn luasnap_push_closure(L: *mut lua_State, p: *const c_void);
    pub(crate) fn luasnap_push_closure_n(L: *mut lua_State, p: *const c_void, n: c_int) -> c_int;
    pub(crate) fn luasnap_closure_rebind(
        L: *mut lua_State,
        idx: c_int,
        p: *const c_void,
        from: *const c_int,
    ) -> c_int;
    pub(crate) fn luasnap_closure_trim(L: *mut lua_State, idx: c_int) -> c_int;
}

// chunks.c, loaders.c: the chunk registry and the loaders that register what they compile.
unsafe extern "C-unwind" {
    pub(crate) fn luasnap_loadstring(
        L: *mut lua_State,
        idx: c_int,
        chunkname: *const c_char,
        mode: *const c_char,
    ) -> c_int;
    pub(crate) fn luasnap_loadstring_from_save(
        L: *mut lua_State,
        idx: c_int,
        chunkname: *const c_char,
    ) -> c_int;
    pub(crate) fn luasnap_dump(
        L: *mut lua_State,
        writer: lua_Writer,
        data: *mut c_void,
        strip: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_chunks_each_proto(L: *mut lua_State, f: ProtoFn, ud: *mut c_void);
    pub(crate) fn luasnap_require_loaded(L: *mut lua_State) -> c_int;
    pub(crate) fn luasnap_require_load(
        L: *mut lua_State,
        path: *const c_char,
        pathlen: usize,
        src: *const c_char,
        srclen: usize,
    ) -> c_int;
    pub(crate) fn luasnap_chunk_keep(L: *mut lua_State, fnidx: c_int);
    pub(crate) fn luasnap_chunk_current(
        L: *mut lua_State,
        name: *const c_char,
        namelen: usize,
    ) -> *const c_void;
    pub(crate) fn luasnap_chunk_find(
        L: *mut lua_State,
        print: u64,
        src: *const c_char,
        srclen: usize,
        name: *const c_char,
        namelen: usize,
    ) -> *const c_void;
    #[cfg(feature = "interpreter")]
    pub(crate) fn luasnap_loadfilex(
        L: *mut lua_State,
        filename: *const c_char,
        mode: *const c_char,
    ) -> c_int;
    pub(crate) fn luasnap_chunks_install(L: *mut lua_State);
}

unsafe extern "C" {
    pub(crate) fn luasnap_chunk_describe(p: *const c_void, out: *mut ChunkDesc) -> c_int;
}

// coframes.c: a suspended coroutine, read for the writer.
unsafe extern "C" {
    pub(crate) fn luasnap_thread_info(
        co: *mut lua_State,
        stacksize: *mut c_int,
        nci: *mut c_int,
        tbc: *mut c_int,
        errfunc: *mut i64,
    );
    pub(crate) fn luasnap_thread_push_slot(L: *mut lua_State, co: *mut lua_State, i: c_int);
    pub(crate) fn luasnap_thread_cis(co: *mut lua_State, out: *mut CiRecord, n: c_int);
    pub(crate) fn luasnap_thread_k(co: *mut lua_State, level: c_int) -> *const c_void;
    pub(crate) fn luasnap_upval_open(
        L: *mut lua_State,
        idx: c_int,
        n: c_int,
        owner: *mut *mut lua_State,
        level: *mut c_int,
    ) -> c_int;
    pub(crate) fn luasnap_thread_tbc(co: *mut lua_State, out: *mut i32, max: c_int) -> c_int;
    pub(crate) fn luasnap_thread_frames(
        co: *mut lua_State,
        out: *mut *const c_void,
        max: c_int,
    ) -> c_int;
}

// coload.c: building a loaded coroutine.
unsafe extern "C-unwind" {
    pub(crate) fn luasnap_thread_put(L: *mut lua_State, co: *mut lua_State, i: c_int) -> c_int;
    pub(crate) fn luasnap_upval_join_at(
        L: *mut lua_State,
        idx: c_int,
        n: c_int,
        co: *mut lua_State,
        level: c_int,
        aidx: c_int,
        an: c_int,
    ) -> *mut c_void;
}

unsafe extern "C" {
    pub(crate) fn luasnap_upval_shareable(L: *mut lua_State, idx: c_int, n: c_int) -> c_int;
    pub(crate) fn luasnap_thread_slot_lclosure(co: *mut lua_State, slot: c_int) -> *const c_void;
    pub(crate) fn luasnap_thread_restore(
        L: *mut lua_State,
        co: *mut lua_State,
        cis: *const CiRecord,
        nci: c_int,
        errfunc: i64,
        known_k: *const *const c_void,
        nknown: c_int,
        pcall_k: *const c_void,
        memo: *mut c_void,
    ) -> *const c_char;
    pub(crate) fn luasnap_thread_building(co: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_thread_hold(co: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_thread_set_tbc(
        co: *mut lua_State,
        slots: *const i32,
        n: c_int,
    ) -> *const c_char;
}

// upvalcheck.c, loadmemo.c: open upvalues of loaded coroutines, and the load's memo.
unsafe extern "C" {
    pub(crate) fn luasnap_open_upval_check(
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
    pub(crate) fn luasnap_upmemo_size() -> usize;
    pub(crate) fn luasnap_upmemo_free(memo: *mut c_void);
    pub(crate) fn luasnap_upmemo_walks(memo: *const c_void) -> usize;
    pub(crate) fn luasnap_upmemo_reads(memo: *const c_void) -> usize;
}

// tscan.c: tables and closures, read for the writer.
unsafe extern "C" {
    pub(crate) fn luasnap_table_next(L: *mut lua_State, tp: *const c_void, pos: *mut u32) -> c_int;
    pub(crate) fn luasnap_table_entry(
        L: *mut lua_State,
        tp: *const c_void,
        pos: u32,
        what: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_table_scan(
        L: *mut lua_State,
        tp: *const c_void,
        pos: u32,
        out: *mut ScanEntry,
        max: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_string_bytes(ts: *const c_void, len: *mut usize) -> *const c_char;
    pub(crate) fn luasnap_table_info(
        tp: *const c_void,
        key: *const c_void,
        narr: *mut u32,
        nhash: *mut u32,
        mt: *mut *const c_void,
    ) -> c_int;
    pub(crate) fn luasnap_meta_has(mt: *const c_void, key: *const c_void) -> c_int;
    pub(crate) fn luasnap_push_metatable(L: *mut lua_State, tp: *const c_void);
    pub(crate) fn luasnap_closure_scan(
        f: *const c_void,
        proto: *mut *const c_void,
        uids: *mut *const c_void,
        vals: *mut RawVal,
        max: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_table_layout(
        L: *mut lua_State,
        tp: *const c_void,
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
    pub(crate) fn luasnap_layout_cache_size() -> usize;
    pub(crate) fn luasnap_layout_cache_reset(cache: *mut c_void);
    pub(crate) fn luasnap_node_key(L: *mut lua_State, tp: *const c_void, i: u32, out: *mut RawVal);
    pub(crate) fn luasnap_table_removed_keys(
        tp: *const c_void,
        nodes: *mut u32,
        ptrs: *mut *const c_void,
        kinds: *mut u8,
        cap: u32,
    ) -> u32;
    pub(crate) fn luasnap_push_node_key(L: *mut lua_State, tp: *const c_void, i: u32);
}

unsafe extern "C-unwind" {
    pub(crate) fn luasnap_anchor(
        L: *mut lua_State,
        idx: c_int,
        ps: *const *const c_void,
        keys: *const lua_Integer,
        n: c_int,
        first: lua_Integer,
    );
}

// tbuild.c: tables and closures, built for the loader.
unsafe extern "C-unwind" {
    pub(crate) fn luasnap_table_build(
        L: *mut lua_State,
        strs: c_int,
        objs: c_int,
        ops: *const RawVal,
        n: c_int,
        finals: c_int,
        lay: *const u32,
        laynx: *const i32,
        scratch: *mut c_void,
        memo: *mut c_void,
    ) -> c_int;
    pub(crate) fn luasnap_table_resize_nodes(L: *mut lua_State, idx: c_int, nodes: u32);
    pub(crate) fn luasnap_rawset_charged(L: *mut lua_State, idx: c_int, memo: *mut c_void)
        -> c_int;
}

unsafe extern "C" {
    pub(crate) fn luasnap_table_relayout(
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
    pub(crate) fn luasnap_table_nodes(L: *mut lua_State, idx: c_int) -> u32;
    pub(crate) fn luasnap_table_removed_key(
        L: *mut lua_State,
        tidx: c_int,
        node: u32,
        kidx: c_int,
        dead: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_removed_key_kind(L: *mut lua_State, kidx: c_int, dead: c_int) -> c_int;
    pub(crate) fn luasnap_table_add_removed(
        L: *mut lua_State,
        tidx: c_int,
        kidx: c_int,
        dead: c_int,
    ) -> c_int;
    pub(crate) fn luasnap_table_seal_removed(L: *mut lua_State, tidx: c_int) -> u32;
    pub(crate) fn luasnap_relayout_scratch(size: u32) -> usize;
    pub(crate) fn luasnap_relayout_memo_size() -> usize;
    pub(crate) fn luasnap_relayout_memo_limit(memo: *mut c_void, limit: u64);
    pub(crate) fn luasnap_relayout_memo_over(memo: *const c_void) -> c_int;
    pub(crate) fn luasnap_hash_seed(L: *mut lua_State) -> u32;
}

// ident.c: identities of keys (patch 4), for save-games.
unsafe extern "C" {
    pub(crate) fn luasnap_identity_at(L: *mut lua_State, idx: c_int) -> u32;
    pub(crate) fn luasnap_identity(o: *const c_void) -> u32;
    pub(crate) fn luasnap_set_identity(L: *mut lua_State, idx: c_int, id: u32) -> c_int;
    pub(crate) fn luasnap_name_identity(
        L: *mut lua_State,
        idx: c_int,
        name: *const c_char,
        len: usize,
    );
    pub(crate) fn luasnap_key_counter(L: *mut lua_State) -> u64;
    pub(crate) fn luasnap_set_key_counter(L: *mut lua_State, n: u64);
}

// state.c: the collector and memory, for the serializer.
unsafe extern "C" {
    pub(crate) fn luasnap_gc_stopem(L: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_gc_quiet(L: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_gc_uncounted(L: *mut lua_State) -> usize;
    pub(crate) fn luasnap_fresh_keys(L: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_gc_nopoints(L: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_gc_defer_begin(L: *mut lua_State) -> i64;
    pub(crate) fn luasnap_gmatch_positions(L: *mut lua_State, idx: c_int, out: *mut i64) -> c_int;
    pub(crate) fn luasnap_gc_defer_end(L: *mut lua_State, saved: i64);
    pub(crate) fn luasnap_gc_nofinal(L: *mut lua_State, on: c_int) -> c_int;
    pub(crate) fn luasnap_finalizers_foreign(L: *mut lua_State, since: c_int) -> c_int;
    pub(crate) fn luasnap_finalizers_mark(L: *mut lua_State, since: c_int, clear: c_int);
    pub(crate) fn luasnap_final_state(L: *mut lua_State, o: *const c_void) -> c_int;
    pub(crate) fn luasnap_final_state_at(
        L: *mut lua_State,
        idx: c_int,
        gco: *mut *const c_void,
    ) -> c_int;
    pub(crate) fn luasnap_finalizer_list(
        L: *mut lua_State,
        out: *mut *const c_void,
        cap: usize,
    ) -> usize;
    pub(crate) fn luasnap_push_finalizable(L: *mut lua_State, o: *const c_void) -> c_int;
    pub(crate) fn luasnap_setmetatable_unmarked(L: *mut lua_State, idx: c_int) -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn luasnap_finalizers_restore(
        L: *mut lua_State,
        since: c_int,
        objs: c_int,
        marked: *const u32,
        n: c_int,
        unmarked: *const u32,
        m: c_int,
        clear: c_int,
        scratch: *mut *mut c_void,
    ) -> c_int;
    pub(crate) fn luasnap_finalizers_head(L: *mut lua_State) -> *const c_void;
    pub(crate) fn luasnap_finalizers_replaced(L: *mut lua_State, head: *const c_void);
    pub(crate) fn luasnap_heap_bytes(L: *mut lua_State) -> u64;
}

unsafe extern "C-unwind" {
    pub(crate) fn luasnap_gc_full_quiet(L: *mut lua_State);
    pub(crate) fn luasnap_checkstack(L: *mut lua_State, n: c_int, msg: *const c_char);
    pub(crate) fn luasnap_raise_memerr(L: *mut lua_State) -> !;
}

// canonical.c: arena bytes that depend on the Lua state alone.
unsafe extern "C" {
    pub(crate) fn luasnap_settle_thread(th: *mut lua_State) -> c_int;
    pub(crate) fn luasnap_scrub_idle_state(L: *mut lua_State);
    pub(crate) fn luasnap_clear_dead_stack(L: *mut lua_State);
    pub(crate) fn luasnap_reset_strcache(L: *mut lua_State);
    pub(crate) fn luasnap_is_weak_removable(L: *mut lua_State, idx: c_int) -> c_int;
    pub(crate) static luasnap_min_stack_bytes: usize;
    pub(crate) fn luasnap_has_light(p: *const c_void, size: usize) -> c_int;
    pub(crate) fn luasnap_scrub_light(p: *mut c_void, size: usize);
}

// budget.c: the instruction budget of the running OS thread (lvm.h), and the load's budget
// hook that finalizers keep (Lua patch 8).
unsafe extern "C" {
    pub(crate) fn luasnap_budget_begin(budget: u64, spent_message: *const c_char) -> c_int;
    pub(crate) fn luasnap_budget_end(
        budget: u64,
        used: *mut u64,
        place: *mut c_char,
        n: usize,
    ) -> c_int;
    pub(crate) fn luasnap_register_load_hook(h: Option<lua_Hook>);
}

// strkey.c: the string table's keyed hash (Lua patch 9).
unsafe extern "C" {
    pub(crate) fn luasnap_strtab_longest_chain(L: *mut lua_State) -> c_int;
}

// corolib.c, detsort.c: the library functions luasnap replaces (Lua C functions: they may
// raise).

unsafe extern "C-unwind" {
    pub(crate) fn luasnap_co_resume(L: *mut lua_State) -> c_int;
    pub(crate) fn luasnap_co_wrap(L: *mut lua_State) -> c_int;
    pub(crate) fn luasnap_co_close(L: *mut lua_State) -> c_int;
    pub(crate) fn luasnap_det_sort(L: *mut lua_State) -> c_int;
    pub(crate) fn luasnap_det_randomseed(L: *mut lua_State) -> c_int;
}

// cfids.c (compiled into the Lua library: ltable.c calls it): light C functions' identities.
unsafe extern "C" {
    pub(crate) fn luasnap_cfunction_name(
        f: lua_CFunction,
        name: *const c_char,
        len: usize,
    ) -> c_int;
}

// readline.c: the stand-alone interpreter's terminal (`luasnap run` only).
#[cfg(feature = "interpreter")]
unsafe extern "C" {
    pub(crate) fn luasnap_readline_init(L: *mut lua_State, lib: *const c_char) -> c_int;
    pub(crate) fn luasnap_readline(prompt: *const c_char, line: *mut *mut c_char) -> c_int;
    pub(crate) fn luasnap_readline_done(line: *mut c_char);
    pub(crate) fn luasnap_default_sigpipe();
    pub(crate) fn luasnap_interruptible(L: *mut lua_State, on: c_int);
}

#[cfg(test)]
mod tests;
