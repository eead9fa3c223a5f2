//! Helpers shared by the integration tests that run whole games.
#![allow(dead_code)] // each test binary uses its own subset

use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameConfig};

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

/// A folder game of `lua-bridge/games/` as one script, the way `stock_driver.lua --bundle`
/// writes it (the deterministic profile has no `require` yet): every other `.lua` file of the
/// folder becomes a function in a local table, loaded by a local `require` that finds only
/// those; `main.lua` runs last and its `G` is the script's result.
pub fn bundle(game: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("lua-bridge/games")
        .join(game);
    let mut files = Vec::new();
    let mut todo = vec![dir.clone()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "lua") {
                let rel = p.strip_prefix(&dir).unwrap().to_str().unwrap().to_string();
                if rel != "main.lua" {
                    files.push(rel);
                }
            }
        }
    }
    files.sort();
    let mut out = String::from(
        "local __modules, __loaded = {}, {}\n\
         local function require(name)\n\
         \x20 local v = __loaded[name]\n\
         \x20 if v ~= nil then return v end\n\
         \x20 local f = __modules[name]\n\
         \x20 if not f then error(\"module '\" .. tostring(name) .. \"' not found in the game folder\", 2) end\n\
         \x20 v = f(name)\n\
         \x20 if v == nil then v = true end\n\
         \x20 __loaded[name] = v\n\
         \x20 return v\n\
         end\n",
    );
    for rel in &files {
        let name = rel.trim_end_matches(".lua").replace('/', ".");
        let text = std::fs::read_to_string(dir.join(rel)).unwrap();
        out += &format!("__modules[{name:?}] = function(...)\n{text}\nend\n");
        if let Some(pkg) = name.strip_suffix(".init") {
            out += &format!("__modules[{pkg:?}] = __modules[{name:?}]\n");
        }
    }
    let main = std::fs::read_to_string(dir.join("main.lua")).unwrap();
    out += &format!("local __G = (function(...)\n{main}\nend)()\nreturn __G\n");
    out
}
