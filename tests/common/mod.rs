//! Helpers shared by the integration tests: games run whole, tests run in a child process.
#![allow(dead_code)] // each test binary uses its own subset

pub mod child;
pub mod chunks;

use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameConfig};
use luasnap::bridge::Vm;

/// A coroutine suspended in a `pairs()` loop over a table keyed by tables, after clearing
/// its current entry twice (format 10 writes the removed keys after the root).
pub const SET_WALK: &str = "
set = {}
for i = 1, 12 do set[{ id = i }] = i end
walk = coroutine.wrap(function()
  for k, v in pairs(set) do set[k] = nil coroutine.yield(v) end
  return 'done'
end)
walk() walk()";

/// A VM of the deterministic profile seeded with `seed`, on an arena of `capacity` bytes.
pub fn det_vm(capacity: usize, seed: u64) -> Vm {
    Vm::builder()
        .capacity(capacity)
        .deterministic(seed)
        .build()
        .unwrap()
}

/// A VM of the full profile (`package`, `io`, ...), on an arena of `capacity` bytes.
pub fn full_vm(capacity: usize) -> Vm {
    Vm::builder().capacity(capacity).build().unwrap()
}

/// A two-player game (seed 3) from the script `main.lua`, at an address the OS chooses, under
/// a step budget of a million instructions: small games of one test each.
pub fn main_lua(script: &str) -> GameConfig {
    GameConfig {
        script: script.into(),
        chunk_name: "@main.lua".into(),
        base_address: None,
        capacity: 256 << 20,
        step_budget: Some(1_000_000),
        ..GameConfig::default_game(2, 3)
    }
}

/// A game of `players` from `script`, at an address the OS chooses.
pub fn config(name: &str, script: &str, players: usize, seed: u64) -> GameConfig {
    GameConfig {
        script: script.into(),
        chunk_name: format!("={name}"),
        players,
        seed,
        base_address: None,
        window: 8,
        capacity: 1 << 30,
        setup: Default::default(),
        step_budget: Some(luasnap::bridge::runtime::DEFAULT_STEP_BUDGET),
        ..GameConfig::default_game(players, seed)
    }
}

/// A save at frame `at` of a two-player game, loaded with the serializer backend and run
/// `more` frames, must equal `at + more` frames straight: values by path and `G.digest`.
pub fn continuation(name: &str, script: &str, at: u64, more: u64) {
    let cfg = config(name, script, 2, 9);
    let input = |f: u64| vec![scripted_input(9, f, 0), scripted_input(9, f, 1)];
    let mut straight = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..at + more {
        straight.step(&input(f)).unwrap();
    }
    let mut first = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..at {
        first.step(&input(f)).unwrap();
    }
    let save = first.save_game().unwrap();
    drop(first);
    let mut resumed = Game::from_save(&cfg, Backend::Serialize, &save).unwrap();
    assert_eq!(resumed.frame(), at);
    for f in at..at + more {
        resumed.step(&input(f)).unwrap();
    }
    let (a, b) = (
        straight.value_graph().unwrap(),
        resumed.value_graph().unwrap(),
    );
    let d = a.diff(&b, 10);
    assert!(
        d.equal,
        "{name}: save at {at} + {more} frames differs from a straight run:\n{}",
        d.differences
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        straight.game_digest().unwrap(),
        resumed.game_digest().unwrap()
    );
}

/// A folder game of `lua-bridge/games/`, run from its folder: `main.lua` is the script and
/// `require` loads the game's modules from the folder.
pub fn folder(game: &str, players: usize, seed: u64) -> GameConfig {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("lua-bridge/games")
        .join(game);
    config(game, "", players, seed).game_at(&dir).unwrap()
}

/// A fresh file named `prefix`…`suffix`, removed when the returned path drops: at the end of
/// the test, and while a failing test unwinds (a child process given its path only reads it).
pub fn temp_file(prefix: &str, suffix: &str) -> tempfile::TempPath {
    tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .tempfile()
        .unwrap()
        .into_temp_path()
}
