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
//! | `loader.rs`   | the load's state (`Loader`), which every other file extends          |
//! | `frame.rs`    | the frames of objects still receiving their children                 |
//! | `state.rs`    | what the kinds keep in the loader between values                     |
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
//! | `generated.rs`| chunks the game made with `load`, compiled from the save's text      |
//! | `rebind.rs`   | saved functions bound to a newer version of the game's code          |
//! | `renamed.rs`  | saved functions the game declares renamed or removed                 |
//! | `resume.rs`   | coroutines suspended in such functions: resumed there, kept or refused |
//! | `thread.rs`   | coroutines: stacks, frames, to-be-closed variables                   |
//! | `open.rs`     | open upvalues into loaded coroutines, and their checks               |
//! | `userdata.rs` | plain-data and raw-byte userdata                                     |
//! | `special.rs`  | permanents, C closures, objects rebuilt by `__persist` functions     |
//! | `limits.rs`   | the load's budgets: preallocation, heap, collisions, depth           |
//! | `csrc.rs`     | the C helpers the loader calls                                       |
//!
//! The imports run one way: this file (the loader's constructor and the crate's entry points)
//! over the kinds' files, over `loader.rs`, over `frame.rs`, `state.rs` and `csrc.rs`.
//!
//! Every `unsafe fn` here takes the load's protected context (a `lua_pcall` of the VM the
//! load runs in: a Lua error, a `longjmp`, ends the load, so no Rust value with a destructor
//! may be alive in a frame it skips) and `Slots` that are this load's helper tables.

mod batch;
mod build;
mod closure;
mod csrc;
mod dispatch;
mod finals;
mod frame;
mod generated;
mod ident;
mod ids;
mod layout;
mod limits;
mod loader;
mod meta;
mod open;
mod proto;
mod rebind;
mod removed;
mod renamed;
mod resume;
mod special;
mod state;
mod table;
mod thread;
mod userdata;

pub(crate) use ident::check_counter;
pub(crate) use layout::relayout_blob;
pub(crate) use loader::Loader;
#[cfg(any(test, feature = "fuzzing"))]
pub use open::{last_load_frame_check_reads, last_load_open_upvalue_walks};
pub(crate) use proto::proto_tree;
pub(crate) use removed::{give_game_removed_keys, seal_game_table};

use crate::bridge::ffi::UserDataType;
use crate::persist::budget::LoadBudget;
use crate::persist::format::{min_strref_len, Opened, Reader, FLAG_BYTECODE, FLAG_QUOTED_PLACES};
use crate::persist::options::{LoadOptions, Trust};
use csrc::{luasnap_gc_stopem, luasnap_relayout_memo_size};
use mlua_sys::lua_State;
use state::{Idents, Rebinding, UpMemo};
use std::collections::HashMap;

/// Allows emergency collections again (a load stops them while it holds raw pointers).
///
/// # Safety
/// `L` is a valid state.
pub(crate) unsafe fn allow_emergency_gc(L: *mut lua_State) {
    // SAFETY: callers' contract.
    unsafe { luasnap_gc_stopem(L, 0) };
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
            generated_text: 0,
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
            rb: Rebinding {
                quoted_places: file.flags & FLAG_QUOTED_PLACES != 0,
                ..Rebinding::default()
            },
            accept: None,
            idents: Idents::default(),
            finals: Default::default(),
            unlaid: Default::default(),
            game_removed: None,
            refused: Vec::new(),
            refused_more: 0,
            refused_seen: Default::default(),
            refused_at: 0,
            refused_functions: Vec::new(),
            refused_functions_more: 0,
            refused_stand_in: None,
        };
        loader.limit_collisions(file.body.len());
        loader
    }
}
