//! A window of retained snapshots with incremental copies.
//!
//! # How it works
//!
//! The ring keeps a *mirror*: a copy of the arena as it was at the latest snapshot, in a buffer
//! as large as the arena's reservation but committed only where written. Each older retained
//! snapshot `S_i` keeps an *undo record*: the contents, as of `S_i`, of the pages that changed
//! between `S_i` and `S_{i+1}`. Memory is one base copy plus the changed pages.
//!
//! Invariant (while tracking is armed): for every page `p` in the tracked extent, either the
//! tracker reports `p` as written since the latest snapshot, or `mirror[p] == arena[p]`.
//! Without armed tracking, every page counts as written.
//!
//! - **Snapshot** `S_{n+1}`: collect the written pages `D`; for each run of `D`, append
//!   `mirror[run]` to `S_n`'s undo record, then copy `arena[run]` into the mirror. When `D` is
//!   larger than the break-even fraction (the tracker's, or [`RingConfig::full_copy_above`]),
//!   copying page by page costs more than one contiguous copy: the whole extent is copied into
//!   a fresh mirror and the old mirror becomes `S_n`'s (full) undo record. Tracking goes on
//!   after one such snapshot (a full collection, a level load among light frames); after two
//!   in a row it pauses for a few snapshots (its fault cost would be wasted too), then resumes.
//! - **Rollback** to `S_k`: if one of the undo records `k..n` is a full record, start from the
//!   oldest such one and apply the page records older than it. Otherwise restore each page
//!   once: from the oldest of the records `k..n` that holds it (its contents at `S_k`), else,
//!   for pages only in `D`, from the mirror; pages outside `S_k`'s extent are skipped. The
//!   mirror gets the records' pages too. Snapshots newer than `S_k` are invalidated; their ids
//!   give [`SnapError::Invalidated`].
//!
//! The extent grows with the arena; pages newly inside it count as written. After a rollback it
//! shrinks back to the snapshot's.

use crate::{restore_bytes, SnapError};
use luasnap_alloc::{
    Arena, ArenaId, PageTracker, Reservation, TrackError, TrackerKind, TrackerPreference, PAGE_SIZE,
};
use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// Snapshots retained by default: the 8 frames GGPO and GGRS predict ahead.
pub const DEFAULT_WINDOW: usize = 8;
/// After a snapshot that wrote more than the break-even fraction, tracking pauses for this many
/// snapshots, doubling on each repeat up to [`MAX_BACKOFF`].
const MIN_BACKOFF: u32 = 4;
const MAX_BACKOFF: u32 = 64;
/// Restored runs closer than this are re-armed by one call: re-arming a clean page between
/// them costs less than another call. (Re-arming the whole extent instead costs in proportion
/// to the extent, milliseconds on a heap of a few MB.)
const REARM_GAP: usize = 8 * PAGE_SIZE;

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);

/// How snapshots are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// Copy every used byte each time: one memcpy per snapshot and per rollback.
    Full,
    /// Copy only the pages written since the previous snapshot, found by a page tracker.
    /// Falls back to full copies where no tracker works.
    Incremental(TrackerPreference),
}

/// Configuration of a [`SnapshotRing`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RingConfig {
    /// Snapshots retained (at least 1). Default [`DEFAULT_WINDOW`].
    pub window: usize,
    /// Default: incremental with the best tracker available.
    pub mode: SnapshotMode,
    /// Fraction of the extent's pages written above which a snapshot copies everything
    /// instead. `None` uses the tracker's measured break-even.
    pub full_copy_above: Option<f64>,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            window: DEFAULT_WINDOW,
            mode: SnapshotMode::Incremental(TrackerPreference::Auto),
            full_copy_above: None,
        }
    }
}

/// A retained snapshot of one [`SnapshotRing`]. Cheap to copy; ids are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId {
    ring: u64,
    seq: u64,
}

impl SnapshotId {
    /// Position in the ring's sequence of snapshots (0 for the first).
    pub fn seq(self) -> u64 {
        self.seq
    }
}

/// How the ring is copying, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyStrategy {
    /// Incremental copies with this tracker.
    Incremental(TrackerKind),
    /// Incremental mode, but the last snapshot wrote more than the break-even fraction, so
    /// tracking is paused and full copies are made for a few snapshots.
    PausedIncremental(TrackerKind),
    /// Full copies because [`SnapshotMode::Full`] was asked for.
    Full,
    /// Full copies because no tracker works here.
    FullNoTracker(String),
    /// Full copies because tracking failed mid-run.
    FullTrackerLost(String),
}

impl fmt::Display for CopyStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyStrategy::Incremental(k) => write!(f, "incremental ({k})"),
            CopyStrategy::PausedIncremental(k) => {
                write!(f, "incremental ({k}, paused: heavy writes)")
            }
            CopyStrategy::Full => f.write_str("full"),
            CopyStrategy::FullNoTracker(why) => write!(f, "full (no page tracker: {why})"),
            CopyStrategy::FullTrackerLost(why) => write!(f, "full (page tracker lost: {why})"),
        }
    }
}

/// Counters and memory use of a ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Snapshots taken.
    pub snapshots: u64,
    /// Of which copied only written pages.
    pub incremental_snapshots: u64,
    /// Rollbacks done.
    pub rollbacks: u64,
    /// Pages written between the last two snapshots (all pages for a full copy).
    pub last_dirty_pages: usize,
    /// Snapshots currently retained.
    pub retained: usize,
    /// Bytes of the base copy (the mirror's extent).
    pub base_bytes: usize,
    /// Bytes held by undo records of older snapshots.
    pub undo_bytes: usize,
}

impl RingStats {
    /// Total snapshot memory: base copy plus undo records.
    pub fn memory_bytes(&self) -> usize {
        self.base_bytes + self.undo_bytes
    }
}

/// Page-aligned ranges of the arena that the ring copies and tracks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Extent {
    meta_end: usize,
    data: Range<usize>,
}

impl Extent {
    fn of(arena: &Arena) -> Extent {
        let s = arena.state_ranges();
        Extent {
            meta_end: s.meta.end.next_multiple_of(PAGE_SIZE),
            data: s.data,
        }
    }

    fn union(&self, other: &Extent) -> Extent {
        Extent {
            meta_end: self.meta_end.max(other.meta_end),
            data: self.data.start..self.data.end.max(other.data.end),
        }
    }

    fn ranges(&self) -> [Range<usize>; 2] {
        [0..self.meta_end, self.data.clone()]
    }

    /// The parts of `self` not in `older` (same data start).
    fn grown_since(&self, older: &Extent) -> [Range<usize>; 2] {
        [
            older.meta_end.min(self.meta_end)..self.meta_end,
            older.data.end.clamp(self.data.start, self.data.end)..self.data.end,
        ]
    }

    fn bytes(&self) -> usize {
        self.meta_end + self.data.len()
    }
}

/// Contents of pages at one snapshot, for the pages that changed before the next one.
#[derive(Default)]
struct PageUndo {
    runs: Vec<Range<usize>>,
    bytes: Vec<u8>,
}

impl PageUndo {
    fn apply(&self, arena: &mut Arena, mirror: &mut Reservation) {
        let mut at = 0;
        for run in &self.runs {
            let src = &self.bytes[at..at + run.len()];
            restore_bytes(arena, run.start, src);
            mirror.as_mut_slice()[run.clone()].copy_from_slice(src);
            at += run.len();
        }
    }
}

enum Undo {
    Pages(PageUndo),
    /// A whole former mirror: the arena at that snapshot, over that snapshot's extent.
    Full(Reservation),
}

struct Entry {
    seq: u64,
    extent: Extent,
    /// `None` for the latest snapshot, whose state is the mirror.
    undo: Option<Undo>,
}

enum Tracking {
    Off(CopyStrategy),
    On {
        kind: TrackerKind,
        generation: u64,
        /// Whether the extent is armed; false while paused.
        armed: bool,
        paused_left: u32,
        next_pause: u32,
        /// Whether the previous snapshot wrote more than the break-even fraction.
        heavy_before: bool,
    },
}

/// A window of the last N snapshots of one arena, with rollback to any of them.
///
/// ```
/// use luasnap_alloc::Arena;
/// use luasnap_snap::{digest, RingConfig, SnapshotRing};
///
/// let mut arena = Arena::new(64 << 20)?;
/// let mut ring = SnapshotRing::new(&mut arena, RingConfig::default())?;
/// let mut ids = Vec::new();
/// let mut digests = Vec::new();
/// for frame in 0..8 {
///     let p = arena.alloc(1000 + frame).unwrap();
///     ids.push(ring.snapshot(&mut arena)?);
///     digests.push(digest(&arena));
/// }
/// ring.rollback(&mut arena, ids[3])?;
/// assert_eq!(digest(&arena), digests[3]);
/// // Rolling back to frame 3 invalidated frames 4..8.
/// assert!(ring.rollback(&mut arena, ids[5]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SnapshotRing {
    id: u64,
    arena: ArenaId,
    window: usize,
    threshold: Option<f64>,
    tracking: Tracking,
    mirror: Reservation,
    extent: Extent,
    entries: VecDeque<Entry>,
    next_seq: u64,
    evicted_below: u64,
    spare_full: Vec<Reservation>,
    spare_pages: Vec<PageUndo>,
    dirty: Vec<Range<usize>>,
    /// Scratch for rollbacks: one bit per page of the extent, set once the page is restored.
    restored_pages: Vec<u64>,
    stats: RingStats,
}

impl fmt::Debug for SnapshotRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotRing")
            .field("arena", &self.arena)
            .field("window", &self.window)
            .field("strategy", &self.strategy())
            .field("stats", &self.stats())
            .finish()
    }
}

impl SnapshotRing {
    /// A ring for `arena`. In incremental mode this starts page tracking on the arena with the
    /// best mechanism allowed, and falls back to full copies if none works
    /// ([`strategy`](Self::strategy) says which).
    pub fn new(arena: &mut Arena, config: RingConfig) -> Result<SnapshotRing, SnapError> {
        if config.window == 0 {
            return Err(SnapError::Config(
                "the window must retain at least 1 snapshot".into(),
            ));
        }
        if let Some(f) = config.full_copy_above {
            if !(0.0..=1.0).contains(&f) {
                return Err(SnapError::Config(format!(
                    "full_copy_above must be a fraction in 0..=1, got {f}"
                )));
            }
        }
        let tracking = match config.mode {
            SnapshotMode::Full => Tracking::Off(CopyStrategy::Full),
            SnapshotMode::Incremental(pref) => match arena.enable_tracking(pref) {
                Ok(kind) => Tracking::On {
                    kind,
                    generation: arena.tracker_generation(),
                    armed: false,
                    paused_left: 0,
                    next_pause: MIN_BACKOFF,
                    heavy_before: false,
                },
                Err(e) => Tracking::Off(CopyStrategy::FullNoTracker(e.to_string())),
            },
        };
        Ok(SnapshotRing {
            id: NEXT_RING_ID.fetch_add(1, Ordering::Relaxed),
            arena: arena.id(),
            window: config.window,
            threshold: config.full_copy_above,
            tracking,
            mirror: Reservation::new(arena.capacity(), None)?,
            extent: Extent::default(),
            entries: VecDeque::with_capacity(config.window + 1),
            next_seq: 0,
            evicted_below: 0,
            spare_full: Vec::new(),
            spare_pages: Vec::new(),
            dirty: Vec::new(),
            restored_pages: Vec::new(),
            stats: RingStats::default(),
        })
    }

    /// How snapshots are being copied right now.
    pub fn strategy(&self) -> CopyStrategy {
        match &self.tracking {
            Tracking::Off(s) => s.clone(),
            Tracking::On {
                kind, armed: true, ..
            } => CopyStrategy::Incremental(*kind),
            Tracking::On { kind, .. } if self.entries.is_empty() => {
                CopyStrategy::Incremental(*kind)
            }
            Tracking::On { kind, .. } => CopyStrategy::PausedIncremental(*kind),
        }
    }

    /// The tracker in use, if incremental copies are possible.
    pub fn tracker_kind(&self) -> Option<TrackerKind> {
        match self.tracking {
            Tracking::On { kind, .. } => Some(kind),
            Tracking::Off(_) => None,
        }
    }

    /// Counters and memory use.
    pub fn stats(&self) -> RingStats {
        let mut s = self.stats;
        s.retained = self.entries.len();
        s.base_bytes = if self.entries.is_empty() {
            0
        } else {
            self.extent.bytes()
        };
        s.undo_bytes = self
            .entries
            .iter()
            .map(|e| match &e.undo {
                Some(Undo::Pages(p)) => p.bytes.len(),
                Some(Undo::Full(_)) => e.extent.bytes(),
                None => 0,
            })
            .sum();
        s
    }

    /// The retained snapshots, oldest first.
    pub fn retained(&self) -> impl Iterator<Item = SnapshotId> + '_ {
        self.entries.iter().map(|e| SnapshotId {
            ring: self.id,
            seq: e.seq,
        })
    }

    /// The most recent snapshot, if any.
    pub fn latest(&self) -> Option<SnapshotId> {
        self.entries.back().map(|e| SnapshotId {
            ring: self.id,
            seq: e.seq,
        })
    }

    /// The window size.
    pub fn window(&self) -> usize {
        self.window
    }

    fn check_arena(&self, arena: &Arena) -> Result<(), SnapError> {
        if arena.id() != self.arena {
            return Err(SnapError::WrongArena {
                taken_of: self.arena,
                given: arena.id(),
            });
        }
        Ok(())
    }

    fn tracker<'a>(&self, arena: &'a mut Arena) -> Result<&'a mut PageTracker, TrackError> {
        let Tracking::On {
            kind, generation, ..
        } = self.tracking
        else {
            unreachable!("tracker() is only called while tracking is on");
        };
        if arena.tracker_generation() != generation {
            return Err(TrackError::Unavailable {
                kind,
                reason: "tracking on this arena was disabled or replaced behind the snapshot ring"
                    .into(),
            });
        }
        arena.tracker_mut().ok_or(TrackError::Unavailable {
            kind,
            reason: "the arena has no tracker".into(),
        })
    }

    /// Switches to full copies after a tracker failure and returns the error to report.
    fn lose_tracking(&mut self, arena: &mut Arena, e: TrackError) -> SnapError {
        if let Tracking::On { generation, .. } = self.tracking {
            if arena.tracker_generation() == generation {
                arena.disable_tracking();
            }
        }
        self.tracking = Tracking::Off(CopyStrategy::FullTrackerLost(e.to_string()));
        SnapError::TrackerLost { source: e }
    }

    fn fresh_full_buffer(&mut self, capacity: usize) -> Result<Reservation, SnapError> {
        match self.spare_full.pop() {
            Some(r) => Ok(r),
            None => Ok(Reservation::new(capacity, None)?),
        }
    }

    /// Takes a snapshot and returns its id. The oldest snapshot beyond the window is dropped.
    ///
    /// Call it only while nothing is running in the arena (for a Lua VM: while Lua is idle).
    pub fn snapshot(&mut self, arena: &mut Arena) -> Result<SnapshotId, SnapError> {
        self.check_arena(arena)?;
        let current = Extent::of(arena);
        let new_extent = if self.entries.is_empty() {
            current
        } else {
            self.extent.union(&current)
        };

        // 1. Tracker work first: if it fails, nothing has been changed yet.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.clear();
        let full = match self.track_for_snapshot(arena, &new_extent, &mut dirty) {
            Ok(full) => full,
            Err(e) => {
                self.dirty = dirty;
                return Err(self.lose_tracking(arena, e));
            }
        };

        // 2. Copies.
        if self.entries.is_empty() {
            copy_extent(arena, &new_extent, &mut self.mirror);
            self.stats.last_dirty_pages = new_extent.bytes() / PAGE_SIZE;
        } else if full {
            let mut fresh = self.fresh_full_buffer(arena.capacity())?;
            copy_extent(arena, &new_extent, &mut fresh);
            let old = std::mem::replace(&mut self.mirror, fresh);
            self.entries.back_mut().expect("non-empty").undo = Some(Undo::Full(old));
            self.stats.last_dirty_pages = new_extent.bytes() / PAGE_SIZE;
        } else {
            let mut undo = self.spare_pages.pop().unwrap_or_default();
            undo.runs.clear();
            undo.bytes.clear();
            undo.bytes.reserve(dirty.iter().map(|r| r.len()).sum());
            let mirror = self.mirror.as_mut_slice();
            for run in &dirty {
                undo.bytes.extend_from_slice(&mirror[run.clone()]);
                mirror[run.clone()].copy_from_slice(arena.bytes(run.clone()));
            }
            self.stats.last_dirty_pages = undo.bytes.len() / PAGE_SIZE;
            undo.runs.extend(dirty.iter().cloned());
            self.entries.back_mut().expect("non-empty").undo = Some(Undo::Pages(undo));
            self.stats.incremental_snapshots += 1;
        }
        self.dirty = dirty;
        self.extent = new_extent.clone();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(Entry {
            seq,
            extent: new_extent,
            undo: None,
        });
        while self.entries.len() > self.window {
            let old = self.entries.pop_front().expect("non-empty");
            self.evicted_below = old.seq + 1;
            self.recycle(old.undo);
        }
        self.stats.snapshots += 1;
        Ok(SnapshotId { ring: self.id, seq })
    }

    /// Decides whether this snapshot copies everything, and gathers the written runs if not.
    /// Only tracker calls here, so an error leaves the ring and arena unchanged.
    fn track_for_snapshot(
        &mut self,
        arena: &mut Arena,
        new_extent: &Extent,
        dirty: &mut Vec<Range<usize>>,
    ) -> Result<bool, TrackError> {
        let Tracking::On {
            kind,
            armed,
            paused_left,
            next_pause,
            heavy_before,
            ..
        } = self.tracking
        else {
            return Ok(true);
        };
        if self.entries.is_empty() {
            self.tracker(arena)?.arm_all(new_extent)?;
            self.set_tracking(true, 0, next_pause);
            return Ok(true);
        }
        if !armed {
            // Paused: full copy; resume tracking once the pause is over.
            let left = paused_left.saturating_sub(1);
            if left == 0 {
                self.tracker(arena)?.arm_all(new_extent)?;
            }
            self.set_tracking(left == 0, left, next_pause);
            return Ok(true);
        }
        let old_extent = self.extent.clone();
        let limit = self.threshold.unwrap_or(kind.break_even_fraction());
        let tracker = self.tracker(arena)?;
        for r in old_extent.ranges() {
            tracker.collect(r, dirty)?;
        }
        for r in new_extent.grown_since(&old_extent) {
            if !r.is_empty() {
                tracker.arm(r.clone())?;
                dirty.push(r);
            }
        }
        let dirty_bytes: usize = dirty.iter().map(|r| r.len()).sum();
        let heavy = dirty_bytes as f64 > limit * new_extent.bytes() as f64;
        self.set_heavy(heavy);
        if heavy && !heavy_before {
            // One heavy frame (a full collection, a level load) among light ones: one
            // contiguous copy beats page runs, and the pages written are re-armed already, so
            // tracking goes on for the next frames.
            return Ok(true);
        }
        if heavy {
            // Heavy writes again: tracking faults would be wasted on the next frames too.
            // Pause tracking for a while.
            tracker.disarm_all(new_extent)?;
            self.set_tracking(false, next_pause, (next_pause * 2).min(MAX_BACKOFF));
            return Ok(true);
        }
        self.set_tracking(true, 0, MIN_BACKOFF);
        Ok(false)
    }

    fn set_heavy(&mut self, heavy: bool) {
        if let Tracking::On { heavy_before, .. } = &mut self.tracking {
            *heavy_before = heavy;
        }
    }

    fn set_tracking(&mut self, now_armed: bool, pause: u32, next: u32) {
        if let Tracking::On {
            armed,
            paused_left,
            next_pause,
            ..
        } = &mut self.tracking
        {
            *armed = now_armed;
            *paused_left = pause;
            *next_pause = next;
        }
    }

    fn recycle(&mut self, undo: Option<Undo>) {
        match undo {
            Some(Undo::Pages(p)) if self.spare_pages.len() < self.window => {
                self.spare_pages.push(p)
            }
            Some(Undo::Full(r)) if self.spare_full.len() < 2 => self.spare_full.push(r),
            _ => {}
        }
    }

    fn find(&self, id: SnapshotId) -> Result<usize, SnapError> {
        if id.ring != self.id {
            return Err(SnapError::ForeignSnapshot { seq: id.seq });
        }
        if let Some(i) = self.entries.iter().position(|e| e.seq == id.seq) {
            return Ok(i);
        }
        if id.seq < self.evicted_below {
            Err(SnapError::Evicted {
                seq: id.seq,
                window: self.window,
            })
        } else {
            Err(SnapError::Invalidated { seq: id.seq })
        }
    }

    /// Restores the arena to snapshot `id`, byte for byte. Newer snapshots are invalidated;
    /// `id` stays retained and can be rolled back to again.
    ///
    /// Call it only while nothing is running in the arena. If the tracker fails before anything
    /// is restored, the call returns [`SnapError::TrackerLost`] having changed nothing; if it
    /// fails afterwards, the rollback stands and the ring continues with full copies.
    pub fn rollback(&mut self, arena: &mut Arena, id: SnapshotId) -> Result<(), SnapError> {
        self.check_arena(arena)?;
        if self.entries.is_empty() {
            return Err(SnapError::NoSnapshot);
        }
        let k = self.find(id)?;
        let n = self.entries.len() - 1;
        let full_at = (k..n).find(|&i| matches!(self.entries[i].undo, Some(Undo::Full(_))));
        let target = self.entries[k].extent.clone();
        let armed = matches!(self.tracking, Tracking::On { armed: true, .. });

        // 1. Tracker first: the pages written since the latest snapshot. Peeked, not re-armed:
        //    the restore below writes them, and they are re-armed after it (step 5).
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.clear();
        if armed && full_at.is_none() {
            let extent = self.extent.clone();
            let collected = self.tracker(arena).and_then(|t| {
                extent
                    .ranges()
                    .into_iter()
                    .try_for_each(|r| t.peek(r, &mut dirty))
            });
            if let Err(e) = collected {
                self.dirty = dirty;
                return Err(self.lose_tracking(arena, e));
            }
        }

        // 2. Open the pages about to be restored for writing, one call per run: writing them
        //    while armed would take a write fault per page. They are re-armed in step 4.
        if armed {
            let open = match full_at {
                Some(_) => target.ranges().to_vec(),
                None => coalesce(
                    &plan_restore(
                        &target,
                        page_records(&self.entries, k..n),
                        &dirty,
                        &mut self.restored_pages,
                    ),
                    REARM_GAP,
                ),
            };
            if let Err(e) = self.tracker(arena).and_then(|t| t.open_runs(&open)) {
                self.dirty = dirty;
                return Err(self.lose_tracking(arena, e));
            }
        }

        // 3. Restore.
        let oldest_applied = match full_at {
            Some(j) => {
                let Some(Undo::Full(buf)) = self.entries[j].undo.take() else {
                    unreachable!("full_at points at a full record");
                };
                for r in target.ranges() {
                    restore_bytes(arena, r.start, &buf.as_slice()[r.clone()]);
                }
                let old = std::mem::replace(&mut self.mirror, buf);
                self.recycle(Some(Undo::Full(old)));
                j
            }
            None if armed => {
                // Each page is written once, from the oldest record that holds it (records
                // `k..n`, whose content as of `S_k` wins) or else from the mirror (pages only
                // written since `S_n`, unchanged from `S_k` to `S_n`); pages outside the
                // target's extent are skipped (they are above the allocator's top there, never
                // read, and count as written when the extent grows again).
                let restored = restore_once(
                    arena,
                    &mut self.mirror,
                    &target,
                    page_records(&self.entries, k..n),
                    &dirty,
                    &mut self.restored_pages,
                );
                dirty.clear();
                dirty.extend(restored);
                k
            }
            None => {
                for r in target.ranges() {
                    restore_bytes(arena, r.start, &self.mirror.as_slice()[r.clone()]);
                }
                n
            }
        };
        for i in (k..oldest_applied).rev() {
            if let Some(Undo::Pages(p)) = &self.entries[i].undo {
                p.apply(arena, &mut self.mirror);
                dirty.extend(p.runs.iter().cloned());
            }
        }

        // 4. Forget what was undone.
        for i in k..=n {
            let undo = self.entries[i].undo.take();
            self.recycle(undo);
        }
        self.entries.truncate(k + 1);
        self.extent = target.clone();
        self.stats.rollbacks += 1;

        // 5. Re-arm what the restore wrote (and step 2 opened): arena and mirror agree there.
        if armed {
            let rearmed = self.tracker(arena).and_then(|t| {
                if full_at.is_some() {
                    t.arm_all(&target)
                } else {
                    t.rearm_runs(&coalesce(&dirty, REARM_GAP))
                }
            });
            if let Err(e) = rearmed {
                let _ = self.lose_tracking(arena, e);
            }
        }
        self.dirty = dirty;
        Ok(())
    }
}

/// The page records of `entries[range]`, oldest first.
fn page_records(entries: &VecDeque<Entry>, range: Range<usize>) -> impl Iterator<Item = &PageUndo> {
    entries.range(range).filter_map(|e| match &e.undo {
        Some(Undo::Pages(p)) => Some(p),
        _ => None,
    })
}

trait ArmExtent {
    fn arm_all(&mut self, extent: &Extent) -> Result<(), TrackError>;
    fn disarm_all(&mut self, extent: &Extent) -> Result<(), TrackError>;
}

impl ArmExtent for PageTracker {
    fn arm_all(&mut self, extent: &Extent) -> Result<(), TrackError> {
        extent.ranges().into_iter().try_for_each(|r| self.arm(r))
    }

    fn disarm_all(&mut self, extent: &Extent) -> Result<(), TrackError> {
        extent.ranges().into_iter().try_for_each(|r| self.disarm(r))
    }
}

/// Restores, for a rollback to `target` while tracking is armed, every page of `records`
/// (oldest first: the first record holding a page gives its content) and of `since_latest`
/// (restored from the mirror unless a record holds them), each page once and only inside
/// `target`; records also update the mirror. Returns the restored pages as sorted, merged
/// runs.
fn restore_once<'a>(
    arena: &mut Arena,
    mirror: &mut Reservation,
    target: &Extent,
    records: impl Iterator<Item = &'a PageUndo>,
    since_latest: &[Range<usize>],
    bits: &mut Vec<u64>,
) -> Vec<Range<usize>> {
    let mut set = PageSet::new(target, bits);
    for rec in records {
        let mut at = 0;
        for run in &rec.runs {
            for off in run.clone().step_by(PAGE_SIZE) {
                if set.claim(off) {
                    let src = &rec.bytes[at + off - run.start..][..PAGE_SIZE];
                    restore_bytes(arena, off, src);
                    mirror.as_mut_slice()[off..off + PAGE_SIZE].copy_from_slice(src);
                }
            }
            at += run.len();
        }
    }
    for run in since_latest {
        for off in run.clone().step_by(PAGE_SIZE) {
            if set.claim(off) {
                restore_bytes(arena, off, &mirror.as_slice()[off..off + PAGE_SIZE]);
            }
        }
    }
    set.runs()
}

/// The pages [`restore_once`] will write for the same arguments that are still armed (those
/// of `records` not in `since_latest`: the latter are writable already), as sorted, merged
/// runs.
fn plan_restore<'a>(
    target: &Extent,
    records: impl Iterator<Item = &'a PageUndo>,
    since_latest: &[Range<usize>],
    bits: &mut Vec<u64>,
) -> Vec<Range<usize>> {
    let mut set = PageSet::new(target, bits);
    for run in records.flat_map(|rec| rec.runs.iter()) {
        for off in run.clone().step_by(PAGE_SIZE) {
            set.claim(off);
        }
    }
    for run in since_latest {
        for off in run.clone().step_by(PAGE_SIZE) {
            set.remove(off);
        }
    }
    set.runs()
}

/// One bit per page of an extent.
struct PageSet<'b> {
    meta_end: usize,
    data: Range<usize>,
    bits: &'b mut Vec<u64>,
}

impl<'b> PageSet<'b> {
    fn new(target: &Extent, bits: &'b mut Vec<u64>) -> PageSet<'b> {
        let pages = target.data.end.max(target.meta_end).div_ceil(PAGE_SIZE);
        bits.clear();
        bits.resize(pages.div_ceil(64), 0);
        PageSet {
            meta_end: target.meta_end,
            data: target.data.clone(),
            bits,
        }
    }

    /// Adds the page at offset `off`; false if it was in already or lies outside the extent.
    fn claim(&mut self, off: usize) -> bool {
        if !(off < self.meta_end || self.data.contains(&off)) {
            return false;
        }
        let p = off / PAGE_SIZE;
        let (w, b) = (p / 64, 1u64 << (p % 64));
        let fresh = self.bits[w] & b == 0;
        self.bits[w] |= b;
        fresh
    }

    /// Takes the page at offset `off` out of the set, if it is in.
    fn remove(&mut self, off: usize) {
        let p = off / PAGE_SIZE;
        if let Some(w) = self.bits.get_mut(p / 64) {
            *w &= !(1u64 << (p % 64));
        }
    }

    /// The pages in the set as sorted, merged runs.
    fn runs(&self) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = Vec::new();
        for (w, &word) in self.bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let b = word.trailing_zeros() as usize;
                word &= word - 1;
                let off = (w * 64 + b) * PAGE_SIZE;
                match out.last_mut() {
                    Some(last) if last.end == off => last.end = off + PAGE_SIZE,
                    _ => out.push(off..off + PAGE_SIZE),
                }
            }
        }
        out
    }
}

/// Merges sorted runs separated by at most `gap` bytes.
fn coalesce(runs: &[Range<usize>], gap: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(last) if r.start <= last.end + gap => last.end = last.end.max(r.end),
            _ => out.push(r.clone()),
        }
    }
    out
}

fn copy_extent(arena: &Arena, extent: &Extent, dst: &mut Reservation) {
    let out = dst.as_mut_slice();
    for r in extent.ranges() {
        out[r.clone()].copy_from_slice(arena.bytes(r));
    }
}
