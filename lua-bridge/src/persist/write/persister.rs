//! The writer's state: the [`Persister`] every file of the writer extends with its kind's
//! steps (`impl Persister` in each), how a step fails, and the two stack moves the kinds share.
//! It holds the working memory (`scratch.rs`, with the frames) and imports no file that moves
//! them, so each of those files depends on this one and none back.

use super::super::format::Writer;
use super::super::options::PersistOptions;
use super::super::slots::Slots;
use super::scratch::{GameRemovedNode, Scratch};
use crate::bridge::ffi::UserDataType;
use mlua_sys::{self as ffi, lua_State};
use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_int, c_void, CString};

/// The order in which the saving VM marked its objects for finalization, as far as read.
#[derive(Default)]
pub(crate) struct MarkOrder {
    /// Object (a table, or a userdata's header) to its number: the first marked is 0.
    pub(super) numbers: HashMap<*const c_void, u32>,
    /// The next number to give.
    pub(super) next: u32,
    /// The collector's lists as last read (finalized first to last).
    pub(super) list: Vec<*const c_void>,
}

/// A failure whose message is staged in `Persister::error`.
pub(crate) struct Fail;

/// Writes a value and everything reachable from it (see the module docs of `write`).
pub(crate) struct Persister<'a> {
    /// Working memory kept between persists on a thread: the id table (objects written by
    /// identity, to their id; strings written, to their string id), the objects and strings
    /// not anchored yet, table-scan batches, closure scans, prototypes and chunks written,
    /// upvalue homes, the frame stack and layout buffers (see [`Scratch`]).
    pub(super) sc: Scratch,
    pub w: Writer,
    /// String ids given so far.
    pub(super) nstrs: u32,
    /// String ids from this one on are not anchored yet (see `anchor`).
    pub(super) anchored: u32,
    /// The spkey string (anchored in `strs[0]`).
    pub(super) spkey_str: *const c_void,
    /// The last metatable `meta_has_spkey` looked in, and its answer.
    pub(super) last_meta: (*const c_void, bool),
    /// Changes whenever Lua code may run (see `anchor`): older batches are stale.
    pub(super) scan_gen: u32,
    pub(super) next_id: u32,
    /// Fingerprints of the prototypes of the chunks written, by identity (forgotten before
    /// Lua code runs, which could free a prototype and give its address to another).
    pub(super) proto_hashes: HashMap<*const c_void, u64>,
    pub error: Option<String>,
    pub has_bytecode: bool,
    /// Whether the file carries source text.
    pub has_source: bool,
    pub(super) opts: &'a PersistOptions,
    pub(super) spkey: CString,
    /// The VM's registered userdata types (written by name and bytes).
    pub(super) types: &'a [UserDataType],
    /// Bytecode of a detached function, as `lua_dump` writes it (see `proto.rs`).
    pub(super) dump: Vec<u8>,
    /// The saving VM's order of finalization marks, as far as read (see `finals.rs`).
    pub(super) marks: MarkOrder,
    /// Whether the value is a whole-game save's root, after which the objects awaiting
    /// finalization that it does not reach are written (`finals.rs`).
    pub game: bool,
    /// For a whole-game save, the code-1 nodes of `_G` and `package.loaded` its root's
    /// layouts describe, whose keys follow the other tables' (`removed.rs`).
    pub game_removed: Vec<GameRemovedNode>,
}

impl Drop for Persister<'_> {
    fn drop(&mut self) {
        std::mem::take(&mut self.sc).keep();
    }
}

impl<'a> Persister<'a> {
    /// A writer for the VM whose arena starts at `arena_base` (the key of its scratch
    /// memory) and whose userdata types are `types`.
    pub fn new(opts: &'a PersistOptions, types: &'a [UserDataType], arena_base: usize) -> Self {
        Persister {
            sc: Scratch::take(arena_base),
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
            types,
            dump: Vec::new(),
            marks: Default::default(),
            game: false,
            game_removed: Vec::new(),
        }
    }
}

/// Pushes the object anchored as `id` (at `seen[id]`).
///
/// # Safety
/// Room for one value; `s.seen` is the writer's `seen` table.
#[inline]
pub(super) unsafe fn push_seen(L: *mut lua_State, s: Slots, id: u32) {
    // SAFETY: callers' contract; rawgeti raises nothing.
    unsafe { ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer) };
}

/// Replaces the closure on top with the value of its upvalue `i`.
///
/// # Safety
/// A closure with upvalue `i` is on top, and room for one more value.
pub(super) unsafe fn replace_with_upvalue(L: *mut lua_State, i: c_int) {
    // SAFETY: callers' contract: [f] -> [f, v] -> [v, f] -> [v].
    unsafe {
        ffi::lua_getupvalue(L, -1, i);
        ffi::lua_rotate(L, -2, 1);
        ffi::lua_pop(L, 1);
    }
}
