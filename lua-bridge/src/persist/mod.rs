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

mod budget;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod forge;
mod format;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod install;
mod read;
mod write;

/// Work counters of the last load this thread ended, for tests: the open-upvalue check's
/// prototype-tree walks (at most one per distinct question of the load) and the instructions
/// the frame checks read (about each frame function's code once per load; docs/save-games.md).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub use read::{last_load_frame_check_reads, last_load_open_upvalue_walks};

use crate::bridge::error::VmError;
use crate::bridge::ffi::{self as raw, Job};
use crate::bridge::helpers::{luasnap_gc_stopem, luasnap_proto, luasnap_raise_memerr};
use crate::bridge::natives;
use crate::bridge::per_vm;
use crate::bridge::vm::Vm;
pub(crate) use budget::budget_hook_intact;
use budget::LoadBudget;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, CStr, CString};

pub use format::{FORMAT_VERSION, HEADER_LEN, LUA_RELEASE, MAGIC};
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub use fuzz::{fuzz_load, FUZZ_GAME};

/// Registry key: value -> name, the permanents used when persisting.
pub(crate) const PERMS_KEY: &CStr = c"luasnap.perms";
/// Registry key: name -> value, the permanents used when loading.
pub(crate) const UNPERMS_KEY: &CStr = c"luasnap.unperms";

/// Registry key: the constructors foreign loads may call (function -> true; a Lua function's
/// prototype and those nested in it, as light userdata -> the function, which anchors them).
pub(crate) const CTORS_KEY: &CStr = c"luasnap.ctors";
/// The name of `coroutine.wrap`'s helper among the permanents: its closures (one upvalue, a
/// coroutine) are the only C closures with upvalues a load rebuilds.
pub(crate) const WRAP_AUX: &CStr = c"coroutine.wrap#aux";
/// The name of `string.gmatch`'s helper: its closures keep a match state with raw pointers,
/// so they are never saved or loaded.
pub(crate) const GMATCH_AUX: &CStr = c"string.gmatch#aux";

/// The name of pcall/xpcall's continuation among the permanents.
pub(crate) const PCALL_K: &CStr = c"pcall#k";
/// The permanents that are continuations (C functions a suspended coroutine's C frame resumes
/// through). A loaded frame may only name one of these, looked up in the VM's own permanents.
pub(crate) const CONTINUATIONS: [&CStr; 1] = [PCALL_K];

/// Stack slots of the helper tables inside a persist or load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slots {
    pub perms: c_int,
    pub seen: c_int,
    pub objs: c_int,
    pub keys: c_int,
    /// Strings by string id (anchored while the save is written or read).
    pub strs: c_int,
    pub protos: c_int,
    pub inits: c_int,
}

/// How to persist.
#[derive(Debug, Clone)]
pub struct PersistOptions {
    /// Track where each value is, so errors name the path (`root.player.inv[3]@metatable`).
    pub path: bool,
    /// Include each chunk's source text, once per chunk, so an own-trust load compiles the
    /// code a VM lacks (a fresh process, or one running a newer version of the game). Foreign
    /// loads never use it. Without it, functions are matched by fingerprint only.
    pub code: bool,
    /// Include bytecode for the code that has no source text: chunks loaded as binary
    /// (`string.dump` output) and functions compiled outside the chunk registry. Used only by
    /// own-trust loads that set [`LoadOptions::bytecode`].
    pub bytecode: bool,
    /// Keep debug information (line numbers, local names) in that bytecode.
    pub debug: bool,
    /// The metafield consulted for special persistence (Eris's `spkey`).
    pub spkey: String,
}

impl Default for PersistOptions {
    fn default() -> Self {
        PersistOptions {
            path: true,
            code: true,
            bytecode: true,
            debug: true,
            spkey: "__persist".into(),
        }
    }
}

/// Who wrote a save-game: what loading it may do depends on it. Every load names one; there
/// is no default. See "Trust levels" in `docs/save-games.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// The game's own files on the player's machine. As in Eris: load-time functions
    /// (`__persist` rebuild, create and init functions) may be any function the file names,
    /// the source text the file carries is compiled for chunks the VM lacks, and with
    /// [`LoadOptions::bytecode`] the file's bytecode is loaded for chunks that were loaded as
    /// binary. Memory safety, the instruction budget and the heap cap still hold.
    Own,
    /// Downloaded, shared, or received from a peer: no code from the file, load-time calls
    /// only to constructors the host registered ([`Vm::register_constructor`],
    /// `eris.constructor`), references only to the permanents not in
    /// [`LoadOptions::denied_permanents`], a smaller heap-growth cap by default.
    Foreign,
}

/// The default heap-growth cap of a load of an own save (Rust API and `eris.unpersist`).
pub const DEFAULT_OWN_HEAP_GROWTH: usize = 1 << 30;
/// The default heap-growth cap of a load of a foreign save.
pub const DEFAULT_FOREIGN_HEAP_GROWTH: usize = 256 << 20;
/// The default instruction budget of Lua code run during a load.
pub const DEFAULT_INSTRUCTION_BUDGET: u64 = 10_000_000;
/// Permanents a foreign save may not name by default: a name stands for itself and for every
/// name below it (`"os"` covers `os.execute`). Names with a `#` (the library's hidden
/// helpers) are refused too, except `ipairs#aux`, which checks its arguments.
pub const DEFAULT_FOREIGN_DENIED: [&str; 11] = [
    "os",
    "io",
    "debug",
    "package",
    "load",
    "loadfile",
    "dofile",
    "require",
    "collectgarbage",
    "eris",
    "string.dump",
];

/// How to load. Built with [`LoadOptions::new`] (or [`own`](LoadOptions::own) /
/// [`foreign`](LoadOptions::foreign)): the trust level is always chosen by the caller.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Who wrote the file.
    pub trust: Trust,
    /// [`Trust::Own`] only: load the file's bytecode for chunks that were loaded as binary
    /// (`string.dump` output) and functions compiled outside the chunk registry, when this VM
    /// does not have them. Lua has no bytecode verifier: only for files you produced yourself.
    /// Default false (`eris.unpersist` in own mode sets it, as Eris loads bytecode); ignored
    /// for foreign files. Source text needs no such option: own loads always compile it.
    pub bytecode: bool,
    /// The metafield name used when the file was written.
    pub spkey: String,
    /// Instructions that Lua code run during the load (rebuild and init functions, and
    /// coroutines they resume) may execute in total; past it the load fails. Loaded code
    /// cannot lift it: a load-time call that replaces the hook fails the load, and a nested
    /// load only gets what is left.
    pub instruction_budget: u64,
    /// Cap on how much the heap may grow during the load, in bytes (`None`: only the VM's
    /// limit). Defaults: [`DEFAULT_OWN_HEAP_GROWTH`], [`DEFAULT_FOREIGN_HEAP_GROWTH`].
    pub max_heap_growth: Option<usize>,
    /// Permanents the file may not name: a name covers itself and every name below it.
    /// Defaults: none for own saves, [`DEFAULT_FOREIGN_DENIED`] for foreign ones (remove
    /// names to allow more).
    pub denied_permanents: Vec<String>,
    /// May loaded objects get finalizers (a metatable with `__gc` when it is set)? The collector
    /// runs finalizers whenever it likes, with hooks off: outside the load's instruction budget
    /// and constructor rules, even after a load that failed. Default: true for own saves,
    /// false for foreign ones (such a file is refused).
    pub finalizers: bool,
    /// With `finalizers` false: accept objects whose metatable has `__gc` instead of refusing
    /// the file, but never mark them for finalization, so their finalizers never run (not at
    /// a collection, not when the VM closes). For VMs that only read what they load, like
    /// `luasnap diff`'s. Default: false.
    pub inert_finalizers: bool,
}

impl LoadOptions {
    /// The defaults for files of this trust level.
    pub fn new(trust: Trust) -> Self {
        LoadOptions {
            trust,
            bytecode: false,
            spkey: "__persist".into(),
            instruction_budget: DEFAULT_INSTRUCTION_BUDGET,
            max_heap_growth: Some(match trust {
                Trust::Own => DEFAULT_OWN_HEAP_GROWTH,
                Trust::Foreign => DEFAULT_FOREIGN_HEAP_GROWTH,
            }),
            finalizers: trust == Trust::Own,
            inert_finalizers: false,
            denied_permanents: match trust {
                Trust::Own => Vec::new(),
                Trust::Foreign => DEFAULT_FOREIGN_DENIED
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            },
        }
    }

    /// `LoadOptions::new(Trust::Own)`.
    pub fn own() -> Self {
        Self::new(Trust::Own)
    }

    /// `LoadOptions::new(Trust::Foreign)`.
    pub fn foreign() -> Self {
        Self::new(Trust::Foreign)
    }

    /// Whether the file may name the permanent `name`.
    pub(crate) fn allows_permanent(&self, name: &[u8]) -> bool {
        if self.trust == Trust::Foreign && name.contains(&b'#') && name != b"ipairs#aux" {
            return false;
        }
        !self.denied_permanents.iter().any(|d| {
            let d = d.as_bytes();
            name.starts_with(d) && (name.len() == d.len() || name[d.len()] == b'.')
        })
    }
}

/// Why a save failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SaveError {
    /// A value cannot be persisted; the message names it and where it is.
    #[error("cannot save: {message}")]
    Unpersistable {
        /// What and where.
        message: String,
    },
    /// Lua code run while saving (a `__persist` function) failed, or memory ran out.
    #[error(transparent)]
    Lua(VmError),
}

/// Why a load failed. A failed load leaves the VM usable; what it built is garbage.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Not a luasnap save-game at all.
    #[error("not a luasnap save-game (bad magic); check the file name")]
    NotASaveGame,
    /// Shorter than its header.
    #[error("the save-game is truncated ({len} bytes); the file was cut short")]
    Truncated {
        /// Bytes present.
        len: usize,
    },
    /// Written by another version of the format.
    #[error("save-game format {found} is not supported (this build reads formats 1 to {supported}); load it with the luasnap version that wrote it")]
    UnsupportedFormat {
        /// The file's format version.
        found: u16,
        /// The newest version this build reads (it reads every version from 1 up).
        supported: u16,
    },
    /// Written for another Lua release.
    #[error("the save-game was written for Lua release {found}, this VM runs {expected}; prototypes cannot be matched across releases")]
    WrongLuaVersion {
        /// The file's `LUA_VERSION_RELEASE_NUM`.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// Written with other integer or float formats.
    #[error("the save-game uses other number formats (integer/float size or byte order)")]
    NumberFormat,
    /// The body does not match its length or checksum.
    #[error("the save-game is corrupt ({what}); it was damaged after it was written")]
    Corrupt {
        /// What does not match.
        what: String,
    },
    /// The body is well-formed but refers to something this VM lacks, or is malformed.
    #[error("cannot load: {message}")]
    Invalid {
        /// What is wrong, and where in the body.
        message: String,
    },
    /// Lua code run while loading failed (or used up the instruction budget, or memory).
    #[error(transparent)]
    Lua(VmError),
}

impl From<format::HeaderError> for LoadError {
    fn from(e: format::HeaderError) -> LoadError {
        use format::HeaderError as H;
        match e {
            H::Truncated { len } => LoadError::Truncated { len },
            H::Magic => LoadError::NotASaveGame,
            H::Format { found } => LoadError::UnsupportedFormat {
                found,
                supported: format::FORMAT_VERSION,
            },
            H::Lua { found } => LoadError::WrongLuaVersion {
                found,
                expected: format::LUA_RELEASE,
            },
            H::Numbers => LoadError::NumberFormat,
            H::Length { declared, actual } => LoadError::Corrupt {
                what: format!("declares {declared} body bytes, has {actual}"),
            },
            H::Checksum => LoadError::Corrupt {
                what: "checksum mismatch".into(),
            },
        }
    }
}

/// Records the value on top (popped) as a permanent under `name`.
///
/// # Safety
/// Protected context (may allocate).
pub(crate) unsafe fn add_permanent(L: *mut lua_State, name: &CStr) {
    // SAFETY: protected context; the two registry tables exist once `install` ran (it runs
    // when the libraries open, before any native is registered).
    unsafe {
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, PERMS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -3);
            return;
        }
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
        // [v, perms, unperms]
        ffi::lua_pushvalue(L, -3);
        ffi::lua_rawget(L, -3);
        let known = ffi::lua_type(L, -1) != ffi::LUA_TNIL;
        ffi::lua_settop(L, -2);
        if !known {
            ffi::lua_pushvalue(L, -3);
            ffi::lua_pushstring(L, name.as_ptr());
            ffi::lua_rawset(L, -4);
            ffi::lua_pushstring(L, name.as_ptr());
            ffi::lua_pushvalue(L, -4);
            ffi::lua_rawset(L, -3);
        }
        ffi::lua_settop(L, -4);
    }
}

pub(crate) unsafe fn key_name(L: *mut lua_State, idx: c_int) -> Option<String> {
    // SAFETY: reads a string key without conversion.
    unsafe {
        if ffi::lua_type(L, idx) != ffi::LUA_TSTRING {
            return None;
        }
        let mut len = 0;
        let p = ffi::lua_tolstring(L, idx, &mut len);
        std::str::from_utf8(std::slice::from_raw_parts(p.cast::<u8>(), len))
            .ok()
            .map(str::to_string)
    }
}

/// Persists the value on top of the stack at `base + 2`, with perms at `base + 1` (a table,
/// or nil for the VM's permanents). Runs protected. On success the file is left on the stack
/// as a string if `as_string`, else returned (and nil left). Returns the status, the
/// Persister's error (if it produced it) and the file.
unsafe fn persist_protected(
    L: *mut lua_State,
    opts: &PersistOptions,
    as_string: bool,
) -> (c_int, Option<String>, Option<Vec<u8>>) {
    // SAFETY: a VM built by this crate, on its thread; the caller pushed perms and value.
    let (natives, base) = unsafe { (natives::state_of(L), per_vm::arena_base(L)) };
    let mut p = write::Persister::new(opts, natives.registry.types(), base);
    let mut out: Vec<u8> = Vec::new();
    // SAFETY: queries only.
    let running = unsafe { ffi::lua_gc(L, ffi::LUA_GCISRUNNING) } != 0;
    // SAFETY: reads a flag of the global state.
    let stopem = unsafe { luasnap_gc_stopem(L, -1) };
    let mut body = |L: *mut lua_State| -> c_int {
        // SAFETY: protected body; all Rust state lives in `p` and `out`, outside this frame.
        unsafe {
            // [perms|nil, value]
            ffi::lua_gc(L, ffi::LUA_GCSTOP);
            merge_permanents(L, PERMS_KEY);
            ffi::lua_createtable(L, 0, 0); // seen
            ffi::lua_createtable(L, 0, 0); // strs
            ffi::lua_rotate(L, 2, 2); // [perms, seen, strs, value]
            let s = Slots {
                perms: 1,
                seen: 2,
                objs: 2,
                keys: 3,
                strs: 3,
                protos: 3,
                inits: 3,
            };
            if p.run(L, s).is_err() {
                let msg = p.error.as_deref().unwrap_or("persist failed");
                ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
                ffi::lua_error(L);
            }
            let flags = if p.has_bytecode {
                format::FLAG_BYTECODE
            } else {
                0
            } | if p.has_source { format::FLAG_SOURCE } else { 0 };
            out = std::mem::take(&mut p.w).finish(flags);
            if as_string {
                ffi::lua_pushlstring(L, out.as_ptr().cast(), out.len());
            } else {
                ffi::lua_pushnil(L);
            }
            1
        }
    };
    // SAFETY: perms and value are the two values on top (callers' contract).
    let st = unsafe { call_job(L, &mut body, running) };
    // Emergency collections as they were before (the persister stops them; a load around
    // this persist, if any, wants them stopped).
    // SAFETY: sets a flag of the global state.
    unsafe { luasnap_gc_stopem(L, stopem) };
    let file = (st == ffi::LUA_OK && !as_string).then_some(out);
    (st, p.error.take(), file)
}

/// Replaces stack slot 1 (the caller's permanents table, or nil) with the VM's permanents
/// under `key` plus the caller's: as in Eris, the caller's add to the standard library's and
/// win where both name the same value (or, loading, the same name). Raw reads only: a
/// metatable on the caller's table is not consulted.
///
/// # Safety
/// Protected context (allocates); slot 1 holds a table or nil.
unsafe fn merge_permanents(L: *mut lua_State, key: &CStr) {
    // SAFETY: callers' contract; balanced pushes.
    unsafe {
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, key.as_ptr());
        if ffi::lua_type(L, 1) != ffi::LUA_TTABLE {
            ffi::lua_replace(L, 1);
            return;
        }
        let builtin = ffi::lua_gettop(L);
        ffi::lua_createtable(L, 0, 512);
        let merged = builtin + 1;
        for src in [builtin, 1] {
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, src) != 0 {
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_rawset(L, merged);
            }
        }
        ffi::lua_replace(L, 1);
        ffi::lua_settop(L, builtin - 1);
    }
}

/// Runs `body` protected with the two values on top of the stack as its arguments; they are
/// replaced by its one result, or by the error object. With `restart_gc`, the collector (which
/// the body stops) is restarted. Returns the `lua_pcall` status.
///
/// # Safety
/// `L` is a VM of this crate with at least two values on its stack, in a context where Lua
/// may be called.
unsafe fn call_job(
    L: *mut lua_State,
    body: &mut dyn FnMut(*mut lua_State) -> c_int,
    restart_gc: bool,
) -> c_int {
    let mut job = Job { body, panic: None };
    // SAFETY: the job outlives the protected call that reads it through the light userdata;
    // the pushes need no allocation beyond LUA_MINSTACK.
    unsafe {
        let base = ffi::lua_gettop(L) - 2;
        ffi::lua_pushcclosure(L, raw::run_job, 0);
        ffi::lua_pushlightuserdata(L, (&mut job as *mut Job<'_>).cast());
        ffi::lua_rotate(L, base + 1, 2);
        let st = ffi::lua_pcall(L, 3, 1, 0);
        if restart_gc {
            ffi::lua_gc(L, ffi::LUA_GCRESTART);
        }
        st
    }
}

/// Loads a file with unperms at `base + 1` (or nil): `opened` (from `format::open`), or else
/// the file that is a string on top, at `base + 2`.
unsafe fn load_protected(
    L: *mut lua_State,
    opts: &LoadOptions,
    opened: Option<format::Opened<'_>>,
) -> (c_int, Option<String>) {
    // SAFETY: a VM built by this crate, on its thread.
    let (natives, limits) = unsafe { (natives::state_of(L), LoadBudget::of(L)) };
    let file = match opened {
        Some(x) => x,
        None => {
            let mut data: &[u8] = &[];
            // SAFETY: the file is a string on top; it stays on the stack (alive) during the load.
            unsafe {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                if !p.is_null() {
                    data = std::slice::from_raw_parts(p.cast::<u8>(), len);
                }
            }
            match format::open(data) {
                Ok(x) => x,
                Err(e) => return (ffi::LUA_ERRRUN, Some(LoadError::from(e).to_string())),
            }
        }
    };
    let mut loader = read::Loader::new(file, opts, natives.registry.types(), limits);
    // SAFETY: queries only.
    let running = unsafe { ffi::lua_gc(L, ffi::LUA_GCISRUNNING) } != 0;
    // Budgets. A load nested in a load-time call of another (eris.unpersist) gets at most
    // what the outer one has left, and gives the outer one its hook back: loaded code cannot
    // lift a budget by loading again.
    // SAFETY: a thread of this VM; `end` follows below.
    let outer = unsafe { limits.begin(L, opts) };
    let mut body = |L: *mut lua_State| -> c_int {
        // SAFETY: protected body; state lives in `loader`, outside this frame.
        unsafe {
            ffi::lua_gc(L, ffi::LUA_GCSTOP);
            merge_permanents(L, UNPERMS_KEY);
            // [unperms, data|nil]: a data string stays on the stack while the loader reads it.
            ffi::lua_settop(L, 2);
            // objs and strs presized from the body's length (every object and string takes
            // a few bytes of it): growing them by doubling costs a rehash each time.
            let (nobjs, nstrs) = loader.helper_sizes();
            ffi::lua_createtable(L, nobjs, 0);
            for _ in 0..3 {
                ffi::lua_createtable(L, 0, 0);
            }
            ffi::lua_createtable(L, nstrs, 0);
            let s = Slots {
                perms: 1,
                seen: 3,
                objs: 3,
                keys: 4,
                protos: 5,
                inits: 6,
                strs: 7,
            };
            if loader.run(L, s).is_err() {
                if loader.out_of_memory {
                    // As any allocation failing in the load: a memory error, not a bad file.
                    luasnap_raise_memerr(L);
                }
                let msg = loader.error.as_deref().unwrap_or("load failed");
                ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
                ffi::lua_error(L);
            }
            1
        }
    };
    // SAFETY: unperms and the file are the two values on top (callers' contract); the count
    // hook bounds Lua code run meanwhile.
    let st = unsafe { call_job(L, &mut body, running) };
    // SAFETY: L is a thread of this VM; the load is over.
    unsafe {
        if loader.end_nofinal(L) && running {
            ffi::lua_gc(L, ffi::LUA_GCRESTART); // ignored by call_job while the mark was on
        }
    }
    // SAFETY: L is a thread of this VM; emergency collections were stopped by the loader.
    unsafe {
        if limits.end(L, outer) {
            read::allow_emergency_gc(L);
        }
    }
    (st, loader.error.take())
}

/// Returns 1 (the value on top) when `st` is `LUA_OK`, else raises the error object on top.
///
/// # Safety
/// Called from a C function Lua is running, with the result or error object on top; nothing
/// with a destructor may be alive in the calling frames.
unsafe fn one_result_or_raise(L: *mut lua_State, st: c_int) -> c_int {
    if st != ffi::LUA_OK {
        // SAFETY: callers' contract: the error object is on top and nothing needs dropping.
        unsafe { ffi::lua_error(L) };
    }
    1
}

/// `raw_persist(perms|nil, value, path, debug, spkey)` behind `eris.persist`.
unsafe extern "C-unwind" fn eris_persist(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with the documented arguments; the helper only raises its error.
    unsafe { one_result_or_raise(L, eris_persist_inner(L)) }
}

unsafe fn eris_persist_inner(L: *mut lua_State) -> c_int {
    // SAFETY: reads arguments without conversion, then persists protected.
    unsafe {
        let spkey = key_name(L, 5).unwrap_or_else(|| "__persist".into());
        let opts = PersistOptions {
            path: ffi::lua_toboolean(L, 3) != 0,
            code: true,
            bytecode: true,
            debug: ffi::lua_toboolean(L, 4) != 0,
            spkey,
        };
        ffi::lua_settop(L, 2);
        persist_protected(L, &opts, true).0
    }
}

/// `raw_unpersist(perms|nil, data, spkey, foreign, maxgrowth)` behind `eris.unpersist`.
unsafe extern "C-unwind" fn eris_unpersist(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with the documented arguments; the helper only raises its error.
    unsafe { one_result_or_raise(L, eris_unpersist_inner(L)) }
}

unsafe fn eris_unpersist_inner(L: *mut lua_State) -> c_int {
    // SAFETY: reads arguments without conversion, then loads protected.
    unsafe {
        let spkey = key_name(L, 3).unwrap_or_else(|| "__persist".into());
        let trust = if ffi::lua_toboolean(L, 4) != 0 {
            Trust::Foreign
        } else {
            Trust::Own
        };
        let growth = ffi::lua_tonumberx(L, 5, std::ptr::null_mut());
        let opts = LoadOptions {
            spkey,
            // As Eris: an own save's bytecode (binary chunks) loads.
            bytecode: trust == Trust::Own,
            max_heap_growth: (growth.is_finite() && growth >= 0.0).then_some(growth as usize),
            ..LoadOptions::new(trust)
        };
        ffi::lua_settop(L, 2);
        let (st, err) = load_protected(L, &opts, None);
        if st != ffi::LUA_OK {
            if let Some(msg) = err {
                ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
            }
        }
        st
    }
}

/// `raw_constructor(f)` behind `eris.constructor`.
unsafe extern "C-unwind" fn eris_constructor(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with a function at 1 (checked by the prelude); mark_constructor
    // raises only Lua errors (memory), and nothing here needs dropping.
    unsafe {
        ffi::lua_settop(L, 1);
        mark_constructor(L);
    }
    0
}

/// Marks the function on top (popped) as a constructor foreign loads may call: the function
/// itself, and for a Lua function its prototype and every prototype nested in it (so the
/// rebuild closures a `__persist` function returns qualify when it is marked).
///
/// # Safety
/// Protected context (allocates); a function on top.
unsafe fn mark_constructor(L: *mut lua_State) {
    unsafe extern "C" fn collect(p: *const std::ffi::c_void, ud: *mut std::ffi::c_void) {
        // SAFETY: ud is the Vec below, alive for the walk.
        unsafe { (*(ud as *mut Vec<*const std::ffi::c_void>)).push(p) };
    }
    // SAFETY: protected context (callers' contract); balanced pushes.
    unsafe {
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, CTORS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -3);
            return;
        }
        ffi::lua_rotate(L, -2, 1); // [ctors, f]
        ffi::lua_pushvalue(L, -1);
        ffi::lua_pushboolean(L, 1);
        ffi::lua_rawset(L, -4);
        let p = luasnap_proto(L, -1);
        if !p.is_null() {
            let mut protos: Vec<*const std::ffi::c_void> = Vec::new();
            read::proto_tree(p, collect, (&mut protos as *mut Vec<_>).cast());
            for q in protos {
                ffi::lua_pushlightuserdata(L, q.cast_mut());
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rawset(L, -4);
            }
        }
        ffi::lua_settop(L, -3);
    }
}

/// What the root of a persist is.
enum Root<'a> {
    Path(&'a CStr),
    Game,
}

impl Vm {
    fn persist_root(&self, root: Root<'_>, opts: &PersistOptions) -> Result<Vec<u8>, SaveError> {
        let mut staged: Option<String> = None;
        let mut result: Option<Vec<u8>> = None;
        let r = self.run(
            &mut |L| {
                // SAFETY: protected body; builds the root, then persists it in a nested
                // protected call so the Persister's state is dropped before errors propagate.
                unsafe {
                    ffi::lua_pushnil(L);
                    match &root {
                        Root::Path(p) => raw::push_path(L, p),
                        Root::Game => push_game_root(L),
                    }
                    let (st, err, file) = persist_protected(L, opts, false);
                    staged = err;
                    if st != ffi::LUA_OK {
                        ffi::lua_error(L);
                    }
                    result = file;
                    0
                }
            },
            |_, _| (),
        );
        match (r, staged, result) {
            (Ok(()), _, Some(bytes)) => Ok(bytes),
            (Err(VmError::Lua { message, .. }), Some(staged), _) if message.contains(&staged) => {
                Err(SaveError::Unpersistable { message: staged })
            }
            (Err(e), _, _) => Err(SaveError::Lua(e)),
            (Ok(()), _, None) => Err(SaveError::Unpersistable {
                message: "nothing was written".into(),
            }),
        }
    }

    /// Persists the value at a dotted global path (and everything reachable from it).
    pub fn persist(&self, path: &str) -> Result<Vec<u8>, SaveError> {
        self.persist_with(path, &PersistOptions::default())
    }

    /// Like [`persist`](Vm::persist), with options.
    pub fn persist_with(&self, path: &str, opts: &PersistOptions) -> Result<Vec<u8>, SaveError> {
        let p = self.checked_path(path).map_err(SaveError::Lua)?;
        self.persist_root(Root::Path(&p), opts)
    }

    /// Saves the whole game: the globals and `package.loaded` (library tables and functions go
    /// by name, as permanents).
    pub fn save_game(&self) -> Result<Vec<u8>, SaveError> {
        // math.random's state is not a Lua value: copied where the root includes it.
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { crate::bridge::random_state::stage(L) };
                0
            },
            |_, _| (),
        )
        .map_err(SaveError::Lua)?;
        self.persist_root(Root::Game, &PersistOptions::default())
    }

    fn load_root(
        &mut self,
        data: &[u8],
        opts: &LoadOptions,
        store: Option<&CStr>,
    ) -> Result<(), LoadError> {
        // Refuse bad headers before touching the VM.
        let opened = format::open(data).map_err(LoadError::from)?;
        self.check_idle("load a save-game")
            .map_err(LoadError::Lua)?;
        let old_limit = self.arena.stats().limit_bytes as usize;
        if let Some(growth) = opts.max_heap_growth {
            // The arena's limit bounds the bytes of live blocks.
            let cap = (self.arena.stats().bytes_allocated as usize)
                .saturating_add(growth)
                .min(old_limit);
            let _ = self.arena.set_limit(
                cap.next_multiple_of(luasnap_alloc::PAGE_SIZE)
                    .min(old_limit),
            );
        }
        let mut staged: Option<String> = None;
        let r = self.run(
            &mut |L| {
                // SAFETY: protected body; the load itself runs in a nested protected call.
                unsafe {
                    ffi::lua_pushnil(L);
                    ffi::lua_pushnil(L); // the file is read from `data`, not copied into Lua
                    let (st, err) = load_protected(L, opts, Some(opened));
                    staged = err;
                    if st != ffi::LUA_OK {
                        ffi::lua_error(L);
                    }
                    match store {
                        Some(path) => store_at_path(L, path),
                        None => restore_game(L),
                    }
                    0
                }
            },
            |_, _| (),
        );
        let _ = self.arena.set_limit(old_limit);
        match (r, staged) {
            (Ok(()), _) => Ok(()),
            (Err(VmError::Lua { message, .. }), Some(staged)) if message.contains(&staged) => {
                Err(LoadError::Invalid { message: staged })
            }
            (Err(e), _) => Err(LoadError::Lua(e)),
        }
    }

    /// Loads a save-game written by `trust` (with that level's default options) and stores
    /// the value at a dotted global path.
    pub fn unpersist(&mut self, data: &[u8], path: &str, trust: Trust) -> Result<(), LoadError> {
        self.unpersist_with(data, path, &LoadOptions::new(trust))
    }

    /// Like [`unpersist`](Vm::unpersist), with options.
    pub fn unpersist_with(
        &mut self,
        data: &[u8],
        path: &str,
        opts: &LoadOptions,
    ) -> Result<(), LoadError> {
        let p = self.checked_path(path).map_err(LoadError::Lua)?;
        self.load_root(data, opts, Some(&p))
    }

    /// Loads a whole-game save written by `trust`: restores the globals and
    /// `package.loaded` in place (entries not in the save are removed, `_G` itself stays the
    /// same table).
    pub fn load_game(&mut self, data: &[u8], trust: Trust) -> Result<(), LoadError> {
        self.load_game_with(data, &LoadOptions::new(trust))
    }

    /// Like [`load_game`](Vm::load_game), with options.
    pub fn load_game_with(&mut self, data: &[u8], opts: &LoadOptions) -> Result<(), LoadError> {
        self.load_root(data, opts, None)?;
        // The loaded copy of math.random's state goes back into the generator.
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { crate::bridge::random_state::unstage(L) };
                0
            },
            |_, _| (),
        )
        .map_err(LoadError::Lua)
    }

    /// Marks the function at a dotted global path as a constructor: loads of foreign saves
    /// may call it at load time (as a `__persist` rebuild, create or init function), and
    /// closures of the functions defined inside it (the rebuild closures a `__persist`
    /// function returns). Nothing else runs while a foreign save loads.
    pub fn register_constructor(&mut self, path: &str) -> Result<(), VmError> {
        let p = self.checked_path(path)?;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    raw::push_path(L, &p);
                    if ffi::lua_type(L, -1) != ffi::LUA_TFUNCTION {
                        ffi::lua_pushstring(
                            L,
                            c"register_constructor: the value at that path is not a function"
                                .as_ptr(),
                        );
                        ffi::lua_error(L);
                    }
                    mark_constructor(L);
                }
                0
            },
            |_, _| (),
        )
    }

    /// Makes the value at a dotted global path a permanent under `name`: saves refer to it by
    /// name instead of persisting it, and loads take it from the loading VM.
    pub fn register_permanent(&mut self, name: &str, path: &str) -> Result<(), VmError> {
        let p = self.checked_path(path)?;
        let n = CString::new(name).map_err(|_| VmError::BadName { name: name.into() })?;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    raw::push_path(L, &p);
                    add_permanent(L, &n);
                }
                0
            },
            |_, _| (),
        )
    }
}

/// Pushes `{ globals = copy of _G, loaded = copy of package.loaded }`.
unsafe fn push_game_root(L: *mut lua_State) {
    // SAFETY: protected context.
    unsafe {
        ffi::lua_createtable(L, 0, 4);
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        shallow_copy_keeping(L);
        ffi::lua_setfield(L, -3, c"globals_kept".as_ptr());
        ffi::lua_setfield(L, -2, c"globals".as_ptr());
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr()) == ffi::LUA_TTABLE {
            shallow_copy_keeping(L);
            ffi::lua_setfield(L, -3, c"loaded_kept".as_ptr());
            ffi::lua_setfield(L, -2, c"loaded".as_ptr());
        } else {
            ffi::lua_settop(L, -2);
        }
    }
}

/// Replaces the table on top with a raw shallow copy of it without its "own bindings" (a
/// string key `N` whose value is the permanent named `N`, such as `_G.os == os`), and pushes
/// the array of those names: [.., t] -> [.., copy, names]. A game save writes the names
/// instead of the permanents, and a load keeps the loading VM's own binding for each (see
/// `restore_kept`), so a foreign load, which denies `os` and the like, still restores an
/// ordinary game while refusing such a permanent anywhere else.
unsafe fn shallow_copy_keeping(L: *mut lua_State) {
    // SAFETY: protected context; a table on top.
    unsafe {
        let src = ffi::lua_gettop(L);
        ffi::lua_createtable(L, 0, 64); // src + 1: the copy
        ffi::lua_createtable(L, 16, 0); // src + 2: the names
        if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, PERMS_KEY.as_ptr()) != ffi::LUA_TTABLE {
            ffi::lua_settop(L, -2);
            ffi::lua_createtable(L, 0, 0);
        }
        let perms = src + 3;
        let mut kept = 0;
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, src) != 0 {
            // [.., k, v]
            let mut own = false;
            if ffi::lua_type(L, -2) == ffi::LUA_TSTRING {
                ffi::lua_pushvalue(L, -1);
                if ffi::lua_rawget(L, perms) == ffi::LUA_TSTRING {
                    own = ffi::lua_rawequal(L, -1, -3) != 0;
                }
                ffi::lua_settop(L, -2);
            }
            if own {
                kept += 1;
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rawseti(L, src + 2, kept);
                ffi::lua_settop(L, -2);
            } else {
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_rawset(L, src + 1);
            }
        }
        ffi::lua_settop(L, src + 2);
        ffi::lua_rotate(L, src, -1);
        ffi::lua_settop(L, -2);
    }
}

/// [.., saved, live] -> for each name in the root's field `field` (written by
/// `shallow_copy_keeping`), sets `saved[name]` to `live[name]` if that is the loading VM's
/// own permanent named `name`; otherwise the name stays absent (a host that removed `os`
/// from its globals keeps it removed). Raises on a malformed list. Leaves the stack as is.
unsafe fn restore_kept(L: *mut lua_State, root: c_int, field: &CStr) {
    // SAFETY: protected context; two tables on top, the game root at `root`.
    unsafe {
        let live = ffi::lua_gettop(L);
        let saved = live - 1;
        match raw_field(L, root, field) {
            ffi::LUA_TNIL => {
                ffi::lua_settop(L, live);
                return;
            }
            ffi::LUA_TTABLE => {}
            _ => malformed_game(L),
        }
        let names = live + 1;
        ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
        let unperms = live + 2;
        let n = ffi::lua_rawlen(L, names);
        // Only the array 1..n: anything else in the list is refused.
        ffi::lua_pushnil(L);
        let mut count = 0usize;
        while ffi::lua_next(L, names) != 0 {
            count += 1;
            ffi::lua_settop(L, -2);
        }
        if count != n {
            malformed_game(L);
        }
        for i in 1..=n {
            if ffi::lua_rawgeti(L, names, i as ffi::lua_Integer) != ffi::LUA_TSTRING {
                malformed_game(L);
            }
            // [.., name]
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawget(L, live);
            ffi::lua_pushvalue(L, -2);
            let own = ffi::lua_type(L, unperms) == ffi::LUA_TTABLE
                && ffi::lua_rawget(L, unperms) != ffi::LUA_TNIL
                && ffi::lua_rawequal(L, -1, -2) != 0;
            ffi::lua_settop(L, -2);
            // [.., name, live[name]]
            if own {
                ffi::lua_rawset(L, saved);
            } else {
                ffi::lua_settop(L, -3);
            }
        }
        ffi::lua_settop(L, live);
    }
}

/// Raises the error for a game root whose list of kept bindings is not an array of names.
unsafe fn malformed_game(L: *mut lua_State) -> ! {
    // SAFETY: protected context.
    unsafe {
        ffi::lua_pushstring(
            L,
            c"malformed game save: its list of kept library bindings is not an array of names"
                .as_ptr(),
        );
        ffi::lua_error(L)
    }
}

/// Stores the loaded value (on top) at the global path.
unsafe fn store_at_path(L: *mut lua_State, path: &CStr) {
    // SAFETY: protected context; the value is on top.
    unsafe {
        let bytes = path.to_bytes();
        match bytes.iter().rposition(|&b| b == b'.') {
            Some(dot) => {
                let parent = CString::new(&bytes[..dot]).expect("from a CStr");
                raw::push_path(L, &parent);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_pushlstring(L, bytes[dot + 1..].as_ptr().cast(), bytes.len() - dot - 1);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_settable(L, -3);
                ffi::lua_settop(L, -2);
            }
            None => ffi::lua_setglobal(L, path.as_ptr()),
        }
    }
}

/// Pushes `t[name]` for the table at absolute index `t`, without metamethods, and returns its
/// type. The game root comes from the file: a metatable with `__index` there would run a
/// function the file names after the load's budget and constructor rules ended.
///
/// # Safety
/// A protected context of a VM built by this crate; `t` is the absolute index of a table.
unsafe fn raw_field(L: *mut lua_State, t: c_int, name: &CStr) -> c_int {
    // SAFETY: protected context (the push may raise a memory error); `t` is a table.
    unsafe {
        ffi::lua_pushstring(L, name.as_ptr());
        ffi::lua_rawget(L, t)
    }
}

/// Restores `_G` and `package.loaded` from a loaded game root (on top) in place.
unsafe fn restore_game(L: *mut lua_State) {
    // SAFETY: protected context; raises a clear error if the root is not a game save.
    unsafe {
        let root = ffi::lua_gettop(L);
        if ffi::lua_type(L, root) != ffi::LUA_TTABLE
            || raw_field(L, root, c"globals") != ffi::LUA_TTABLE
        {
            ffi::lua_pushstring(
                L,
                c"not a whole-game save (no globals table); use unpersist for single values"
                    .as_ptr(),
            );
            ffi::lua_error(L);
        }
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        restore_kept(L, root, c"globals_kept");
        replace_contents(L);
        if raw_field(L, root, c"loaded") == ffi::LUA_TTABLE
            && ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, c"_LOADED".as_ptr()) == ffi::LUA_TTABLE
        {
            restore_kept(L, root, c"loaded_kept");
            replace_contents(L);
        }
        ffi::lua_settop(L, root - 1);
    }
}

/// [.., saved, live] -> makes `live` hold exactly `saved`'s entries; pops both.
unsafe fn replace_contents(L: *mut lua_State) {
    // SAFETY: protected context; two tables on top.
    unsafe {
        let live = ffi::lua_gettop(L);
        let saved = live - 1;
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, live) != 0 {
            ffi::lua_settop(L, -2);
            ffi::lua_pushvalue(L, -1);
            if ffi::lua_rawget(L, saved) == ffi::LUA_TNIL {
                ffi::lua_pushvalue(L, -2);
                ffi::lua_pushnil(L);
                ffi::lua_rawset(L, live);
            }
            ffi::lua_settop(L, -2);
        }
        ffi::lua_pushnil(L);
        while ffi::lua_next(L, saved) != 0 {
            ffi::lua_pushvalue(L, -2);
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_rawset(L, live);
        }
        ffi::lua_settop(L, saved - 1);
    }
}
