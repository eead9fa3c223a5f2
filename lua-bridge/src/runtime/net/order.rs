//! Ordering the players' commands into frames, and each client's frame delay.
//!
//! A command says "my input is `input` from frame `frame` on". The server keeps, per slot, the
//! input in force and the commands scheduled for frames not yet closed. Closing a frame applies
//! each slot's commands due by then (the latest wins) and gives the frame's inputs. A command
//! for a frame already closed is *late*: it takes effect at the next open frame instead.
//!
//! Invariant: a slot's schedule holds only frames in `next..=next + MAX_LEAD_FRAMES`, in
//! increasing order of arrival, so it never holds more than `MAX_LEAD_FRAMES + 1` entries
//! whatever a client sends.

use std::collections::BTreeMap;

/// How far ahead of the next open frame a command may be; further is a lie about the frame.
pub(crate) const MAX_LEAD_FRAMES: u64 = 512;
/// The largest frame delay the server asks of a client.
pub(crate) const MAX_DELAY_FRAMES: u32 = 120;
/// Frames over which the delay controller looks for slack before lowering a delay.
const SLACK_WINDOW: u64 = 90;

/// Where a command went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// At its frame, `slack` frames before that frame closes.
    OnTime { slack: u64 },
    /// At the next open frame, `by` frames after the one it named.
    Late { by: u64 },
}

/// A command the server refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CommandError {
    /// The frame is too far in the future: no honest client is that far ahead.
    #[error("a command for frame {frame}, more than {MAX_LEAD_FRAMES} frames past the next open frame {next}")]
    TooFarAhead { frame: u64, next: u64 },
    /// The frame is before the slot's previous command (commands travel in order).
    #[error("a command for frame {frame} after one for frame {last} (commands must not go back in time)")]
    Backwards { frame: u64, last: u64 },
}

/// The match's frames as the server closes them.
#[derive(Debug)]
pub(crate) struct FrameOrder {
    next: u64,
    held: Vec<u8>,
    scheduled: Vec<BTreeMap<u64, u8>>,
    last_command: Vec<Option<u64>>,
}

impl FrameOrder {
    /// Frame 0 of a match of `players`, every input 0.
    pub(crate) fn new(players: usize) -> FrameOrder {
        FrameOrder {
            next: 0,
            held: vec![0; players],
            scheduled: vec![BTreeMap::new(); players],
            last_command: vec![None; players],
        }
    }

    /// The next frame to close (= frames closed so far).
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// Schedules a slot's command.
    pub(crate) fn place(
        &mut self,
        slot: usize,
        frame: u64,
        input: u8,
    ) -> Result<Placement, CommandError> {
        if frame > self.next + MAX_LEAD_FRAMES {
            return Err(CommandError::TooFarAhead {
                frame,
                next: self.next,
            });
        }
        if let Some(last) = self.last_command[slot] {
            if frame < last {
                return Err(CommandError::Backwards { frame, last });
            }
        }
        self.last_command[slot] = Some(frame);
        let (at, placement) = if frame >= self.next {
            (
                frame,
                Placement::OnTime {
                    slack: frame - self.next,
                },
            )
        } else {
            (
                self.next,
                Placement::Late {
                    by: self.next - frame,
                },
            )
        };
        self.scheduled[slot].insert(at, input);
        Ok(placement)
    }

    /// Closes the next frame: its number and its inputs, one per slot.
    pub(crate) fn close(&mut self) -> (u64, Vec<u8>) {
        let frame = self.next;
        for (slot, schedule) in self.scheduled.iter_mut().enumerate() {
            while let Some(entry) = schedule.first_entry() {
                if *entry.key() > frame {
                    break;
                }
                self.held[slot] = entry.remove();
            }
        }
        self.next += 1;
        (frame, self.held.clone())
    }

    /// A slot left: it plays no input (0) from the next frame on.
    pub(crate) fn clear(&mut self, slot: usize) {
        self.held[slot] = 0;
        self.scheduled[slot].clear();
        self.last_command[slot] = None;
    }
}

/// One client's frame delay: how many frames ahead of the last confirmation it receives its
/// commands must name so that they reach the server before their frame closes. It starts
/// from the round trip; a late command raises it at once (by the frames it was late); a
/// window of commands that all had two frames or more to spare lowers it by one.
#[derive(Debug, Clone)]
pub(crate) struct DelayControl {
    delay: u32,
    /// The delay it started with (from the round trip alone).
    start: u32,
    min_slack: u64,
    window_start: u64,
    /// Frames before which lateness is not held against the delay (commands sent under the
    /// previous delay are still arriving).
    settle_until: u64,
    /// Late commands seen.
    pub(crate) late: u64,
}

impl DelayControl {
    /// A delay for a round trip of `rtt_ticks` frames.
    pub(crate) fn new(rtt_ticks: f64, now: u64) -> DelayControl {
        let delay = (rtt_ticks.ceil().max(0.0) as u32 + 2).min(MAX_DELAY_FRAMES);
        DelayControl {
            delay,
            start: delay,
            min_slack: u64::MAX,
            window_start: now,
            settle_until: now,
            late: 0,
        }
    }

    /// The delay in force.
    pub(crate) fn delay(&self) -> u32 {
        self.delay
    }

    /// The delay it started with, from the round trip alone: a delay far above it was raised
    /// by commands that arrived late.
    pub(crate) fn start(&self) -> u32 {
        self.start
    }

    /// Whether lateness raised the delay well past its start (to twice it and by 4 frames or
    /// more): the client's commands keep arriving after their frames closed, which a slow
    /// link does not explain (the start covers the round trip), a client too slow to keep up
    /// does.
    pub(crate) fn grew(&self) -> bool {
        self.delay >= 2 * self.start && self.delay >= self.start + 4
    }

    /// Takes a command's placement at frame `now`; returns the new delay if it changed.
    pub(crate) fn observe(&mut self, placement: Placement, now: u64) -> Option<u32> {
        match placement {
            Placement::Late { by } => {
                self.late += 1;
                if now < self.settle_until || self.delay >= MAX_DELAY_FRAMES {
                    return None;
                }
                self.delay = (self.delay + by.min(8) as u32).min(MAX_DELAY_FRAMES);
                self.settle_until = now + self.delay as u64 + 1;
                self.min_slack = u64::MAX;
                self.window_start = now;
                Some(self.delay)
            }
            Placement::OnTime { slack } => {
                self.min_slack = self.min_slack.min(slack);
                if now < self.window_start + SLACK_WINDOW {
                    return None;
                }
                let lower = self.min_slack >= 2 && self.min_slack != u64::MAX && self.delay > 1;
                self.min_slack = u64::MAX;
                self.window_start = now;
                if lower {
                    self.delay -= 1;
                    self.settle_until = now + self.delay as u64 + 1;
                    Some(self.delay)
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_hold_until_the_next_and_late_ones_move_to_the_open_frame() {
        let mut o = FrameOrder::new(2);
        assert_eq!(o.place(0, 2, 5), Ok(Placement::OnTime { slack: 2 }));
        assert_eq!(o.close(), (0, vec![0, 0]));
        assert_eq!(o.close(), (1, vec![0, 0]));
        assert_eq!(o.close(), (2, vec![5, 0]));
        assert_eq!(o.place(1, 1, 7), Ok(Placement::Late { by: 2 }));
        assert_eq!(o.close(), (3, vec![5, 7]));
        o.clear(0);
        assert_eq!(o.close(), (4, vec![0, 7]));
    }

    #[test]
    fn lies_about_frames_are_refused_and_the_schedule_stays_bounded() {
        let mut o = FrameOrder::new(1);
        assert!(matches!(
            o.place(0, MAX_LEAD_FRAMES + 1, 1),
            Err(CommandError::TooFarAhead { .. })
        ));
        o.place(0, 10, 1).unwrap();
        assert_eq!(
            o.place(0, 9, 1),
            Err(CommandError::Backwards { frame: 9, last: 10 })
        );
        for f in 10..=MAX_LEAD_FRAMES + 100 {
            let _ = o.place(0, f, (f % 7) as u8);
        }
        assert!(o.scheduled[0].len() as u64 <= MAX_LEAD_FRAMES + 1);
    }

    #[test]
    fn the_delay_rises_when_late_and_falls_with_slack() {
        let mut d = DelayControl::new(3.2, 0);
        assert_eq!(d.delay(), 6);
        assert_eq!(d.observe(Placement::Late { by: 2 }, 10), Some(8));
        // Commands sent under the old delay are still late: not held against the new one.
        assert_eq!(d.observe(Placement::Late { by: 1 }, 12), None);
        let mut changed = None;
        for now in 20..200 {
            changed = changed.or(d.observe(Placement::OnTime { slack: 3 }, now));
        }
        assert_eq!(changed, Some(7));
    }

    #[test]
    fn a_delay_raised_far_past_its_start_has_grown() {
        let mut d = DelayControl::new(2.5, 0);
        assert_eq!((d.start(), d.delay()), (5, 5));
        assert!(!d.grew());
        d.observe(Placement::Late { by: 3 }, 10);
        assert!(
            !d.grew(),
            "8 frames from 5 is a link's jitter, not falling behind"
        );
        d.observe(Placement::Late { by: 8 }, 30);
        assert_eq!(d.delay(), 16);
        assert!(d.grew());
    }
}
