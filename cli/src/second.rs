//! `luasnap simulate`'s second process: the lockstep reference run again in another process,
//! compared with this one's.
//!
//! A backend runs in the same process as the reference it is checked against (with `--mode
//! all` each mode's process runs its own), so anything that depends on the process (where the
//! executable was loaded, where the arena sits, a host library's state) agrees between them
//! and goes unseen. The second process runs the same command, reference only, and reports the
//! value digest after a few frames spread over the run; if one differs, it runs again and
//! reports after every frame of the stretch where they parted, which gives the first
//! differing frame, and then writes a save-game of its state after that frame, whose values
//! are diffed by path against this process's state there.

use crate::simulate::SimulateArgs;
use luasnap::bridge::persist::{LoadOptions, Trust};
use luasnap::bridge::runtime::{Backend, Game, GameConfig};
use luasnap::bridge::simulate::{checkpoints, LockstepRecord, Reference, Simulation};
use luasnap::bridge::value_diff::ValueDiff;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Frames the first comparison checks: evenly spaced, the last one included.
const CHECKPOINTS: u64 = 8;

/// Differing paths listed.
const LIMIT: usize = 20;

/// What the second process said about the lockstep reference.
#[derive(Debug)]
pub struct CrossCheck {
    /// The frames compared first and whether all agreed there.
    pub agrees: bool,
    /// The last frame compared (the run's last).
    pub last_frame: u64,
    /// The second process's value digest after the last frame.
    pub value_digest: u64,
    /// Where the runs part: the first frame after which the value digests differ.
    pub frame: Option<u64>,
    /// The values that differ after that frame (this process left, the second right).
    pub diff: Option<ValueDiff>,
}

impl CrossCheck {
    /// The check as `simulate --json` reports it (`second_process`).
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "matches": self.agrees,
            "value_digest": format!("{:016x}", self.value_digest),
            "first_differing_frame": self.frame,
            "differences": self.diff.as_ref().map(|d| d.differences.iter().map(|x| serde_json::json!({
                "path": x.path, "left": x.left, "right": x.right, "note": x.note,
            })).collect::<Vec<_>>()),
            "explanation": self.to_string().trim_end(),
        })
    }
}

impl std::fmt::Display for CrossCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.agrees {
            return write!(
                f,
                "second process: the lockstep reference agrees (value digest {:016x} after frame {})",
                self.value_digest, self.last_frame
            );
        }
        write!(
            f,
            "the lockstep reference differs in a second process (the same command, run again): \
             the state first differs after frame {}. The game's results depend on the process: \
             on addresses (`tostring` of a table or function, `%p`), on the order of `pairs()` \
             over keys whose position this build does not fix (light userdata, C functions no \
             library names), or on a native that reads the machine: see docs/determinism.md",
            self.frame
                .map_or_else(|| "(not found)".into(), |f| f.to_string())
        )?;
        match &self.diff {
            Some(d) if !d.equal => {
                writeln!(f, ". Differing values (this process vs the second):")?;
                for x in &d.differences {
                    writeln!(f, "  {x}")?;
                }
                if d.truncated {
                    writeln!(f, "  ... (more not shown)")?;
                }
                Ok(())
            }
            _ => write!(f, "."),
        }
    }
}

/// The frames the first comparison checks, for a run of `args`' frames from `start`.
pub fn first_frames(start: u64, frames: u64) -> Vec<u64> {
    checkpoints(start, frames, CHECKPOINTS)
}

/// A command that runs `simulate` in another process of this binary on the same game, start
/// and options as `args` (the files read for this run, the save loaded, the arena, budget and
/// collection points), without a second process of its own: the second process and the
/// processes of `--mode all`'s modes start from it.
pub fn same_game(args: &SimulateArgs) -> Result<Command, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot start another process (the executable: {e})"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("simulate");
    if let Some(g) = &args.game {
        cmd.arg(g);
    }
    cmd.args(["--frames", &args.frames.to_string()])
        .args(["--players", &args.players.to_string()])
        .args(["--seed", &args.seed.to_string()])
        .args(["--memory-limit", &args.memory_limit.to_string()])
        .args(["--step-budget", &args.step_budget.to_string()])
        .args(["--second-process", "off"]);
    if let Some(n) = args.collect_every {
        cmd.args(["--collect-every", &n.to_string()]);
    }
    if let Some(load) = &args.load {
        cmd.arg("--load").arg(load);
        cmd.args([
            "--trust",
            match args.trust {
                crate::diff::TrustArg::Own => "own",
                crate::diff::TrustArg::Foreign => "foreign",
            },
        ]);
    }
    for name in &args.allow_permanent {
        cmd.args(["--allow-permanent", name]);
    }
    if let Some(files) = &args.game_files {
        cmd.arg("--game-files").arg(files);
    }
    Ok(cmd)
}

/// Starts the second process: the same game, start and options, reference only, reporting
/// the value digest after each frame of `digests`, and with `save` a save-game of the state
/// after that frame written to that file.
pub fn spawn(
    args: &SimulateArgs,
    digests: &[u64],
    save: Option<(u64, &Path)>,
) -> Result<Child, String> {
    let mut cmd = same_game(args)?;
    let list: Vec<String> = digests.iter().map(u64::to_string).collect();
    cmd.args(["--lockstep-digests", &list.join(",")]);
    if let Some((frame, path)) = save {
        cmd.arg("--lockstep-save")
            .arg(format!("{frame}:{}", path.display()));
    }
    crate::tether::tether(&mut cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start a second process: {e}"))
}

/// Waits for the second process and reads its record.
fn collect(child: Child) -> Result<LockstepRecord, String> {
    let out = child
        .wait_with_output()
        .map_err(|e| format!("the second process: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the lockstep reference failed in a second process ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "the second process's report is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let digests = v["digests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let frame = d[0].as_u64()?;
            let digest = u64::from_str_radix(d[1].as_str()?, 16).ok()?;
            Some((frame, digest))
        })
        .collect();
    Ok(LockstepRecord {
        digests,
        save: None,
    })
}

/// The frames listed in `--lockstep-digests`.
pub fn frame_list(list: Option<&str>) -> Result<Vec<u64>, String> {
    match list {
        None | Some("") => Ok(Vec::new()),
        Some(list) => list
            .split(',')
            .map(|f| {
                f.parse()
                    .map_err(|_| format!("--lockstep-digests: {f:?} is not a frame"))
            })
            .collect(),
    }
}

/// `--lockstep-save FRAME:PATH`.
pub fn save_spec(spec: Option<&str>) -> Result<Option<(u64, PathBuf)>, String> {
    let Some(s) = spec else { return Ok(None) };
    let (frame, path) = s
        .split_once(':')
        .ok_or_else(|| format!("--lockstep-save: {s:?} is not FRAME:PATH"))?;
    let frame = frame
        .parse()
        .map_err(|_| format!("--lockstep-save: {frame:?} is not a frame"))?;
    Ok(Some((frame, PathBuf::from(path))))
}

/// The side of the second process (`--lockstep-digests`, `--lockstep-save`): runs the
/// lockstep reference and prints the digests asked for as one JSON object.
pub fn run_child(args: &SimulateArgs, sim: &mut Simulation) -> Result<(), String> {
    let digests = frame_list(args.lockstep_digests.as_deref())?;
    let save = save_spec(args.lockstep_save.as_deref())?;
    let record = sim
        .lockstep(&digests, save.as_ref().map(|(f, _)| *f))
        .map_err(|e| e.to_string())?;
    if let (Some((_, path)), Some(bytes)) = (&save, &record.save) {
        std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let digests: Vec<_> = record
        .digests
        .iter()
        .map(|(f, d)| serde_json::json!([f, format!("{d:016x}")]))
        .collect();
    println!("{}", serde_json::json!({ "digests": digests }));
    Ok(())
}

/// Compares the reference (with its digests at [`first_frames`]) with the second process
/// started on the same frames, and when they differ, finds the first differing frame and the
/// values that differ there.
pub fn compare(
    args: &SimulateArgs,
    game: &GameConfig,
    sim: &mut Simulation,
    reference: &Reference,
    first: Child,
) -> Result<CrossCheck, String> {
    let theirs = collect(first)?;
    let last = reference.end_frame.saturating_sub(1);
    let value_digest = theirs
        .digests
        .iter()
        .find(|(f, _)| *f == last)
        .map_or(0, |(_, d)| *d);
    let parted = reference
        .digests
        .iter()
        .zip(&theirs.digests)
        .position(|(a, b)| a != b)
        .or((reference.digests.len() != theirs.digests.len()).then_some(0));
    let Some(i) = parted else {
        return Ok(CrossCheck {
            agrees: true,
            last_frame: last,
            value_digest,
            frame: None,
            diff: None,
        });
    };
    // Every frame of the stretch where they parted.
    let from = if i == 0 {
        sim.start_frame()
    } else {
        reference.digests[i - 1].0 + 1
    };
    let upto = reference.digests[i].0;
    let stretch: Vec<u64> = (from..=upto).collect();
    let child = spawn(args, &stretch, None)?;
    let ours = sim.lockstep(&stretch, None).map_err(|e| e.to_string())?;
    let theirs = collect(child)?;
    let frame = ours
        .digests
        .iter()
        .zip(&theirs.digests)
        .find(|(a, b)| a != b)
        .map(|(a, _)| a.0);
    let diff = match frame {
        Some(f) => Some(diff_at(args, game, sim, f)?),
        None => None,
    };
    Ok(CrossCheck {
        agrees: false,
        last_frame: last,
        value_digest,
        frame,
        diff,
    })
}

/// The values that differ after frame `f` between this process and the second one (its
/// save-game of that state, loaded here beside the game).
fn diff_at(
    args: &SimulateArgs,
    game: &GameConfig,
    sim: &mut Simulation,
    f: u64,
) -> Result<ValueDiff, String> {
    // Removed when it drops, whichever way this returns.
    let path = crate::scratch_file(&format!("second-frame{f}-"), ".luasave")?;
    let child = spawn(args, &[], Some((f, &path)))?;
    let ours = sim.lockstep_graph(f).map_err(|e| e.to_string())?;
    collect(child)?;
    let bytes = std::fs::read(&path).map_err(|e| format!("the second process's save-game: {e}"))?;
    // Beside the simulation's own game: another arena, wherever the system puts it.
    let mut cfg = game.clone();
    cfg.base_address = None;
    let opts = match args.trust {
        crate::diff::TrustArg::Own => LoadOptions::new(Trust::Own),
        crate::diff::TrustArg::Foreign => {
            let mut o = LoadOptions::new(Trust::Foreign);
            o.finalizers = true;
            o
        }
    };
    let mut theirs: Game = Game::from_save_with(&cfg, Backend::ArenaFull, &bytes, &opts)
        .map_err(|e| format!("the second process's save-game: {e}"))?;
    let theirs = theirs.value_graph().map_err(|e| e.to_string())?;
    Ok(ours.diff(&theirs, LIMIT))
}
