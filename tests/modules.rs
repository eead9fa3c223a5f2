//! A game is a folder: the deterministic profile's `require` loads the game's own modules
//! (`name.lua`, `name/init.lua`, dots as folders) and nothing else; modules given by name and
//! source; chunk names relative to the game's folder, so a moved game keeps its saves.

use luasnap::bridge::runtime::{Backend, Game, GameConfig};
use luasnap::bridge::{Module, Value, Vm};
use std::path::Path;

/// A fresh folder named by `tag`, removed with all it holds when the guard drops.
fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("luasnap-modules-{tag}-"))
        .tempdir()
        .unwrap()
}

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A small game of three files: main.lua, lib/counter.lua, town/init.lua.
fn small_game(dir: &Path) {
    write(
        dir,
        "main.lua",
        r#"
local counter = require("lib.counter")
local town = require("town")
local G = {}
local state
function G.init(players, seed) state = { c = counter.new(seed), town = town.new() } end
function G.step(inputs)
  for _, i in ipairs(inputs) do state.c:add(i) end
  state.town:grow(state.c.n)
end
function G.digest() return state.c.n * 1000 + state.town.size end
return G
"#,
    );
    write(
        dir,
        "lib/counter.lua",
        r#"
local M = {}
M.__index = M
function M.new(start) return setmetatable({ n = start }, M) end
function M:add(k) self.n = self.n + k end
return M
"#,
    );
    write(
        dir,
        "town/init.lua",
        r#"
local Town = {}
Town.__index = Town
function Town.new() return setmetatable({ size = 1 }, Town) end
function Town:grow(n) self.size = (self.size + n) % 997 end
return Town
"#,
    );
}

#[test]
fn require_loads_the_games_modules_from_its_folder_and_nothing_else() {
    let tmp = temp_dir("require");
    let dir = tmp.path();
    small_game(dir);
    write(
        dir,
        "lib/probe.lua",
        "return { name = ..., path = select(2, ...) }",
    );
    let vm = Vm::builder()
        .capacity(64 << 20)
        .deterministic(1)
        .module_folder(dir)
        .build()
        .unwrap();
    let r = vm
        .exec(
            r#"
            local probe, path = require("lib.probe")
            local again = require("lib.probe")
            local ok, err = pcall(require, "lpeg")          -- optional modules are probed so
            local ok2 = pcall(require, "..main")             -- no way out of the folder
            local ok3 = pcall(require, "os")
            return probe.name, probe.path, path, again == probe, ok, err, ok2, ok3,
                   package == nil, type(require("town").new)
            "#,
            "=check",
        )
        .unwrap();
    let s = |v: &Value| match v {
        Value::String(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    };
    assert_eq!(s(&r[0]), "lib.probe");
    assert_eq!(s(&r[1]), "lib/probe.lua");
    assert_eq!(s(&r[2]), "lib/probe.lua");
    assert_eq!(r[3], Value::Boolean(true), "loaded once");
    assert_eq!(r[4], Value::Boolean(false));
    let err = s(&r[5]);
    assert!(
        err.contains("module 'lpeg' not found") && err.contains("lpeg.lua"),
        "{err}"
    );
    assert_eq!(r[6], Value::Boolean(false));
    assert_eq!(r[7], Value::Boolean(false), "no system modules");
    assert_eq!(r[8], Value::Boolean(true), "still no package library");
    assert_eq!(s(&r[9]), "function");
    // The lookup require uses.
    let m = vm.module("town").unwrap().unwrap();
    assert_eq!(m.path, "town/init.lua");
    assert!(vm.module("nope").unwrap().is_none());
    // Errors name the module's chunk relative to the folder.
    write(dir, "lib/broken.lua", "local x = \n error('boom')");
    let e = vm
        .exec("require('lib.broken')", "=check")
        .unwrap_err()
        .to_string();
    assert!(e.contains("lib/broken.lua:2: boom"), "{e}");
}

#[test]
fn modules_given_by_name_and_source_are_what_require_finds() {
    let vm = Vm::builder()
        .capacity(64 << 20)
        .deterministic(1)
        .module(Module::new(
            "util.math",
            "return { twice = function(x) return 2 * x end }",
        ))
        .build()
        .unwrap();
    assert_eq!(
        vm.exec("return require('util.math').twice(21)", "=check")
            .unwrap(),
        vec![Value::Integer(42)]
    );
    let e = vm
        .exec("return require('util.math').nope()", "=check")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
    assert_eq!(
        vm.module("util.math").unwrap().unwrap().path,
        "util/math.lua"
    );
}

fn run_and_save(dir: &Path, frames: u64) -> (Vec<u8>, Option<i64>) {
    let cfg = GameConfig {
        base_address: None,
        capacity: 256 << 20,
        ..GameConfig::default_game(2, 5)
    }
    .game_at(dir)
    .unwrap();
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..frames {
        g.step(&[(f % 3) as u8, 1u8]).unwrap();
    }
    (g.save_game().unwrap(), g.game_digest().unwrap())
}

#[test]
fn a_save_made_in_one_folder_loads_when_the_game_runs_from_another() {
    let (from, to) = (temp_dir("from"), temp_dir("to"));
    let (a, b) = (from.path(), to.path());
    small_game(a);
    small_game(b);
    let (save, digest) = run_and_save(a, 7);
    // The main script given as a file this time, the folder elsewhere: the same chunk names.
    let cfg = GameConfig {
        base_address: None,
        capacity: 256 << 20,
        ..GameConfig::default_game(2, 5)
    }
    .game_at(&b.join("main.lua"))
    .unwrap();
    let mut g = Game::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
    assert_eq!(g.game_digest().unwrap(), digest);
    let report = g.load_report().unwrap();
    assert!(
        report.rebound.is_empty() && report.missing.is_empty(),
        "{}",
        report.summary()
    );
    g.step(&[1u8, 1u8]).unwrap();
}

#[test]
fn a_moved_module_of_version_2_runs_after_loading_a_version_1_save() {
    let (v1, v2) = (temp_dir("v1"), temp_dir("v2"));
    let (a, b) = (v1.path(), v2.path());
    small_game(a);
    small_game(b);
    // Version 2: the counter counts double, its lines moved.
    write(
        b,
        "lib/counter.lua",
        r#"
-- version 2
local M = {}
M.__index = M
function M.new(start) return setmetatable({ n = start }, M) end

-- counts double now
function M:add(k) self.n = self.n + 2 * k end
return M
"#,
    );
    let (save, digest) = run_and_save(a, 3);
    let cfg = GameConfig {
        base_address: None,
        capacity: 256 << 20,
        ..GameConfig::default_game(2, 5)
    }
    .game_at(b)
    .unwrap();
    let mut g = Game::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
    assert_eq!(g.game_digest().unwrap(), digest);
    let report = g.load_report().unwrap();
    assert!(
        report
            .rebound
            .iter()
            .any(|f| f.place == "M.add" && f.chunk == "lib/counter.lua"),
        "{}",
        report.summary()
    );
    let before = g.game_digest().unwrap().unwrap() / 1000;
    g.step(&[1u8, 1u8]).unwrap();
    assert_eq!(
        g.game_digest().unwrap().unwrap() / 1000,
        before + 4,
        "version 2's add runs"
    );
}

/// json_town (lua-bridge/games/json_town: json.lua, dkjson, serpent, inspect and middleclass
/// unchanged in lib/), run from its folder with `require`: its G.digest() after 100 frames
/// equals stock Lua 5.5.1's (`lua lua-bridge/games/stock_driver.lua lua-bridge/games/json_town
/// --players 2 --seed 7`), and every simulate mode ends in the reference state.
#[test]
fn json_town_from_its_folder_matches_stock_lua_and_every_mode() {
    use luasnap::bridge::runtime::scripted_input;
    use luasnap::bridge::simulate::{SimOptions, Simulation};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua-bridge/games/json_town");
    let cfg = GameConfig {
        base_address: None,
        capacity: 1 << 30,
        step_budget: Some(luasnap::bridge::runtime::DEFAULT_STEP_BUDGET),
        ..GameConfig::default_game(2, 7)
    }
    .game_at(&dir)
    .unwrap();
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..100 {
        g.step(&[scripted_input(7, f, 0), scripted_input(7, f, 1)])
            .unwrap();
    }
    assert_eq!(g.game_digest().unwrap(), Some(-1816277546944528331));
    drop(g);
    let mut sim = Simulation::new(SimOptions {
        game: cfg,
        frames: 40,
        delay: 3,
        start: None,
        start_trust: luasnap::bridge::persist::Trust::Foreign,
        saving: luasnap::bridge::runtime::Saving::EveryFrame,
    })
    .unwrap();
    let (reference, _) = sim.reference(false).unwrap();
    for b in Backend::ALL {
        let r = sim.run(b, &reference).unwrap();
        if !r.matches_reference {
            panic!("json_town, {}: {}", b.name(), sim.explain(b, 10).unwrap());
        }
        assert!(r.rollbacks > 0);
    }
}

#[test]
fn diff_saves_of_a_folder_game_reads_its_modules_without_running_it() {
    let tmp = temp_dir("diff");
    let dir = tmp.path();
    small_game(dir);
    // A file in the folder that is no module (it does not compile) is passed over.
    write(dir, "tools/broken.lua", "return +");
    let (a, _) = run_and_save(dir, 3);
    let (b, _) = run_and_save(dir, 9);
    let cfg = GameConfig::default_game(2, 5).game_at(dir).unwrap();
    // Foreign trust: the saves' functions (lib/counter.lua's, town/init.lua's) must find their
    // code in the reading VM, which compiled the folder's modules and ran none of them.
    use luasnap::bridge::persist::Trust;
    use luasnap::bridge::value_diff::diff_saves;
    let d = diff_saves(Some(&cfg), &a, &b, Trust::Foreign, 50).unwrap();
    assert!(!d.diff.equal);
    let listed: Vec<String> = d.diff.differences.iter().map(|x| x.to_string()).collect();
    assert!(
        listed.iter().any(|l| l.contains("luasnap_frame: 3 vs 9")),
        "{listed:?}"
    );
    let same = diff_saves(Some(&cfg), &a, &a, Trust::Foreign, 50).unwrap();
    assert!(same.diff.equal && same.diff.differences.is_empty());
    // Without the game: its functions are not this VM's code, and the error says whose.
    let e = diff_saves(None, &a, &b, Trust::Foreign, 50).unwrap_err();
    assert!(e.to_string().contains(".lua"), "{e}");
}

/// A game whose `ai` module is required only in `G.init`: a VM that ran the script's top
/// level has not compiled it, so a load finds its chunk by the name the save gives.
const LAZY_MAIN: &str = r#"
local G = {}
local state
function G.init(players, seed) state = { ai = require("ai").new(seed) } end
function G.step(inputs) state.ai:think(#inputs) end
function G.digest() return state.ai.n end
return G
"#;

const LAZY_AI: &str = r#"
local A = {}
A.__index = A
function A.new(s) return setmetatable({ n = s }, A) end
function A:think(k) self.n = self.n + k end
return A
"#;

fn lazy_cfg(at: &Path, modules: Vec<Module>) -> GameConfig {
    GameConfig {
        base_address: None,
        capacity: 256 << 20,
        modules,
        ..GameConfig::default_game(2, 5)
    }
    .game_at(at)
    .unwrap()
}

fn lazy_save(cfg: &GameConfig) -> (Vec<u8>, Option<i64>) {
    let mut g = Game::new(cfg, Backend::ArenaFull).unwrap();
    for _ in 0..3 {
        g.step(&[1u8, 1u8]).unwrap();
    }
    (g.save_game().unwrap(), g.game_digest().unwrap())
}

/// A save names the chunks of its functions, and a hostile one names any path: a chunk named
/// `../../outside.lua` or by an absolute path is not read even where that file exists and
/// holds the very module, and the load refuses the function as one this game does not have.
#[test]
fn a_save_naming_a_chunk_outside_the_games_folder_reads_nothing_there() {
    let root = temp_dir("escape");
    let game = root.path().join("x/y/game");
    write(&game, "main.lua", LAZY_MAIN);
    write(root.path(), "x/outside.lua", LAZY_AI);
    write(root.path(), "abs/outside.lua", LAZY_AI);
    let absolute = root.path().join("abs/outside.lua");
    for path in ["../../outside.lua", absolute.to_str().unwrap()] {
        // The saving game's module is named by that path (a forged save could say anything).
        let ai = Module {
            name: "ai".into(),
            path: path.into(),
            source: LAZY_AI.into(),
        };
        let (save, _) = lazy_save(&lazy_cfg(&game, vec![ai]));
        let err = Game::<u8>::from_save(&lazy_cfg(&game, Vec::new()), Backend::ArenaFull, &save)
            .err()
            .unwrap_or_else(|| panic!("a save naming {path} loaded"))
            .to_string();
        assert!(
            err.contains(path) && err.contains("not among the chunks this VM has loaded"),
            "{path}: {err}"
        );
    }
}

/// A symbolic link in the game's folder counts as what it points to, wherever that is, as
/// stock Lua's `require` follows it: a module folder linked from elsewhere (a library shared
/// by several games) is required, read with the folder ([`GameConfig::read_folder`], what
/// every command does) under the link's path, and a save of the game loads through it, lazily
/// or read once, as from a folder holding the files. A link to the folder itself is walked
/// once; a `.lua` link to nothing is an error naming it.
#[cfg(unix)]
#[test]
fn a_symbolic_link_in_the_games_folder_counts_as_what_it_points_to() {
    let root = temp_dir("link");
    let (real, linked) = (root.path().join("real"), root.path().join("linked"));
    let main = LAZY_MAIN.replace("require(\"ai\")", "require(\"lib.ai\")");
    for dir in [&real, &linked] {
        write(dir, "main.lua", &main);
    }
    write(&real, "lib/ai.lua", LAZY_AI);
    write(root.path(), "elsewhere/ai.lua", LAZY_AI);
    std::os::unix::fs::symlink(root.path().join("elsewhere"), linked.join("lib")).unwrap();
    std::os::unix::fs::symlink(".", linked.join("again")).unwrap();
    let (save, digest) = lazy_save(&lazy_cfg(&real, Vec::new()));
    let read = lazy_cfg(&linked, Vec::new()).read_folder().unwrap();
    let paths: Vec<String> = read
        .folder_files
        .as_deref()
        .unwrap()
        .files()
        .into_iter()
        .map(|m| m.path)
        .collect();
    assert_eq!(paths, ["lib/ai.lua", "main.lua"]);
    for cfg in [lazy_cfg(&linked, Vec::new()), read] {
        assert_eq!(
            lazy_save(&cfg).1,
            digest,
            "a game through the link runs alike"
        );
        let g = Game::<u8>::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
        assert_eq!(g.game_digest().unwrap(), digest);
    }
    std::os::unix::fs::symlink(root.path().join("gone.lua"), linked.join("old.lua")).unwrap();
    let err = lazy_cfg(&linked, Vec::new())
        .read_folder()
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("old.lua") && err.contains("gone.lua") && err.contains("symbolic link"),
        "{err}"
    );
}

/// A game given as one script in a folder full of other files (a downloads folder): a load
/// reads only the chunks the save names. 2,000 unrelated Lua files sorting before `ai.lua`
/// (more than a walk of the folder would read) and one that does not compile change
/// nothing.
#[test]
fn a_single_script_game_in_a_crowded_folder_loads_reading_only_its_modules() {
    let dir = temp_dir("crowded");
    let d = dir.path();
    write(d, "game.lua", LAZY_MAIN);
    write(d, "ai.lua", LAZY_AI);
    write(d, "broken.lua", "this is not Lua (");
    for i in 0..2000 {
        std::fs::write(d.join(format!("a{i:04}.lua")), "return 1").unwrap();
    }
    let cfg = lazy_cfg(&d.join("game.lua"), Vec::new());
    let (save, digest) = lazy_save(&cfg);
    let mut g = Game::<u8>::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
    assert_eq!(g.game_digest().unwrap(), digest);
    let report = g.load_report().unwrap();
    assert!(
        report.rebound.is_empty() && report.missing.is_empty(),
        "{}",
        report.summary()
    );
    g.step(&[1u8, 1u8]).unwrap();
    assert_eq!(g.game_digest().unwrap(), digest.map(|n| n + 2));
}

/// A game's folder read lazily for the run ([`GameConfig::read_folder_lazily`]): a single
/// script among thousands of Lua files reads the module it requires, and nothing else of the
/// folder, in every game built from the configuration; a module edited on disk after the
/// first game read it changes nothing in later games or loads, and a file looked for and
/// missing stays missing.
#[test]
fn a_game_read_lazily_reads_what_it_requires_once_for_the_run() {
    let dir = temp_dir("lazily");
    let d = dir.path();
    write(d, "game.lua", LAZY_MAIN);
    write(d, "ai.lua", LAZY_AI);
    write(d, "broken.lua", "this is not Lua (");
    for i in 0..3000 {
        std::fs::write(d.join(format!("a{i:04}.lua")), "return 1").unwrap();
    }
    let cfg = lazy_cfg(&d.join("game.lua"), Vec::new()).read_folder_lazily();
    let files = cfg.folder_files.clone().unwrap();
    let read = || -> Vec<String> { files.files().into_iter().map(|m| m.path).collect() };
    assert!(read().is_empty(), "nothing read before a game runs");
    let (save, digest) = lazy_save(&cfg);
    assert_eq!(read(), ["ai.lua"], "only the module the game required");
    write(
        d,
        "ai.lua",
        &LAZY_AI.replace("self.n + k", "self.n + 1000 * k"),
    );
    assert_eq!(
        lazy_save(&cfg).1,
        digest,
        "a later game runs the module as read"
    );
    let mut g = Game::<u8>::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
    g.step(&[1u8, 1u8]).unwrap();
    assert_eq!(g.game_digest().unwrap(), digest.map(|n| n + 2));
    assert_eq!(read(), ["ai.lua"]);
    assert_eq!(files.file("later.lua").unwrap(), None);
    write(d, "later.lua", "return 1");
    assert_eq!(
        files.file("later.lua").unwrap(),
        None,
        "missing stays missing"
    );
    // A configuration read afresh runs the edit.
    let fresh = lazy_cfg(&d.join("game.lua"), Vec::new()).read_folder_lazily();
    assert_ne!(lazy_save(&fresh).1, digest);
}

/// A game's folder read once ([`GameConfig::read_folder`]): a module edited on disk since,
/// before the game first requires it (in `G.init`) or while it runs, changes nothing, in a
/// new game and in one loaded from a save; the same config read afresh runs the edit.
#[test]
fn a_game_read_once_runs_the_files_it_read_whatever_the_folder_becomes() {
    let dir = temp_dir("read-once");
    let d = dir.path();
    write(d, "main.lua", LAZY_MAIN);
    write(d, "ai.lua", LAZY_AI);
    let read = lazy_cfg(d, Vec::new()).read_folder().unwrap();
    let (save, digest) = lazy_save(&read);
    write(
        d,
        "ai.lua",
        &LAZY_AI.replace("self.n + k", "self.n + 1000 * k"),
    );
    let (_, again) = lazy_save(&read);
    assert_eq!(again, digest, "a new game runs the module as read");
    let mut g = Game::<u8>::from_save(&read, Backend::ArenaFull, &save).unwrap();
    g.step(&[1u8, 1u8]).unwrap();
    assert_eq!(g.game_digest().unwrap(), digest.map(|n| n + 2));
    // The folder as it is now: the edit runs.
    let (_, edited) = lazy_save(&lazy_cfg(d, Vec::new()));
    assert_eq!(edited, digest.map(|n| n + 3 * 2 * 999));
    // A module not among the files read is not found, though it is in the folder now.
    write(d, "extra.lua", "return 1");
    let mut probe = read.clone();
    probe.script = LAZY_MAIN.replace("require(\"ai\")", "require(\"extra\") and require(\"ai\")");
    let err = Game::<u8>::new(&probe, Backend::ArenaFull)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("extra"), "{err}");
}
