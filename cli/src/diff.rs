//! `luasnap diff A.sav B.sav`: the values that differ between two save-games, by path.

use crate::save_file::{read_save, Body};
use luasnap::bridge::persist::Trust;
use luasnap::bridge::persist::{Accept, LoadError};
use luasnap::bridge::runtime::{GameConfig, GameError};
use luasnap::bridge::value_diff::{
    needs_more_memory, save_graph_allowing, KeysOnOneSide, ValueGraph,
};
use luasnap::bridge::VmError;
use serde_json::json;
use std::path::PathBuf;
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
    /// The game that wrote them: its main script, or its folder (compiled, not run: its
    /// functions are matched by the code the loading VM compiled); without it, a plain VM is
    /// tried, then the embedded default game. Natives and userdata types this binary does not
    /// register load as named stand-ins (`native host.roll`, a userdata whose metatable names
    /// `Vec2`), compared by name and bytes.
    #[arg(long)]
    pub game: Option<PathBuf>,
    /// Load the saves as your own files (`own`: functions are compiled from the source they
    /// carry) or as files from someone else (`foreign`, the default: no code from the files;
    /// pass --game with the script that wrote them).
    #[arg(long, value_enum, default_value = "foreign")]
    pub trust: TrustArg,
    /// A library function the saves' state holds on purpose (`load`, `collectgarbage`): a
    /// foreign load accepts it, as a game's `G.permanents` would (diff compiles the game
    /// without running it, so it does not read `G.permanents`); repeat for more.
    #[arg(long = "allow-permanent", value_name = "NAME")]
    pub allow_permanent: Vec<String>,
    /// List at most this many differing paths.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The memory the comparison may use, in MiB: each save's load may grow its heap by half
    /// of it, each save's graph of values hold a quarter (the loaded heap goes before the
    /// next save loads). Past it, diff stops and says which part needed more.
    #[arg(long, default_value_t = DEFAULT_MAX_MEMORY_MIB, value_name = "MIB")]
    pub max_memory: usize,
}

/// `--max-memory`'s default, in MiB.
pub const DEFAULT_MAX_MEMORY_MIB: usize = luasnap::bridge::value_diff::DEFAULT_MAX_MEMORY >> 20;

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

/// The save's values, read by the library's `save_graph_allowing` (stand-ins for what this
/// binary's VMs lack, the `--allow-permanent` names accepted) within `max_memory` bytes, with
/// what to do on the command line when that fails.
fn graph_of(
    bytes: &[u8],
    game: Option<&GameConfig>,
    args: &DiffArgs,
    max_memory: usize,
) -> Result<ValueGraph, String> {
    let trust = Trust::from(args.trust);
    let mut allowed = args.allow_permanent.clone();
    allowed.extend(crate::host_permanents());
    save_graph_allowing(game, bytes, trust, max_memory, &allowed).map_err(|e| {
        let message = match &e {
            GameError::Load(l) => {
                crate::loads::load_error_on_the_command_line(l, crate::loads::DIFF)
            }
            GameError::Vm(VmError::ValueGraphTooLarge { limit, objects }) => format!(
                "the state's values take more than {} MiB to compare ({objects} objects read so far)",
                limit >> 20
            ),
            e => e.to_string(),
        };
        let refused = match &e {
            GameError::Load(LoadError::Refused { accept, .. }) => Some(accept),
            _ => None,
        };
        let hint = match (game, trust) {
            _ if needs_more_memory(&e) => {
                return format!(
                    "{message}; luasnap diff loads each save within half of --max-memory ({} MiB now) \
                     and builds its graph within a quarter: raise it if the machine has the memory",
                    max_memory >> 20
                )
            }
            (Some(_), _) => return message,
            // The refusal names the flags that accept the permanent; a game would not.
            (None, _)
                if matches!(
                    refused,
                    Some(Accept::Permanent(_) | Accept::Permanents { .. })
                ) =>
            {
                return message
            }
            // The refusal names --trust own already.
            (None, _) if refused.is_some() => {
                return format!(
                    "{message}; or pass --game SCRIPT with the script that wrote the saves"
                )
            }
            (None, Trust::Foreign) => {
                "pass --game SCRIPT with the script that wrote the saves, or --trust own if you \
                 trust them (they carry their code)"
            }
            (None, Trust::Own) => "pass --game SCRIPT with the script that wrote the saves",
        };
        format!("{message} ({hint})")
    })
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
            eprintln!("luasnap: {}", crate::shown(&e));
            ExitCode::from(2)
        }
    }
}

/// The keys on one side only, a line per table (at most `limit` tables): the count behind the
/// `(absent)` lines, which `--limit` cuts short.
fn keys_on_one_side(tables: &[KeysOnOneSide], limit: usize) {
    if tables.is_empty() || limit == 0 {
        return;
    }
    out!("keys on one side only, by table (left vs right):");
    for k in tables.iter().take(limit) {
        out!("  {k}");
    }
    if tables.len() > limit {
        out!(
            "  ... ({} more tables; raise --limit)",
            tables.len() - limit
        );
    }
}

fn diff(args: &DiffArgs) -> Result<bool, String> {
    let body = Body::Load {
        max: args.max_memory.saturating_mul(1 << 20) as u64,
        flag: "--max-memory",
    };
    let (a, b) = (read_save(&args.left, body)?, read_save(&args.right, body)?);
    let game = match &args.game {
        Some(p) => Some(
            crate::game_config(1, 0)
                .game_at(p)
                .map_err(|e| format!("the game given by --game: {e}"))?,
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
    let max_memory = args.max_memory.saturating_mul(1 << 20);
    let ga = graph_of(&a, game.as_ref(), args, max_memory)
        .map_err(|e| format!("{}: {e}", args.left.display()))?;
    let gb = graph_of(&b, game.as_ref(), args, max_memory)
        .map_err(|e| format!("{}: {e}", args.right.display()))?;
    let d = ga.diff(&gb, args.limit);
    if args.json {
        let diffs: Vec<_> = d
            .differences
            .iter()
            .map(|x| json!({"path": x.path, "left": x.left, "right": x.right, "note": x.note}))
            .collect();
        let keys: Vec<_> = d
            .keys_on_one_side
            .iter()
            .map(
                |k| json!({"table": k.table, "only_left": k.only_left, "only_right": k.only_right}),
            )
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
                "keys_on_one_side": keys,
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
        keys_on_one_side(&d.keys_on_one_side, args.limit);
    }
    Ok(d.equal)
}
