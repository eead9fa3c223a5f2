//! `luasnap p2p`: two GGRS peers on 127.0.0.1 running the Lua game, with desync detection.

use crate::simulate::{parse_step_budget, StepBudget};
use luasnap::bridge::ggrs_adapter::p2p_pair;
use luasnap::bridge::runtime::{GameConfig, DEFAULT_STEP_BUDGET};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `luasnap p2p`.
#[derive(Debug, clap::Args)]
pub struct P2pArgs {
    /// The game script (default: the embedded Arena Brawl).
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
}

/// Runs the two peers and reports.
pub fn run(args: P2pArgs) -> Result<(), String> {
    let mut cfg = GameConfig::default_game(2, args.seed);
    cfg.base_address = None; // two VMs in one process
    cfg.step_budget = args.step_budget.0;
    if let Some(path) = &args.game {
        cfg.script = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        cfg.chunk_name = format!("@{}", path.display());
    }
    let peers = p2p_pair(&cfg, args.frames, Duration::from_secs(args.timeout))?;
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
    if desyncs > 0 {
        let (frame, l, r) = peers
            .iter()
            .flat_map(|p| p.desyncs.iter())
            .next()
            .copied()
            .unwrap();
        return Err(format!("{desyncs} desyncs detected; first at frame {frame} (local checksum {l:x}, remote {r:x})"));
    }
    println!("no desync: both peers agreed on every checksum exchanged");
    Ok(())
}
