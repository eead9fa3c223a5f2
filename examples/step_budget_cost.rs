//! What the instruction budget of `G.step` costs: each corpus game runs twice side by side, with
//! the budget off and at its default, in alternating blocks of frames, timed by the thread's
//! CPU time (so other processes on a shared machine count less).
//!
//! `cargo run --release --example step_budget_cost [FRAMES]` (default 300).

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let frames: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(300);
    println!("| game | G.step, budget off | G.step, budget {DEFAULT_STEP_BUDGET} | ratio |");
    println!("|---|---|---|---|");
    for (name, script) in GAMES {
        let cfg = |budget| GameConfig {
            script: script.into(),
            chunk_name: format!("={name}"),
            base_address: None,
            step_budget: budget,
            ..GameConfig::default_game(2, 5)
        };
        let mut games = [
            Game::new(&cfg(None), Backend::ArenaFull)?,
            Game::new(&cfg(Some(DEFAULT_STEP_BUDGET)), Backend::ArenaFull)?,
        ];
        let mut spent = [Duration::ZERO; 2];
        let block = 25;
        let mut f = 0;
        while f < frames {
            for (g, t) in games.iter_mut().zip(&mut spent) {
                let start = ThreadTime::now();
                for k in f..(f + block).min(frames) {
                    g.step(&[scripted_input(5, k, 0), scripted_input(5, k, 1)])?;
                }
                *t += start.elapsed();
            }
            f += block;
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6 / frames as f64;
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:.2} |",
            us(spent[0]),
            us(spent[1]),
            spent[1].as_secs_f64() / spent[0].as_secs_f64()
        );
    }
    Ok(())
}
