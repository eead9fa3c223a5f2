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
