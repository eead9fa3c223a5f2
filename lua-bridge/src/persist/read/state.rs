//! What the loader keeps for the kinds that need memory across values: the records its kind
//! files read and write in the [`Loader`](super::loader::Loader), defined here so that the
//! loader holds them without importing the files that fill them. Their methods, and the
//! invariants they keep, are in those files:
//!
//! | record                          | kept by       | for                                      |
//! |---------------------------------|---------------|------------------------------------------|
//! | [`LoadedChunk`]                 | `proto.rs`    | the chunks a file names (format 4)       |
//! | [`LoadedCo`], [`UpMemo`]        | `open.rs`     | coroutines built, the open-upvalue check |
//! | [`Idents`]                      | `ident.rs`    | identities of keys (format 7)            |
//! | [`Rebinding`] and its parts     | `rebind.rs`   | saved functions bound to newer code      |
//! | [`SavedChunk`]                  | `resume.rs`   | saved code a suspended frame must match  |

use crate::persist::report::{LoadReport, SavedFunction};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_int, c_void};

/// A chunk a file names (format 4).
pub(super) struct LoadedChunk {
    /// Its name as the file gives it (`@town/agent.lua`).
    pub(super) name: Vec<u8>,
    /// Its main prototype in this VM (reused or compiled), or None: its functions are matched
    /// by fingerprint (foreign loads, files without code).
    pub(super) main: Option<*const c_void>,
    /// Whether the file brought its code.
    pub(super) brought_code: bool,
    /// Whether it is a text chunk (not `string.dump` output).
    pub(super) source_text: bool,
    /// Whether it is a text chunk named by its own text: one the game made with `load(s)`
    /// (`generated.rs`).
    pub(super) made_by_load: bool,
    /// Whether `main` is the file's code this load compiled (not the VM's own).
    pub(super) compiled: bool,
    /// Whether `main` is the file's code a foreign load compiled (`generated.rs`).
    pub(super) generated: bool,
    /// The VM's current version of it, when the load binds saved functions to the game's
    /// current code and it differs from the saved one (`rebind.rs`).
    pub(super) current: Option<usize>,
    /// Its saved version as the file gives it, to compare with the current one when a
    /// suspended frame needs it (`resume.rs`).
    pub(super) saved: SavedChunk,
}

/// The saved version of a chunk whose code changed in this version, as far as a foreign load
/// compares it with the current one (`resume.rs`).
#[derive(Clone, Copy, Debug)]
pub(super) enum SavedChunk {
    /// Not needed (the VM has the saved code), or the file has no text for it (written
    /// without code, or a binary chunk).
    Absent,
    /// Its source text (`len` bytes at `at` in the file's body) and its main function's
    /// fingerprint, not compiled yet.
    Text {
        at: usize,
        len: usize,
        main_hash: u64,
    },
    /// Compiled for comparison only (never run, hidden from fingerprint searches), its main
    /// closure anchored in `protos` under this address.
    Compiled(*const c_void),
}

/// Whether a chunk of the file (see `generated.rs`), text (`kind` 0) named `name` with source text `code`, is one
/// the game made with `load` from a string without a chunk name: `load(s)` names the chunk by
/// `s` itself. A file's chunk (`@main.lua`) or a host's (`Vm::exec(code, "=setup")`) is named
/// otherwise, so neither is ever compiled here.
pub(super) fn made_by_load(kind: u8, name: &[u8], code: &[u8]) -> bool {
    kind == 0 && !code.is_empty() && name == code
}

/// A suspended coroutine this load builds, for the open upvalues joined into it.
pub(super) struct LoadedCo {
    /// The stack size the file declares: open upvalues go into slots 1..=len.
    pub len: c_int,
    /// Its frames (`luasnap_thread_frames`) once restored: from then on the coroutine is held
    /// unresumable until the load ends (`luasnap_thread_hold`), so they stay as indexed.
    pub(super) frames: Option<Vec<*const c_void>>,
    /// Open upvalues joined while its stack was still arriving, checked once its frames are
    /// restored: (closure id, upvalue index, level).
    pub(super) unchecked: Vec<(u32, c_int, c_int)>,
    /// Its open upvalues by level, each as a closure joined to it (id, upvalue index), to link
    /// a new one in O(log n) (see `luasnap_upval_join_at`).
    pub(super) open: BTreeMap<c_int, (u32, c_int)>,
}

/// The memo of `luasnap_open_upval_check` (u64 words for its alignment): its answers for
/// this load, in a table the C side allocates (bounded by the game's code; see
/// docs/save-games.md), freed when the load ends (dropped with the loader: its `Drop` is in `open.rs`).
#[derive(Default)]
pub(super) struct UpMemo(pub(super) Vec<u64>);

/// What a load knows of the finalization marks its file gives (format 8).
#[derive(Default)]
pub(crate) struct Finals {
    /// The record for the new table or userdata whose tag comes next.
    pub(super) next: Option<crate::persist::format::Final>,
    /// Objects marked: (order number, object id).
    pub(super) marked: Vec<(u32, u32)>,
    /// Objects whose metatable has `__gc` though the saving VM had not marked them.
    pub(super) unmarked: Vec<u32>,
}

/// What a load knows of the identities its file gives.
#[derive(Default)]
pub(crate) struct Idents {
    /// The identity for the new object whose tag comes next.
    pub(super) next: Option<u32>,
    /// Identities given so far.
    pub(super) given: HashSet<u32>,
    /// The highest of them (0: none).
    pub(super) max: u32,
    /// Whether the file gave an identity twice: only a game whose counter went past 2^31 - 1
    /// and started again does (`check_counter`).
    pub(super) shared: bool,
}

/// A place in a chunk: the names from its main function down (`persist::place`).
pub(super) type Place = Vec<Vec<u8>>;

/// The state of a load that binds saved functions to this version's
/// ([`FunctionBinding::Current`](crate::persist::options::FunctionBinding)).
#[derive(Default)]
pub(super) struct Rebinding {
    pub(super) currents: Vec<Current>,
    /// Chunk name -> its current version, once looked up.
    pub(super) by_name: HashMap<Vec<u8>, Option<usize>>,
    pub(super) rebounds: Vec<Rebound>,
    /// By prototype index (as `Loader::protos`): how its closures are made, for the saved
    /// functions of the game's chunks.
    pub bindings: HashMap<usize, Binding>,
    /// Closures this load made for rebound functions (object ids, in the order made), and
    /// each one's rebound function.
    pub(super) pending: Vec<(u32, usize)>,
    pub(super) pending_by_id: HashMap<u32, usize>,
    /// Their addresses, to find them in suspended frames.
    pub(super) pending_ptrs: HashMap<*const c_void, u32>,
    /// Own loads: pending closures that keep their saved code (a suspended coroutine runs
    /// them, or they share one's local).
    pub(super) pinned: HashSet<u32>,
    /// Closures this load made of functions directly inside a current chunk's main function,
    /// which hold its module-level variables: (id, prototype, current).
    pub(super) holders: Vec<(u32, *const c_void, usize)>,
    /// Upvalue slots of loaded closures that no saved upvalue filled: (id, slot, prototype,
    /// current), filled when the walk is over.
    pub(super) unfilled: Vec<(u32, c_int, *const c_void, usize)>,
    /// The game's closures holding each current chunk's module-level locals, once looked up.
    pub(super) game_holders: HashMap<(usize, ModuleVar), (*const c_void, c_int)>,
    pub(super) game_looked: HashSet<usize>,
    /// Names of the chunks the save holds functions of whose saved code is this version's
    /// (`@M.lua`): a function of one of them that a saved module table lacks was removed by
    /// the saved game, not added by an update (`persist::added`).
    pub(super) unchanged_chunks: HashSet<Vec<u8>>,
    pub report: LoadReport,
    /// Whether the file's places quote keys that are no names (`format::FLAG_QUOTED_PLACES`);
    /// an older file's may read two functions alike (`persist::place`).
    pub(super) quoted_places: bool,
    /// Saved places of unnamed functions found by their code at another rank among the
    /// unnamed functions of their enclosing function (`rebind.rs`), by current chunk: the
    /// saved place and this version's; the functions nested in one are looked up under it.
    pub(super) relocated: HashMap<(usize, Place), Place>,
}

/// The VM's current version of a chunk the save names.
pub(super) struct Current {
    /// Its main prototype; its main closure is anchored in `protos` under this address.
    pub(super) main: *const c_void,
    /// Every prototype of its tree, by place.
    pub(super) places: HashMap<Vec<Vec<u8>>, *const c_void>,
    /// Each prototype's enclosing one (null for the main one).
    pub(super) parents: HashMap<*const c_void, *const c_void>,
    /// The named prototypes by family (`persist::place::family_key`), in source order.
    pub(super) families: HashMap<crate::persist::place::Family, Vec<*const c_void>>,
}

/// A saved function whose code changed, bound to this version's function at its place.
pub(super) struct Rebound {
    /// This version's function.
    pub(super) target: *const c_void,
    /// The chunk it is in (`Rebinding::currents`).
    pub(super) current: usize,
    /// The saved closure's upvalue count, and the target's.
    pub(super) saved_n: usize,
    pub(super) target_n: usize,
    /// For each upvalue of the target, the saved upvalue of its name, if any.
    pub(super) from_saved: Vec<Option<usize>>,
    /// For each saved upvalue, the target's upvalue of its name, if any.
    pub(super) to_target: Vec<Option<usize>>,
    /// The saved upvalues' names (empty: none, a stripped function).
    pub(super) saved_names: Vec<Vec<u8>>,
    /// For the report and messages.
    pub(super) function: SavedFunction,
    /// Whether it is in the report's `rebound` (or `moved`) list yet.
    pub(super) reported: bool,
    /// Whether this version's function is the saved code at other lines (an update moved it).
    pub(super) moved: bool,
    /// Whether its closures are made of the saved code (own loads of saves with code) and
    /// bound when the walk is over; else they are made of the target at once.
    pub(super) saved_code: bool,
    /// The saved function as the file names it: its chunk (`Loader::chunks`), its path of
    /// child indices there, its fingerprint.
    pub(super) chunk: usize,
    pub(super) path: Vec<u64>,
    pub(super) hash: u64,
    /// Whether the target is the saved code, lines aside (a frame suspended in it resumes
    /// there: `resume.rs`), once asked.
    pub(super) same_code: Option<bool>,
    /// For a saved function bound by the game's declaration (`renamed.rs`): the saved function
    /// at its own place, and whether the declaration names a replacement (`G.removed`) rather
    /// than its new place. Messages about the saved code name it, not the target.
    pub(super) declared: Option<(SavedFunction, bool)>,
    /// Whether it is an unnamed function bound by its rank among the unnamed functions of its
    /// enclosing function although this version's function there has other code (and no
    /// unnamed function of this version has exactly the saved code): reported as such.
    pub(super) by_rank: bool,
    /// Whether the target is the stand-in for a function the game declares removed with
    /// nothing replacing it (`G.removed = { [place] = true }`; `renamed.rs`).
    pub(super) removed: bool,
}

/// How the closures of one saved function (a prototype index) are made.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Binding {
    /// Its rebound function (`Rebinding::rebounds`), if its code changed.
    pub rebound: Option<usize>,
    /// The current chunk it is in, if it is one of the game's and this version has it.
    pub current: Option<usize>,
}

/// A variable of a chunk's main function that the chunk's functions share as an upvalue.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum ModuleVar {
    /// A local of the main function, by register.
    Local(c_int),
    /// An upvalue of the main function (its `_ENV`), by index.
    Upvalue(c_int),
}
