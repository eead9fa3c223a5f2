//! Errors of snapshot and rollback.

use luasnap_alloc::{ArenaError, ArenaId, TrackError};

/// Why a snapshot or rollback was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapError {
    /// The snapshot (or ring) belongs to another arena.
    #[error("this snapshot was taken of {taken_of}, not of {given}; restore it into the arena that took it")]
    WrongArena {
        /// The arena the snapshot was taken of.
        taken_of: ArenaId,
        /// The arena passed in.
        given: ArenaId,
    },
    /// The snapshot id was issued by another ring.
    #[error("snapshot #{seq} belongs to another snapshot ring")]
    ForeignSnapshot {
        /// The id's sequence number.
        seq: u64,
    },
    /// A rollback to an older snapshot discarded this one.
    #[error(
        "snapshot #{seq} was invalidated by a rollback to an older snapshot; take a new snapshot"
    )]
    Invalidated {
        /// The id's sequence number.
        seq: u64,
    },
    /// The snapshot fell out of the retention window.
    #[error("snapshot #{seq} is older than the {window} retained snapshots; raise the window size if you need to go back further")]
    Evicted {
        /// The id's sequence number.
        seq: u64,
        /// The window size.
        window: usize,
    },
    /// Nothing to roll back to.
    #[error("no snapshot has been taken yet")]
    NoSnapshot,
    /// The configuration is unusable.
    #[error("invalid snapshot configuration: {0}")]
    Config(String),
    /// Page tracking failed mid-run. Nothing was changed; the ring has switched to full copies,
    /// so retrying the same call succeeds.
    #[error("page tracking failed ({error}); nothing was changed and the ring now uses full copies: retry the call")]
    TrackerLost {
        /// What failed (in the message, not also the error's `source()`: a report that walks
        /// the chain prints it once).
        error: TrackError,
    },
    /// A snapshot buffer could not be reserved.
    #[error("could not reserve a snapshot buffer: {0}")]
    Buffer(ArenaError),
}

impl From<ArenaError> for SnapError {
    fn from(e: ArenaError) -> SnapError {
        SnapError::Buffer(e)
    }
}
