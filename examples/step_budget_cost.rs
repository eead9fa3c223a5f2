//! What the instruction budget of `G.step` costs: each game runs twice side by side, with the
//! budget off and at its default, in alternating blocks of frames, timed by the thread's CPU
//! time (so other processes on a shared machine count less); and how many instructions the
//! budget charged per frame (`Vm::last_budget_used`), the figure to hold a budget against.
//!
//! `cargo run --release --example step_budget_cost [FRAMES] [GAME.lua ...]` (default 300
//! frames; the five single-file corpus games, then any game scripts given, such as the bundles
//! `lua lua-bridge/games/stock_driver.lua lua-bridge/games/json_town --bundle /tmp/json_town.lua`
//! writes for the folder games).

use cpu_time::ThreadTime;
use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameConfig, DEFAULT_STEP_BUDGET};
use std::time::Duration;

const GAMES: [(&str, &str); 5] = [
    (
        "arena_brawl",
        include_str!("../lua-bridge/games/arena_brawl.lua"),
    ),
    (
        "arena_shooter",
        include_str!("../lua-bridge/games/arena_shooter.lua"),
    ),
    (
        "ai_village",
        include_str!("../lua-bridge/games/ai_village.lua"),
    ),
    (
        "bulk_market",
        include_str!("../lua-bridge/games/bulk_market.lua"),
    ),
    (
        "dungeon_crawl",
        include_str!("../lua-bridge/games/dungeon_crawl.lua"),
    ),
];

/// The median of a sample (sorted in place).
fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let frames: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(300);
    let mut games: Vec<(String, String)> = GAMES
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect();
    for path in args {
        let name = std::path::Path::new(&path)
            .file_stem()
            .map_or(path.clone(), |s| s.to_string_lossy().into_owned());
        games.push((name, std::fs::read_to_string(&path)?));
    }
    println!(
        "| game | G.step, budget off | G.step, budget {DEFAULT_STEP_BUDGET} | ratio | \
         instructions charged per frame, median / max |"
    );
    println!("|---|---|---|---|---|");
    for (name, script) in games {
        let cfg = |budget| GameConfig {
            script: script.clone(),
            chunk_name: format!("={name}"),
            base_address: None,
            step_budget: budget,
            ..GameConfig::default_game(2, 5)
        };
        let mut runs = [
            Game::new(&cfg(None), Backend::ArenaFull)?,
            Game::new(&cfg(Some(DEFAULT_STEP_BUDGET)), Backend::ArenaFull)?,
        ];
        let mut spent = [Duration::ZERO; 2];
        let mut charged = Vec::new();
        let block = 25;
        let mut f = 0;
        while f < frames {
            for (i, (g, t)) in runs.iter_mut().zip(&mut spent).enumerate() {
                for k in f..(f + block).min(frames) {
                    let inputs = [scripted_input(5, k, 0), scripted_input(5, k, 1)];
                    let start = ThreadTime::now();
                    g.step(&inputs)?;
                    *t += start.elapsed();
                    if i == 1 {
                        charged.push(g.vm().last_budget_used());
                    }
                }
            }
            f += block;
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6 / frames as f64;
        let max = charged.iter().copied().max().unwrap_or(0);
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:.3} | {} / {} |",
            us(spent[0]),
            us(spent[1]),
            spent[1].as_secs_f64() / spent[0].as_secs_f64(),
            median(&mut charged),
            max
        );
    }
    Ok(())
}
