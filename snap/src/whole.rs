//! Whole copies of an arena's extent that leave its free page runs out.
//!
//! The allocator zeroes pages as it frees them ([`Arena::free_runs`]), so the bytes of a free
//! run are known without reading them: a whole copy lists the runs instead of copying them,
//! and a restore writes zeros only where the arena is not free (so zero) already. On the
//! library games a fifth of the extent is free runs at a frame's end.

use crate::{restore_bytes, zero_bytes, SnapError};
use luasnap_alloc::{copy_streaming, Arena, Reservation};
use std::ops::Range;

/// The arena's bytes over one snapshot's extent, but for the free runs it had then.
pub(crate) struct WholeCopy {
    buf: Reservation,
    /// The free runs at the copy (sorted, disjoint): not in `buf`, zero in the arena then.
    zero: Vec<Range<usize>>,
}

impl WholeCopy {
    /// A copy buffer as large as an arena of `capacity` bytes (committed where written).
    pub(crate) fn new(capacity: usize) -> Result<WholeCopy, SnapError> {
        Ok(WholeCopy {
            buf: Reservation::for_copies(capacity)?,
            zero: Vec::new(),
        })
    }

    /// Copies `ranges` of the arena but for `free`, the arena's free runs now (as
    /// [`Arena::free_runs`] gives them: sorted). Returns the bytes copied.
    pub(crate) fn capture(
        &mut self,
        arena: &Arena,
        ranges: &[Range<usize>],
        free: &[Range<usize>],
    ) -> usize {
        self.zero.clear();
        let out = self.buf.as_mut_slice();
        let mut copied = 0;
        for r in ranges {
            pieces(r.clone(), free, |piece, is_free| {
                if is_free {
                    self.zero.push(piece);
                } else {
                    copied += piece.len();
                    copy_streaming(&mut out[piece.clone()], arena.bytes(piece));
                }
            });
        }
        copied
    }

    /// Writes `run` of the arena back as it was at the copy: the bytes copied, and zeros for
    /// the free runs of then but where `free_now` (the arena's free runs before this restore
    /// began, sorted) says the arena holds zeros already.
    pub(crate) fn restore(&self, arena: &mut Arena, run: Range<usize>, free_now: &[Range<usize>]) {
        pieces(run, &self.zero, |piece, was_free| {
            if !was_free {
                restore_bytes(arena, piece.start, &self.buf.as_slice()[piece]);
            } else {
                pieces(piece, free_now, |p, is_free| {
                    if !is_free {
                        zero_bytes(arena, p);
                    }
                });
            }
        });
    }

    /// Takes in bytes of a later state at `at` (a page record folded into the base): they are
    /// in the buffer now, whatever the copy left out there.
    pub(crate) fn write(&mut self, at: usize, bytes: &[u8]) {
        let run = at..at + bytes.len();
        copy_streaming(&mut self.buf.as_mut_slice()[run.clone()], bytes);
        // The zero runs `run` overlaps, found by binary search (a fold writes many runs),
        // give way to what is left of the first and the last of them outside `run`.
        let first = self.zero.partition_point(|z| z.end <= run.start);
        let last = first + self.zero[first..].partition_point(|z| z.start < run.end);
        if first == last {
            return;
        }
        let (head, tail) = (self.zero[first].start, self.zero[last - 1].end);
        let left = (head < run.start).then_some(head..run.start);
        let right = (tail > run.end).then_some(run.end..tail);
        self.zero.splice(first..last, left.into_iter().chain(right));
    }

    /// Bytes the copy left out (free runs).
    #[cfg(test)]
    pub(crate) fn skipped(&self) -> usize {
        self.zero.iter().map(|r| r.len()).sum()
    }
}

/// Calls `f` on the pieces of `run` in address order, each with whether it lies in one of
/// `sorted` (disjoint ranges in address order) or between them.
fn pieces(run: Range<usize>, sorted: &[Range<usize>], mut f: impl FnMut(Range<usize>, bool)) {
    let mut at = run.start;
    let first = sorted.partition_point(|r| r.end <= run.start);
    for r in &sorted[first..] {
        if r.start >= run.end {
            break;
        }
        let (start, end) = (r.start.max(at), r.end.min(run.end));
        if start > at {
            f(at..start, false);
        }
        f(start..end, true);
        at = end;
    }
    if at < run.end {
        f(at..run.end, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(run: Range<usize>, sorted: &[Range<usize>]) -> Vec<(Range<usize>, bool)> {
        let mut out = Vec::new();
        pieces(run, sorted, |p, inside| out.push((p, inside)));
        out
    }

    #[test]
    fn pieces_cover_the_run_in_order() {
        let sorted = [2..4, 6..9, 12..13];
        assert_eq!(
            split(0..10, &sorted),
            [
                (0..2, false),
                (2..4, true),
                (4..6, false),
                (6..9, true),
                (9..10, false)
            ]
        );
        assert_eq!(
            split(3..7, &sorted),
            [(3..4, true), (4..6, false), (6..7, true)]
        );
        assert_eq!(split(9..12, &sorted), [(9..12, false)]);
        assert_eq!(split(12..13, &sorted), [(12..13, true)]);
        assert_eq!(split(5..5, &sorted), []);
    }

    #[test]
    fn a_fold_takes_its_pages_out_of_the_zero_runs() -> Result<(), SnapError> {
        let mut w = WholeCopy::new(1 << 20)?;
        w.zero = vec![4096..5 * 4096, 8 * 4096..9 * 4096];
        w.write(2 * 4096, &[7u8; 4096]);
        assert_eq!(
            w.zero,
            [4096..2 * 4096, 3 * 4096..5 * 4096, 8 * 4096..9 * 4096]
        );
        w.write(4 * 4096, &[7u8; 5 * 4096]);
        assert_eq!(w.zero, [4096..2 * 4096, 3 * 4096..4 * 4096]);
        assert_eq!(w.skipped(), 2 * 4096);
        Ok(())
    }
}
