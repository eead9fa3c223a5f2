//! A window of retained snapshots with incremental copies.
//!
//! # How it works
//!
//! The ring keeps a *base*: a copy of the arena as it was at the oldest retained snapshot
//! `S_0`, in a buffer as large as the arena's reservation but committed only where written.
//! Each newer snapshot `S_i` keeps a *record*: the contents, as of `S_i`, of the pages written
//! between `S_{i-1}` and `S_i` (a page record), or of the whole extent (a full record). Memory
//! is one base copy plus the changed pages; a snapshot copies each written page once. The base
//! and full records leave out the extent's free page runs, which the allocator keeps zero: they
//! list them, and a restore writes zeros there only where the arena is not free already
//! (`whole.rs`).
//!
//! Invariant (while tracking is armed): for every page `p` in the tracked extent, either the
//! tracker reports `p` as written since the latest snapshot `S_n`, or `arena[p]` is `p`'s
//! content at `S_n`: that of the newest record holding `p`, else the base's. Without armed
//! tracking, every page counts as written.
//!
//! - **Snapshot** `S_{n+1}`: collect the written pages `D` and copy `arena[D]` into a new page
//!   record. When `D` holds more than the break-even fraction (the tracker's, or
//!   [`RingConfig::full_copy_above`]) of the pages tracked since `S_n` (pages the extent grew
//!   by are copied as one run either way and count on neither side), copying page by page
//!   costs more than one contiguous copy: the whole extent goes into a full record. Tracking goes on after one such snapshot
//!   (a full collection, a level load among light frames); after two in a row it pauses for a
//!   few snapshots (its fault cost would be wasted too), then resumes. When a snapshot leaves
//!   the window, the next one's record is folded into the base (a page record is copied in, a
//!   full record becomes the base).
//! - **Rollback** to `S_k`, when tracking was armed without a break since `S_k` (every record
//!   after `S_k` is a page record): the pages written since `S_k` are those of the records
//!   after it plus `D`; each is restored once, from the newest record up to `S_k` that holds it
//!   (its content at `S_k`), else from the base; pages outside `S_k`'s extent are skipped.
//!   Otherwise the whole extent is restored from the newest full record up to `S_k` (or the
//!   base), then the page records after that one up to `S_k` are applied. Snapshots newer
//!   than `S_k` are invalidated; their ids give [`SnapError::Invalidated`].
//!
//! The extent grows with the arena; pages newly inside it count as written. After a rollback it
//! shrinks back to the snapshot's.
//!
//! # Frames re-simulated after a rollback
//!
//! A rollback to `S_k` drops the snapshots after it, and the frames they held are simulated
//! again at once, each followed by a snapshot: they write about the pages the dropped frames
//! wrote, which are the pages the rollback has just restored. Armed again, every one of them
//! would take a write fault in each re-simulated frame (about 0.85 µs inside a game, against
//! about 0.5 µs to copy a page as part of a run). So an exact rollback leaves the pages it
//! restored open (with the clean pages it opened between them), while they are at most
//! [`OPEN_AT_MOST`] times the pages a dropped frame wrote. An open page is reported written by
//! the tracker like a page that took a fault, so the invariant above holds unchanged: the
//! snapshots of the re-simulated frames copy every open page, written or not (their scans
//! peek, they do not re-arm), the rollbacks among them restore every open page, and the
//! snapshot of the last re-simulated frame (the count of snapshots dropped) re-arms them with
//! its scan. Those snapshots are not samples of what tracking costs: the automatic mode's
//! rule and the heavy-frame rule do not see them, and a page open without a fault is not
//! counted in [`RingStats::pages_tracked`].

use crate::cost::{AutoStep, CopyCosts, CostModel};
use crate::whole::WholeCopy;
use crate::{restore_bytes, SnapError};
use luasnap_alloc::{
    copy_streaming, thread_cpu_ns, Arena, ArenaId, PageTracker, Reservation, TrackError,
    TrackerKey, TrackerKind, TrackerPreference, PAGE_SIZE,
};
use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Snapshots retained by default: the 8 frames GGPO and GGRS predict ahead.
pub const DEFAULT_WINDOW: usize = 8;
/// After a snapshot that wrote more than the break-even fraction, tracking pauses for this many
/// snapshots, doubling on each repeat up to [`MAX_BACKOFF`].
const MIN_BACKOFF: u32 = 4;
/// The longest pause. A pause ends with one tracked sample, which decides the next pause: a
/// game's first frames (a small heap, mostly written) double the pause each time, so the pause
/// in force as the game settles is decided by one frame (a collection frame or not). At 64
/// that one frame decided how 64 frames were copied (json_town continued from a save tracked
/// 146 frames of 299, the straight run 194 of 300). At 16 an always-heavy game pays a tracked
/// frame's faults once in 17 frames.
const MAX_BACKOFF: u32 = 16;
/// Runs a rollback opens for writing closer than this are opened by one call: opening a clean
/// page between them (re-armed afterwards by the scan) costs less than another call.
const OPEN_GAP: usize = 8 * PAGE_SIZE;

/// A rollback leaves the pages it restored open for the re-simulated frames only while they
/// are at most this many times the pages a dropped frame wrote: each open page is copied at
/// every re-simulated snapshot (about 0.5 µs as a run) where a page the frame writes costs a
/// fault (about 0.85 µs) and a copy. Over the 3-4 frames of a rollback at delay 4, leaving
/// open pays below about 3 times; the margin is for the open pages' later folds into the base.
const OPEN_AT_MOST: f64 = 2.0;

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);

/// How snapshots are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// Copy every used byte each time: one memcpy per snapshot and per rollback.
    Full,
    /// Copy only the pages written since the previous snapshot, found by a page tracker.
    /// Falls back to full copies where no tracker works.
    Incremental(TrackerPreference),
    /// Incremental or whole copies, whichever costs less here for what the workload writes:
    /// what a page costs copied whole, copied as written and tracked is measured once per
    /// process on scratch pages, the scan for written pages on the ring's own snapshots
    /// ([`CopyCosts`]); the ring copies whole
    /// (with tracking paused, so the workload takes no write faults) while a tracked snapshot
    /// costs more than a whole copy, with hysteresis: running tracking pauses after two
    /// snapshots in a row above the whole copy's cost, and resumes after a probe below 0.8
    /// times it; probes come after 4, 8, ... up to 64 snapshots (256 while tracking
    /// costs twice a whole copy or more). `RingConfig::full_copy_above` is ignored. Falls
    /// back to full copies where no tracker works.
    Auto(TrackerPreference),
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
    /// Pages the latest snapshot copied: those written since the one before, or for a whole
    /// copy all of the extent but its free runs (zero, so listed instead of copied).
    pub last_dirty_pages: usize,
    /// Pages the tracker saw written between the last two snapshots, whether or not the
    /// latest copied only those (`None` when tracking was not armed over that interval).
    pub last_written_pages: Option<usize>,
    /// Pages the tracker reported written over the ring's life, at snapshots and at rollbacks:
    /// each one a write fault the workload took (a page written again after a snapshot or a
    /// rollback counts again). What tracking cost the workload is this times
    /// [`CopyCosts::fault_ns`](crate::CopyCosts::fault_ns) ([`workload_fault_ns`](crate::workload_fault_ns)).
    pub pages_tracked: u64,
    /// Pages rollbacks left open for the frames re-simulated after them, over the ring's life
    /// (copied at their snapshots without a write fault; see the ring's module docs).
    pub pages_left_open: u64,
    /// Snapshots currently retained.
    pub retained: usize,
    /// Bytes of the snapshots' extent (what a full copy copies; the base copy holds at most
    /// this).
    pub base_bytes: usize,
    /// Bytes held by the records of the snapshots after the oldest.
    pub undo_bytes: usize,
}

impl RingStats {
    /// Total snapshot memory: base copy plus records.
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

/// Contents of pages at one snapshot, for the pages written since the previous one.
///
/// The bytes live in a reservation as large as the arena's, reused from record to record:
/// its pages stay committed, where a heap buffer's memory is given back and faulted in again
/// (a zeroed page per fault, a fifth of a save's time when measured).
struct PageRecord {
    runs: Vec<Range<usize>>,
    buf: Reservation,
    len: usize,
}

impl PageRecord {
    fn new(capacity: usize) -> Result<PageRecord, SnapError> {
        Ok(PageRecord {
            runs: Vec::new(),
            buf: Reservation::for_copies(capacity)?,
            len: 0,
        })
    }

    /// Replaces the contents with `runs` of the arena.
    fn capture(&mut self, arena: &Arena, runs: &[Range<usize>]) {
        self.runs.clear();
        self.runs.extend(runs.iter().cloned());
        let mut at = 0;
        let out = self.buf.as_mut_slice();
        for run in runs {
            copy_streaming(&mut out[at..at + run.len()], arena.bytes(run.clone()));
            at += run.len();
        }
        self.len = at;
    }

    fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }

    /// The record's pages with their contents, in address order.
    fn pages(&self) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        let mut at = 0;
        self.runs.iter().flat_map(move |run| {
            let first = at;
            at += run.len();
            run.clone()
                .step_by(PAGE_SIZE)
                .map(move |off| (off, &self.bytes()[first + off - run.start..][..PAGE_SIZE]))
        })
    }

    fn apply(&self, arena: &mut Arena) {
        let mut at = 0;
        for run in &self.runs {
            restore_bytes(arena, run.start, &self.bytes()[at..at + run.len()]);
            at += run.len();
        }
    }

    fn fold_into(&self, base: &mut WholeCopy) {
        let mut at = 0;
        for run in &self.runs {
            base.write(run.start, &self.bytes()[at..at + run.len()]);
            at += run.len();
        }
    }
}

enum Record {
    Pages(PageRecord),
    /// The arena at that snapshot, over that snapshot's extent (its free runs listed, not
    /// copied).
    Full(WholeCopy),
}

struct Entry {
    seq: u64,
    extent: Extent,
    /// `None` for the oldest retained snapshot, whose state is the base.
    record: Option<Record>,
}

/// What a rollback left open for the frames that re-simulate after it.
#[derive(Debug, Default, Clone, Copy)]
struct OpenAfterRollback {
    /// Snapshots to take before the open pages are armed again: the snapshots the rollback
    /// dropped (the frames a rollback session re-simulates). The last of them re-arms.
    snapshots_left: usize,
    /// Pages open in the tracked extent that no write fault opened: restored by the rollback,
    /// or between restored runs.
    pages: usize,
}

enum Tracking {
    Off(CopyStrategy),
    On {
        kind: TrackerKind,
        /// The only way to the tracker's records (see `TrackerKey`).
        key: TrackerKey,
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
    /// The arena at the oldest retained snapshot.
    base: WholeCopy,
    extent: Extent,
    entries: VecDeque<Entry>,
    next_seq: u64,
    evicted_below: u64,
    spare_full: Vec<WholeCopy>,
    /// Scratch: the arena's free runs, for whole copies and restores.
    free_runs: Vec<Range<usize>>,
    spare_pages: Vec<PageRecord>,
    dirty: Vec<Range<usize>>,
    /// Scratch for rollbacks: one bit per page of the extent, set once the page is restored.
    restored_pages: Vec<u64>,
    stats: RingStats,
    /// The measured costs, in [`SnapshotMode::Auto`].
    cost: Option<CostModel>,
    /// The pages a rollback left open (see "Frames re-simulated after a rollback"): snapshots
    /// still to take before they are armed again, and how many pages are open without a
    /// fault (so that a scan's count of written pages is not taken for that many faults).
    open: OpenAfterRollback,
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
            SnapshotMode::Incremental(pref) | SnapshotMode::Auto(pref) => {
                match arena.enable_tracking(pref) {
                    Ok(key) => Tracking::On {
                        kind: key.kind(),
                        key,
                        armed: false,
                        paused_left: 0,
                        next_pause: MIN_BACKOFF,
                        heavy_before: false,
                    },
                    Err(e) => Tracking::Off(CopyStrategy::FullNoTracker(e.to_string())),
                }
            }
        };
        Ok(SnapshotRing {
            id: NEXT_RING_ID.fetch_add(1, Ordering::Relaxed),
            arena: arena.id(),
            window: config.window,
            threshold: config.full_copy_above,
            base: WholeCopy::new(arena.capacity())?,
            extent: Extent::default(),
            entries: VecDeque::with_capacity(config.window + 1),
            next_seq: 0,
            evicted_below: 0,
            spare_full: Vec::new(),
            free_runs: Vec::new(),
            spare_pages: Vec::new(),
            dirty: Vec::new(),
            restored_pages: Vec::new(),
            open: OpenAfterRollback::default(),
            stats: RingStats::default(),
            cost: match (&config.mode, &tracking) {
                (SnapshotMode::Auto(_), Tracking::On { kind, .. }) => Some(CostModel::new(*kind)),
                _ => None,
            },
            tracking,
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
            .map(|e| match &e.record {
                Some(Record::Pages(p)) => p.len,
                Some(Record::Full(_)) => e.extent.bytes(),
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

    /// The pages the latest snapshot copied as written since the one before (merged runs of
    /// arena offsets), or `None` when it copied the whole extent (or is the only one). For
    /// finding out who writes a frame's pages: map the offsets to the allocator's blocks.
    pub fn last_written(&self) -> Option<&[Range<usize>]> {
        match &self.entries.back()?.record {
            Some(Record::Pages(p)) => Some(&p.runs),
            _ => None,
        }
    }

    /// What copies cost here, as measured so far, in [`SnapshotMode::Auto`] (`None` in the
    /// other modes, or where no tracker works).
    pub fn copy_costs(&self) -> Option<CopyCosts> {
        self.cost.as_ref().map(CostModel::costs)
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
        let Tracking::On { kind, key, .. } = &self.tracking else {
            unreachable!("tracker() is only called while tracking is on");
        };
        arena
            .tracker_mut(key)
            .ok_or_else(|| TrackError::Unavailable {
                kind: *kind,
                reason: "tracking on this arena was disabled or replaced behind the snapshot ring"
                    .into(),
            })
    }

    /// Switches to full copies after a tracker failure and returns the error to report.
    fn lose_tracking(&mut self, arena: &mut Arena, e: TrackError) -> SnapError {
        if let Tracking::On { key, .. } = &self.tracking {
            if arena.tracker_mut(key).is_some() {
                arena.disable_tracking();
            }
        }
        self.open = OpenAfterRollback::default();
        self.tracking = Tracking::Off(CopyStrategy::FullTrackerLost(e.to_string()));
        SnapError::TrackerLost { error: e }
    }

    fn fresh_page_record(&mut self, capacity: usize) -> Result<PageRecord, SnapError> {
        match self.spare_pages.pop() {
            Some(r) => Ok(r),
            None => PageRecord::new(capacity),
        }
    }

    fn fresh_full_buffer(&mut self, capacity: usize) -> Result<WholeCopy, SnapError> {
        match self.spare_full.pop() {
            Some(r) => Ok(r),
            None => WholeCopy::new(capacity),
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

        // 0. A buffer for a page record, before the tracker re-arms anything: failing to map
        //    one must leave the written pages reported.
        let mut rec = match self.tracking {
            Tracking::On { armed: true, .. } if !self.entries.is_empty() => {
                Some(self.fresh_page_record(arena.capacity())?)
            }
            _ => None,
        };

        // 1. Tracker work first: if it fails, nothing has been changed yet.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.clear();
        let full = match self.track_for_snapshot(arena, &new_extent, &mut dirty) {
            Ok(full) => full,
            Err(e) => {
                self.dirty = dirty;
                self.recycle(rec.map(Record::Pages));
                return Err(self.lose_tracking(arena, e));
            }
        };

        // 2. Copies: each written page once.
        let record = if self.entries.is_empty() {
            arena.free_runs(&mut self.free_runs);
            let copied = self
                .base
                .capture(arena, &new_extent.ranges(), &self.free_runs);
            self.stats.last_dirty_pages = copied / PAGE_SIZE;
            None
        } else if full {
            self.recycle(rec.take().map(Record::Pages));
            let mut fresh = self.fresh_full_buffer(arena.capacity())?;
            arena.free_runs(&mut self.free_runs);
            let copied = fresh.capture(arena, &new_extent.ranges(), &self.free_runs);
            self.stats.last_dirty_pages = copied / PAGE_SIZE;
            Some(Record::Full(fresh))
        } else {
            let mut rec = rec.take().expect("incremental only while armed");
            rec.capture(arena, &dirty);
            self.stats.last_dirty_pages = rec.len / PAGE_SIZE;
            self.stats.incremental_snapshots += 1;
            Some(Record::Pages(rec))
        };
        self.dirty = dirty;
        self.extent = new_extent.clone();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(Entry {
            seq,
            extent: new_extent,
            record,
        });
        while self.entries.len() > self.window {
            // The oldest leaves (its state is the base's); the next one's record becomes part
            // of the base.
            let old = self.entries.pop_front().expect("non-empty");
            self.evicted_below = old.seq + 1;
            self.recycle(old.record);
            match self.entries.front_mut().expect("window >= 1").record.take() {
                Some(Record::Pages(p)) => {
                    p.fold_into(&mut self.base);
                    self.recycle(Some(Record::Pages(p)));
                }
                Some(Record::Full(r)) => {
                    let old = std::mem::replace(&mut self.base, r);
                    self.recycle(Some(Record::Full(old)));
                }
                None => {}
            }
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
        self.stats.last_written_pages = None;
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
            // Armed whole: nothing a rollback left open stays open.
            self.open = OpenAfterRollback::default();
            self.set_tracking(true, 0, next_pause);
            return Ok(true);
        }
        if !armed {
            // Paused: full copy; resume tracking once the pause is over.
            let left = paused_left.saturating_sub(1);
            if left == 0 {
                self.tracker(arena)?.arm_all(new_extent)?;
                self.open = OpenAfterRollback::default();
            }
            self.set_tracking(left == 0, left, next_pause);
            return Ok(true);
        }
        if self.open.snapshots_left > 0 {
            self.snapshot_while_open(arena, new_extent, dirty)?;
            return Ok(false);
        }
        let old_extent = self.extent.clone();
        let limit = self.threshold.unwrap_or(kind.break_even_fraction());
        // What a whole copy would copy, for the automatic mode's model: the extent but its
        // free runs (`whole.rs`).
        let whole_pages = if self.cost.is_some() {
            arena.free_runs(&mut self.free_runs);
            let free_bytes: usize = self.free_runs.iter().map(|r| r.len()).sum();
            (new_extent.bytes() - free_bytes) / PAGE_SIZE
        } else {
            0
        };
        // In the thread's CPU time, as the costs it is weighed against: a scan the scheduler
        // interrupted on a shared machine does not read as milliseconds.
        let scan_started = thread_cpu_ns();
        let tracker = self.tracker(arena)?;
        for r in old_extent.ranges() {
            tracker.collect(r, dirty)?;
        }
        let faulted: usize = dirty.iter().map(|r| r.len() / PAGE_SIZE).sum();
        self.stats.pages_tracked += faulted as u64;
        for r in new_extent.grown_since(&old_extent) {
            if !r.is_empty() {
                tracker.arm(r.clone())?;
                dirty.push(r);
            }
        }
        let scan_took = Duration::from_nanos((thread_cpu_ns() - scan_started).max(0.0) as u64);
        let dirty_bytes: usize = dirty.iter().map(|r| r.len()).sum();
        self.stats.last_written_pages = Some(dirty_bytes / PAGE_SIZE);
        if let Some(cost) = &mut self.cost {
            let extent_pages = new_extent.bytes() / PAGE_SIZE;
            cost.note_scan(extent_pages, dirty_bytes / PAGE_SIZE, scan_took);
            cost.note_counts(self.stats.snapshots, self.stats.rollbacks);
            return match cost.after_tracked(extent_pages, whole_pages, dirty_bytes / PAGE_SIZE) {
                AutoStep::Track => Ok(false),
                AutoStep::CopyWhole => Ok(true),
                AutoStep::Pause(snapshots) => {
                    // The faults of this interval are paid: its written pages are copied.
                    tracker.disarm_all(new_extent)?;
                    self.set_tracking(false, snapshots, next_pause);
                    Ok(false)
                }
            };
        }
        // Heavy: more of the tracked pages written than the break-even fraction. Pages the
        // extent grew by are copied as one run either way and took no fault, so they count on
        // neither side: a game that grows (its first frames, a level load) is not judged heavy
        // for it, nor does its growth lengthen the pauses it gets once it settles.
        let heavy = (faulted * PAGE_SIZE) as f64 > limit * old_extent.bytes() as f64;
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

    /// A snapshot of a re-simulated frame, while the pages the rollback restored are open:
    /// every open page counts as written (the tracker reports it) and is copied, written or
    /// not; no write fault was taken for it. The pages stay open for the next re-simulated
    /// frame, but for the last of them: its scan arms them again, and the frames after it are
    /// tracked as before. Not a sample of what tracking costs: the automatic mode's rule and
    /// the heavy-frame rule do not see it, and it reports no count of written pages.
    fn snapshot_while_open(
        &mut self,
        arena: &mut Arena,
        new_extent: &Extent,
        dirty: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        self.open.snapshots_left -= 1;
        let rearm = self.open.snapshots_left == 0;
        let old_extent = self.extent.clone();
        let tracker = self.tracker(arena)?;
        for r in old_extent.ranges() {
            if rearm {
                tracker.collect(r, dirty)?;
            } else {
                tracker.peek(r, dirty)?;
            }
        }
        let open: usize = dirty.iter().map(|r| r.len() / PAGE_SIZE).sum();
        self.stats.pages_tracked += open.saturating_sub(self.open.pages) as u64;
        self.open.pages = if rearm { 0 } else { open };
        for r in new_extent.grown_since(&old_extent) {
            if !r.is_empty() {
                tracker.arm(r.clone())?;
                dirty.push(r);
            }
        }
        Ok(())
    }

    /// Step 5 of a rollback to an extent `target` (tracking armed), after the restore. Exact,
    /// and the pages restored (with those opened between them) not many more than a dropped
    /// frame wrote: they stay open for the `dropped` re-simulated frames (see "Frames
    /// re-simulated after a rollback" at the top). Otherwise they are re-armed: the arena is
    /// `S_k` there, and every page of the target's extent the tracker reports as written now
    /// was restored, so a scan that re-arms the written pages re-arms exactly those; it only
    /// reads the entries of the others, where re-arming runs rewrites every entry they span.
    fn after_restore(
        &mut self,
        arena: &mut Arena,
        target: &Extent,
        exact: bool,
        leave_open: bool,
        open_pages: usize,
        dropped: usize,
    ) {
        if leave_open {
            self.open = OpenAfterRollback {
                snapshots_left: dropped.max(1),
                pages: open_pages,
            };
            self.stats.pages_left_open += open_pages as u64;
            return;
        }
        self.open = OpenAfterRollback::default();
        let rearmed = self.tracker(arena).and_then(|t| {
            if exact {
                let mut rearmed_runs = Vec::new();
                target
                    .ranges()
                    .into_iter()
                    .try_for_each(|r| t.collect(r, &mut rearmed_runs))
            } else {
                t.arm_all(target)
            }
        });
        if let Err(e) = rearmed {
            let _ = self.lose_tracking(arena, e);
        }
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

    /// Keeps a record's buffer for reuse. Whole-extent buffers are kept up to the window while
    /// snapshots are copied whole (a rollback drops up to a window of them, and the saves that
    /// re-simulate need as many again: a fresh buffer costs a zero-filled page fault per page,
    /// 2-3 ms for 7 MiB, measured on the AI village), else two.
    fn recycle(&mut self, record: Option<Record>) {
        let copying_whole = match &self.tracking {
            Tracking::Off(_) => true,
            Tracking::On { armed, .. } => !armed,
        } || matches!(
            self.entries.back().and_then(|e| e.record.as_ref()),
            Some(Record::Full(_))
        );
        let keep_full = if copying_whole { self.window } else { 2 };
        match record {
            Some(Record::Pages(p)) if self.spare_pages.len() < self.window => {
                self.spare_pages.push(p)
            }
            Some(Record::Full(r)) if self.spare_full.len() < keep_full => self.spare_full.push(r),
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
        let target = self.entries[k].extent.clone();
        let armed = matches!(self.tracking, Tracking::On { armed: true, .. });
        // Page by page only if tracking saw every write since `S_k`.
        let exact =
            armed && (k + 1..=n).all(|i| matches!(self.entries[i].record, Some(Record::Pages(_))));

        // 1. Tracker first: the pages written since the latest snapshot. Peeked, not re-armed:
        //    the restore below writes them, and they are re-armed after it (step 5).
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.clear();
        if exact {
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
            let reported: usize = dirty.iter().map(|r| r.len() / PAGE_SIZE).sum();
            self.stats.pages_tracked += reported.saturating_sub(self.open.pages) as u64;
        }

        // 2. The pages to restore (exact: those written since `S_k`, inside its extent), and
        //    opening the armed ones for writing, one call per run: writing them while armed
        //    would take a write fault per page. Step 5 re-arms them or leaves them open.
        let mut bits = std::mem::take(&mut self.restored_pages);
        let mut set = PageSet::new(&target, &mut bits);
        let mut open_pages = 0;
        let opened = if exact {
            for rec in page_records(&self.entries, k + 1..n + 1) {
                for run in &rec.runs {
                    run.clone().step_by(PAGE_SIZE).for_each(|off| set.add(off));
                }
            }
            for run in &dirty {
                run.clone().step_by(PAGE_SIZE).for_each(|off| {
                    set.take(off);
                });
            }
            let armed_runs = set.runs();
            for run in &dirty {
                run.clone().step_by(PAGE_SIZE).for_each(|off| set.add(off));
            }
            let open = coalesce(&armed_runs, OPEN_GAP);
            open_pages = set.count()
                + open
                    .iter()
                    .map(|r| set.count_absent(r.clone()))
                    .sum::<usize>();
            self.tracker(arena).and_then(|t| t.open_runs(&open))
        } else if armed {
            let open = target.ranges();
            open_pages = target.bytes() / PAGE_SIZE;
            self.tracker(arena).and_then(|t| t.open_runs(&open))
        } else {
            Ok(())
        };
        if let Err(e) = opened {
            self.dirty = dirty;
            self.restored_pages = bits;
            return Err(self.lose_tracking(arena, e));
        }

        // 3. Restore. Whole copies hold free runs as zeros to write where the arena is not
        //    free now (free runs are zero).
        let mut free_now = std::mem::take(&mut self.free_runs);
        arena.free_runs(&mut free_now);
        if exact {
            // Each page once, from the newest record up to `S_k` that holds it (its content
            // at `S_k`), else from the newest full state up to `S_k`.
            let mut source = &self.base;
            for i in (1..=k).rev() {
                match &self.entries[i].record {
                    Some(Record::Pages(p)) => {
                        for (off, bytes) in p.pages() {
                            if set.take(off) {
                                restore_bytes(arena, off, bytes);
                            }
                        }
                    }
                    Some(Record::Full(r)) => {
                        source = r;
                        break;
                    }
                    None => unreachable!("only the oldest entry has no record"),
                }
            }
            for run in set.runs() {
                source.restore(arena, run, &free_now);
            }
        } else {
            let j = (1..=k)
                .rev()
                .find(|&i| matches!(self.entries[i].record, Some(Record::Full(_))))
                .unwrap_or(0);
            let source = match &self.entries[j].record {
                Some(Record::Full(r)) => r,
                _ => &self.base,
            };
            for r in target.ranges() {
                source.restore(arena, r, &free_now);
            }
            for rec in page_records(&self.entries, j + 1..k + 1) {
                rec.apply(arena);
            }
        }
        self.restored_pages = bits;
        self.free_runs = free_now;

        // Pages the dropped frames wrote, per frame: what a re-simulated frame will write.
        let dropped_pages: usize = page_records(&self.entries, k + 1..n + 1)
            .map(|r| r.len / PAGE_SIZE)
            .sum();
        let per_frame = dropped_pages / (n - k).max(1);
        // 4. Forget what was undone.
        for i in k + 1..=n {
            let record = self.entries[i].record.take();
            self.recycle(record);
        }
        self.entries.truncate(k + 1);
        self.extent = target.clone();
        self.stats.rollbacks += 1;

        // 5. Re-arm what the restore wrote, or leave it open for the re-simulated frames.
        if armed {
            let leave_open = exact && (open_pages as f64) <= OPEN_AT_MOST * per_frame as f64;
            self.after_restore(arena, &target, exact, leave_open, open_pages, n - k);
        }
        self.dirty = dirty;
        Ok(())
    }
}

/// The page records of `entries[range]`, oldest first.
fn page_records(
    entries: &VecDeque<Entry>,
    range: Range<usize>,
) -> impl Iterator<Item = &PageRecord> {
    entries.range(range).filter_map(|e| match &e.record {
        Some(Record::Pages(p)) => Some(p),
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

    /// Adds the page at offset `off`, unless it lies outside the extent.
    fn add(&mut self, off: usize) {
        if off < self.meta_end || self.data.contains(&off) {
            let p = off / PAGE_SIZE;
            self.bits[p / 64] |= 1u64 << (p % 64);
        }
    }

    /// Takes the page at offset `off` out of the set; whether it was in.
    fn take(&mut self, off: usize) -> bool {
        let p = off / PAGE_SIZE;
        match self.bits.get_mut(p / 64) {
            Some(w) if *w & (1u64 << (p % 64)) != 0 => {
                *w &= !(1u64 << (p % 64));
                true
            }
            _ => false,
        }
    }

    /// Pages in the set.
    fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Pages of `run` (inside the extent) not in the set.
    fn count_absent(&self, run: Range<usize>) -> usize {
        run.step_by(PAGE_SIZE)
            .filter(|&off| off < self.meta_end || self.data.contains(&off))
            .filter(|&off| {
                let p = off / PAGE_SIZE;
                self.bits
                    .get(p / 64)
                    .is_some_and(|w| w & (1u64 << (p % 64)) == 0)
            })
            .count()
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
