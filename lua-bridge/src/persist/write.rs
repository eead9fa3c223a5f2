//! Persisting: Lua values to the save-game format.
//!
//! Depth first, without recursion on the native stack and with O(1) Lua stack: each object
//! being written is a frame on a Rust stack; tables are iterated by entry position (array
//! part, then hash nodes: `luasnap_table_scan` and `luasnap_table_next` in
//! `csrc/internals.c`), so resuming a table after a child object costs no key lookup, and a
//! million-deep linked list needs a million small frames and nothing more.
//!
//! Two paths. The scan describes a table's entries without pushing them; primitives,
//! strings, objects already written, new tables and closures whose upvalues are plain are
//! written straight from it, tables and closures tracked by identity and anchored only before
//! Lua code runs (see [`Persister::anchor`]). Everything else goes the general way: the value
//! pushed, inspected through the C API, its contents a frame.
//!
//! All Rust state lives in [`Persister`], owned outside the protected call: a Lua error (from a
//! `__persist` function, or out of memory) unwinds only frames that hold nothing to drop.

use super::format::{
    Tag, Writer, MIN_STRREF_LEN, THREAD_DEAD, THREAD_NOT_STARTED, THREAD_SUSPENDED,
};
use super::{
    kind, luasnap_checkstack, luasnap_gc_stopem, ChunkDesc, PersistOptions, RawVal, Slots,
};
use super::{luasnap_chunk_describe, luasnap_proto_child, luasnap_proto_nchildren};
use super::{luasnap_proto, luasnap_proto_hash, luasnap_proto_nupvalues};
use super::{
    luasnap_thread_cis, luasnap_thread_info, luasnap_thread_push_slot, luasnap_upval_open, CiRecord,
};
use crate::bridge::ffi::Shared;
use mlua_sys::{self as ffi, lua_State};
use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_int, c_void, CStr, CString};

unsafe extern "C" {
    fn luasnap_table_next(L: *mut lua_State, t: *const c_void, pos: *mut u32) -> c_int;
    fn luasnap_table_entry(L: *mut lua_State, t: *const c_void, pos: u32, what: c_int) -> c_int;
    fn luasnap_table_scan(
        L: *mut lua_State,
        t: *const c_void,
        pos: u32,
        out: *mut ScanEntry,
        max: c_int,
    ) -> c_int;
    fn luasnap_string_bytes(ts: *const c_void, len: *mut usize) -> *const std::ffi::c_char;
    fn luasnap_table_info(
        t: *const c_void,
        key: *const c_void,
        narr: *mut u32,
        nhash: *mut u32,
        mt: *mut *const c_void,
    ) -> c_int;
    fn luasnap_anchor(
        L: *mut lua_State,
        idx: c_int,
        ps: *const *const c_void,
        keys: *const ffi::lua_Integer,
        n: c_int,
        first: ffi::lua_Integer,
    );
    fn luasnap_push_metatable(L: *mut lua_State, t: *const c_void);
    fn luasnap_meta_has(mt: *const c_void, key: *const c_void) -> c_int;
    fn luasnap_table_layout(
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
    fn luasnap_layout_cache_size() -> usize;
    fn luasnap_layout_cache_reset(cache: *mut c_void);
    fn luasnap_proto_tree_hashes(p: *const c_void, hs: *mut u64, max: c_int) -> c_int;
    fn luasnap_node_key(L: *mut lua_State, t: *const c_void, i: u32, out: *mut RawVal);
    fn luasnap_thread_tbc(co: *mut lua_State, out: *mut i32, max: c_int) -> c_int;
    fn luasnap_closure_scan(
        f: *const c_void,
        proto: *mut *const c_void,
        uids: *mut *const c_void,
        vals: *mut RawVal,
        max: c_int,
    ) -> c_int;
}

/// Upvalues a Lua closure can have (Lua's MAXUPVAL).
const MAX_UPVALUES: usize = 255;

/// Table entries described per `luasnap_table_scan` call.
const SCAN_BATCH: usize = 64;
/// Scanned entries kept for tables waiting on a child (see `Frame::Table`); past this many,
/// a table opening a child drops the rest of its batch and scans it again later, so deep
/// nesting costs no more memory than a frame each.
const SCAN_KEEP: usize = 1 << 15;

/// Object identities (addresses) to ids, in four id spaces (see [`Kind`]). Every Lua object
/// lives in the VM's arena, 16-byte aligned, and is visited in about the order it was
/// allocated, so ids sit in a table indexed by arena offset / 16 (one 4-byte slot per 16 bytes
/// of arena, in leaves of `LEAF` slots allocated when first used): a lookup is an index, and
/// objects allocated together have their slots together, where a hash map scattered them (its
/// lookups were most of the writer's cache misses). The kinds share the table (a slot holds
/// the id + 1 and the kind in its top two bits): no two objects alive share an address, and
/// nothing is freed while a persist runs (see `Persister::anchor`). Whatever does not fit (an
/// identity outside the arena's first `DENSE_SPAN` bytes or not 16-byte aligned, such as a C
/// function or a userdata's memory, an id past `ID_MASK - 1`, a slot taken by another kind)
/// goes to a hash map.
///
/// The table outlives a persist (see [`Scratch`]): [`IdMap::reset`] empties it for the next,
/// zeroing the leaves written since the last reset (a small save after a large one zeroes
/// the large one's leaves once, not at every save).
#[derive(Default)]
struct IdMap {
    base: usize,
    leaves: Vec<Option<Box<[u32; LEAF]>>>,
    far: HashMap<(usize, Kind), u32>,
    /// Whether `far` holds an identity the table could have held (then misses look there too).
    far_dense: bool,
    /// Leaves `dirty.0..dirty.1` may hold slots written since the last reset.
    dirty: (usize, usize),
}

/// Slots per leaf of `IdMap` (a leaf covers 16 KiB of arena).
const LEAF: usize = 1024;
/// Arena offsets `IdMap` indexes directly (past this, identities go to its hash map).
const DENSE_SPAN: usize = 1 << 34;
/// Where a slot's kind starts.
const KIND_SHIFT: u32 = 30;
/// A slot's id + 1 (the rest is its kind).
const ID_MASK: u32 = (1 << KIND_SHIFT) - 1;

/// Which id space of `IdMap`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    /// An object written (its object id).
    Obj = 0,
    /// A string written (its string id).
    Str = 1,
    /// An upvalue written (its index in `Persister::upval_homes`).
    Upval = 2,
    /// A permanent (id 0): written by name, by the general path, until it has an object id.
    Perm = 3,
}

impl IdMap {
    /// Empties the map for a persist of the arena at `base`, keeping its memory.
    fn reset(&mut self, base: usize) {
        self.base = base;
        let (lo, hi) = self.dirty;
        for leaf in self.leaves.iter_mut().take(hi).skip(lo).flatten() {
            leaf.fill(0);
        }
        self.dirty = (usize::MAX, 0);
        self.far.clear();
        self.far_dense = false;
    }

    /// Notes that leaf `i` gets a slot written.
    #[inline]
    fn touch(&mut self, i: usize) {
        self.dirty = (self.dirty.0.min(i), self.dirty.1.max(i + 1));
    }

    /// Bytes it holds.
    fn footprint(&self) -> usize {
        self.leaves.capacity() * std::mem::size_of::<Option<Box<[u32; LEAF]>>>()
            + self.leaves.iter().flatten().count() * LEAF * 4
            + self.far.capacity() * 24
    }

    /// The table index of `p`, if the table can hold it.
    #[inline]
    fn key(&self, p: *const c_void) -> Option<usize> {
        let off = (p as usize).wrapping_sub(self.base);
        (off & 15 == 0 && off < DENSE_SPAN).then_some(off >> 4)
    }

    #[inline]
    fn get(&self, p: *const c_void, kind: Kind) -> Option<u32> {
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get(k / LEAF) {
                let e = leaf[k % LEAF];
                if e != 0 && e >> KIND_SHIFT == kind as u32 {
                    return Some((e & ID_MASK) - 1);
                }
            }
            if !self.far_dense {
                return None;
            }
        }
        self.far.get(&(p as usize, kind)).copied()
    }

    #[inline]
    fn contains(&self, p: *const c_void) -> bool {
        self.get(p, Kind::Obj).is_some()
    }

    /// Gives `p` the id `id` of `kind`. A permanent's slot takes the object id it gets.
    #[inline]
    fn insert(&mut self, p: *const c_void, kind: Kind, id: u32) {
        // The common case in one look at the slot: its leaf exists and the slot is free.
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get_mut(k / LEAF) {
                let e = &mut leaf[k % LEAF];
                if *e == 0 && id < ID_MASK - 1 {
                    *e = (kind as u32) << KIND_SHIFT | (id + 1);
                    self.touch(k / LEAF);
                    return;
                }
            }
        }
        self.insert_slow(p, kind, id);
    }

    /// `insert`, every case.
    #[inline(never)]
    fn insert_slow(&mut self, p: *const c_void, kind: Kind, id: u32) {
        if let Some(k) = self.key(p) {
            if id < ID_MASK - 1 {
                let i = k / LEAF;
                if i >= self.leaves.len() {
                    self.leaves.resize_with(i + 1, || None);
                }
                let leaf = self.leaves[i].get_or_insert_with(|| Box::new([0; LEAF]));
                let e = &mut leaf[k % LEAF];
                let old = *e >> KIND_SHIFT;
                if *e == 0 || old == kind as u32 || (old == Kind::Perm as u32 && kind == Kind::Obj)
                {
                    *e = (kind as u32) << KIND_SHIFT | (id + 1);
                    self.touch(i);
                    return;
                }
            }
            self.far_dense = true;
        }
        self.far.insert((p as usize, kind), id);
    }

    /// What the object `p` is to the writer: `Ok(id)` written, with that object id;
    /// `Err(true)` neither written nor a permanent; `Err(false)` a permanent not written yet.
    /// As `get(p, Kind::Obj)` then `get(p, Kind::Perm)`, in one look at the slot when it can.
    #[inline]
    fn obj_state(&self, p: *const c_void) -> Result<u32, bool> {
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get(k / LEAF) {
                let e = leaf[k % LEAF];
                if e >> KIND_SHIFT == Kind::Obj as u32 && e != 0 {
                    return Ok((e & ID_MASK) - 1);
                }
                if !self.far_dense {
                    // Nothing of the table's span is in the hash map: the slot says all.
                    return Err(!(e != 0 && e >> KIND_SHIFT == Kind::Perm as u32));
                }
            }
        }
        match self.get(p, Kind::Obj) {
            Some(id) => Ok(id),
            None => Err(self.get(p, Kind::Perm).is_none()),
        }
    }

    /// The id of `p`, or None after giving it `id`.
    #[inline]
    fn get_or_insert(&mut self, p: *const c_void, kind: Kind, id: u32) -> Option<u32> {
        // The common cases in one look at the slot: found, or free (and, with nothing of the
        // table's span in the hash map, not there either).
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get_mut(k / LEAF) {
                let e = &mut leaf[k % LEAF];
                if *e != 0 && *e >> KIND_SHIFT == kind as u32 {
                    return Some((*e & ID_MASK) - 1);
                }
                if *e == 0 && !self.far_dense && id < ID_MASK - 1 {
                    *e = (kind as u32) << KIND_SHIFT | (id + 1);
                    self.touch(k / LEAF);
                    return None;
                }
            }
        }
        let old = self.get(p, kind);
        if old.is_none() {
            self.insert(p, kind, id);
        }
        old
    }

    /// Room in the top level for an arena of `bytes`.
    fn reserve(&mut self, bytes: usize) {
        self.leaves
            .reserve((bytes / 16 / LEAF).min(DENSE_SPAN / 16 / LEAF));
    }
}

/// A failure whose message is staged in `Persister::error`.
pub(crate) struct Fail;

enum Frame {
    /// The table `t` (kept alive by the graph, or anchored: see `anchor`).
    /// state 0: metatable next; 1: next entry; 2: the key at `pos - 1` (the object `key`) has
    /// been written, its value next. `pos`: the position after the current entry.
    ///
    /// Its scanned entries live in `Persister::scan` from `floor` on; those still to write are
    /// `scan[lo..hi]`, the ones from `pos` on. Invariant: they describe the table as it is
    /// while `gen` equals `Persister::scan_gen`, which changes before Lua code runs (only Lua
    /// code can change a table being written or free what its entries point to; the collector
    /// is stopped); a stale or empty batch is scanned again from `pos`. Child frames scan
    /// above `hi` and truncate back to their own floor when done.
    Table {
        t: *const c_void,
        state: u8,
        pos: u32,
        key: *const c_void,
        floor: u32,
        lo: u32,
        hi: u32,
        gen: u32,
    },
    LClosure {
        id: u32,
        next: c_int,
        n: c_int,
    },
    CClosure {
        id: u32,
        next: c_int,
        n: c_int,
    },
    /// state 0: metatable; then user values 1..=nuv.
    UdBytes {
        id: u32,
        state: c_int,
        nuv: c_int,
    },
    /// A `__persist` result: state 0: first function; 1: second (two-phase init); 2: done.
    Special {
        id: u32,
        state: u8,
        two: bool,
    },
    /// Stack slots 1..n, then (if suspended) `nci` frame records.
    Thread {
        id: u32,
        next: c_int,
        n: c_int,
        nci: c_int,
    },
}

/// Where the writer is, for error messages.
#[derive(Clone, Copy)]
enum Seg {
    Key,
    Meta,
    Upvalue(c_int),
    UserValue(c_int),
    Special(u8),
    Stack(c_int),
}

/// Scratch buffers for tables' layouts (see `Persister::end_table`).
#[derive(Default)]
struct LayoutBufs {
    codes: Vec<u32>,
    nexts: Vec<i32>,
    idx: Vec<u32>,
    blob: Vec<u8>,
    /// The layout cache of `luasnap_table_layout` (zeroed: empty).
    cache: Vec<u64>,
    /// For each entry of that cache, the bytes written (tag, length, layout) for the table
    /// that filled it in this epoch, or nothing (not filled since the epoch began, or its
    /// layout has removed keys, which the cache does not compare).
    written: Vec<Vec<u8>>,
    /// Bit w set: `written[w]` holds bytes (`luasnap_table_layout` then skips copying the
    /// entry's codes on a hit).
    kept: u64,
}

/// Entries of `luasnap_table_layout`'s cache (LS_LC_WAYS in csrc/internals.c).
const LAYOUT_WAYS: usize = 64;

impl LayoutBufs {
    /// Starts a new epoch of the layout cache: Lua code may run next, or a new persist
    /// starts (either may free a string and give its address to another).
    fn forget_layouts(&mut self) {
        if self.cache.is_empty() {
            // SAFETY: a size query.
            let bytes = unsafe { luasnap_layout_cache_size() };
            self.cache = vec![0; bytes.div_ceil(8)];
        }
        // SAFETY: the cache has luasnap_layout_cache_size() bytes, 8-byte aligned.
        unsafe { luasnap_layout_cache_reset(self.cache.as_mut_ptr().cast()) };
        for w in &mut self.written {
            w.clear();
        }
        self.kept = 0;
    }
}

/// Appends a tag and a varint (the hot paths' `Writer::tag` + `Writer::varint`, with one
/// capacity check for the usual one- or two-byte varint).
#[inline(always)]
fn put_tagged(out: &mut Vec<u8>, tag: Tag, v: u64) {
    if v < 0x80 {
        out.extend_from_slice(&[tag as u8, v as u8]);
    } else {
        out.push(tag as u8);
        put_varint(out, v);
    }
}

/// Whether a scanned value's kind is a primitive or a string (no id lookup to write it).
#[inline(always)]
fn is_prim(k: u64) -> bool {
    matches!(k, kind::FALSE..=kind::STR | kind::NIL)
}

/// A table entry described by `luasnap_table_scan` (mirrors `luasnap_sentry`): each side's
/// [`kind`] and bits (see [`full_val`]); strings by identity alone.
#[repr(C)]
#[derive(Clone, Copy)]
struct ScanEntry {
    kbits: u64,
    vbits: u64,
    /// The entry's position plus one.
    pos: u32,
    kkind: u8,
    vkind: u8,
}

// The C side checks the same size for `luasnap_sentry`.
const _: () = assert!(std::mem::size_of::<ScanEntry>() == 24);

/// A scanned value (`kind`, `bits` of a [`ScanEntry`]) as a [`RawVal`], a string's bytes
/// included.
///
/// # Safety
/// The value was just described by `luasnap_table_scan`; no Lua code ran since.
unsafe fn full_val(kind: u64, bits: u64) -> RawVal {
    let mut v = RawVal {
        kind,
        bits,
        ..RawVal::EMPTY
    };
    if kind == kind::STR {
        let mut len = 0usize;
        // SAFETY: bits is a live TString (callers' contract); reads only.
        v.s = unsafe { luasnap_string_bytes(bits as usize as *const c_void, &mut len) };
        v.len = len as u64;
    }
    v
}

/// Appends a tag and 8 little-endian bytes.
#[inline]
fn put_tagged_u64(out: &mut Vec<u8>, tag: Tag, v: u64) {
    let mut b = [0u8; 9];
    b[0] = tag as u8;
    b[1..].copy_from_slice(&v.to_le_bytes());
    out.extend_from_slice(&b);
}

/// Appends `v` as a varint (the format's).
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) struct Persister<'a> {
    /// Working memory kept between persists on a thread: the id table (objects written by
    /// identity, to their id; strings written, to their string id), the objects and strings
    /// not anchored yet, table-scan batches, closure scans, prototypes and chunks written,
    /// upvalue homes, the frame stack and layout buffers (see [`Scratch`]).
    sc: Scratch,
    pub w: Writer,
    /// String ids given so far.
    nstrs: u32,
    /// String ids from this one on are not anchored yet (see `anchor`).
    anchored: u32,
    /// The spkey string (anchored in `strs[0]`).
    spkey_str: *const c_void,
    /// The last metatable `meta_has_spkey` looked in, and its answer.
    last_meta: (*const c_void, bool),
    /// Changes whenever Lua code may run (see `anchor`): older batches are stale.
    scan_gen: u32,
    next_id: u32,
    /// Fingerprints of the prototypes of the chunks written, by identity (forgotten before
    /// Lua code runs, which could free a prototype and give its address to another).
    proto_hashes: HashMap<*const c_void, u64>,
    pub error: Option<String>,
    pub has_bytecode: bool,
    /// Whether the file carries source text.
    pub has_source: bool,
    opts: &'a PersistOptions,
    spkey: CString,
    shared: &'a Shared,
    dump: Vec<u8>,
}

unsafe extern "C-unwind" fn dump_writer(
    _L: *mut lua_State,
    p: *const c_void,
    sz: usize,
    ud: *mut c_void,
) -> c_int {
    if sz == 0 || p.is_null() {
        return 0;
    }
    // SAFETY: ud is the Persister's dump buffer; p has sz readable bytes.
    unsafe {
        (*(ud as *mut Vec<u8>)).extend_from_slice(std::slice::from_raw_parts(p.cast::<u8>(), sz))
    };
    0
}

/// The writer's working memory: kept between persists on a thread (up to `SCRATCH_KEEP`
/// bytes), so a save does not pay again for allocating, growing and page-faulting what the
/// last one already had, the id table first (a quarter of the arena's used extent).
#[derive(Default)]
struct Scratch {
    /// Objects written by identity, to their id, and strings written, to their string id.
    refs: IdMap,
    /// Identities of the strings not anchored yet, in id order (see `Persister::anchor`).
    unanchored: Vec<*const c_void>,
    /// Tables and closures written without being anchored yet, and their ids.
    unanchored_objs: Vec<*const c_void>,
    unanchored_ids: Vec<ffi::lua_Integer>,
    /// Entries described by table scans, a stack of batches (see `Frame::Table`).
    scan: Vec<ScanEntry>,
    /// Upvalues written (by `IdMap` index, `Kind::Upval`): the closure (object id) and the
    /// upvalue number that wrote each first.
    upval_homes: Vec<(u32, c_int)>,
    /// Prototypes written, to their index in the file.
    protos: HashMap<*const c_void, u32>,
    /// Chunks written (by record): their index in the file, and the path to each prototype of
    /// the chunk's tree by fingerprint.
    chunks: HashMap<*const c_void, (u32, HashMap<u64, Vec<u32>>)>,
    frames: Vec<Frame>,
    segs: Vec<Seg>,
    /// Scratch for tables' layouts.
    layout: LayoutBufs,
    /// Upvalues (identity, value) described by the last closure scan.
    cl_uids: Vec<*const c_void>,
    cl_vals: Vec<RawVal>,
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
    fn take(arena_base: usize) -> Scratch {
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
            + bytes(&self.layout.codes)
            + bytes(&self.layout.nexts)
            + bytes(&self.layout.idx)
            + bytes(&self.layout.blob)
            + bytes(&self.layout.cache)
            + self.layout.written.iter().map(bytes).sum::<usize>()
    }

    /// Keeps it for the thread's next persist, if it is not too large.
    fn keep(self) {
        if self.footprint() <= SCRATCH_KEEP {
            SCRATCH.with(|c| c.set(Some(self)));
        }
    }
}

impl Drop for Persister<'_> {
    fn drop(&mut self) {
        std::mem::take(&mut self.sc).keep();
    }
}

impl<'a> Persister<'a> {
    pub fn new(opts: &'a PersistOptions, shared: &'a Shared) -> Self {
        Persister {
            sc: Scratch::take(shared.arena_base),
            w: Writer::file(),
            nstrs: 0,
            anchored: 0,
            spkey_str: std::ptr::null(),
            last_meta: (std::ptr::null(), false),
            scan_gen: 0,
            next_id: 0,
            proto_hashes: HashMap::default(),
            error: None,
            has_bytecode: false,
            has_source: false,
            spkey: CString::new(opts.spkey.as_str())
                .unwrap_or_else(|_| CString::new("__persist").unwrap()),
            opts,
            shared,
            dump: Vec::new(),
        }
    }

    /// The closure (object id) and upvalue number that wrote the upvalue `uid` first.
    #[inline]
    fn upval_home(&self, uid: *const c_void) -> Option<(u32, c_int)> {
        let i = self.sc.refs.get(uid, Kind::Upval)?;
        Some(self.sc.upval_homes[i as usize])
    }

    /// Records that upvalue number `at` of the closure `owner` wrote the upvalue `uid`.
    fn set_upval_home(&mut self, uid: *const c_void, owner: u32, at: c_int) {
        self.sc
            .refs
            .insert(uid, Kind::Upval, self.sc.upval_homes.len() as u32);
        self.sc.upval_homes.push((owner, at));
    }

    /// Whether `p` is the identity of a permanent not written yet (then the general path
    /// writes it, by name).
    #[inline]
    fn is_permanent(&self, p: *const c_void) -> bool {
        self.sc.refs.get(p, Kind::Perm).is_some()
    }

    /// Writes the value on top of the stack (popped). `slots` locates the helper tables.
    ///
    /// # Safety
    /// Protected context; `slots` are valid absolute indices of this call's helper tables.
    pub unsafe fn run(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: protected context (callers' contract).
        unsafe {
            // No emergency collection while objects are known by address (ids, kept scan
            // batches): one clearing a weak table could free what they point to. The caller
            // puts the flag back.
            luasnap_gc_stopem(L, 1);
            // Collect the permanents' identities once (a few hundred entries).
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, s.perms) != 0 {
                ffi::lua_settop(L, -2);
                if !matches!(
                    ffi::lua_type(L, -1),
                    ffi::LUA_TNIL | ffi::LUA_TBOOLEAN | ffi::LUA_TNUMBER | ffi::LUA_TSTRING
                ) {
                    self.sc
                        .refs
                        .insert(ffi::lua_topointer(L, -1), Kind::Perm, 0);
                }
            }
            ffi::lua_pushlstring(L, self.spkey.as_ptr(), self.spkey.as_bytes().len());
            self.spkey_str = ffi::lua_topointer(L, -1);
            ffi::lua_rawseti(L, s.strs, 0);
            let used = ffi::lua_gc(L, ffi::LUA_GCCOUNT) as usize * 1024;
            self.w.buf.reserve(used / 4);
            self.sc.refs.reserve(used);
            self.value(L, s)?;
            while !self.sc.frames.is_empty() {
                if !self.advance(L, s)? {
                    self.sc.frames.pop();
                }
            }
        }
        Ok(())
    }

    fn fail(&mut self, L: *mut lua_State, what: String) -> Fail {
        self.error = Some(if self.opts.path {
            // SAFETY: reads the keys table; formatting only inspects primitives.
            format!("{what} at {}", unsafe { self.path(L) })
        } else {
            format!(
                "{what} (for where it is in the value, turn on paths: PersistOptions::path, \
                 or eris.settings(\"path\", true))"
            )
        });
        Fail
    }

    unsafe fn path(&self, L: *mut lua_State) -> String {
        let mut out = String::from("root");
        for (depth, seg) in self.sc.segs.iter().enumerate() {
            match *seg {
                Seg::Key => {
                    let Some(&Frame::Table { t, pos, .. }) = self.sc.frames.get(depth) else {
                        continue;
                    };
                    // SAFETY: the frame's table is alive; the current entry is at pos - 1; the
                    // push is popped (the stack has room: fail runs with few values).
                    unsafe {
                        luasnap_checkstack(L, 2, c"persist".as_ptr());
                        if pos > 0 && luasnap_table_entry(L, t, pos - 1, 0) != 0 {
                            out.push_str(&key_text(L));
                            ffi::lua_settop(L, -2);
                        }
                    }
                }
                Seg::Meta => out.push_str("@metatable"),
                Seg::Upvalue(i) => out.push_str(&format!("@upvalue[{i}]")),
                Seg::UserValue(i) => out.push_str(&format!("@uservalue[{i}]")),
                Seg::Special(0) => out.push_str("@persist"),
                Seg::Special(_) => out.push_str("@persist_init"),
                Seg::Stack(i) => out.push_str(&format!("@stack[{i}]")),
            }
        }
        out
    }

    #[inline(always)]
    fn new_id(&mut self, p: *const c_void) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.sc.refs.insert(p, Kind::Obj, id);
        id
    }

    /// Writes the value on top (popped): primitives and references at once, new objects as a
    /// header plus a frame for their contents.
    unsafe fn value(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: protected context; the value is on top.
        unsafe {
            let t = ffi::lua_type(L, -1);
            match t {
                ffi::LUA_TNIL => self.w.tag(Tag::Nil),
                ffi::LUA_TBOOLEAN => self.w.tag(if ffi::lua_toboolean(L, -1) != 0 {
                    Tag::True
                } else {
                    Tag::False
                }),
                ffi::LUA_TNUMBER => {
                    if ffi::lua_isinteger(L, -1) != 0 {
                        self.w.tag(Tag::Int);
                        self.w.i64(ffi::lua_tointegerx(L, -1, std::ptr::null_mut()));
                    } else {
                        self.w.tag(Tag::Float);
                        self.w
                            .u64(ffi::lua_tonumberx(L, -1, std::ptr::null_mut()).to_bits());
                    }
                }
                ffi::LUA_TSTRING => {
                    let mut len = 0;
                    let p = ffi::lua_tolstring(L, -1, &mut len);
                    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
                    self.string(ffi::lua_topointer(L, -1), bytes);
                }
                ffi::LUA_TLIGHTUSERDATA => {
                    if self.permanent(L, s) {
                        return Ok(());
                    }
                    self.w.tag(Tag::Light);
                    self.w.u64(ffi::lua_touserdata(L, -1) as u64);
                }
                _ => return self.object(L, s, t),
            }
            ffi::lua_settop(L, -2);
        }
        Ok(())
    }

    /// Writes a string. Strings of MIN_STRREF_LEN bytes or more are written once and referred
    /// to afterwards (by identity `obj`: short strings are interned, so that is one object per
    /// content); shorter ones cost less to repeat than to look up.
    #[inline(always)]
    fn string(&mut self, obj: *const c_void, bytes: &[u8]) {
        if bytes.len() >= MIN_STRREF_LEN {
            // Most strings are written already: their reference, inline.
            if let Some(old) = self.sc.refs.get(obj, Kind::Str) {
                put_tagged(&mut self.w.buf, Tag::StrRef, old as u64);
                return;
            }
        }
        self.new_string(obj, bytes);
    }

    /// `string`, for a string to write whole (new, or too short to refer to).
    #[inline(never)]
    fn new_string(&mut self, obj: *const c_void, bytes: &[u8]) {
        if bytes.len() < MIN_STRREF_LEN {
            self.w.tag(Tag::Str);
            self.w.bytes(bytes);
        } else {
            match self.sc.refs.get_or_insert(obj, Kind::Str, self.nstrs) {
                Some(old) => put_tagged(&mut self.w.buf, Tag::StrRef, old as u64),
                None => {
                    self.nstrs += 1;
                    put_tagged(&mut self.w.buf, Tag::Str, bytes.len() as u64);
                    self.w.buf.extend_from_slice(bytes);
                    self.sc.unanchored.push(obj);
                }
            }
        }
    }

    /// Anchors the strings, tables and closures recorded by identity since the last call
    /// (strings in the strings table, the others in `seen` under their ids). Identities are only valid while
    /// the objects live: until Lua code runs, every one recorded is reachable from the
    /// unchanged graph, but a `__persist` function may change the graph and run a full
    /// collection, and a freed object's address could come back as another object. So this
    /// runs before every call into Lua code.
    ///
    /// # Safety
    /// Protected context; no Lua code ran since the objects were recorded.
    unsafe fn anchor(&mut self, L: *mut lua_State, s: Slots) {
        // SAFETY: every pointer is a live object (see above); the tables are at s.strs, s.seen.
        unsafe {
            luasnap_anchor(
                L,
                s.strs,
                self.sc.unanchored.as_ptr(),
                std::ptr::null(),
                self.sc.unanchored.len() as c_int,
                self.anchored as ffi::lua_Integer + 1,
            );
            luasnap_anchor(
                L,
                s.seen,
                self.sc.unanchored_objs.as_ptr(),
                self.sc.unanchored_ids.as_ptr(),
                self.sc.unanchored_objs.len() as c_int,
                0,
            );
        }
        // Lua code runs next: scanned batches waiting in parent frames are stale, and so are
        // the layouts cached by string identity.
        self.scan_gen = self.scan_gen.wrapping_add(1);
        self.sc.layout.forget_layouts();
        self.last_meta = (std::ptr::null(), false);
        self.proto_hashes.clear();
        self.anchored += self.sc.unanchored.len() as u32;
        self.sc.unanchored.clear();
        self.sc.unanchored_objs.clear();
        self.sc.unanchored_ids.clear();
    }

    /// For a scanned table `t` not written yet (its id looked up), that can be written by
    /// identity, without pushing it (not a permanent, no special persistence): records it
    /// (a new id, anchored later) and returns its sizes and metatable for `table_header`.
    ///
    /// # Safety
    /// `t` was just described by `luasnap_table_scan`; no Lua code ran since.
    unsafe fn unseen_table_info(&mut self, t: *const c_void) -> Option<(u32, u32, *const c_void)> {
        if self.is_permanent(t) {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_table_info(t) }
    }

    /// `unseen_table_info` for a table known not to be a permanent.
    ///
    /// # Safety
    /// As for `unseen_table_info`.
    #[inline]
    unsafe fn new_table_info(&mut self, t: *const c_void) -> Option<(u32, u32, *const c_void)> {
        let (mut narr, mut nhash, mut mt) = (0u32, 0u32, std::ptr::null());
        // SAFETY: t is a live table (callers' contract); no key, no lookup.
        unsafe { luasnap_table_info(t, std::ptr::null(), &mut narr, &mut nhash, &mut mt) };
        // SAFETY: t's metatable is live; nothing ran since t was described.
        if !mt.is_null() && unsafe { self.meta_has_spkey(mt) } {
            return None;
        }
        self.record(t);
        Some((narr, nhash, mt))
    }

    /// Whether the metatable `mt` (of a table being written) has the special-persistence key.
    /// The last answer is kept: tables of one class share their metatable, and no metatable
    /// changes until Lua code runs (`anchor` forgets it).
    ///
    /// # Safety
    /// `mt` is a live table; no Lua code ran since the table that has it was described.
    #[inline]
    unsafe fn meta_has_spkey(&mut self, mt: *const c_void) -> bool {
        if mt != self.last_meta.0 {
            // SAFETY: mt is a live table (callers' contract), spkey_str a live string.
            let has = unsafe { luasnap_meta_has(mt, self.spkey_str) } != 0;
            self.last_meta = (mt, has);
        }
        self.last_meta.1
    }

    /// Whether the object `p` is neither written yet nor a permanent (which the general path
    /// writes by name).
    fn unwritten(&self, p: *const c_void) -> bool {
        !self.sc.refs.contains(p) && !self.is_permanent(p)
    }

    /// Gives the object `p`, written by identity, its id, and lists it for `anchor`.
    #[inline(always)]
    fn record(&mut self, p: *const c_void) -> u32 {
        let id = self.new_id(p);
        self.sc.unanchored_objs.push(p);
        self.sc.unanchored_ids.push(id as ffi::lua_Integer);
        id
    }

    /// For a scanned value that is a Lua closure not written yet, that can be written whole
    /// without pushing it: not a permanent, its prototype written before, every upvalue closed
    /// and holding a plain value (see `plain`) or shared with a closure written before. Returns
    /// its prototype's index and upvalue count, with the upvalues in `cl_uids` and `cl_vals`,
    /// for `write_closure`.
    ///
    /// # Safety
    /// `v` was just described by `luasnap_table_scan`; no Lua code ran since.
    unsafe fn closure_info(&mut self, vkind: u64, f: *const c_void) -> Option<(u32, usize)> {
        if vkind != kind::LCLOSURE || !self.unwritten(f) {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_closure_info(f) }
    }

    /// `closure_info` for a scanned value known to be neither written nor a permanent.
    ///
    /// # Safety
    /// As for `closure_info`.
    #[inline]
    unsafe fn closure_info_scanned(
        &mut self,
        vkind: u64,
        f: *const c_void,
    ) -> Option<(u32, usize)> {
        if vkind != kind::LCLOSURE {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_closure_info(f) }
    }

    /// `closure_info` for a Lua closure known to be neither written nor a permanent.
    ///
    /// # Safety
    /// As for `closure_info`.
    unsafe fn new_closure_info(&mut self, f: *const c_void) -> Option<(u32, usize)> {
        let mut proto = std::ptr::null();
        // SAFETY: f is a live Lua closure (callers' contract); the buffers hold MAX_UPVALUES.
        let n = unsafe {
            luasnap_closure_scan(
                f,
                &mut proto,
                self.sc.cl_uids.as_mut_ptr(),
                self.sc.cl_vals.as_mut_ptr(),
                MAX_UPVALUES as c_int,
            )
        };
        let n = usize::try_from(n).ok()?;
        let index = *self.sc.protos.get(&proto)?;
        let plain = (0..n).all(|i| {
            self.upval_home(self.sc.cl_uids[i]).is_some() || self.plain(&self.sc.cl_vals[i])
        });
        plain.then_some((index, n))
    }

    /// Writes the closure `f` that `closure_info` just described, as the general path would.
    ///
    /// # Safety
    /// As for `closure_info`, which returned `(index, n)` for `f`.
    unsafe fn write_closure(&mut self, f: *const c_void, (index, n): (u32, usize)) {
        let id = self.record(f);
        self.w.tag(Tag::LClosure);
        self.w.varint(index as u64);
        self.w.varint(n as u64);
        for i in 0..n {
            let (uid, v) = (self.sc.cl_uids[i], self.sc.cl_vals[i]);
            if let Some((owner, at)) = self.upval_home(uid) {
                self.w.tag(Tag::UpvalRef);
                self.w.varint(owner as u64);
                self.w.varint(at as u64);
            } else {
                self.set_upval_home(uid, id, i as c_int + 1);
                self.w.tag(Tag::UpvalNew);
                // SAFETY: v was described by the closure scan; nothing ran since.
                unsafe { self.write_plain(&v) };
            }
        }
    }

    /// Ends a table's entries: with its hash part's layout (`Tag::Layout`) when its keys
    /// allow one (see `luasnap_table_layout`), so that a load keeps `next`'s order; else
    /// with `Tag::Nil`.
    ///
    /// # Safety
    /// `t` is a live table; no Lua code runs meanwhile.
    unsafe fn end_table(&mut self, L: *mut lua_State, t: *const c_void) {
        let lay = &mut self.sc.layout;
        let out = &mut self.w.buf;
        let (mut lastfree, mut seed, mut nodes, mut way) = (0u32, 0u32, 0u32, -1i32);
        let n = loop {
            let cap = lay.codes.len();
            // SAFETY: the buffers hold `cap` entries each, the cache its size; t is live;
            // reads only the table.
            let n = unsafe {
                luasnap_table_layout(
                    L,
                    t,
                    lay.codes.as_mut_ptr(),
                    lay.nexts.as_mut_ptr(),
                    lay.idx.as_mut_ptr(),
                    cap as u32,
                    &mut lastfree,
                    &mut seed,
                    lay.cache.as_mut_ptr().cast(),
                    &mut nodes,
                    &mut way,
                    lay.kept,
                )
            } as usize;
            let size = nodes as usize;
            if size < 2 || size <= cap {
                break n;
            }
            lay.codes.resize(size, 0);
            lay.nexts.resize(size, 0);
            lay.idx.resize(size, 0);
        };
        if n == 0 {
            out.push(Tag::Nil as u8);
            return;
        }
        // A table laid out like the one that filled this cache entry: the same bytes, unless
        // that one had removed keys (their values are not compared).
        let hit = way
            .checked_sub(LAYOUT_WAYS as i32)
            .and_then(|w| lay.written.get(w as usize))
            .filter(|b| !b.is_empty());
        if let Some(b) = hit {
            out.extend_from_slice(b);
            return;
        }
        let start = out.len();
        lay.blob.clear();
        put_varint(&mut lay.blob, seed as u64);
        put_varint(&mut lay.blob, n as u64);
        put_varint(&mut lay.blob, lastfree as u64);
        let mut removed_keys = false;
        for (i, (&c, &nx)) in lay.codes[..n].iter().zip(&lay.nexts[..n]).enumerate() {
            put_varint(&mut lay.blob, c as u64);
            if c != 0 {
                let nx = nx as i64;
                put_varint(&mut lay.blob, ((nx << 1) ^ (nx >> 63)) as u64);
            }
            if c == 2 {
                removed_keys = true;
                // A removed entry's key (a number, boolean or string).
                let mut k = RawVal::EMPTY;
                // SAFETY: i < the node count; t is live; reads only.
                unsafe { luasnap_node_key(L, t, i as u32, &mut k) };
                put_varint(&mut lay.blob, k.kind);
                match k.kind {
                    kind::INT => {
                        let v = k.bits as i64;
                        put_varint(&mut lay.blob, ((v << 1) ^ (v >> 63)) as u64);
                    }
                    kind::FLOAT => put_varint(&mut lay.blob, k.bits),
                    kind::STR => {
                        put_varint(&mut lay.blob, k.len);
                        // SAFETY: describe() gave the live string's bytes and length.
                        let b =
                            unsafe { std::slice::from_raw_parts(k.s.cast::<u8>(), k.len as usize) };
                        lay.blob.extend_from_slice(b);
                    }
                    _ => {}
                }
            }
        }
        out.push(Tag::Layout as u8);
        put_varint(out, lay.blob.len() as u64);
        out.extend_from_slice(&lay.blob);
        if let Ok(w) = usize::try_from(way) {
            if w < LAYOUT_WAYS {
                // This layout filled cache entry w: keep its bytes for the tables that hit it.
                if lay.written.len() < LAYOUT_WAYS {
                    lay.written.resize_with(LAYOUT_WAYS, Vec::new);
                }
                let keep = &mut lay.written[w];
                keep.clear();
                lay.kept &= !(1 << w);
                if !removed_keys {
                    keep.extend_from_slice(&out[start..]);
                    lay.kept |= 1 << w;
                }
            }
        }
    }

    /// Writes a table's header and (if nil or written already) its metatable, and pushes the
    /// frame for the rest.
    #[inline(always)]
    fn table_header(&mut self, t: *const c_void, (narr, nhash, mt): (u32, u32, *const c_void)) {
        put_tagged(&mut self.w.buf, Tag::Table, narr as u64);
        self.w.varint(nhash as u64);
        // The metatable comes first: written here when it is nil or already written (the
        // common case: shared metatables), else by the frame.
        let mut state = 0;
        if mt.is_null() {
            self.w.tag(Tag::Nil);
            state = 1;
        } else if let Some(mid) = self.sc.refs.get(mt, Kind::Obj) {
            put_tagged(&mut self.w.buf, Tag::Ref, mid as u64);
            state = 1;
        }
        let floor = self.sc.scan.len() as u32;
        self.sc.frames.push(Frame::Table {
            t,
            state,
            pos: 0,
            key: std::ptr::null(),
            floor,
            lo: floor,
            hi: floor,
            gen: self.scan_gen,
        });
    }

    /// What a scanned value is to the table loop: `Ok(None)` a primitive or a string,
    /// `Ok(Some(id))` an object written already, `Err(true)` an object not written yet,
    /// `Err(false)` anything else (for the general path). One id lookup per object.
    #[inline]
    fn classify(&self, v: &RawVal) -> Result<Option<u32>, bool> {
        match v.kind {
            kind::FALSE..=kind::STR | kind::NIL => Ok(None),
            kind::OBJ | kind::TABLE | kind::LCLOSURE => {
                match self
                    .sc
                    .refs
                    .get(v.bits as usize as *const c_void, Kind::Obj)
                {
                    Some(id) => Ok(Some(id)),
                    None => Err(true),
                }
            }
            _ => Err(false),
        }
    }

    /// Writes a value `classify` found plain: by its id if it has one.
    ///
    /// # Safety
    /// As for `write_plain`.
    #[inline]
    unsafe fn write_classified(&mut self, v: &RawVal, id: Option<u32>) {
        match id {
            Some(id) => put_tagged(&mut self.w.buf, Tag::Ref, id as u64),
            // SAFETY: callers' contract.
            None => unsafe { self.write_plain(v) },
        }
    }

    /// Whether a scanned value can be written without the general path: a primitive, a
    /// string, or an object already written (a reference).
    fn plain(&self, v: &RawVal) -> bool {
        match v.kind {
            kind::FALSE..=kind::STR => true,
            kind::OBJ | kind::TABLE | kind::LCLOSURE => {
                self.sc.refs.contains(v.bits as usize as *const c_void)
            }
            kind::NIL => true,
            _ => false,
        }
    }

    /// Writes a scanned primitive or string (`is_prim(kind)` holds; `bits` as the scan gave
    /// them: a string by identity).
    ///
    /// # Safety
    /// The value was just described by `luasnap_table_scan`; no Lua code ran since.
    #[inline(always)]
    unsafe fn write_scanned(&mut self, kind: u64, bits: u64) {
        match kind {
            kind::STR => {
                let obj = bits as usize as *const c_void;
                // Most strings are written already: their reference, inline (a string without
                // an id is new, or too short to refer to).
                match self.sc.refs.get(obj, Kind::Str) {
                    Some(id) => put_tagged(&mut self.w.buf, Tag::StrRef, id as u64),
                    // SAFETY: a live string (callers' contract).
                    None => unsafe { self.new_scanned_string(obj) },
                }
            }
            kind::INT => {
                let i = bits as i64;
                put_tagged(&mut self.w.buf, Tag::Int, ((i << 1) ^ (i >> 63)) as u64);
            }
            kind::FALSE => self.w.tag(Tag::False),
            kind::TRUE => self.w.tag(Tag::True),
            kind::FLOAT => put_tagged_u64(&mut self.w.buf, Tag::Float, bits),
            _ => self.w.tag(Tag::Nil),
        }
    }

    /// Writes the scanned string `obj` that has no string id yet.
    ///
    /// # Safety
    /// `obj` is a live string's identity from `luasnap_table_scan`; no Lua code ran since.
    #[inline(never)]
    unsafe fn new_scanned_string(&mut self, obj: *const c_void) {
        let mut len = 0usize;
        // SAFETY: obj is a live TString (callers' contract); reads only.
        let p = unsafe { luasnap_string_bytes(obj, &mut len) };
        // SAFETY: the string's bytes, alive while it is (nothing runs meanwhile).
        let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
        self.new_string(obj, bytes);
    }

    /// Writes a scanned value for which `plain` holds.
    ///
    /// # Safety
    /// `v` was just described by `luasnap_table_scan` (a string's bytes are live).
    unsafe fn write_plain(&mut self, v: &RawVal) {
        match v.kind {
            kind::NIL => self.w.tag(Tag::Nil),
            kind::FALSE => self.w.tag(Tag::False),
            kind::TRUE => self.w.tag(Tag::True),
            kind::INT => {
                let i = v.bits as i64;
                put_tagged(&mut self.w.buf, Tag::Int, ((i << 1) ^ (i >> 63)) as u64);
            }
            kind::FLOAT => put_tagged_u64(&mut self.w.buf, Tag::Float, v.bits),
            kind::STR => {
                // SAFETY: the scan pointed at the live string's bytes (callers' contract).
                let bytes = unsafe { std::slice::from_raw_parts(v.s.cast::<u8>(), v.len as usize) };
                self.string(v.bits as usize as *const c_void, bytes);
            }
            _ => {
                let id = self
                    .sc
                    .refs
                    .get(v.bits as usize as *const c_void, Kind::Obj)
                    .expect("`plain` checked that the object is written");
                put_tagged(&mut self.w.buf, Tag::Ref, id as u64);
            }
        }
    }

    /// If the value on top is a permanent, writes it (popped) and returns true.
    unsafe fn permanent(&mut self, L: *mut lua_State, s: Slots) -> bool {
        // SAFETY: rawget on the permanents table (value -> key) does not raise.
        unsafe {
            if ffi::lua_type(L, -1) != ffi::LUA_TLIGHTUSERDATA
                && !self.is_permanent(ffi::lua_topointer(L, -1))
            {
                return false;
            }
            ffi::lua_pushvalue(L, -1);
            if ffi::lua_rawget(L, s.perms) == ffi::LUA_TNIL {
                ffi::lua_settop(L, -2);
                return false;
            }
            self.w.tag(Tag::Perm);
            let kt = ffi::lua_type(L, -1);
            // A permanent's key is a primitive: write it as a value.
            if !matches!(kt, ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN) {
                ffi::lua_settop(L, -2);
                self.w.tag(Tag::Nil);
            } else {
                let _ = self.value(L, s);
            }
            if ffi::lua_type(L, -1) != ffi::LUA_TLIGHTUSERDATA {
                let p = ffi::lua_topointer(L, -1);
                self.new_id(p);
            }
            ffi::lua_settop(L, -2);
            true
        }
    }

    unsafe fn object(&mut self, L: *mut lua_State, s: Slots, t: c_int) -> Result<(), Fail> {
        // SAFETY: protected context; the object is on top.
        unsafe {
            let ptr = ffi::lua_topointer(L, -1);
            if let Some(id) = self.sc.refs.get(ptr, Kind::Obj) {
                self.w.tag(Tag::Ref);
                self.w.varint(id as u64);
                ffi::lua_settop(L, -2);
                return Ok(());
            }
            if self.permanent(L, s) {
                return Ok(());
            }
            // Anchor it (keeps it alive and findable by id), then write its header.
            let id = self.new_id(ptr);
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawseti(L, s.seen, id as ffi::lua_Integer);
            match t {
                ffi::LUA_TTABLE => {
                    if self.special(L, s, id)? {
                        return Ok(());
                    }
                    // Anchored in seen[id] above.
                    let (mut narr, mut nhash, mut mt) = (0u32, 0u32, std::ptr::null());
                    luasnap_table_info(ptr, std::ptr::null(), &mut narr, &mut nhash, &mut mt);
                    self.table_header(ptr, (narr, nhash, mt));
                }
                ffi::LUA_TFUNCTION => {
                    if ffi::lua_iscfunction(L, -1) == 0 {
                        self.lclosure(L, s, id)?;
                    } else {
                        self.cclosure(L, s, id)?;
                    }
                }
                ffi::LUA_TUSERDATA => self.userdata(L, s, id)?,
                ffi::LUA_TTHREAD => self.thread(L, id)?,
                _ => {
                    return Err(self.fail(
                        L,
                        format!(
                            "cannot persist a value of type {}",
                            crate::bridge::ffi::type_name(L, -1)
                        ),
                    ))
                }
            }
            ffi::lua_settop(L, -2);
        }
        Ok(())
    }

    /// Handles `__persist` (the configured key) on a table or userdata on top. Returns true if
    /// it wrote the object (as a thunk or two-phase), false to persist it normally.
    unsafe fn special(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<bool, Fail> {
        // SAFETY: protected context; may call the metamethod (Lua code).
        unsafe {
            if ffi::luaL_getmetafield(L, -1, self.spkey.as_ptr()) == ffi::LUA_TNIL {
                return Ok(false);
            }
            match ffi::lua_type(L, -1) {
                ffi::LUA_TBOOLEAN if ffi::lua_toboolean(L, -1) != 0 => {
                    ffi::lua_settop(L, -2);
                    Ok(false)
                }
                ffi::LUA_TBOOLEAN => {
                    ffi::lua_settop(L, -2);
                    let what = format!(
                        "{} refuses to be persisted ({} is false)",
                        crate::bridge::ffi::type_name(L, -1),
                        self.opts.spkey
                    );
                    Err(self.fail(L, what))
                }
                ffi::LUA_TFUNCTION => {
                    // __persist(obj) returns a rebuild function, or a create thunk and an
                    // initializer (two-phase).
                    self.anchor(L, s);
                    ffi::lua_pushvalue(L, -2);
                    // Lua code may collect (everything written is anchored above): the
                    // collector must find the flag clear (lgc.c's singlestep asserts it).
                    luasnap_gc_stopem(L, 0);
                    ffi::lua_callk(L, 1, 2, 0, None);
                    luasnap_gc_stopem(L, 1);
                    let two = ffi::lua_type(L, -1) != ffi::LUA_TNIL;
                    if ffi::lua_type(L, -2) != ffi::LUA_TFUNCTION
                        || (two && ffi::lua_type(L, -1) != ffi::LUA_TFUNCTION)
                    {
                        ffi::lua_settop(L, -3);
                        let what = format!("{} must return a function (or two)", self.opts.spkey);
                        return Err(self.fail(L, what));
                    }
                    // Keep the functions reachable by id while their frames run: seen[-id-1].
                    ffi::lua_createtable(L, 2, 0);
                    ffi::lua_rotate(L, -3, 1);
                    ffi::lua_rawseti(L, -3, 2);
                    ffi::lua_rawseti(L, -2, 1);
                    ffi::lua_rawseti(L, s.seen, -(id as ffi::lua_Integer) - 1);
                    self.w.tag(if two { Tag::TwoPhase } else { Tag::Thunk });
                    self.sc.frames.push(Frame::Special { id, state: 0, two });
                    ffi::lua_settop(L, -2);
                    Ok(true)
                }
                _ => {
                    ffi::lua_settop(L, -2);
                    let what = format!("{} must be true, false or a function", self.opts.spkey);
                    Err(self.fail(L, what))
                }
            }
        }
    }

    unsafe fn lclosure(&mut self, L: *mut lua_State, _s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a Lua closure is on top.
        unsafe {
            let proto = luasnap_proto(L, -1);
            let n = luasnap_proto_nupvalues(proto);
            self.w.tag(Tag::LClosure);
            match self.sc.protos.get(&proto) {
                Some(&index) => self.w.varint(index as u64),
                None => {
                    let index = self.sc.protos.len() as u32;
                    self.sc.protos.insert(proto, index);
                    self.w.varint(index as u64);
                    let hash = match self.proto_hashes.get(&proto) {
                        Some(&h) => h,
                        None => luasnap_proto_hash(proto),
                    };
                    self.w.u64(hash);
                    let mut ar: ffi::lua_Debug = std::mem::zeroed();
                    ffi::lua_pushvalue(L, -1);
                    ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar);
                    self.w.varint(ar.linedefined.max(0) as u64);
                    if !self.chunk_home(proto, hash) {
                        // Detached: compiled outside the chunk registry, no source text.
                        self.w.varint(0);
                        let src = std::ffi::CStr::from_ptr(ar.short_src.as_ptr()).to_bytes();
                        self.w.bytes(src);
                        if self.opts.bytecode {
                            self.dump.clear();
                            crate::bridge::chunks::luasnap_dump(
                                L,
                                dump_writer,
                                (&mut self.dump as *mut Vec<u8>).cast(),
                                (!self.opts.debug) as c_int,
                            );
                            self.w.bytes(&self.dump);
                            self.has_bytecode = true;
                        } else {
                            self.w.bytes(&[]);
                        }
                    }
                }
            }
            self.w.varint(n as u64);
            self.sc.frames.push(Frame::LClosure { id, next: 1, n });
        }
        Ok(())
    }

    /// Writes where prototype `proto` (fingerprint `hash`) lives: its chunk (the chunk's name,
    /// main fingerprint and code the first time) and its path in the chunk's tree. Returns
    /// false, writing nothing, for a prototype outside every chunk record.
    unsafe fn chunk_home(&mut self, proto: *const c_void, hash: u64) -> bool {
        let mut d = ChunkDesc::EMPTY;
        // SAFETY: proto is alive (its closure is on the stack); the collector is stopped, so
        // the record, its text and its tree stay put while the pointers are used.
        if unsafe { luasnap_chunk_describe(proto, &mut d) } == 0 {
            return false;
        }
        if !self.sc.chunks.contains_key(&d.rec) {
            let mut paths = HashMap::default();
            let mut path = Vec::new();
            // SAFETY: d.main is the record's live main prototype; the buffer holds `max`.
            let hashes = unsafe {
                let mut hs = vec![0u64; 64];
                let mut n = luasnap_proto_tree_hashes(d.main, hs.as_mut_ptr(), hs.len() as c_int);
                if n > hs.len() as c_int {
                    hs.resize(n as usize, 0);
                    n = luasnap_proto_tree_hashes(d.main, hs.as_mut_ptr(), n);
                }
                hs.truncate(n.max(0) as usize);
                (n >= 0).then_some(hs)
            };
            let mut at = 0;
            // SAFETY: as above.
            unsafe {
                tree_paths(
                    d.main,
                    &mut path,
                    &mut paths,
                    hashes.as_deref(),
                    &mut at,
                    &mut self.proto_hashes,
                )
            };
            if !paths.contains_key(&hash) {
                return false;
            }
            let index = self.sc.chunks.len() as u32;
            self.w.varint(index as u64 + 1);
            // SAFETY: the record's text and name, alive with it (see above).
            let (src, name) = unsafe {
                (
                    std::slice::from_raw_parts(d.src.cast::<u8>(), d.srclen),
                    if d.name.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(d.name.cast::<u8>(), d.namelen)
                    },
                )
            };
            let binary = src.first() == Some(&0x1b);
            self.w.u8(binary as u8);
            self.w.bytes(name);
            match self.proto_hashes.get(&d.main) {
                Some(&h) => self.w.u64(h),
                // SAFETY: as above.
                None => self.w.u64(unsafe { luasnap_proto_hash(d.main) }),
            }
            if (binary && self.opts.bytecode) || (!binary && self.opts.code) {
                self.w.bytes(src);
                if binary {
                    self.has_bytecode = true;
                } else {
                    self.has_source = true;
                }
            } else {
                self.w.bytes(&[]);
            }
            self.sc.chunks.insert(d.rec, (index, paths));
        } else {
            let (index, paths) = &self.sc.chunks[&d.rec];
            if !paths.contains_key(&hash) {
                return false;
            }
            self.w.varint(*index as u64 + 1);
        }
        let path = &self.sc.chunks[&d.rec].1[&hash];
        self.w.varint(path.len() as u64);
        for &i in path {
            self.w.varint(i as u64);
        }
        true
    }

    unsafe fn cclosure(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a C function is on top.
        unsafe {
            let f = ffi::lua_tocfunction(L, -1);
            let mut n = 0;
            while !ffi::lua_getupvalue(L, -1 - n, n + 1).is_null() {
                n += 1;
            }
            ffi::lua_settop(L, -1 - n);
            // Look the bare function up among the permanents.
            match f {
                Some(f) => ffi::lua_pushcclosure(L, f, 0),
                None => ffi::lua_pushnil(L),
            }
            ffi::lua_rawget(L, s.perms);
            if !matches!(ffi::lua_type(L, -1), ffi::LUA_TSTRING | ffi::LUA_TNUMBER) {
                ffi::lua_settop(L, -2);
                let what = if n == 0 {
                    "attempt to persist a light C function that is not a permanent: register it (Vm::register_native, or perms[fn] = \"name\" in eris.persist)".to_string()
                } else {
                    "attempt to persist a C closure whose function is not a permanent: add the function to the permanents table".to_string()
                };
                return Err(self.fail(L, what));
            }
            // string.gmatch's iterator keeps a match state with raw pointers into its
            // subject and pattern (a userdata without __persist): say so, not that.
            if ffi::lua_type(L, -1) == ffi::LUA_TSTRING
                && CStr::from_ptr(ffi::lua_tostring(L, -1)) == super::GMATCH_AUX
            {
                ffi::lua_settop(L, -2);
                let what = "a string.gmatch iterator cannot be saved: its match state points into \
                     Lua's memory; iterate it to completion before the frame ends, or keep the \
                     string and the position (string.find with an init argument) instead"
                    .to_string();
                return Err(self.fail(L, what));
            }
            self.w.tag(Tag::CClosure);
            self.value(L, s)?;
            self.w.varint(n as u64);
            self.sc.frames.push(Frame::CClosure { id, next: 1, n });
        }
        Ok(())
    }

    unsafe fn userdata(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a full userdata is on top.
        unsafe {
            // Registered plain-data types persist by type name and bytes.
            if ffi::lua_getmetatable(L, -1) != 0 {
                let mt = ffi::lua_topointer(L, -1);
                ffi::lua_settop(L, -2);
                let size = ffi::lua_rawlen(L, -1) as usize;
                if let Some(ty) = self
                    .shared
                    .userdata_types()
                    .iter()
                    .find(|t| t.metatable == mt && t.size == size)
                {
                    let p = ffi::lua_touserdata(L, -1).cast::<u8>();
                    self.w.tag(Tag::UdPlain);
                    self.w.bytes(ty.name.as_bytes());
                    self.w.bytes(std::slice::from_raw_parts(p, size));
                    return Ok(());
                }
            }
            if self.special(L, s, id)? {
                return Ok(());
            }
            if ffi::luaL_getmetafield(L, -1, self.spkey.as_ptr()) == ffi::LUA_TNIL {
                let what = format!(
                    "cannot persist a userdata without {key}: give its metatable {key} = true (bytes), a function, or register it as PlainData",
                    key = self.opts.spkey
                );
                return Err(self.fail(L, what));
            }
            ffi::lua_settop(L, -2);
            // __persist = true: its bytes, metatable and user values.
            let len = ffi::lua_rawlen(L, -1) as usize;
            let p = ffi::lua_touserdata(L, -1).cast::<u8>();
            let mut nuv = 0;
            while ffi::lua_getiuservalue(L, -1 - nuv, nuv + 1) != ffi::LUA_TNONE {
                nuv += 1;
            }
            ffi::lua_settop(L, -2 - nuv);
            self.w.tag(Tag::UdBytes);
            self.w.bytes(std::slice::from_raw_parts(p, len));
            self.w.varint(nuv as u64);
            self.sc.frames.push(Frame::UdBytes { id, state: 0, nuv });
        }
        Ok(())
    }

    unsafe fn thread(&mut self, L: *mut lua_State, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a thread is on top.
        unsafe {
            let co = ffi::lua_tothread(L, -1);
            let is_main = if co == L {
                let m = ffi::lua_pushthread(L) == 1;
                ffi::lua_settop(L, -2);
                m
            } else {
                let m = ffi::lua_pushthread(co) == 1;
                ffi::lua_settop(co, -2);
                m
            };
            // As Eris: the running coroutine cannot be written (its stack is this call), nor
            // the main thread (a load has its own; a suspended coroutine is what persists).
            if co == L {
                return Err(self.fail(L, "cannot persist the running coroutine".to_string()));
            }
            if is_main {
                return Err(self.fail(L, "cannot persist the main thread".to_string()));
            }
            let mut ar: ffi::lua_Debug = std::mem::zeroed();
            let status = ffi::lua_status(co);
            let started = ffi::lua_getstack(co, 0, &mut ar) != 0;
            let (mut size, mut nci, mut tbc, mut errfunc) = (0, 0, 0, 0i64);
            luasnap_thread_info(co, &mut size, &mut nci, &mut tbc, &mut errfunc);
            if status == ffi::LUA_OK && !started && size > 1 {
                self.w.tag(Tag::Thread);
                self.w.u8(THREAD_NOT_STARTED);
                self.w.varint((size - 1) as u64);
                self.sc.frames.push(Frame::Thread {
                    id,
                    next: 1,
                    n: size - 1,
                    nci: 0,
                });
            } else if (status == ffi::LUA_OK && !started)
                || (status != ffi::LUA_OK && status != ffi::LUA_YIELD)
            {
                self.w.tag(Tag::Thread);
                self.w.u8(THREAD_DEAD);
            } else if status == ffi::LUA_YIELD {
                let _ = tbc; // pending to-be-closed variables follow the frames
                self.w.tag(Tag::Thread);
                self.w.u8(THREAD_SUSPENDED);
                self.w.varint((size - 1) as u64);
                self.w.i64(errfunc);
                self.sc.frames.push(Frame::Thread {
                    id,
                    next: 1,
                    n: size - 1,
                    nci,
                });
            } else {
                return Err(self.fail(L, "cannot persist a running coroutine".to_string()));
            }
        }
        Ok(())
    }

    /// Moves the top frame on by one child (a table frame: through its entries, and on into
    /// the tables it opens and back, popping those it completes). Returns false when the top
    /// frame is complete (the caller pops it).
    unsafe fn advance(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // A table frame that opens a child table or completes goes on with the new top frame
        // here, without a return to `run` for each table.
        'frames: loop {
            let depth = self.sc.frames.len();
            // Path bookkeeping: the segment for this frame's current child.
            self.sc.segs.truncate(depth - 1);
            // SAFETY: protected context; each arm pushes one child value and writes it.
            unsafe {
                return match self.sc.frames.last_mut().expect("non-empty") {
                    Frame::Table {
                        t,
                        state,
                        pos,
                        key,
                        floor,
                        lo,
                        hi,
                        gen,
                    } => {
                        let (t, st) = (*t, *state);
                        match st {
                            0 => {
                                *state = 1;
                                self.sc.segs.push(Seg::Meta);
                                luasnap_push_metatable(L, t);
                                self.value(L, s)?;
                                Ok(true)
                            }
                            2 => {
                                // The key (an object) has been written; now its value.
                                *state = 1;
                                let (at, written) = (*pos - 1, *key);
                                self.sc.segs.push(Seg::Key);
                                // The entry must still be the key just written: a __persist
                                // function may have changed this table meanwhile.
                                let same = luasnap_table_entry(L, t, at, 0) != 0 && {
                                    let p = ffi::lua_topointer(L, -1);
                                    ffi::lua_settop(L, -2);
                                    p == written
                                };
                                if !same || luasnap_table_entry(L, t, at, 1) == 0 {
                                    let what = "a table changed while it was being persisted (by a __persist function?)".to_string();
                                    return Err(self.fail(L, what));
                                }
                                self.value(L, s)?;
                                Ok(true)
                            }
                            _ => {
                                // Entries from `pos` on. Those of primitives, strings, objects
                                // already written and new tables go from a scan of the table
                                // straight to the buffer (a new table's entries by its own
                                // frame, the rest of the batch kept for when it is done); the
                                // rest one at a time, pushed: [v, k].
                                self.sc.segs.push(Seg::Key);
                                let mut at = *pos;
                                let floor = *floor as usize;
                                let (mut i, mut end) = (*lo as usize, *hi as usize);
                                if *gen != self.scan_gen || end > self.sc.scan.len() {
                                    i = end; // stale: scan again from `pos`
                                }
                                // Whether the last scan reached the table's end (it stops early
                                // only when the batch is full): then no scan after it.
                                let mut exhausted = false;
                                loop {
                                    if i >= end {
                                        if exhausted {
                                            break;
                                        }
                                        self.sc.scan.truncate(floor);
                                        self.sc.scan.reserve(SCAN_BATCH);
                                        // SAFETY: room for SCAN_BATCH entries past `floor`; the C
                                        // side fills every field of the `n` entries it returns
                                        // (plain data), which set_len then covers.
                                        let n = luasnap_table_scan(
                                            L,
                                            t,
                                            at,
                                            self.sc.scan.as_mut_ptr().add(floor),
                                            SCAN_BATCH as c_int,
                                        ) as usize;
                                        if n == 0 {
                                            break;
                                        }
                                        self.sc.scan.set_len(floor + n);
                                        (i, end) = (floor, floor + n);
                                        exhausted = n < SCAN_BATCH;
                                    }
                                    let e = self.sc.scan[i];
                                    i += 1;
                                    let mut opened = None;
                                    let (kk, vk) = (e.kkind as u64, e.vkind as u64);
                                    if is_prim(kk) {
                                        // The usual key (a primitive or a string): the value
                                        // decides, with one look at its id slot if an object.
                                        if is_prim(vk) {
                                            self.write_scanned(kk, e.kbits);
                                            self.write_scanned(vk, e.vbits);
                                            at = e.pos;
                                            continue;
                                        }
                                        if matches!(vk, kind::OBJ | kind::TABLE | kind::LCLOSURE) {
                                            let v = e.vbits as usize as *const c_void;
                                            match self.sc.refs.obj_state(v) {
                                                Ok(id) => {
                                                    self.write_scanned(kk, e.kbits);
                                                    put_tagged(
                                                        &mut self.w.buf,
                                                        Tag::Ref,
                                                        id as u64,
                                                    );
                                                    at = e.pos;
                                                    continue;
                                                }
                                                Err(true) if vk == kind::TABLE => {
                                                    if let Some(info) = self.new_table_info(v) {
                                                        self.write_scanned(kk, e.kbits);
                                                        opened =
                                                            Some((v, info, 1, std::ptr::null()));
                                                    }
                                                }
                                                Err(true) => {
                                                    if let Some(info) =
                                                        self.closure_info_scanned(vk, v)
                                                    {
                                                        self.write_scanned(kk, e.kbits);
                                                        self.write_closure(v, info);
                                                        at = e.pos;
                                                        continue;
                                                    }
                                                }
                                                Err(false) => {}
                                            }
                                        }
                                    } else {
                                        // A key that is an object (or else): described in full.
                                        let (ek, ev) =
                                            (full_val(kk, e.kbits), full_val(vk, e.vbits));
                                        match self.classify(&ek) {
                                            Ok(kid) => match self.classify(&ev) {
                                                Ok(vid) => {
                                                    self.write_classified(&ek, kid);
                                                    self.write_classified(&ev, vid);
                                                    at = e.pos;
                                                    continue;
                                                }
                                                Err(true) if vk == kind::TABLE => {
                                                    let v = e.vbits as usize as *const c_void;
                                                    if let Some(info) = self.unseen_table_info(v) {
                                                        self.write_classified(&ek, kid);
                                                        opened =
                                                            Some((v, info, 1, std::ptr::null()));
                                                    }
                                                }
                                                Err(true) => {
                                                    let v = e.vbits as usize as *const c_void;
                                                    if let Some(info) = self.closure_info(vk, v) {
                                                        self.write_classified(&ek, kid);
                                                        self.write_closure(v, info);
                                                        at = e.pos;
                                                        continue;
                                                    }
                                                }
                                                Err(false) => {}
                                            },
                                            Err(true) if kk == kind::TABLE => {
                                                let k = e.kbits as usize as *const c_void;
                                                if let Some(info) = self.unseen_table_info(k) {
                                                    opened = Some((k, info, 2, k));
                                                }
                                            }
                                            Err(_) => {}
                                        }
                                    }
                                    if i == end || self.sc.scan.len() > SCAN_KEEP {
                                        // Nothing left to keep, or too much kept already.
                                        self.sc.scan.truncate(floor);
                                        (i, end) = (floor, floor);
                                        exhausted = false;
                                    }
                                    let gen_now = self.scan_gen;
                                    if let Some(Frame::Table {
                                        pos, lo, hi, gen, ..
                                    }) = self.sc.frames.get_mut(depth - 1)
                                    {
                                        (*pos, *lo, *hi, *gen) =
                                            (e.pos, i as u32, end as u32, gen_now);
                                    }
                                    if let Some((child, info, st, k)) = opened {
                                        // A new table's frame goes on top: this one goes on after it.
                                        if let Some(Frame::Table { state, key, .. }) =
                                            self.sc.frames.get_mut(depth - 1)
                                        {
                                            (*state, *key) = (st, k);
                                        }
                                        self.table_header(child, info);
                                        // Its entries next, here (as `run` would).
                                        continue 'frames;
                                    }
                                    // The general path, for this entry: pushed, then written.
                                    let base = ffi::lua_gettop(L);
                                    if luasnap_table_next(L, t, &mut at) == 0 {
                                        break; // cannot happen: the entry was just scanned
                                    }
                                    let key_ptr = ffi::lua_topointer(L, -1);
                                    self.value(L, s)?;
                                    if self.sc.frames.len() > depth {
                                        // The key is a new object whose contents come first.
                                        ffi::lua_settop(L, base);
                                        if let Some(Frame::Table { state, key, .. }) =
                                            self.sc.frames.get_mut(depth - 1)
                                        {
                                            *state = 2;
                                            *key = key_ptr;
                                        }
                                        return Ok(true);
                                    }
                                    self.value(L, s)?;
                                    if self.sc.frames.len() > depth {
                                        ffi::lua_settop(L, base);
                                        return Ok(true);
                                    }
                                    if self.scan_gen != gen_now {
                                        i = end; // Lua code ran: scan again from `at`
                                        exhausted = false;
                                    }
                                }
                                self.sc.scan.truncate(floor);
                                self.end_table(L, t);
                                // Done: back to the frame below, here (as `run` would).
                                self.sc.frames.pop();
                                if self.sc.frames.is_empty() {
                                    return Ok(true);
                                }
                                continue 'frames;
                            }
                        }
                    }
                    Frame::LClosure { id, next, n } | Frame::CClosure { id, next, n } => {
                        let (id, i, n) = (*id, *next, *n);
                        if i > n {
                            return Ok(false);
                        }
                        *next += 1;
                        self.sc.segs.push(Seg::Upvalue(i));
                        ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                        let is_lua = ffi::lua_iscfunction(L, -1) == 0;
                        if is_lua {
                            // An upvalue still open in a suspended coroutine's stack: keep the link.
                            let (mut owner, mut level) = (std::ptr::null_mut(), 0);
                            if luasnap_upval_open(L, -1, i, &mut owner, &mut level) != 0
                                && owner != L
                            {
                                ffi::lua_settop(L, -2);
                                luasnap_checkstack(L, 2, c"persist".as_ptr());
                                let main = ffi::lua_pushthread(owner) == 1;
                                ffi::lua_settop(owner, -2);
                                if !main {
                                    self.w.tag(Tag::UpvalOpen);
                                    self.w.varint(level as u64);
                                    ffi::lua_pushthread(owner);
                                    ffi::lua_xmove(owner, L, 1);
                                    self.value(L, s)?;
                                    return Ok(true);
                                }
                                ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                            }
                            let uid = ffi::lua_upvalueid(L, -1, i) as *const c_void;
                            if let Some((owner, index)) = self.upval_home(uid) {
                                ffi::lua_settop(L, -2);
                                self.w.tag(Tag::UpvalRef);
                                self.w.varint(owner as u64);
                                self.w.varint(index as u64);
                                return Ok(true);
                            }
                            self.set_upval_home(uid, id, i);
                            self.w.tag(Tag::UpvalNew);
                        }
                        ffi::lua_getupvalue(L, -1, i);
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_settop(L, -2);
                        self.value(L, s)?;
                        Ok(true)
                    }
                    Frame::UdBytes { id, state, nuv } => {
                        let (id, st, nuv) = (*id, *state, *nuv);
                        if st > nuv {
                            return Ok(false);
                        }
                        *state += 1;
                        ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                        if st == 0 {
                            self.sc.segs.push(Seg::Meta);
                            if ffi::lua_getmetatable(L, -1) == 0 {
                                ffi::lua_pushnil(L);
                            }
                        } else {
                            self.sc.segs.push(Seg::UserValue(st));
                            ffi::lua_getiuservalue(L, -1, st);
                        }
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_settop(L, -2);
                        self.value(L, s)?;
                        Ok(true)
                    }
                    Frame::Special { id, state, two } => {
                        let (id, st, two) = (*id, *state, *two);
                        if st >= if two { 2 } else { 1 } {
                            return Ok(false);
                        }
                        *state += 1;
                        self.sc.segs.push(Seg::Special(st));
                        ffi::lua_rawgeti(L, s.seen, -(id as ffi::lua_Integer) - 1);
                        ffi::lua_rawgeti(L, -1, st as ffi::lua_Integer + 1);
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_settop(L, -2);
                        self.value(L, s)?;
                        Ok(true)
                    }
                    Frame::Thread { id, next, n, nci } => {
                        let (id, i, n, nci) = (*id, *next, *n, *nci);
                        ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                        let co = ffi::lua_tothread(L, -1);
                        ffi::lua_settop(L, -2);
                        if i > n {
                            // Suspended: the frames, after the stack values they refer to.
                            if nci > 0 {
                                self.w.varint(nci as u64);
                                let mut cis = vec![std::mem::zeroed::<CiRecord>(); nci as usize];
                                luasnap_thread_cis(co, cis.as_mut_ptr(), nci);
                                for r in cis {
                                    self.w.varint(r.func as u64);
                                    self.w.varint(r.top as u64);
                                    self.w.varint(r.callstatus as u64);
                                    self.w.i64(r.u2 as i64);
                                    self.w.varint(r.pc as u64);
                                    self.w.varint(r.nextraargs.max(0) as u64);
                                    self.w.i64(r.old_errfunc);
                                    self.w.i64(r.ctx);
                                    if r.k.is_null() {
                                        self.w.tag(Tag::Nil);
                                    } else {
                                        ffi::lua_pushlightuserdata(L, r.k.cast_mut());
                                        if ffi::lua_rawget(L, s.perms) != ffi::LUA_TSTRING {
                                            ffi::lua_settop(L, -2);
                                            let what = "cannot persist a coroutine suspended inside a C function whose continuation is not a permanent (only pcall/xpcall and coroutine.yield are known)".to_string();
                                            return Err(self.fail(L, what));
                                        }
                                        self.value(L, s)?;
                                    }
                                }
                                // Pending to-be-closed variables, as stack offsets, oldest first.
                                let n = luasnap_thread_tbc(co, std::ptr::null_mut(), 0);
                                let mut slots = vec![0i32; n.max(0) as usize];
                                luasnap_thread_tbc(co, slots.as_mut_ptr(), n);
                                self.w.varint(slots.len() as u64);
                                for slot in slots {
                                    self.w.varint(slot as u64);
                                }
                            }
                            return Ok(false);
                        }
                        if let Some(Frame::Thread { next, .. }) = self.sc.frames.last_mut() {
                            *next += 1;
                        }
                        self.sc.segs.push(Seg::Stack(i));
                        luasnap_checkstack(L, 2, c"persist".as_ptr());
                        luasnap_thread_push_slot(L, co, i);
                        self.value(L, s)?;
                        Ok(true)
                    }
                };
            }
        }
    }
}

/// Records the path (child indices from the main prototype) of `p` and of every prototype
/// below it, by fingerprint; the first of equal fingerprints wins (equal fingerprints are
/// equal functions). `hashes`: the fingerprints of `p`'s tree in pre-order (from
/// `luasnap_proto_tree_hashes`, read from `*at` on), or None to hash each prototype alone.
/// Every fingerprint also goes to `memo`, by prototype.
///
/// # Safety
/// `p` is a live prototype.
unsafe fn tree_paths(
    p: *const c_void,
    path: &mut Vec<u32>,
    out: &mut HashMap<u64, Vec<u32>>,
    hashes: Option<&[u64]>,
    at: &mut usize,
    memo: &mut HashMap<*const c_void, u64>,
) {
    // SAFETY: callers' contract; children of a live prototype are alive.
    unsafe {
        let hash = match hashes.and_then(|hs| hs.get(*at)) {
            Some(&h) => h,
            None => luasnap_proto_hash(p),
        };
        *at += 1;
        memo.insert(p, hash);
        out.entry(hash).or_insert_with(|| path.clone());
        for i in 0..luasnap_proto_nchildren(p) {
            path.push(i as u32);
            tree_paths(luasnap_proto_child(p, i), path, out, hashes, at, memo);
            path.pop();
        }
    }
}

/// A short text for the key on top of the stack, as a path segment (`.name` or `[repr]`).
unsafe fn key_text(L: *mut lua_State) -> String {
    // SAFETY: reads a primitive without conversion.
    unsafe {
        match ffi::lua_type(L, -1) {
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                let b = std::slice::from_raw_parts(p.cast::<u8>(), len);
                match std::str::from_utf8(b) {
                    Ok(s) if crate::bridge::ffi::valid_path(s) && !s.contains('.') => {
                        format!(".{s}")
                    }
                    Ok(s) => format!("[{s:?}]"),
                    Err(_) => "[<bytes>]".into(),
                }
            }
            ffi::LUA_TNUMBER if ffi::lua_isinteger(L, -1) != 0 => {
                format!("[{}]", ffi::lua_tointegerx(L, -1, std::ptr::null_mut()))
            }
            ffi::LUA_TNUMBER => format!("[{}]", ffi::lua_tonumberx(L, -1, std::ptr::null_mut())),
            ffi::LUA_TBOOLEAN => format!("[{}]", ffi::lua_toboolean(L, -1) != 0),
            ffi::LUA_TNIL => String::new(),
            _ => format!("[<{}>]", crate::bridge::ffi::type_name(L, -1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{put_tagged, put_tagged_u64, IdMap, Kind, DENSE_SPAN, ID_MASK, LEAF};
    use crate::persist::format::{Tag, Writer};
    use std::ffi::c_void;

    #[test]
    fn tagged_writes_are_the_writers_bytes() {
        for v in [
            0,
            1,
            0x7f,
            0x80,
            0x3fff,
            0x4000,
            1 << 35,
            u64::MAX >> 1,
            u64::MAX,
        ] {
            let mut w = Writer::default();
            w.tag(Tag::StrRef);
            w.varint(v);
            let mut out = Vec::new();
            put_tagged(&mut out, Tag::StrRef, v);
            assert_eq!(out, w.buf, "{v:#x}");
            let mut w = Writer::default();
            w.tag(Tag::Float);
            w.u64(v);
            out.clear();
            put_tagged_u64(&mut out, Tag::Float, v);
            assert_eq!(out, w.buf, "{v:#x}");
        }
    }

    const BASE: usize = 0x7000_0000_0000;

    fn at(off: usize) -> *const c_void {
        BASE.wrapping_add(off) as *const c_void
    }

    fn map() -> IdMap {
        let mut m = IdMap::default();
        m.reset(BASE);
        m
    }

    #[test]
    fn ids_in_the_table_keep_their_kind() {
        let mut m = map();
        m.insert(at(0), Kind::Obj, 0);
        m.insert(at(16), Kind::Str, 0);
        m.insert(at(32), Kind::Upval, 3);
        m.insert(at(16 * LEAF * 3 + 32), Kind::Obj, 7);
        assert_eq!(m.get(at(0), Kind::Obj), Some(0));
        assert_eq!(m.get(at(0), Kind::Str), None);
        assert_eq!(m.get(at(16), Kind::Str), Some(0));
        assert_eq!(m.get(at(16), Kind::Obj), None);
        assert!(!m.contains(at(16)));
        assert_eq!(m.get(at(32), Kind::Upval), Some(3));
        assert_eq!(m.get(at(32), Kind::Obj), None);
        assert_eq!(m.get(at(16 * LEAF * 3 + 32), Kind::Obj), Some(7));
        assert_eq!(m.get(at(16 * LEAF * 3 + 48), Kind::Obj), None);
        assert_eq!(m.get(at(16 * LEAF * 9), Kind::Obj), None);
        assert_eq!(m.get_or_insert(at(64), Kind::Str, 5), None);
        assert_eq!(m.get_or_insert(at(64), Kind::Str, 6), Some(5));
        assert!(!m.far_dense && m.far.is_empty());
    }

    #[test]
    fn a_permanent_takes_its_object_id() {
        let mut m = map();
        m.insert(at(80), Kind::Perm, 0);
        assert_eq!(m.get(at(80), Kind::Perm), Some(0));
        assert!(!m.contains(at(80)));
        m.insert(at(80), Kind::Obj, 12);
        assert_eq!(m.get(at(80), Kind::Obj), Some(12));
        assert_eq!(m.get(at(80), Kind::Perm), None);
        // Outside the table (a light C function): both stay, apart.
        let f = 0x1234_5678 as *const c_void;
        m.insert(f, Kind::Perm, 0);
        m.insert(f, Kind::Obj, 13);
        assert_eq!(m.get(f, Kind::Obj), Some(13));
        assert!(!m.far_dense);
    }

    #[test]
    fn reset_forgets_every_identity() {
        let mut m = map();
        m.insert(at(0), Kind::Obj, 1);
        m.insert(at(16 * LEAF * 5), Kind::Str, 2);
        m.insert(at(8), Kind::Obj, 3);
        m.insert(at(32), Kind::Obj, ID_MASK - 1);
        assert!(m.far_dense);
        let leaves = m.leaves.iter().flatten().count();
        m.reset(BASE + 16 * LEAF);
        assert_eq!(m.leaves.iter().flatten().count(), leaves, "leaves are kept");
        for p in [at(0), at(16 * LEAF * 5), at(8), at(32), at(16 * LEAF * 6)] {
            assert_eq!(m.get(p, Kind::Obj), None);
            assert_eq!(m.get(p, Kind::Str), None);
        }
        assert!(!m.far_dense && m.far.is_empty());
        // The new base counts offsets from there.
        m.insert(at(16 * LEAF), Kind::Obj, 4);
        assert_eq!(m.get(at(16 * LEAF), Kind::Obj), Some(4));
        assert!(m.leaves[0].as_ref().is_some_and(|l| l[0] != 0));
        assert_eq!(m.dirty, (0, 1));
        // Leaf 5 is kept from before: the one-look path writes it and notes it too.
        assert!(m.leaves[5].is_some());
        assert_eq!(m.get_or_insert(at(16 * LEAF * 6), Kind::Str, 5), None);
        assert_eq!(m.dirty, (0, 6));
        // The next reset zeroes only the leaves written since this one.
        m.reset(BASE);
        assert_eq!(m.dirty, (usize::MAX, 0));
        assert!(m.leaves.iter().flatten().all(|l| l.iter().all(|&e| e == 0)));
    }

    /// `obj_state` (one look at the slot when it can) says what `get` for an object id, then
    /// for a permanent, says: in the table, in the hash map, before and after the hash map
    /// holds an identity of the table's span.
    #[test]
    fn obj_state_agrees_with_get() {
        let expect = |m: &IdMap, p| match m.get(p, Kind::Obj) {
            Some(id) => Ok(id),
            None => Err(m.get(p, Kind::Perm).is_none()),
        };
        let probes = [
            at(0),
            at(16),
            at(32),
            at(48),
            at(64),
            at(8),
            at(16 * LEAF * 7),
            at(DENSE_SPAN),
            0x1234_5678 as *const c_void,
        ];
        let mut m = map();
        m.insert(at(0), Kind::Obj, 3);
        m.insert(at(16), Kind::Perm, 0);
        m.insert(at(32), Kind::Str, 1);
        m.insert(at(8), Kind::Perm, 0);
        m.insert(at(DENSE_SPAN), Kind::Obj, 4);
        m.insert(0x1234_5678 as *const c_void, Kind::Perm, 0);
        assert!(!m.far_dense);
        for p in probes {
            assert_eq!(m.obj_state(p), expect(&m, p), "{p:?}");
        }
        assert_eq!(m.obj_state(at(0)), Ok(3));
        assert_eq!(m.obj_state(at(16)), Err(false));
        assert_eq!(m.obj_state(at(32)), Err(true));
        assert_eq!(m.obj_state(at(64)), Err(true));
        // The hash map now holds identities of the span: a permanent whose slot a string
        // holds, an object whose id does not fit a slot.
        m.insert(at(32), Kind::Perm, 0);
        m.insert(at(48), Kind::Obj, ID_MASK - 1);
        assert!(m.far_dense);
        for p in probes {
            assert_eq!(m.obj_state(p), expect(&m, p), "{p:?}");
        }
        assert_eq!(m.obj_state(at(32)), Err(false));
        assert_eq!(m.obj_state(at(48)), Ok(ID_MASK - 1));
        // A permanent that gets its object id.
        m.insert(at(16), Kind::Obj, 9);
        assert_eq!(m.obj_state(at(16)), Ok(9));
    }

    #[test]
    fn identities_the_table_cannot_hold_go_to_the_map() {
        let mut m = map();
        // Not 16-byte aligned (a userdata's memory), below the arena, past the span.
        for (p, id) in [(at(8), 1), (at(usize::MAX - 15), 2), (at(DENSE_SPAN), 3)] {
            m.insert(p, Kind::Obj, id);
            assert_eq!(m.get(p, Kind::Obj), Some(id));
            assert_eq!(m.get(p, Kind::Str), None);
        }
        assert!(!m.far_dense);
        // An id too large for a slot, and a slot another kind holds.
        m.insert(at(32), Kind::Obj, ID_MASK - 1);
        assert!(m.far_dense);
        assert_eq!(m.get(at(32), Kind::Obj), Some(ID_MASK - 1));
        m.insert(at(48), Kind::Obj, 4);
        m.insert(at(48), Kind::Str, 9);
        assert_eq!(m.get(at(48), Kind::Obj), Some(4));
        assert_eq!(m.get(at(48), Kind::Str), Some(9));
        m.insert(at(96), Kind::Obj, 5);
        m.insert(at(96), Kind::Perm, 0);
        assert_eq!(m.get(at(96), Kind::Obj), Some(5));
        assert_eq!(m.get(at(64), Kind::Obj), None);
    }
}
