//! `luasnap simulate`: a networked client that predicts and rolls back, on each backend.

use crate::mode_process::ModeOutcome;
use crate::save_file::{read_save, Body};
use crate::{usage, CliError};
use luasnap::bridge::runtime::{
    Activity, Backend, Clock, GameConfig, GameError, Saving, DEFAULT_STEP_BUDGET,
};
use luasnap::bridge::simulate::{Divergence, ModeReport, Reference, SimOptions, Simulation};
use serde_json::json;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Options of `luasnap simulate`.
#[derive(Debug, clap::Parser)]
pub struct SimulateArgs {
    /// The game: its main script, or its folder (with main.lua; `require` loads the game's
    /// modules from the folder). Default: the embedded Arena Brawl, ~10 MB of heap.
    pub game: Option<PathBuf>,
    /// Frames to simulate.
    #[arg(long, default_value_t = 600)]
    pub frames: u64,
    /// Players (player 1 is local; the others are remote).
    #[arg(long, default_value_t = 2)]
    pub players: usize,
    /// Frames remote inputs arrive late.
    #[arg(long, default_value_t = 3)]
    pub delay: u64,
    /// Seeds the game and the input schedule. With --load the game's own state, its random
    /// generator included, is the save's, so the seed chooses only the scripted inputs of
    /// the frames played from it: give the seed the save was played with to continue that
    /// game as one straight run would.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Which save/load backend to run: `auto` (the runtime's default, the one to use: whole
    /// copies or copies of the pages written since the last snapshot, whichever its cost model
    /// prices lower per frame, decided again as the game changes; docs/gc.md, "The runtime:
    /// one collector, copies chosen by cost"), `full` (whole copies), `incremental` (written
    /// pages only, tracked by userfaultfd), `serialize` (the save-game serializer), or `all`
    /// (each in turn, each in a process of its own that also runs its own reference; each
    /// mode's end state is compared with the reference of this process too; on a busy machine
    /// add --cpu-time).
    #[arg(long, default_value = "all", value_parser = ["full", "incremental", "auto", "serialize", "all"])]
    pub mode: String,
    /// Snapshots retained (the rollback window): at least 2, and the delay + 2.
    #[arg(long, default_value_t = 10)]
    pub window: usize,
    /// Which frames the client saves: `new` (the default): every new frame, and of the frames
    /// a rollback re-simulates only the one after the last confirmed frame (one save per
    /// rollback instead of one per re-simulated frame; a later rollback into the other
    /// re-simulated frames loads that one and replays the frames between); `every` frame
    /// (GGPO's own: each re-simulated frame saved again); or `sparse`: only the state after
    /// the last confirmed frame (GGRS's sparse saving: a rollback goes back to the newest save,
    /// further than the first wrong frame when predictions were right for a while).
    #[arg(long, value_enum, default_value = "new")]
    pub saving: SavingArg,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write a save-game of the final state here.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Start from this save-game (continuing its frame count) instead of G.init.
    #[arg(long)]
    pub load: Option<PathBuf>,
    /// Who wrote the --load file: `foreign` (the default: no code from the file; its
    /// functions are bound to the game script's functions at the same place, so a save of an
    /// older version runs this version's code, and one whose functions this version lacks is
    /// refused) or `own` (the code it carries is compiled, and what this version lacks keeps
    /// its saved code).
    #[arg(long, value_enum, default_value = "foreign", requires = "load")]
    pub trust: crate::diff::TrustArg,
    /// A library function the game's state holds on purpose (`load`, `collectgarbage`), which
    /// loads of its saves then accept, as the names the script lists in `G.permanents`
    /// (GameConfig::permanents); repeat for more.
    #[arg(long = "allow-permanent", value_name = "NAME")]
    pub allow_permanent: Vec<String>,
    /// The size of the game's arena: the address space its VM reserves, which the Lua heap
    /// with the allocator's rounding and free space must fit in (GameConfig::capacity); in
    /// bytes, or with a K, M, G or T suffix (1024-based), from 1M to 1T: `--memory-limit 4G`.
    /// Not the cap on live bytes as `luasnap run --memory-limit` is: it is what `luasnap run
    /// --capacity` sets.
    /// Running out names the frame and the run.
    #[arg(long, default_value = "2G", value_parser = parse_memory_limit)]
    pub memory_limit: usize,
    /// Lua instructions one G.step may run before it is stopped with an error naming the
    /// frame (an endless loop), counting the coroutines it resumes; `off` for no limit.
    #[arg(long, default_value_t = StepBudget(Some(DEFAULT_STEP_BUDGET)), value_parser = parse_step_budget)]
    pub step_budget: StepBudget,
    /// Frames between the runtime's collection points: a full collection at the end of every
    /// Nth frame, the only moments besides the game's own `collectgarbage()` where weak
    /// entries are cleared and finalizers run; 0 for none. It overrides the game's own
    /// `G.collect_every` (as GameConfig::collect_every does); without it, the game's, else 60.
    /// Not with --load: the save carries the count it was played with.
    #[arg(long, value_name = "N", conflicts_with = "load")]
    pub collect_every: Option<u64>,
    /// Time steps, saves and loads by the thread's CPU time instead of the wall clock: on a
    /// shared machine, time spent waiting for a core is not counted (write faults are).
    #[arg(long)]
    pub cpu_time: bool,
    /// Also run the lockstep reference in a second process and compare (`on`, the default):
    /// a game whose results depend on the process (addresses, the order of keys this build
    /// does not fix) differs there, and is explained by the first differing frame and the
    /// paths of the differing values. `off` skips it.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub second_process: String,
    /// (The second process's side: the frames after which to report the value digest.)
    #[arg(long, hide = true)]
    pub lockstep_digests: Option<String>,
    /// (The second process's side: FRAME:PATH, a save-game of the state after FRAME.)
    #[arg(long, hide = true)]
    pub lockstep_save: Option<String>,
    /// (The second process's side: the game's files as the first process read them, run
    /// instead of reading the game's folder.)
    #[arg(long, hide = true)]
    pub game_files: Option<PathBuf>,
    /// (A mode's process of `--mode all`: progress as lines on stderr for the parent to draw,
    /// no stall warning of its own, no line about the load; see mode_process.rs.)
    #[arg(long, hide = true)]
    pub mode_process: bool,
}

/// `--saving`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SavingArg {
    /// Every frame, re-simulated ones included.
    Every,
    /// Only the confirmed frames.
    Sparse,
    /// Every new frame; of re-simulated ones only the confirmed.
    New,
}

impl From<SavingArg> for Saving {
    fn from(s: SavingArg) -> Saving {
        match s {
            SavingArg::Every => Saving::EveryFrame,
            SavingArg::Sparse => Saving::Sparse,
            SavingArg::New => Saving::NewFrames,
        }
    }
}

/// `--step-budget`: a number of Lua instructions, or `off`.
#[derive(Debug, Clone, Copy)]
pub struct StepBudget(pub Option<u64>);

impl std::fmt::Display for StepBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("off"),
        }
    }
}

/// Parses `--step-budget`: `off`, or a positive count of instructions (`_` separators allowed).
pub fn parse_step_budget(s: &str) -> Result<StepBudget, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(StepBudget(None));
    }
    match t.replace('_', "").parse::<u64>() {
        Ok(n) if n > 0 => Ok(StepBudget(Some(n))),
        _ => Err(format!(
            "{s:?} is not a step budget; give a number of Lua instructions (e.g. 100000000) or `off`"
        )),
    }
}

/// Parses `--memory-limit`: a size as every size option takes it (`crate::size::parse_size`:
/// bytes, or a number with K, M, G or T), from 1M to 1T.
pub fn parse_memory_limit(s: &str) -> Result<usize, String> {
    const RANGE: &str =
        "from 1M to 1T: bytes (1048576 and up), or a number with K, M, G or T (1024K, 64M, 4G, 1T)";
    let bytes =
        crate::size::parse_size(s).map_err(|e| format!("{e}; the arena's size goes {RANGE}"))?;
    if (1 << 20..=1 << 40).contains(&bytes) {
        return Ok(bytes);
    }
    let side = if bytes < 1 << 20 {
        "below 1M"
    } else {
        "above 1T"
    };
    Err(format!("{s:?} is {side}; the arena's size goes {RANGE}"))
}

/// What a one-player run says about rollbacks.
const ONE_PLAYER: &str = "with --players 1 every input is local and known at once: nothing is predicted, so no rollback happens; use --players 2 or more to exercise rollbacks";

/// Fails now, before a long run, if `path` cannot be written; leaves no file behind.
fn check_writable(path: &std::path::Path) -> Result<(), String> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("cannot write the save-game to {}: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// The game of `args` with its folder read once for the run, each file the first time it is
/// required (`GameConfig::read_folder_lazily`): every mode's VM, the loads of saves and the
/// second process run these files, whatever becomes of the folder during the run.
fn game_of(args: &SimulateArgs) -> Result<GameConfig, String> {
    let game = crate::game_config(args.players, args.seed);
    match (&args.game_files, &args.game) {
        (Some(files), _) => crate::game_files::read(files, game),
        (None, Some(path)) => game
            .game_at(path)
            .map(GameConfig::read_folder_lazily)
            .map_err(|e| e.to_string()),
        (None, None) => Ok(game),
    }
}

/// Refuses what the flags cannot do together, before anything runs.
fn check_flags(args: &SimulateArgs) -> Result<(), CliError> {
    if args.mode_process && args.mode == "all" {
        return Err(usage(
            "--mode-process is the side of one mode's process of `--mode all` (the tool passes it itself, with --mode NAME): give it with --mode full, incremental, auto or serialize, or leave it out",
        ));
    }
    Ok(())
}

/// Runs the simulation; returns an error message for the user on failure (a usage error for
/// flags out of range or that do not go together).
pub fn run(mut args: SimulateArgs) -> Result<(), CliError> {
    check_flags(&args)?;
    let mut game = game_of(&args)?;
    let backends: Vec<Backend> = match args.mode.as_str() {
        "all" => Backend::ALL.to_vec(),
        name => vec![Backend::from_name(name).expect("clap checked the value")],
    };
    // The second process and the modes' processes run the files read here (removed when the
    // run ends).
    let others = args.second_process == "on" || backends.len() > 1;
    let _files = match (&args.game, &args.game_files) {
        (Some(_), None) if others => {
            let files = crate::game_files::write(&mut game)?;
            args.game_files = Some(files.to_path_buf());
            Some(files)
        }
        _ => None,
    };
    game.permanents.extend(args.allow_permanent.iter().cloned());
    game.window = args.window;
    game.capacity = args.memory_limit;
    game.step_budget = args.step_budget.0;
    game.collect_every = args.collect_every;
    let activity = Activity::new();
    game.activity = Some(activity.clone());
    let start = match &args.load {
        Some(path) => Some(read_save(
            path,
            Body::Load {
                max: args.memory_limit as u64,
                flag: "--memory-limit",
            },
        )?),
        None => None,
    };
    if let Some(path) = &args.save {
        check_writable(path)?;
    }
    let opts = SimOptions {
        game,
        frames: args.frames,
        delay: args.delay,
        start,
        start_trust: args.trust.into(),
        saving: args.saving.into(),
    };
    opts.validate().map_err(|e| usage(e.to_string()))?;
    let frames = opts.frames;
    let game = opts.game.clone();
    let progress = match args.mode_process {
        true => Progress::quiet(activity),
        false => Progress::new(
            !args.json && std::io::stderr().is_terminal(),
            frames,
            activity,
        ),
    };
    // Watching from here covers the script's top level and G.init (Simulation::new). A mode's
    // process tells its parent, which prints it; the second process is not watched.
    let say: Option<fn(&str)> = match args.mode_process {
        _ if args.lockstep_digests.is_some() || args.lockstep_save.is_some() => None,
        true => Some(crate::mode_process::report_stall),
        false => Some(say_stall),
    };
    let finished = Arc::new(AtomicBool::new(false));
    let budget_off = args.step_budget.0.is_none();
    let watchdog = say.map(|say| progress.watch.spawn(Arc::clone(&finished), budget_off, say));
    let result = simulate(&args, game, opts, &backends, &progress);
    finished.store(true, Ordering::Relaxed);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    progress.clear();
    result
}

/// Builds the simulation and runs its modes, `progress` told of every frame.
fn simulate(
    args: &SimulateArgs,
    game: GameConfig,
    opts: SimOptions,
    backends: &[Backend],
    progress: &Progress,
) -> Result<(), CliError> {
    let mut sim = Simulation::new(opts).map_err(|e| match e {
        GameError::Load(e) => {
            crate::loads::load_error_on_the_command_line(&e, crate::loads::SIMULATE)
        }
        e => e.to_string(),
    })?;
    if let (Some(path), Some(report), false) = (&args.load, sim.load_report(), args.mode_process) {
        eprintln!(
            "luasnap: loaded {}: {}; inputs from --seed {}",
            path.display(),
            crate::shown(&report.summary()),
            args.seed
        );
    }
    if args.cpu_time {
        sim.set_clock(Clock::ThreadCpu);
    }
    if args.lockstep_digests.is_some() || args.lockstep_save.is_some() {
        return Ok(crate::second::run_child(args, &mut sim)?);
    }
    progress.watch.set_start_frame(sim.start_frame());
    let (shown, mode_process) = (progress.clone(), args.mode_process);
    sim.set_progress(Box::new(move |what, done, total| {
        if mode_process {
            // The parent draws the progress.
            crate::mode_process::report_progress(what, done, total);
        }
        shown.report(what, what, done, total);
    }));
    Ok(run_modes(args, &game, &mut sim, backends, progress)?)
}

/// Where the runs are: a progress bar on a terminal, and what the watchdog reads to say
/// where the time goes when no frame has finished for a while (an endless loop would
/// otherwise hang silently; a huge heap's saves would look like one), for the runs of this
/// process and those of the modes' processes alike.
#[derive(Clone)]
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// The run the bar shows.
    run: Arc<Mutex<String>>,
    watch: crate::watchdog::FrameWatch,
}

impl Progress {
    /// Progress that nobody sees (a mode's process reports its own to its parent), of the
    /// games that record into `activity`.
    fn quiet(activity: Activity) -> Progress {
        Progress {
            bar: None,
            run: Arc::new(Mutex::new(String::new())),
            watch: crate::watchdog::FrameWatch::new(activity),
        }
    }

    /// A bar of `frames` frames if `bar`, starting with the reference.
    fn new(bar: bool, frames: u64, activity: Activity) -> Progress {
        let bar = bar.then(|| {
            let bar = indicatif::ProgressBar::new(frames);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "  {prefix:>11} [{bar:30}] {pos}/{len} frames {per_sec} eta {eta}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix("reference");
            bar
        });
        Progress {
            bar,
            ..Progress::quiet(activity)
        }
    }

    /// `done` of `total` frames of `run` (the stall warning's name for it) are done; the bar
    /// shows `label` for it.
    fn report(&self, label: &str, run: &str, done: u64, total: u64) {
        self.watch.frame_done(run, done);
        let Some(bar) = &self.bar else { return };
        let Ok(mut shown) = self.run.lock() else {
            return;
        };
        if *shown != run {
            *shown = run.to_string();
            bar.reset();
            bar.set_length(total);
            bar.set_prefix(label.to_string());
        }
        bar.set_position(done);
        if done == total {
            bar.finish_and_clear();
        }
    }

    /// A note on a terminal, between the bars.
    fn note(&self, m: &str) {
        if self.bar.is_some() {
            eprintln!("  {m}");
        }
    }

    /// Takes the bar of a run that ended early (a mode's process that failed) off the terminal.
    fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The stall warning on this process's terminal.
fn say_stall(text: &str) {
    eprintln!("\nluasnap: {}", crate::shown(text));
}

/// What a run of every mode gave: the modes that ran (their figures as [`mode_json`] writes
/// them), those that failed (with several modes, a failure is reported beside the others'
/// results, not instead of them), why the first one that does not match the reference does
/// not (as [`divergence_json`] writes it), and what the second process found
/// (`--second-process on`).
struct Outcome {
    modes: Vec<serde_json::Value>,
    failures: Vec<(Backend, String)>,
    divergence: Option<serde_json::Value>,
    cross: Option<crate::second::CrossCheck>,
}

/// Runs the reference and every mode, then reports: the second process started beside them,
/// the save written, the modes compared with the reference, the first mismatch explained,
/// the report printed; an error says what did not agree or failed.
fn run_modes(
    args: &SimulateArgs,
    game: &GameConfig,
    sim: &mut Simulation,
    backends: &[Backend],
    progress: &Progress,
) -> Result<(), String> {
    let several = backends.len() > 1;
    // The second process runs beside this one's reference and modes. With several modes the
    // reference also takes the digests a second process is compared by, to explain a mode
    // whose process ended elsewhere than this one's reference.
    let probes = if args.second_process == "on" || several {
        crate::second::first_frames(sim.start_frame(), args.frames)
    } else {
        Vec::new()
    };
    let second = if args.second_process == "on" {
        Some(crate::second::spawn(args, &probes, None)?)
    } else {
        None
    };
    let (reference, save) = sim
        .reference_with(args.save.is_some(), &probes)
        .map_err(|e| e.to_string())?;
    let mut ran = run_each_mode(args, sim, backends, &reference, progress)?;
    if let (Some(path), Some(bytes)) = (&args.save, &save) {
        write_save(path, bytes, &reference)?;
    }
    let cross = match second {
        Some(child) => {
            progress.note("comparing the lockstep reference with a second process...");
            Some(crate::second::compare(args, game, sim, &reference, child)?)
        }
        None => None,
    };
    if several {
        mark_modes_of_other_states(&mut ran.modes, &reference);
    }
    // A mismatch is explained before printing, so --json carries the explanation too (a
    // mode's process explained its own).
    let divergence = explain_first_mismatch(
        args,
        game,
        sim,
        backends,
        progress,
        Explaining {
            reference: &reference,
            probes: &probes,
            cross: cross.as_ref(),
        },
        &mut ran,
    )?;
    let outcome = Outcome {
        modes: ran.modes,
        failures: ran.failures,
        divergence,
        cross,
    };
    print_report(args, &reference, &outcome)?;
    outcome_result(outcome)
}

/// The modes' runs: their reports, the modes that failed, and each report's explanation if
/// the mode's own process explained why it did not match its reference.
struct ModeRuns {
    modes: Vec<serde_json::Value>,
    failures: Vec<(Backend, String)>,
    explained: Vec<Option<serde_json::Value>>,
}

/// Runs each mode: one in this process, beside the reference; several each in a process of
/// its own (a failure there is reported beside the others' results).
fn run_each_mode(
    args: &SimulateArgs,
    sim: &mut Simulation,
    backends: &[Backend],
    reference: &Reference,
    progress: &Progress,
) -> Result<ModeRuns, String> {
    let mut ran = ModeRuns {
        modes: Vec::new(),
        failures: Vec::new(),
        explained: Vec::new(),
    };
    if let [backend] = backends {
        let r = sim.run(*backend, reference).map_err(|e| e.to_string())?;
        ran.modes.push(mode_json(&r, reference));
        ran.explained.push(None);
        return Ok(ran);
    }
    for b in backends {
        let name = b.name();
        let mut child_progress = |run: &str, done, total| {
            if run == name {
                progress.report(name, name, done, total);
            } else {
                let label = format!("{name}: {run}");
                progress.report(&label, &format!("{name} process's {run}"), done, total);
            }
        };
        progress.watch.delegate(true);
        let outcome = crate::mode_process::run(args, *b, &mut child_progress, &mut |text| {
            say_stall(&format!("the {name} process: {text}"))
        });
        progress.watch.delegate(false);
        match outcome {
            ModeOutcome::Ran { report, divergence } => {
                ran.modes.push(report);
                ran.explained.push(divergence);
            }
            ModeOutcome::Failed(e) => {
                progress.clear();
                ran.failures.push((*b, e));
            }
        }
    }
    Ok(ran)
}

/// Writes the reference's save-game (`--save`) to `path`.
fn write_save(path: &std::path::Path, bytes: &[u8], reference: &Reference) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!(
        "luasnap: saved frame {} to {} ({})",
        reference.end_frame,
        path.display(),
        human_bytes(bytes.len() as u64)
    );
    Ok(())
}

/// Marks the modes whose process ended in another state than this one's reference: a mode's
/// process ended in its own reference's state, and across processes only the value digest is
/// the same for the same state (the arena holds addresses).
fn mark_modes_of_other_states(modes: &mut [serde_json::Value], reference: &Reference) {
    let reference_digest = format!("{:016x}", reference.value_digest);
    for m in modes {
        if m["value_digest"] != reference_digest.as_str() {
            m["matches_reference"] = false.into();
        }
    }
}

/// What explaining a mismatch compares with: the reference, the frames the second process
/// reports digests after, and what the second process found (`--second-process on`).
struct Explaining<'a> {
    reference: &'a Reference,
    probes: &'a [u64],
    cross: Option<&'a crate::second::CrossCheck>,
}

/// Why the first mode that does not match the reference does not (None: all match): as its
/// own process explained it, else by re-running it here (one mode) or by comparing with a
/// second process that disagrees (started now if none ran).
fn explain_first_mismatch(
    args: &SimulateArgs,
    game: &GameConfig,
    sim: &mut Simulation,
    backends: &[Backend],
    progress: &Progress,
    with: Explaining<'_>,
    ran: &mut ModeRuns,
) -> Result<Option<serde_json::Value>, String> {
    let Some(i) = ran
        .modes
        .iter()
        .position(|m| m["matches_reference"] != true)
    else {
        return Ok(None);
    };
    let name = ran.modes[i]["mode"].as_str().unwrap_or("?").to_string();
    let locating = || progress.note(&format!("locating where mode {name} diverges..."));
    Ok(Some(match (ran.explained[i].take(), backends) {
        (Some(d), _) => d,
        (None, [backend]) => {
            locating();
            divergence_json(&sim.explain(*backend, 20).map_err(|e| e.to_string())?)
        }
        (None, _) => {
            locating();
            let fresh;
            let c = match with.cross {
                Some(c) if !c.agrees => c,
                _ => {
                    let child = crate::second::spawn(args, with.probes, None)?;
                    fresh = crate::second::compare(args, game, sim, with.reference, child)?;
                    &fresh
                }
            };
            process_divergence(&name, &ran.modes[i], with.reference, c)
        }
    }))
}

/// Prints the report (`--json` or the table), at once; a closed pipe (`| head`) ends the
/// output quietly.
fn print_report(
    args: &SimulateArgs,
    reference: &Reference,
    outcome: &Outcome,
) -> Result<(), String> {
    let text = if args.json {
        json_report(args, reference, outcome)
    } else {
        table_report(args, reference, outcome)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(|e| format!("cannot write the report: {e}")),
    }
}

/// The command's result once the report is out: an error if the second process disagreed,
/// a mode did not end in the reference state, or a mode failed.
fn outcome_result(outcome: Outcome) -> Result<(), String> {
    if let Some(c) = outcome.cross.filter(|c| !c.agrees) {
        return Err(c.to_string().trim_end().to_string());
    }
    if let Some(why) = outcome.divergence {
        return Err(why["explanation"]
            .as_str()
            .unwrap_or("a mode did not end in the reference state")
            .to_string());
    }
    if let Some((b, e)) = outcome.failures.first() {
        return Err(format!("mode {} failed: {e}", b.name()));
    }
    Ok(())
}

fn divergence_json(d: &Divergence) -> serde_json::Value {
    json!({
        "mode": d.backend.name(),
        "first_differing_frame": d.frame,
        "values_equal": d.diff.equal,
        "differences": d.diff.differences.iter().map(|x| json!({"path": x.path, "left": x.left, "right": x.right, "note": x.note})).collect::<Vec<_>>(),
        "truncated": d.diff.truncated,
        "explanation": d.to_string().trim_end(),
    })
}

/// Why mode `name`, whose process ended in its own reference's state, did not end in this
/// process's: the lockstep reference differs between processes, where `c` (a comparison with
/// a second process) says.
fn process_divergence(
    name: &str,
    mode: &serde_json::Value,
    reference: &Reference,
    c: &crate::second::CrossCheck,
) -> serde_json::Value {
    let explanation = format!(
        "mode {name} did not end in the reference state: in its own process it ended in value digest {}, as the lockstep reference there did, and the lockstep reference in this process ended in {:016x}; {}",
        mode["value_digest"].as_str().unwrap_or("?"),
        reference.value_digest,
        c.to_string().trim_end()
    );
    let check = c.json();
    json!({
        "mode": name,
        "first_differing_frame": c.frame,
        "values_equal": c.diff.as_ref().map(|d| d.equal),
        "differences": check["differences"],
        "truncated": c.diff.as_ref().map(|d| d.truncated),
        "explanation": explanation,
    })
}

/// The report as one line of JSON (`--json`).
fn json_report(args: &SimulateArgs, reference: &Reference, outcome: &Outcome) -> String {
    let out = json!({
        "process": std::process::id(),
        "frames": args.frames,
        "players": args.players,
        "delay": args.delay,
        "saving": Saving::from(args.saving).name(),
        "seed": args.seed,
        "start_frame": reference.start_frame,
        "end_frame": reference.end_frame,
        "heap_bytes": reference.heap_bytes,
        "step_us": reference.step_us,
        "reference_digest": format!("{:016x}", reference.arena_digest),
        "reference_value_digest": format!("{:016x}", reference.value_digest),
        "game_digest": reference.game_digest,
        "modes": outcome.modes,
        "failed_modes": outcome.failures.iter().map(|(b, e)| json!({"mode": b.name(), "error": e})).collect::<Vec<_>>(),
        "divergence": outcome.divergence,
        "second_process": outcome.cross.as_ref().map(crate::second::CrossCheck::json),
        "note": if args.players == 1 { Some(ONE_PLAYER) } else { None },
    });
    format!("{out}\n")
}

/// The report as a header and a markdown table, one row per mode.
fn table_report(args: &SimulateArgs, reference: &Reference, outcome: &Outcome) -> String {
    let mut text = String::new();
    let tracker = luasnap::alloc::probe_trackers()
        .best()
        .map(|k| k.to_string());
    let _ = writeln!(
        text,
        "luasnap simulate: {} | frames {}..{} | {} players | delay {} | saving {} | seed {} | heap {} | reference G.step {:.0} µs (mean, this process, no snapshots) | tracker {}",
        what_runs(args),
        reference.start_frame,
        reference.end_frame,
        args.players,
        args.delay,
        Saving::from(args.saving).name(),
        args.seed,
        human_bytes(reference.heap_bytes),
        reference.step_us,
        tracker.as_deref().unwrap_or("none"),
    );
    let game_digest = reference
        .game_digest
        .map(|d| format!(", G.digest() {d}"))
        .unwrap_or_default();
    let _ = writeln!(
        text,
        "reference: arena digest {:016x}, value digest {:016x}{game_digest}\n",
        reference.arena_digest, reference.value_digest
    );
    mode_table(&mut text, &outcome.modes);
    for (b, e) in &outcome.failures {
        let _ = writeln!(text, "| {} | failed: {} |", b.name(), crate::shown(e));
    }
    if let Some(c) = outcome.cross.as_ref().filter(|c| c.agrees) {
        let _ = writeln!(text, "\n{c}");
    }
    if args.players == 1 {
        let _ = writeln!(text, "\nnote: {ONE_PLAYER}");
    }
    text
}

/// What the header says is simulated: the game script, a save, or both.
fn what_runs(args: &SimulateArgs) -> String {
    match (&args.game, &args.load) {
        (Some(p), Some(save)) => format!(
            "{} with the state saved in {} ({})",
            p.display(),
            save.display(),
            match args.trust {
                crate::diff::TrustArg::Own =>
                    "saved functions run the script's code; --trust own: those it lacks keep their saved code",
                crate::diff::TrustArg::Foreign => "saved functions run the script's code",
            }
        ),
        (Some(p), None) => p.display().to_string(),
        (None, Some(save)) => format!("the game saved in {}", save.display()),
        (None, None) => "the embedded default game".into(),
    }
}

/// A cost measured as the difference between a mode's run and the reference's (which ran
/// without snapshots), µs: the snapshot cost per frame and the rollback overhead with
/// tracking. When the steps' run-to-run noise beats the cost, the difference comes out
/// negative; it is then reported as within noise (0 in JSON, with a flag and the raw
/// figure), never as a negative cost.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Difference(f64);

impl Difference {
    /// Whether the noise beat the cost: the difference is negative (or not a number).
    fn within_noise(self) -> bool {
        self.0.is_nan() || self.0 < 0.0
    }
    /// The cost to report: the difference, or 0 within noise.
    fn reported(self) -> f64 {
        if self.within_noise() {
            0.0
        } else {
            self.0
        }
    }
    /// The table's cell: the cost in whole µs, or `< noise`.
    fn cell(self) -> String {
        if self.within_noise() {
            "< noise".into()
        } else {
            format!("{:.0}", self.0)
        }
    }
    /// The JSON fields: `<name>` (never negative), `<name>_raw` (as measured) and
    /// `<noise_flag>` (true when the raw figure was negative and `<name>` is 0).
    fn json_into(
        self,
        m: &mut serde_json::Map<String, serde_json::Value>,
        name: &str,
        noise_flag: &str,
    ) {
        m.insert(name.into(), json!(self.reported()));
        m.insert(format!("{name}_raw"), json!(self.0));
        m.insert(noise_flag.into(), json!(self.within_noise()));
    }
}

/// One mode's figures as JSON, steps compared with the reference's (run without snapshots):
/// those differences as [`Difference::json_into`] writes them. `process` is the process that
/// ran them.
fn mode_json(r: &ModeReport, reference: &Reference) -> serde_json::Value {
    let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len().max(1) as f64;
    let mut out = json!({
        "mode": r.backend.name(),
        "process": std::process::id(),
        "rollbacks": r.rollbacks,
        "resimulated_frames": r.resimulated,
        "save_us_median": r.save_us_median(),
        "save_us_p99": r.save_us_p99(),
        "load_us_median": r.load_us_median(),
        "load_us_p99": r.load_us_p99(),
        "rollback_overhead_us_median": r.rollback_us_median(),
        "rollback_overhead_us_p99": r.rollback_us_p99(),
        "step_us_mean": r.step_us_mean(),
        "copy_and_fault_us_per_frame": r.copy_and_fault_us_per_frame(),
        "pages_tracked": r.pages_tracked,
        "fault_ns": r.fault_ns,
        "memory_bytes": r.memory_bytes,
        "memory_mean_bytes": r.memory_mean_bytes,
        "pages_copied_per_frame_median": r.pages_per_frame_median(),
        "pages_copied_per_frame_mean": mean(&r.pages_per_frame),
        "pages_written_per_frame_median": r.written_per_frame_median(),
        "pages_written_per_frame_mean": (!r.written_per_frame.is_empty()).then(|| mean(&r.written_per_frame)),
        "frames_tracked": r.written_per_frame.len(),
        "extent_bytes": r.extent_bytes,
        "final_digest": format!("{:016x}", r.final_digest),
        "value_digest": format!("{:016x}", r.value_digest),
        "matches_reference": r.matches_reference,
    });
    if let serde_json::Value::Object(m) = &mut out {
        Difference(r.rollback_with_tracking_us_median(reference)).json_into(
            m,
            "rollback_overhead_with_tracking_us_median",
            "rollback_overhead_with_tracking_within_noise",
        );
        Difference(r.snapshot_cost_us_per_frame(reference)).json_into(
            m,
            "snapshot_cost_us_per_frame",
            "snapshot_cost_within_noise",
        );
    }
    out
}

/// The modes' figures (as [`mode_json`] writes them) as a markdown table.
fn mode_table(text: &mut String, modes: &[serde_json::Value]) {
    let _ = writeln!(
        text,
        "| mode | rollbacks | re-simulated frames | save µs median / p99 | load µs median / p99 | rollback overhead µs median / p99 | the same with tracking, median | G.step µs (mean) | snapshot cost µs per frame | saves, loads and faults µs per frame | pages written / copied per frame (median) | arena extent | snapshot memory, peak / mean | matches reference |"
    );
    let _ = writeln!(
        text,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for m in modes {
        // NaN (null in JSON) for a figure a mode's report lacks.
        let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
        let n = |k: &str| m[k].as_u64().unwrap_or(0);
        let name = m["mode"].as_str().unwrap_or("?");
        let copied = n("pages_copied_per_frame_median");
        let pages = match (name, m["pages_written_per_frame_median"].as_u64()) {
            ("serialize", _) => "-".to_string(),
            (_, Some(w)) => format!("{w} / {copied}"),
            (_, None) => format!("- / {copied}"),
        };
        let _ = writeln!(
            text,
            "| {name} | {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {:.0} | {} | {:.0} | {pages} | {} | {} / {} | {} |",
            n("rollbacks"),
            n("resimulated_frames"),
            f("save_us_median"),
            f("save_us_p99"),
            f("load_us_median"),
            f("load_us_p99"),
            f("rollback_overhead_us_median"),
            f("rollback_overhead_us_p99"),
            Difference(f("rollback_overhead_with_tracking_us_median_raw")).cell(),
            f("step_us_mean"),
            Difference(f("snapshot_cost_us_per_frame_raw")).cell(),
            f("copy_and_fault_us_per_frame"),
            human_bytes(n("extent_bytes")),
            human_bytes(n("memory_bytes")),
            human_bytes(n("memory_mean_bytes")),
            if m["matches_reference"] == true { "yes" } else { "NO" },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Difference;

    #[test]
    fn a_negative_difference_is_reported_as_within_noise_never_as_a_negative_cost() {
        // What a newcomer saw: the steps' noise beat the snapshot cost.
        for raw in [-929.0, -5210.0, -12812.0, -0.3, f64::NAN] {
            let d = Difference(raw);
            assert!(d.within_noise(), "{raw}");
            assert_eq!(d.reported(), 0.0);
            assert_eq!(d.cell(), "< noise");
            let mut m = serde_json::Map::new();
            d.json_into(&mut m, "cost", "cost_within_noise");
            assert_eq!(m["cost"], 0.0);
            assert_eq!(m["cost_within_noise"], true);
            if !raw.is_nan() {
                assert_eq!(m["cost_raw"], raw);
            }
        }
        for raw in [0.0, 0.4, 41.6, 5210.0] {
            let d = Difference(raw);
            assert!(!d.within_noise());
            assert_eq!(d.reported(), raw);
            assert_eq!(d.cell(), format!("{raw:.0}"));
            let mut m = serde_json::Map::new();
            d.json_into(&mut m, "cost", "cost_within_noise");
            assert_eq!(m["cost"], raw);
            assert_eq!(m["cost_raw"], raw);
            assert_eq!(m["cost_within_noise"], false);
        }
    }
}
