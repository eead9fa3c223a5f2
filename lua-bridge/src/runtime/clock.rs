//! The clock the runtime's timings read.

use std::time::{Duration, Instant};

/// Which clock the runtime's timings read (the per-frame save, load and step times of a
/// [`FrameSession`](crate::runtime::FrameSession) and of `simulate`'s reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Clock {
    /// Wall time: what a player waits for.
    #[default]
    Wall,
    /// The calling thread's CPU time, user and system (write faults included): on a machine
    /// shared with other work, time spent waiting for a core is not counted, so costs compare
    /// better between runs.
    ThreadCpu,
}

impl Clock {
    /// Runs `f` and returns its result with the time it took on this clock.
    pub fn time<T>(self, f: impl FnOnce() -> T) -> (T, Duration) {
        match self {
            Clock::Wall => {
                let t = Instant::now();
                let r = f();
                (r, t.elapsed())
            }
            Clock::ThreadCpu => {
                let t = cpu_time::ThreadTime::now();
                let r = f();
                (r, t.elapsed())
            }
        }
    }
}
