//! Why a save or a load failed.

use super::format;
use crate::bridge::error::VmError;

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
    /// The save is well-formed, but holds something this load does not accept under its
    /// options (a denied permanent, a function this version lacks under foreign trust);
    /// `accept` says what would accept it.
    #[error("cannot load: {message}; {accept}")]
    Refused {
        /// What is refused, and where in the body.
        message: String,
        /// What would accept it.
        accept: Accept,
    },
    /// The load needed more memory than it may take: the heap grew past the load's cap
    /// ([`LoadOptions::max_heap_growth`](super::LoadOptions::max_heap_growth)). The save may
    /// be sound; a larger cap is what to try.
    #[error("cannot load: the save-game needs more memory than the load may take (its heap-growth cap, LoadOptions::max_heap_growth, is {cap} bytes); raise the cap if the machine has the memory (the load stopped with: {message})")]
    NeedsMoreMemory {
        /// The cap, in bytes the heap may grow by.
        cap: usize,
        /// What stopped the load, where (as Lua or the reader said it).
        message: String,
    },
    /// Lua code run while loading failed (or used up the instruction budget, or memory).
    #[error(transparent)]
    Lua(VmError),
}

/// The most names of refused permanents one load's error lists ([`Accept::Permanents`]).
pub const REFUSED_NAMES: usize = 32;

/// The names of [`Accept::Permanents`] as a Lua list: `"a", "b"`.
fn name_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What accepts a save a load refused ([`LoadError::Refused`]), so each interface can say it
/// in its own words: an option in Rust, a flag on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Accept {
    /// Trusting the file as one's own ([`Trust::Own`](super::Trust::Own); `--trust own`).
    TrustOwn,
    /// Accepting the permanent of this name: the game declares it (`G.permanents`,
    /// `GameConfig::permanents`), or the load allows it
    /// ([`LoadOptions::allowed_permanents`](super::LoadOptions::allowed_permanents); `--allow-permanent NAME`).
    Permanent(String),
    /// Accepting the permanents of these names, as [`Accept::Permanent`] does one: a load
    /// that refuses more than one names each (the first [`REFUSED_NAMES`] met), and `more`
    /// says how many others it refused besides.
    Permanents {
        /// The names, in the order the load met them.
        names: Vec<String>,
        /// How many more it refused (named by a load once these are accepted).
        more: usize,
    },
    /// Declaring what became of the function at this saved place, which this version no
    /// longer has: its new place if it was renamed (`G.renamed`), its replacement if it was
    /// removed (`G.removed`; [`LoadOptions::renames`](super::LoadOptions::renames)); or
    /// trusting the file, which then keeps its saved code ([`Trust::Own`](super::Trust::Own);
    /// `--trust own`).
    Rename(String),
}

impl Accept {
    /// For [`Accept::Rename`]: the declarations that would accept the saved function at
    /// `place`, in the game's words.
    pub fn rename_declarations(place: &str) -> String {
        format!(
            "if it was renamed, declare its new name in the game (G.renamed = {{ [{place:?}] = \"its name now\" }}), or if it was removed, the function of this version that replaces it (G.removed = {{ [{place:?}] = \"its replacement\" }})"
        )
    }
}

impl Accept {
    /// In the words of the `eris` module (`eris.unpersist`).
    pub(super) fn lua(&self) -> String {
        match self {
            Accept::TrustOwn => {
                "if you trust the file, load it as your own (eris.settings(\"trust\", \"own\"))".into()
            }
            Accept::Permanent(name) => format!(
                "if the file is trusted, load it as your own (eris.settings(\"trust\", \"own\")), or name {name:?} in the perms table you pass"
            ),
            Accept::Permanents { names, .. } => format!(
                "if the file is trusted, load it as your own (eris.settings(\"trust\", \"own\")), or name {} in the perms table you pass",
                name_list(names)
            ),
            Accept::Rename(_) => {
                "if you trust the file, load it as your own (eris.settings(\"trust\", \"own\"))".into()
            }
        }
    }
}

impl std::fmt::Display for Accept {
    /// In the Rust API's words.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Accept::TrustOwn => f.write_str("if you trust the file, load it as your own (Trust::Own)"),
            Accept::Permanent(name) => write!(
                f,
                "if the game's state holds it on purpose, declare it in the game (G.permanents = {{ {name:?} }} in the script's G, or GameConfig::permanents), or allow it for this load (LoadOptions::allowed_permanents)"
            ),
            Accept::Permanents { names, more } => {
                write!(
                    f,
                    "if the game's state holds them on purpose, declare them in the game (G.permanents = {{ {} }} in the script's G, or GameConfig::permanents), or allow them for this load (LoadOptions::allowed_permanents)",
                    name_list(names)
                )?;
                if *more > 0 {
                    write!(f, "; the next load names the {more} more")?;
                }
                Ok(())
            }
            Accept::Rename(place) => write!(
                f,
                "{} in the script's G, or LoadOptions::renames; or if you trust the file, load it as your own (Trust::Own: its saved code is kept)",
                Accept::rename_declarations(place)
            ),
        }
    }
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
