//! Loading: the save-game format back into Lua values.
//!
//! Mirrors the writer: depth first, frames on a Rust stack, O(1) Lua stack. Every count, index
//! and length read from the file is checked against what the file can hold and what the VM
//! has, so arbitrary bytes give an error or a value, never a crash: objects are built through
//! the Lua API, or by `luasnap_table_build` from steps decoded and checked here (see
//! [`Loader::plain_entries`]), prototypes come from the VM's own chunks or, for own-trust
//! loads, from the chunk source text the file carries, compiled by Lua's compiler and checked
//! against each function's fingerprint (bytecode only for binary chunks when the caller allows
//! it), and Lua code run while loading (`__persist` rebuild functions) is bounded by an
//! instruction budget.

use super::format::{
    min_strref_len, Opened, Reader, Tag, FLAG_BYTECODE, THREAD_DEAD, THREAD_NOT_STARTED,
    THREAD_SUSPENDED,
};
use super::{budget_hook_intact, luasnap_checkstack, luasnap_gc_stopem, luasnap_heap_bytes};
use super::{kind, LoadOptions, RawVal, Slots, Trust};
use super::{luasnap_chunk_find, luasnap_proto_child};
use super::{luasnap_proto, luasnap_proto_hash, luasnap_proto_nupvalues};
use super::{luasnap_thread_restore, CiRecord};
use super::{CTORS_KEY, GMATCH_AUX, WRAP_AUX};
use crate::bridge::ffi::Shared;
use mlua_sys::{self as ffi, lua_State};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};

unsafe extern "C" {
    fn luasnap_push_closure(L: *mut lua_State, p: *const c_void);
    fn luasnap_each_proto(
        L: *mut lua_State,
        f: unsafe extern "C" fn(*const c_void, *mut c_void),
        ud: *mut c_void,
    );
    fn luasnap_proto_tree(
        p: *const c_void,
        f: unsafe extern "C" fn(*const c_void, *mut c_void),
        ud: *mut c_void,
    );
    fn luasnap_gc_nofinal(L: *mut lua_State, on: c_int) -> c_int;
    fn luasnap_thread_building(co: *mut lua_State, on: c_int) -> c_int;
    fn luasnap_thread_hold(co: *mut lua_State, on: c_int) -> c_int;
    fn luasnap_thread_put(L: *mut lua_State, co: *mut lua_State, i: c_int) -> c_int;
    fn luasnap_thread_frames(co: *mut lua_State, out: *mut *const c_void, max: c_int) -> c_int;
    fn luasnap_upval_join_at(
        L: *mut lua_State,
        idx: c_int,
        n: c_int,
        co: *mut lua_State,
        level: c_int,
        aidx: c_int,
        an: c_int,
    ) -> *mut c_void;
    fn luasnap_upval_shareable(L: *mut lua_State, idx: c_int, n: c_int) -> c_int;
    fn luasnap_upmemo_size() -> usize;
    fn luasnap_upmemo_free(memo: *mut c_void);
    fn luasnap_upmemo_walks(memo: *const c_void) -> usize;
    fn luasnap_upmemo_reads(memo: *const c_void) -> usize;
    fn luasnap_open_upval_check(
        L: *mut lua_State,
        idx: c_int,
        n: c_int,
        co: *mut lua_State,
        level: c_int,
        frames: *const *const c_void,
        nframes: c_int,
        strict: c_int,
        memo: *mut c_void,
    ) -> *const std::ffi::c_char;
    fn luasnap_thread_set_tbc(
        co: *mut lua_State,
        slots: *const i32,
        n: c_int,
    ) -> *const std::ffi::c_char;
    fn luasnap_table_nodes(L: *mut lua_State, idx: c_int) -> u32;
    fn luasnap_table_relayout(
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
    fn luasnap_relayout_scratch(size: u32) -> usize;
    fn luasnap_relayout_memo_limit(memo: *mut c_void, limit: u64);
    fn luasnap_relayout_memo_over(memo: *const c_void) -> c_int;
    fn luasnap_rawset_charged(L: *mut lua_State, idx: c_int, memo: *mut c_void) -> c_int;
    fn luasnap_hash_seed(L: *mut lua_State) -> u32;
    fn luasnap_table_build(
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
    fn luasnap_relayout_memo_size() -> usize;
    fn luasnap_recheck_finalizer(L: *mut lua_State);
}

/// Why a foreign load stopped at keys chosen to collide.
const COLLISIONS: &str = "the save-game has tables whose keys collide in the same hash-table nodes (integers a multiple of the node count minus one, say), so that inserting and finding them would take time quadratic in the file's size; foreign loads stop after walking 32 collision-chain nodes per body byte: if you trust the file, load it as your own (Trust::Own), where no such limit applies";

/// Collision-chain nodes a foreign load may walk, per body byte (plus [`CHAIN_BASE`]): an
/// honest save walks one or two per entry, and an entry takes 2 bytes or more.
const CHAIN_PER_BYTE: u64 = 32;
const CHAIN_BASE: u64 = 1 << 20;

/// Why a load refused a metatable with `__gc` (see [`LoadOptions::finalizers`]).
const NO_FINALIZERS: &str = "the save-game gives an object a finalizer (a metatable with __gc), which the collector would run after the load, outside its instruction budget and constructor rules; foreign loads refuse them: if you trust the file, load it as your own (Trust::Own) or set LoadOptions::finalizers";

/// Whether the table on top has a raw `__gc` field (the metatable about to be set).
///
/// # Safety
/// Protected context (the loader's), a table on top and a free slot.
unsafe fn has_gc(L: *mut lua_State) -> bool {
    // SAFETY: raw access on the table on top; pushes and pops one value ("__gc" is one of
    // Lua's fixed strings, so pushing it finds it without allocating).
    unsafe {
        ffi::lua_pushstring(L, c"__gc".as_ptr());
        let found = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
        ffi::lua_settop(L, -2);
        found
    }
}

/// Why a load refuses a coroutine that load-time code reset while the load built it.
const RESET: &str =
    "a load-time function reset a coroutine the load was still building (coroutine.close)";

/// `RESET` for the C side's messages.
const RESET_C: &std::ffi::CStr =
    c"an open upvalue into a coroutine that load-time code reset (coroutine.close)";

/// The memo of `luasnap_open_upval_check` (u64 words for its alignment): its answers for
/// this load, in a table the C side allocates (bounded by the game's code; see
/// docs/save-games.md), freed when the load ends (dropped with the loader).
#[derive(Default)]
struct UpMemo(Vec<u64>);

impl UpMemo {
    /// The memo, zeroed the first time.
    fn ptr(&mut self) -> *mut c_void {
        if self.0.is_empty() {
            // SAFETY: a pure size query.
            let words = unsafe { luasnap_upmemo_size() }.div_ceil(8);
            self.0 = vec![0; words];
        }
        self.0.as_mut_ptr().cast()
    }

    /// Prototype-tree walks the check made in this load so far.
    fn walks(&self) -> usize {
        if self.0.is_empty() {
            return 0;
        }
        // SAFETY: a memo of luasnap_upmemo_size() bytes, zeroed then used only by the check.
        unsafe { luasnap_upmemo_walks(self.0.as_ptr().cast()) }
    }

    /// Instructions the frame checks read in this load so far.
    fn reads(&self) -> usize {
        if self.0.is_empty() {
            return 0;
        }
        // SAFETY: as in `walks`.
        unsafe { luasnap_upmemo_reads(self.0.as_ptr().cast()) }
    }
}

thread_local! {
    /// `UpMemo::walks` of the last load this thread ended (see
    /// [`last_load_open_upvalue_walks`]).
    static LAST_WALKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// `UpMemo::reads` of the last load this thread ended.
    static LAST_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Instructions the checks of suspended frames read in the last load this thread ended: the
/// work counter of a test (about the code size of each function with a suspended frame, once
/// per load, whatever the number of frames).
pub fn last_load_frame_check_reads() -> usize {
    LAST_READS.with(|w| w.get())
}

/// Prototype-tree walks the open-upvalue check made in the last load this thread ended: the
/// work counter of a test (each distinct question walks at most once per load).
pub fn last_load_open_upvalue_walks() -> usize {
    LAST_WALKS.with(|w| w.get())
}

impl Drop for UpMemo {
    fn drop(&mut self) {
        LAST_WALKS.with(|w| w.set(self.walks()));
        LAST_READS.with(|w| w.set(self.reads()));
        if !self.0.is_empty() {
            // SAFETY: as in `walks`; the memo is not used after this.
            unsafe { luasnap_upmemo_free(self.0.as_mut_ptr().cast()) }
        }
    }
}

/// Why the check refused, as the load's error: a refusal is a malformed file, the check's
/// own allocation failing is not.
fn check_error(msg: &str) -> String {
    if msg.starts_with("out of memory") {
        format!("cannot check the save-game's open upvalues: {msg}")
    } else {
        format!("malformed save-game: {msg}")
    }
}

/// A suspended coroutine this load builds, for the open upvalues joined into it.
struct LoadedCo {
    /// The stack size the file declares: open upvalues go into slots 1..=len.
    len: c_int,
    /// Its frames (`luasnap_thread_frames`) once restored: from then on the coroutine is held
    /// unresumable until the load ends (`luasnap_thread_hold`), so they stay as indexed.
    frames: Option<Vec<*const c_void>>,
    /// Open upvalues joined while its stack was still arriving, checked once its frames are
    /// restored: (closure id, upvalue index, level).
    unchecked: Vec<(u32, c_int, c_int)>,
    /// Its open upvalues by level, each as a closure joined to it (id, upvalue index), to link
    /// a new one in O(log n) (see `luasnap_upval_join_at`).
    open: BTreeMap<c_int, (u32, c_int)>,
}

/// Why a userdata rebuilt from the file's bytes may not take a C library's metatable.
const LIBRARY_METATABLE: &str = "a userdata rebuilt from bytes with the metatable of a C library's type (luaL_newmetatable: io's FILE*, say); that library's functions and __gc would trust the forged bytes as its own struct (a file handle's close function pointer, for one)";

/// Whether the table on top is a metatable a C library registered for its userdata
/// (`luaL_newmetatable`: `registry[mt.__name] == mt`). Such a library finds its userdata by
/// that metatable (`luaL_checkudata`) and trusts their payload, so a userdata whose bytes
/// come from a file must not get it.
///
/// # Safety
/// Protected context, a table on top and two free slots.
unsafe fn library_metatable(L: *mut lua_State) -> bool {
    // SAFETY: raw reads; pushes and pops two values ("__name" is a short string: pushing
    // it may allocate, which the protected context allows).
    unsafe {
        ffi::lua_pushstring(L, c"__name".as_ptr());
        if ffi::lua_rawget(L, -2) != ffi::LUA_TSTRING {
            ffi::lua_settop(L, -2);
            return false;
        }
        ffi::lua_rawget(L, ffi::LUA_REGISTRYINDEX);
        let same = ffi::lua_rawequal(L, -1, -2) != 0;
        ffi::lua_settop(L, -2);
        same
    }
}

/// Allows emergency collections again (a load stops them while it holds raw pointers).
///
/// # Safety
/// `L` is a valid state.
pub(crate) unsafe fn allow_emergency_gc(L: *mut lua_State) {
    // SAFETY: callers' contract.
    unsafe { luasnap_gc_stopem(L, 0) };
}

/// Calls `f(q, ud)` for `p` and every prototype nested in it.
///
/// # Safety
/// `p` is a live prototype.
pub(crate) unsafe fn proto_tree(
    p: *const c_void,
    f: unsafe extern "C" fn(*const c_void, *mut c_void),
    ud: *mut c_void,
) {
    // SAFETY: callers' contract.
    unsafe { luasnap_proto_tree(p, f, ud) };
}

/// Preallocation (table array slots, hash nodes counted twice, coroutine stack slots beyond
/// the values read) a whole load may ask for from its file's hints: this many units per body
/// byte, plus [`PREALLOC_BASE`]. Past it, hints are ignored (tables grow as entries come)
/// and coroutine frames that need more stack are refused. Honest files ask for about one
/// unit per two bytes.
const PREALLOC_PER_BYTE: u64 = 4;
const PREALLOC_BASE: u64 = 1 << 16;

/// Steps per `luasnap_table_build` call (an entry needing more goes the general way).
const BUILD_OPS: usize = 1024;
/// How deep tables nest within one batch built by `luasnap_table_build`.
const PLAIN_DEPTH: usize = 16;
/// Layout words (node codes and links, plus three per table) one batch may carry; a table
/// with a larger layout ends the batch and the general path places it.
const BATCH_LAYOUT: usize = 1 << 14;

/// Where a table opened by a batch is (see `Loader::plain_entries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Its metatable is next.
    Meta,
    /// A key (or its end marker) is next.
    Key,
    /// The value of the key on the stack is next.
    Value,
}

impl Stage {
    /// The matching `Frame::Table` state.
    fn state(self) -> u8 {
        match self {
            Stage::Meta => 0,
            Stage::Key => 1,
            Stage::Value => 2,
        }
    }
}

/// How many tables a batch may open with `depth` frames already on the stack: tables opened
/// there become stack frames, which stay below `STACK_FRAMES`.
fn nopen_room(depth: usize) -> usize {
    PLAIN_DEPTH.min(STACK_FRAMES.saturating_sub(depth + 1))
}

/// Lua's limit on a closure's upvalues (`MAXUPVAL`); a batch leaves a closure with more to the
/// general path.
const MAX_UPVALUES: usize = 255;
/// Steps a batch's buffer holds: a batch takes no entry once it has `BUILD_OPS` steps, and one
/// entry adds at most its key's step, a closure's steps (its `NEWCLOSURE`, then a value and a
/// `SETUPVAL` for each of at most `MAX_UPVALUES` upvalues) and its `SET` (an end marker adds
/// a `LAYOUT` and a `SET`; a new table its `NEWTABLE` and `META`).
const OPS_CAP: usize = BUILD_OPS + 2 * MAX_UPVALUES + 2;

/// Array and hash sizes for a new table from a file's hints, capped by what the rest of the
/// file (`remaining` bytes) can hold (2+ bytes per entry), or by `own_cap` for an own save
/// (see `Loader::own_cap`). Hints are also charged to the load's total preallocation budget
/// `left` (hash nodes twice): nested tables cannot each ask for the whole rest of the file.
/// The third value says whether a hint was cut.
#[inline(always)]
fn table_sizes(
    remaining: usize,
    own_cap: Option<u64>,
    left: &mut u64,
    narr: u64,
    nhash: u64,
) -> (c_int, c_int, bool) {
    let cap = own_cap
        .unwrap_or((remaining / 2) as u64)
        .min(c_int::MAX as u64);
    let (narr0, nhash0) = (narr, nhash);
    let narr = narr.min(cap).min(*left);
    *left -= narr;
    let nhash = nhash.min(cap).min(*left / 2);
    *left -= nhash * 2;
    (
        narr as c_int,
        nhash as c_int,
        narr != narr0 || nhash != nhash0,
    )
}

/// The tag bytes the batch decoder matches on.
const T_NIL: u8 = Tag::Nil as u8;
const T_FALSE: u8 = Tag::False as u8;
const T_TRUE: u8 = Tag::True as u8;
const T_INT: u8 = Tag::Int as u8;
const T_FLOAT: u8 = Tag::Float as u8;
const T_STR: u8 = Tag::Str as u8;
const T_STRREF: u8 = Tag::StrRef as u8;
const T_REF: u8 = Tag::Ref as u8;

/// How a batch ended (see [`Batch::decode`]).
struct BatchEnd {
    /// The tables the batch opened and left open, outermost first: id, and the index of its
    /// `NEWTABLE` step if its size hints were not capped (else its entries may not fit its
    /// nodes: it is never placed) and no metatable step named it.
    open: [(u32, Option<usize>); PLAIN_DEPTH],
    nopen: usize,
    /// Where the innermost table (the frame's own if none is open) is; the tables around it
    /// each expect their value (the table they opened).
    stage: Stage,
    /// Whether it stopped because its buffers were full.
    full: bool,
}

/// One batch of steps for `luasnap_table_build` being decoded (see `Loader::plain_entries`):
/// a copy of the loader's reader and counters, written back when the batch ends, so the
/// decoding loop keeps them in registers, and a buffer of fixed size for the steps. Decodes
/// booleans, numbers, strings, string references, references to objects already read, nil,
/// new tables and Lua closures of prototypes already read, each checked as the general path
/// checks it; anything else, malformed bytes included, ends the batch before it, with the
/// reader and counters as they were before it (the general path reads it and reports what
/// is wrong).
struct Batch<'a, 'b> {
    r: Reader<'a>,
    ops: &'b mut [RawVal; OPS_CAP],
    /// Steps decoded (`ops[..n]`).
    n: usize,
    /// The batch's layouts, `lay[..nlay]` (see `Loader::blay`), their links in `laynx`.
    lay: &'b mut Vec<u32>,
    laynx: &'b mut Vec<i32>,
    nlay: usize,
    strs: u32,
    next_id: u32,
    prealloc_left: u64,
    /// `Loader::own_cap`.
    own_cap: Option<u64>,
    /// The general path's frames (tables still open outside the batch).
    frames: &'b [Frame],
    /// `Loader::late_meta`.
    late_meta: &'b mut Vec<u32>,
    strref_len: usize,
    protos: &'b [*const c_void],
    format: u16,
    /// The VM's hash seed (see `place_hint`).
    seed: u32,
    /// The node count of the largest layout decoded (0: none), for the scratch.
    max_size: u32,
}

impl Batch<'_, '_> {
    /// Appends a step. `n` stays below `OPS_CAP` (see there): the index check never fails.
    #[inline(always)]
    fn push(&mut self, kind: u64, len: u64, bits: u64, s: *const std::ffi::c_char) {
        self.ops[self.n] = RawVal { kind, len, bits, s };
        self.n += 1;
    }

    /// Decodes steps until the batch is full or the next item is not one it takes. An entry
    /// is decoded in one trip around the loop (its key, then its value, and for a new table its
    /// metatable), so the innermost table expects a key whenever the loop starts over.
    fn decode(&mut self, room: usize) -> BatchEnd {
        let mut open = [(0u32, None); PLAIN_DEPTH];
        let mut nopen = 0;
        // Whether the layouts fill half their buffer (checked as each is added).
        let mut lay_full = false;
        let (stage, full) = loop {
            if self.n >= BUILD_OPS || lay_full {
                break (Stage::Key, true);
            }
            let Some(tag) = self.r.peek() else {
                break (Stage::Key, false);
            };
            if tag == T_NIL || tag == Tag::Layout as u8 {
                // An end marker, with the hash part's layout or without: the frame's own is
                // for the general path; a layout is placed by the batch (which then sets the
                // table in its parent) when it can be, else by the general path.
                if nopen == 0 {
                    break (Stage::Key, false);
                }
                if tag == T_NIL {
                    self.r.pos += 1;
                } else {
                    if self.format < 5 {
                        break (Stage::Key, false);
                    }
                    let Some((size, seed)) = self.layout() else {
                        break (Stage::Key, false);
                    };
                    lay_full = self.nlay >= BATCH_LAYOUT / 2;
                    if let Some(at) = open[nopen - 1].1 {
                        self.place_hint(at, size, seed);
                    }
                }
                nopen -= 1;
                // The parent got its entry and expects a key.
                self.push(kind::SET, self.r.pos as u64, 0, std::ptr::null());
                continue;
            }
            // The key (its step pushed once the value shows whether one step takes both).
            let at = self.r.pos;
            let Some(key) = self.plain(tag) else {
                self.r.pos = at;
                break (Stage::Key, false);
            };
            // Its value.
            let Some(tag) = self.r.peek() else {
                self.push_val(key);
                break (Stage::Value, false);
            };
            let at = self.r.pos;
            self.r.pos += 1;
            match self.simple(tag) {
                Some(Some(v)) => {
                    // An entry of a plain value: one step with its key when they fit one
                    // (the key a string already read or an integer in 0..2^32).
                    let (kk, kb) = (key.kind, key.bits);
                    if matches!(kk, kind::STRREF | kind::INT) && kb <= u32::MAX as u64 {
                        let k = kind::SETKV | v.kind << 8 | kk << 16 | kb << 32;
                        self.push(k, v.len, v.bits, v.s);
                    } else {
                        self.push_val(key);
                        self.push_val(v);
                        self.push(kind::SET, self.r.pos as u64, 0, std::ptr::null());
                    }
                    continue;
                }
                Some(None) => {
                    self.r.pos = at;
                    self.push_val(key);
                    break (Stage::Value, false);
                }
                None => self.r.pos = at,
            }
            self.push_val(key);
            let mark = (at, self.n);
            if tag == Tag::Table as u8 && nopen < room {
                let Some((id, placeable)) = self.new_table() else {
                    self.unread(mark);
                    break (Stage::Value, false);
                };
                open[nopen] = (id, placeable);
                nopen += 1;
                // Its metatable.
                let Some(tag) = self.r.peek() else {
                    break (Stage::Meta, false);
                };
                let at = self.r.pos;
                let Some(mt) = self.plain(tag) else {
                    self.r.pos = at;
                    break (Stage::Meta, false);
                };
                if mt.kind == kind::NIL {
                    // No metatable: the new table has none, so its two steps (push nil, set
                    // it) would do nothing (most tables: 5,600 of 7,000 in a 1 MB bench load,
                    // 15% of the steps).
                    continue;
                }
                self.push_val(mt);
                // A table still open in this batch given as a metatable is not placed: until
                // its layout step, its entries sit in nodes unhashed, and setting a metatable
                // looks `__gc` up in it (the finalizer check and mark), as the collector looks
                // up `__mode` and caches what it did not find. Found by an independent
                // attacker: a class whose instance is among its own entries lost its
                // finalizer. (Placement is decided when the table ends: dropping its step
                // index here keeps it a plain NEWTABLE.)
                if mt.kind == kind::REF {
                    let mut open_mt = false;
                    for o in open[..nopen].iter_mut().filter(|o| o.0 as u64 == mt.bits) {
                        o.1 = None;
                        open_mt = true;
                    }
                    // A metatable still being built may get its __gc after this step: the
                    // table's finalizer is checked again when the load ends.
                    if open_mt
                        || self
                            .frames
                            .iter()
                            .any(|f| matches!(f, Frame::Table { id, .. } if *id as u64 == mt.bits))
                    {
                        self.late_meta.push(open[nopen - 1].0);
                    }
                }
                self.push(kind::META, self.r.pos as u64, 0, std::ptr::null());
                continue;
            }
            let read = if tag == Tag::LClosure as u8 {
                self.closure()
            } else {
                self.plain(tag).map(|v| self.push_val(v))
            };
            if read.is_none() {
                self.unread(mark);
                break (Stage::Value, false);
            }
            self.push(kind::SET, self.r.pos as u64, 0, std::ptr::null());
        };
        BatchEnd {
            open,
            nopen,
            stage,
            full,
        }
    }

    /// The step of a boolean, number, string or string reference whose tag `tag` was just
    /// read: `Some(None)` if its payload is malformed, `None` for another tag. Counts the
    /// string id a new string takes.
    #[inline(always)]
    fn simple(&mut self, tag: u8) -> Option<Option<RawVal>> {
        let null = std::ptr::null();
        let (kind, bits, len, s) = match tag {
            T_FALSE => (kind::FALSE, 0, 0, null),
            T_TRUE => (kind::TRUE, 0, 0, null),
            T_INT => match self.r.i64() {
                Some(i) => (kind::INT, i as u64, 0, null),
                None => return Some(None),
            },
            T_FLOAT => match self.r.u64() {
                Some(b) => (kind::FLOAT, b, 0, null),
                None => return Some(None),
            },
            T_STR => {
                let Some(b) = self.r.bytes() else {
                    return Some(None);
                };
                let sid = if b.len() >= self.strref_len {
                    self.strs += 1;
                    self.strs as u64
                } else {
                    0
                };
                (kind::STR, sid, b.len() as u64, b.as_ptr().cast())
            }
            T_STRREF => match self.r.varint() {
                Some(sid) if sid < self.strs as u64 => (kind::STRREF, sid + 1, 0, null),
                _ => return Some(None),
            },
            _ => return None,
        };
        Some(Some(RawVal { kind, len, bits, s }))
    }

    /// Appends a step.
    #[inline(always)]
    fn push_val(&mut self, v: RawVal) {
        self.push(v.kind, v.len, v.bits, v.s);
    }

    /// Decodes one item at the reader, whose tag is `tag`, into its step (not pushed): a
    /// boolean, number, string, string reference, nil or a reference to an object already
    /// read. None, having counted no string, for anything else.
    #[inline(always)]
    fn plain(&mut self, tag: u8) -> Option<RawVal> {
        let at = self.r.pos;
        self.r.pos += 1;
        let v = match self.simple(tag) {
            Some(v) => v?,
            None if tag == T_NIL => RawVal {
                kind: kind::NIL,
                ..RawVal::EMPTY
            },
            None if tag == T_REF => {
                let id = self.r.varint()?;
                if id >= self.next_id as u64 {
                    return None;
                }
                RawVal {
                    kind: kind::REF,
                    len: at as u64,
                    bits: id,
                    s: std::ptr::null(),
                }
            }
            None => return None,
        };
        Some(v)
    }

    /// Decodes a new table's header (its tag next) into a `NEWTABLE` step, charging its size
    /// hints. Returns its id and whether it may be placed (its hints were not cut: see
    /// [`BatchEnd::open`]), as the index of its step.
    #[inline(always)]
    fn new_table(&mut self) -> Option<(u32, Option<usize>)> {
        self.r.pos += 1;
        let (narr, nhash) = (self.r.varint()?, self.r.varint()?);
        let (narr, nhash, capped) = table_sizes(
            self.r.remaining(),
            self.own_cap,
            &mut self.prealloc_left,
            narr,
            nhash,
        );
        let id = self.next_id;
        self.next_id += 1;
        self.push(
            kind::NEWTABLE,
            (narr as u64) << 32 | nhash as u64,
            id as u64,
            std::ptr::null(),
        );
        Some((id, (!capped).then_some(self.n - 1)))
    }

    /// Decodes a Lua closure (its tag next) of a prototype already read, whose upvalues are
    /// plain items or shared, into its steps.
    fn closure(&mut self) -> Option<()> {
        self.r.pos += 1;
        let p = *self.protos.get(usize::try_from(self.r.varint()?).ok()?)?;
        let n = self.r.varint()?;
        // SAFETY: p is a prototype of this VM, kept alive for the load.
        if n > MAX_UPVALUES as u64 || n != unsafe { luasnap_proto_nupvalues(p) } as u64 {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.push(
            kind::NEWCLOSURE,
            id as u64,
            p as usize as u64,
            std::ptr::null(),
        );
        for i in 1..=n {
            let tag = self.r.u8()?;
            if tag == Tag::UpvalNew as u8 {
                let v = self.plain(self.r.peek()?)?;
                self.push_val(v);
                self.push(kind::SETUPVAL, 0, i, std::ptr::null());
            } else if tag == Tag::UpvalRef as u8 {
                let (other, index) = (self.r.varint()?, self.r.varint()?);
                if other >= self.next_id as u64 || index > u32::MAX as u64 {
                    return None;
                }
                self.push(kind::JOINUPVAL, i << 32 | index, other, std::ptr::null());
            } else {
                return None;
            }
        }
        Some(())
    }

    /// Decodes the layout at the reader (its `Tag::Layout` next) into `lay`/`laynx` for a
    /// `kind::LAYOUT` step, which it pushes; returns the layout's node count and hash seed.
    /// None, with the reader and the batch's layouts where they were, for what the general
    /// path must place or report: a layout with removed keys, one too large for the batch, or
    /// malformed bytes.
    fn layout(&mut self) -> Option<(u32, u32)> {
        let mark = self.r.pos;
        let done = self.layout_inner(mark);
        if done.is_none() {
            self.r.pos = mark;
        }
        done
    }

    fn layout_inner(&mut self, mark: usize) -> Option<(u32, u32)> {
        self.r.pos += 1; // the tag
        let blob = self.r.bytes()?;
        let mut r = Reader::new(blob);
        let (seed, size, lastfree) = Loader::layout_header(&mut r, blob.len())?;
        let off = self.nlay;
        let end = off + 3 + size as usize;
        if end > BATCH_LAYOUT {
            return None;
        }
        if self.lay.len() < end {
            // Grown as batches need it (up to BATCH_LAYOUT words), never shrunk.
            let len = end.next_power_of_two().min(BATCH_LAYOUT);
            self.lay.resize(len, 0);
            self.laynx.resize(len, 0);
        }
        let (codes, links) = (&mut self.lay[off..end], &mut self.laynx[off..end]);
        codes[..3].copy_from_slice(&[size, lastfree, seed]);
        links[..3].copy_from_slice(&[0; 3]);
        if layout_nodes(r, size, &mut codes[3..], &mut links[3..]) != Some(blob.len()) {
            return None;
        }
        self.nlay = end;
        self.max_size = self.max_size.max(size);
        self.push(kind::LAYOUT, mark as u64, off as u64, std::ptr::null());
        Some((size, seed))
    }

    /// After `layout` pushed the `LAYOUT` step (node count `size`, hash seed `seed`) of the
    /// table whose `NEWTABLE` step is `ops[at]`: marks the table as placed
    /// (`kind::NEWTABLE_PLACED`: its entries go into its nodes unhashed, and the layout step
    /// moves them) when the layout will apply, i.e. it was saved under this VM's hash seed for
    /// a hash part of the table's node count (a layout that does not apply leaves the table as
    /// its insertions built it, which a placed table cannot be). The C side checks the layout
    /// against the entries as for any table.
    fn place_hint(&mut self, at: usize, size: u32, seed: u32) {
        let op = &mut self.ops[at];
        let nhash = op.len & 0xffff_ffff;
        if op.kind == kind::NEWTABLE
            && seed == self.seed
            && nhash > 0
            && nhash.next_power_of_two() == size as u64
        {
            op.kind = kind::NEWTABLE_PLACED;
        }
    }

    /// Back to `mark` (reader position, step count): drops the steps from there on, and the
    /// string and object ids and preallocation they took. (Counting them here keeps the
    /// decoding loop from saving the counters before every item.)
    #[inline(always)]
    fn unread(&mut self, mark: (usize, usize)) {
        let (pos, len) = (mark.0, mark.1.min(self.n));
        // By value: the batch stays in registers.
        let (strs, ids, prealloc) = taken(&self.ops[len..self.n]);
        self.strs -= strs;
        self.next_id -= ids;
        self.prealloc_left += prealloc;
        self.n = len;
        self.r.pos = pos;
    }
}

/// Decodes the nodes of a layout of `size` nodes (see `Loader::layout_node`) into `codes` and
/// `links` (one per node), refusing removed keys (code 2): the reader's position after them,
/// or None. Apart from the decoding loop, and by value, for registers of its own.
#[inline(never)]
fn layout_nodes(
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

/// The string ids, object ids and preallocation units the steps `ops` took (see
/// `Batch::unread`).
#[cold]
#[inline(never)]
fn taken(ops: &[RawVal]) -> (u32, u32, u64) {
    let (mut strs, mut ids, mut prealloc) = (0, 0, 0);
    for op in ops {
        let value_kind = if op.kind & 0xff == kind::SETKV {
            op.kind >> 8 & 0xff
        } else {
            op.kind
        };
        match value_kind {
            kind::STR if op.bits != 0 => strs += 1,
            kind::NEWTABLE | kind::NEWTABLE_PLACED => {
                ids += 1;
                // Its hints are charged again when the general path reads it.
                prealloc += (op.len >> 32) + 2 * (op.len & 0xffff_ffff);
            }
            kind::NEWCLOSURE => ids += 1,
            _ => {}
        }
    }
    (strs, ids, prealloc)
}

const REBUILDING: &str = "a reference to an object that is still being rebuilt: a __persist rebuild function captured its own object; use two-phase persistence (return a create function and an init function)";

pub(crate) struct Fail;

/// Table frames up to this depth keep their table and key on the Lua stack (fast); deeper ones
/// use the id tables, so nesting depth never exhausts the Lua stack.
const STACK_FRAMES: usize = 4000;

/// What a completed child left on the stack is for.
enum Frame {
    /// state 0: metatable; 1: key; 2: value (key in keys[depth]).
    /// `at`: stack index of the table, with its current key in `at + 1` (0: kept only in
    /// `objs`/`keys`, for frames deeper than `STACK_FRAMES`).
    Table {
        id: u32,
        state: u8,
        at: c_int,
    },
    /// `open`: the level of an open upvalue whose thread is the child being read.
    /// `wrap`: a `coroutine.wrap` function, whose one upvalue must be a coroutine.
    Closure {
        id: u32,
        next: c_int,
        n: c_int,
        open: Option<c_int>,
        wrap: bool,
    },
    UdBytes {
        id: u32,
        state: c_int,
        nuv: c_int,
    },
    /// state 0: rebuild (or create) function; 1: init function (two-phase).
    Special {
        id: u32,
        state: u8,
        two: bool,
    },
    /// `errfunc` is Some for a suspended coroutine (frame records follow the stack).
    Thread {
        id: u32,
        next: c_int,
        n: c_int,
        errfunc: Option<i64>,
    },
}

pub(crate) struct Loader<'a> {
    r: Reader<'a>,
    next_id: u32,
    /// Strings read so far (`strs[1..=strs]`).
    strs: u32,
    /// Strings at least this long get a string id (it depends on the file's format).
    strref_len: usize,
    protos: Vec<*const c_void>,
    /// The file's format version.
    format: u16,
    /// Chunks read so far (format 4).
    chunks: Vec<LoadedChunk>,
    index: Option<HashMap<u64, *const c_void>>,
    full_index: bool,
    frames: Vec<Frame>,
    inits: u32,
    /// Steps decoded for `luasnap_table_build`: [`OPS_CAP`] once a batch is decoded (see
    /// [`Batch`]).
    ops: Vec<RawVal>,
    /// A table layout decoded for `apply_layout`: its node codes; `laynx` holds the chain
    /// links at the same offsets.
    lay: Vec<u32>,
    laynx: Vec<i32>,
    /// The layouts of a batch's steps (see [`Batch`]): per table its node count, lastfree and
    /// hash seed, then its node codes; `blaynx` holds the chain links at the same offsets.
    blay: Vec<u32>,
    blaynx: Vec<i32>,
    /// Scratch for placing a layout's entries (`luasnap_relayout_scratch`), kept between
    /// tables; u64 words for the alignment of Lua's nodes.
    scratch: Vec<u64>,
    /// The last layout placed, for the next table laid out alike (`luasnap_relayout_memo_size`
    /// bytes, zeroed: empty); valid for the whole load, whatever runs between the batches.
    memo: Vec<u64>,
    /// The VM's hash seed: layouts saved under another are not placed (see `place_hint`).
    seed: u32,
    /// The VM's continuations and pcall's (see `continuations`), once looked up.
    known_k: Option<(Vec<*const c_void>, *const c_void)>,
    pub error: Option<String>,
    shared: &'a Shared,
    trusted_bytecode: bool,
    opts: &'a LoadOptions,
    /// Preallocation units the file's hints may still ask for (see [`PREALLOC_PER_BYTE`]).
    prealloc_left: u64,
    /// For an own save: the units of preallocation the heap-growth cap allows (a unit is 16
    /// bytes: an array slot and its tag, half a hash node), which then bound a table's size
    /// hints and the whole load's instead of the file's length. A small own save may ask for
    /// the large sparse tables it had (`table.create(0, 1024)` with a few keys: their layout
    /// was not written, the keys sitting where a fresh table of that size puts them), so they
    /// come back with the same node count and `pairs` order; memory stays bounded by the cap
    /// (found by an independent attacker: 2,000 such tables in a 300 KB save lost their
    /// order, 1,097 of them). None for foreign saves: their hints stay bounded by the file.
    own_cap: Option<u64>,
    /// Objects given a metatable that was still being built (or had no `__gc` yet) when it
    /// was set: Lua marks an object for finalization only if its metatable has `__gc` at
    /// `setmetatable`, and a save writes an object's metatable before its entries, so a class
    /// that is its own metatable (`T = setmetatable({ __gc = f }, ...)`, `setmetatable(T, T)`)
    /// would lose its finalizer. Checked again when the load ends (`luasnap_recheck_finalizer`).
    late_meta: Vec<u32>,
    /// Suspended coroutines this load created, in creation order: the only threads open
    /// upvalues may point into (`loaded_cos` by address).
    threads: Vec<*mut lua_State>,
    loaded_cos: HashMap<*mut lua_State, LoadedCo>,
    /// Memo of `luasnap_open_upval_check` and of the frame checks' indexes.
    upmemo: UpMemo,
    /// The load failed for want of memory (restoring a coroutine's stack or frames), not on a
    /// bad file: the caller raises Lua's memory error.
    pub out_of_memory: bool,
    /// Coroutines this load created, whose budget hook goes when the load ends.
    all_threads: Vec<*mut lua_State>,
    /// The C functions of `coroutine.wrap`'s and `string.gmatch`'s helpers, once looked up.
    aux: Option<(usize, usize)>,
    /// Whether this load marked the state as one without new finalizers (its caller unmarks
    /// it: [`Loader::end_nofinal`]).
    nofinal_marked: bool,
}

/// A chunk a file names (format 4).
struct LoadedChunk {
    /// Its name, for messages.
    name: String,
    /// Its main prototype in this VM (reused or compiled), or None: its functions are matched
    /// by fingerprint (foreign loads, files without code).
    main: Option<*const c_void>,
    /// Whether the file brought its code.
    brought_code: bool,
}

/// How deep a path into a chunk's prototype tree may go (Lua nests functions at most about
/// 200 deep).
const MAX_PATH: u64 = 256;

unsafe extern "C" fn collect_proto(p: *const c_void, ud: *mut c_void) {
    // SAFETY: ud is the index being built; p is a live prototype (collector stopped).
    unsafe {
        let index = &mut *(ud as *mut HashMap<u64, *const c_void>);
        index.entry(luasnap_proto_hash(p)).or_insert(p);
    }
}

struct ChunkReader<'b> {
    data: &'b [u8],
    done: bool,
}

unsafe extern "C-unwind" fn chunk_reader(
    _L: *mut lua_State,
    ud: *mut c_void,
    size: *mut usize,
) -> *const std::ffi::c_char {
    // SAFETY: ud is a ChunkReader alive for the lua_load call.
    unsafe {
        let r = &mut *(ud as *mut ChunkReader<'_>);
        if r.done {
            *size = 0;
            return std::ptr::null();
        }
        r.done = true;
        *size = r.data.len();
        r.data.as_ptr().cast()
    }
}

impl<'a> Loader<'a> {
    pub fn new(file: Opened<'a>, opts: &'a LoadOptions, shared: &'a Shared) -> Self {
        let own_cap = (opts.trust == Trust::Own)
            .then(|| opts.max_heap_growth.map_or(u64::MAX / 4, |g| g as u64 / 16));
        let mut loader = Loader {
            r: Reader::new(file.body),
            next_id: 0,
            strs: 0,
            strref_len: min_strref_len(file.format),
            protos: Vec::new(),
            format: file.format,
            chunks: Vec::new(),
            index: None,
            full_index: false,
            frames: Vec::new(),
            inits: 0,
            ops: Vec::new(),
            lay: Vec::new(),
            laynx: Vec::new(),
            blay: Vec::new(),
            blaynx: Vec::new(),
            scratch: Vec::new(),
            // SAFETY: a pure function.
            memo: vec![0; unsafe { luasnap_relayout_memo_size() }.div_ceil(8)],
            seed: 0,
            known_k: None,
            error: None,
            shared,
            trusted_bytecode: opts.trust == Trust::Own
                && opts.bytecode
                && file.flags & FLAG_BYTECODE != 0,
            opts,
            prealloc_left: (file.body.len() as u64)
                .saturating_mul(PREALLOC_PER_BYTE)
                .saturating_add(PREALLOC_BASE)
                .max(own_cap.unwrap_or(0)),
            own_cap,
            late_meta: Vec::new(),
            threads: Vec::new(),
            loaded_cos: HashMap::new(),
            upmemo: UpMemo::default(),
            out_of_memory: false,
            all_threads: Vec::new(),
            aux: None,
            nofinal_marked: false,
        };
        // A foreign save's collision chains are bounded by its length (see `COLLISIONS`); an
        // own save's are not.
        if opts.trust == Trust::Foreign {
            let limit = (file.body.len() as u64)
                .saturating_mul(CHAIN_PER_BYTE)
                .saturating_add(CHAIN_BASE);
            // SAFETY: the memo is luasnap_relayout_memo_size() bytes, owned by this loader.
            unsafe { luasnap_relayout_memo_limit(loader.memo.as_mut_ptr().cast(), limit) };
        }
        loader
    }

    /// Array sizes for the object and string tables of the load: about what a game's save of
    /// this length needs (the bench heap's: 18 bytes per object, 118 per string; an object
    /// takes 6 bytes or more, a string 8 or more, so a denser file grows them, by doubling).
    /// Sizing them for the densest file (n/6 and n/8) cleared and spread over 460 KB of id
    /// slots per 177 KB body, 4x what the bench save uses: 1.6% of its instructions.
    pub fn helper_sizes(&self) -> (c_int, c_int) {
        let n = self.r.remaining().min(1 << 30);
        ((n / 16) as c_int, (n / 64) as c_int)
    }

    /// Unmarks the state this load marked as one without new finalizers; returns whether it
    /// did (the collector must then be restarted, if it ran before: `lua_gc` ignored it).
    ///
    /// # Safety
    /// `L` is a thread of the VM the load ran in, the load over.
    pub(crate) unsafe fn end_nofinal(&mut self, L: *mut lua_State) -> bool {
        let marked = std::mem::take(&mut self.nofinal_marked);
        if marked {
            // SAFETY: clears one bit of the global state.
            unsafe { luasnap_gc_nofinal(L, 0) };
        }
        marked
    }

    fn fail(&mut self, what: impl Into<String>) -> Fail {
        self.error = Some(format!(
            "{} (at byte {} of the body)",
            what.into(),
            self.r.pos
        ));
        Fail
    }

    /// Scratch for placing a layout of `size` nodes, for the C side (grown, never shrunk).
    fn scratch_for(&mut self, size: u32) -> *mut c_void {
        // SAFETY: a pure size computation.
        let words = unsafe { luasnap_relayout_scratch(size) }.div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        self.scratch.as_mut_ptr().cast()
    }

    /// Reads a layout's header (seed, node count, lastfree) and checks it against the blob
    /// that holds it (every node takes at least one byte; sizes are powers of two below 2^31).
    #[inline(always)]
    fn layout_header(r: &mut Reader<'_>, blob_len: usize) -> Option<(u32, u32, u32)> {
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

    /// Reads a table's layout (after `Tag::Layout`) and puts the entries of the table
    /// objs[id], complete now, into the nodes it gives (`luasnap_table_relayout`, which
    /// checks it against the table), so `next` visits them in the saved order.
    unsafe fn apply_layout(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        let Some(blob) = self.r.bytes() else {
            return Err(self.malformed("truncated table layout"));
        };
        let mut r = Reader::new(blob);
        let bad = "a table layout that is not one (bad sizes or links)";
        let Some((seed, size, lastfree)) = Self::layout_header(&mut r, blob.len()) else {
            return Err(self.malformed(bad));
        };
        // A layout for another node count does not apply (the table keeps the order its
        // insertions gave it, as luasnap_table_relayout would decide): skipped before its
        // nodes are read into host memory (about 60 bytes a node with the scratch), so that
        // memory is bounded by the heap the table takes (under the load's growth cap), not
        // by what the file claims (an attacker's 4 MB file took 273 MB outside the cap).
        // SAFETY: protected context; objs[id] is a table (registered when it was read).
        let nodes = unsafe {
            luasnap_checkstack(L, 1, c"load".as_ptr());
            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
            let n = luasnap_table_nodes(L, -1);
            ffi::lua_settop(L, -2);
            n
        };
        if nodes != size {
            return Ok(());
        }
        self.lay.clear();
        self.laynx.clear();
        // The removed entries' keys go to a table (keys[1..]) for the C side, made at the
        // first one.
        let mut nkeys = 0;
        for _ in 0..size {
            let Some((c, nx)) = Self::layout_node(&mut r, size) else {
                return Err(self.malformed(bad));
            };
            if c == 2 {
                let Some(k) = r.varint() else {
                    return Err(self.malformed(bad));
                };
                // SAFETY: protected context; room checked; the keys table is on top once made.
                unsafe {
                    if nkeys == 0 {
                        luasnap_checkstack(L, 4, c"load".as_ptr());
                        ffi::lua_createtable(L, 0, 0);
                    }
                    match k {
                        kind::FALSE | kind::TRUE => {
                            ffi::lua_pushboolean(L, (k == kind::TRUE) as c_int)
                        }
                        kind::INT => match r.varint() {
                            Some(z) => {
                                ffi::lua_pushinteger(L, ((z >> 1) as i64) ^ -((z & 1) as i64))
                            }
                            None => return Err(self.malformed(bad)),
                        },
                        kind::FLOAT => match r.varint() {
                            Some(b) if !f64::from_bits(b).is_nan() => {
                                ffi::lua_pushnumber(L, f64::from_bits(b))
                            }
                            _ => return Err(self.malformed(bad)),
                        },
                        kind::STR => match r.bytes() {
                            Some(b) => {
                                ffi::lua_pushlstring(L, b.as_ptr().cast(), b.len());
                            }
                            None => return Err(self.malformed(bad)),
                        },
                        _ => return Err(self.malformed(bad)),
                    }
                    nkeys += 1;
                    ffi::lua_rawseti(L, -2, nkeys);
                }
            }
            self.lay.push(c);
            self.laynx.push(nx);
        }
        if r.pos != blob.len() {
            return Err(self.malformed(bad));
        }
        let scratch = self.scratch_for(size);
        // SAFETY: protected context; objs[id] is the table (registered when it was read);
        // lay and laynx hold `size` entries, scratch the bytes the C side asks for; the C side
        // checks everything else and neither allocates nor raises.
        let rc = unsafe {
            luasnap_checkstack(L, 3, c"load".as_ptr());
            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
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

    /// Whether a metatable with `__gc` fails the load (see [`LoadOptions::finalizers`]; with
    /// `inert_finalizers` the whole load runs marked as one without new finalizers instead).
    /// Whether the load walked more collision-chain nodes than its limit (see `COLLISIONS`).
    fn collisions_over(&self) -> bool {
        // SAFETY: the memo is luasnap_relayout_memo_size() bytes, owned by this loader.
        unsafe { luasnap_relayout_memo_over(self.memo.as_ptr().cast()) != 0 }
    }

    fn refuses_finalizers(&self) -> bool {
        !self.opts.finalizers && !self.opts.inert_finalizers
    }

    fn malformed(&mut self, what: &str) -> Fail {
        self.fail(format!("malformed save-game: {what}"))
    }

    /// Reads the root value and leaves it on the stack.
    ///
    /// # Safety
    /// Protected context; `s` are valid absolute indices of this call's helper tables.
    pub unsafe fn run(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: protected context (callers' contract).
        unsafe {
            // No emergency collection while prototypes are looked up by raw pointer (the
            // caller allows them again when the load ends, whatever its outcome).
            luasnap_gc_stopem(L, 1);
            self.seed = luasnap_hash_seed(L);
            if !self.opts.finalizers {
                // No finalizer from anything the load runs (see luasnap_gc_nofinal); the
                // caller unmarks it after the load (`nofinal_marked`).
                self.nofinal_marked = luasnap_gc_nofinal(L, 1) == 0;
            }
            let mut ready = self.value(L, s)?;
            loop {
                if ready {
                    // A completed child is on top: hand it to its parent.
                    match self.frames.len() {
                        0 => break,
                        _ => self.accept(L, s)?,
                    }
                }
                ready = match self.frames.len() {
                    0 => break,
                    _ => self.advance(L, s)?,
                };
            }
            if self.r.remaining() != 0 {
                return Err(self.malformed("trailing bytes after the root value"));
            }
            // Every suspended coroutine is complete (its frame ended), its open upvalues
            // checked: they may run from now on (the initializers below may resume them).
            for i in 0..self.threads.len() {
                if luasnap_thread_hold(self.threads[i], 0) != 0 {
                    return Err(self.malformed(RESET));
                }
            }
            // Objects whose metatable got its __gc after it was set are marked for
            // finalization now, as `setmetatable` would have on the complete metatable (a
            // no-op for those already marked, and while no finalizers are allowed); a load
            // that refuses finalizers refuses them, as it refuses a __gc seen at once.
            for i in 0..self.late_meta.len() {
                ffi::lua_rawgeti(L, s.objs, self.late_meta[i] as ffi::lua_Integer);
                if self.refuses_finalizers() {
                    let gc = ffi::lua_getmetatable(L, -1) != 0 && {
                        let gc = has_gc(L);
                        ffi::lua_settop(L, -2);
                        gc
                    };
                    if gc {
                        ffi::lua_settop(L, -2);
                        return Err(self.fail(NO_FINALIZERS));
                    }
                } else {
                    luasnap_recheck_finalizer(L);
                }
                ffi::lua_settop(L, -2);
            }
            // Two-phase initializers run last, in creation order, on the complete graph.
            for i in 1..=self.inits {
                ffi::lua_rawgeti(L, s.inits, i as ffi::lua_Integer);
                // [.., pair, init, object]
                ffi::lua_rawgeti(L, -1, 2);
                ffi::lua_rawgeti(L, -2, 1);
                // Lua code may collect: the collector must find the flag clear (lgc.c's
                // singlestep asserts it); after_call stops emergencies again.
                luasnap_gc_stopem(L, 0);
                ffi::lua_callk(L, 1, 0, 0, None);
                self.after_call(L)?;
                ffi::lua_settop(L, -2);
            }
            // Coroutines made by this load run outside it from now on: no budget hook.
            for &co in &self.all_threads {
                if budget_hook_intact(co) {
                    ffi::lua_sethook(co, None, 0, 0);
                }
            }
        }
        Ok(())
    }

    /// After Lua code ran at load time: the budget hook must still be the load's (code that
    /// replaced it could run unbounded), and what a collection may have invalidated goes.
    unsafe fn after_call(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: queries and flags of the loading thread's state.
        unsafe {
            if !budget_hook_intact(L) {
                return Err(self.fail("a load-time function changed the load's instruction-budget hook (debug.sethook); the save-game is refused"));
            }
            // A collection (collectgarbage, or one that finished its cycle meanwhile) may have
            // freed prototypes the index points to: look them up again when next needed.
            // Those already used are anchored in `protos`.
            self.index = None;
            self.full_index = false;
            luasnap_gc_stopem(L, 1);
        }
        Ok(())
    }

    /// Whether the function on top may be called at load time: always for own saves; for
    /// foreign ones, only a constructor the host registered (see `Vm::register_constructor`).
    unsafe fn may_call(&mut self, L: *mut lua_State) -> bool {
        if self.opts.trust == Trust::Own {
            return true;
        }
        // SAFETY: protected context; balanced pushes.
        unsafe {
            if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, CTORS_KEY.as_ptr()) != ffi::LUA_TTABLE {
                ffi::lua_settop(L, -2);
                return false;
            }
            ffi::lua_pushvalue(L, -2);
            let mut ok = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
            ffi::lua_settop(L, -2);
            if !ok {
                let p = luasnap_proto(L, -2);
                if !p.is_null() {
                    ffi::lua_pushlightuserdata(L, p.cast_mut());
                    ok = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
                    ffi::lua_settop(L, -2);
                }
            }
            ffi::lua_settop(L, -2);
            ok
        }
    }

    /// The C functions of `coroutine.wrap`'s and `string.gmatch`'s helpers (from the VM's
    /// own permanents), looked up once per load.
    unsafe fn aux(&mut self, L: *mut lua_State) -> (usize, usize) {
        if let Some(a) = self.aux {
            return a;
        }
        let mut a = (0usize, 0usize);
        // SAFETY: protected context; balanced pushes.
        unsafe {
            ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, super::UNPERMS_KEY.as_ptr());
            if ffi::lua_type(L, -1) == ffi::LUA_TTABLE {
                ffi::lua_getfield(L, -1, WRAP_AUX.as_ptr());
                a.0 = ffi::lua_tocfunction(L, -1).map_or(0, |f| f as usize);
                ffi::lua_getfield(L, -2, GMATCH_AUX.as_ptr());
                a.1 = ffi::lua_tocfunction(L, -1).map_or(0, |f| f as usize);
                ffi::lua_settop(L, -3);
            }
            ffi::lua_settop(L, -2);
        }
        self.aux = Some(a);
        a
    }

    /// Refuses the value on top if it is a library helper without the upvalues it relies on
    /// (`coroutine.wrap`'s without its coroutine, `string.gmatch`'s without its match
    /// state): called, it would read a missing upvalue as a pointer.
    unsafe fn refuse_bare_helper(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: protected context; queries and balanced pushes.
        unsafe {
            if ffi::lua_iscfunction(L, -1) == 0 {
                return Ok(());
            }
            let f = ffi::lua_tocfunction(L, -1).map_or(0, |f| f as usize);
            let (wrap, gmatch) = self.aux(L);
            if f != 0 && (f == wrap || f == gmatch) {
                if ffi::lua_getupvalue(L, -1, 1).is_null() {
                    return Err(self.malformed(
                        "a library helper (coroutine.wrap's or string.gmatch's) without its state",
                    ));
                }
                ffi::lua_settop(L, -2);
            }
        }
        Ok(())
    }

    /// Refuses a permanent's name (the key on top) that the load's options do not allow.
    unsafe fn check_perm_name(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: reads a string without conversion.
        unsafe {
            if ffi::lua_type(L, -1) != ffi::LUA_TSTRING {
                return Ok(());
            }
            let mut len = 0;
            let p = ffi::lua_tolstring(L, -1, &mut len);
            let name = std::slice::from_raw_parts(p.cast::<u8>(), len);
            if !self.opts.allows_permanent(name) {
                let name = String::from_utf8_lossy(name).into_owned();
                ffi::lua_settop(L, -2);
                return Err(self.fail(format!(
                    "the save refers to the permanent {name:?}, which this load does not allow ({} save); if the file is trusted, remove it from LoadOptions::denied_permanents",
                    if self.opts.trust == Trust::Foreign { "a foreign" } else { "an own" }
                )));
            }
        }
        Ok(())
    }

    fn id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    unsafe fn register(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: the object is on top; stores it in objs[id] (may allocate: protected).
        unsafe {
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawseti(L, s.objs, id as ffi::lua_Integer);
        }
        self.check_heap(L)
    }

    /// Fails once the heap grew past the load's cap (each object is bounded by the file's
    /// bytes and the preallocation budget, so this check per object bounds the overshoot).
    fn check_heap(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: reads two counters of the global state.
        if unsafe { luasnap_heap_bytes(L) } > self.shared.heap_cap.get() {
            return Err(self.fail("the load exceeded its heap-growth cap (LoadOptions::max_heap_growth, eris.settings(\"maxgrowth\"))"));
        }
        Ok(())
    }

    /// Reads one value. Returns true if it is complete on top of the stack, false if a frame
    /// was pushed that will leave it there when done.
    unsafe fn value(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // SAFETY: protected context; every push is checked against stack space by the fixed
        // small number of values used per step (LUA_MINSTACK).
        unsafe {
            luasnap_checkstack(L, 8, c"load".as_ptr());
            let Some(tag) = self.r.u8() else {
                return Err(self.malformed("truncated"));
            };
            let Some(tag) = Tag::from_u8(tag) else {
                return Err(self.malformed(&format!("unknown tag {tag}")));
            };
            match tag {
                Tag::Layout => {
                    return Err(self.malformed("a table layout where a value belongs"));
                }
                Tag::Nil => ffi::lua_pushnil(L),
                Tag::False => ffi::lua_pushboolean(L, 0),
                Tag::True => ffi::lua_pushboolean(L, 1),
                Tag::Int => match self.r.i64() {
                    Some(v) => ffi::lua_pushinteger(L, v),
                    None => return Err(self.malformed("bad integer")),
                },
                Tag::Float => match self.r.u64() {
                    Some(v) => ffi::lua_pushnumber(L, f64::from_bits(v)),
                    None => return Err(self.malformed("bad float")),
                },
                Tag::Str => match self.r.bytes() {
                    Some(b) => {
                        ffi::lua_pushlstring(L, b.as_ptr().cast(), b.len());
                        if b.len() >= self.strref_len {
                            self.strs += 1;
                            ffi::lua_pushvalue(L, -1);
                            ffi::lua_rawseti(L, s.strs, self.strs as ffi::lua_Integer);
                        }
                    }
                    None => return Err(self.malformed("bad string length")),
                },
                Tag::StrRef => match self.r.varint() {
                    Some(sid) if sid < self.strs as u64 => {
                        ffi::lua_rawgeti(L, s.strs, sid as ffi::lua_Integer + 1);
                    }
                    _ => return Err(self.malformed("bad string reference")),
                },
                Tag::Light => match self.r.u64() {
                    Some(v) => ffi::lua_pushlightuserdata(L, v as usize as *mut c_void),
                    None => return Err(self.malformed("bad light userdata")),
                },
                Tag::Ref => {
                    let Some(id) = self.r.varint() else {
                        return Err(self.malformed("bad reference"));
                    };
                    if id >= self.next_id as u64 {
                        return Err(self.malformed("reference to an object not yet defined"));
                    }
                    if ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer) == ffi::LUA_TNIL {
                        ffi::lua_settop(L, -2);
                        return Err(self.fail(REBUILDING));
                    }
                }
                Tag::Perm => {
                    // The key: a primitive value.
                    if !self.value(L, s)?
                        || !matches!(
                            ffi::lua_type(L, -1),
                            ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN | ffi::LUA_TNIL
                        )
                    {
                        return Err(self.malformed("a permanent's key must be a primitive"));
                    }
                    self.check_perm_name(L)?;
                    ffi::lua_pushvalue(L, -1);
                    if ffi::lua_rawget(L, s.perms) == ffi::LUA_TNIL {
                        ffi::lua_settop(L, -2);
                        let name = perm_name(L);
                        ffi::lua_settop(L, -2);
                        return Err(self.fail(format!(
                            "missing permanent {name}: the save refers to it by that name; register it under the same name before loading (Vm::register_native / register_permanent, or perms[\"name\"] = value in eris.unpersist)"
                        )));
                    }
                    ffi::lua_rotate(L, -2, 1);
                    ffi::lua_settop(L, -2);
                    self.refuse_bare_helper(L)?;
                    if ffi::lua_type(L, -1) != ffi::LUA_TLIGHTUSERDATA {
                        let id = self.id();
                        self.register(L, s, id)?;
                    }
                }
                Tag::Table => {
                    let id = self.id();
                    let (Some(narr), Some(nhash)) = (self.r.varint(), self.r.varint()) else {
                        return Err(self.malformed("bad table header"));
                    };
                    let (narr, nhash) = self.table_sizes(narr, nhash);
                    ffi::lua_createtable(L, narr, nhash);
                    self.register(L, s, id)?;
                    let at = if self.frames.len() < STACK_FRAMES {
                        ffi::lua_pushnil(L); // the key slot
                        ffi::lua_gettop(L) - 1
                    } else {
                        ffi::lua_settop(L, -2);
                        0
                    };
                    self.frames.push(Frame::Table { id, state: 0, at });
                    return Ok(false);
                }
                Tag::LClosure => return self.lclosure(L, s),
                Tag::CClosure => return self.cclosure(L, s),
                Tag::UdPlain => {
                    let (Some(name), Some(bytes)) = (self.r.bytes(), self.r.bytes()) else {
                        return Err(self.malformed("bad plain userdata"));
                    };
                    let Some(ty) = self
                        .shared
                        .userdata_types()
                        .iter()
                        .find(|t| t.name.as_bytes() == name)
                    else {
                        let n = String::from_utf8_lossy(name).into_owned();
                        return Err(self.fail(format!("userdata type '{n}' is not registered in this VM; register it (VmBuilder::userdata) before loading")));
                    };
                    if ty.size != bytes.len() {
                        return Err(self.malformed("plain userdata of the wrong size for its type"));
                    }
                    let id = self.id();
                    let p = ffi::lua_newuserdatauv(L, ty.size, 0);
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), ty.size);
                    ffi::lua_pushlightuserdata(L, ty.metatable.cast_mut());
                    ffi::lua_rawget(L, ffi::LUA_REGISTRYINDEX);
                    ffi::lua_setmetatable(L, -2);
                    self.register(L, s, id)?;
                }
                Tag::UdBytes => {
                    let (Some(bytes), Some(nuv)) = (self.r.bytes(), self.r.varint()) else {
                        return Err(self.malformed("bad userdata"));
                    };
                    if nuv > u16::MAX as u64 || nuv > self.r.remaining() as u64 {
                        return Err(self.malformed("too many user values"));
                    }
                    let id = self.id();
                    let p = ffi::lua_newuserdatauv(L, bytes.len(), nuv as c_int);
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), bytes.len());
                    self.register(L, s, id)?;
                    ffi::lua_settop(L, -2);
                    self.frames.push(Frame::UdBytes {
                        id,
                        state: 0,
                        nuv: nuv as c_int,
                    });
                    return Ok(false);
                }
                Tag::Thunk | Tag::TwoPhase => {
                    let id = self.id();
                    self.frames.push(Frame::Special {
                        id,
                        state: 0,
                        two: tag == Tag::TwoPhase,
                    });
                    return Ok(false);
                }
                Tag::Thread => {
                    let Some(kind) = self.r.u8() else {
                        return Err(self.malformed("bad thread"));
                    };
                    let id = self.id();
                    let co = ffi::lua_newthread(L);
                    self.all_threads.push(co);
                    if kind == THREAD_SUSPENDED {
                        self.threads.push(co);
                    }
                    if kind == THREAD_SUSPENDED || kind == THREAD_NOT_STARTED {
                        // Unresumable until complete and checked (see Frame::Thread).
                        luasnap_thread_building(co, 1);
                    }
                    self.register(L, s, id)?;
                    match kind {
                        THREAD_DEAD => {}
                        THREAD_NOT_STARTED | THREAD_SUSPENDED => {
                            let Some(n) = self.r.varint() else {
                                return Err(self.malformed("bad thread"));
                            };
                            if n == 0 || n > self.r.remaining() as u64 || n > 1_000_000 {
                                return Err(self.malformed("bad coroutine stack size"));
                            }
                            if kind == THREAD_SUSPENDED {
                                self.loaded_cos.insert(
                                    co,
                                    LoadedCo {
                                        len: n as c_int,
                                        frames: None,
                                        unchecked: Vec::new(),
                                        open: BTreeMap::new(),
                                    },
                                );
                            }
                            let errfunc = if kind == THREAD_SUSPENDED {
                                match self.r.i64() {
                                    Some(e) => Some(e),
                                    None => return Err(self.malformed("bad thread")),
                                }
                            } else {
                                None
                            };
                            ffi::lua_settop(L, -2);
                            self.frames.push(Frame::Thread {
                                id,
                                next: 1,
                                n: n as c_int,
                                errfunc,
                            });
                            return Ok(false);
                        }
                        _ => return Err(self.malformed("unknown coroutine state")),
                    }
                }
                Tag::MainThread => {
                    ffi::lua_pushthread(L);
                    let id = self.id();
                    self.register(L, s, id)?;
                }
                Tag::UpvalNew | Tag::UpvalRef | Tag::UpvalOpen => {
                    return Err(self.malformed("upvalue outside a closure"))
                }
            }
        }
        Ok(true)
    }

    unsafe fn proto(&mut self, L: *mut lua_State, s: Slots) -> Result<*const c_void, Fail> {
        let Some(index) = self.r.varint() else {
            return Err(self.malformed("bad prototype"));
        };
        if (index as usize) < self.protos.len() {
            return Ok(self.protos[index as usize]);
        }
        if index as usize != self.protos.len() {
            return Err(self.malformed("prototypes out of order"));
        }
        if self.format < 4 {
            let (Some(hash), Some(src), Some(line), Some(code)) = (
                self.r.u64(),
                self.r.bytes(),
                self.r.varint(),
                self.r.bytes(),
            ) else {
                return Err(self.malformed("bad prototype"));
            };
            // SAFETY: protected context (callers' contract).
            return unsafe { self.detached(L, s, hash, src, line, code) };
        }
        let (Some(hash), Some(line), Some(home)) = (self.r.u64(), self.r.varint(), self.r.varint())
        else {
            return Err(self.malformed("bad prototype"));
        };
        if home == 0 {
            let (Some(src), Some(code)) = (self.r.bytes(), self.r.bytes()) else {
                return Err(self.malformed("bad prototype"));
            };
            // SAFETY: as above.
            return unsafe { self.detached(L, s, hash, src, line, code) };
        }
        let c = (home - 1) as usize;
        if c > self.chunks.len() {
            return Err(self.malformed("chunks out of order"));
        }
        if c == self.chunks.len() {
            // SAFETY: as above.
            let chunk = unsafe { self.chunk(L, s)? };
            self.chunks.push(chunk);
        }
        let Some(depth) = self.r.varint().filter(|&d| d <= MAX_PATH) else {
            return Err(self.malformed("bad prototype path"));
        };
        let Some(mut p) = self.chunks[c].main else {
            // No code to use: the function's fingerprint names it.
            for _ in 0..depth {
                if self.r.varint().is_none() {
                    return Err(self.malformed("bad prototype path"));
                }
            }
            // SAFETY: as above.
            let found = unsafe { self.by_fingerprint(L, s, hash)? };
            let brought = self.chunks[c].brought_code;
            let name = self.chunks[c].name.clone();
            return match found {
                Some(p) => Ok(p),
                None if brought => Err(self.fail(format!(
                    "the function defined at {name}:{line} is not among the chunks this VM has loaded; the save-game brings that chunk's code, which only an own-trust load compiles (Trust::Own, or eris.settings(\"trust\", \"own\"))"
                ))),
                None => Err(self.fail(format!(
                    "the function defined at {name}:{line} is not among the chunks this VM has loaded (or its code changed), and the save-game has no code for it; load the same game code before loading the save"
                ))),
            };
        };
        for _ in 0..depth {
            let Some(i) = self.r.varint() else {
                return Err(self.malformed("bad prototype path"));
            };
            // SAFETY: p is a live prototype (its chunk is anchored for the load).
            let child = unsafe { luasnap_proto_child(p, i.min(c_int::MAX as u64) as c_int) };
            if child.is_null() {
                let name = self.chunks[c].name.clone();
                return Err(self.fail(format!(
                    "chunk {name} has no function at the position the save-game gives (the function defined at line {line}); the save does not match its code"
                )));
            }
            p = child;
        }
        // SAFETY: as above.
        if unsafe { luasnap_proto_hash(p) } != hash {
            let name = self.chunks[c].name.clone();
            return Err(self.fail(format!(
                "chunk {name} compiles to a different prototype tree than the save-game says (the function defined at line {line} differs); the save was written by another Lua build or altered"
            )));
        }
        self.protos.push(p);
        Ok(p)
    }

    /// Reads a chunk's first occurrence (after its home) and finds or compiles it.
    unsafe fn chunk(&mut self, L: *mut lua_State, s: Slots) -> Result<LoadedChunk, Fail> {
        let (Some(kind), Some(name), Some(main_hash), Some(code)) =
            (self.r.u8(), self.r.bytes(), self.r.u64(), self.r.bytes())
        else {
            return Err(self.malformed("bad chunk"));
        };
        if kind > 1 {
            return Err(self.malformed("bad chunk kind"));
        }
        let shown = || String::from_utf8_lossy(name).into_owned();
        if code.is_empty() || self.opts.trust == Trust::Foreign {
            return Ok(LoadedChunk {
                name: shown(),
                main: None,
                brought_code: !code.is_empty(),
            });
        }
        if kind == 1 && !(self.opts.trust == Trust::Own && self.opts.bytecode) {
            return Err(self.fail(format!(
                "chunk {} was loaded as binary (string.dump output): its bytecode is loaded only by own-trust loads that allow it (LoadOptions::bytecode)",
                shown()
            )));
        }
        let key = -(self.chunks.len() as ffi::lua_Integer) - 1;
        // No Rust value with a destructor is alive across the calls below (they may raise a
        // memory error): the name and code are slices of the file, the outcome plain data.
        // SAFETY: protected context; pushes are balanced; the main closure pushed for a found
        // or compiled chunk is anchored in `protos` for the whole load.
        let outcome: Result<*const c_void, bool> = unsafe {
            // The identical chunk, live in this VM: shared prototypes, no compile.
            let found = luasnap_chunk_find(
                L,
                main_hash,
                code.as_ptr().cast(),
                code.len(),
                name.as_ptr().cast(),
                name.len(),
            );
            if !found.is_null() {
                luasnap_push_closure(L, found);
                ffi::lua_rawseti(L, s.protos, key);
                Ok(found)
            } else {
                // [name, code]: the chunk name as a C string (a name with a NUL byte compiles
                // under a shorter name, so its fingerprint differs and it is refused).
                luasnap_checkstack(L, 4, c"load".as_ptr());
                ffi::lua_pushlstring(L, name.as_ptr().cast(), name.len());
                ffi::lua_pushlstring(L, code.as_ptr().cast(), code.len());
                let cname = ffi::lua_tolstring(L, -2, std::ptr::null_mut());
                let mode = if kind == 1 { c"b" } else { c"t" };
                let st = crate::bridge::chunks::luasnap_loadstring(L, -1, cname, mode.as_ptr());
                if st != ffi::LUA_OK {
                    // [name, code, message]: the message is read below, then popped.
                    Err(false)
                } else {
                    let p = luasnap_proto(L, -1);
                    ffi::lua_rawseti(L, s.protos, key);
                    ffi::lua_settop(L, -3);
                    if p.is_null() || luasnap_proto_hash(p) != main_hash {
                        Err(true)
                    } else {
                        Ok(p)
                    }
                }
            }
        };
        match outcome {
            Ok(p) => Ok(LoadedChunk {
                name: shown(),
                main: Some(p),
                brought_code: true,
            }),
            Err(false) => {
                // SAFETY: the compiler's message is on top, above the name and code.
                let msg = unsafe {
                    let mut len = 0;
                    let m = ffi::lua_tolstring(L, -1, &mut len);
                    let msg = if m.is_null() {
                        String::new()
                    } else {
                        String::from_utf8_lossy(std::slice::from_raw_parts(m.cast::<u8>(), len))
                            .into_owned()
                    };
                    ffi::lua_settop(L, -4);
                    msg
                };
                Err(self.fail(format!(
                    "chunk {} in the save-game does not compile: {msg}",
                    shown()
                )))
            }
            Err(true) => Err(self.fail(format!(
                "chunk {} compiles to a different prototype tree than the save-game's fingerprint says; the save was written by another Lua build or altered",
                shown()
            ))),
        }
    }

    /// A prototype outside every chunk (or from a format 1-3 file): the file's bytecode if
    /// the load trusts it, else the live prototype with that fingerprint.
    unsafe fn detached(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        hash: u64,
        src: &[u8],
        line: u64,
        code: &[u8],
    ) -> Result<*const c_void, Fail> {
        if self.trusted_bytecode && !code.is_empty() {
            // Trusted: load the file's bytecode. Only for files the caller vouches for.
            // SAFETY: protected context; lua_load in binary mode on bytes from a trusted file.
            unsafe {
                let mut cr = ChunkReader {
                    data: code,
                    done: false,
                };
                let st = ffi::lua_load(
                    L,
                    chunk_reader,
                    (&mut cr as *mut ChunkReader<'_>).cast(),
                    c"=(save-game)".as_ptr(),
                    c"b".as_ptr(),
                );
                if st != ffi::LUA_OK {
                    ffi::lua_settop(L, -2);
                    return Err(self.fail("the save-game's bytecode does not load in this Lua"));
                }
                let p = luasnap_proto(L, -1);
                ffi::lua_rawseti(L, s.protos, self.protos.len() as ffi::lua_Integer + 1);
                if luasnap_proto_hash(p) != hash {
                    return Err(self.malformed("bytecode does not match its fingerprint"));
                }
                self.protos.push(p);
                return Ok(p);
            }
        }
        // SAFETY: protected context (callers' contract).
        match unsafe { self.by_fingerprint(L, s, hash)? } {
            Some(p) => Ok(p),
            None => {
                let src = String::from_utf8_lossy(src).into_owned();
                let hint = if code.is_empty() || self.opts.trust == Trust::Foreign {
                    "load the same game code before loading the save"
                } else {
                    "the save-game brings its bytecode, which only own-trust loads that allow it (LoadOptions::bytecode) use"
                };
                Err(self.fail(format!(
                    "the function defined at {src}:{line} is not among the chunks this VM has loaded (or its code changed); {hint}"
                )))
            }
        }
    }

    /// The live prototype with fingerprint `hash`, anchored for the load and listed, or None.
    unsafe fn by_fingerprint(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        hash: u64,
    ) -> Result<Option<*const c_void>, Fail> {
        if self.index.is_none() {
            // The prototypes of every chunk the VM compiled (anchored in the registry).
            let mut index = HashMap::new();
            let ud = (&mut index as *mut HashMap<u64, *const c_void>).cast();
            // SAFETY: reads the anchored chunks; the collector is stopped for the load.
            unsafe { crate::bridge::chunks::luasnap_chunks_each_proto(L, collect_proto, ud) };
            self.index = Some(index);
        }
        let mut found = self.index.as_ref().and_then(|i| i.get(&hash).copied());
        if found.is_none() && !self.full_index {
            // Not in an anchored chunk (compiled by other means): every prototype alive.
            self.full_index = true;
            let index = self.index.get_or_insert_with(HashMap::new);
            // SAFETY: the collector is stopped for the whole load.
            unsafe {
                luasnap_each_proto(
                    L,
                    collect_proto,
                    (index as *mut HashMap<u64, *const c_void>).cast(),
                )
            };
            found = self.index.as_ref().and_then(|i| i.get(&hash).copied());
        }
        if let Some(p) = found {
            // Anchor it for the whole load: found by raw pointer, it may belong to no chunk
            // the registry keeps, and Lua code run by the load (or a collection it finishes)
            // could otherwise free it under a closure.
            // SAFETY: protected context; emergency collections are stopped and no Lua code ran
            // since the index was built, so p is alive.
            unsafe {
                luasnap_push_closure(L, p);
                ffi::lua_rawseti(L, s.protos, self.protos.len() as ffi::lua_Integer + 1);
            }
            self.protos.push(p);
        }
        Ok(found)
    }

    unsafe fn lclosure(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // SAFETY: protected context.
        unsafe {
            let p = self.proto(L, s)?;
            let Some(n) = self.r.varint() else {
                return Err(self.malformed("bad closure"));
            };
            if n != luasnap_proto_nupvalues(p) as u64 {
                return Err(self.malformed("closure upvalue count differs from its prototype"));
            }
            let id = self.id();
            luasnap_push_closure(L, p);
            self.register(L, s, id)?;
            ffi::lua_settop(L, -2);
            self.frames.push(Frame::Closure {
                id,
                next: 1,
                n: n as c_int,
                open: None,
                wrap: false,
            });
            Ok(false)
        }
    }

    unsafe fn cclosure(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // SAFETY: protected context.
        unsafe {
            // The function: the key of a permanent naming a bare C function.
            if !self.value(L, s)?
                || !matches!(ffi::lua_type(L, -1), ffi::LUA_TSTRING | ffi::LUA_TNUMBER)
            {
                return Err(self.malformed("bad C closure"));
            }
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawget(L, s.perms);
            // Only a function without upvalues of its own: the closure is rebuilt from the
            // bare function, and one that keeps state in upvalues (math.random's generator,
            // a native's index) would read the missing ones as pointers.
            let bare = ffi::lua_iscfunction(L, -1) != 0 && {
                let has_upvalue = !ffi::lua_getupvalue(L, -1, 1).is_null();
                if has_upvalue {
                    ffi::lua_settop(L, -2);
                }
                !has_upvalue
            };
            let f = if bare {
                ffi::lua_tocfunction(L, -1)
            } else {
                None
            };
            ffi::lua_settop(L, -2);
            let Some(f) = f else {
                let name = perm_name(L);
                ffi::lua_settop(L, -2);
                return Err(self.fail(format!("missing permanent {name} (a C function without upvalues of its own): register it under the same name before loading")));
            };
            let Some(n) = self.r.varint() else {
                return Err(self.malformed("bad C closure"));
            };
            // C functions trust their upvalues: a closure is rebuilt only where the loader
            // knows the layout and checks it. `coroutine.wrap`'s helper: one coroutine.
            // Without upvalues it is the permanent itself, under the permanents' rules.
            let (wrap, _) = self.aux(L);
            let is_wrap = wrap != 0 && f as usize == wrap;
            if n == 0 {
                self.check_perm_name(L)?;
            } else if !(is_wrap && n == 1) {
                let name = perm_name(L);
                ffi::lua_settop(L, -2);
                return Err(self.malformed(&format!(
                    "a C closure of {name} with {n} upvalues: the loader rebuilds C closures only where it knows and checks their upvalues (coroutine.wrap functions)"
                )));
            }
            ffi::lua_settop(L, -2);
            if n == 0 && is_wrap {
                return Err(self.malformed(
                    "a library helper (coroutine.wrap's or string.gmatch's) without its state",
                ));
            }
            if n == 0 {
                let (_, gmatch) = self.aux(L);
                if gmatch != 0 && f as usize == gmatch {
                    return Err(self.malformed(
                        "a library helper (coroutine.wrap's or string.gmatch's) without its state",
                    ));
                }
            }
            let id = self.id();
            for _ in 0..n {
                ffi::lua_pushnil(L);
            }
            ffi::lua_pushcclosure(L, f, n as c_int);
            self.register(L, s, id)?;
            ffi::lua_settop(L, -2);
            self.frames.push(Frame::Closure {
                id,
                next: 1,
                n: n as c_int,
                open: None,
                wrap: is_wrap,
            });
            Ok(false)
        }
    }

    /// Moves the top frame on: reads its next child. Returns whether a value is complete on top
    /// (a child value, or this frame's own object when it finished).
    unsafe fn advance(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        let depth = self.frames.len();
        // SAFETY: protected context.
        unsafe {
            match self.frames.last_mut().expect("non-empty") {
                Frame::Table { id, state, at } => {
                    let (id, at, state) = (*id, *at, *state);
                    if state == 1 {
                        if at > 0 && self.plain_entries(L, s, at)? {
                            // Frames may have been pushed: on from the top one.
                            return Ok(false);
                        }
                        // End of entries (with the hash part's layout, or without)?
                        let end = self.r.data.get(self.r.pos).copied();
                        if end == Some(Tag::Nil as u8) || end == Some(Tag::Layout as u8) {
                            self.r.pos += 1;
                            if end == Some(Tag::Layout as u8) {
                                if self.format < 5 {
                                    return Err(self
                                        .malformed("a table layout (format 5) in an older file"));
                                }
                                self.apply_layout(L, s, id)?;
                            }
                            if at > 0 {
                                self.frames.pop();
                                ffi::lua_settop(L, at);
                                return Ok(true);
                            }
                            return Ok(self.finish(L, s, id));
                        }
                    }
                    self.value(L, s)
                }
                Frame::Closure { id, next, n, .. } => {
                    let (id, i, n) = (*id, *next, *n);
                    if i > n {
                        return Ok(self.finish(L, s, id));
                    }
                    let Some(tag) = self.r.u8() else {
                        return Err(self.malformed("truncated"));
                    };
                    match Tag::from_u8(tag) {
                        Some(Tag::UpvalRef) => {
                            let (Some(other), Some(index)) = (self.r.varint(), self.r.varint())
                            else {
                                return Err(self.malformed("bad upvalue reference"));
                            };
                            if other >= self.next_id as u64 {
                                return Err(self.malformed("upvalue of an undefined closure"));
                            }
                            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                            ffi::lua_rawgeti(L, s.objs, other as ffi::lua_Integer);
                            let other_p = luasnap_proto(L, -1);
                            let this_p = luasnap_proto(L, -2);
                            if other_p.is_null()
                                || this_p.is_null()
                                || index == 0
                                || index > luasnap_proto_nupvalues(other_p) as u64
                            {
                                ffi::lua_settop(L, -3);
                                return Err(self.malformed("bad shared upvalue"));
                            }
                            // Open upvalues are shared through their coroutine's slot, each
                            // closure checked (`join_open`), never by reference.
                            if luasnap_upval_shareable(L, -1, index as c_int) == 0 {
                                ffi::lua_settop(L, -3);
                                return Err(self.malformed(
                                    "a closure shares an open upvalue by reference (saves name open upvalues by their coroutine's stack slot)",
                                ));
                            }
                            ffi::lua_upvaluejoin(L, -2, i, -1, index as c_int);
                            ffi::lua_settop(L, -3);
                            if let Some(Frame::Closure { next, .. }) = self.frames.last_mut() {
                                *next += 1;
                            }
                            Ok(false)
                        }
                        Some(Tag::UpvalNew) => self.value(L, s),
                        Some(Tag::UpvalOpen) => {
                            let Some(level) = self.r.varint() else {
                                return Err(self.malformed("bad open upvalue"));
                            };
                            if level == 0 || level > 1_000_000 {
                                return Err(self.malformed("bad open upvalue"));
                            }
                            if let Some(Frame::Closure { open, .. }) = self.frames.last_mut() {
                                *open = Some(level as c_int);
                            }
                            self.value(L, s)
                        }
                        _ => {
                            // C closures have no upvalue tags: it was a value tag.
                            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                            let is_c = ffi::lua_iscfunction(L, -1) != 0;
                            ffi::lua_settop(L, -2);
                            if !is_c {
                                return Err(self.malformed("expected an upvalue"));
                            }
                            self.r.pos -= 1;
                            self.value(L, s)
                        }
                    }
                }
                Frame::UdBytes { id, state, nuv } => {
                    let (id, st, nuv) = (*id, *state, *nuv);
                    if st > nuv {
                        return Ok(self.finish(L, s, id));
                    }
                    self.value(L, s)
                }
                Frame::Special { id, state, two } => {
                    let (id, st, two) = (*id, *state, *two);
                    if st >= if two { 2 } else { 1 } {
                        return Ok(self.finish(L, s, id));
                    }
                    self.value(L, s)
                }
                Frame::Thread {
                    id,
                    next,
                    n,
                    errfunc,
                } => {
                    let (id, i, n, errfunc) = (*id, *next, *n, *errfunc);
                    if i > n {
                        ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                        let co = ffi::lua_tothread(L, -1);
                        ffi::lua_settop(L, -2);
                        if luasnap_thread_building(co, 0) != 0 {
                            return Err(self.malformed(RESET));
                        }
                        if let Some(errfunc) = errfunc {
                            let restored = self.restore_frames(L, s, id, errfunc);
                            // Held unresumable until the load ends, restored or not: its open
                            // upvalues are checked against these frames (now and as later
                            // closures join them) before anything can run it.
                            luasnap_thread_hold(co, 1);
                            restored?;
                            self.check_open_upvalues(L, s, co)?;
                        }
                        return Ok(self.finish(L, s, id));
                    }
                    let _ = depth;
                    self.value(L, s)
                }
            }
        }
    }

    /// Array and hash sizes for a new table from a file's hints (see [`table_sizes`]).
    fn table_sizes(&mut self, narr: u64, nhash: u64) -> (c_int, c_int) {
        let (narr, nhash, _) = table_sizes(
            self.r.remaining(),
            self.own_cap,
            &mut self.prealloc_left,
            narr,
            nhash,
        );
        (narr, nhash)
    }

    /// Reads entries of the table at stack index `at` (its frame on top, between entries) in
    /// batches that `luasnap_table_build` builds without a step through the general path for
    /// each value: entries of plain values (see [`Batch`]) and the new tables among them,
    /// their metatables and entries, nested up to `PLAIN_DEPTH` deep. A batch stops before
    /// anything else (a coroutine, say, or the table's end marker); the tables still open
    /// there become frames of the general path, in its stack layout (table, then its key
    /// slot), which goes on from that point. Returns whether it read anything.
    unsafe fn plain_entries(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        at: c_int,
    ) -> Result<bool, Fail> {
        let room = nopen_room(self.frames.len());
        let mut progress = false;
        if self.ops.len() < OPS_CAP {
            self.ops.resize(OPS_CAP, RawVal::EMPTY);
        }
        loop {
            let Ok(ops) = <&mut [RawVal; OPS_CAP]>::try_from(&mut self.ops[..OPS_CAP]) else {
                unreachable!("a slice of OPS_CAP steps");
            };
            let mut b = Batch {
                r: self.r,
                ops,
                n: 0,
                lay: &mut self.blay,
                laynx: &mut self.blaynx,
                nlay: 0,
                strs: self.strs,
                next_id: self.next_id,
                prealloc_left: self.prealloc_left,
                own_cap: self.own_cap,
                frames: &self.frames,
                late_meta: &mut self.late_meta,
                strref_len: self.strref_len,
                protos: &self.protos,
                format: self.format,
                seed: self.seed,
                max_size: 0,
            };
            let end = b.decode(room);
            let (n, max_size) = (b.n, b.max_size);
            (self.r.pos, self.strs, self.next_id) = (b.r.pos, b.strs, b.next_id);
            self.prealloc_left = b.prealloc_left;
            if n == 0 {
                return Ok(progress);
            }
            progress = true;
            if max_size > 0 {
                self.scratch_for(max_size);
            }
            // SAFETY: protected context; the frame's table is at `at` with its key slot on
            // top, which goes (the steps work on the table on top); s.strs and s.objs are
            // absolute indices of tables; every id was checked against what had been read;
            // the strings point into the body, alive for the load; the layouts' scratch has
            // the size the largest asks for; stack room for the nesting (checked).
            unsafe {
                ffi::lua_settop(L, at);
                luasnap_checkstack(L, 2 * PLAIN_DEPTH as c_int + 8, c"load".as_ptr());
                let failed = luasnap_table_build(
                    L,
                    s.strs,
                    s.objs,
                    self.ops.as_ptr(),
                    n as c_int,
                    self.refuses_finalizers() as c_int,
                    self.blay.as_ptr(),
                    self.blaynx.as_ptr(),
                    self.scratch.as_mut_ptr().cast(),
                    self.memo.as_mut_ptr().cast(),
                );
                if failed <= -2 {
                    let op = self.ops[(-2 - failed) as usize];
                    self.r.pos = op.len as usize; // where its bytes are
                    return Err(self.fail(NO_FINALIZERS));
                }
                if failed >= 0 && self.collisions_over() {
                    return Err(self.fail(COLLISIONS));
                }
                if failed >= 0 {
                    let op = self.ops[failed as usize];
                    if matches!(op.kind, kind::META | kind::REF | kind::LAYOUT) {
                        self.r.pos = op.len as usize; // where its bytes are
                    }
                    let k = if op.kind & 0xff == kind::SETKV {
                        kind::SET
                    } else {
                        op.kind
                    };
                    return Err(match k {
                        kind::META => self.malformed("a metatable must be a table"),
                        kind::SET => self.malformed(
                            "a table entry with a NaN key, or more keys than its layout has \
                             nodes",
                        ),
                        kind::LAYOUT => self.malformed(
                            "a table's layout does not match its entries (a damaged or forged \
                             file; nothing was placed)",
                        ),
                        kind::REF => self.fail(REBUILDING),
                        kind::JOINUPVAL => self.malformed("bad shared upvalue"),
                        _ => self.malformed("internal: a table build step out of place"),
                    });
                }
                // Back to the general layout: [t0, k1, t1, k2, t2, ..., tn, key slot].
                if end.stage != Stage::Value {
                    ffi::lua_pushnil(L);
                }
            }
            // The tables around the innermost one each expect their value (that table).
            let nopen = end.nopen;
            if let Some(Frame::Table { state, .. }) = self.frames.last_mut() {
                *state = if nopen > 0 {
                    Stage::Value.state()
                } else {
                    end.stage.state()
                };
            }
            for (i, &(id, _)) in end.open[..nopen].iter().enumerate() {
                let stage = if i + 1 == nopen {
                    end.stage
                } else {
                    Stage::Value
                };
                self.frames.push(Frame::Table {
                    id,
                    state: stage.state(),
                    at: at + 2 * (i as c_int + 1),
                });
            }
            if !end.full || nopen > 0 || end.stage != Stage::Key {
                return Ok(true);
            }
        }
    }

    /// The VM's own continuations ([`super::CONTINUATIONS`], from the registry's unperms)
    /// and pcall's among them; looked up once per load.
    unsafe fn continuations(&mut self, L: *mut lua_State) -> (Vec<*const c_void>, *const c_void) {
        if let Some(k) = self.known_k.take() {
            return k;
        }
        let (mut known, mut pcall_k) = (Vec::new(), std::ptr::null());
        // SAFETY: protected context; reads registry fields, balanced pushes.
        unsafe {
            ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, super::UNPERMS_KEY.as_ptr());
            for name in super::CONTINUATIONS {
                if ffi::lua_type(L, -1) == ffi::LUA_TTABLE
                    && ffi::lua_getfield(L, -1, name.as_ptr()) == ffi::LUA_TLIGHTUSERDATA
                {
                    let k = ffi::lua_touserdata(L, -1) as *const c_void;
                    known.push(k);
                    if name == super::PCALL_K {
                        pcall_k = k;
                    }
                }
                ffi::lua_settop(L, -2);
            }
            ffi::lua_settop(L, -2);
        }
        (known, pcall_k)
    }

    /// Reads the frame records of a suspended coroutine (its stack is in place) and rebuilds
    /// them, after checking every invariant the VM relies on to resume it.
    unsafe fn restore_frames(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        errfunc: i64,
    ) -> Result<(), Fail> {
        let Some(nci) = self.r.varint() else {
            return Err(self.malformed("bad coroutine frames"));
        };
        if nci == 0 || nci > 100_000 || nci > self.r.remaining() as u64 {
            return Err(self.malformed("bad coroutine frame count"));
        }
        let mut cis = Vec::with_capacity(nci as usize);
        // SAFETY: protected context; reads, permanent lookups, then the validated restore.
        unsafe {
            for _ in 0..nci {
                let fields = (
                    self.r.varint(),
                    self.r.varint(),
                    self.r.varint(),
                    self.r.i64(),
                    self.r.varint(),
                    self.r.varint(),
                    self.r.i64(),
                    self.r.i64(),
                );
                let (
                    Some(func),
                    Some(top),
                    Some(cs),
                    Some(u2),
                    Some(pc),
                    Some(extra),
                    Some(olderr),
                    Some(ctx),
                ) = fields
                else {
                    return Err(self.malformed("bad coroutine frame"));
                };
                let fits = |v: u64| v <= i32::MAX as u64;
                if !fits(func)
                    || !fits(top)
                    || cs > u32::MAX as u64
                    || !fits(pc)
                    || !fits(extra)
                    || u2 < i32::MIN as i64
                    || u2 > i32::MAX as i64
                {
                    return Err(self.malformed("coroutine frame field out of range"));
                }
                // The continuation: nil, or the name of a permanent light C function.
                let k = match self.r.data.get(self.r.pos) {
                    Some(&b) if b == Tag::Nil as u8 => {
                        self.r.pos += 1;
                        std::ptr::null()
                    }
                    _ => {
                        if !self.value(L, s)? || ffi::lua_type(L, -1) != ffi::LUA_TSTRING {
                            return Err(self.malformed("bad continuation"));
                        }
                        ffi::lua_rawget(L, s.perms);
                        let p = if ffi::lua_type(L, -1) == ffi::LUA_TLIGHTUSERDATA {
                            ffi::lua_touserdata(L, -1)
                        } else {
                            std::ptr::null_mut()
                        };
                        ffi::lua_settop(L, -2);
                        if p.is_null() {
                            return Err(self.fail(
                                "missing permanent continuation (save written by another build?)",
                            ));
                        }
                        p as *const c_void
                    }
                };
                cis.push(CiRecord {
                    func: func as i32,
                    top: top as i32,
                    callstatus: cs as u32,
                    u2: u2 as i32,
                    pc: pc as i32,
                    nextraargs: extra as i32,
                    old_errfunc: olderr,
                    ctx,
                    k,
                });
            }
            // The continuations a frame may resume through: only those the VM registered
            // itself (C functions), whatever the permanents given map their names to.
            let (known, pcall_k) = self.continuations(L);
            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
            let co = ffi::lua_tothread(L, -1);
            ffi::lua_settop(L, -2);
            // Stack the frames need beyond the values read: charged to the preallocation
            // budget, so frame tops cannot make a small file allocate large stacks.
            let stacksize = ffi::lua_gettop(co) as u64 + 1;
            let need = cis.iter().map(|c| c.top.max(0) as u64).max().unwrap_or(0);
            let extra = need.saturating_sub(stacksize);
            if extra > self.prealloc_left {
                return Err(self.malformed(
                    "suspended coroutine: its frames need more stack than the file can justify (for an own save: than its heap-growth cap allows)",
                ));
            }
            self.prealloc_left -= extra;
            let err = luasnap_thread_restore(
                L,
                co,
                cis.as_ptr(),
                cis.len() as c_int,
                errfunc,
                known.as_ptr(),
                known.len() as c_int,
                pcall_k,
                self.upmemo_ptr(),
            );
            self.known_k = Some((known, pcall_k));
            if !err.is_null() {
                let msg = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
                if msg.starts_with("not enough memory") {
                    // Its stack or frames could not grow: the VM is out of memory, the file
                    // may be fine.
                    self.out_of_memory = true;
                    return Err(self.fail(format!("suspended coroutine: {msg}")));
                }
                return Err(self.malformed(&format!("suspended coroutine: {msg}")));
            }
            if self.format >= 4 {
                // Pending to-be-closed variables, oldest first.
                let Some(n) = self.r.varint().filter(|&n| n <= self.r.remaining() as u64) else {
                    return Err(self.malformed("bad to-be-closed variable count"));
                };
                let mut slots = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    match self.r.varint() {
                        Some(v) if v <= i32::MAX as u64 => slots.push(v as i32),
                        _ => return Err(self.malformed("bad to-be-closed variable")),
                    }
                }
                let err = luasnap_thread_set_tbc(co, slots.as_ptr(), n as c_int);
                if !err.is_null() {
                    let msg = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
                    return Err(self.malformed(&format!("suspended coroutine: {msg}")));
                }
            }
        }
        Ok(())
    }

    /// Joins upvalue `i` of the closure at -2 (object `id`) to slot `level` of the loaded
    /// coroutine `co` (checked to be in its declared stack). Into a coroutine whose frames are
    /// restored, the upvalue is checked first (Lua code the load runs next may call the
    /// closure); into one still arriving, once its frames are.
    ///
    /// # Safety
    /// Protected context; the closure at -2; `co` one of `loaded_cos`; `s` this load's slots.
    unsafe fn join_open(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
        id: u32,
        i: c_int,
        level: c_int,
    ) -> Result<(), Fail> {
        let strict = (self.opts.trust == Trust::Foreign) as c_int;
        let memo = self.upmemo_ptr();
        let Some(lc) = self.loaded_cos.get_mut(&co) else {
            return Err(self.malformed("bad open upvalue"));
        };
        // SAFETY: protected context; the closure is at -2; co is a coroutine this load made,
        // alive (objs holds it); `lc.frames` are its frames, which cannot change while the
        // load holds it (the check verifies it was not reset).
        let err = unsafe {
            match &lc.frames {
                Some(frames) => luasnap_open_upval_check(
                    L,
                    -2,
                    i,
                    co,
                    level,
                    frames.as_ptr(),
                    frames.len() as c_int,
                    strict,
                    memo,
                ),
                None if ffi::lua_status(co) != ffi::LUA_ERRERR => RESET_C.as_ptr(),
                None => std::ptr::null(),
            }
        };
        if !err.is_null() {
            // SAFETY: a static C string from the check.
            let msg = unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy();
            return Err(self.fail(check_error(&msg)));
        }
        let above = lc.open.range(level + 1..).next().map(|(_, &a)| a);
        // SAFETY: as above; objs[aid] is a closure joined to co's open upvalue closest above
        // level (the C side checks that it still is); balanced pushes.
        let uv = unsafe {
            match above {
                Some((aid, an)) => {
                    ffi::lua_rawgeti(L, s.objs, aid as ffi::lua_Integer);
                    let uv = luasnap_upval_join_at(L, -3, i, co, level, -1, an);
                    ffi::lua_settop(L, -2);
                    uv
                }
                None => luasnap_upval_join_at(L, -2, i, co, level, 0, 0),
            }
        };
        if uv.is_null() {
            return Err(self.malformed("bad open upvalue"));
        }
        lc.open.insert(level, (id, i));
        if lc.frames.is_none() {
            lc.unchecked.push((id, i, level));
        }
        Ok(())
    }

    /// The memo of `luasnap_open_upval_check`, zeroed the first time.
    fn upmemo_ptr(&mut self) -> *mut c_void {
        self.upmemo.ptr()
    }

    /// Indexes the frames of the loaded coroutine `co`, just restored (and held), and checks
    /// the open upvalues joined into it while its stack was arriving.
    ///
    /// # Safety
    /// Protected context; `co` one of `loaded_cos`, its frames restored; `s` this load's slots.
    unsafe fn check_open_upvalues(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
    ) -> Result<(), Fail> {
        let strict = (self.opts.trust == Trust::Foreign) as c_int;
        let memo = self.upmemo_ptr();
        // SAFETY: co's frames are restored; the walk reads its CallInfo list.
        let frames = unsafe {
            let n = luasnap_thread_frames(co, std::ptr::null_mut(), 0);
            let mut frames = vec![std::ptr::null(); n.max(0) as usize];
            luasnap_thread_frames(co, frames.as_mut_ptr(), n);
            frames
        };
        let Some(lc) = self.loaded_cos.get_mut(&co) else {
            return Err(self.malformed("internal: a coroutine the load did not make"));
        };
        let unchecked = std::mem::take(&mut lc.unchecked);
        let mut err = std::ptr::null();
        for (cid, i, level) in unchecked {
            // SAFETY: protected context; objs[cid] is the closure (ids are checked when
            // read); one push, popped.
            unsafe {
                ffi::lua_rawgeti(L, s.objs, cid as ffi::lua_Integer);
                err = luasnap_open_upval_check(
                    L,
                    -1,
                    i,
                    co,
                    level,
                    frames.as_ptr(),
                    frames.len() as c_int,
                    strict,
                    memo,
                );
                ffi::lua_settop(L, -2);
            }
            if !err.is_null() {
                break;
            }
        }
        lc.frames = Some(frames);
        if !err.is_null() {
            // SAFETY: a static C string from the check.
            let msg = unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy();
            return Err(self.fail(check_error(&format!("suspended coroutine: {msg}"))));
        }
        Ok(())
    }

    /// Pops the finished frame and pushes its object.
    unsafe fn finish(&mut self, L: *mut lua_State, s: Slots, id: u32) -> bool {
        self.frames.pop();
        // SAFETY: objs[id] exists for every finished frame.
        unsafe {
            ffi::lua_pushnil(L);
            ffi::lua_rawseti(L, s.keys, self.frames.len() as ffi::lua_Integer + 1);
            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
        }
        true
    }

    /// The value on top is the next child of the top frame: put it in place (popped).
    unsafe fn accept(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let depth = self.frames.len();
        // SAFETY: protected context; the child is on top.
        unsafe {
            match self.frames.last_mut().expect("non-empty") {
                Frame::Table { id, state, at } => {
                    let (id, at) = (*id, *at);
                    match *state {
                        0 => {
                            *state = 1;
                            let t = ffi::lua_type(L, -1);
                            if t != ffi::LUA_TTABLE && t != ffi::LUA_TNIL {
                                ffi::lua_settop(L, -2);
                                return Err(self.malformed("a metatable must be a table"));
                            }
                            if t == ffi::LUA_TTABLE && self.refuses_finalizers() && has_gc(L) {
                                ffi::lua_settop(L, -2);
                                return Err(self.fail(NO_FINALIZERS));
                            }
                            if t == ffi::LUA_TTABLE && !has_gc(L) {
                                self.late_meta.push(id); // (see `late_meta`)
                            }
                            if at > 0 {
                                ffi::lua_setmetatable(L, at);
                            } else {
                                ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                                ffi::lua_rotate(L, -2, 1);
                                ffi::lua_setmetatable(L, -2);
                                ffi::lua_settop(L, -2);
                            }
                        }
                        1 if at > 0 => {
                            *state = 2;
                            ffi::lua_replace(L, at + 1);
                        }
                        1 => {
                            *state = 2;
                            ffi::lua_rawseti(L, s.keys, depth as ffi::lua_Integer);
                        }
                        _ if at > 0 => {
                            *state = 1;
                            ffi::lua_pushvalue(L, at + 1);
                            ffi::lua_rotate(L, -2, 1); // [k, v]
                                                       // Raises on a nil or NaN key.
                            if luasnap_rawset_charged(L, at, self.memo.as_mut_ptr().cast()) < 0 {
                                return Err(self.fail(COLLISIONS));
                            }
                        }
                        _ => {
                            *state = 1;
                            ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                            ffi::lua_rawgeti(L, s.keys, depth as ffi::lua_Integer);
                            ffi::lua_rotate(L, -3, -1); // [t, k, v]
                                                        // Raises on a nil or NaN key.
                            if luasnap_rawset_charged(L, -3, self.memo.as_mut_ptr().cast()) < 0 {
                                return Err(self.fail(COLLISIONS));
                            }
                            ffi::lua_settop(L, -2);
                        }
                    }
                }
                Frame::Closure {
                    id,
                    next,
                    open,
                    wrap,
                    ..
                } => {
                    let (id, i, open, wrap) = (*id, *next, open.take(), *wrap);
                    *next += 1;
                    if wrap && ffi::lua_type(L, -1) != ffi::LUA_TTHREAD {
                        ffi::lua_settop(L, -2);
                        return Err(self.malformed("a coroutine.wrap function without a coroutine"));
                    }
                    ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                    ffi::lua_rotate(L, -2, 1);
                    match open {
                        Some(level) => {
                            // The child is the thread whose stack slot `level` the upvalue is:
                            // only a suspended coroutine this load builds (never the loading
                            // thread, the main thread or one that exists already: their stacks
                            // change under the load), inside the stack the file declares.
                            let co = ffi::lua_tothread(L, -1);
                            let inside = !co.is_null()
                                && self.loaded_cos.get(&co).is_some_and(|c| level <= c.len);
                            if !inside {
                                ffi::lua_settop(L, -3);
                                return Err(self.malformed("bad open upvalue"));
                            }
                            let joined = self.join_open(L, s, co, id, i, level);
                            ffi::lua_settop(L, -3);
                            joined?;
                        }
                        None => {
                            ffi::lua_setupvalue(L, -2, i);
                            ffi::lua_settop(L, -2);
                        }
                    }
                }
                Frame::UdBytes { id, state, .. } => {
                    let (id, st) = (*id, *state);
                    *state += 1;
                    ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                    ffi::lua_rotate(L, -2, 1);
                    if st == 0 {
                        let t = ffi::lua_type(L, -1);
                        if t != ffi::LUA_TTABLE && t != ffi::LUA_TNIL {
                            ffi::lua_settop(L, -3);
                            return Err(self.malformed("a metatable must be a table"));
                        }
                        if t == ffi::LUA_TTABLE && self.refuses_finalizers() && has_gc(L) {
                            ffi::lua_settop(L, -3);
                            return Err(self.fail(NO_FINALIZERS));
                        }
                        if t == ffi::LUA_TTABLE && library_metatable(L) {
                            ffi::lua_settop(L, -3);
                            return Err(self.malformed(LIBRARY_METATABLE));
                        }
                        if t == ffi::LUA_TTABLE && !has_gc(L) {
                            self.late_meta.push(id); // (see `late_meta`)
                        }
                        ffi::lua_setmetatable(L, -2);
                    } else {
                        ffi::lua_setiuservalue(L, -2, st);
                    }
                    ffi::lua_settop(L, -2);
                }
                Frame::Special { id, state, two } => {
                    let (id, st, two) = (*id, *state, *two);
                    *state += 1;
                    if ffi::lua_type(L, -1) != ffi::LUA_TFUNCTION {
                        ffi::lua_settop(L, -2);
                        return Err(self.malformed("a __persist rebuild must be a function"));
                    }
                    if !self.may_call(L) {
                        ffi::lua_settop(L, -2);
                        return Err(self.fail("a foreign save-game names a load-time function that is not a registered constructor (Vm::register_constructor, eris.constructor)"));
                    }
                    if st == 0 {
                        // Call the rebuild (or create) function: the object. The flag
                        // clear while Lua code runs, as in the initializers above.
                        luasnap_gc_stopem(L, 0);
                        ffi::lua_callk(L, 0, 1, 0, None);
                        self.after_call(L)?;
                        if ffi::lua_type(L, -1) == ffi::LUA_TNIL {
                            ffi::lua_settop(L, -2);
                            return Err(self.fail("a __persist rebuild function returned nil"));
                        }
                        self.register(L, s, id)?;
                        ffi::lua_settop(L, -2);
                        let _ = two;
                    } else {
                        // Two-phase: remember (object, init) to call when everything is loaded.
                        self.inits += 1;
                        ffi::lua_createtable(L, 2, 0);
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_rawseti(L, -2, 2);
                        ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                        ffi::lua_rawseti(L, -2, 1);
                        ffi::lua_rawseti(L, s.inits, self.inits as ffi::lua_Integer);
                    }
                }
                Frame::Thread { id, next, .. } => {
                    let (id, slot) = (*id, *next);
                    *next += 1;
                    ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer);
                    let co = ffi::lua_tothread(L, -1);
                    ffi::lua_settop(L, -2);
                    // Nothing raises on co (it has no error handler: see luasnap_thread_put).
                    if luasnap_thread_put(L, co, slot) != 0 {
                        return Err(self.malformed(
                            "a coroutine stack larger than Lua allows (LUAI_MAXSTACK slots)",
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A printable form of a permanent's key (on top).
unsafe fn perm_name(L: *mut lua_State) -> String {
    // SAFETY: reads a primitive without conversion.
    unsafe {
        match ffi::lua_type(L, -1) {
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                format!(
                    "{:?}",
                    String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len))
                )
            }
            ffi::LUA_TNUMBER => format!("{}", ffi::lua_tonumberx(L, -1, std::ptr::null_mut())),
            _ => "(unnamed)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{layout_nodes, MAX_UPVALUES};
    use crate::bridge::vm::Vm;
    use crate::persist::format::{Reader, Writer};
    use crate::persist::Trust;
    use crate::Value;

    /// `make(seed)`: a closure with Lua's most upvalues (255: 150 locals of one function, 105
    /// of an inner one). `R[2]`: a table of integers and such closures, with runs of 600 and
    /// 1023 integers between them, so that batches come to start a run (after a closure that
    /// filled one) and a closure starts at step 1023 of a batch and fills its buffer to the
    /// end. (`R[1]` brings the prototype first: a closure whose prototype is new goes the
    /// general way.)
    fn wide_closures() -> String {
        let (outer, inner) = (150, MAX_UPVALUES - 150);
        let names = |p: &str, n: usize| (1..=n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        let vals = |n: usize| (1..=n).map(|i| format!("seed * {i}")).collect::<Vec<_>>();
        let (a, b) = (names("a", outer), names("b", inner));
        let sum = a.iter().chain(&b).cloned().collect::<Vec<_>>().join(" + ");
        format!(
            "local function make(seed)\n local {} = {}\n return (function()\n local {} = {}\n \
             return function() return {sum} end\n end)()\nend\n\
             R = {{ make(0) }}\n local t, n = {{}}, 0\n\
             local function add(v) n = n + 1 t[n] = v end\n\
             add(make(1))\n\
             for k = 1, 6 do\n\
               for _ = 1, 600 do add(n) end add(make(k))\n\
               for _ = 1, 1023 do add(n) end add(make(k + 100))\n\
             end\n\
             R[2] = t\n\
             function total(r) local s = r[1]() for _, v in ipairs(r[2]) do \
             s = s + (type(v) == 'function' and v() or v) end return s end",
            a.join(", "),
            vals(outer).join(", "),
            b.join(", "),
            vals(inner).join(", ")
        )
    }

    #[test]
    fn closures_with_the_most_upvalues_fill_a_batch_to_its_end() {
        let mut vm = Vm::builder().capacity(256 << 20).build().unwrap();
        vm.exec(wide_closures(), "=wide").unwrap();
        let want = vm.exec("return total(R)", "=total").unwrap();
        let bytes = vm.persist("R").unwrap();
        vm.unpersist(&bytes, "R2", Trust::Own).unwrap();
        assert_eq!(vm.exec("return total(R2)", "=total").unwrap(), want);
        // Each closure kept its own upvalues: seed * (1 + .. + 150 + 1 + .. + 105).
        let (o, i) = (150, MAX_UPVALUES as i64 - 150);
        assert_eq!(
            vm.exec(
                "local c = R2[2][1 + 601] R2 = nil return c(), R[2][602]()",
                "=own"
            )
            .unwrap(),
            vec![Value::Integer(o * (o + 1) / 2 + i * (i + 1) / 2); 2]
        );
    }

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
