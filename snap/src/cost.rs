//! What each way of copying costs on this machine: the basis of
//! [`SnapshotMode::Auto`](crate::SnapshotMode::Auto).
//!
//! Per page of the extent, a whole copy costs one contiguous copy. Per page written, an
//! incremental snapshot costs the tracker's re-arming, the copy into a record and the record's
//! fold into the base copy (both measured once per process on scratch pages,
//! [`page_copy_ns`]), plus one write fault taken inside the workload when the page was first
//! written after the previous snapshot (what [`write_fault_ns`] measures once per process: the
//! ring cannot see it). So copying written pages pays off while
//!
//! ```text
//! written pages × (written_ns + fault_ns)  <  extent pages × whole_ns
//! ```
//!
//! that is below the break-even fraction `whole_ns / (written_ns + fault_ns)` of the extent's
//! pages written. With userfaultfd on the reference machine a fault costs about 0.6 µs and a
//! page copy 0.1-0.3 µs, so the break-even lies near a tenth of the pages, not the half the
//! copies alone would suggest.
//!
//! A tracked snapshot also has a part that does not depend on the pages written: the
//! tracker's scan of the extent for written pages (`scan_ns` per page of the extent, measured
//! apart from the copies). So the automatic mode compares, per snapshot,
//!
//! ```text
//! tracked = fixed_ns + extent pages × scan_ns + written pages × (written_ns + fault_ns)
//! whole   = extent pages × whole_ns
//! ```
//!
//! plus a fixed cost per tracked snapshot (`fixed_ns`): the tracker's own calls, which do not
//! grow with the pages (its system calls at the snapshot's scan, and a rollback's peek, opening
//! and re-arming, shared over the snapshots between rollbacks), measured once per process
//! ([`tracker_call_ns`]). On a small arena they are a share a per-page model misses: a 0.7 MiB
//! game's whole copy takes 30-60 µs.
//!
//! The snapshots of frames re-simulated after a rollback that left its restored pages open
//! (the ring's module docs) are not samples: they copy the open pages without faults, so they
//! cost less than the model says, and the model leaves them out rather than learn from them.
//! That errs towards whole copies on games that roll back often.
//!
//! The automatic mode switches with hysteresis ([`AutoState`]): tracking that runs stops only when `tracked`
//! exceeds `whole`, twice in a row; tracking resumed to measure again (after a pause) goes on
//! only when `tracked` is below 0.8 × `whole`. A game near the break-even
//! keeps the mode it is in instead of flipping with the frame-to-frame spread of its writes,
//! and a game far above it probes rarely.

use luasnap_alloc::{page_copy_ns, tracker_call_ns, write_fault_ns, TrackerKind};
use std::time::Duration;

/// What a write fault costs inside a workload, relative to the same fault on scratch pages
/// ([`write_fault_ns`]): the kernel's entry and exit also evict the workload's cache lines and
/// TLB entries. On the AI village corpus game, tracking 464 pages a frame made `G.step` 380 µs
/// slower (0.82 µs a page) where the scratch measurement gave 0.55 µs.
const FAULT_IN_WORKLOAD: f64 = 1.5;

/// What one write fault of a `kind` tracker costs inside a workload, in nanoseconds: the
/// fault measured on scratch pages ([`write_fault_ns`], once per process) times the workload
/// factor above; the reference machine's figure where the measurement failed.
pub fn workload_fault_ns(kind: TrackerKind) -> f64 {
    FAULT_IN_WORKLOAD
        * write_fault_ns(kind).unwrap_or(match kind {
            TrackerKind::Uffd => 600.0,
            TrackerKind::Mprotect => 4000.0,
        })
}

/// Samples kept per estimate: the median of the latest ones.
const SAMPLES: usize = 9;

/// The median of the latest [`SAMPLES`] samples: one copy that the scheduler interrupted (a
/// shared machine: milliseconds for a copy of microseconds) moves it not at all, where it
/// moved a mean for many snapshots, and a mean that stops being sampled (tracking paused)
/// kept it for good.
#[derive(Debug, Clone, Copy)]
struct Recent {
    samples: [f64; SAMPLES],
    len: usize,
    next: usize,
}

impl Recent {
    const EMPTY: Recent = Recent {
        samples: [0.0; SAMPLES],
        len: 0,
        next: 0,
    };

    fn note(&mut self, x: f64) {
        self.samples[self.next] = x;
        self.next = (self.next + 1) % SAMPLES;
        self.len = (self.len + 1).min(SAMPLES);
    }

    fn get(&self) -> Option<f64> {
        let mut v = self.samples;
        let v = &mut v[..self.len];
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

/// The costs the automatic mode compares, in nanoseconds per page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyCosts {
    /// A whole copy of the extent, per page of it (measured once per process,
    /// [`page_copy_ns`]).
    pub whole_ns: f64,
    /// An incremental snapshot, per page written (re-arming, copy and fold; measured once per
    /// process, [`page_copy_ns`]).
    pub written_ns: f64,
    /// One write fault of the page tracker, taken in the workload (measured once per process).
    pub fault_ns: f64,
    /// A tracked snapshot's scan for written pages, per page of the extent, whatever was
    /// written (measured on tracked snapshots that found at most an eighth of the extent
    /// written; before the first one, 10 ns). Re-arming the written pages counts in
    /// `written_ns`.
    pub scan_ns: f64,
    /// A tracked snapshot's fixed cost, whatever the pages: the tracker's calls at its scan
    /// and the share of a rollback's calls (peek, opening, re-arming) that falls on each
    /// snapshot (measured once per process, [`tracker_call_ns`]).
    pub fixed_ns: f64,
}

impl CopyCosts {
    /// The fraction of the extent's pages written above which a whole copy costs less than
    /// tracking and copying the written pages (in `0.0..=1.0`).
    /// On an extent of `extent_pages`: the fixed cost is shared over its pages.
    pub fn break_even(&self, extent_pages: usize) -> f64 {
        let fixed = self.fixed_ns / extent_pages.max(1) as f64;
        ((self.whole_ns - self.scan_ns - fixed) / (self.written_ns + self.fault_ns)).clamp(0.0, 1.0)
    }

    /// What a tracked snapshot costs, in nanoseconds: the fixed cost, the scan of
    /// `extent_pages`, and the faults and copies of `written_pages`.
    pub fn tracked_ns(&self, extent_pages: usize, written_pages: usize) -> f64 {
        self.fixed_ns
            + extent_pages as f64 * self.scan_ns
            + written_pages as f64 * (self.written_ns + self.fault_ns)
    }

    /// What a whole copy of `extent_pages` costs, in nanoseconds.
    pub fn whole_copy_ns(&self, extent_pages: usize) -> f64 {
        extent_pages as f64 * self.whole_ns
    }
}

/// Running tracking stops when a tracked snapshot costs more than this many times a whole
/// copy (twice in a row); tracking resumed after a pause goes on only below
/// [`RESUME_BELOW`] times it. The band leans to whole copies: a tracked frame's cost has the
/// heavier tail (a collection's frame writes many more pages than the mean) and its faults are
/// an estimate, where a whole copy costs what its extent does.
pub(crate) const STOP_ABOVE: f64 = 1.0;
/// See [`STOP_ABOVE`].
pub(crate) const RESUME_BELOW: f64 = 0.8;
/// The first pause of tracking, in snapshots; each pause after a probe that found tracking
/// dearer doubles, up to [`MAX_PAUSE`] (or [`MAX_PAUSE_FAR`]).
const MIN_PAUSE: u32 = 4;
const MAX_PAUSE: u32 = 64;
/// The longest pause when the last probe found tracking at least twice a whole copy's cost:
/// a probe then wastes more than a whole frame's copies, and the game would have to change a
/// great deal for tracking to pay.
const MAX_PAUSE_FAR: u32 = 256;
/// A probe that found tracking this many times a whole copy's cost lets pauses grow to
/// [`MAX_PAUSE_FAR`].
const FAR: f64 = 2.0;

/// Tracked snapshots in a row after which tracking counts as settled: the next pause is the
/// shortest again.
const SETTLED: u32 = 16;

/// A scan measures `scan_ns` when at most one page of the extent in this many was written.
const SCAN_SAMPLE_BELOW: usize = 8;

/// What the automatic mode does with a snapshot taken while tracking was armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AutoStep {
    /// Copy the written pages; tracking goes on.
    Track,
    /// Copy the whole extent; tracking goes on (one heavy snapshot among light ones, a
    /// collection or a level load, that wrote more than a whole copy costs to copy page by
    /// page).
    CopyWhole,
    /// Copy the written pages (their faults are paid) and pause tracking for this many
    /// snapshots; the next tracked snapshot is a probe.
    Pause(u32),
}

/// The automatic mode's switch between tracked and whole copies: a pure function of the
/// costs and the pages written, so that it can be tested without timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AutoState {
    /// The previous tracked snapshot cost more tracked than a whole copy.
    heavy_before: bool,
    /// Tracking was resumed after a pause to measure again: it goes on only if clearly
    /// cheaper.
    probing: bool,
    /// Snapshots of the next pause.
    next_pause: u32,
    /// Tracked snapshots in a row that cost less tracked than a whole copy.
    tracked_run: u32,
}

impl Default for AutoState {
    fn default() -> Self {
        AutoState {
            heavy_before: false,
            probing: false,
            next_pause: MIN_PAUSE,
            tracked_run: SETTLED,
        }
    }
}

impl AutoState {
    /// Decides a snapshot taken while tracking was armed, which found `written_pages` of
    /// `extent_pages` written; a whole copy would copy `whole_pages` of them (the extent but
    /// its free runs).
    pub(crate) fn after_tracked(
        &mut self,
        costs: &CopyCosts,
        extent_pages: usize,
        whole_pages: usize,
        written_pages: usize,
    ) -> AutoStep {
        let whole = costs.whole_copy_ns(whole_pages).max(1.0);
        let ratio = costs.tracked_ns(extent_pages, written_pages) / whole;
        let limit = if self.probing {
            RESUME_BELOW
        } else {
            STOP_ABOVE
        };
        if ratio <= limit {
            // Pauses start short again only once tracking has lasted: a game whose frames
            // straddle the break-even would otherwise probe every few snapshots.
            self.tracked_run += 1;
            if self.tracked_run >= SETTLED {
                self.next_pause = MIN_PAUSE;
            }
            self.heavy_before = false;
            self.probing = false;
            return AutoStep::Track;
        }
        self.tracked_run = 0;
        if !self.heavy_before && !self.probing {
            // One heavy snapshot among light ones (a collection, a level load): tracking goes
            // on, and its faults are paid by now, so the copy is the cheaper of the two
            // without them (a page record also keeps rollbacks over it exact).
            self.heavy_before = true;
            let pages = written_pages as f64 * costs.written_ns;
            return if pages < whole {
                AutoStep::Track
            } else {
                AutoStep::CopyWhole
            };
        }
        let pause = self.next_pause;
        let most = if ratio >= FAR {
            MAX_PAUSE_FAR
        } else {
            MAX_PAUSE
        };
        self.next_pause = (pause * 2).min(most).max(MIN_PAUSE);
        self.heavy_before = true;
        self.probing = true;
        AutoStep::Pause(pause)
    }
}

/// Running measurements of one ring.
#[derive(Debug, Clone)]
pub(crate) struct CostModel {
    whole_ns: f64,
    written_ns: f64,
    scan: Recent,
    fault_ns: f64,
    /// The tracker's calls at a snapshot and at a rollback ([`tracker_call_ns`]).
    snapshot_calls_ns: f64,
    rollback_calls_ns: f64,
    /// Rollbacks per snapshot so far (how much of a rollback's calls each snapshot carries).
    rollbacks_per_snapshot: f64,
    /// Where the switch between tracked and whole copies stands.
    pub(crate) state: AutoState,
}

impl CostModel {
    pub(crate) fn new(kind: TrackerKind) -> CostModel {
        // Where the measurement failed: a page copy at about 10 GB/s, twice that as written.
        let copy_costs = page_copy_ns(kind).unwrap_or((400.0, 800.0));
        let calls = tracker_call_ns(kind).unwrap_or((3000.0, 5000.0));
        CostModel {
            whole_ns: copy_costs.0,
            written_ns: copy_costs.1,
            scan: Recent::EMPTY,
            fault_ns: workload_fault_ns(kind),
            // Where the measurement failed: three system calls at a snapshot, five at a
            // rollback, about 1 µs each.
            snapshot_calls_ns: calls.0,
            rollback_calls_ns: calls.1,
            rollbacks_per_snapshot: 0.0,
            state: AutoState::default(),
        }
    }

    /// A tracked snapshot's scan of `extent_pages`, which found `written_pages` written and
    /// re-armed them, took `took` (the thread's CPU time). Only a scan that found few pages written measures the
    /// scan's own cost: re-arming a written page is part of what tracking it costs. The
    /// tracker's calls count in the fixed cost, not per page.
    pub(crate) fn note_scan(&mut self, extent_pages: usize, written_pages: usize, took: Duration) {
        if extent_pages > 0 && written_pages <= extent_pages / SCAN_SAMPLE_BELOW {
            let pages_ns = (took.as_nanos() as f64 - self.snapshot_calls_ns).max(0.0);
            self.scan.note(pages_ns / extent_pages as f64);
        }
    }

    /// The ring has taken `snapshots` and rolled back `rollbacks` times.
    pub(crate) fn note_counts(&mut self, snapshots: u64, rollbacks: u64) {
        self.rollbacks_per_snapshot = rollbacks as f64 / snapshots.max(1) as f64;
    }

    /// Decides a snapshot taken while tracking was armed ([`AutoState::after_tracked`]).
    pub(crate) fn after_tracked(
        &mut self,
        extent_pages: usize,
        whole_pages: usize,
        written_pages: usize,
    ) -> AutoStep {
        let costs = self.costs();
        self.state
            .after_tracked(&costs, extent_pages, whole_pages, written_pages)
    }

    pub(crate) fn costs(&self) -> CopyCosts {
        CopyCosts {
            whole_ns: self.whole_ns,
            written_ns: self.written_ns,
            fault_ns: self.fault_ns,
            scan_ns: self.scan.get().unwrap_or(10.0),
            fixed_ns: self.snapshot_calls_ns
                + self.rollback_calls_ns * self.rollbacks_per_snapshot.min(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs of a made-up machine: a whole copy 400 ns a page, a tracked page 1200 ns (copy
    /// 400, fault 800), the scan 10 ns a page of the extent. With 1000 pages of extent a
    /// whole copy costs 400 µs; tracking `w` pages costs 10 + 1.2 × `w` µs: equal at 325.
    const COSTS: CopyCosts = CopyCosts {
        whole_ns: 400.0,
        written_ns: 400.0,
        fault_ns: 800.0,
        scan_ns: 10.0,
        fixed_ns: 0.0,
    };
    const EXTENT: usize = 1000;

    /// The pages that make tracking cost `ratio` times a whole copy.
    fn written_at(ratio: f64) -> usize {
        ((ratio * 400_000.0 - 10_000.0) / 1200.0).round() as usize
    }

    fn run(state: &mut AutoState, ratios: &[f64]) -> Vec<AutoStep> {
        ratios
            .iter()
            .map(|&r| state.after_tracked(&COSTS, EXTENT, EXTENT, written_at(r)))
            .collect()
    }

    #[test]
    fn an_interrupted_copy_does_not_move_the_estimate() {
        let mut r = Recent::EMPTY;
        assert_eq!(r.get(), None);
        for x in [400.0, 410.0, 390.0, 45_000.0, 405.0] {
            r.note(x);
        }
        assert_eq!(r.get(), Some(405.0));
        // Only the latest samples count: a machine that became slower is followed.
        for _ in 0..SAMPLES / 2 + 1 {
            r.note(900.0);
        }
        assert_eq!(r.get(), Some(900.0));
    }

    #[test]
    fn the_costs_count_the_scan_the_faults_and_the_copies() {
        assert_eq!(COSTS.tracked_ns(EXTENT, 325), 400_000.0);
        assert_eq!(COSTS.whole_copy_ns(EXTENT), 400_000.0);
        assert_eq!(COSTS.break_even(EXTENT), 0.325);
    }

    #[test]
    fn on_a_small_extent_the_fixed_cost_tips_the_balance_to_whole_copies() {
        use AutoStep::*;
        // 100 pages: a whole copy 40 µs. 20 pages written cost 1 + 24 µs per page, tracked
        // (0.63 of a whole copy): without a fixed cost tracking goes on; with the tracker's
        // calls at 20 µs a snapshot it costs 45 µs, more than a whole copy, twice in a row.
        let small = 100;
        let per_page = COSTS;
        let with_calls = CopyCosts {
            fixed_ns: 20_000.0,
            ..COSTS
        };
        assert!(with_calls.break_even(small) < 0.2 && per_page.break_even(small) > 0.3);
        let mut s = AutoState::default();
        let steps: Vec<_> = (0..3)
            .map(|_| s.after_tracked(&per_page, small, small, 20))
            .collect();
        assert_eq!(steps, [Track; 3]);
        let mut s = AutoState::default();
        let steps: Vec<_> = (0..2)
            .map(|_| s.after_tracked(&with_calls, small, small, 20))
            .collect();
        assert_eq!(steps, [Track, Pause(4)]);
        // On a large extent the same calls change nothing.
        let mut s = AutoState::default();
        let steps: Vec<_> = (0..3)
            .map(|_| s.after_tracked(&with_calls, 100 * small, 100 * small, 20 * small))
            .collect();
        assert_eq!(steps, [Track; 3]);
    }

    #[test]
    fn the_fixed_cost_carries_the_rollbacks_share_and_leaves_the_scan() {
        let mut m = CostModel::new(TrackerKind::Mprotect);
        m.snapshot_calls_ns = 2_000.0;
        m.rollback_calls_ns = 6_000.0;
        assert_eq!(m.costs().fixed_ns, 2_000.0);
        m.note_counts(300, 75);
        assert_eq!(m.costs().fixed_ns, 3_500.0);
        // A scan of 1000 pages that took 12 µs: 2 µs of calls, 10 ns a page.
        m.note_scan(1000, 0, Duration::from_micros(12));
        assert_eq!(m.costs().scan_ns, 10.0);
    }

    #[test]
    fn one_heavy_snapshot_among_light_ones_is_copied_whole_and_tracking_goes_on() {
        let mut s = AutoState::default();
        let steps = run(&mut s, &[0.1, 0.1, 5.0, 0.1, 0.1]);
        use AutoStep::*;
        assert_eq!(steps, [Track, Track, CopyWhole, Track, Track]);
        assert!(written_at(5.0) as f64 * COSTS.written_ns > COSTS.whole_copy_ns(EXTENT));
    }

    #[test]
    fn a_heavy_snapshot_whose_faults_are_paid_copies_the_cheaper_way() {
        use AutoStep::*;
        // 1.2 times a whole copy tracked (392 pages written): their copies alone cost 157 µs
        // against 400 for a whole copy; all 1000 pages written: 400 µs either way, whole.
        let mut s = AutoState::default();
        let steps = run(&mut s, &[0.1, 1.2, 0.1, 1.2, 1.2]);
        assert_eq!(steps, [Track, Track, Track, Track, Pause(4)]);
        let mut s = AutoState::default();
        let steps = vec![
            s.after_tracked(&COSTS, EXTENT, EXTENT, 10),
            s.after_tracked(&COSTS, EXTENT, EXTENT, EXTENT),
            s.after_tracked(&COSTS, EXTENT, EXTENT, 10),
        ];
        assert_eq!(steps, [Track, CopyWhole, Track]);
    }

    #[test]
    fn heavy_snapshots_pause_tracking_longer_each_time_a_probe_confirms_them() {
        use AutoStep::*;
        let mut s = AutoState::default();
        // Just above the break-even: pauses double up to 64 snapshots.
        let steps = run(&mut s, &[1.5; 9]);
        let pauses = [4, 8, 16, 32, 64, 64, 64, 64].map(Pause);
        assert_eq!(steps[0], Track);
        assert_eq!(steps[1..], pauses);
        // Far above it (a probe costs more than a whole copy's frame): up to 256.
        let mut s = AutoState::default();
        let steps = run(&mut s, &[2.5; 9]);
        let pauses = [4, 8, 16, 32, 64, 128, 256, 256].map(Pause);
        assert_eq!(steps[1..], pauses);
    }

    #[test]
    fn near_the_break_even_the_mode_in_use_is_kept() {
        use AutoStep::*;
        // Tracking that runs goes on up to the break-even, whatever the spread below it.
        let mut s = AutoState::default();
        let steps = run(&mut s, &[0.95, 0.85, 0.98, 1.0, 0.9, 0.82]);
        assert_eq!(steps, [Track; 6]);
        // Two snapshots in a row above it pause tracking; a probe a little below the
        // break-even does not resume it, one clearly below does, and pauses go on growing
        // until tracking has lasted 16 snapshots.
        let steps = run(&mut s, &[1.2, 1.2, 0.85, 0.75, 0.9, 1.2, 1.2]);
        assert_eq!(
            steps,
            [Track, Pause(4), Pause(8), Track, Track, Track, Pause(16)]
        );
        let steps = run(&mut s, &[0.75; 16]);
        assert_eq!(steps, [Track; 16]);
        let steps = run(&mut s, &[1.2, 1.2]);
        assert_eq!(steps, [Track, Pause(4)]);
        // One snapshot above it, then ones at it: tracking goes on.
        let mut s = AutoState::default();
        let steps = run(&mut s, &[1.2, 1.0, 0.98]);
        assert_eq!(steps, [Track; 3]);
    }
}
