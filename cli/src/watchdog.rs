//! `simulate`'s stall warning: when no frame has finished for a while (10 s), it says where
//! the time since the last one went (`G.step`, saves, loads, `G.init`, the script's top
//! level, digests, from the game's [`Activity`]), what runs now and what to do. It watches
//! from before the game is built, so an endless `G.init` or top level is named too, with
//! the step budget off as well.
//!
//! It asked "is G.step in an endless loop?" whatever the cause: an outside tester's 1 GB
//! heap was told so while `G.step` took microseconds and each save seconds.

use luasnap::bridge::runtime::{Activity, Spent, Work};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long without a finished frame before the warning: 10 s, or
/// `LUASNAP_STALL_WARNING_SECS`.
fn stall_after() -> Duration {
    let secs = std::env::var("LUASNAP_STALL_WARNING_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// The last finished frame: its run (as the warning names it), the frames that run has
/// done, when, and the game's work so far at that moment.
struct LastFrame {
    run: Option<String>,
    done: u64,
    at: Instant,
    spent: Spent,
}

/// What the watchdog reads; clones share it.
#[derive(Clone)]
pub(crate) struct FrameWatch {
    last: Arc<Mutex<LastFrame>>,
    activity: Activity,
    /// The frame the runs start at (a loaded save's), once the game is built.
    start_frame: Arc<AtomicU64>,
    /// Set while another process watches itself (a mode's process of `--mode all` warns on
    /// its own, from its own game's activity).
    delegated: Arc<AtomicBool>,
}

impl FrameWatch {
    /// Watches the games that record into `activity` (GameConfig::activity).
    pub(crate) fn new(activity: Activity) -> FrameWatch {
        FrameWatch {
            last: Arc::new(Mutex::new(LastFrame {
                run: None,
                done: 0,
                at: Instant::now(),
                spent: activity.spent(),
            })),
            activity,
            start_frame: Arc::new(AtomicU64::new(0)),
            delegated: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The game is built: its runs start at `frame`.
    pub(crate) fn set_start_frame(&self, frame: u64) {
        self.start_frame.store(frame, Ordering::Relaxed);
    }

    /// While `on`, another process watches itself: no warning from here.
    pub(crate) fn delegate(&self, on: bool) {
        self.delegated.store(on, Ordering::Relaxed);
    }

    /// `done` frames of `run` have finished.
    pub(crate) fn frame_done(&self, run: &str, done: u64) {
        let spent = self.activity.spent();
        if let Ok(mut w) = self.last.lock() {
            if w.run.as_deref() != Some(run) {
                w.run = Some(run.to_string());
            }
            w.done = done;
            w.at = Instant::now();
            w.spent = spent;
        }
    }

    /// Warns through `say` when no frame has finished for a while, once per stall, until
    /// `finished`. `budget_off`: `--step-budget off` (the hint then says how to stop a loop).
    pub(crate) fn spawn(
        &self,
        finished: Arc<AtomicBool>,
        budget_off: bool,
        say: fn(&str),
    ) -> std::thread::JoinHandle<()> {
        let watch = self.clone();
        let stall = stall_after();
        std::thread::spawn(move || {
            let mut warned_at = None;
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if watch.delegated.load(Ordering::Relaxed) {
                    continue;
                }
                let Some((at, text)) = watch.stalled(stall, budget_off) else {
                    continue;
                };
                if warned_at != Some(at) {
                    warned_at = Some(at);
                    say(&text);
                }
            }
        })
    }

    /// The warning, if no frame has finished for `stall`, with the moment of the last one.
    fn stalled(&self, stall: Duration, budget_off: bool) -> Option<(Instant, String)> {
        let w = self.last.lock().ok()?;
        if w.at.elapsed() < stall {
            return None;
        }
        let place = match &w.run {
            Some(run) => format!(
                "in the {run} run (at frame {})",
                self.start_frame.load(Ordering::Relaxed) + w.done
            ),
            None => "since the run began (no frame yet: the game is being built)".into(),
        };
        let stall = Stall {
            waited: w.at.elapsed(),
            place,
            spent: self.activity.spent().since(&w.spent),
            now: self.activity.now(),
            budget_off,
        };
        Some((w.at, stall.to_string()))
    }
}

/// A stall, as the warning tells it.
pub(crate) struct Stall {
    /// Time since the last finished frame (or since the run began).
    pub waited: Duration,
    /// Which run and frame (`in the full run (at frame 120)`).
    pub place: String,
    /// The game's work since then, by kind.
    pub spent: Spent,
    /// The work running now, and for how long.
    pub now: Option<(Work, Duration)>,
    pub budget_off: bool,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no frame has finished for {} s {}",
            self.waited.as_secs(),
            self.place
        )?;
        let mut parts: Vec<(Work, Duration)> = Work::ALL
            .iter()
            .map(|&w| (w, self.spent.of(w)))
            .filter(|(_, d)| *d >= Duration::from_millis(50))
            .collect();
        parts.sort_by_key(|&(_, d)| std::cmp::Reverse(d));
        let mut went = String::new();
        for (i, (w, d)) in parts.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(went, "{sep}{:.1} s in {}", d.as_secs_f64(), w.name());
        }
        if !went.is_empty() {
            write!(f, ": the time went {went}")?;
        }
        match self.now {
            Some((w, d)) => write!(
                f,
                "; running now: {} (for {:.1} s). {}",
                doing(w),
                d.as_secs_f64(),
                self.hint(w)
            ),
            None => f.write_str(
                "; no call into the game runs now (the tool's own work between frames: comparing, writing). Ctrl-C stops the run",
            ),
        }
    }
}

/// Running `work`, as the warning says it.
fn doing(work: Work) -> &'static str {
    match work {
        Work::TopLevel => "the script's top level (with the modules it requires there)",
        Work::Init => "G.init(players, seed)",
        Work::Step => "G.step",
        Work::Save => "a save",
        Work::Load => "a load",
        Work::Digest => "a digest (G.digest() or the value digest)",
    }
}

impl Stall {
    /// What to make of `work` running this long, and what to do.
    fn hint(&self, work: Work) -> String {
        let call = match work {
            Work::Save | Work::Load => {
                return format!(
                    "The game's code is not what is slow: {} of its heap take this long (a large heap: see the save and load columns of the report); it is not stuck, let it run, or keep less in the game's state",
                    work.name()
                )
            }
            Work::Step => "G.step",
            Work::Init => "G.init",
            Work::TopLevel => "the script's top level",
            Work::Digest => "G.digest()",
        };
        let budget = if self.budget_off {
            format!("--step-budget is off; with a budget (the default, or --step-budget N) an endless loop in {call} is stopped with an error naming where it is")
        } else {
            "--step-budget stops an endless loop with an error naming where it is".to_string()
        };
        format!("Is {call} in an endless loop? Ctrl-C stops the run ({budget})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stall(spent: &[(Work, u64)], now: Option<(Work, u64)>, budget_off: bool) -> String {
        let mut s = Spent::default();
        for &(w, ms) in spent {
            s.add(w, Duration::from_millis(ms));
        }
        Stall {
            waited: Duration::from_secs(10),
            place: "in the full run (at frame 40)".into(),
            spent: s,
            now: now.map(|(w, ms)| (w, Duration::from_millis(ms))),
            budget_off,
        }
        .to_string()
    }

    /// An outside tester's 1 GB heap: G.step took microseconds, saves seconds; the warning
    /// asked about an endless loop in G.step.
    #[test]
    fn time_in_saves_is_said_to_be_saves_not_a_loop() {
        let text = stall(
            &[(Work::Save, 9_600), (Work::Step, 1), (Work::Load, 300)],
            Some((Work::Save, 3_600)),
            false,
        );
        assert!(
            text.starts_with("no frame has finished for 10 s in the full run (at frame 40): the time went 9.6 s in saves, 0.3 s in loads; running now: a save (for 3.6 s)."),
            "{text}"
        );
        assert!(text.contains("it is not stuck"), "{text}");
        assert!(!text.contains("endless loop"), "{text}");
        assert!(!text.contains("in G.step"), "{text}");
    }

    #[test]
    fn a_long_g_step_is_asked_about_with_the_budget_on_or_off() {
        let on = stall(&[(Work::Step, 10_000)], Some((Work::Step, 10_000)), false);
        assert!(on.contains("running now: G.step (for 10.0 s). Is G.step in an endless loop? Ctrl-C stops the run (--step-budget stops"), "{on}");
        let off = stall(&[(Work::Init, 10_000)], Some((Work::Init, 10_000)), true);
        assert!(
            off.contains(
                "running now: G.init(players, seed) (for 10.0 s). Is G.init in an endless loop?"
            ),
            "{off}"
        );
        assert!(off.contains("--step-budget is off; with a budget"), "{off}");
    }
}
