//! `luasnap p2p`: two GGRS peers on 127.0.0.1 running the Lua game, with desync detection: by
//! default in two processes (this one and a second one it starts), as two players' machines
//! would be; `--one-process` runs both in this process.
//!
//! A desync is explained as `simulate` explains a mode that diverges: both processes run the
//! game in lockstep with the inputs the session confirmed, compare value digests after every
//! frame up to the desync to find the first frame where they part, and diff the values there
//! by path. If the two lockstep runs agree, the desync came from a peer's re-simulations.

use crate::second::{frame_list, save_spec};
use crate::simulate::{parse_step_budget, StepBudget};
use luasnap::bridge::ggrs_adapter::{
    p2p_pair_with, p2p_peer_with, replay, PeerReport, PeerSocket, SessionOptions, DESYNC_INTERVAL,
};
use luasnap::bridge::runtime::scripted_input;
use luasnap::bridge::runtime::{Backend, Game, GameConfig, DEFAULT_STEP_BUDGET};
use luasnap::bridge::value_diff::ValueDiff;
use serde_json::json;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Options of `luasnap p2p`.
#[derive(Debug, clap::Args)]
pub struct P2pArgs {
    /// The game: its main script, or its folder (with main.lua; `require` loads the game's
    /// modules from the folder). Default: the embedded Arena Brawl.
    pub game: Option<PathBuf>,
    /// Frames each peer simulates.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub frames: u64,
    /// Seeds the game and the inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Lua instructions one G.step may run before it is stopped with an error naming the
    /// frame (an endless loop), counting the coroutines it resumes; `off` for no limit.
    #[arg(long, default_value_t = StepBudget(Some(DEFAULT_STEP_BUDGET)), value_parser = parse_step_budget)]
    pub step_budget: StepBudget,
    /// Frames between the runtime's collection points: a full collection at the end of every
    /// Nth frame, the only moments besides the game's own `collectgarbage()` where weak
    /// entries are cleared and finalizers run; 0 for none. It overrides the game's own
    /// `G.collect_every` (as GameConfig::collect_every does); without it, the game's, else 60.
    /// Both peers run with it (the second process is given it).
    #[arg(long, value_name = "N")]
    pub collect_every: Option<u64>,
    /// Run both peers in this process (two VMs, each where the system puts it) instead of one
    /// here and one in a second process.
    #[arg(long)]
    pub one_process: bool,
    /// GGRS's sparse saving: each peer saves only the last frame all inputs are confirmed for,
    /// so a rollback is one load and one save instead of a save per re-simulated frame, and
    /// goes back to that frame. Pays where a save costs more than a step (large heaps, cheap
    /// frames). Both peers run with it.
    #[arg(long)]
    pub sparse_saving: bool,
    /// (The second process's side: be player 2, talking to the first peer at this address.)
    #[arg(long, hide = true)]
    pub peer_of: Option<SocketAddr>,
    /// (The second process's side of an explanation: run in lockstep with the inputs in this
    /// file, one line of bytes in hex per frame.)
    #[arg(long, hide = true)]
    pub replay: Option<PathBuf>,
    /// (With --replay: the frames after which to report the value digest.)
    #[arg(long, hide = true)]
    pub lockstep_digests: Option<String>,
    /// (With --replay: FRAME:PATH, a save-game of the state after FRAME.)
    #[arg(long, hide = true)]
    pub lockstep_save: Option<String>,
    /// (The second process's side: the game's files as the first process read them, run
    /// instead of reading the game's folder.)
    #[arg(long, hide = true)]
    pub game_files: Option<PathBuf>,
}

/// The session's options: the defaults, with `--sparse-saving`.
fn session_options(args: &P2pArgs) -> SessionOptions {
    SessionOptions {
        sparse_saving: args.sparse_saving,
        ..SessionOptions::default()
    }
}

/// This process's peer `me` of a two-process run, with the run's options and scripted inputs.
fn scripted_peer(
    cfg: &GameConfig,
    me: usize,
    socket: PeerSocket,
    other: SocketAddr,
    frames: u64,
    timeout: Duration,
    options: &SessionOptions,
) -> Result<PeerReport, String> {
    let seed = cfg.seed;
    p2p_peer_with(cfg, me, socket, other, frames, timeout, options, |f, p| {
        scripted_input(seed, f, p)
    })
}

/// Differing paths listed.
const LIMIT: usize = 20;

/// The game of `args` with its folder read once for the run, each file the first time it is
/// required (`GameConfig::read_folder_lazily`): both peers, in one process or two, and the
/// replays that explain a desync run these files, whatever becomes of the folder meanwhile.
fn config(args: &P2pArgs) -> Result<GameConfig, String> {
    let mut cfg = crate::game_config(2, args.seed);
    cfg.step_budget = args.step_budget.0;
    cfg.collect_every = args.collect_every;
    match (&args.game_files, &args.game) {
        (Some(files), _) => crate::game_files::read(files, cfg),
        (None, Some(path)) => cfg
            .game_at(path)
            .map(GameConfig::read_folder_lazily)
            .map_err(|e| e.to_string()),
        (None, None) => Ok(cfg),
    }
}

/// Runs the two peers and reports.
pub fn run(mut args: P2pArgs) -> Result<(), String> {
    let mut cfg = config(&args)?;
    // Second processes run the files read here (removed when the run ends).
    let _files = match (&args.game, &args.game_files) {
        (Some(_), None) if !args.one_process => {
            let files = crate::game_files::write(&mut cfg)?;
            args.game_files = Some(files.to_path_buf());
            Some(files)
        }
        _ => None,
    };
    let timeout = Duration::from_secs(args.timeout);
    if let Some(path) = &args.replay {
        return replay_child(&args, &cfg, path);
    }
    if let Some(first) = args.peer_of {
        return second_peer(&cfg, first, args.frames, timeout, &session_options(&args));
    }
    let peers = if args.one_process {
        cfg.base_address = None; // two VMs in one process
        p2p_pair_with(
            &cfg,
            args.frames,
            timeout,
            &session_options(&args),
            scripted_input,
        )?
    } else {
        two_processes(&args, &cfg, timeout)?
    };
    println!("| peer | frames | rollbacks | frames advanced | desyncs | wall time |");
    println!("|---|---|---|---|---|---|");
    for (i, p) in peers.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {:.2} s |",
            i + 1,
            p.frames,
            p.rollbacks,
            p.advances,
            p.desyncs.len(),
            p.elapsed.as_secs_f64()
        );
    }
    let desyncs: usize = peers.iter().map(|p| p.desyncs.len()).sum();
    let Some(&(frame, l, r)) = peers
        .iter()
        .flat_map(|p| p.desyncs.iter())
        .min_by_key(|d| d.0)
    else {
        println!(
            "no desync: both peers agreed on every checksum exchanged ({}{})",
            if args.one_process {
                "one process"
            } else {
                "two processes"
            },
            if args.sparse_saving {
                ", sparse saving"
            } else {
                ""
            }
        );
        return Ok(());
    };
    let head = format!(
        "{desyncs} desyncs detected; first at frame {frame} (local checksum {l:x}, remote {r:x})"
    );
    let why = explain(&args, &cfg, &peers[0].inputs, frame.max(0) as u64)
        .unwrap_or_else(|e| format!("(could not explain it: {e})"));
    Err(format!("{head}. {why}"))
}

/// This process is player 1; a second process, started here, is player 2.
fn two_processes(
    args: &P2pArgs,
    cfg: &GameConfig,
    timeout: Duration,
) -> Result<[PeerReport; 2], String> {
    let socket = PeerSocket::loopback().map_err(|e| e.to_string())?;
    let here = socket.local_addr().map_err(|e| e.to_string())?;
    let mut cmd = base_command(args)?;
    cmd.arg("--peer-of").arg(here.to_string());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the second peer's process: {e}"))?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let there = match out.read_line(&mut line) {
        Ok(n) if n > 0 => serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| v["port"].as_u64())
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port as u16))),
        _ => None,
    };
    let Some(there) = there else {
        return Err(failed_child(
            child,
            "the second peer's process did not start",
        ));
    };
    let options = session_options(args);
    let mine = scripted_peer(cfg, 0, socket, there, args.frames, timeout, &options);
    if let Err(e) = mine {
        // The other peer would wait for this one until its timeout.
        let _ = child.kill();
        return Err(match child.try_wait() {
            Ok(Some(st)) if !st.success() => format!(
                "{e}; {}",
                failed_child(child, "the second peer's process failed")
            ),
            _ => {
                let _ = child.wait();
                e
            }
        });
    }
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let status = child.wait().map_err(|e| e.to_string())?;
    let mine = mine?;
    let theirs = serde_json::from_str::<serde_json::Value>(rest.trim())
        .ok()
        .filter(|_| status.success())
        .and_then(|v| report_from_json(&v));
    let Some(theirs) = theirs else {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!(
            "the second peer's process failed ({status}): {}",
            err.trim()
        ));
    };
    Ok([mine, theirs])
}

/// The error of a second process that ended early: its status and what it printed.
fn failed_child(mut child: Child, what: &str) -> String {
    let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    format!("{what} ({status}): {}", err.trim())
}

/// `luasnap p2p` with this game, frames, seed and budget, for a second process.
fn base_command(args: &P2pArgs) -> Result<Command, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot start a second process (the executable: {e})"))?;
    let mut cmd = Command::new(exe);
    crate::tether::tether(&mut cmd).arg("p2p");
    if let Some(g) = &args.game {
        cmd.arg(g);
    }
    cmd.args(["--frames", &args.frames.to_string()])
        .args(["--seed", &args.seed.to_string()])
        .args(["--timeout", &args.timeout.to_string()])
        .args(["--step-budget", &args.step_budget.to_string()]);
    if let Some(n) = args.collect_every {
        cmd.args(["--collect-every", &n.to_string()]);
    }
    if args.sparse_saving {
        cmd.arg("--sparse-saving");
    }
    if let Some(files) = &args.game_files {
        cmd.arg("--game-files").arg(files);
    }
    Ok(cmd)
}

/// The second process's peer: player 2. Prints its port, then its report, as JSON lines.
fn second_peer(
    cfg: &GameConfig,
    first: SocketAddr,
    frames: u64,
    timeout: Duration,
    options: &SessionOptions,
) -> Result<(), String> {
    let socket = PeerSocket::loopback().map_err(|e| e.to_string())?;
    let port = socket.local_addr().map_err(|e| e.to_string())?.port();
    println!("{}", json!({ "port": port }));
    let r = scripted_peer(cfg, 1, socket, first, frames, timeout, options)?;
    let desyncs: Vec<_> = r
        .desyncs
        .iter()
        .map(|(f, l, r)| json!([f, format!("{l:x}"), format!("{r:x}")]))
        .collect();
    println!(
        "{}",
        json!({
            "frames": r.frames,
            "rollbacks": r.rollbacks,
            "advances": r.advances,
            "desyncs": desyncs,
            "elapsed_s": r.elapsed.as_secs_f64(),
        })
    );
    Ok(())
}

fn report_from_json(v: &serde_json::Value) -> Option<PeerReport> {
    let desyncs = v["desyncs"]
        .as_array()?
        .iter()
        .filter_map(|d| {
            Some((
                d[0].as_i64()? as i32,
                u128::from_str_radix(d[1].as_str()?, 16).ok()?,
                u128::from_str_radix(d[2].as_str()?, 16).ok()?,
            ))
        })
        .collect();
    Some(PeerReport {
        frames: v["frames"].as_u64()?,
        rollbacks: v["rollbacks"].as_u64()?,
        advances: v["advances"].as_u64()?,
        desyncs,
        desync_files: Vec::new(),
        elapsed: Duration::from_secs_f64(v["elapsed_s"].as_f64()?),
        // Its inputs are this side's; its checksum the default's (the game digest).
        ..PeerReport::default()
    })
}

fn write_inputs(path: &Path, inputs: &[Vec<u8>]) -> Result<(), String> {
    let text: String = inputs
        .iter()
        .map(|f| f.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n")
        .collect();
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn read_inputs(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .map(|l| {
            (0..l.len() / 2)
                .map(|i| u8::from_str_radix(&l[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|_| format!("{}: not an input line: {l:?}", path.display()))
        })
        .collect()
}

/// The second process's side of an explanation (`--replay`): prints the digests asked for.
fn replay_child(args: &P2pArgs, cfg: &GameConfig, path: &Path) -> Result<(), String> {
    let inputs = read_inputs(path)?;
    let digests = frame_list(args.lockstep_digests.as_deref())?;
    let save = save_spec(args.lockstep_save.as_deref())?;
    let r = replay(cfg, &inputs, &digests, save.as_ref().map(|s| s.0), false)
        .map_err(|e| e.to_string())?;
    if let (Some((_, path)), Some(bytes)) = (&save, &r.save) {
        std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let digests: Vec<_> = r
        .digests
        .iter()
        .map(|(f, d)| json!([f, format!("{d:016x}")]))
        .collect();
    println!("{}", json!({ "digests": digests }));
    Ok(())
}

/// Runs the replay in a second process and returns its digests.
fn replay_elsewhere(
    args: &P2pArgs,
    inputs: &Path,
    digests: &[u64],
    save: Option<(u64, &Path)>,
) -> Result<Vec<(u64, u64)>, String> {
    let mut cmd = base_command(args)?;
    cmd.arg("--replay").arg(inputs);
    let list: Vec<String> = digests.iter().map(u64::to_string).collect();
    cmd.args(["--lockstep-digests", &list.join(",")]);
    if let Some((f, p)) = save {
        cmd.arg("--lockstep-save")
            .arg(format!("{f}:{}", p.display()));
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start a second process: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the lockstep replay failed in a second process ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("the replay's report: {e}"))?;
    Ok(v["digests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            Some((
                d[0].as_u64()?,
                u64::from_str_radix(d[1].as_str()?, 16).ok()?,
            ))
        })
        .collect())
}

/// Why the peers' states at `frame` (a desync GGRS found) differ: lockstep runs with the
/// confirmed `inputs` in this process and in a second one, compared after every frame since
/// the last checksum the peers agreed on.
fn explain(
    args: &P2pArgs,
    cfg: &GameConfig,
    inputs: &[Vec<u8>],
    frame: u64,
) -> Result<String, String> {
    if inputs.len() as u64 <= frame {
        return Err(format!("the inputs of frame {frame} are not known here"));
    }
    let from = frame.saturating_sub(DESYNC_INTERVAL as u64);
    let stretch: Vec<u64> = (from..=frame).collect();
    // Both files are removed when they drop, whichever way this returns.
    let file = crate::scratch_file("p2p-", ".inputs")?;
    write_inputs(&file, &inputs[..=frame as usize])?;
    let theirs = replay_elsewhere(args, &file, &stretch, None)?;
    let ours = replay(cfg, inputs, &stretch, None, false).map_err(|e| e.to_string())?;
    let Some(f) = ours
        .digests
        .iter()
        .zip(&theirs)
        .find(|(a, b)| a != b)
        .map(|(a, _)| a.0)
    else {
        return Ok(format!(
            "Run in lockstep with the confirmed inputs, the game agrees in two processes up \
             to frame {frame}: the desync comes from a peer's re-simulations after rollbacks \
             (state the game keeps outside its values, collector timing), not from the process"
        ));
    };
    let save = crate::scratch_file(&format!("p2p-frame{f}-"), ".luasave")?;
    replay_elsewhere(args, &file, &[], Some((f, &save)))?;
    let bytes = std::fs::read(&save).map_err(|e| format!("the second process's save-game: {e}"))?;
    let ours = replay(cfg, inputs, &[], Some(f), true).map_err(|e| e.to_string())?;
    let mut there = cfg.clone();
    there.base_address = None;
    let mut theirs: Game = Game::from_save(&there, Backend::ArenaFull, &bytes)
        .map_err(|e| format!("the second process's save-game: {e}"))?;
    let theirs = theirs.value_graph().map_err(|e| e.to_string())?;
    let diff = ours.graph.expect("asked for").diff(&theirs, LIMIT);
    Ok(describe(f, &diff))
}

fn describe(f: u64, diff: &ValueDiff) -> String {
    let mut s = format!(
        "Run in lockstep with the confirmed inputs in two processes, the state first differs \
         after frame {f}: the game's results depend on the process (see docs/determinism.md)"
    );
    if !diff.equal {
        s.push_str(". Differing values (this process vs the second):\n");
        for d in &diff.differences {
            s.push_str(&format!("  {d}\n"));
        }
        if diff.truncated {
            s.push_str("  ... (more not shown)\n");
        }
    }
    s.trim_end().to_string()
}
