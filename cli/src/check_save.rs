//! `luasnap check-save GAME SAVE...`: loads kept save-games of older versions into this
//! version of the game, as a player's `simulate --load` would (the game's declarations read
//! and checked first), and says for each what became of its functions, or why it is refused:
//! a refusal names every saved function this version lacks at once. A developer runs it
//! before shipping, so an undeclared removal is found on their machine, not by players.

use crate::diff::TrustArg;
use crate::loads::LoadFlags;
use crate::save_file::{read_save, Body};
use luasnap::bridge::persist::{FunctionBinding, LoadOptions, LoadReport, SavedFunction};
use luasnap::bridge::runtime::{Backend, Game, GameConfig, GameError};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `luasnap check-save`.
#[derive(Debug, clap::Args)]
pub struct CheckSaveArgs {
    /// This version of the game: its main script, or its folder.
    pub game: PathBuf,
    /// The save-games to check (written by older versions, kept for this).
    #[arg(required = true, value_name = "SAVE")]
    pub saves: Vec<PathBuf>,
    /// Who writes such saves: `foreign` (the default, as a player's load: no code from the
    /// file, and every saved function this version lacks needs a declaration) or `own`
    /// (what this version lacks keeps its saved code).
    #[arg(long, value_enum, default_value = "foreign")]
    pub trust: TrustArg,
    /// A library function the game's state holds on purpose (`load`), accepted as the
    /// names the script lists in `G.permanents`; repeat for more.
    #[arg(long = "allow-permanent", value_name = "NAME")]
    pub allow_permanent: Vec<String>,
    /// The size of the game's arena, as `simulate --memory-limit`: a save's body larger
    /// than it is refused without reading it.
    #[arg(long, default_value = "2G", value_parser = crate::simulate::parse_memory_limit)]
    pub memory_limit: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How a refusal says what accepts it: check-save has `--trust own` and reads the game's
/// declarations.
const CHECK_SAVE: LoadFlags = LoadFlags {
    command: "check-save",
    trust_own: true,
    runs_game: true,
};

/// What became of one save: the load's report, or why it is refused.
type Checked = Result<LoadReport, String>;

/// Runs the command: status 0 if every save loads, 1 if any is refused (or the game does not
/// start: then no save is checked).
pub fn run(args: CheckSaveArgs) -> ExitCode {
    let mut cfg = crate::game_config(1, 0);
    cfg.permanents.extend(args.allow_permanent.iter().cloned());
    cfg.capacity = args.memory_limit;
    let cfg = match cfg.game_at(&args.game) {
        Ok(cfg) => cfg,
        Err(e) => return fail(&e.to_string()),
    };
    let mut checked = Vec::with_capacity(args.saves.len());
    for path in &args.saves {
        match check(&cfg, &args, path) {
            Ok(one) => checked.push(one),
            // The game itself does not start (its declarations): no save can be checked.
            Err(e) => return fail(&e),
        }
    }
    let refused = checked.iter().filter(|c| c.is_err()).count();
    if args.json {
        print_json(&args.saves, &checked, refused);
    } else {
        print_text(&args.saves, &checked, refused);
    }
    if refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn fail(e: &str) -> ExitCode {
    eprintln!("luasnap: {}", crate::shown(e));
    ExitCode::FAILURE
}

/// One save checked; Err only when the game does not start (its declarations are wrong).
fn check(
    cfg: &GameConfig,
    args: &CheckSaveArgs,
    path: &std::path::Path,
) -> Result<Checked, String> {
    let body = Body::Load {
        max: args.memory_limit as u64,
        flag: "--memory-limit",
    };
    let bytes = match read_save(path, body) {
        Ok(b) => b,
        Err(e) => return Ok(Err(e)),
    };
    let mut opts = LoadOptions::new(args.trust.into());
    opts.finalizers = true;
    opts.functions = FunctionBinding::Current;
    match Game::<u8>::check_save(cfg, Backend::default(), &bytes, &opts) {
        Ok(report) => Ok(Ok(report)),
        Err(GameError::Load(e)) => Ok(Err(crate::loads::load_error_on_the_command_line(
            &e, CHECK_SAVE,
        ))),
        Err(e @ GameError::Declared { .. }) => Err(e.to_string()),
        Err(e) => Ok(Err(e.to_string())),
    }
}

fn print_text(saves: &[PathBuf], checked: &[Checked], refused: usize) {
    for (path, c) in saves.iter().zip(checked) {
        match c {
            Ok(report) => println!("{}: loads: {}", path.display(), report.summary()),
            Err(e) => println!("{}: refused: {}", path.display(), crate::shown(e)),
        }
    }
    println!(
        "{} of {} save-games load into this version{}",
        saves.len() - refused,
        saves.len(),
        if refused > 0 {
            "; declare what became of the functions named above in the table the game's script returns (G.renamed, G.removed, G.moved), then check again"
        } else {
            ""
        }
    );
}

fn print_json(saves: &[PathBuf], checked: &[Checked], refused: usize) {
    let list = |v: &[SavedFunction]| -> Vec<String> { v.iter().map(|f| f.to_string()).collect() };
    let each: Vec<serde_json::Value> = saves
        .iter()
        .zip(checked)
        .map(|(path, c)| match c {
            Ok(r) => json!({
                "path": path.display().to_string(),
                "loads": true,
                "unchanged": r.unchanged,
                "rebound": list(&r.rebound),
                "moved": list(&r.moved),
                "renamed": r.renamed.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
                "removed": list(&r.removed),
                "moved_files": r.moved_files.iter().map(|m| json!({"from": m.from, "to": m.to})).collect::<Vec<_>>(),
                "unnamed_rebound": list(&r.unnamed_rebound),
                "kept": list(&r.kept),
                "missing": list(&r.missing),
                "added": r.added,
                "summary": r.summary(),
            }),
            Err(e) => json!({
                "path": path.display().to_string(),
                "loads": false,
                "error": e,
            }),
        })
        .collect();
    let out = json!({ "saves": each, "refused": refused });
    println!("{out}");
}
