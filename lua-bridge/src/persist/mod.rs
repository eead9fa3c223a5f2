//! Save-games: an Eris-class object-graph serializer for Lua 5.5 (the slow, portable path).
//!
//! [`Vm::persist`] turns the value at a global path, and everything reachable from it, into a
//! self-contained byte string; [`Vm::unpersist`] rebuilds it in another VM, in another process,
//! later. [`Vm::save_game`] / [`Vm::load_game`] do the whole game: the globals and
//! `package.loaded`, restored into the live `_G` rather than replacing it. From Lua, the
//! `eris` module offers Eris's API: `eris.persist([perms,] value)`,
//! `eris.unpersist([perms,] data)`, `eris.settings(name [, value])`.
//!
//! # What persists
//! nil, booleans, integers and floats (kept apart; NaN payloads, -0.0, infinities), strings,
//! tables (metatables, cycles, shared references, weak modes), Lua closures (shared prototypes,
//! shared upvalues, any `_ENV`), C functions and anything else through the permanents table,
//! userdata through `__persist` (`true`: bytes; `false`: refuse; a function returning a rebuild
//! function, or a create function and an init function for two-phase persistence) or as
//! registered plain data, and coroutines: not started, dead, or suspended with their whole
//! stack (yields inside `pcall`/`xpcall` and metamethods, tail calls, open upvalues shared with
//! closures outside), each frame checked before the coroutine can run again.
//!
//! # How it is fast
//! The writer scans tables from C and writes primitives, strings, references and new tables
//! without a Lua API call per value; the loader decodes runs of entries into steps that a C
//! helper builds against Lua's internals. Both fall back to a general path, one value at a
//! time on the Lua stack, for everything else. See "Speed and size" in `docs/save-games.md`.
//!
//! # Safety on hostile files
//! See "Trust levels: the threat model" in `docs/save-games.md`. In short: every load names
//! its [`Trust`] level; in every mode the loader is memory-safe on any bytes (every read
//! bounded, C closures only with known upvalue layouts, coroutine frames checked against the
//! instructions they are suspended at), and Lua code run while loading has an instruction
//! budget and the heap a growth cap, which loaded code cannot lift. **Functions come from
//! source text**: a save carries each chunk's text once, which own-trust loads compile with
//! Lua's own compiler (or reuse, when the VM has the identical chunk) and foreign-trust loads
//! never use (they match each function's structural fingerprint against the chunks this VM
//! compiled itself); bytecode loads only for chunks loaded as binary, in own-trust loads that
//! set [`LoadOptions::bytecode`]. Foreign saves may in addition only call registered
//! constructors and name allowed permanents.
//!
//! [`Vm::persist`]: crate::Vm::persist
//! [`Vm::unpersist`]: crate::Vm::unpersist
//! [`Vm::save_game`]: crate::Vm::save_game
//! [`Vm::load_game`]: crate::Vm::load_game

mod added;
mod budget;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod forge;
mod format;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod game;
mod install;
pub(crate) mod moved;
mod options;
pub(crate) mod permanents;
pub(crate) mod place;
mod protected;
mod read;
pub(crate) mod renames;
mod report;
mod slots;
mod vm;
mod write;

/// Work counters of the last load this thread ended, for tests: the open-upvalue check's
/// prototype-tree walks (at most one per distinct question of the load) and the instructions
/// the frame checks read (about each frame function's code once per load; docs/save-games.md).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub use read::{last_load_frame_check_reads, last_load_open_upvalue_walks};

pub use error::{Accept, LoadError, SaveError, REFUSED_NAMES};

/// A save-game edited by hand (a modder's tool, a hex editor) sealed again: the file with its
/// header's body length and checksum written for the bytes it now has, or `None` when they
/// match already. The checksum only tells a damaged file from the file as written (anyone can
/// recompute it), so a resealed file is as untrusted as before and a load checks everything
/// else as it would (a foreign load takes no code from it). What a load refuses before the
/// checksum is refused here too: not a save-game, another format version, Lua release or
/// number format, a file shorter than its header.
pub fn reseal(file: &[u8]) -> Result<Option<Vec<u8>>, LoadError> {
    format::reseal(file).map_err(LoadError::from)
}
/// The body length that the header at the start of `head` (its first [`HEADER_LEN`] bytes, or
/// more) declares, once every other field of the header a load checks before the body checks
/// out (not a save-game, another format version, Lua release or number format are refused as a
/// load refuses them). A reader of a file checks this before it reads the body: a file whose
/// length disagrees is damaged or edited, and a declared length larger than what the reader
/// will load is refused without reading gigabytes.
pub fn declared_body_len(head: &[u8]) -> Result<u64, LoadError> {
    format::check_head(head)
        .map(|(_, _, len)| len)
        .map_err(LoadError::from)
}
pub use format::{FLAG_QUOTED_PLACES, FORMAT_VERSION, HEADER_LEN, LUA_RELEASE, MAGIC};
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub use fuzz::{fuzz_load, FUZZ_GAME};
pub use moved::MovedFile;
/// For the runtime's check that its glue is named as luasnap's chunks are.
#[cfg(test)]
pub(crate) use options::LUASNAP_CHUNK_PREFIX;
pub use options::{
    ChunkSources, FunctionBinding, LoadOptions, PersistOptions, Trust, DEFAULT_FOREIGN_DENIED,
    DEFAULT_FOREIGN_HEAP_GROWTH, DEFAULT_INSTRUCTION_BUDGET, DEFAULT_OWN_HEAP_GROWTH,
};
pub use renames::{Rename, RenameTo};
pub use report::{LoadReport, MovedChunk, RenamedFunction, SavedFunction};
