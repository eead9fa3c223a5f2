//! `luasnap diff A.sav B.sav`: the values that differ between two save-games, by path.

use luasnap::bridge::persist::{LoadOptions, Trust, MAGIC};
use luasnap::bridge::runtime::{Backend, Game, GameConfig};
use luasnap::bridge::value_diff::ValueGraph;
use luasnap::bridge::Vm;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `println!` that ignores a closed stdout (`luasnap diff a b | head -1` ends quietly).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Options of `luasnap diff`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The first save-game (left).
    pub left: PathBuf,
    /// The second save-game (right).
    pub right: PathBuf,
    /// The game that wrote them: its main script, or its folder (its functions are matched by
    /// the code the loading VM compiled); without it, a plain VM is tried, then the embedded
    /// default game.
    #[arg(long)]
    pub game: Option<PathBuf>,
    /// Load the saves as your own files (`own`: functions are compiled from the source they
    /// carry) or as files from someone else (`foreign`, the default: no code from the files;
    /// pass --game with the script that wrote them).
    #[arg(long, value_enum, default_value = "foreign")]
    pub trust: TrustArg,
    /// List at most this many differing paths.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `--trust`: who wrote the saves.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TrustArg {
    /// Your own files: the code they carry is compiled.
    Own,
    /// Files from someone else: no code from them.
    Foreign,
}

impl From<TrustArg> for Trust {
    fn from(t: TrustArg) -> Trust {
        match t {
            TrustArg::Own => Trust::Own,
            TrustArg::Foreign => Trust::Foreign,
        }
    }
}

/// Reads a file and checks that it is a luasnap save-game.
pub fn read_save(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read save-game {}: {e}", path.display()))?;
    if !bytes.starts_with(MAGIC) {
        return Err(format!(
            "{} is not a luasnap save-game (it does not start with {:?}); give a file written by `luasnap simulate --save` or Vm::save_game",
            path.display(),
            String::from_utf8_lossy(MAGIC)
        ));
    }
    Ok(bytes)
}

fn graph_of(bytes: &[u8], script: Option<&GameConfig>, trust: Trust) -> Result<ValueGraph, String> {
    let game_vm = |game: GameConfig| -> Result<Vm, String> {
        let mut cfg = game;
        cfg.capacity = 8 << 30;
        Game::load_script(&cfg, Backend::ArenaFull).map_err(|e| e.to_string())
    };
    let attempt = |mut vm: Vm| -> Result<ValueGraph, String> {
        // Saves to compare often come from another peer: no code from the file unless the
        // user vouches for it. Games keep objects with finalizers in their state: this VM
        // only lives to be read, so it takes them but never runs their finalizers (a file's
        // __gc would run outside the load's budget, when the VM collects or closes).
        let mut opts = LoadOptions::new(trust);
        opts.finalizers = false;
        opts.inert_finalizers = true;
        vm.load_game_with(bytes, &opts).map_err(|e| e.to_string())?;
        vm.value_graph().map_err(|e| e.to_string())
    };
    match script {
        Some(game) => attempt(game_vm(game.clone())?),
        None => {
            let plain = Vm::builder()
                .capacity(8 << 30)
                .deterministic(0)
                .build()
                .map_err(|e| e.to_string())?;
            if let Ok(g) = attempt(plain) {
                return Ok(g);
            }
            // Saves written by the runtime (`simulate --save`, the GGRS adapter) hold its glue
            // functions too: a runtime VM with an empty game names the game's own functions in
            // its error, the thing the user can act on.
            let empty = "return { init = function() end, step = function() end }";
            let empty = GameConfig {
                script: empty.into(),
                chunk_name: "=[empty game]".into(),
                ..GameConfig::default_game(1, 0)
            };
            let runtime_error = match attempt(game_vm(empty)?) {
                Ok(g) => return Ok(g),
                Err(e) => e,
            };
            let d = GameConfig::default_game(1, 0);
            attempt(game_vm(d)?).map_err(|_| {
                let hint = match trust {
                    Trust::Foreign => {
                        "pass --game SCRIPT with the script that wrote the saves, or --trust own \
                         if you trust them (they carry their code)"
                    }
                    Trust::Own => "pass --game SCRIPT with the script that wrote the saves",
                };
                format!("{runtime_error} ({hint})")
            })
        }
    }
}

/// Runs the diff: exit status 0 when the states are equal, 1 when they differ, 2 on error.
pub fn run(args: DiffArgs) -> ExitCode {
    match diff(&args) {
        Ok(equal) => {
            if equal {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("luasnap: {e}");
            ExitCode::from(2)
        }
    }
}

fn diff(args: &DiffArgs) -> Result<bool, String> {
    let (a, b) = (read_save(&args.left)?, read_save(&args.right)?);
    let script = match &args.game {
        Some(p) => Some(
            GameConfig::default_game(1, 0)
                .game_at(p)
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    if a == b {
        // Identical bytes hold identical values: nothing to load (no code, no trust needed).
        if args.json {
            out!(
                "{}",
                json!({
                    "left": args.left.display().to_string(),
                    "right": args.right.display().to_string(),
                    "equal": true,
                    "byte_identical": true,
                    "differences": [],
                    "truncated": false,
                })
            );
        } else {
            out!("equal: the two saves are byte-identical");
        }
        return Ok(true);
    }
    let ga = graph_of(&a, script.as_ref(), args.trust.into())
        .map_err(|e| format!("{}: {e}", args.left.display()))?;
    let gb = graph_of(&b, script.as_ref(), args.trust.into())
        .map_err(|e| format!("{}: {e}", args.right.display()))?;
    let d = ga.diff(&gb, args.limit);
    if args.json {
        let diffs: Vec<_> = d
            .differences
            .iter()
            .map(|x| json!({"path": x.path, "left": x.left, "right": x.right, "note": x.note}))
            .collect();
        out!(
            "{}",
            json!({
                "left": args.left.display().to_string(),
                "right": args.right.display().to_string(),
                "equal": d.equal,
                "left_digest": format!("{:016x}", ga.digest()),
                "right_digest": format!("{:016x}", gb.digest()),
                "differences": diffs,
                "truncated": d.truncated,
            })
        );
    } else if d.equal {
        out!("equal: the two saves hold the same values");
    } else {
        out!(
            "{} vs {}: differing values",
            args.left.display(),
            args.right.display()
        );
        for x in &d.differences {
            out!("  {x}");
        }
        if d.truncated && d.differences.is_empty() {
            out!("  (not listed: --limit {})", args.limit);
        } else if d.truncated {
            out!("  ... (more; raise --limit)");
        }
    }
    Ok(d.equal)
}
