//! # luasnap-snap: snapshots of an arena
//!
//! Byte-level snapshot and rollback of a [`luasnap_alloc::Arena`]: copy its state ranges (the
//! allocator map and the used data pages) out, copy them back at the same addresses later, and
//! everything in the arena is exactly as it was. Nothing here knows about Lua.
//!
//! - [`Snapshot`]: one full copy; capture and restore each cost one memcpy of the used bytes.
//! - [`SnapshotRing`]: a window of the last N snapshots (default 8, the GGPO/GGRS prediction
//!   window) with rollback to any of them. In incremental mode it copies only the pages written
//!   since the previous snapshot, found by userfaultfd + `PAGEMAP_SCAN` (Linux 6.7+) or by
//!   mprotect, and falls back to full copies by itself when a frame writes too much or no
//!   tracker works. Memory: one base copy plus the changed pages.
//! - [`digest`]: a fast hash of the arena's state, for desync detection.
//!
//! Snapshots hold absolute addresses: they are only valid in the process and arena that took
//! them. Restoring into another arena is refused with [`SnapError::WrongArena`].
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

mod cost;
mod digest;
mod error;
mod ring;
mod snapshot;
mod whole;

pub use cost::{workload_fault_ns, CopyCosts};
pub use digest::digest;
pub use error::SnapError;
pub use ring::{
    CopyStrategy, RingConfig, RingStats, SnapshotId, SnapshotMode, SnapshotRing, DEFAULT_WINDOW,
};
pub use snapshot::Snapshot;

use luasnap_alloc::Arena;

/// Copies `src` into the arena at `offset`.
///
/// Every caller in this crate passes bytes captured from the same arena at the same offsets,
/// in combinations that reproduce a state the arena was in (see the ring's invariants), which
/// is what [`Arena::bytes_mut`] requires.
fn restore_bytes(arena: &mut Arena, offset: usize, src: &[u8]) {
    // SAFETY: see above: the bytes restore an earlier state of this same arena (the arena id is
    // checked by every public entry point before any restore).
    unsafe { arena.bytes_mut(offset..offset + src.len()) }.copy_from_slice(src);
}

/// Writes zeros over `range` of the arena: the bytes of pages that were a free run in the state
/// a restore reproduces (free runs are zero, see [`Arena::free_runs`]).
fn zero_bytes(arena: &mut Arena, range: std::ops::Range<usize>) {
    // SAFETY: as for `restore_bytes`: zero is what these bytes held in the earlier state of
    // this same arena that the caller restores.
    unsafe { arena.bytes_mut(range) }.fill(0);
}
