//! The load's state: the [`Loader`] every file of the loader extends with its kind's steps
//! (`impl Loader` in each), and how a step fails. It holds the frames (`frame.rs`) and the
//! kinds' records (`state.rs`) and imports no file that moves them, so each of those files
//! depends on this one and none back.

use super::csrc::{CiRecord, RawVal};
use super::frame::Frame;
use super::state::{Idents, LoadedChunk, LoadedCo, Rebinding, UpMemo};
use crate::bridge::ffi::UserDataType;
use crate::persist::budget::LoadBudget;
use crate::persist::error::Accept;
use crate::persist::format::{Bad, Reader};
use crate::persist::options::LoadOptions;
use mlua_sys::lua_State;
use std::collections::HashMap;
use std::ffi::c_void;

/// A load failed: the error is in [`Loader::error`].
pub(crate) struct Fail;

/// One load: the reader over the file's body, the counters of what it defined, the frames of
/// the objects still receiving children, and the checks' memory.
pub(crate) struct Loader<'a> {
    pub(super) r: Reader<'a>,
    pub(super) next_id: u32,
    /// Strings read so far (`strs[1..=strs]`).
    pub(super) strs: u32,
    /// Strings at least this long get a string id (it depends on the file's format).
    pub(super) strref_len: usize,
    pub(super) protos: Vec<*const c_void>,
    /// The file's format version.
    pub(super) format: u16,
    /// Chunks read so far (format 4).
    pub(super) chunks: Vec<LoadedChunk>,
    /// Source text this load compiled for chunks the game made with `load` (see
    /// `generated.rs`), in bytes.
    pub(super) generated_text: usize,
    pub(super) index: Option<HashMap<u64, *const c_void>>,
    pub(super) full_index: bool,
    pub(super) frames: Vec<Frame>,
    pub(super) inits: u32,
    /// Steps decoded for `luasnap_table_build`: `OPS_CAP` once a batch is decoded (see
    /// `batch.rs`).
    pub(super) ops: Vec<RawVal>,
    /// A table layout decoded for `apply_layout`: its node codes; `laynx` holds the chain
    /// links at the same offsets.
    pub(super) lay: Vec<u32>,
    pub(super) laynx: Vec<i32>,
    /// The layouts of a batch's steps (see `batch.rs`): per table its node count, lastfree and
    /// hash seed, then its node codes; `blaynx` holds the chain links at the same offsets.
    pub(super) blay: Vec<u32>,
    pub(super) blaynx: Vec<i32>,
    /// Scratch for placing a layout's entries (`luasnap_relayout_scratch`), kept between
    /// tables; u64 words for the alignment of Lua's nodes.
    pub(super) scratch: Vec<u64>,
    /// The last layout placed, for the next table laid out alike (`luasnap_relayout_memo_size`
    /// bytes, zeroed: empty); valid for the whole load, whatever runs between the batches.
    pub(super) memo: Vec<u64>,
    /// The VM's hash seed: layouts saved under another are not placed (see `place_hint`).
    pub(super) seed: u32,
    /// The VM's continuations and pcall's (see `continuations`), once looked up.
    pub(super) known_k: Option<(Vec<*const c_void>, *const c_void)>,
    /// The frame records of the coroutine being restored (kept here, not in the reading
    /// function's frame: see `restore_frames`).
    pub(super) cis: Vec<CiRecord>,
    pub error: Option<String>,
    /// The VM's registered userdata types (loaded by name and bytes).
    pub(super) types: &'a [UserDataType],
    /// The VM's load limits (the heap-growth cap the load checks per object).
    pub(super) limits: &'a LoadBudget,
    pub(super) trusted_bytecode: bool,
    pub(super) opts: &'a LoadOptions,
    /// Preallocation units the file's hints may still ask for (see `limits.rs`).
    pub(super) prealloc_left: u64,
    /// For an own save: the units of preallocation the heap-growth cap allows (a unit is 16
    /// bytes: an array slot and its tag, half a hash node), which then bound a table's size
    /// hints and the whole load's instead of the file's length. A small own save may ask for
    /// the large sparse tables it had (`table.create(0, 1024)` with a few keys: their layout
    /// was not written, the keys sitting where a fresh table of that size puts them), so they
    /// come back with the same node count and `pairs` order; memory stays bounded by the cap
    /// (found by an independent attacker: 2,000 such tables in a 300 KB save lost their
    /// order, 1,097 of them). None for foreign saves: their hints stay bounded by the file.
    pub(super) own_cap: Option<u64>,
    /// Objects given a metatable that was still being built (or had no `__gc` yet) when it
    /// was set, in a load that refuses finalizers: a save writes an object's metatable before
    /// its entries, so a class that is its own metatable (`T = setmetatable({ __gc = f },
    /// ...)`, `setmetatable(T, T)`) gets its `__gc` after. Checked again when the load ends
    /// (`recheck_finalizers`). Loads that allow finalizers mark objects when they end instead
    /// (`mark_finalizers`: those the file marks, or in files of format 7 and older every one
    /// whose metatable has `__gc`).
    pub(super) late_meta: Vec<u32>,
    /// Suspended coroutines this load created, in creation order: the only threads open
    /// upvalues may point into (`loaded_cos` by address).
    pub(super) threads: Vec<*mut lua_State>,
    pub(super) loaded_cos: HashMap<*mut lua_State, LoadedCo>,
    /// Memo of `luasnap_open_upval_check` and of the frame checks' indexes.
    pub(super) upmemo: UpMemo,
    /// The load failed for want of memory (restoring a coroutine's stack or frames), not on a
    /// bad file: the caller raises Lua's memory error.
    pub out_of_memory: bool,
    /// Coroutines this load created, whose budget hook goes when the load ends.
    pub(super) all_threads: Vec<*mut lua_State>,
    /// The C functions of `coroutine.wrap`'s and `string.gmatch`'s helpers, once looked up.
    pub(super) aux: Option<(usize, usize)>,
    /// Whether this load marked the state as one without new finalizers (its caller unmarks
    /// it: [`Loader::end_nofinal`]).
    pub(super) nofinal_marked: bool,
    /// Keys of permanents and C closures being read, one inside the other (at most
    /// `MAX_KEY_NESTING`).
    pub(super) key_depth: u32,
    /// The ids of the permanents read, in order (a foreign load's closures share upvalues only
    /// with closures it built: see `closure.rs`).
    pub(super) perm_ids: Vec<u32>,
    /// Whether the load denies the permanent `_G` (foreign loads, by default): it may then be
    /// only its functions' `_ENV` (see `Loader::globals_here`).
    pub(super) globals_denied: bool,
    /// The globals table (`lua_topointer`), read when the load begins.
    pub(super) globals: *const c_void,
    /// Its object id once read (`u32::MAX` before).
    pub(super) globals_id: u32,
    /// Saved functions bound to this version of the game's code, and the load's report.
    pub(super) rb: Rebinding,
    /// What would accept the save, if the load refused it (see [`Loader::refuse`]).
    pub accept: Option<Accept>,
    /// The identities the file gives its objects as table keys (see `ident.rs`).
    pub idents: Idents,
    /// The finalization marks the file gives its objects (see `finals.rs`).
    pub(super) finals: super::state::Finals,
    /// Tables whose saved layout did not (or may not) apply, under another hash seed or node
    /// count, and whether they were given removed keys to seal when the walk ends (see
    /// `removed.rs`).
    pub(super) unlaid: HashMap<u32, bool>,
    /// The removed keys the file gives the loading VM's own `_G` and `package.loaded` (a
    /// registry reference to the list `Loader::game_removed_keys` read, format 11), for the
    /// whole-game restore; whoever takes the loader's outcome releases it
    /// (`LoadOutcome::take_game_removed`).
    pub game_removed: Option<std::ffi::c_int>,
    /// Permanents the load's options do not allow, met so far: the first `REFUSED_NAMES`
    /// (printable), how many more, each name once, and where the first was (see
    /// `Loader::refused_permanents`).
    pub(super) refused: Vec<String>,
    pub(super) refused_more: usize,
    pub(super) refused_seen: std::collections::HashSet<Vec<u8>>,
    pub(super) refused_at: usize,
    /// Functions this version no longer has that a foreign load refuses, met so far (the
    /// first `REFUSED_NAMES`), and how many more (see `Loader::missing_later`).
    pub(super) refused_functions: Vec<crate::persist::report::SavedFunction>,
    pub(super) refused_functions_more: usize,
    /// The stand-in all of them are bound to, compiled once per load (a file holding many
    /// costs one compilation, not one each).
    pub(super) refused_stand_in: Option<*const std::ffi::c_void>,
}

impl Loader<'_> {
    /// Records why the load fails, at the reader's position.
    pub(super) fn fail(&mut self, what: impl Into<String>) -> Fail {
        // A name the save gives (a chunk's, a permanent's) may hold NUL bytes: shown escaped,
        // as C code reading the message would stop at the first.
        self.error = Some(format!(
            "{} (at byte {} of the body)",
            what.into().replace('\0', "\\0"),
            self.r.pos
        ));
        Fail
    }

    /// [`Loader::fail`] for bytes that are not a save-game.
    pub(super) fn malformed(&mut self, what: &str) -> Fail {
        self.fail(format!("malformed save-game: {what}"))
    }

    /// A record as `format` decoded it: its value, or the load fails with the record's message
    /// at the reader's position (where the decoder stopped).
    pub(super) fn record<T>(&mut self, decoded: Result<T, Bad>) -> Result<T, Fail> {
        decoded.map_err(|bad| self.malformed(bad))
    }
}
