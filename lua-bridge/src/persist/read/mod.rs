//! Loading: the save-game format back into Lua values.
//!
//! Mirrors the writer: depth first, frames on a Rust stack, O(1) Lua stack. Every count, index
//! and length read from the file is checked against what the file can hold and what the VM
//! has, so arbitrary bytes give an error or a value, never a crash: objects are built through
//! the Lua API, or by `luasnap_table_build` from steps decoded and checked here (see
//! `build.rs`), prototypes come from the VM's own chunks or, for own-trust loads, from the
//! chunk source text the file carries, compiled by Lua's compiler and checked against each
//! function's fingerprint (bytecode only for binary chunks when the caller allows it), and Lua
//! code run while loading (`__persist` rebuild functions) is bounded by an instruction budget.
//!
//! What the bytes mean is `format`'s: each record is read by its decoder there (which reads
//! its fields in order and says what is wrong with them), and each frame holds the cursor of
//! its object's parts from `format/parts.rs`, so the loader reads values in the order the
//! writer writes them. The batch decoder calls the same field readers and record decoders
//! inline. What is left here is what the values mean to this VM.
//!
//! The files, one per part of the format:
//!
//! | file          | reads                                                                |
//! |---------------|----------------------------------------------------------------------|
//! | `dispatch.rs` | the walk: a value by its tag, the frames of objects with children   |
//! | `ids.rs`      | the object and string id tables, strings and references             |
//! | `ident.rs`    | identities of objects that are table keys (format 7)                 |
//! | `table.rs`    | tables on the general path: header, metatable, entries              |
//! | `batch.rs`    | runs of plain entries decoded into build steps (`Batch`)            |
//! | `build.rs`    | those steps run by `luasnap_table_build`, open tables as frames     |
//! | `layout.rs`   | the hash-part layouts that end tables                                |
//! | `meta.rs`     | metatables of tables and userdata, and the finalizers they bring    |
//! | `closure.rs`  | closures and their upvalues                                          |
//! | `proto.rs`    | prototypes and the chunks they live in                               |
//! | `rebind.rs`   | saved functions bound to a newer version of the game's code          |
//! | `thread.rs`   | coroutines: stacks, frames, to-be-closed variables                   |
//! | `open.rs`     | open upvalues into loaded coroutines, and their checks               |
//! | `userdata.rs` | plain-data and raw-byte userdata                                     |
//! | `special.rs`  | permanents, C closures, objects rebuilt by `__persist` functions     |
//! | `limits.rs`   | the load's budgets: preallocation, heap, collisions, depth           |
//! | `csrc.rs`     | the C helpers the loader calls                                       |
//!
//! Every `unsafe fn` here takes the load's protected context (a `lua_pcall` of the VM the
//! load runs in: a Lua error, a `longjmp`, ends the load, so no Rust value with a destructor
//! may be alive in a frame it skips) and `Slots` that are this load's helper tables.

mod batch;
mod build;
mod closure;
mod csrc;
mod dispatch;
mod ident;
mod ids;
mod layout;
mod limits;
mod meta;
mod open;
mod proto;
mod rebind;
mod special;
mod table;
mod thread;
mod userdata;

pub(crate) use ident::check_counter;
#[cfg(any(test, feature = "fuzzing"))]
pub use open::{last_load_frame_check_reads, last_load_open_upvalue_walks};
pub(crate) use proto::proto_tree;

use crate::bridge::ffi::UserDataType;
use crate::persist::budget::LoadBudget;
use crate::persist::error::Accept;
use crate::persist::format::{min_strref_len, Bad, Opened, Reader, FLAG_BYTECODE};
use crate::persist::options::{LoadOptions, Trust};
use csrc::{luasnap_gc_stopem, luasnap_relayout_memo_size};
use csrc::{CiRecord, RawVal};
use dispatch::Frame;
use mlua_sys::lua_State;
use open::{LoadedCo, UpMemo};
use proto::LoadedChunk;
use std::collections::HashMap;
use std::ffi::c_void;

/// A load failed: the error is in [`Loader::error`].
pub(crate) struct Fail;

/// Allows emergency collections again (a load stops them while it holds raw pointers).
///
/// # Safety
/// `L` is a valid state.
pub(crate) unsafe fn allow_emergency_gc(L: *mut lua_State) {
    // SAFETY: callers' contract.
    unsafe { luasnap_gc_stopem(L, 0) };
}

/// One load: the reader over the file's body, the counters of what it defined, the frames of
/// the objects still receiving children, and the checks' memory.
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
    /// Steps decoded for `luasnap_table_build`: `OPS_CAP` once a batch is decoded (see
    /// `batch.rs`).
    ops: Vec<RawVal>,
    /// A table layout decoded for `apply_layout`: its node codes; `laynx` holds the chain
    /// links at the same offsets.
    lay: Vec<u32>,
    laynx: Vec<i32>,
    /// The layouts of a batch's steps (see `batch.rs`): per table its node count, lastfree and
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
    /// The frame records of the coroutine being restored (kept here, not in the reading
    /// function's frame: see `restore_frames`).
    cis: Vec<CiRecord>,
    pub error: Option<String>,
    /// The VM's registered userdata types (loaded by name and bytes).
    types: &'a [UserDataType],
    /// The VM's load limits (the heap-growth cap the load checks per object).
    limits: &'a LoadBudget,
    trusted_bytecode: bool,
    opts: &'a LoadOptions,
    /// Preallocation units the file's hints may still ask for (see `limits.rs`).
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
    /// was set, in a load that refuses finalizers: a save writes an object's metatable before
    /// its entries, so a class that is its own metatable (`T = setmetatable({ __gc = f },
    /// ...)`, `setmetatable(T, T)`) gets its `__gc` after. Checked again when the load ends
    /// (`recheck_finalizers`). Loads that allow finalizers mark every object they made when
    /// they end instead (`mark_finalizers`).
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
    /// Keys of permanents and C closures being read, one inside the other (at most
    /// `MAX_KEY_NESTING`).
    key_depth: u32,
    /// The ids of the permanents read, in order (a foreign load's closures share upvalues only
    /// with closures it built: see `closure.rs`).
    perm_ids: Vec<u32>,
    /// Whether the load denies the permanent `_G` (foreign loads, by default): it may then be
    /// only its functions' `_ENV` (see `Loader::globals_here`).
    globals_denied: bool,
    /// The globals table (`lua_topointer`), read when the load begins.
    globals: *const c_void,
    /// Its object id once read (`u32::MAX` before).
    globals_id: u32,
    /// Saved functions bound to this version of the game's code, and the load's report.
    rb: rebind::Rebinding,
    /// What would accept the save, if the load refused it (see [`Loader::refuse`]).
    pub accept: Option<Accept>,
    /// The identities the file gives its objects as table keys (see `ident.rs`).
    pub idents: ident::Idents,
}

impl<'a> Loader<'a> {
    /// A loader for the body of `file`, under `opts`, in the VM whose userdata types are
    /// `types` and whose load limits are `limits`.
    pub fn new(
        file: Opened<'a>,
        opts: &'a LoadOptions,
        types: &'a [UserDataType],
        limits: &'a LoadBudget,
    ) -> Self {
        let own_cap = limits::own_cap(opts);
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
            cis: Vec::new(),
            error: None,
            types,
            limits,
            trusted_bytecode: opts.trust == Trust::Own
                && opts.bytecode
                && file.flags & FLAG_BYTECODE != 0,
            opts,
            prealloc_left: limits::prealloc_budget(file.body.len(), own_cap),
            own_cap,
            late_meta: Vec::new(),
            threads: Vec::new(),
            loaded_cos: HashMap::new(),
            upmemo: UpMemo::default(),
            out_of_memory: false,
            all_threads: Vec::new(),
            aux: None,
            nofinal_marked: false,
            key_depth: 0,
            perm_ids: Vec::new(),
            globals_denied: !opts.allows_permanent(b"_G"),
            globals: std::ptr::null(),
            globals_id: u32::MAX,
            rb: rebind::Rebinding::default(),
            accept: None,
            idents: ident::Idents::default(),
        };
        loader.limit_collisions(file.body.len());
        loader
    }

    /// Records why the load fails, at the reader's position.
    fn fail(&mut self, what: impl Into<String>) -> Fail {
        self.error = Some(format!(
            "{} (at byte {} of the body)",
            what.into(),
            self.r.pos
        ));
        Fail
    }

    /// [`Loader::fail`] for bytes that are not a save-game.
    fn malformed(&mut self, what: &str) -> Fail {
        self.fail(format!("malformed save-game: {what}"))
    }

    /// A record as `format` decoded it: its value, or the load fails with the record's message
    /// at the reader's position (where the decoder stopped).
    fn record<T>(&mut self, decoded: Result<T, Bad>) -> Result<T, Fail> {
        decoded.map_err(|bad| self.malformed(bad))
    }
}
