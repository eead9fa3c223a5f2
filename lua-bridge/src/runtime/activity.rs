//! What a game is doing, for a watchdog on another thread: which call into the game or which
//! save or load runs now, since when, and the time each kind of work took so far.
//!
//! A watchdog that sees no frame finish for a while cannot tell an endless loop in `G.step`
//! from a save of a 1 GB heap that takes seconds, or from `G.init` still running before the
//! first frame: an outside tester's watchdog asked "is G.step in an endless loop?" while
//! `G.step` took microseconds and the time went into saves. [`GameConfig::activity`]
//! (shared by every game built from the configuration and its clones) records it; the
//! watchdog reads [`Activity::now`] and the difference of two [`Activity::spent`].
//!
//! [`GameConfig::activity`]: super::GameConfig::activity

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A kind of work a game does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The script's top level, with the modules it requires there.
    TopLevel,
    /// `G.init(players, seed)`.
    Init,
    /// `G.step(inputs)`, with the collection point after it.
    Step,
    /// A save of the state (a snapshot, or a save-game).
    Save,
    /// A load of a saved state (a rollback, or a save-game read).
    Load,
    /// `G.digest()` or the value digest.
    Digest,
}

impl Work {
    /// Every kind, in the order [`Spent`] keeps them.
    pub const ALL: [Work; 6] = [
        Work::TopLevel,
        Work::Init,
        Work::Step,
        Work::Save,
        Work::Load,
        Work::Digest,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The call's or the work's name, as a sentence uses it (`G.step`, `saves`).
    pub fn name(self) -> &'static str {
        match self {
            Work::TopLevel => "the script's top level",
            Work::Init => "G.init",
            Work::Step => "G.step",
            Work::Save => "saves",
            Work::Load => "loads",
            Work::Digest => "digests",
        }
    }
}

/// The time each kind of work took, in the order of [`Work::ALL`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent([Duration; 6]);

impl Spent {
    /// The time `work` took.
    pub fn of(&self, work: Work) -> Duration {
        self.0[work.index()]
    }

    /// Counts `d` more of `work`.
    pub fn add(&mut self, work: Work, d: Duration) {
        self.0[work.index()] += d;
    }

    /// The time taken since `earlier` was read, each kind.
    pub fn since(&self, earlier: &Spent) -> Spent {
        let mut d = *self;
        for (now, then) in d.0.iter_mut().zip(earlier.0) {
            *now = now.saturating_sub(then);
        }
        d
    }
}

/// See the module's doc. Clones share the record.
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<Mutex<Record>>);

#[derive(Debug, Default)]
struct Record {
    /// The work running now, and since when.
    now: Option<(Work, Instant)>,
    spent: Spent,
}

impl Activity {
    /// A record of nothing done yet.
    pub fn new() -> Activity {
        Activity::default()
    }

    /// The work running now and how long it has run, if any.
    pub fn now(&self) -> Option<(Work, Duration)> {
        let r = self.0.lock().ok()?;
        r.now.map(|(w, since)| (w, since.elapsed()))
    }

    /// The time each kind of work took so far, the one running now included.
    pub fn spent(&self) -> Spent {
        let Ok(r) = self.0.lock() else {
            return Spent::default();
        };
        let mut s = r.spent;
        if let Some((w, since)) = r.now {
            s.add(w, since.elapsed());
        }
        s
    }

    /// Runs `f` as `work`. Work inside work (the top level inside a save-game's load) counts
    /// as the outer work.
    pub(crate) fn run<R>(&self, work: Work, f: impl FnOnce() -> R) -> R {
        let began = Instant::now();
        let outer = match self.0.lock() {
            Ok(mut r) if r.now.is_none() => {
                r.now = Some((work, began));
                false
            }
            _ => true,
        };
        let result = f();
        if !outer {
            if let Ok(mut r) = self.0.lock() {
                r.now = None;
                r.spent.add(work, began.elapsed());
            }
        }
        result
    }
}

/// Runs `f` as `work` in `activity`, if there is one.
pub(crate) fn as_work<R>(activity: Option<&Activity>, work: Work, f: impl FnOnce() -> R) -> R {
    match activity {
        Some(a) => a.run(work, f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_recorded_while_it_runs_and_summed_after() {
        let a = Activity::new();
        assert_eq!(a.now(), None);
        let before = a.spent();
        a.run(Work::Save, || {
            assert_eq!(a.now().map(|(w, _)| w), Some(Work::Save));
            // Inner work counts as the outer.
            a.run(Work::TopLevel, || {
                assert_eq!(a.now().map(|(w, _)| w), Some(Work::Save));
            });
            std::thread::sleep(Duration::from_millis(2));
        });
        assert_eq!(a.now(), None);
        let d = a.spent().since(&before);
        assert!(d.of(Work::Save) >= Duration::from_millis(2));
        assert_eq!(d.of(Work::TopLevel), Duration::ZERO);
        assert_eq!(d.of(Work::Step), Duration::ZERO);
    }
}
