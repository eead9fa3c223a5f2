//! Errors of the VM and of natives. (The crate's umbrella `Error` is in `src/error.rs`,
//! above the layers whose errors it unites.)

use crate::bridge::value::Value;
use luasnap_alloc::ArenaError;
use luasnap_snap::SnapError;

/// What kind of Lua failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LuaErrorKind {
    /// A runtime error (`error(...)`, a type error, an error raised by a native).
    Runtime,
    /// The chunk did not compile.
    Syntax,
    /// The arena's limit was reached ("not enough memory").
    Memory,
    /// An error inside the error handler.
    Handler,
}

/// Why a VM operation failed. A Lua error leaves the VM usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum VmError {
    /// Lua code failed. The message is Lua's; the traceback, when there is one, says where.
    ///
    /// An error object that is not a string (`error({ code = 7 })`) arrives whole in `value`,
    /// and the message is its `__tostring` (as `lua` prints it) or else its contents written
    /// as Lua (`{code = 7}`):
    ///
    /// ```
    /// use luasnap_bridge::{Value, Vm, VmError};
    ///
    /// let vm = Vm::builder().capacity(64 << 20).build()?;
    /// match vm.exec("error({ code = 7 })", "shop") {
    ///     Err(VmError::Lua { message, value: Some(Value::Table(t)), .. }) => {
    ///         assert_eq!(message, "{code = 7}");
    ///         assert_eq!(t.get("code"), Some(&Value::Integer(7)));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), VmError>(())
    /// ```
    #[error("{message}{}", traceback.as_deref().map(|t| format!("\n{t}")).unwrap_or_default())]
    Lua {
        /// Which kind of failure.
        kind: LuaErrorKind,
        /// Lua's error message.
        message: String,
        /// `stack traceback:` and the frames, when available.
        traceback: Option<String>,
        /// The error object, copied out, when Lua raised something other than a string or a
        /// number (a table, a userdata); `None` for messages, and for an object that cannot be
        /// copied (a table that contains itself).
        value: Option<Value>,
    },
    /// Snapshot, rollback or native registration was attempted while Lua code is running
    /// (inside a native, a coroutine or a hook).
    #[error("cannot {operation} while Lua code is running; do it between calls into Lua")]
    LuaRunning {
        /// What was attempted.
        operation: &'static str,
    },
    /// Natives and userdata types must be registered before the first snapshot, so that every
    /// snapshot sees the same permanent table.
    #[error("cannot register '{name}' after the first snapshot; register natives and userdata types when building the VM")]
    RegistryClosed {
        /// The name being registered.
        name: String,
    },
    /// A native's path already holds a value (a standard library function, a global).
    #[error("cannot register native '{name}': that path already holds a {found} (a standard library function or a global); choose another name, or use VmBuilder::native_override to replace it on purpose")]
    NativeOverride {
        /// The path.
        name: String,
        /// The Lua type of the value there.
        found: String,
    },
    /// A native or userdata type with this name exists already.
    #[error("'{name}' is already registered; choose another name")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// The name is not a valid Lua identifier path.
    #[error("'{name}' is not a valid name: use identifiers separated by dots (like `game.step`)")]
    BadName {
        /// The name.
        name: String,
    },
    /// A Rust value cannot be turned into a Lua value or back.
    #[error("cannot convert {what}")]
    Conversion {
        /// What and why.
        what: String,
    },
    /// A global or path does not hold what was expected.
    #[error("'{path}' is {found}, not a {expected}")]
    NotFound {
        /// The path looked up.
        path: String,
        /// What was expected there.
        expected: &'static str,
        /// Lua's type name of what was found.
        found: String,
    },
    /// The arena could not be created or reconfigured.
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// Snapshot or rollback was refused.
    #[error(transparent)]
    Snapshot(#[from] SnapError),
    /// A value read from Lua does not fit the Rust type asked for (a float into `u8`, a string
    /// into `i32`, a missing field of a struct).
    #[error("'{path}' is {found}, expected {expected}{}; read it as a type that fits (or `Value` to see what is there)", reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Type {
        /// Where the value was read: the path given, or `result #n` / `argument #n`, followed by
        /// the position inside it (`cfg.tags[2]`).
        path: String,
        /// The Rust-side type expected.
        expected: String,
        /// What was found (Lua's type name, with the value when it is short).
        found: String,
        /// Why it does not fit, when the type alone does not say (out of range, not UTF-8).
        reason: Option<String>,
    },
    /// A path does not parse; `at` is the character (from 0) where parsing stopped.
    #[error("cannot parse path '{path}' at character {at}: {message}\n  {path}\n  {caret}^; write paths like `world.players[1].hp` or `cfg[\"key with space\"]`", caret = " ".repeat(*at))]
    BadPath {
        /// The path.
        path: String,
        /// Character index (from 0) of the problem.
        at: usize,
        /// What is wrong there.
        message: String,
    },
    /// A handle from one VM was passed to another.
    #[error("a handle from another VM was passed to this one; copy the value out (`Value`) and pass that")]
    ForeignHandle,
    /// A userdata type's metamethod would be replaced by the one luasnap installs.
    #[error("userdata type '{name}': {message}")]
    UserDataConflict {
        /// The type name.
        name: &'static str,
        /// Which metamethod conflicts and what to do.
        message: String,
    },
    /// A coroutine cannot be resumed (it is dead, or running).
    #[error("cannot resume the coroutine: it is {status}")]
    NotResumable {
        /// `dead`, `running` or `normal`.
        status: &'static str,
    },
    /// A call under an instruction budget ([`Vm::call_with_budget`](crate::Vm::call_with_budget))
    /// ran more Lua instructions than it allows and was stopped (an endless loop, or more work
    /// than the budget was chosen for). The VM stays usable; the state is what the call left
    /// half-way, so roll back to a snapshot taken before it.
    #[error("stopped after {budget} Lua instructions (the call's instruction budget){}: an endless loop, or more work than the budget allows{}", location.as_deref().map(|l| format!(" at {l}")).unwrap_or_default(), traceback.as_deref().map(|t| format!("\n{t}")).unwrap_or_default())]
    InstructionBudget {
        /// The budget, in Lua VM instructions.
        budget: u64,
        /// Where the budget ran out (`chunk:line`): in the loop, even when a `pcall` caught
        /// the first error and the traceback shows a later one.
        location: Option<String>,
        /// Where it was stopped: `stack traceback:` and the frames.
        traceback: Option<String>,
    },
    /// The graph of values a comparison or digest extracts
    /// ([`Vm::value_graph_within`](crate::Vm::value_graph_within), `luasnap diff`) would hold
    /// more than its memory limit.
    #[error("the state's values take more than {limit} bytes to compare ({objects} objects read so far); raise the limit (`luasnap diff --max-memory`, Vm::value_graph_within) if the machine has the memory")]
    ValueGraphTooLarge {
        /// The limit, in bytes.
        limit: usize,
        /// The objects read when it was reached.
        objects: usize,
    },
    /// A userdata type cannot be stored inline.
    #[error("userdata type '{name}' needs alignment {align}, above the 8 bytes Lua guarantees")]
    UserDataAlignment {
        /// The type name.
        name: &'static str,
        /// Its alignment.
        align: usize,
    },
}

impl VmError {
    /// Whether this is Lua's out-of-memory error (the arena's limit was reached).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            VmError::Lua {
                kind: LuaErrorKind::Memory,
                ..
            }
        )
    }
}

/// An error returned by a native; it becomes a Lua error whose message is
/// `"<native name>: <message>"`, catchable with `pcall`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeError(pub String);

impl NativeError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> NativeError {
        NativeError(message.into())
    }
}

impl std::fmt::Display for NativeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for NativeError {
    fn from(e: E) -> NativeError {
        NativeError(e.to_string())
    }
}

/// Names the deterministic profile leaves out.
const LEFT_OUT: [&str; 5] = ["os", "io", "package", "dofile", "loadfile"];

/// The `debug` library's functions other than `traceback`, which the deterministic profile
/// leaves out of its `debug` table.
const DEBUG_LEFT_OUT: [&str; 15] = [
    "debug",
    "gethook",
    "getinfo",
    "getlocal",
    "getmetatable",
    "getregistry",
    "getupvalue",
    "getuservalue",
    "sethook",
    "setlocal",
    "setmetatable",
    "setupvalue",
    "setuservalue",
    "upvalueid",
    "upvaluejoin",
];

/// Marks a message already explained by [`explain_left_out`].
pub(crate) const LEFT_OUT_MARK: &str = "is left out of the deterministic profile";

/// Adds to a Lua error about a nil global the deterministic profile leaves out (`os`, `io`,
/// ...) or a nil field that may be a left-out `debug` function, why it is nil, instead of the
/// bare "attempt to index a nil value (global 'os')".
pub(crate) fn explain_left_out(message: String) -> String {
    if message.contains(LEFT_OUT_MARK) {
        return message;
    }
    let missing = LEFT_OUT.iter().find(|n| {
        message.contains(&format!("(global '{n}')")) || message.contains(&format!("(field '{n}')"))
    });
    let debug_fn = DEBUG_LEFT_OUT
        .iter()
        .find(|n| message.contains(&format!("(field '{n}')")));
    let note = match (missing, debug_fn) {
        (Some(n), _) => format!(
            " ('{n}' {LEFT_OUT_MARK} this VM was built with: no io, os, package, dofile or loadfile (require loads only the game's own modules), and of debug only debug.traceback, so a script cannot read the clock, files or the environment; use the seed and math.random instead of os.time and keep state in Lua values, or use the full standard library: luasnap run without --deterministic, or in Rust a VM built without .deterministic(seed); a game under luasnap simulate always runs deterministic)"
        ),
        // A nil field of some table: say so only if it may be the debug library's.
        (None, Some(n)) if message.contains("nil value") => format!(
            " (if this is debug.{n}: it {LEFT_OUT_MARK} this VM was built with, whose debug table has only debug.traceback, since the rest reads and writes locals, upvalues, hooks and the registry; luasnap run without --deterministic, or in Rust a VM built without .deterministic(seed), has the whole library)"
        ),
        _ => String::new(),
    };
    if note.is_empty() {
        return message;
    }
    // Before a traceback that the message carries, right after the message itself.
    match message.find("\nstack traceback:") {
        Some(at) => format!("{}{note}{}", &message[..at], &message[at..]),
        None => format!("{message}{note}"),
    }
}

/// Adds to Lua's "attempt to index a nil value (global 'host')" that no native is registered
/// under `host.` and how to register one, unless `registered("host")` (a native of that
/// namespace exists, so the script itself changed the global) or the global is one the
/// deterministic profile leaves out ([`explain_left_out`] says why).
pub(crate) fn explain_missing_native(message: String, registered: impl Fn(&str) -> bool) -> String {
    const INDEX_NIL: &str = "attempt to index a nil value (global '";
    let head = message.split("\nstack traceback:").next().unwrap_or("");
    let Some(name) = head
        .find(INDEX_NIL)
        .and_then(|at| head[at + INDEX_NIL.len()..].split('\'').next())
    else {
        return message;
    };
    if name.is_empty() || LEFT_OUT.contains(&name) || registered(name) {
        return message;
    }
    let note = format!(
        " (no native named '{name}.…' is registered in this VM: if '{name}' is the host's namespace, register its functions before the VM is built, with VmBuilder::native(\"{name}.<function>\", |call| ...), for a game in GameConfig::setup: VmSetup::new(|b| b.native(\"{name}.<function>\", ...)))"
    );
    match message.find("\nstack traceback:") {
        Some(at) => format!("{}{note}{}", &message[..at], &message[at..]),
        None => format!("{message}{note}"),
    }
}
