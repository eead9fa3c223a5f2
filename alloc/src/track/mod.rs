//! Recording which pages of an arena get written.
//!
//! Two mechanisms, chosen at run time:
//! - [`TrackerKind::Uffd`]: userfaultfd write-protection in asynchronous mode
//!   (`UFFD_FEATURE_WP_ASYNC`, Linux 6.7+), read back and re-armed in one `PAGEMAP_SCAN` ioctl.
//!   The kernel resolves the write faults itself (~1 µs each, no signal), and writes made by
//!   syscalls are tracked like any other.
//! - [`TrackerKind::Mprotect`]: pages made read-only, a `SIGSEGV` handler records the first write
//!   to each and makes it writable again. Portable to any Unix, but ~3-6 µs per first write, and
//!   a syscall writing into a protected page fails with `EFAULT` instead of faulting: call
//!   [`Arena::prepare_external_write`](crate::Arena::prepare_external_write) first.
//!
//! Where neither works, there is no tracker and snapshots copy everything.
//!
//! The protocol, in offsets from the arena base (all page-aligned):
//! [`arm`](PageTracker::arm) a range to start recording it, [`collect`](PageTracker::collect)
//! the runs written since (which re-arms them), [`disarm`](PageTracker::disarm) to stop.
//! A page that was never armed reads as not written: the caller must treat ranges it has not
//! armed as written.

mod mprotect;
mod uffd;

use crate::error::TrackError;
use std::fmt;
use std::ops::Range;
use std::ptr::NonNull;

/// A written-page tracking mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrackerKind {
    /// userfaultfd asynchronous write-protect plus the `PAGEMAP_SCAN` ioctl (Linux 6.7+).
    Uffd,
    /// `mprotect` plus a `SIGSEGV` handler.
    Mprotect,
}

impl fmt::Display for TrackerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrackerKind::Uffd => "userfaultfd+pagemap_scan",
            TrackerKind::Mprotect => "mprotect+sigsegv",
        })
    }
}

impl TrackerKind {
    /// The fraction of pages written per frame above which tracking costs more than copying
    /// everything. Measured before luasnap was written, on a 2-vCPU Xeon VM (Linux 6.18):
    /// tracking a frame cost as much as one full copy of the arena once about 20% of its
    /// pages were written under userfaultfd, 5% under mprotect (a first write to a page costs
    /// about 0.9 µs and 3.5-6.5 µs respectively; a 100 MiB copy about 12 ms).
    pub fn break_even_fraction(self) -> f64 {
        match self {
            TrackerKind::Uffd => 0.20,
            TrackerKind::Mprotect => 0.05,
        }
    }
}

/// Which mechanism to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrackerPreference {
    /// userfaultfd if it works here, else mprotect.
    #[default]
    Auto,
    /// Only this mechanism; fail if it does not work.
    Only(TrackerKind),
}

/// What each mechanism does in this process, as found by [`probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerSupport {
    /// `Ok` if userfaultfd + `PAGEMAP_SCAN` work, else why not.
    pub uffd: Result<(), String>,
    /// `Ok` if the mprotect tracker works, else why not.
    pub mprotect: Result<(), String>,
}

impl TrackerSupport {
    /// The mechanism `TrackerPreference::Auto` picks, if any.
    pub fn best(&self) -> Option<TrackerKind> {
        if self.uffd.is_ok() {
            Some(TrackerKind::Uffd)
        } else if self.mprotect.is_ok() {
            Some(TrackerKind::Mprotect)
        } else {
            None
        }
    }
}

/// Tries each mechanism on a small scratch mapping and reports what works here.
pub fn probe() -> TrackerSupport {
    let try_kind = |kind| -> Result<(), String> {
        let mut scratch = crate::mapping::Reservation::new(4 * crate::PAGE_SIZE, None)
            .map_err(|e| e.to_string())?;
        let mut t = PageTracker::new(scratch.base(), scratch.len(), TrackerPreference::Only(kind))
            .map_err(|e| e.to_string())?;
        t.arm(0..scratch.len()).map_err(|e| e.to_string())?;
        scratch.prefault(crate::PAGE_SIZE..2 * crate::PAGE_SIZE);
        let mut runs = Vec::new();
        t.collect(0..scratch.len(), &mut runs)
            .map_err(|e| e.to_string())?;
        if runs.len() != 1 || runs[0] != (crate::PAGE_SIZE..2 * crate::PAGE_SIZE) {
            return Err(format!("a test write to page 1 was reported as {runs:?}"));
        }
        drop(t);
        Ok(())
    };
    TrackerSupport {
        uffd: try_kind(TrackerKind::Uffd),
        mprotect: try_kind(TrackerKind::Mprotect),
    }
}

enum Imp {
    Uffd(uffd::UffdTracker),
    Mprotect(mprotect::MprotectTracker),
}

/// Records writes to the pages of one region. Owned by the [`Arena`](crate::Arena) it watches,
/// so it always stops before the region is unmapped.
pub struct PageTracker {
    base: NonNull<u8>,
    len: usize,
    imp: Imp,
    fail_next: bool,
}

// SAFETY: the tracker holds the region's address (which it only passes to syscalls) and owned
// file descriptors / a registry slot; none of it is tied to the creating thread.
unsafe impl Send for PageTracker {}

impl fmt::Debug for PageTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageTracker")
            .field("kind", &self.kind())
            .field("len", &self.len)
            .finish()
    }
}

impl PageTracker {
    pub(crate) fn new(
        base: NonNull<u8>,
        len: usize,
        preference: TrackerPreference,
    ) -> Result<PageTracker, TrackError> {
        let imp = match preference {
            TrackerPreference::Only(TrackerKind::Uffd) => {
                Imp::Uffd(uffd::UffdTracker::new(base, len)?)
            }
            TrackerPreference::Only(TrackerKind::Mprotect) => {
                Imp::Mprotect(mprotect::MprotectTracker::new(base, len)?)
            }
            TrackerPreference::Auto => match uffd::UffdTracker::new(base, len) {
                Ok(t) => Imp::Uffd(t),
                Err(_) => Imp::Mprotect(mprotect::MprotectTracker::new(base, len)?),
            },
        };
        Ok(PageTracker {
            base,
            len,
            imp,
            fail_next: false,
        })
    }

    /// The mechanism in use.
    pub fn kind(&self) -> TrackerKind {
        match self.imp {
            Imp::Uffd(_) => TrackerKind::Uffd,
            Imp::Mprotect(_) => TrackerKind::Mprotect,
        }
    }

    /// Fault injection for tests: the next `arm`, `collect` or `disarm` fails as if the kernel
    /// had refused it, without touching any page.
    #[doc(hidden)]
    pub fn inject_failure(&mut self) {
        self.fail_next = true;
    }

    fn check(&mut self, range: &Range<usize>) -> Result<(), TrackError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(TrackError::Syscall {
                kind: self.kind(),
                call: "injected failure",
                errno: libc::EPERM,
            });
        }
        assert!(
            range.start % crate::PAGE_SIZE == 0
                && range.end % crate::PAGE_SIZE == 0
                && range.start <= range.end
                && range.end <= self.len,
            "tracker range {range:?} is not page-aligned inside 0..{}",
            self.len
        );
        Ok(())
    }

    /// Starts recording writes to `range` and forgets earlier ones there.
    pub fn arm(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        self.check(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        match &mut self.imp {
            Imp::Uffd(t) => t.protect(self.base, range, true),
            Imp::Mprotect(t) => t.arm(range),
        }
    }

    /// Appends to `out` the runs of pages in `range` written since they were armed (merged,
    /// in address order) and re-arms them.
    pub fn collect(
        &mut self,
        range: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        self.check(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        match &mut self.imp {
            Imp::Uffd(t) => t.collect(self.base, range, out),
            Imp::Mprotect(t) => t.collect(range, out),
        }
    }

    /// Appends the runs written since armed, like [`collect`](PageTracker::collect), but leaves
    /// them writable and marked: for a caller about to overwrite them itself, which then re-arms
    /// them with [`rearm_runs`](PageTracker::rearm_runs) (saving a write fault per page).
    pub fn peek(
        &mut self,
        range: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        self.check(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        match &mut self.imp {
            Imp::Uffd(t) => t.peek(self.base, range, out),
            Imp::Mprotect(t) => {
                t.peek(range, out);
                Ok(())
            }
        }
    }

    /// Re-arms exactly these runs (e.g. after the caller wrote them itself while restoring).
    pub fn rearm_runs(&mut self, runs: &[Range<usize>]) -> Result<(), TrackError> {
        for r in runs {
            self.arm(r.clone())?;
        }
        Ok(())
    }

    /// Opens these runs for writes by the caller, which will re-arm them with
    /// [`rearm_runs`](PageTracker::rearm_runs) afterwards: they count as written until then.
    /// One call per run, where writing armed pages would take a write fault per page (with
    /// userfaultfd about a microsecond each; with mprotect a signal each).
    pub fn open_runs(&mut self, runs: &[Range<usize>]) -> Result<(), TrackError> {
        for r in runs {
            self.check(r)?;
            if r.is_empty() {
                continue;
            }
            match &mut self.imp {
                Imp::Uffd(t) => t.protect(self.base, r.clone(), false)?,
                Imp::Mprotect(t) => t.expose(r.clone())?,
            }
        }
        Ok(())
    }

    /// Stops recording `range`; writes there cost nothing and are no longer seen.
    pub fn disarm(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        self.check(&range)?;
        if range.is_empty() {
            return Ok(());
        }
        match &mut self.imp {
            Imp::Uffd(t) => t.protect(self.base, range, false),
            Imp::Mprotect(t) => t.disarm(range),
        }
    }

    /// See [`Arena::prepare_external_write`](crate::Arena::prepare_external_write).
    pub fn prepare_external_write(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        let start = range.start - range.start % crate::PAGE_SIZE;
        let end = range.end.next_multiple_of(crate::PAGE_SIZE).min(self.len);
        if start >= end {
            return Ok(());
        }
        match &mut self.imp {
            Imp::Uffd(_) => Ok(()),
            Imp::Mprotect(t) => t.expose(start..end),
        }
    }
}

/// Appends `run` to `out`, merging it with the last run if they touch.
pub(crate) fn push_run(out: &mut Vec<Range<usize>>, run: Range<usize>) {
    if let Some(last) = out.last_mut() {
        if last.end == run.start {
            last.end = run.end;
            return;
        }
    }
    out.push(run);
}

/// What one first write to an armed page costs with `kind` in this process, in nanoseconds
/// (the median of a few rounds over 128 scratch pages; measured once per process, on first
/// use, in about a millisecond). `None` if the mechanism does not work here. Page tracking
/// costs this on every page a workload writes between two snapshots, inside the workload
/// itself: the snapshot ring's automatic mode weighs it against copying the pages.
pub fn write_fault_ns(kind: TrackerKind) -> Option<f64> {
    static UFFD: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    static MPROTECT: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    let cell = match kind {
        TrackerKind::Uffd => &UFFD,
        TrackerKind::Mprotect => &MPROTECT,
    };
    *cell.get_or_init(|| measure_write_faults(kind).ok())
}

/// What a page costs in this process, in nanoseconds: copied within a whole copy, and copied
/// as written (the tracker's scan and re-arming, the copy into a record and the record's fold
/// into a base copy: what the snapshot ring's saves do, with the same streaming copies,
/// [`copy_streaming`](crate::copy_streaming)). Measured once per process, on first
/// use, on 8 MiB of scratch pages in the thread's CPU time (a copy the scheduler interrupts is
/// not counted longer), the median of 5 rounds: a few milliseconds. `None` if the tracker does
/// not work here.
///
/// The ring's own snapshots were the measurement before: a copy interrupted by the scheduler
/// (a shared machine) or a first copy into fresh memory (a zero-filled page fault per page)
/// set an estimate that was not measured again once the mode switched (on the AI village, a
/// whole copy estimated at 11.5 µs a page kept tracking on for good).
pub fn page_copy_ns(kind: TrackerKind) -> Option<(f64, f64)> {
    static UFFD: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    static MPROTECT: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    let cell = match kind {
        TrackerKind::Uffd => &UFFD,
        TrackerKind::Mprotect => &MPROTECT,
    };
    *cell.get_or_init(|| measure_page_copies(kind).ok())
}

/// What the tracker's own calls cost a tracked snapshot and a rollback in this process, in
/// nanoseconds, whatever the pages: `(snapshot, rollback)`. A snapshot's scan collects the
/// written pages (the system calls that read and re-arm the tracker's state); a rollback
/// peeks at them, opens the pages it restores and re-arms them. Measured once per process, on
/// first use, on one written scratch page (so that the calls do their least work), in the
/// thread's CPU time, the median of 9 rounds. `None` if the tracker does not work here.
///
/// A page copy's cost ([`page_copy_ns`]) and the scan's cost per page of an extent grow with
/// the pages; these do not, and on a small arena (a 0.7 MiB game: 180 pages, a whole copy of
/// 30-60 µs) they are a share of a tracked frame that a per-page model leaves out.
pub fn tracker_call_ns(kind: TrackerKind) -> Option<(f64, f64)> {
    static UFFD: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    static MPROTECT: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    let cell = match kind {
        TrackerKind::Uffd => &UFFD,
        TrackerKind::Mprotect => &MPROTECT,
    };
    *cell.get_or_init(|| measure_tracker_calls(kind).ok())
}

fn measure_tracker_calls(kind: TrackerKind) -> Result<(f64, f64), String> {
    const PAGES: usize = 4;
    let len = PAGES * crate::PAGE_SIZE;
    let mut scratch = crate::mapping::Reservation::new(len, None).map_err(|e| e.to_string())?;
    scratch.prefault(0..len);
    let mut tracker = PageTracker::new(scratch.base(), len, TrackerPreference::Only(kind))
        .map_err(|e| e.to_string())?;
    tracker.arm(0..len).map_err(|e| e.to_string())?;
    let page = 0..crate::PAGE_SIZE;
    let (mut snapshot, mut rollback, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..9 {
        // Writes the page (a volatile read-modify-write): the fault is not timed.
        scratch.prefault(page.clone());
        runs.clear();
        let t = thread_cpu_ns();
        tracker
            .collect(0..len, &mut runs)
            .map_err(|e| e.to_string())?;
        snapshot.push(thread_cpu_ns() - t);
        scratch.prefault(page.clone());
        runs.clear();
        let t = thread_cpu_ns();
        tracker.peek(0..len, &mut runs).map_err(|e| e.to_string())?;
        tracker
            .open_runs(std::slice::from_ref(&page))
            .map_err(|e| e.to_string())?;
        tracker
            .collect(0..len, &mut runs)
            .map_err(|e| e.to_string())?;
        rollback.push(thread_cpu_ns() - t);
    }
    drop(tracker);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(&mut snapshot), median(&mut rollback)))
}

/// The calling thread's CPU time, in nanoseconds (user and system time: the kernel's work in
/// the thread's system calls and page faults counts, time spent waiting for a core does not).
/// The clock every cost measurement of page tracking uses: on a shared machine a wall-clock
/// measurement that the scheduler interrupted reads milliseconds for microseconds of work.
pub fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    debug_assert_eq!(rc, 0);
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

fn measure_page_copies(kind: TrackerKind) -> Result<(f64, f64), String> {
    /// 8 MiB: more than the caches hold, as a game's extent is.
    const PAGES: usize = 2048;
    /// One page in this many written, in runs of one page.
    const EVERY: usize = 4;
    let len = PAGES * crate::PAGE_SIZE;
    let reserve = |len| crate::mapping::Reservation::new(len, None).map_err(|e| e.to_string());
    let (mut src, mut dst, mut rec) = (reserve(len)?, reserve(len)?, reserve(len / EVERY)?);
    for r in [&mut src, &mut dst, &mut rec] {
        let n = r.len();
        r.prefault(0..n);
    }
    let mut tracker = PageTracker::new(src.base(), len, TrackerPreference::Only(kind))
        .map_err(|e| e.to_string())?;
    let (mut whole, mut written, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = thread_cpu_ns();
        crate::copy_streaming(dst.as_mut_slice(), src.as_slice());
        whole.push((thread_cpu_ns() - t) / PAGES as f64);
        tracker.arm(0..len).map_err(|e| e.to_string())?;
        for page in (0..PAGES).step_by(EVERY) {
            // Writes the page (a volatile read-modify-write): the fault is not timed.
            src.prefault(page * crate::PAGE_SIZE..page * crate::PAGE_SIZE + 1);
        }
        let t = thread_cpu_ns();
        runs.clear();
        tracker
            .collect(0..len, &mut runs)
            .map_err(|e| e.to_string())?;
        let mut at = 0;
        for run in &runs {
            crate::copy_streaming(
                &mut rec.as_mut_slice()[at..at + run.len()],
                &src.as_slice()[run.clone()],
            );
            at += run.len();
        }
        let mut at = 0;
        for run in &runs {
            crate::copy_streaming(
                &mut dst.as_mut_slice()[run.clone()],
                &rec.as_slice()[at..at + run.len()],
            );
            at += run.len();
        }
        written.push((thread_cpu_ns() - t) / (PAGES / EVERY) as f64);
    }
    drop(tracker);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(&mut whole), median(&mut written)))
}

fn measure_write_faults(kind: TrackerKind) -> Result<f64, String> {
    const PAGES: usize = 128;
    let mut scratch = crate::mapping::Reservation::new(PAGES * crate::PAGE_SIZE, None)
        .map_err(|e| e.to_string())?;
    let len = scratch.len();
    let mut t = PageTracker::new(scratch.base(), len, TrackerPreference::Only(kind))
        .map_err(|e| e.to_string())?;
    scratch.prefault(0..len);
    let mut rounds = Vec::new();
    for _ in 0..5 {
        t.arm(0..len).map_err(|e| e.to_string())?;
        // In the thread's CPU time: the fault is handled in this thread (the kernel's
        // asynchronous write-protect mode, or the SIGSEGV handler), and a round the scheduler
        // interrupted is not counted longer.
        let start = thread_cpu_ns();
        // Touching each page writes it (a volatile read-modify-write), which takes the fault.
        scratch.prefault(0..len);
        rounds.push((thread_cpu_ns() - start) / PAGES as f64);
    }
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[rounds.len() / 2])
}
