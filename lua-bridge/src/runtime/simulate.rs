//! A networked client, simulated: what `luasnap simulate` runs.
//!
//! Each player's input is [`scripted_input`]`(seed, frame, player)`. The local player (0) knows
//! its input at once; remote inputs arrive `delay` frames late and are predicted until then by
//! repeating the last known one. A wrong prediction rolls back to the frame where it was made
//! and re-simulates. A lockstep reference (no prediction) gives the state every run must end
//! in: byte-identical arenas for the arena backends, equal value digests for the graph
//! serializer (which rebuilds objects elsewhere).
//!
//! Every run happens in the same VM: the game is initialized once, captured, and each run
//! (the reference and every backend) starts by restoring that capture. So all runs start from
//! the same bytes, and an arena run that ends byte-identical to the reference has shown the
//! rollbacks left no trace.

use crate::runtime::value_diff::ValueDiff;
use crate::runtime::{
    quantile_us, scripted_input, Backend, Clock, FrameSession, Game, GameConfig, GameError, Saving,
    Timings,
};
use luasnap_snap::Snapshot;
use std::time::Duration;

fn median(v: &[usize]) -> Option<usize> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The game.
    pub game: GameConfig,
    /// Frames to simulate.
    pub frames: u64,
    /// Frames remote inputs arrive late (0..window-2).
    pub delay: u64,
    /// Start from this save-game instead of `G.init` (continuing its frame count).
    pub start: Option<Vec<u8>>,
    /// Who wrote `start`: [`Trust::Foreign`](crate::persist::Trust) takes no code from it
    /// (its functions are bound to the game script's, this version's), `Trust::Own` also
    /// keeps the saved code of functions this version lacks. Either way the saved functions
    /// run this version's code where it has them ([`FunctionBinding::Current`](crate::persist::FunctionBinding)).
    /// See [`Game::from_save`].
    pub start_trust: crate::persist::Trust,
    /// Which frames the GGPO client saves: every frame, or only the confirmed ones
    /// ([`Saving::Sparse`], one save per rollback instead of one per re-simulated frame).
    pub saving: Saving,
}

impl SimOptions {
    /// Checks ranges; the message says what to change.
    pub fn validate(&self) -> Result<(), GameError> {
        if self.frames == 0 || self.frames > 10_000_000 {
            return Err(GameError::Config(format!(
                "--frames must be 1..=10000000, got {}",
                self.frames
            )));
        }
        if self.game.players == 0 || self.game.players > 16 {
            return Err(GameError::Config(format!(
                "--players must be 1..=16, got {}",
                self.game.players
            )));
        }
        if self.game.window < 2 {
            return Err(GameError::Config(format!(
                "--window must be at least 2 (the frame a rollback returns to and the current one), got {}",
                self.game.window
            )));
        }
        if self.delay + 2 > self.game.window as u64 {
            return Err(GameError::Config(format!(
                "--delay {} needs a window of at least {} snapshots (window is {}); use --window {} or a delay of at most {}",
                self.delay,
                self.delay + 2,
                self.game.window,
                self.delay + 2,
                self.game.window - 2
            )));
        }
        Ok(())
    }

    fn new_game(&self, backend: Backend) -> Result<Game, GameError> {
        match &self.start {
            Some(save) => match self.start_trust {
                crate::persist::Trust::Foreign => Game::from_save(&self.game, backend, save),
                crate::persist::Trust::Own => Game::from_save_with(
                    &self.game,
                    backend,
                    save,
                    &crate::persist::LoadOptions {
                        functions: crate::persist::FunctionBinding::Current,
                        ..crate::persist::LoadOptions::new(crate::persist::Trust::Own)
                    },
                ),
            },
            None => Game::new(&self.game, backend),
        }
    }

    fn actual(&self, frame: u64) -> Vec<u8> {
        (0..self.game.players)
            .map(|p| scripted_input(self.game.seed, frame, p))
            .collect()
    }
}

/// The lockstep reference run's end state.
#[derive(Debug, Clone)]
pub struct Reference {
    /// First frame simulated.
    pub start_frame: u64,
    /// Frame count at the end.
    pub end_frame: u64,
    /// Arena digest at the end.
    pub arena_digest: u64,
    /// Value digest at the end.
    pub value_digest: u64,
    /// `G.digest()` at the end ([`Game::game_digest`]: a string's hash for a string), `None`
    /// for a game without one: the figure to compare with another implementation of the game
    /// (stock Lua running the same script and inputs).
    pub game_digest: Option<i64>,
    /// Lua's heap at the end, in bytes.
    pub heap_bytes: u64,
    /// Mean time of one `G.step`, in microseconds.
    pub step_us: f64,
    /// Each frame's `G.step`, from `start_frame` on: steps without snapshots, to compare a
    /// backend's steps of the same frames with.
    pub step_times: Vec<Duration>,
    /// The value digest after each frame [`Simulation::reference_with`] was asked for:
    /// (frame, digest).
    pub digests: Vec<(u64, u64)>,
}

impl Reference {
    /// The time of `frame`'s step in the reference run (none for a frame it did not run).
    pub fn step_at(&self, frame: u64) -> Option<Duration> {
        let i = frame.checked_sub(self.start_frame)?;
        self.step_times.get(usize::try_from(i).ok()?).copied()
    }

    /// What `steps` (frames and their times) took beyond the same frames' steps here, µs
    /// (negative when they ran faster).
    fn excess_us(&self, steps: &[(u64, Duration)]) -> f64 {
        steps
            .iter()
            .map(|&(f, d)| {
                let plain = self
                    .step_at(f)
                    .map_or(self.step_us, |p| p.as_secs_f64() * 1e6);
                d.as_secs_f64() * 1e6 - plain
            })
            .sum()
    }
}

/// What a lockstep run recorded at the frames it was asked about (see
/// [`Simulation::lockstep`]). "After frame `f`" is the state once `G.step` of frame `f` ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockstepRecord {
    /// The value digest after each frame asked for, in frame order: (frame, digest).
    pub digests: Vec<(u64, u64)>,
    /// A save-game of the state after the frame asked for, if any.
    pub save: Option<Vec<u8>>,
}

/// The frames a lockstep run of `frames` frames from `start` is checked after when it is
/// compared with another process's: `count` evenly spaced ones, the last frame among them.
/// A first comparison at these frames brackets where two runs part; a second one, after
/// every frame of the bracket, finds the first differing frame.
pub fn checkpoints(start: u64, frames: u64, count: u64) -> Vec<u64> {
    let count = count.clamp(1, frames.max(1));
    let mut out: Vec<u64> = (1..=count)
        .map(|i| start + (frames * i / count).max(1) - 1)
        .collect();
    out.dedup();
    out
}

/// One backend's run.
#[derive(Debug, Clone)]
pub struct ModeReport {
    /// The backend.
    pub backend: Backend,
    /// Rollbacks done.
    pub rollbacks: u64,
    /// Frames re-simulated.
    pub resimulated: u64,
    /// Save, load and rollback-overhead durations.
    pub(crate) timings: Timings,
    /// Saved state held (ring or save-games), bytes: the most held after any frame of the
    /// run, what a client must budget. Not the figure at the end, which depends on where the
    /// run stops (a ring that copies whole for a few frames holds whole copies then).
    pub memory_bytes: usize,
    /// Saved state held after a frame, bytes: the mean over the run's frames.
    pub memory_mean_bytes: usize,
    /// Arena digest at the end.
    pub final_digest: u64,
    /// Value digest at the end.
    pub value_digest: u64,
    /// Whether the run ended in the reference state.
    pub matches_reference: bool,
    /// Pages each snapshot copied (the written pages, or the whole extent for a whole copy),
    /// one entry per frame advanced that took a save (every frame, unless the saving is
    /// [`Saving::Sparse`]); empty for the serializer.
    pub pages_per_frame: Vec<usize>,
    /// Pages the tracker saw written in each frame advanced while it was armed (empty in full
    /// mode, and for frames the automatic mode copied whole with tracking paused); with
    /// [`Saving::Sparse`], written since the save before, one entry per frame that saved.
    pub written_per_frame: Vec<usize>,
    /// The arena's extent at the end, bytes (what a full snapshot copies).
    pub extent_bytes: u64,
    /// Write faults the game took from the page tracker over the run
    /// ([`RingStats::pages_tracked`](luasnap_snap::RingStats::pages_tracked); 0 without one).
    pub pages_tracked: u64,
    /// What one of them costs in this process, ns
    /// ([`workload_fault_ns`](luasnap_snap::workload_fault_ns); 0 without a tracker).
    pub fault_ns: f64,
}

impl ModeReport {
    /// Median save time, µs.
    pub fn save_us_median(&self) -> f64 {
        quantile_us(&self.timings.saves, 0.5)
    }
    /// 99th-percentile save time, µs.
    pub fn save_us_p99(&self) -> f64 {
        quantile_us(&self.timings.saves, 0.99)
    }
    /// Median load time, µs.
    pub fn load_us_median(&self) -> f64 {
        quantile_us(&self.timings.loads, 0.5)
    }
    /// 99th-percentile load time, µs.
    pub fn load_us_p99(&self) -> f64 {
        quantile_us(&self.timings.loads, 0.99)
    }
    /// Median pages copied per frame (0 for the serializer).
    pub fn pages_per_frame_median(&self) -> usize {
        median(&self.pages_per_frame).unwrap_or(0)
    }
    /// Median pages written per frame, of the frames tracked (`None` if none was).
    pub fn written_per_frame_median(&self) -> Option<usize> {
        median(&self.written_per_frame)
    }
    /// Each `G.step` of the run (re-simulated ones included) with the frame it simulated.
    pub fn step_times(&self) -> &[(u64, Duration)] {
        &self.timings.steps
    }
    /// For each rollback, how many steps re-simulated its frames.
    pub fn resimulated_steps(&self) -> Vec<usize> {
        self.timings
            .rollback_steps
            .iter()
            .map(|r| r.len())
            .collect()
    }
    /// Mean time of one `G.step` in this run, write faults included, µs.
    pub fn step_us_mean(&self) -> f64 {
        let t = &self.timings.steps;
        t.iter().map(|s| s.1).sum::<Duration>().as_secs_f64() * 1e6 / t.len().max(1) as f64
    }
    /// What saving and restoring cost per frame advanced, µs: the saves and loads, plus what
    /// every `G.step` of the run took beyond the reference's step of the same frame (which
    /// ran without snapshots): page tracking's cost inside the game, and a cache the copies
    /// left cold. Re-simulated frames count as the steps they repeat. A difference of two
    /// runs: negative when the steps' run-to-run noise beats the cost (`luasnap simulate`
    /// reports that as within noise); [`ModeReport::copy_and_fault_us_per_frame`] is not.
    pub fn snapshot_cost_us_per_frame(&self, reference: &Reference) -> f64 {
        let t = &self.timings;
        let io: Duration = t.saves.iter().chain(&t.loads).sum();
        let frames = (t.steps.len() as u64).saturating_sub(self.resimulated);
        (io.as_secs_f64() * 1e6 + reference.excess_us(&t.steps)) / frames.max(1) as f64
    }
    /// Saves, loads and the tracker's write faults per frame advanced, µs: the snapshot cost
    /// with the faults counted at their measured cost ([`ModeReport::fault_ns`]) instead of
    /// the steps' excess over the reference's. It leaves out what the copies do to the
    /// caches, and it does not move with the machine's load as the steps do (a 2% drift of a
    /// 5 ms `G.step` is 100 µs a frame, more than the copies of a small game cost): the
    /// column to compare the copy modes by on a busy machine.
    pub fn copy_and_fault_us_per_frame(&self) -> f64 {
        let t = &self.timings;
        let io: Duration = t.saves.iter().chain(&t.loads).sum();
        let faults_us = self.pages_tracked as f64 * self.fault_ns / 1e3;
        let frames = (t.steps.len() as u64).saturating_sub(self.resimulated);
        (io.as_secs_f64() * 1e6 + faults_us) / frames.max(1) as f64
    }
    /// Rollback overheads with page tracking counted, µs, sorted: each rollback's load and
    /// saves, plus what its re-simulated steps took beyond the reference's steps of the same
    /// frames. A difference from the reference: negative when the steps' noise beats the cost.
    pub fn rollbacks_with_tracking_us(&self, reference: &Reference) -> Vec<f64> {
        let t = &self.timings;
        let mut v: Vec<f64> = t
            .rollback_overheads
            .iter()
            .zip(&t.rollback_steps)
            .map(|(o, steps)| o.as_secs_f64() * 1e6 + reference.excess_us(&t.steps[steps.clone()]))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
    /// Median of [`ModeReport::rollbacks_with_tracking_us`].
    pub fn rollback_with_tracking_us_median(&self, reference: &Reference) -> f64 {
        let v = self.rollbacks_with_tracking_us(reference);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
    /// Median rollback overhead (load + re-simulated saves), µs.
    pub fn rollback_us_median(&self) -> f64 {
        quantile_us(&self.timings.rollback_overheads, 0.5)
    }
    /// 99th-percentile rollback overhead, µs.
    pub fn rollback_us_p99(&self) -> f64 {
        quantile_us(&self.timings.rollback_overheads, 0.99)
    }
}

/// Called as runs progress: (which run, frames done, frames in the run).
pub type Progress = Box<dyn FnMut(&str, u64, u64)>;

/// One game VM, initialized once, on which the reference and every backend run in turn.
pub struct Simulation {
    opts: SimOptions,
    game: Option<Game>,
    start: Snapshot,
    start_frame: u64,
    progress: Option<Progress>,
    clock: Clock,
}

impl Simulation {
    /// Builds the game (from `G.init` or the start save) and captures its initial state.
    pub fn new(opts: SimOptions) -> Result<Simulation, GameError> {
        opts.validate()?;
        let mut game = opts.new_game(Backend::ArenaFull)?;
        // Before the capture: every run starts from the state this call leaves. It must
        // leave the values as they were, checked here as after the runs (`reference`): a
        // digest that sorts a list of the state in place changes it only the first time, so
        // the check at the end alone would compare an already sorted state with itself.
        let before = game.value_digest()?;
        if game.game_digest()?.is_some() && game.value_digest()? != before {
            return Err(GameError::DigestChangesState {
                frame: game.frame(),
            });
        }
        let start = game.capture();
        let start_frame = game.frame();
        Ok(Simulation {
            opts,
            game: Some(game),
            start,
            start_frame,
            progress: None,
            clock: Clock::Wall,
        })
    }

    /// What loading the start save did with its functions (None without one).
    pub fn load_report(&self) -> Option<&crate::persist::LoadReport> {
        self.game.as_ref().and_then(|g| g.load_report())
    }

    /// The frame the runs start from (0, or the frame of the start save).
    pub fn start_frame(&self) -> u64 {
        self.start_frame
    }

    /// Times steps, saves and loads with `clock` (default: the wall clock).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// Reports progress to `p` (called once per frame simulated, rollbacks aside).
    pub fn set_progress(&mut self, p: Progress) {
        self.progress = Some(p);
    }

    fn fresh(&mut self, backend: Backend) -> Result<Game, GameError> {
        let mut game = self
            .game
            .take()
            .expect("the game is returned after each run");
        if let Err(e) = game.restart(
            &self.start,
            self.start_frame,
            backend,
            self.opts.game.window,
        ) {
            self.game = Some(game);
            return Err(e);
        }
        Ok(game)
    }

    /// Runs the lockstep reference; returns its end state and, if asked, a save-game of it.
    pub fn reference(
        &mut self,
        with_save: bool,
    ) -> Result<(Reference, Option<Vec<u8>>), GameError> {
        self.reference_with(with_save, &[])
    }

    /// [`reference`](Simulation::reference), also taking the value digest after each frame in
    /// `digests_after` (into [`Reference::digests`]), for comparison with a lockstep run in
    /// another process ([`Simulation::lockstep`] there). Taking a digest changes nothing in the
    /// game's state (it captures the VM and restores it), and its time is not in
    /// [`Reference::step_us`].
    pub fn reference_with(
        &mut self,
        with_save: bool,
        digests_after: &[u64],
    ) -> Result<(Reference, Option<Vec<u8>>), GameError> {
        let mut game = self.fresh(Backend::ArenaFull)?;
        let clock = self.clock;
        let result = (|| {
            let start = game.frame();
            let mut step_times = Vec::with_capacity(self.opts.frames as usize);
            let mut digests = Vec::with_capacity(digests_after.len());
            for f in start..start + self.opts.frames {
                let inputs = self.opts.actual(f);
                let (stepped, took) = clock.time(|| game.step(&inputs));
                step_times.push(took);
                stepped.map_err(|e| match e {
                    GameError::OutOfMemory {
                        frame,
                        heap_bytes,
                        capacity,
                        ..
                    } => GameError::OutOfMemory {
                        frame,
                        run: "reference (lockstep)".into(),
                        heap_bytes,
                        capacity,
                    },
                    e => e,
                })?;
                if digests_after.contains(&f) {
                    digests.push((f, game.value_digest()?));
                }
                if let Some(p) = &mut self.progress {
                    p("reference", f - start + 1, self.opts.frames);
                }
            }
            let total: Duration = step_times.iter().sum();
            let step_us = total.as_secs_f64() * 1e6 / self.opts.frames as f64;
            let mut r = Reference {
                start_frame: start,
                end_frame: game.frame(),
                arena_digest: game.arena_digest(),
                value_digest: game.value_digest()?,
                game_digest: None,
                heap_bytes: game.vm().lua_memory() as u64,
                step_us,
                step_times,
                digests,
            };
            let save = if with_save {
                Some(game.save_game()?)
            } else {
                None
            };
            // G.digest() must work (an integer or a string) where the explanation and the
            // network checksums call it: checked at the start (in `new`) and here, after the
            // digests, since calling it may allocate. It must also leave the game's values as
            // they were: simulate restores the VM around it, a network session does not.
            let before = game.value_digest()?;
            r.game_digest = game.game_digest()?;
            if r.game_digest.is_some() && game.value_digest()? != before {
                return Err(GameError::DigestChangesState {
                    frame: game.frame(),
                });
            }
            Ok((r, save))
        })();
        self.game = Some(game);
        result
    }

    /// Runs the lockstep reference again from the same start, as another process does to be
    /// compared with this one (`luasnap simulate` checks its reference against a second
    /// process): the value digest after each frame in `digests_after`, and a save-game of the
    /// state after frame `save_after`. It stops after the last frame asked about. Every run
    /// makes the same calls into the VM (the reference's, without timing), so two processes
    /// that agree on the game agree on these.
    pub fn lockstep(
        &mut self,
        digests_after: &[u64],
        save_after: Option<u64>,
    ) -> Result<LockstepRecord, GameError> {
        let (record, _) = self.lockstep_then(digests_after, save_after, false)?;
        Ok(record)
    }

    /// [`lockstep`](Simulation::lockstep), also returning the value graph of the state after
    /// frame `save_after` (for a diff with another process's save-game of that state).
    pub fn lockstep_graph(
        &mut self,
        at: u64,
    ) -> Result<crate::runtime::value_diff::ValueGraph, GameError> {
        let (_, graph) = self.lockstep_then(&[], Some(at), true)?;
        Ok(graph.expect("asked for"))
    }

    fn lockstep_then(
        &mut self,
        digests_after: &[u64],
        save_after: Option<u64>,
        graph: bool,
    ) -> Result<
        (
            LockstepRecord,
            Option<crate::runtime::value_diff::ValueGraph>,
        ),
        GameError,
    > {
        let mut game = self.fresh(Backend::ArenaFull)?;
        let start = self.start_frame;
        let last = digests_after
            .iter()
            .copied()
            .chain(save_after)
            .max()
            .unwrap_or(start);
        let result = (|| {
            let mut record = LockstepRecord::default();
            let mut value_graph = None;
            for f in start..(last + 1).min(start + self.opts.frames) {
                game.step(&self.opts.actual(f))?;
                if digests_after.contains(&f) {
                    record.digests.push((f, game.value_digest()?));
                }
                if save_after == Some(f) {
                    if graph {
                        value_graph = Some(game.value_graph()?);
                    } else {
                        record.save = Some(game.save_game()?);
                    }
                }
            }
            Ok((record, value_graph))
        })();
        self.game = Some(game);
        result
    }

    /// Runs the GGPO client model with `backend` and compares its end state with `reference`.
    pub fn run(
        &mut self,
        backend: Backend,
        reference: &Reference,
    ) -> Result<ModeReport, GameError> {
        let game = self.fresh(backend)?;
        let mut s = FrameSession::with_saving(game, self.opts.game.window - 1, self.opts.saving);
        s.set_clock(self.clock);
        let mut progress = self.progress.take();
        let mut pages_per_frame = Vec::new();
        let mut written_per_frame = Vec::new();
        let mut saves_seen = 0;
        let (mut memory_peak, mut memory_sum, mut memory_frames) = (0, 0u128, 0u128);
        let result = drive(&self.opts, &mut s, &mut |done, s: &FrameSession| {
            let held = s.memory_bytes();
            memory_peak = memory_peak.max(held);
            memory_sum += held as u128;
            memory_frames += 1;
            // A frame that took no save (sparse saving) leaves the ring's figures as they were.
            let saved = std::mem::replace(&mut saves_seen, s.saves_taken()) < s.saves_taken();
            if backend != Backend::Serialize && saved {
                let stats = s.game().vm().snapshots().stats();
                pages_per_frame.push(stats.last_dirty_pages);
                written_per_frame.extend(stats.last_written_pages);
            }
            if let Some(p) = &mut progress {
                p(backend.name(), done, self.opts.frames);
            }
        });
        self.progress = progress;
        let memory_bytes = memory_peak.max(s.memory_bytes());
        let memory_mean_bytes = (memory_sum / memory_frames.max(1)) as usize;
        let (rollbacks, resimulated, timings) = (s.rollbacks, s.resimulated, s.timings.clone());
        let mut game = s.into_game();
        let report = result.and_then(|()| {
            let final_digest = game.arena_digest();
            let value_digest = game.value_digest()?;
            let matches_reference = match backend {
                Backend::Serialize => value_digest == reference.value_digest,
                _ => {
                    final_digest == reference.arena_digest && value_digest == reference.value_digest
                }
            };
            let ring = game.vm().snapshots();
            Ok(ModeReport {
                pages_per_frame,
                written_per_frame,
                pages_tracked: ring.stats().pages_tracked,
                fault_ns: ring
                    .tracker_kind()
                    .map_or(0.0, luasnap_snap::workload_fault_ns),
                extent_bytes: game.vm().arena_stats().extent_bytes,
                backend,
                rollbacks,
                resimulated,
                timings,
                memory_bytes,
                memory_mean_bytes,
                final_digest,
                value_digest,
                matches_reference,
            })
        });
        self.game = Some(game);
        report
    }

    /// Explains a run that did not end in the reference state: the first frame whose state
    /// differs, and the paths of the differing values.
    ///
    /// It replays the true inputs twice: once straight (the truth), once saving and restoring
    /// the state with `backend` around every frame (save, step, load, step again), comparing
    /// after each frame what the run was judged by (the arena digest for the arena backends,
    /// `G.digest()` or else the value digest for the serializer). At the first frame that
    /// differs, both states' values are diffed (at most `limit` paths). If no frame differs
    /// that way, the end states of the reference and of a GGPO run with `backend` are diffed
    /// instead (`frame` is then `None`).
    pub fn explain(&mut self, backend: Backend, limit: usize) -> Result<Divergence, GameError> {
        let arena = backend != Backend::Serialize;
        let check = |g: &mut Game| -> Result<u64, GameError> {
            if arena {
                return Ok(g.arena_digest());
            }
            Ok(match g.game_digest()? {
                Some(d) => d as u64,
                None => g.value_digest()?,
            })
        };
        let frames: Vec<u64> = (self.start_frame..self.start_frame + self.opts.frames).collect();
        // The truth, frame by frame.
        let mut game = self.fresh(Backend::ArenaFull)?;
        let mut truth = Vec::with_capacity(frames.len());
        let r = (|| {
            for &f in &frames {
                game.step(&self.opts.actual(f))?;
                truth.push(check(&mut game)?);
            }
            Ok::<(), GameError>(())
        })();
        self.game = Some(game);
        r?;
        // Saved and restored around every frame.
        let saved_run =
            |sim: &mut Simulation, upto: Option<u64>| -> Result<(Game, Option<u64>), GameError> {
                let mut game = sim.fresh(backend)?;
                let r = (|| {
                    for (i, &f) in frames.iter().enumerate() {
                        let inputs = sim.opts.actual(f);
                        let h = game.save()?;
                        game.step(&inputs)?;
                        game.load(&h, f)?;
                        game.step(&inputs)?;
                        if upto == Some(f) || (upto.is_none() && check(&mut game)? != truth[i]) {
                            return Ok(Some(f));
                        }
                    }
                    Ok(None)
                })();
                match r {
                    Ok(found) => Ok((game, found)),
                    Err(e) => {
                        sim.game = Some(game);
                        Err(e)
                    }
                }
            };
        let (game, found) = saved_run(self, None)?;
        self.game = Some(game);
        let (left, right) = match found {
            Some(f) => {
                let (mut game, _) = saved_run(self, Some(f))?;
                let right = game.value_graph();
                self.game = Some(game);
                let right = right?;
                let mut game = self.fresh(Backend::ArenaFull)?;
                let left = (|| {
                    for g in self.start_frame..=f {
                        game.step(&self.opts.actual(g))?;
                    }
                    game.value_graph()
                })();
                self.game = Some(game);
                (left?, right)
            }
            None => {
                let mut game = self.fresh(Backend::ArenaFull)?;
                let left = (|| {
                    for &f in &frames {
                        game.step(&self.opts.actual(f))?;
                    }
                    game.value_graph()
                })();
                self.game = Some(game);
                let left = left?;
                let game = self.fresh(backend)?;
                let mut s =
                    FrameSession::with_saving(game, self.opts.game.window - 1, self.opts.saving);
                let r = drive(&self.opts, &mut s, &mut |_, _| {});
                let mut game = s.into_game();
                let right = r.and_then(|()| game.value_graph());
                self.game = Some(game);
                (left, right?)
            }
        };
        Ok(Divergence {
            backend,
            frame: found,
            diff: left.diff(&right, limit),
        })
    }
}

/// Why a run did not end in the reference state (see [`Simulation::explain`]).
#[derive(Debug, Clone)]
pub struct Divergence {
    /// The backend.
    pub backend: Backend,
    /// The first frame after which a state saved and restored with the backend differs from
    /// the straight run's (`None`: every frame agreed that way; the diff is of the end states).
    pub frame: Option<u64>,
    /// The differing values: left is the straight (reference) run, right the backend's.
    pub diff: ValueDiff,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = self.backend.name();
        match self.frame {
            Some(fr) => write!(
                f,
                "mode {mode} did not end in the reference state. The state first differs after frame {fr} when saved and restored with this backend around every frame"
            )?,
            None if self.backend == Backend::Serialize => write!(
                f,
                "mode {mode} did not end in the reference state. Saving and loading around every frame, without rollbacks, keeps the state equal to a straight run, so the difference comes from frames re-simulated after a rollback, from a state this backend rebuilt at other addresses and with another collector history. The game's results likely depend on object addresses (`pairs` over a table whose keys are tables, functions or coroutines; `tostring` of a table; `%p`) or on collector timing (`collectgarbage(\"count\")`, what weak tables still hold, side effects of `__gc`): see docs/determinism.md. The end states differ"
            )?,
            None => write!(
                f,
                "mode {mode} did not end in the reference state, though saving and restoring around every frame agrees with a straight run, and a rollback restores the same bytes; this is probably a luasnap bug (please report it with the game). The end states differ"
            )?,
        }
        if self.diff.equal {
            write!(
                f,
                ".\nThe values are equal (same value digest): only the arena's bytes differ, in state that is not a Lua value (collector, allocator, dead stack slots). This is a luasnap bug; please report it with the game."
            )
        } else {
            writeln!(f, ". Differing values (reference vs {mode}):")?;
            for d in &self.diff.differences {
                writeln!(f, "  {d}")?;
            }
            if self.diff.truncated {
                writeln!(f, "  ... (more not shown)")?;
            }
            Ok(())
        }
    }
}

/// The GGPO loop over all frames of `opts`.
fn drive(
    opts: &SimOptions,
    s: &mut FrameSession,
    tick: &mut dyn FnMut(u64, &FrameSession),
) -> Result<(), GameError> {
    let start = s.game().frame();
    let end = start + opts.frames;
    let players = opts.game.players;
    // Inputs each frame was simulated with.
    let mut used: Vec<Vec<u8>> = Vec::with_capacity(opts.frames as usize);
    let mut checked: Option<u64> = None; // frames <= checked are verified against the truth
                                         // What the client predicts for frame `f` when remote inputs are known up to `known`.
    let predict = |f: u64, known: Option<u64>| -> Vec<u8> {
        (0..players)
            .map(|p| match (p, known) {
                (0, _) => scripted_input(opts.game.seed, f, 0),
                (_, Some(k)) if f <= k => scripted_input(opts.game.seed, f, p),
                (_, Some(k)) => scripted_input(opts.game.seed, k, p),
                (_, None) => 0,
            })
            .collect()
    };
    let reconcile = |s: &mut FrameSession,
                     used: &mut Vec<Vec<u8>>,
                     known: Option<u64>,
                     checked: &mut Option<u64>|
     -> Result<(), GameError> {
        let Some(k) = known else { return Ok(()) };
        let now = s.game().frame();
        if now == start {
            return Ok(()); // nothing simulated yet
        }
        let from = checked.map_or(start, |c| c + 1);
        let upto = k.min(now - 1);
        if from <= upto {
            // Before the rollback those inputs cause: sparse saving saves the state after them.
            s.confirm(upto);
            let wrong = (from..=upto).find(|&g| used[(g - start) as usize] != opts.actual(g));
            if let Some(g) = wrong {
                s.rollback_and_resimulate(g, |h| {
                    let inp = predict(h, Some(k));
                    used[(h - start) as usize] = inp.clone();
                    inp
                })?;
            }
            *checked = Some(upto);
        }
        Ok(())
    };
    for f in start..end {
        let known = (f >= start + opts.delay).then(|| f - opts.delay);
        reconcile(s, &mut used, known, &mut checked)?;
        let inputs = predict(f, known);
        s.advance(&inputs)?;
        used.push(inputs);
        tick(f - start + 1, s);
    }
    // The network catches up: every input of the run becomes known.
    reconcile(s, &mut used, Some(end - 1), &mut checked)
}
