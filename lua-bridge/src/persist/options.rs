//! How to save and how to load: the options, the trust levels and their defaults.

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
    /// Downloaded, shared, or received from a peer: no code from the file (except, when `load`
    /// is allowed, the text of chunks the game made with `load`: see
    /// [`LoadOptions::allowed_permanents`]), load-time calls
    /// only to constructors the host registered ([`Vm::register_constructor`](crate::bridge::vm::Vm::register_constructor),
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
///
/// `_G` is here (and `package.loaded` under `package`): a file that names the globals table
/// can put it where game code writes (`player.inventory = _G`), so that the game overwrites
/// its own globals, the runtime's included. A whole-game save does not need to name it (the
/// root's kept lists keep `_G._G` and `package.loaded._G`); a host whose game state holds it
/// (a module's `local G = _G`) opts in by removing `"_G"` from
/// [`LoadOptions::denied_permanents`].
pub const DEFAULT_FOREIGN_DENIED: [&str; 12] = [
    "_G",
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

/// Which code the functions of a loaded save run. See "Updates that keep saves" in
/// `docs/updates.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionBinding {
    /// The code they were saved with, as in Eris: this VM's identical function, or, for an
    /// own save, the source text the save carries, compiled. A foreign load refuses a save
    /// whose functions this VM does not have as they were saved. What
    /// [`LoadOptions::new`] sets, and `eris.unpersist`.
    Saved,
    /// This version of the game's code: each saved function is bound to the function at the
    /// same place in this VM's current version of its chunk (the same chunk name, the same
    /// names from the chunk's main function down: `Agent.work`, `G.step > turn`; lines may
    /// move), and takes the saved upvalues by name; upvalues the newer function adds take the
    /// game's module-level variables (`_ENV`, a new local helper) or start as nil. A function
    /// with no counterpart, and a coroutine suspended in a function whose code changed, keep
    /// their saved code in an own load and refuse a foreign one, naming the function. The
    /// chunk's current version is the last one the host ran under that name ([`Vm::exec`](crate::Vm::exec),
    /// [`Vm::load`](crate::Vm::load), a module `require` loaded). What
    /// `Game::from_save` sets. Needs a save of format 6 or later (earlier ones keep their
    /// saved code).
    Current,
}

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
    /// Permanents the file may name even where `denied_permanents` (or the rule for the
    /// library's hidden helpers) refuses them, each by its exact name: the library functions
    /// a game's state holds on purpose (`load` for a library that compiles code, `require`),
    /// which the game declares (`G.permanents`, `GameConfig::permanents`). Default: none.
    ///
    /// Allowing `load` also lets a foreign load compile, from the text the file carries, the
    /// chunks the game made at run time with `load(text)` that this VM has not (text chunks
    /// named by their own text, at most 64 KiB each and 1 MiB a load): the file then brings
    /// code, which
    /// the game may call later inside its sandbox. Such functions are never taken as the
    /// game's own (a foreign save cannot make one a finalizer). See "Code in the save" in
    /// `docs/save-games.md`.
    pub allowed_permanents: Vec<String>,
    /// Which code loaded functions run (default [`FunctionBinding::Saved`]).
    pub functions: FunctionBinding,
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
    /// Load what this VM cannot rebuild as named stand-ins instead of refusing the file, for
    /// VMs that only read what they load (`luasnap diff` of a game whose host registers
    /// natives and userdata types): a permanent this VM lacks (a native `host.roll`) becomes
    /// an empty table whose metatable's `__name` is `native host.roll`, and a plain userdata of
    /// a type it has not registered keeps its bytes under a metatable whose `__name` is the
    /// type's name (`Vec2`). Everything else loads and compares as usual; calling a stand-in
    /// fails. Default: false.
    pub stand_ins: bool,
    /// Where the load finds the source of a file chunk (`@path`) a save names that this VM
    /// has not compiled (default: nowhere). The load asks once per such chunk, before it
    /// binds the chunk's functions, with the chunk name without its `@` (`src/ai.lua`), and
    /// compiles (never runs) what it gets, as [`Vm::compile`](crate::Vm::compile)
    /// would; a chunk it gets nothing for, or that does not compile, is a chunk this VM does
    /// not have. The names come from the file: a foreign save names any path it likes, so
    /// the source must refuse what is not the game's (`Game::from_save` reads only files of
    /// the game's folder).
    pub chunk_sources: Option<ChunkSources>,
    /// Functions an update renamed or removed ([`FunctionBinding::Current`] loads): a saved
    /// function at a place this version no longer has is bound to the place its declaration
    /// names, or refused as the declaration says. `Game::from_save` adds the game's own
    /// (`G.renamed`, `G.removed`). A malformed declaration fails every load. Default: none. See
    /// "Renamed and removed functions" in `docs/updates.md`.
    pub renames: Vec<super::renames::Rename>,
    /// Files an update moved ([`FunctionBinding::Current`] loads): a saved function of a file
    /// declared moved is bound to this version's function at its place in the file it moved
    /// to, as for a file that kept its name. `Game::from_save` adds the game's own
    /// (`G.moved`). A malformed declaration (a cycle, a path no game can have) fails every
    /// load. Default: none. See "Moved files" in `docs/updates.md`.
    pub moved: Vec<super::moved::MovedFile>,
}

/// The host's lookup of chunk sources by name, for [`LoadOptions::chunk_sources`].
#[derive(Clone)]
pub struct ChunkSources(std::sync::Arc<FindChunk>);

/// `find(path)`: the source of the chunk `@path`, or `None`.
type FindChunk = dyn Fn(&str) -> Option<Vec<u8>> + Send + Sync;

impl ChunkSources {
    /// A lookup: `find(path)` is the source of the chunk `@path`, or `None`.
    pub fn new(find: impl Fn(&str) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        ChunkSources(std::sync::Arc::new(find))
    }

    /// The source of the chunk `@path`, if the host has one.
    pub(crate) fn find(&self, path: &str) -> Option<Vec<u8>> {
        (self.0)(path)
    }
}

impl std::fmt::Debug for ChunkSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChunkSources(..)")
    }
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
            allowed_permanents: Vec::new(),
            functions: FunctionBinding::Saved,
            stand_ins: false,
            chunk_sources: None,
            renames: Vec::new(),
            moved: Vec::new(),
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
        if self.allowed_permanents.iter().any(|a| a.as_bytes() == name) {
            return true;
        }
        if self.trust == Trust::Foreign && name.contains(&b'#') && name != b"ipairs#aux" {
            return false;
        }
        !self.denied_permanents.iter().any(|d| {
            let d = d.as_bytes();
            name.starts_with(d) && (name.len() == d.len() || name[d.len()] == b'.')
        })
    }
}

/// How luasnap's own chunks are named (the runtime's glue, `[luasnap runtime]`): an update
/// load never binds a saved function to one of theirs by place, only by code.
pub(crate) const LUASNAP_CHUNK_PREFIX: &str = "=[luasnap";
