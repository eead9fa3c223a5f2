//! The writer's working memory, kept between persists on a thread, and the sizes of its
//! buffers. The kinds' files that fill each part (`table.rs`, `layout.rs`, `proto.rs`, ...)
//! import it; it imports none of them.

use super::super::format::{GameTable, Writer};
use super::csrc::{RawVal, ScanEntry};
use super::frame::{Frame, Seg};
use super::ids::IdMap;
use mlua_sys as ffi;
use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_int, c_void};

/// Table entries described per `luasnap_table_scan` call.
/// A code-1 node of `_G` or `package.loaded` (see `luasnap_table_removed_keys`), described
/// together with the layout the game root carries for that table, so that the node indices
/// match it whatever runs before the keys are written (a finalizer may change the tables).
/// `key` is an identity only, never read through.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GameRemovedNode {
    pub(super) table: GameTable,
    pub(super) node: u32,
    pub(super) key: *const c_void,
    pub(super) kind: u8,
}

pub(super) const SCAN_BATCH: usize = 64;

/// Upvalues a Lua closure can have (Lua's MAXUPVAL).
pub(super) const MAX_UPVALUES: usize = 255;

/// The writer's working memory: kept between persists on a thread (up to `SCRATCH_KEEP`
/// bytes), so a save does not pay again for allocating, growing and page-faulting what the
/// last one already had, the id table first (a quarter of the arena's used extent).
///
/// Invariant: between persists everything but the buffers' capacity is meaningless;
/// [`Scratch::take`] empties each part before a persist uses it.
#[derive(Default)]
pub(super) struct Scratch {
    /// Objects written by identity, to their id, and strings written, to their string id.
    pub refs: IdMap,
    /// Identities of the strings not anchored yet, in id order (see `Persister::anchor`).
    pub unanchored: Vec<*const c_void>,
    /// Tables and closures written without being anchored yet, and their ids.
    pub unanchored_objs: Vec<*const c_void>,
    pub unanchored_ids: Vec<ffi::lua_Integer>,
    /// Entries described by table scans, a stack of batches (see `TableFrame`).
    pub scan: Vec<ScanEntry>,
    /// Upvalues written (by `IdMap` index, `IdSpace::Upval`): the closure (object id) and the
    /// upvalue number that wrote each first.
    pub upval_homes: Vec<(u32, c_int)>,
    /// Prototypes written, to their index in the file.
    pub protos: HashMap<*const c_void, u32>,
    /// Chunks written (by record): their index in the file, and where each prototype of the
    /// chunk's tree is (its path and place), by fingerprint.
    pub chunks: HashMap<*const c_void, (u32, HashMap<u64, TreeEntry>)>,
    pub frames: Vec<Frame>,
    pub segs: Vec<Seg>,
    /// Scratch for tables' layouts.
    pub layout: LayoutBufs,
    /// Upvalues (identity, value) described by the last closure scan.
    pub cl_uids: Vec<*const c_void>,
    pub cl_vals: Vec<RawVal>,
    /// Tables written whose layouts have removed entries without their keys (code 1), whose
    /// keys go after the root (see `Persister::removed_keys`).
    pub removed_tables: Vec<*const c_void>,
    /// What `luasnap_table_removed_keys` describes of one of them: nodes, identities, kinds.
    pub rk_nodes: Vec<u32>,
    pub rk_ptrs: Vec<*const c_void>,
    pub rk_kinds: Vec<u8>,
}

/// Where a prototype is in its chunk's tree: the child indices from the main prototype, and
/// its place (the names from the main prototype down; see `persist::place`).
pub(super) struct TreeEntry {
    pub(super) path: Vec<u32>,
    pub(super) place: Vec<Vec<u8>>,
}

/// Scratch buffers for tables' layouts (filled and kept by `layout.rs`).
///
/// Invariant: `cache` is zeroed or holds `luasnap_layout_cache_size()` bytes that only
/// `luasnap_table_layout` wrote since the last [`LayoutBufs::forget_layouts`]; `written[w]`
/// is non-empty only if bit `w` of `kept` is set, and then holds the bytes written for the
/// table that filled cache entry `w` in this epoch.
#[derive(Default)]
pub(super) struct LayoutBufs {
    pub(super) codes: Vec<u32>,
    pub(super) nexts: Vec<i32>,
    pub(super) idx: Vec<u32>,
    pub(super) blob: Writer,
    /// The layout cache of `luasnap_table_layout` (zeroed: empty).
    pub(super) cache: Vec<u64>,
    /// For each entry of that cache, the bytes written (tag, length, layout) for the table
    /// that filled it in this epoch, or nothing (not filled since the epoch began, or its
    /// layout has removed keys, which the cache does not compare).
    pub(super) written: Vec<Vec<u8>>,
    /// Bit w set: `written[w]` holds bytes (`luasnap_table_layout` then skips copying the
    /// entry's codes on a hit).
    pub(super) kept: u64,
    /// Bit w set: the layout `written[w]` holds has code-1 nodes (removed entries whose keys
    /// go after the root).
    pub(super) kept_dead: u64,
}

/// The most scratch memory a thread keeps between persists (enough for arenas of about
/// 64 MiB); a persist that needed more frees it when done.
const SCRATCH_KEEP: usize = 16 << 20;

thread_local! {
    /// The scratch of the last persist on this thread (a nested persist, from a `__persist`
    /// function, finds none and makes its own).
    static SCRATCH: std::cell::Cell<Option<Scratch>> = const { std::cell::Cell::new(None) };
}

impl Scratch {
    /// This thread's kept scratch, emptied, or a new one.
    pub fn take(arena_base: usize) -> Scratch {
        let mut sc = SCRATCH.with(|c| c.take()).unwrap_or_default();
        sc.refs.reset(arena_base);
        sc.unanchored.clear();
        sc.unanchored_objs.clear();
        sc.unanchored_ids.clear();
        sc.scan.clear();
        sc.scan.reserve(4 * SCAN_BATCH);
        sc.upval_homes.clear();
        sc.protos.clear();
        sc.chunks.clear();
        sc.frames.clear();
        sc.segs.clear();
        sc.cl_uids.resize(MAX_UPVALUES, std::ptr::null());
        sc.cl_vals.resize(MAX_UPVALUES, RawVal::EMPTY);
        sc.layout.forget_layouts();
        sc.removed_tables.clear();
        sc
    }

    /// Bytes it holds.
    fn footprint(&self) -> usize {
        fn bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        self.refs.footprint()
            + bytes(&self.unanchored)
            + bytes(&self.unanchored_objs)
            + bytes(&self.unanchored_ids)
            + bytes(&self.scan)
            + bytes(&self.upval_homes)
            + self.protos.capacity() * 16
            + bytes(&self.frames)
            + bytes(&self.segs)
            + self.layout.footprint()
            + bytes(&self.removed_tables)
            + bytes(&self.rk_nodes)
            + bytes(&self.rk_ptrs)
            + bytes(&self.rk_kinds)
    }

    /// Keeps it for the thread's next persist, if it is not too large.
    pub fn keep(self) {
        if self.footprint() <= SCRATCH_KEEP {
            SCRATCH.with(|c| c.set(Some(self)));
        }
    }
}
