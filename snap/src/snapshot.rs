//! A single full snapshot of an arena.

use crate::{restore_bytes, SnapError};
use luasnap_alloc::{copy_streaming, Arena, ArenaId, StateRanges};
use xxhash_rust::xxh3::Xxh3;

/// A full copy of an arena's state: its allocator map and every used range.
///
/// [`capture_from`](Snapshot::capture_from) reuses the buffer, so a snapshot retaken every frame
/// costs one memcpy and no page faults. For a window of snapshots with incremental copies, use
/// [`SnapshotRing`](crate::SnapshotRing).
///
/// ```
/// use luasnap_alloc::Arena;
/// use luasnap_snap::{digest, Snapshot};
///
/// let mut arena = Arena::new(16 << 20)?;
/// let a = arena.alloc(100).unwrap();
/// let snap = Snapshot::capture(&arena);
/// let before = digest(&arena);
/// let _b = arena.alloc(5000).unwrap();
/// snap.restore(&mut arena)?;
/// assert_eq!(digest(&arena), before);
/// # let _ = a;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Snapshot {
    arena: ArenaId,
    ranges: StateRanges,
    bytes: Vec<u8>,
}

impl Snapshot {
    /// Copies the arena's state.
    pub fn capture(arena: &Arena) -> Snapshot {
        let mut s = Snapshot {
            arena: arena.id(),
            ranges: arena.state_ranges(),
            bytes: Vec::new(),
        };
        s.capture_from(arena);
        s
    }

    /// Recaptures into this snapshot's buffer (growing it only if the arena grew).
    pub fn capture_from(&mut self, arena: &Arena) {
        self.arena = arena.id();
        self.ranges = arena.state_ranges();
        let total = self.ranges.total();
        if self.bytes.len() < total {
            self.bytes.resize(total, 0);
        } else {
            self.bytes.truncate(total);
        }
        let mut at = 0;
        for r in self.ranges.iter() {
            let n = r.len();
            copy_streaming(&mut self.bytes[at..at + n], arena.bytes(r));
            at += n;
        }
    }

    /// Copies the state back; afterwards the arena's bytes and digest equal those at capture.
    pub fn restore(&self, arena: &mut Arena) -> Result<(), SnapError> {
        if arena.id() != self.arena {
            return Err(SnapError::WrongArena {
                taken_of: self.arena,
                given: arena.id(),
            });
        }
        let mut at = 0;
        for r in self.ranges.iter() {
            let n = r.len();
            restore_bytes(arena, r.start, &self.bytes[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the snapshot holds no bytes (never true for a captured arena).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The arena this snapshot was taken of.
    pub fn arena(&self) -> ArenaId {
        self.arena
    }

    /// The digest the arena had when this snapshot was taken (equal to [`crate::digest`] of it).
    pub fn digest(&self) -> u64 {
        let mut h = Xxh3::new();
        let mut at = 0;
        for r in self.ranges.iter() {
            h.update(&(r.start as u64).to_le_bytes());
            h.update(&(r.len() as u64).to_le_bytes());
            h.update(&self.bytes[at..at + r.len()]);
            at += r.len();
        }
        h.digest()
    }
}
