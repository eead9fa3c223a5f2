//! The client runtime: games that predict and roll back, on top of snapshots.
//!
//! A game is a Lua script returning a table `G` with `G.init(players, seed)` and
//! `G.step(inputs)` (`inputs[p]`: player `p`'s input, an integer for `u8` inputs, a table or
//! userdata for the host's own [`GameInput`] type), and optionally `G.digest()`
//! (a game-defined checksum). Its state is whatever the script keeps: globals, upvalues,
//! coroutines. [`Game`] runs one in a deterministic VM; [`Backend`] says how its state is saved
//! and restored: arena snapshots (full or incremental) or the graph serializer (save-games),
//! so the two speeds can be compared on the same game.
//!
//! Two client models:
//! - [`FrameSession`]: the GGPO model. Save every frame within a window (or only the confirmed
//!   ones, [`Saving::Sparse`]); when a prediction turns out wrong, load the frame of the first
//!   wrong prediction (or the newest save before it) and re-simulate.
//! - [`PredictiveClient`]: predictive re-execution, as in the seed design. The synchronous
//!   form holds the confirmed state; the asynchronous form is that plus the unacknowledged
//!   commands. When acknowledgements arrive, roll back to the synchronous form, apply them,
//!   take a new synchronous snapshot, and re-apply what is still pending.

mod activity;
mod clock;
mod declared;
pub mod digest;
#[cfg(feature = "ggrs")]
pub mod ggrs_adapter;
mod glue;
pub(crate) mod graph;
pub(crate) mod input;
#[cfg(feature = "net")]
pub mod net;
mod saving;
pub mod simulate;
pub mod value_diff;

use crate::bridge::error::VmError;
use crate::bridge::value::{Table, Value};
use crate::bridge::vm::{GcMode, Vm};
use crate::persist::{FunctionBinding, LoadError, LoadReport, SaveError};
use crate::runtime::activity::as_work;
pub use crate::runtime::activity::{Activity, Spent, Work};
pub use crate::runtime::clock::Clock;
pub use crate::runtime::input::{GameInput, PodInput, VmSetup};
pub use crate::runtime::saving::Saving;
use glue::DRIVER;
pub use glue::RUNTIME_CHUNK;
use luasnap_alloc::TrackerPreference;
use luasnap_snap::{SnapshotId, SnapshotMode};
use std::collections::VecDeque;
use std::time::Duration;

/// The embedded default game (about 10 MB of heap: thousands of entities with closures,
/// metatables, AI coroutines and strings).
pub const DEFAULT_GAME: &str = include_str!("../../games/arena_brawl.lua");
/// Where game VMs put their arena by default, so runs in one process lay out memory
/// identically and can be compared byte for byte.
pub const GAME_BASE_ADDRESS: usize = 0x3e00_0000_0000;

/// How a game's state is saved and restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// Arena snapshots, full copies.
    ArenaFull,
    /// Arena snapshots, written pages only (a frame that writes more than
    /// [`FULL_COPY_ABOVE`] of the pages is copied whole).
    ArenaIncremental,
    /// Arena snapshots, whole or written pages, whichever costs less for what the game writes
    /// (measured as it runs: [`SnapshotMode::Auto`]). The default.
    #[default]
    ArenaAuto,
    /// The graph serializer (save-games).
    Serialize,
}

impl Backend {
    /// All backends, in the order `simulate` runs them.
    pub const ALL: [Backend; 4] = [
        Backend::ArenaFull,
        Backend::ArenaIncremental,
        Backend::ArenaAuto,
        Backend::Serialize,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::ArenaFull => "full",
            Backend::ArenaIncremental => "incremental",
            Backend::ArenaAuto => "auto",
            Backend::Serialize => "serialize",
        }
    }

    /// How the arena backends copy snapshots (the serializer keeps whole copies for
    /// `simulate`'s captures only).
    fn snapshot_mode(self) -> SnapshotMode {
        match self {
            Backend::ArenaIncremental => SnapshotMode::Incremental(TrackerPreference::Auto),
            Backend::ArenaAuto => SnapshotMode::Auto(TrackerPreference::Auto),
            Backend::ArenaFull | Backend::Serialize => SnapshotMode::Full,
        }
    }

    /// Parses a name from [`Backend::name`].
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// Why a game could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GameError {
    /// The script does not follow the game contract.
    #[error("the game script {what}; it must return a table G with functions G.init(players, seed) and G.step(inputs)")]
    Contract {
        /// What is wrong.
        what: String,
    },
    /// `G.digest()` changed the game's state (sorted a list in place, drew from
    /// `math.random`, ...): peers that checksum at different frames would then desync.
    #[error("G.digest() changed the game's state at frame {frame}: it must only read it (sort a copy, draw no random numbers); peers that compute checksums at different frames would desync")]
    DigestChangesState {
        /// The frame after which it was called.
        frame: u64,
    },
    /// The script's top level or `G.init(players, seed)` failed.
    #[error("the game failed while its script ran or in G.init(players, seed): {error}")]
    Init {
        /// Lua's error with its traceback (in the message: not also the error's `source()`,
        /// so a report that walks the chain prints it once).
        error: VmError,
    },
    /// The game's Lua code failed in `G.step`. The state is what the frame left half-way:
    /// the game refuses to step or save it ([`GameError::HalfStepped`]) until a state saved
    /// at that frame or before is loaded ([`Game::load`]; a [`FrameSession`] loads its save of
    /// the frame itself when it holds one).
    #[error("the game failed in G.step at frame {frame} (frames count from 0: G.step's call number {}): {error}", frame + 1)]
    Script {
        /// The frame being simulated (or 0 during init).
        frame: u64,
        /// Lua's error with its traceback (in the message, not the `source()`).
        error: VmError,
    },
    /// `G.step` failed at `frame` (an error, its budget, the arena), leaving the state half-way
    /// through the frame; stepping or saving that state is refused until a state saved at the
    /// frame or before is loaded. Saved, it would stand for the frame in every later rollback.
    #[error("G.step failed at frame {frame} and left the state half-way through it, so {operation} is refused: load a state saved at frame {frame} or before (Game::load, FrameSession::load_frame or rollback_and_resimulate) and go on from there")]
    HalfStepped {
        /// The frame `G.step` failed in.
        frame: u64,
        /// What was refused (`G.step`, `a save`).
        operation: &'static str,
    },
    /// `G.digest()` returned something other than an integer or a string.
    #[error("G.digest() returned {returned} at frame {frame}; it must return an integer or a string (a checksum of the game state, equal whenever the states are equal)")]
    Digest {
        /// The frame count when it was called.
        frame: u64,
        /// What it returned, as Lua would describe it (`a table`, `the float 0.5`, `nil`).
        returned: String,
    },
    /// The game's heap reached the arena's limit.
    #[error("the game ran out of memory at frame {frame} in the {run} run: the Lua heap held {heap_bytes} bytes of a {capacity}-byte arena; {}", oom_advice(*heap_bytes, *capacity, run))]
    OutOfMemory {
        /// The frame being simulated (0 during init).
        frame: u64,
        /// Which run (`reference`, or a backend's name).
        run: String,
        /// The Lua heap when it failed, bytes.
        heap_bytes: usize,
        /// The arena's address space, bytes.
        capacity: usize,
    },
    /// `G.step` ran more Lua instructions than [`GameConfig::step_budget`] allows and was
    /// stopped: an endless loop (or far more work than a frame should do). The game's state
    /// is what the frame left half-way; the VM stays usable, so roll back to the last snapshot
    /// (a [`FrameSession`] or [`Game::load`] does) to go on.
    #[error("G.step did not finish frame {frame} (frames count from 0: G.step's call number {}) within its instruction budget of {budget} Lua instructions and was stopped{}: look for an endless loop there; if the frame really needs that much work, raise the budget (`luasnap simulate --step-budget`, GameConfig::step_budget); the state is what the frame left half-way, so roll back to the last snapshot to go on{}", frame + 1, location.as_deref().map(|l| format!(" at {l}")).unwrap_or_default(), traceback.as_deref().map(|t| format!("\n{t}")).unwrap_or_default())]
    StepBudget {
        /// The frame being simulated.
        frame: u64,
        /// The budget, in Lua VM instructions.
        budget: u64,
        /// Where the budget ran out (`chunk:line`).
        location: Option<String>,
        /// Lua's traceback of the error that stopped the frame.
        traceback: Option<String>,
    },
    /// A call into the game other than `G.step` (the top level of its script with the modules
    /// it requires there, `G.init`, `G.digest()`, the `__persist` functions a save calls, the
    /// metamethods the runtime's reads of `G` and of its own globals run) ran more Lua
    /// instructions than
    /// [`GameConfig::step_budget`] allows and was stopped: every call the runtime makes into
    /// the game runs under that budget, so an endless loop anywhere ends with this error
    /// instead of hanging the process.
    #[error("{call} did not finish within the instruction budget of {budget} Lua instructions (the step budget, which every call into the game runs under) and was stopped{}: look for an endless loop there; if it really needs that much work, raise the budget (`--step-budget N`, or `--step-budget off`; GameConfig::step_budget){}", location.as_deref().map(|l| format!(" at {l}")).unwrap_or_default(), traceback.as_deref().map(|t| format!("\n{t}")).unwrap_or_default())]
    CallBudget {
        /// The call that was stopped.
        call: GameCall,
        /// The budget, in Lua VM instructions.
        budget: u64,
        /// Where the budget ran out (`chunk:line`).
        location: Option<String>,
        /// Lua's traceback of the error that stopped the call.
        traceback: Option<String>,
    },
    /// The game's snapshot window is smaller than the frames a GGRS session may load back
    /// (checked by `GgrsGame::new`, before the session runs).
    #[error("the game's snapshot window holds {window} snapshots, but {session} may load a frame that needs {needed} of them: use a window of at least {needed} (GameConfig::window), or let the session roll back less")]
    WindowTooSmall {
        /// The game's window ([`GameConfig::window`]).
        window: usize,
        /// The window the session needs.
        needed: usize,
        /// The session (`a P2P session with max prediction 8`).
        session: String,
    },
    /// The heap changed between two `GgrsGame::handle` calls under arena checksums: a host
    /// call allocated between frames (a Lua function called from Rust, a string key the game
    /// never used). Every frame re-simulated without that call would be reported as a desync.
    #[error("the game's heap changed between two GgrsGame::handle calls (before frame {frame}: {bytes_before} bytes in {blocks_before} blocks, then {bytes_after} in {blocks_after}): something called from Rust between frames allocated, such as a Lua function that builds values or a string key the game never used. Under Checksum::Arena every frame re-simulated without that call would be reported as a desync. Read between frames with paths, handles and keys the game uses (docs/rust-api.md, \"Reading between frames\"), build what the renderer needs inside G.step, or compare Checksum::Game")]
    HeapChangedBetweenFrames {
        /// The game's frame when the change was found.
        frame: u64,
        /// Lua's heap bytes at the end of the previous `handle`.
        bytes_before: u64,
        /// Live blocks then.
        blocks_before: u64,
        /// Lua's heap bytes at the start of this one.
        bytes_after: u64,
        /// Live blocks now.
        blocks_after: u64,
    },
    /// `G.digest()` raised an error.
    #[error("G.digest() failed at frame {frame} (luasnap calls it to compare states; it must not raise): {error}")]
    DigestFailed {
        /// The frame count when it was called.
        frame: u64,
        /// Lua's error with its traceback (in the message, not the `source()`).
        error: VmError,
    },
    /// `G.digest()` used objects as table keys for the first time: they took identities, which
    /// are game state, so two peers that call it at other frames part.
    #[error(
        "G.digest() at frame {frame} made {objects} object(s) table keys for the first time \
         (`seen[entity] = true`, or a table, function or coroutine it made): an object's first \
         use as a key numbers it, and the numbering is part of the game's state (pairs() order), \
         so peers that take digests at other frames part. Key by a number or string instead \
         (`seen[e.id]`), or let G.init or G.step key those objects first (docs/determinism.md)"
    )]
    DigestKeyed {
        /// The frame count when it was called.
        frame: u64,
        /// How many identities it gave.
        objects: u32,
    },
    /// The game script does not compile.
    #[error("the game script has a syntax error: {message}")]
    Syntax {
        /// Lua's message, with the chunk name and line.
        message: String,
    },
    /// The VM failed (building, snapshots).
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Saving with the graph serializer failed.
    #[error(transparent)]
    Save(#[from] SaveError),
    /// Loading a save-game failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The game's `G.renamed` or `G.removed` (or [`LoadOptions::renames`](crate::persist::LoadOptions::renames))
    /// is malformed, or declares a new place or a replacement that no function of this
    /// version is at; or its `G.moved` is malformed, moves a file this version still has, or
    /// to a file it does not have: checked every time the game starts ([`Game::new`], [`Game::from_save`]),
    /// so a mistyped declaration fails before any save that needs it is loaded. The message
    /// names the declaration, says what the file has there and what to correct.
    #[error("{message}")]
    Declared {
        /// What is wrong, naming the declaration as the script writes it.
        message: String,
    },
    /// Options out of range, or a save for another setup.
    #[error("{0}")]
    Config(String),
}

/// A call the runtime makes into the game besides `G.step`, as [`GameError::CallBudget`]
/// names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GameCall {
    /// Running the game's script: its top level and the modules it requires there. Holds the
    /// script's name as its chunk gives it (`main.lua`).
    TopLevel(String),
    /// `G.init(players, seed)`.
    Init,
    /// `G.digest()` after the frame count given.
    Digest(u64),
    /// A save-game of the state after the frame count given ([`Game::save`] with
    /// [`Backend::Serialize`], [`Game::save_game`]): the `__persist` functions it calls.
    Save(u64),
    /// A read or write of the game's tables that the runtime makes (`G.collect_every`,
    /// `G.digest`, `G.permanents`, the global `luasnap_frame`, ...): an `__index` or
    /// `__newindex` metamethod the game set there runs. Holds what it reads or writes.
    Access(String),
}

impl std::fmt::Display for GameCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GameCall::TopLevel(script) => write!(
                f,
                "the top level of {script} (the script and the modules it requires as it runs)"
            ),
            GameCall::Init => f.write_str("G.init(players, seed)"),
            GameCall::Digest(frame) => write!(f, "G.digest() at frame {frame}"),
            GameCall::Save(frame) => write!(
                f,
                "the save of frame {frame} (the __persist functions it calls)"
            ),
            GameCall::Access(what) => write!(
                f,
                "the runtime's access to {what} (an __index or __newindex metamethod there)"
            ),
        }
    }
}

impl GameCall {
    /// The script's name as its chunk name gives it: `@main.lua` and `=arena_brawl` are
    /// `main.lua` and `arena_brawl`.
    fn top_level(chunk_name: &str) -> GameCall {
        let name = chunk_name.strip_prefix(['@', '=']).unwrap_or(chunk_name);
        GameCall::TopLevel(name.to_string())
    }

    /// `error` as this call's error if it is a spent budget.
    fn over_budget(self, error: VmError) -> Result<GameError, VmError> {
        match error {
            VmError::InstructionBudget {
                budget,
                location,
                traceback,
            } => Ok(GameError::CallBudget {
                call: self,
                budget,
                location,
                traceback,
            }),
            e => Err(e),
        }
    }
}

/// Runs `f`, a call into the game's code, under `budget` instructions if there is one
/// ([`Vm::call_with_budget`]).
fn within<R>(
    vm: &Vm,
    budget: Option<u64>,
    f: impl FnOnce() -> Result<R, VmError>,
) -> Result<R, VmError> {
    match budget {
        Some(b) => vm.budgeted(b, f),
        None => f(),
    }
}

/// Runs `f`, an access of the runtime to the game's tables (`what`), under `budget`: a
/// metamethod there (`__index`, `__newindex`) is game code, and one that runs too long ends
/// with [`GameError::CallBudget`] naming the access.
fn accessing<R>(
    vm: &Vm,
    budget: Option<u64>,
    what: &str,
    f: impl FnOnce() -> Result<R, VmError>,
) -> Result<R, GameError> {
    within(vm, budget, f).map_err(|e| {
        GameCall::Access(what.into())
            .over_budget(e)
            .unwrap_or_else(GameError::Vm)
    })
}

/// What the runtime's glue reads of `G` when it checks the game contract.
const CONTRACT_READS: &str = "G.init, G.step and G.collect_every";

/// How to run a game.
#[derive(Debug, Clone)]
pub struct GameConfig {
    /// The script's source.
    pub script: String,
    /// Its chunk name (`@path` for files), used in errors and to match prototypes in saves.
    pub chunk_name: String,
    /// Number of players (1..=16).
    pub players: usize,
    /// Seeds the VM's deterministic profile and `G.init` (0..=`i64::MAX`: `G.init` receives
    /// it as a Lua integer; larger seeds are refused).
    pub seed: u64,
    /// Arena base address (default [`GAME_BASE_ADDRESS`]); `None` lets the OS choose. A fixed
    /// address can hold one arena at a time: a second live game in the same process (two
    /// peers, `Game::from_save` beside the running game) needs `None`, or fails with a
    /// [`GameError::Config`] saying so.
    pub base_address: Option<usize>,
    /// Snapshots retained (at least the rollback depth + 2).
    pub window: usize,
    /// Arena address space.
    pub capacity: usize,
    /// Registers natives and userdata types on the game's VM (before the script runs).
    pub setup: VmSetup,
    /// Lua instructions one `G.step` may run before it is stopped with
    /// [`GameError::StepBudget`] (counted as [`Vm::call_with_budget`] says, coroutines
    /// included); `None`: no limit, what [`GameConfig::default_game`] sets (`luasnap simulate`
    /// sets [`DEFAULT_STEP_BUDGET`] unless told otherwise). The finalizers a collection
    /// point runs after a step ([`GameConfig::collect_every`]) get a budget of the same size,
    /// and so does every other call the runtime makes into the game: the script's top level
    /// (with the modules it requires there), `G.init`, each `G.digest()`, the `__persist`
    /// functions of each save-game ([`Game::save_game`]), and the metamethods the runtime's
    /// reads of `G` and of its globals run, stopped with [`GameError::CallBudget`] naming the
    /// call.
    /// Its cost is within the noise of
    /// timing `G.step` (see [`DEFAULT_STEP_BUDGET`]).
    pub step_budget: Option<u64>,
    /// Modules the game's `require` finds by name, before the folder's.
    pub modules: Vec<crate::bridge::modules::Module>,
    /// The game's folder, where `require` finds the rest of its modules (`a.b`: `a/b.lua` or
    /// `a/b/init.lua`); their chunks are named by their paths in it. See
    /// [`GameConfig::game_at`].
    pub folder: Option<std::path::PathBuf>,
    /// The Lua files of [`GameConfig::folder`] as this run reads them, shared by every game
    /// built from this configuration (and its clones): `require` and the loads of saves find
    /// the folder's files here, each read once, the first time any of them looks for it
    /// ([`GameConfig::read_folder_lazily`]), or all at once ([`GameConfig::read_folder`]),
    /// so every VM of the run runs these very bytes, whatever becomes of the folder (a match
    /// server's and its clients' game is the one whose identity they checked). Default:
    /// `None` (each VM reads a module the first time it is required).
    pub folder_files: Option<std::sync::Arc<crate::bridge::modules::FolderFiles>>,
    /// The library functions the game's state holds on purpose (`"load"` for a library that
    /// compiles code, `"collectgarbage"`), by name as the permanents table gives them: loads
    /// of the game's saves accept them even from foreign files, as they accept the names the
    /// script lists in `G.permanents`. Default: none.
    pub permanents: Vec<String>,
    /// Frames between the runtime's collection points (`Some(0)`: none, only the game's own
    /// `collectgarbage()`); `None`: the game's `G.collect_every` (a field of the table the
    /// script returns), else [`DEFAULT_COLLECT_EVERY`]. At the end of every frame whose number
    /// is a multiple of it the runtime runs a full collection, the only moments besides the
    /// game's `collectgarbage()` where weak tables lose entries and finalizers run (see
    /// [`Vm::gc_collect`]); the count is part of the game's state, so a game continued from a
    /// save keeps the saving game's. A game without weak tables or finalizers may set 0.
    pub collect_every: Option<u64>,
    /// Where the games built from this configuration (and its clones) record what they are
    /// doing: the call into the game or the save or load running now, and the time each took
    /// (a watchdog on another thread reads it to say where the time goes). Default: `None`.
    pub activity: Option<Activity>,
}

/// Frames between the runtime's collection points when neither the host
/// ([`GameConfig::collect_every`]) nor the game (`G.collect_every`) says (see `docs/gc.md`).
pub const DEFAULT_COLLECT_EVERY: u64 = 60;

/// The chunk name [`GameConfig::default_game`] gives the embedded game.
const DEFAULT_GAME_CHUNK: &str = "=arena_brawl";

impl GameConfig {
    /// The embedded default game. For a game of your own, name its script with
    /// [`GameConfig::with_script`] or [`GameConfig::game_at`].
    pub fn default_game(players: usize, seed: u64) -> GameConfig {
        GameConfig {
            script: DEFAULT_GAME.to_string(),
            chunk_name: DEFAULT_GAME_CHUNK.into(),
            players,
            seed,
            base_address: Some(GAME_BASE_ADDRESS),
            window: 10,
            capacity: 2 << 30,
            setup: VmSetup::default(),
            step_budget: None,
            permanents: Vec::new(),
            modules: Vec::new(),
            folder: None,
            folder_files: None,
            collect_every: None,
            activity: None,
        }
    }

    /// This configuration running `source` as the game's script, its chunk named `=name`: the
    /// name errors and tracebacks give its lines (`name:12: attempt to index a nil value`)
    /// and saves give its functions, so a save of another script does not bind to this one's
    /// functions. Keep the name across versions of the game, or its old saves no longer find
    /// their functions. A game in files: [`GameConfig::game_at`].
    pub fn with_script(mut self, name: &str, source: impl Into<String>) -> GameConfig {
        self.script = source.into();
        self.chunk_name = format!("={name}");
        self
    }

    /// A script that is not the embedded game under the embedded game's name would report
    /// its errors at `arena_brawl:LINE` and take saves of any other script so named.
    fn check_chunk_name(&self) -> Result<(), GameError> {
        if self.chunk_name == DEFAULT_GAME_CHUNK && self.script != DEFAULT_GAME {
            return Err(GameError::Config(format!(
                "the game's script is not the embedded default game, but its chunk name is still the default game's ({DEFAULT_GAME_CHUNK:?}): name your script, `GameConfig::default_game(players, seed).with_script(\"my_game\", source)` or `cfg.chunk_name = \"=my_game\".into()`; otherwise its errors point at arena_brawl's lines and a save of any other script left so named loads into it"
            )));
        }
        Ok(())
    }

    /// This configuration with the game at `path`: a game's folder (its `main.lua` is the
    /// script) or a game's main script (its folder is the game's folder). The script's chunk
    /// is named by its file name (`@main.lua`) and the modules `require` loads from the
    /// folder by their paths in it (`@lib/bump.lua`), so the same game run from another
    /// folder, or as `./main.lua`, names its functions alike and keeps its saves.
    pub fn game_at(mut self, path: &std::path::Path) -> Result<GameConfig, GameError> {
        let (dir, main) = if path.is_dir() {
            (path.to_path_buf(), path.join("main.lua"))
        } else {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            (dir, path.to_path_buf())
        };
        let script = crate::bridge::modules::read_source(&main).and_then(|b| {
            String::from_utf8(b)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
        });
        self.script = script.map_err(|e| {
            GameError::Config(if path.is_dir() {
                format!(
                    "cannot read {}: a game's folder holds its main script as main.lua ({e})",
                    main.display()
                )
            } else {
                format!("cannot read {}: {e}", main.display())
            })
        })?;
        let name = main
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "main.lua".into());
        self.chunk_name = format!("@{name}");
        self.folder = Some(dir);
        self.folder_files = None;
        Ok(self)
    }

    /// This configuration with the game's folder read now ([`GameConfig::folder_files`]):
    /// every Lua file in it that `require` could load (hidden ones aside, a symbolic link as
    /// what it points to, 6 folders deep, 2000 files at most; a `.lua` link that cannot be
    /// read is an error naming it). Games built from it read no file of the folder;
    /// a module outside that set is not found. Unchanged if the folder was read whole already
    /// or the game has none; a folder read lazily before is read again, whole.
    pub fn read_folder(mut self) -> Result<GameConfig, GameError> {
        let whole = self.folder_files.as_ref().is_some_and(|f| f.is_complete());
        if let (Some(dir), false) = (&self.folder, whole) {
            let files = crate::bridge::modules::FolderFiles::read_all(dir).map_err(|e| {
                GameError::Config(format!(
                    "cannot read the game's folder {}: {e}",
                    dir.display()
                ))
            })?;
            self.folder_files = Some(std::sync::Arc::new(files));
        }
        Ok(self)
    }

    /// This configuration with the game's folder read once for the run, lazily
    /// ([`GameConfig::folder_files`]): a file of the folder is read the first time a game
    /// built from it (or from a clone) requires it or a load names it, and every later game
    /// gets those bytes; a file never looked for is never read, so a single script in a
    /// crowded folder costs what it requires. Unchanged if the folder's files are set already
    /// or the game has none.
    pub fn read_folder_lazily(mut self) -> GameConfig {
        if let (Some(dir), None) = (&self.folder, &self.folder_files) {
            let files = crate::bridge::modules::FolderFiles::lazy(dir.clone());
            self.folder_files = Some(std::sync::Arc::new(files));
        }
        self
    }
}

/// A saved game state.
#[derive(Debug, Clone)]
pub enum SaveHandle {
    /// An arena snapshot in the VM's window.
    Snapshot(SnapshotId),
    /// A save-game.
    Bytes(Vec<u8>),
}

impl SaveHandle {
    /// Bytes held outside the arena's snapshot ring (save-games only).
    pub fn len(&self) -> usize {
        match self {
            SaveHandle::Snapshot(_) => 0,
            SaveHandle::Bytes(b) => b.len(),
        }
    }

    /// Whether it holds no bytes outside the ring.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Fraction of the arena's pages written in a frame above which a game's snapshot copies the
/// whole arena instead of the written pages, in [`Backend::ArenaIncremental`] (the snapshot
/// ring's `full_copy_above`): half the pages, the copies' own break-even for a client that
/// rolls back (a whole copy also makes the next rollback restore the whole arena, and a page
/// record is copied once more when folded into the base). It leaves out the write faults the
/// game takes on tracked pages, which [`Backend::ArenaAuto`] counts (docs/gc.md).
pub const FULL_COPY_ABOVE: f64 = 0.5;
/// The instruction budget of one `G.step` that `luasnap simulate` uses unless told otherwise
/// (`--step-budget`), and a sensible [`GameConfig::step_budget`]: 100 million Lua
/// instructions, about 300 times the busiest frame of the corpus games (the AI village's
/// frames run up to 0.33 million, Arena Brawl's 11,000) and a fraction of a second to a few
/// seconds of work, so an endless loop is stopped long before the stall warning of `simulate`
/// (10 s) while no real frame comes near it.
///
/// It is not on by default in [`GameConfig`] (it was a count hook that cost `G.step` 1.1-1.55×
/// its CPU time). Now a counter in Lua's VM loop pays for it whether a budget runs or not:
/// `G.step` with the budget on takes 0.93-1.05× its time with it off on the corpus games
/// (`cargo run --release --example step_budget_cost`; `docs/measurements.md`).
pub const DEFAULT_STEP_BUDGET: u64 = 100_000_000;

/// `text` with its control characters escaped as Rust writes them (`\n`, `\u{1b}`), and the
/// bidirectional overrides and isolates that reorder what follows them on a terminal; other
/// characters, non-ASCII letters included, are kept. For one line of text that comes from a
/// game, a save or a peer (a server's refusal): such text may carry escape sequences that
/// clear a terminal, retitle it or fake a line of the tool's own. See [`printable_text`] for
/// text of several lines.
pub fn printable_line(text: &str) -> String {
    printable(text, false)
}

/// [`printable_line`] keeping newlines and tabs, each line after the first indented by
/// [`CONTINUATION`]: for a message of several lines that may carry the game's text (a game's
/// error with its traceback, which can quote strings of a foreign save), printed where a
/// person reads it. No line of it starts where the tool's own lines do, so a game's
/// `error("x\nluasnap: all modes match")` cannot pass for a status line of the tool's; a
/// traceback reads as before, nested under its error.
pub fn printable_text(text: &str) -> String {
    printable(text, true)
}

/// What [`printable_text`] puts before each line after the first.
pub const CONTINUATION: &str = "  ";

fn printable(text: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let reorders = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if reorders {
            out.extend(c.escape_unicode());
        } else if keep_lines && c == '\n' {
            out.push(c);
            out.push_str(CONTINUATION);
        } else if keep_lines && c == '\t' {
            out.push(c);
        } else if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// The script as Lua's standalone loader reads a file: a first line starting with `#` (a
/// `#!` line) is skipped. It becomes a comment so line numbers stay those of the file.
pub(crate) fn script_source(script: &str) -> std::borrow::Cow<'_, str> {
    if script.starts_with('#') {
        std::borrow::Cow::Owned(format!("--{script}"))
    } else {
        std::borrow::Cow::Borrowed(script)
    }
}

/// A game running in its own deterministic VM, stepped with inputs of type `I` (one per
/// player per frame; `u8` by default, see [`GameInput`]).
///
/// The input type is the game's, fixed where the game is made: a game whose `G.step` reads
/// structured inputs takes them and nothing else. It is inferred from what the game is
/// given to ([`FrameSession<Pad>`](FrameSession), [`GgrsGame<LuaGgrs<Pad>>`](crate::ggrs_adapter::GgrsGame))
/// or stepped with; a game only made to be inspected names it:
/// `let game: Game = Game::from_save(&cfg, backend, &save)?` (bytes).
///
/// ```
/// use luasnap_bridge::runtime::{Backend, Game, GameConfig, GameInput};
///
/// #[derive(Clone, Copy, Default, serde::Serialize)]
/// struct Pad { dx: i8, fire: bool }
/// impl GameInput for Pad {}
///
/// let mut cfg = GameConfig::default_game(2, 1).with_script(
///     "pads",
///     "local G, x = {}, 0 function G.init() end
///      function G.step(inputs) x = x + inputs[1].dx end return G",
/// );
/// cfg.base_address = None;
/// cfg.capacity = 64 << 20;
/// let mut game: Game<Pad> = Game::new(&cfg, Backend::ArenaAuto)?;
/// game.step(&[Pad { dx: 1, fire: false }, Pad::default()])?;
/// # Ok::<(), luasnap_bridge::runtime::GameError>(())
/// ```
///
/// Bytes are not pads: the same game refuses `u8` inputs at compile time.
///
/// ```compile_fail,E0308
/// # use luasnap_bridge::runtime::{Backend, Game, GameConfig, GameInput};
/// # #[derive(Clone, Copy, Default, serde::Serialize)]
/// # struct Pad { dx: i8, fire: bool }
/// # impl GameInput for Pad {}
/// # let mut cfg = GameConfig::default_game(2, 1).with_script(
/// #     "pads",
/// #     "local G, x = {}, 0 function G.init() end
/// #      function G.step(inputs) x = x + inputs[1].dx end return G",
/// # );
/// # cfg.base_address = None;
/// # cfg.capacity = 64 << 20;
/// let mut game: Game<Pad> = Game::new(&cfg, Backend::ArenaAuto)?;
/// game.step(&[1u8, 2u8])?;
/// # Ok::<(), luasnap_bridge::runtime::GameError>(())
/// ```
pub struct Game<I = u8> {
    vm: Vm,
    backend: Backend,
    players: usize,
    seed: u64,
    frame: u64,
    has_digest: bool,
    capacity: usize,
    step_budget: Option<u64>,
    /// The frame whose `G.step` failed, while its half-way state is loaded
    /// ([`GameError::HalfStepped`]).
    half_stepped: Option<u64>,
    /// What the load of the save the game started from did with its functions.
    loaded: Option<LoadReport>,
    /// Where it records what it is doing ([`GameConfig::activity`]).
    activity: Option<Activity>,
    /// The input type `G.step` is called with.
    input: std::marker::PhantomData<fn(&[I])>,
}

impl<I> std::fmt::Debug for Game<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Game")
            .field("backend", &self.backend)
            .field("frame", &self.frame)
            .finish()
    }
}

/// What a game's VM is, whatever its input type.
impl Game {
    fn build_vm(cfg: &GameConfig, backend: Backend) -> Result<Vm, GameError> {
        if cfg.players == 0 || cfg.players > 16 {
            return Err(GameError::Config(format!(
                "players must be 1..=16, got {}",
                cfg.players
            )));
        }
        if cfg.seed > i64::MAX as u64 {
            return Err(GameError::Config(format!(
                "the seed must be 0..={} (G.init receives it as a Lua integer), got {}",
                i64::MAX,
                cfg.seed
            )));
        }
        let mode = backend.snapshot_mode();
        let mut b = Vm::builder()
            .capacity(cfg.capacity)
            .deterministic(cfg.seed)
            .window(cfg.window.max(2))
            .snapshot_mode(mode)
            .gc(GcMode::GENERATIONAL)
            .full_copy_above(FULL_COPY_ABOVE);
        if let Some(base) = cfg.base_address {
            b = b.base_address(base);
        }
        for m in &cfg.modules {
            b = b.module(m.clone());
        }
        match (&cfg.folder_files, &cfg.folder) {
            (Some(files), _) => b = b.module_files(files.clone()),
            (None, Some(dir)) => b = b.module_folder(dir.clone()),
            (None, None) => {}
        }
        let vm = cfg.setup.apply(b).build()?;
        // A game's state is its globals: the save-game module is not one of them (a library
        // that maps `_G`, as serpent does, would put it in the state); `require "eris"` still
        // finds it.
        vm.exec("eris = nil", "=luasnap")?;
        Ok(vm)
    }

    /// Builds the VM and runs the script, checking the game contract in Lua (G holds
    /// functions; `luasnap_game` is set).
    pub fn load_script(cfg: &GameConfig, backend: Backend) -> Result<Vm, GameError> {
        cfg.check_chunk_name()?;
        let vm = Self::build_vm(cfg, backend)?;
        let lua_error = |source: VmError| match source {
            VmError::Lua {
                kind: crate::bridge::error::LuaErrorKind::Syntax,
                message,
                ..
            } => GameError::Syntax { message },
            VmError::Lua { .. } => GameError::Init { error: source },
            e => GameCall::top_level(&cfg.chunk_name)
                .over_budget(e)
                .unwrap_or_else(GameError::Vm),
        };
        // The script is its own chunk under its own name (lines and messages as `lua` gives
        // them); the glue is another chunk, so tracebacks never put its lines under the
        // script's name.
        let verdict = {
            let g = within(&vm, cfg.step_budget, || {
                vm.load(script_source(&cfg.script).as_bytes(), &cfg.chunk_name)
            })
            .map_err(lua_error)?;
            let driver = vm.load(DRIVER, RUNTIME_CHUNK)?.into_function()?;
            let every = match cfg.collect_every {
                Some(n) => Value::Integer(n.min(i64::MAX as u64) as i64),
                None => Value::Nil,
            };
            within(&vm, cfg.step_budget, || {
                driver.call::<Value>((&g, every, Value::Integer(DEFAULT_COLLECT_EVERY as i64)))
            })
            .map_err(|e| {
                GameCall::Access(CONTRACT_READS.into())
                    .over_budget(e)
                    .unwrap_or_else(lua_error)
            })?
        };
        if let Value::String(what) = &verdict {
            return Err(GameError::Contract {
                what: String::from_utf8_lossy(what).into_owned(),
            });
        }
        Ok(vm)
    }

    /// The game's files, for checking the new places it declares ([`declared::check_targets`]):
    /// a reader VM (the script and [`GameConfig::modules`] compiled, not run), the folder's
    /// files as a load reads them, and every chunk name: the script's, the modules', then
    /// each Lua file's of the folder.
    fn declared_files(cfg: &GameConfig) -> Result<declared::GameFiles, GameError> {
        let mut chunks = vec![cfg.chunk_name.clone()];
        chunks.extend(cfg.modules.iter().map(|m| format!("@{}", m.path)));
        let folder: Vec<String> = match (&cfg.folder_files, &cfg.folder) {
            (Some(files), _) if files.is_complete() => {
                files.files().into_iter().map(|m| m.path).collect()
            }
            (_, Some(dir)) => crate::bridge::modules::Module::all_in_folder(dir)
                .map_err(|e| {
                    GameError::Config(format!(
                        "cannot read the game's folder {} to check its G.renamed and G.removed: {e}",
                        dir.display()
                    ))
                })?
                .into_iter()
                .map(|m| m.path)
                .collect(),
            _ => Vec::new(),
        };
        for path in folder {
            let chunk = format!("@{path}");
            if !chunks.contains(&chunk) {
                chunks.push(chunk);
            }
        }
        Ok(declared::GameFiles::new(
            Game::reader_vm(cfg)?,
            Game::folder_chunks(cfg),
            chunks,
        ))
    }

    /// The game's `G.moved`, read and checked against this version's files as the game
    /// starts (`declared::check_moved`).
    fn declared_moved(
        vm: &Vm,
        cfg: &GameConfig,
    ) -> Result<Vec<crate::persist::MovedFile>, GameError> {
        let moved =
            declared::declared_moved(vm)?.map_err(|message| GameError::Declared { message })?;
        declared::check_moved(&moved, || Game::declared_files(cfg))?
            .map_err(|message| GameError::Declared { message })?;
        Ok(moved)
    }

    /// The permanents the game declares: [`GameConfig::permanents`] and the strings of the
    /// script's `G.permanents` list.
    fn declared_permanents(vm: &Vm, cfg: &GameConfig) -> Result<Vec<String>, GameError> {
        let mut names = cfg.permanents.clone();
        let listed = accessing(vm, cfg.step_budget, "G.permanents", || {
            vm.exec(
            "local p = luasnap_game.permanents
             if p == nil then return '' end
             if type(p) ~= 'table' then return nil, 'G.permanents must be a list of names (strings), got a ' .. type(p) end
             local out = {}
             for i, name in ipairs(p) do
               if type(name) ~= 'string' then return nil, 'G.permanents[' .. i .. '] must be a name (a string), got a ' .. type(name) end
               out[#out + 1] = name
             end
             return table.concat(out, '\\0')",
                "=luasnap",
            )
        })?;
        match listed.as_slice() {
            [Value::String(s), ..] => names.extend(
                s.split(|&b| b == 0)
                    .filter(|n| !n.is_empty())
                    .map(|n| String::from_utf8_lossy(n).into_owned()),
            ),
            [_, Value::String(why), ..] => {
                return Err(GameError::Config(String::from_utf8_lossy(why).into_owned()))
            }
            _ => {}
        }
        Ok(names)
    }

    /// A VM that reads this game's save-games without running the game: the setup applied
    /// (natives, userdata types), the script, its modules and the runtime's glue compiled but
    /// not run, so that a foreign load matches the saves' functions against them, and a
    /// script whose top level calls the host's natives needs none of them. The modules are
    /// [`GameConfig::modules`]; those of [`GameConfig::folder`] are compiled as a save names
    /// them, by a load given [`Game::folder_chunks`]. For reading a save's values
    /// ([`crate::runtime::value_diff::save_graph`]), not for playing it.
    pub fn reader_vm(cfg: &GameConfig) -> Result<Vm, GameError> {
        cfg.check_chunk_name()?;
        let mut reader = cfg.clone();
        reader.base_address = None;
        let vm = Self::build_vm(&reader, Backend::ArenaFull)?;
        let syntax = |e| match e {
            VmError::Lua {
                kind: crate::bridge::error::LuaErrorKind::Syntax,
                message,
                ..
            } => GameError::Syntax { message },
            e => GameError::Vm(e),
        };
        vm.compile(script_source(&cfg.script).as_bytes(), &cfg.chunk_name)
            .map_err(syntax)?;
        for m in &cfg.modules {
            vm.compile(&m.source, &format!("@{}", m.path))
                .map_err(syntax)?;
        }
        vm.compile(DRIVER, RUNTIME_CHUNK)?;
        Ok(vm)
    }
}

impl<I> Game<I> {
    /// What loading the save this game started from did with the saved functions (`None` for
    /// a game started with [`Game::new`]).
    pub fn load_report(&self) -> Option<&LoadReport> {
        self.loaded.as_ref()
    }

    fn has_digest(vm: &Vm, budget: Option<u64>) -> Result<bool, GameError> {
        let is = accessing(vm, budget, "G.digest", || {
            vm.exec("return type(luasnap_game.digest) == 'function'", "=luasnap")
        })?;
        Ok(is == vec![Value::Boolean(true)])
    }

    /// The renames and removals the game declares (`G.renamed`, `G.removed`), read under
    /// `budget`.
    fn declared_renames(
        vm: &Vm,
        budget: Option<u64>,
    ) -> Result<Vec<crate::persist::Rename>, GameError> {
        accessing(vm, budget, "G.renamed and G.removed", || {
            declared::declared_renames(vm)
        })?
        .map_err(|message| GameError::Declared { message })
    }

    /// Loads the script and calls `G.init(players, seed)`.
    pub fn new(cfg: &GameConfig, backend: Backend) -> Result<Game<I>, GameError> {
        let at_init = |e: GameError, heap_bytes: usize| match out_of_memory(&e) {
            true => GameError::OutOfMemory {
                frame: 0,
                run: backend.name().into(),
                heap_bytes,
                capacity: cfg.capacity,
            },
            false => e,
        };
        let activity = cfg.activity.as_ref();
        let vm = as_work(activity, Work::TopLevel, || Game::load_script(cfg, backend))
            .map_err(explain_base_in_use)
            .map_err(|e| at_init(e, 0))?;
        let renames = Self::declared_renames(&vm, cfg.step_budget)?;
        declared::check_targets(&renames, || Game::declared_files(cfg))?
            .map_err(|message| GameError::Declared { message })?;
        Game::declared_moved(&vm, cfg)?;
        let has_digest = Self::has_digest(&vm, cfg.step_budget)?;
        let mut game = Game {
            vm,
            backend,
            players: cfg.players,
            seed: cfg.seed,
            frame: 0,
            has_digest,
            capacity: cfg.capacity,
            step_budget: cfg.step_budget,
            half_stepped: None,
            loaded: None,
            activity: cfg.activity.clone(),
            input: std::marker::PhantomData,
        };
        let args = [
            Value::Integer(cfg.players as i64),
            Value::Integer(cfg.seed as i64),
        ];
        as_work(activity, Work::Init, || {
            within(&game.vm, game.step_budget, || {
                game.vm.call::<()>("luasnap_game.init", &args)
            })
        })
        .map_err(|source| match GameCall::Init.over_budget(source) {
            Ok(e) => e,
            Err(source) => match game.script_error(source) {
                GameError::Script { error, .. } => GameError::Init { error },
                e => e,
            },
        })
        .map_err(|e| at_init(e, game.vm.lua_memory()))?;
        accessing(
            &game.vm,
            game.step_budget,
            "the global luasnap_players",
            || {
                game.vm
                    .set("luasnap_players", Value::Integer(cfg.players as i64))
            },
        )?;
        // Frames start under the collector's steady schedule, whatever built the heap (a
        // continued game's load ran with the collector stopped: see `gc_collect_settled`).
        game.vm.gc_collect_settled()?;
        Ok(game)
    }

    /// Starts from a save-game written by [`Game::save_game`]: the script is loaded (for its
    /// functions), then the saved state replaces its globals; the frame count continues.
    ///
    /// The file is treated as foreign (it may come from another player): no code is taken
    /// from it, and the budgets of
    /// [`LoadOptions::new`](crate::persist::LoadOptions::new)`(Trust::Foreign)` apply, except
    /// that the game's objects may keep their finalizers (`__gc`). A save of an older version
    /// of the game loads into this one: each saved function is bound to this version's
    /// function at the same place ([`FunctionBinding::Current`]: same module, same name and
    /// nesting), so this version's code runs with the saved state; [`Game::load_report`] says
    /// what was rebound. A function this version no longer has, or a coroutine suspended in
    /// one whose code changed, is refused, naming it; trusting the file
    /// ([`Game::from_save_with`] and `Trust::Own`) keeps their saved code instead. The
    /// permanents the game declares (`G.permanents`, [`GameConfig::permanents`]) are accepted,
    /// and the functions it declares renamed or removed (`G.renamed`, `G.removed`, read from
    /// this version's script before the load: see [`LoadOptions::renames`](crate::persist::LoadOptions::renames)) are bound as
    /// declared. The chunks of modules the game requires only as it runs (in `G.init`) are compiled
    /// (not run) as the save names them, from the game's folder ([`GameConfig::folder`])
    /// and nothing else: only the files the save names are read, and a name that is not a
    /// Lua file inside the folder (`../../etc/passwd`, an absolute path, a hidden file) is a
    /// chunk this game does not have, refused as such. A symbolic link in the folder counts
    /// as what it points to, as for `require`.
    pub fn from_save(
        cfg: &GameConfig,
        backend: Backend,
        save: &[u8],
    ) -> Result<Game<I>, GameError> {
        let mut opts = crate::persist::LoadOptions::new(crate::persist::Trust::Foreign);
        opts.finalizers = true;
        opts.functions = FunctionBinding::Current;
        Self::from_save_with(cfg, backend, save, &opts)
    }

    /// Checks a save-game against this version of the game before it ships: loads it as
    /// [`Game::from_save_with`] does (the game's declarations read and checked first), with
    /// any number of players, and returns what the load did with the saved functions (rebound,
    /// moved, renamed, files moved, ...), or why it was refused: a foreign load names every
    /// saved function this version no longer has at once, each needing a declaration
    /// (`G.renamed`, `G.removed`). The game is not run beyond its script's top level, and the
    /// loaded state is dropped. `luasnap check-save` runs it on each save it is given.
    pub fn check_save(
        cfg: &GameConfig,
        backend: Backend,
        save: &[u8],
        opts: &crate::persist::LoadOptions,
    ) -> Result<crate::persist::LoadReport, GameError> {
        Game::<I>::load_save(cfg, backend, save, opts).map(|(_, report)| report)
    }

    /// The game's script loaded, its declarations read and checked, and `save` loaded into it
    /// with them added to `opts`.
    fn load_save(
        cfg: &GameConfig,
        backend: Backend,
        save: &[u8],
        opts: &crate::persist::LoadOptions,
    ) -> Result<(Vm, crate::persist::LoadReport), GameError> {
        let activity = cfg.activity.as_ref();
        let mut vm = as_work(activity, Work::TopLevel, || Game::load_script(cfg, backend))
            .map_err(explain_base_in_use)?;
        let mut opts = opts.clone();
        if opts.chunk_sources.is_none() {
            opts.chunk_sources = Game::folder_chunks(cfg);
        }
        opts.allowed_permanents
            .extend(Game::declared_permanents(&vm, cfg)?);
        opts.renames
            .extend(Self::declared_renames(&vm, cfg.step_budget)?);
        declared::check_targets(&opts.renames, || Game::declared_files(cfg))?
            .map_err(|message| GameError::Declared { message })?;
        opts.moved.extend(Game::declared_moved(&vm, cfg)?);
        let report = as_work(activity, Work::Load, || vm.load_game_reporting(save, &opts))?;
        Ok((vm, report))
    }

    /// [`Game::from_save`] with the load's options (trust level, budgets, which code the
    /// saved functions run) given; the game's declared permanents are added to
    /// `opts.allowed_permanents`, its declared renames and removals to `opts.renames`.
    pub fn from_save_with(
        cfg: &GameConfig,
        backend: Backend,
        save: &[u8],
        opts: &crate::persist::LoadOptions,
    ) -> Result<Game<I>, GameError> {
        let (vm, report) = Game::<I>::load_save(cfg, backend, save, opts)?;
        let (frame, players) = accessing(
            &vm,
            cfg.step_budget,
            "the globals luasnap_frame and luasnap_players",
            || {
                Ok((
                    vm.get::<Value>("luasnap_frame")?.as_integer(),
                    vm.get::<Value>("luasnap_players")?.as_integer(),
                ))
            },
        )?;
        let (Some(frame), Some(players)) = (frame, players) else {
            return Err(GameError::Config(
                "the save-game was not written by luasnap simulate (no frame count)".into(),
            ));
        };
        if players as usize != cfg.players {
            return Err(GameError::Config(format!(
                "the save-game is for {players} players, not {}: continue it with as many (`luasnap simulate --players {players}`, GameConfig::players)",
                cfg.players
            )));
        }
        let has_digest = Self::has_digest(&vm, cfg.step_budget)?;
        let mut game = Game {
            vm,
            backend,
            players: cfg.players,
            seed: cfg.seed,
            frame: frame as u64,
            has_digest,
            capacity: cfg.capacity,
            step_budget: cfg.step_budget,
            half_stepped: None,
            loaded: Some(report),
            activity: cfg.activity.clone(),
            input: std::marker::PhantomData,
        };
        // As after `G.init` (`Game::new`): without it the loaded heap's first collections are
        // major ones, and json_town continued at frame 150 ran with a 4.0 MB extent (straight:
        // 3.2 MB), snapshot memory and rollbacks growing with it.
        game.vm.gc_collect_settled()?;
        Ok(game)
    }

    /// Restores a [`Vm::capture`] of this game taken at `frame` and switches to `backend`:
    /// the next run starts from exactly the same bytes.
    pub fn restart(
        &mut self,
        capture: &luasnap_snap::Snapshot,
        frame: u64,
        backend: Backend,
        window: usize,
    ) -> Result<(), GameError> {
        self.vm.restore(capture)?;
        self.vm
            .reconfigure_snapshots(backend.snapshot_mode(), window.max(2))?;
        self.backend = backend;
        self.frame = frame;
        self.half_stepped = None;
        Ok(())
    }

    /// A full copy of the game's state (see [`Game::restart`]).
    pub fn capture(&self) -> luasnap_snap::Snapshot {
        self.vm.capture()
    }

    /// Simulates one frame: `G.step(inputs)` with one input per player (see [`GameInput`]:
    /// `u8` reaches Lua as an integer, serde types as tables, [`PodInput`] as userdata).
    pub fn step(&mut self, inputs: &[I]) -> Result<(), GameError>
    where
        I: GameInput,
    {
        let activity = self.activity.clone();
        as_work(activity.as_ref(), Work::Step, || self.step_inner(inputs))
    }

    fn step_inner(&mut self, inputs: &[I]) -> Result<(), GameError>
    where
        I: GameInput,
    {
        if inputs.len() != self.players {
            return Err(GameError::Config(format!(
                "{} inputs for {} players at frame {}; give one input per player",
                inputs.len(),
                self.players,
                self.frame
            )));
        }
        let t = Table::from_array(
            inputs
                .iter()
                .map(GameInput::to_lua)
                .collect::<Result<Vec<_>, _>>()?,
        );
        self.refuse_half_step("G.step")?;
        let args = [Value::Table(t)];
        if let Err(e) = self.run_step(&args) {
            self.half_stepped = Some(self.frame);
            return Err(e);
        }
        self.frame += 1;
        Ok(())
    }

    /// `G.step` with its arguments, then the frame's collection point if it is one.
    fn run_step(&mut self, args: &[Value]) -> Result<(), GameError> {
        let point = match self.step_budget {
            Some(budget) => self
                .vm
                .call_with_budget::<Value>("luasnap_step", args, budget),
            None => self.vm.call::<Value>("luasnap_step", args),
        }
        .map_err(|source| self.script_error(source))?;
        if point == Value::Boolean(true) {
            // A collection point (`GameConfig::collect_every`): by frame number, so every
            // process, every re-simulation and every continued game clears weak entries and
            // calls finalizers at the same frames. Its finalizers run under a budget of the
            // step's size.
            match self.step_budget {
                Some(budget) => self.vm.gc_collect_with_budget(budget),
                None => self.vm.gc_collect(),
            }
            .map_err(|source| self.script_error(source))?;
        }
        Ok(())
    }

    /// Refuses `operation` on a state a failed `G.step` left half-way.
    fn refuse_half_step(&self, operation: &'static str) -> Result<(), GameError> {
        match self.half_stepped {
            Some(frame) => Err(GameError::HalfStepped { frame, operation }),
            None => Ok(()),
        }
    }

    /// The frame whose `G.step` failed, while the state it left half-way is loaded: stepping
    /// and saving are refused until a save is loaded ([`GameError::HalfStepped`]).
    pub fn half_stepped(&self) -> Option<u64> {
        self.half_stepped
    }

    /// The error for a failure of the game's code at the current frame.
    fn script_error(&self, source: VmError) -> GameError {
        match source {
            VmError::Lua {
                kind: crate::bridge::error::LuaErrorKind::Memory,
                ..
            } => GameError::OutOfMemory {
                frame: self.frame,
                run: self.backend.name().into(),
                heap_bytes: self.vm.lua_memory(),
                capacity: self.capacity,
            },
            VmError::InstructionBudget {
                budget,
                location,
                traceback,
            } => GameError::StepBudget {
                frame: self.frame,
                budget,
                location,
                traceback,
            },
            error => GameError::Script {
                frame: self.frame,
                error,
            },
        }
    }

    /// Saves the current state with this game's backend.
    pub fn save(&mut self) -> Result<SaveHandle, GameError> {
        self.refuse_half_step("a save")?;
        let activity = self.activity.clone();
        as_work(activity.as_ref(), Work::Save, || self.save_inner())
    }

    fn save_inner(&mut self) -> Result<SaveHandle, GameError> {
        match self.backend {
            Backend::Serialize => self.save_game().map(SaveHandle::Bytes),
            _ => self
                .vm
                .snapshot()
                .map(SaveHandle::Snapshot)
                .map_err(|e| self.memory_failure(e.into())),
        }
    }

    /// A save or a load that ran out of the arena is [`GameError::OutOfMemory`], naming the
    /// frame and the run, like a `G.step` that does.
    fn memory_failure(&self, e: GameError) -> GameError {
        if out_of_memory(&e) {
            GameError::OutOfMemory {
                frame: self.frame,
                run: self.backend.name().into(),
                heap_bytes: self.vm.lua_memory(),
                capacity: self.capacity,
            }
        } else {
            e
        }
    }

    /// Restores a state saved with [`Game::save`] at `frame`. The state knows its frame: a
    /// handle saved at another frame is restored all the same, the game's frame becomes the
    /// handle's, and the call returns [`GameError::Config`] naming both.
    pub fn load(&mut self, handle: &SaveHandle, frame: u64) -> Result<(), GameError> {
        let activity = self.activity.clone();
        as_work(activity.as_ref(), Work::Load, || {
            self.load_inner(handle, frame)
        })
    }

    fn load_inner(&mut self, handle: &SaveHandle, frame: u64) -> Result<(), GameError> {
        match handle {
            SaveHandle::Snapshot(id) => self.vm.rollback(*id)?,
            SaveHandle::Bytes(b) => {
                self.vm
                    .load_game(b, crate::persist::Trust::Own)
                    .map_err(|e| self.memory_failure(e.into()))?;
                // The replaced state is garbage now, a whole heap of it: collected here, or
                // loads pile it up (Arena Brawl: a 153 MB arena extent after 16 loads of a
                // 9.5 MiB heap, 24 MB with this; later saves run faster too). Settled as after
                // any load (`Game::from_save`), or the next frames run under major collections.
                self.vm.gc_collect_settled()?;
            }
        }
        // A whole saved state replaced what a failed G.step left.
        self.half_stepped = None;
        let saved = accessing(
            &self.vm,
            self.step_budget,
            "the global luasnap_frame",
            || self.vm.get::<Value>("luasnap_frame"),
        )?
        .as_integer();
        self.frame = saved.map_or(frame, |f| f as u64);
        if self.frame != frame {
            return Err(GameError::Config(format!(
                "Game::load was told frame {frame}, but the handle holds the state of frame {}: the game is at frame {} now (keep each handle with the frame Game::save was called at)",
                self.frame, self.frame
            )));
        }
        Ok(())
    }

    /// A save-game of the current state (whatever the backend). The `__persist` functions
    /// it calls run under the step budget ([`GameCall::Save`]).
    pub fn save_game(&self) -> Result<Vec<u8>, GameError> {
        self.refuse_half_step("a save-game")?;
        // A Lua error is taken out of the save's error, so that a spent budget keeps its
        // traceback.
        let saved = as_work(self.activity.as_ref(), Work::Save, || {
            within(&self.vm, self.step_budget, || match self.vm.save_game() {
                Err(SaveError::Lua(e)) => Err(e),
                other => Ok(other),
            })
        });
        match saved {
            Ok(saved) => saved.map_err(|e| self.memory_failure(e.into())),
            Err(e) => Err(GameCall::Save(self.frame)
                .over_budget(e)
                .unwrap_or_else(|e| self.memory_failure(SaveError::Lua(e).into()))),
        }
    }

    /// Frames simulated since `G.init`.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// Number of players.
    pub fn players(&self) -> usize {
        self.players
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The arena digest (byte-level; comparable between VMs at the same base address).
    pub fn arena_digest(&self) -> u64 {
        self.vm.digest()
    }

    /// The value digest (address-independent).
    pub fn value_digest(&mut self) -> Result<u64, GameError> {
        as_work(self.activity.as_ref(), Work::Digest, || {
            self.vm.value_digest()
        })
        .map_err(|e| self.memory_failure(e.into()))
    }

    /// `G.digest()`, if the game defines it: an integer as is, a string (a hex checksum, a
    /// summary) hashed to an integer (xxh3 of its bytes). Any other result is an error.
    pub fn game_digest(&self) -> Result<Option<i64>, GameError> {
        if !self.has_digest {
            return Ok(None);
        }
        let identities = self.vm.key_identities();
        let v = self
            .vm
            .refusing_collections(|| {
                as_work(self.activity.as_ref(), Work::Digest, || {
                    within(&self.vm, self.step_budget, || {
                        self.vm.call::<Value>("luasnap_game.digest", ())
                    })
                })
            })
            .map_err(|error| {
                GameCall::Digest(self.frame)
                    .over_budget(error)
                    .unwrap_or_else(|error| GameError::DigestFailed {
                        frame: self.frame,
                        error,
                    })
            })?;
        let given = self.vm.key_identities().wrapping_sub(identities);
        if given != 0 {
            return Err(GameError::DigestKeyed {
                frame: self.frame,
                objects: u32::try_from(given).unwrap_or(u32::MAX),
            });
        }
        match v {
            Value::Integer(i) => Ok(Some(i)),
            Value::String(s) => Ok(Some(xxhash_rust::xxh3::xxh3_64(&s) as i64)),
            other => Err(GameError::Digest {
                frame: self.frame,
                returned: describe_lua_value(&other),
            }),
        }
    }

    /// The VM (statistics, snapshots).
    pub fn vm(&self) -> &Vm {
        &self.vm
    }
}

/// A value as a Lua programmer would name it in a message: `nil`, `the float 0.5`,
/// `a table`, `the string "abc"`.
pub(crate) fn describe_lua_value(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Number(f) => format!("the float {}", lua_float(*f)),
        Value::String(s) => {
            let text = String::from_utf8_lossy(&s[..s.len().min(40)]).into_owned();
            let more = if s.len() > 40 { "..." } else { "" };
            format!("the string {text:?}{more}")
        }
        Value::Table(_) => "a table".into(),
        Value::UserData(_) => "a userdata".into(),
        Value::Opaque(t) => format!("a {t}"),
    }
}

/// A float as Lua's `tostring` writes it (`%.14g`, with `.0` on integral values).
fn lua_float(f: f64) -> String {
    if f.is_nan() {
        return if f.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f.fract() == 0.0 && f.abs() < 1e15 {
        return format!("{f:.1}");
    }
    let s = format!("{f}");
    if s.len() > 17 {
        format!("{f:.14e}")
    } else {
        s
    }
}

/// Turns "address in use" at a game's fixed base address into advice: a second game in the
/// process needs `base_address: None`.
fn explain_base_in_use(e: GameError) -> GameError {
    match e {
        GameError::Vm(VmError::Arena(luasnap_alloc::ArenaError::AddressInUse { address, .. })) => {
            GameError::Config(format!(
                "the game's arena base address {address:#x} (GameConfig::base_address, fixed by default_game so that runs lay out memory identically) is already in use in this process, by another live Game or Vm; set `base_address: None` in the GameConfig to let the OS choose (needed for a second game in one process, e.g. Game::from_save while the first game lives), or drop the other game first"
            ))
        }
        e => e,
    }
}

/// Each player's input: a pure function of (seed, frame, player) that holds a value for a
/// while and then changes (every 4 to 19 frames, per player).
pub fn scripted_input(seed: u64, frame: u64, player: usize) -> u8 {
    let mix = |mut x: u64| {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    };
    let p = player as u64;
    let hold = 4 + mix(seed ^ (p << 32) ^ 0xA5A5) % 16;
    (mix(seed.wrapping_mul(31) ^ (p << 40) ^ (frame / hold)) & 0x1f) as u8
}

/// Durations of saves, loads, steps and rollbacks, for reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timings {
    /// Each save.
    pub(crate) saves: Vec<Duration>,
    /// Each load.
    pub(crate) loads: Vec<Duration>,
    /// Each `G.step` (re-simulated frames included) with the frame it simulated, as the game
    /// saw it: with the write faults of page tracking, which incremental snapshots cost
    /// inside the step.
    pub(crate) steps: Vec<(u64, Duration)>,
    /// Each rollback's overhead: its load plus the saves of the frames re-simulated.
    pub(crate) rollback_overheads: Vec<Duration>,
    /// For each rollback, the range of [`Timings::steps`] that re-simulated its frames.
    pub(crate) rollback_steps: Vec<std::ops::Range<usize>>,
    /// The clock all of these read.
    pub(crate) clock: Clock,
}

impl Timings {
    /// Records a rollback's overhead: the loads, saves and steps timed since there were
    /// `loads_before` loads, `saves_before` saves and `steps_before` steps.
    fn close_rollback(&mut self, loads_before: usize, saves_before: usize, steps_before: usize) {
        let overhead = self.loads[loads_before..]
            .iter()
            .chain(&self.saves[saves_before..])
            .sum();
        self.rollback_overheads.push(overhead);
        self.rollback_steps.push(steps_before..self.steps.len());
    }

    /// Runs and times the step of `frame`.
    fn step<T>(&mut self, frame: u64, f: impl FnOnce() -> T) -> T {
        let (r, took) = self.clock.time(f);
        self.steps.push((frame, took));
        r
    }

    /// Runs and times a save.
    fn save<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (r, took) = self.clock.time(f);
        self.saves.push(took);
        r
    }

    /// Runs and times a load.
    fn load<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (r, took) = self.clock.time(f);
        self.loads.push(took);
        r
    }
}

/// The `q`-quantile (0..=1) of durations, in microseconds.
pub(crate) fn quantile_us(d: &[Duration], q: f64) -> f64 {
    if d.is_empty() {
        return 0.0;
    }
    let mut v: Vec<f64> = d.iter().map(|x| x.as_secs_f64() * 1e6).collect();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The GGPO model: a state saved within a window; a misprediction loads the frame of the
/// first wrong prediction (or, when [`Saving`] skipped it, the newest save before it) and
/// re-simulates from there. Inputs are any [`GameInput`] (`u8` by default), as for
/// [`Game::step`].
pub struct FrameSession<I: GameInput = u8> {
    game: Game<I>,
    window: usize,
    saving: Saving,
    /// Inputs of frames up to this one are final ([`FrameSession::confirm`]).
    confirmed: Option<u64>,
    saves: VecDeque<(u64, SaveHandle)>,
    in_rollback: bool,
    /// The inputs each frame since the oldest save ran with (sparse saving re-simulates the
    /// frames between a save and the frame a rollback asks for with them).
    stepped: VecDeque<(u64, Vec<I>)>,
    /// Rollbacks done.
    pub rollbacks: u64,
    /// Frames simulated again after rollbacks.
    pub resimulated: u64,
    /// Durations.
    pub(crate) timings: Timings,
}

impl<I: GameInput> FrameSession<I> {
    /// A session over a game that saves every frame; `window` frames are kept (at least 1, at
    /// most the game's snapshot window on the arena backends: see [`FrameSession::with_saving`]).
    pub fn new(game: Game<I>, window: usize) -> FrameSession<I> {
        FrameSession::with_saving(game, window, Saving::EveryFrame)
    }

    /// A session over a game saving as `saving` says; at most `window` saves are kept (at
    /// least 1, and on the arena backends at most the game's snapshot window,
    /// [`GameConfig::window`], whose snapshots they are), and with [`Saving::Sparse`] a frame
    /// is saved when the newest save is `window` frames old.
    pub fn with_saving(game: Game<I>, window: usize, saving: Saving) -> FrameSession<I> {
        let most = match game.backend() {
            Backend::Serialize => usize::MAX,
            _ => game.vm().snapshots().window(),
        };
        FrameSession {
            game,
            window: window.clamp(1, most.max(1)),
            saving,
            confirmed: None,
            saves: VecDeque::new(),
            in_rollback: false,
            stepped: VecDeque::new(),
            rollbacks: 0,
            resimulated: 0,
            timings: Timings::default(),
        }
    }

    /// Which frames this session saves.
    pub fn saving(&self) -> Saving {
        self.saving
    }

    /// Times steps, saves and loads with `clock` from now on (default: the wall clock).
    pub fn set_clock(&mut self, clock: Clock) {
        self.timings.clock = clock;
    }

    /// The game.
    pub fn game(&self) -> &Game<I> {
        &self.game
    }

    /// The game, mutably (digests).
    pub fn game_mut(&mut self) -> &mut Game<I> {
        &mut self.game
    }

    /// Saves taken so far (re-simulated frames' included).
    pub fn saves_taken(&self) -> usize {
        self.timings.saves.len()
    }

    /// The frames whose saved states are held, oldest first.
    pub fn saved_frames(&self) -> impl Iterator<Item = u64> + '_ {
        self.saves.iter().map(|(f, _)| *f)
    }

    /// Says that the inputs of every frame up to `frame` are final: with
    /// [`Saving::NewFrames`] and [`Saving::Sparse`] the state after it is the one a rollback
    /// saves. Call it when those inputs arrive, before the rollback they cause
    /// ([`FrameSession::rollback_and_resimulate`] then saves that state on its way). A frame
    /// before one already confirmed changes nothing.
    pub fn confirm(&mut self, frame: u64) {
        if self.confirmed.is_none_or(|c| frame > c) {
            self.confirmed = Some(frame);
        }
    }

    /// Saves the state at the current frame (before it is simulated), whatever the saving.
    pub fn save_frame(&mut self) -> Result<(), GameError> {
        let frame = self.game.frame();
        let game = &mut self.game;
        let h = self.timings.save(|| game.save())?;
        self.saves.retain(|(f, _)| *f < frame);
        self.saves.push_back((frame, h));
        while self.saves.len() > self.window {
            self.saves.pop_front();
        }
        let oldest = self.saves.front().map_or(frame, |(f, _)| *f);
        while self.stepped.front().is_some_and(|(f, _)| *f < oldest) {
            self.stepped.pop_front();
        }
        Ok(())
    }

    /// Whether the state at the current frame is one this session's saving keeps.
    fn wants_save(&self) -> bool {
        let frame = self.game.frame();
        match (self.saving, self.saves.back()) {
            (Saving::EveryFrame, _) | (_, None) => true,
            (Saving::NewFrames, Some(_)) if !self.in_rollback => true,
            (Saving::Sparse | Saving::NewFrames, Some((newest, _))) => {
                self.confirmed.is_some_and(|c| c + 1 == frame)
                    || newest + self.window as u64 <= frame
            }
        }
    }

    /// Loads the state saved at `frame` (it must be held: [`FrameSession::saved_frames`]).
    pub fn load_frame(&mut self, frame: u64) -> Result<(), GameError> {
        let Some(pos) = self.saves.iter().position(|(f, _)| *f == frame) else {
            return Err(GameError::Config(format!(
                "frame {frame} is not among the states this session holds ({}; its window keeps {}): raise the window (FrameSession's, and GameConfig::window, which bounds it on the arena backends) or roll back less far",
                self.held(),
                self.window
            )));
        };
        let handle = self.saves[pos].1.clone();
        let game = &mut self.game;
        self.timings.load(|| game.load(&handle, frame))?;
        self.saves.truncate(pos + 1);
        while self.stepped.back().is_some_and(|(f, _)| *f >= frame) {
            self.stepped.pop_back();
        }
        Ok(())
    }

    /// Saves (as the session's [`Saving`] says), then simulates one frame.
    ///
    /// If `G.step` fails, the error is returned and the state the frame left half-way is
    /// replaced by the session's save of the frame when it holds one (so the game is at the
    /// start of the frame again, and a later rollback restores a clean state); without one
    /// (sparse saving), stepping and saving are refused until a rollback loads an earlier
    /// frame ([`GameError::HalfStepped`]).
    pub fn advance(&mut self, inputs: &[I]) -> Result<(), GameError> {
        if self.wants_save() {
            self.save_frame()?;
        }
        let frame = self.game.frame();
        let stepped = self.step(inputs);
        if stepped.is_err() && self.saves.back().is_some_and(|(f, _)| *f == frame) {
            self.load_frame(frame)?;
        }
        stepped
    }

    /// Steps the game, keeping the inputs when a rollback may replay them.
    fn step(&mut self, inputs: &[I]) -> Result<(), GameError> {
        let game = &mut self.game;
        let frame = game.frame();
        self.timings.step(frame, || game.step(inputs))?;
        if self.saving != Saving::EveryFrame {
            self.stepped.push_back((frame, inputs.to_vec()));
        }
        Ok(())
    }

    /// Rolls back to `frame` and re-simulates up to the current frame with `inputs_of(f)` for
    /// each frame `f` from `frame` on; records the rollback's overhead. With
    /// [`Saving::EveryFrame`] it loads `frame` and saves each re-simulated frame again;
    /// otherwise it loads the newest save at or before `frame`, re-simulates the frames
    /// before `frame` with the inputs they ran with, and saves only the state after the last
    /// confirmed frame ([`FrameSession::confirm`]).
    pub fn rollback_and_resimulate(
        &mut self,
        frame: u64,
        mut inputs_of: impl FnMut(u64) -> Vec<I>,
    ) -> Result<(), GameError> {
        let now = self.game.frame();
        let from = match self.saving {
            Saving::EveryFrame => frame,
            Saving::Sparse | Saving::NewFrames => self.newest_save_at_or_before(frame)?,
        };
        // Sparse saving re-simulates from an earlier save with the inputs recorded since.
        let replay: Vec<Vec<I>> = self
            .stepped
            .iter()
            .filter(|(f, _)| (from..frame).contains(f))
            .map(|(_, i)| i.clone())
            .collect();
        if replay.len() as u64 != frame - from {
            return Err(GameError::Config(format!(
                "frame {frame} cannot be re-simulated from the save of frame {from}: the inputs of the frames between were not kept (call rollback_and_resimulate only for frames this session stepped)"
            )));
        }
        let saves_before = self.timings.saves.len();
        let loads_before = self.timings.loads.len();
        let steps_before = self.timings.steps.len();
        self.load_frame(from)?;
        let mut replay = replay.into_iter();
        self.in_rollback = true;
        let r = (|| {
            for f in from..now {
                if f != from && self.wants_save() {
                    self.save_frame()?;
                }
                let inputs = match replay.next() {
                    Some(i) => i,
                    None => inputs_of(f),
                };
                self.step(&inputs)?;
            }
            Ok::<(), GameError>(())
        })();
        self.in_rollback = false;
        r?;
        self.rollbacks += 1;
        self.resimulated += now - from;
        self.timings
            .close_rollback(loads_before, saves_before, steps_before);
        Ok(())
    }

    /// The frames held, for messages: `frames 7..=9`, `frames 3, 9`, `none`.
    fn held(&self) -> String {
        let frames: Vec<u64> = self.saved_frames().collect();
        match frames.as_slice() {
            [] => "none".into(),
            [a, .., b] if frames.windows(2).all(|w| w[1] == w[0] + 1) => {
                format!("frames {a}..={b}")
            }
            _ => format!(
                "frames {}",
                frames
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The newest saved frame at or before `frame`.
    fn newest_save_at_or_before(&self, frame: u64) -> Result<u64, GameError> {
        self.saves
            .iter()
            .rev()
            .map(|(f, _)| *f)
            .find(|f| *f <= frame)
            .ok_or_else(|| {
                GameError::Config(format!(
                    "frame {frame} is before every state this session holds ({}; its window keeps {}): raise the window (FrameSession's, and GameConfig::window, which bounds it on the arena backends) or roll back less far",
                    self.held(),
                    self.window
                ))
            })
    }

    /// Bytes of saved state held: the snapshot ring's, or the save-games'.
    pub fn memory_bytes(&self) -> usize {
        match self.game.backend() {
            Backend::Serialize => self.saves.iter().map(|(_, h)| h.len()).sum(),
            _ => self.game.vm().snapshots().stats().memory_bytes(),
        }
    }

    /// Ends the session, returning the game.
    pub fn into_game(self) -> Game<I> {
        self.game
    }
}

/// Predictive re-execution: a synchronous form (confirmed state, saved) and an asynchronous
/// form (the synchronous state plus the pending commands, what the player sees). Inputs are
/// any [`GameInput`] (`u8` by default), as for [`Game::step`].
pub struct PredictiveClient<I: GameInput = u8> {
    game: Game<I>,
    sync: Option<(u64, SaveHandle)>,
    pending: VecDeque<Vec<I>>,
    /// Times the client went back to its synchronous form.
    pub rollbacks: u64,
    /// Pending frames applied again after rollbacks.
    pub resimulated: u64,
    /// Durations.
    pub(crate) timings: Timings,
}

impl<I: GameInput> PredictiveClient<I> {
    /// A client whose synchronous form is the game's current state.
    pub fn new(game: Game<I>) -> Result<PredictiveClient<I>, GameError> {
        let mut c = PredictiveClient {
            game,
            sync: None,
            pending: VecDeque::new(),
            rollbacks: 0,
            resimulated: 0,
            timings: Timings::default(),
        };
        c.take_sync()?;
        Ok(c)
    }

    fn take_sync(&mut self) -> Result<(), GameError> {
        let game = &mut self.game;
        let h = self.timings.save(|| game.save())?;
        self.sync = Some((self.game.frame(), h));
        Ok(())
    }

    /// Applies a predicted (unacknowledged) frame on top of the current form.
    pub fn predict(&mut self, inputs: Vec<I>) -> Result<(), GameError> {
        let game = &mut self.game;
        self.timings.step(game.frame(), || game.step(&inputs))?;
        self.pending.push_back(inputs);
        Ok(())
    }

    /// The server confirmed the next frame's inputs: go back to the synchronous form, apply
    /// them, save the new synchronous form, and re-apply the predictions still pending (the
    /// confirmed frame's own prediction is dropped; the others are replaced by `repredict`).
    pub fn confirm(
        &mut self,
        inputs: &[I],
        repredict: impl FnMut(u64) -> Vec<I>,
    ) -> Result<(), GameError> {
        self.confirm_frames(
            std::slice::from_ref(&inputs.to_vec()),
            repredict,
            |_| Ok(()),
        )
    }

    /// The server confirmed the next `frames.len()` frames: one rollback for all of them. Goes
    /// back to the synchronous form, applies each confirmed frame, calling `at_sync` on the
    /// game after each (it is then the synchronous state of that frame: digests, a host's
    /// observers), saves the new synchronous form, and re-applies as many predictions as were
    /// pending beyond the confirmed frames, with `repredict(frame)`'s inputs (asked for
    /// before anything changes: a frame with the wrong number of inputs, confirmed or
    /// repredicted, is [`GameError::Config`] naming it, and the client keeps its state and
    /// its predictions).
    pub fn confirm_frames(
        &mut self,
        frames: &[Vec<I>],
        mut repredict: impl FnMut(u64) -> Vec<I>,
        mut at_sync: impl FnMut(&mut Game<I>) -> Result<(), GameError>,
    ) -> Result<(), GameError> {
        if frames.is_empty() {
            return Ok(());
        }
        let (sync_frame, handle) = self.sync.clone().expect("a synchronous form exists");
        // The predictions to re-apply, asked for and checked before anything changes: a
        // wrong one must not cost the client the predictions it had.
        let still_pending = self.pending.len().saturating_sub(frames.len()) as u64;
        let first = sync_frame + frames.len() as u64;
        let again: Vec<Vec<I>> = (0..still_pending).map(|i| repredict(first + i)).collect();
        let players = self.game.players();
        let mut checked = again
            .iter()
            .zip(first..)
            .chain(frames.iter().zip(sync_frame..));
        if let Some((inputs, frame)) = checked.find(|(i, _)| i.len() != players) {
            let what = if frame >= first {
                "repredict returned"
            } else {
                "the confirmed frames give"
            };
            return Err(GameError::Config(format!(
                "{what} {} inputs for frame {frame}, for {players} players: give one input per player (nothing was changed: the client still holds its {} predictions)",
                inputs.len(),
                self.pending.len()
            )));
        }
        let had_pending = !self.pending.is_empty();
        let loads_before = self.timings.loads.len();
        let saves_before = self.timings.saves.len();
        let steps_before = self.timings.steps.len();
        if had_pending {
            let game = &mut self.game;
            self.timings.load(|| game.load(&handle, sync_frame))?;
        }
        for inputs in frames {
            let game = &mut self.game;
            self.timings.step(game.frame(), || game.step(inputs))?;
            at_sync(&mut self.game)?;
        }
        self.take_sync()?;
        self.pending.clear();
        for inp in again {
            self.predict(inp)?;
        }
        if had_pending {
            self.rollbacks += 1;
            self.resimulated += self.pending.len() as u64;
            self.timings
                .close_rollback(loads_before, saves_before, steps_before);
        }
        Ok(())
    }

    /// The frame count of the synchronous form (frames confirmed).
    pub fn sync_frame(&self) -> u64 {
        self.sync.as_ref().map(|s| s.0).unwrap_or(0)
    }

    /// The game (in its asynchronous form).
    pub fn game(&self) -> &Game<I> {
        &self.game
    }

    /// The game, mutably.
    pub fn game_mut(&mut self) -> &mut Game<I> {
        &mut self.game
    }

    /// Frames predicted and not yet confirmed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// Whether `e` is Lua running out of the arena (a step's, a save's, a load's, the script's
/// or `G.init`'s allocation).
fn out_of_memory(e: &GameError) -> bool {
    use crate::bridge::error::LuaErrorKind::Memory;
    let memory = |v: &VmError| matches!(v, VmError::Lua { kind: Memory, .. });
    match e {
        GameError::Vm(v)
        | GameError::Init { error: v }
        | GameError::Save(SaveError::Lua(v))
        | GameError::Load(LoadError::Lua(v)) => memory(v),
        _ => false,
    }
}

/// What to do about [`GameError::OutOfMemory`], from how full the heap was.
fn oom_advice(heap_bytes: usize, capacity: usize, run: &str) -> String {
    let raise = "raise the limit (`luasnap simulate --memory-limit`, GameConfig::capacity)";
    if heap_bytes < capacity / 4 {
        // The heap was far from the arena's end: one request larger than what was left.
        format!("the heap was far from full, so one allocation asked for more than the rest of the arena (a `string.rep`, a table or a string built far bigger than meant?); if the game really needs it, {raise}")
    } else if run == "serialize" {
        format!("the serialize backend holds a loaded state beside the one it replaces until it collects it, so its arena needs room for about twice the game's heap (the arena modes do not); {raise}, else look for state that grows every frame")
    } else {
        format!("if the game needs more, {raise}, else look for state that grows every frame")
    }
}

impl Game {
    /// The Lua files of the game's folder ([`GameConfig::folder`]) as a load's
    /// [`LoadOptions::chunk_sources`](crate::persist::LoadOptions::chunk_sources): the load
    /// compiles those a save names, and nothing else is read. A name that is not a Lua file
    /// inside the folder (relative, no `.` or `..` part, no hidden part, at most 6 folders
    /// deep; a symbolic link counts as what it points to) finds nothing, so a hostile save naming
    /// `../../etc/passwd` or `/etc/passwd` reads nothing outside it; and at most 2000 names
    /// are looked up per load. `None` for a game without a folder.
    pub fn folder_chunks(cfg: &GameConfig) -> Option<crate::persist::ChunkSources> {
        folder_chunks(cfg)
    }
}

fn folder_chunks(cfg: &GameConfig) -> Option<crate::persist::ChunkSources> {
    use crate::bridge::modules::{chunk_in_folder, chunk_path_ok, FOLDER_FILES};
    let files = cfg.folder_files.clone();
    let dir = cfg.folder.clone();
    if files.is_none() && dir.is_none() {
        return None;
    }
    // What a load may look up on disk is bounded; a folder read whole is in memory.
    let whole = files.as_ref().is_some_and(|f| f.is_complete());
    let asked = std::sync::atomic::AtomicUsize::new(0);
    Some(crate::persist::ChunkSources::new(move |path| {
        let n = asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n >= FOLDER_FILES && !whole {
            return None;
        }
        match (&files, &dir) {
            // Read once for the run, inside the folder: by its exact path.
            (Some(files), _) => chunk_path_ok(path)
                .then(|| files.file(path).ok().flatten())
                .flatten(),
            (None, Some(dir)) => chunk_in_folder(dir, path),
            (None, None) => None,
        }
    }))
}
