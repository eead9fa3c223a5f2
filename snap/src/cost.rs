//! What each way of copying costs on this machine, measured as snapshots are taken: the basis
//! of [`SnapshotMode::Auto`](crate::SnapshotMode::Auto).
//!
//! Per page of the extent, a whole copy costs one contiguous copy. Per page written, an
//! incremental snapshot costs its share of the written-page scan, the copy into a record and
//! the record's fold into the base copy (what the ring's incremental saves measure), plus one
//! write fault taken inside the workload when the page was first written after the previous
//! snapshot (what [`write_fault_ns`] measures once per process: the ring cannot see it). So
//! copying written pages pays off while
//!
//! ```text
//! written pages × (written_ns + fault_ns)  <  extent pages × whole_ns
//! ```
//!
//! that is below the break-even fraction `whole_ns / (written_ns + fault_ns)` of the extent's
//! pages written. With userfaultfd on the reference machine a fault costs about 0.6 µs and a
//! page copy 0.1-0.3 µs, so the break-even lies near a tenth of the pages, not the half the
//! copies alone would suggest.

use luasnap_alloc::{write_fault_ns, TrackerKind};
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

/// An exponentially weighted mean (weight 1/4 on each new sample).
#[derive(Debug, Clone, Copy)]
struct Mean(Option<f64>);

impl Mean {
    fn note(&mut self, x: f64) {
        self.0 = Some(match self.0 {
            Some(m) => m + (x - m) / 4.0,
            None => x,
        });
    }
}

/// The costs the automatic mode compares, in nanoseconds per page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyCosts {
    /// A whole copy of the extent, per page of it (measured on whole copies).
    pub whole_ns: f64,
    /// An incremental snapshot, per page written (scan, copy and fold; measured on incremental
    /// snapshots; before the first one, estimated as twice `whole_ns`).
    pub written_ns: f64,
    /// One write fault of the page tracker, taken in the workload (measured once per process).
    pub fault_ns: f64,
}

impl CopyCosts {
    /// The fraction of the extent's pages written above which a whole copy costs less than
    /// tracking and copying the written pages (in `0.0..=1.0`).
    pub fn break_even(&self) -> f64 {
        (self.whole_ns / (self.written_ns + self.fault_ns)).clamp(0.0, 1.0)
    }
}

/// Running measurements of one ring.
#[derive(Debug, Clone)]
pub(crate) struct CostModel {
    whole: Mean,
    written: Mean,
    fault_ns: f64,
}

impl CostModel {
    pub(crate) fn new(kind: TrackerKind) -> CostModel {
        CostModel {
            whole: Mean(None),
            written: Mean(None),
            fault_ns: workload_fault_ns(kind),
        }
    }

    /// A whole copy of `pages` pages took `took`.
    pub(crate) fn note_whole(&mut self, pages: usize, took: Duration) {
        if pages > 0 {
            self.whole.note(took.as_nanos() as f64 / pages as f64);
        }
    }

    /// An incremental snapshot of `pages` written pages took `took`.
    pub(crate) fn note_written(&mut self, pages: usize, took: Duration) {
        if pages > 0 {
            self.written.note(took.as_nanos() as f64 / pages as f64);
        }
    }

    pub(crate) fn costs(&self) -> CopyCosts {
        // Before any whole copy: a page copy at about 10 GB/s.
        let whole_ns = self.whole.0.unwrap_or(400.0);
        CopyCosts {
            whole_ns,
            written_ns: self.written.0.unwrap_or(2.0 * whole_ns),
            fault_ns: self.fault_ns,
        }
    }
}
