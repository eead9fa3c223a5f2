//! An outside tester's findings about updates (`/work/coord/stranger/findings.md` 1, 3, 4):
//! unnamed functions found by their code when an update adds one above them, functions
//! declared removed with nothing replacing them, and what an own-trust load does with a
//! function a suspended coroutine runs whose code changed. See `docs/updates.md`.

mod common;

use common::main_lua as config;
use luasnap::bridge::persist::{FunctionBinding, LoadOptions, LoadReport, Trust};
use luasnap::bridge::runtime::{Backend, Game};

fn own() -> LoadOptions {
    LoadOptions {
        functions: FunctionBinding::Current,
        finalizers: true,
        ..LoadOptions::new(Trust::Own)
    }
}

/// Runs `script` for `frames` frames and returns its save.
fn saved(script: &str, frames: usize) -> Vec<u8> {
    let mut g = Game::<u8>::new(&config(script), Backend::ArenaFull).unwrap();
    for _ in 0..frames {
        g.step(&[0, 0]).unwrap();
    }
    g.save_game().unwrap()
}

/// Loads `save` into `script` (foreign trust unless `opts`), plays a frame; the digest and the
/// load's report.
fn continued(script: &str, save: &[u8], opts: Option<&LoadOptions>) -> (Option<i64>, LoadReport) {
    let mut g: Game = match opts {
        Some(o) => Game::from_save_with(&config(script), Backend::ArenaFull, save, o),
        None => Game::from_save(&config(script), Backend::ArenaFull, save),
    }
    .unwrap_or_else(|e| panic!("load: {e}"));
    let report = g.load_report().cloned().unwrap();
    g.step(&[0, 0]).unwrap();
    let d = g.game_digest().unwrap();
    (d, report)
}

/// Version 1 keeps an unnamed callback in its state.
const HANDLER_V1: &str = "local G = {} local state
function G.init(players, seed)
  state = { t = 0, hs = {} }
  table.insert(state.hs, function(x) return x + 1 end)
end
function G.step(inputs) state.t = state.hs[#state.hs](state.t) end
function G.digest() return state.t end
return G";

const V1_LINE: &str = "  table.insert(state.hs, function(x) return x + 1 end)";

/// Version 2 adds another unnamed callback *above* it: the saved `x + 1` closure's place
/// `G.init > (function #1)` is now the new `x * 1000`; this version still has the saved code,
/// moved, as `(function #2)`, and the load finds it there by its code.
#[test]
fn a_saved_unnamed_callback_keeps_its_code_when_an_update_adds_one_above_it() {
    let v2 = HANDLER_V1.replace(
        V1_LINE,
        "  table.insert(state.hs, function(x) return x * 1000 end)\n  table.insert(state.hs, function(x) return x + 1 end)",
    );
    let save = saved(HANDLER_V1, 5);
    for opts in [None, Some(&own())] {
        let (d, report) = continued(&v2, &save, opts);
        assert_eq!(
            d,
            Some(6),
            "the saved `x + 1` handler ran other code; report: {}",
            report.summary()
        );
        assert_eq!(report.relocated.len(), 1, "{}", report.summary());
        assert_eq!(report.relocated[0].saved.place, "G.init > (function #1)");
        assert_eq!(report.relocated[0].to, "G.init > (function #2)");
        assert!(report.unnamed_rebound.is_empty(), "{}", report.summary());
        let summary = report.summary();
        assert!(
            summary.contains("1 unnamed found by their code at another rank (G.init > (function #1) at G.init > (function #2) (main.lua:5))"),
            "{summary}"
        );
    }
}

/// A function nested in an unnamed one found at another rank is looked up under it: the
/// save holds the outer callback (first, in the list's array part) and a closure it made.
#[test]
fn a_function_nested_in_an_unnamed_callback_is_found_under_its_new_rank() {
    let v1 = "local G = {} local state
function G.init(players, seed)
  state = { t = 0, hs = {} }
  table.insert(state.hs, function(x) return function() return x + 1 end end)
  state.hs[2] = state.hs[1](1)
end
function G.step(inputs) state.t = state.t + state.hs[2]() end
function G.digest() return state.t end
return G";
    let v2 = v1.replace(
        "  table.insert(state.hs, function(x) return function() return x + 1 end end)",
        "  local others = { function(x) return function() return x * 1000 end end }\n  table.insert(state.hs, function(x) return function() return x + 1 end end)",
    );
    let save = saved(v1, 5);
    let (d, report) = continued(&v2, &save, None);
    assert_eq!(d, Some(12), "{}", report.summary());
    assert_eq!(report.relocated.len(), 1, "{}", report.summary());
    assert!(report.unnamed_rebound.is_empty(), "{}", report.summary());
    assert!(
        report
            .moved
            .iter()
            .any(|f| f.place == "G.init > (function #1) > (function #1)"),
        "{}",
        report.summary()
    );
}

/// Two unnamed functions of this version both have the saved code (moved): which one the saved
/// closure is cannot be told, and it is bound by its rank, as before, to the function now at
/// its place, with other code; the report says so.
#[test]
fn an_unnamed_callback_whose_code_is_there_twice_is_bound_by_rank_and_reported() {
    let v2 = HANDLER_V1.replace(
        V1_LINE,
        "  table.insert(state.hs, function(x) return x * 1000 end)\n  table.insert(state.hs, function(x) return x + 1 end)\n  table.insert(state.hs, function(x) return x + 1 end)",
    );
    let save = saved(HANDLER_V1, 5);
    let (d, report) = continued(&v2, &save, None);
    assert_eq!(
        d,
        Some(5000),
        "bound by rank to `x * 1000`; {}",
        report.summary()
    );
    assert!(report.relocated.is_empty(), "{}", report.summary());
    assert_eq!(report.unnamed_rebound.len(), 1, "{}", report.summary());
    assert_eq!(report.unnamed_rebound[0].place, "G.init > (function #1)");
    assert!(
        report.summary().contains("1 of them unnamed, bound by their rank to a function with other code: check it is the same callback, or name it (G.init > (function #1) (main.lua:4))"),
        "{}",
        report.summary()
    );
}

/// An unnamed callback whose code changed, and this version has it nowhere: bound by rank
/// (the update changed that callback), reported as such.
#[test]
fn an_unnamed_callback_whose_code_changed_is_bound_by_rank_and_reported() {
    let v2 = HANDLER_V1.replace("x + 1", "x + 2");
    let save = saved(HANDLER_V1, 5);
    let (d, report) = continued(&v2, &save, None);
    assert_eq!(d, Some(7), "{}", report.summary());
    assert_eq!(report.unnamed_rebound.len(), 1, "{}", report.summary());
    assert!(report.relocated.is_empty());
    // Unchanged code at its rank is no guess: nothing reported.
    let (d, report) = continued(HANDLER_V1, &save, None);
    assert_eq!(d, Some(6));
    assert!(report.unnamed_rebound.is_empty() && report.relocated.is_empty());
}

/// Version 2 removed the callback at the saved rank and has the saved code at another: v1
/// had two unnamed callbacks, v2 dropped the first, so the saved second's rank (#2) is no
/// function now; it is found at #1 by its code, under foreign trust too.
#[test]
fn an_unnamed_callback_whose_rank_is_gone_is_found_by_its_code() {
    let v1 = HANDLER_V1.replace(
        V1_LINE,
        "  table.insert(state.hs, function(x) return x * 1000 end)\n  table.insert(state.hs, function(x) return x + 1 end)",
    );
    let v2 = HANDLER_V1.replace(
        V1_LINE,
        "  local unused = 0\n  table.insert(state.hs, function(x) return x + 1 end)",
    );
    let save = saved(&v1, 5);
    let (d, report) = continued(&v2, &save, None);
    assert_eq!(d, Some(6), "{}", report.summary());
    assert!(
        report
            .relocated
            .iter()
            .any(|r| r.saved.place == "G.init > (function #2)" && r.to == "G.init > (function #1)"),
        "{}",
        report.summary()
    );
}

/// Version 1 of a game with a module-like table holding a function the state references.
const LOG_V1: &str = "local G = {} local state
local Log = {}
function Log.label(x) return 'label ' .. x end
function Log.count(x) return x + 1 end
function G.init(players, seed) state = { t = 0, log = Log, f = Log.label } end
function G.step(inputs) state.t = Log.count(state.t) end
function G.digest() return state.t end
function G.call_label() return state.f(1) end
return G";

/// `Log.label` removed, declared gone (`true`): the save holding it loads (foreign and own
/// trust) and plays; a call of the saved reference raises an error naming it.
#[test]
fn a_function_declared_removed_with_nothing_replacing_it_is_a_stand_in_that_raises() {
    let v2 = LOG_V1
        .replace("function Log.label(x) return 'label ' .. x end\n", "")
        .replace(
            "function G.call_label() return state.f(1) end\nreturn G",
            "function G.call_label() return state.f(1) end\nG.removed = { [\"Log.label\"] = true }\nreturn G",
        );
    assert!(v2.contains("= true"));
    let save = saved(LOG_V1, 3);
    for opts in [None, Some(&own())] {
        let mut g: Game = match opts {
            Some(o) => Game::from_save_with(&config(&v2), Backend::ArenaFull, &save, o),
            None => Game::from_save(&config(&v2), Backend::ArenaFull, &save),
        }
        .unwrap_or_else(|e| panic!("load: {e}"));
        let report = g.load_report().cloned().unwrap();
        assert_eq!(report.removed.len(), 1, "{}", report.summary());
        assert_eq!(report.removed[0].place, "Log.label");
        assert!(
            report.summary().contains("1 removed as the game declares, nothing replacing them: a call raises an error (Log.label (main.lua:3))"),
            "{}",
            report.summary()
        );
        g.step(&[0, 0]).unwrap();
        assert_eq!(g.game_digest().unwrap(), Some(4));
        let e = g
            .vm()
            .exec("return luasnap_game.call_label()", "=test")
            .expect_err("a call of the removed function must fail");
        let e = e.to_string();
        assert!(
            e.contains("Log.label (main.lua:3) was removed from this version of the game (G.removed[\"Log.label\"] = true)"),
            "{e}"
        );
    }
}

/// The declaration is checked as the game starts: `true` is accepted, any other value but a
/// string or false is refused naming the three choices, a method written with ':' too.
#[test]
fn a_removal_with_nothing_replacing_it_is_checked_as_the_game_starts() {
    let with = |decl: &str| LOG_V1.replace("return G", &format!("{decl}\nreturn G"));
    Game::<u8>::new(
        &config(&with("G.removed = { [\"Old.f\"] = true }")),
        Backend::ArenaFull,
    )
    .expect("a removal declared with true starts");
    let e = Game::<u8>::new(
        &config(&with("G.removed = { [\"Old.f\"] = 1 }")),
        Backend::ArenaFull,
    )
    .map(|_| ())
    .expect_err("a number is refused")
    .to_string();
    assert!(
        e.contains("true (nothing replaces it: calls raise an error)"),
        "{e}"
    );
    let e = Game::<u8>::new(
        &config(&with("G.removed = { [\"Old:f\"] = true }")),
        Backend::ArenaFull,
    )
    .map(|_| ())
    .expect_err("a method with ':' is refused")
    .to_string();
    assert!(
        e.contains("G.removed[\"Old:f\"] = true") && e.contains("':'"),
        "{e}"
    );
}

/// Version 1: every frame starts one more AI coroutine running `wander`; each yields 1.
const AI_V1: &str = "local G = {} local state
local function wander()
  while true do coroutine.yield(1) end
end
function G.init(players, seed) state = { cos = {}, last = {} } end
function G.step(inputs)
  state.cos[#state.cos + 1] = coroutine.create(wander)
  for i, co in ipairs(state.cos) do local _, v = coroutine.resume(co) state.last[i] = v end
end
function G.digest()
  local twos = 0
  for _, v in ipairs(state.last) do if v == 2 then twos = twos + 1 end end
  return twos
end
return G";

/// docs/updates.md: under own trust, a function whose code changed and a suspended coroutine
/// runs keeps its saved code as a closure: the module local holds that closure, so a
/// coroutine the game starts after the load runs the saved code too, and the report says so.
/// (The stranger's test expected this version's code for new coroutines; that is not what
/// luasnap does, and the docs now say what it does.)
#[test]
fn coroutines_started_after_an_own_load_from_a_kept_function_run_its_saved_code() {
    let v2 = AI_V1.replace("coroutine.yield(1)", "coroutine.yield(2)");
    let save = saved(AI_V1, 3);
    let (d, report) = continued(&v2, &save, Some(&own()));
    // 3 suspended coroutines and 1 started after the load: all run the saved `yield(1)`.
    assert_eq!(d, Some(0), "{}", report.summary());
    assert!(
        report.kept.iter().any(|f| f.place == "wander"),
        "{}",
        report.summary()
    );
    assert!(
        report.summary().contains("1 kept with their saved code, which every later call through them runs too, coroutines started from them later included (wander (main.lua:2))"),
        "{}",
        report.summary()
    );
    // Foreign trust refuses the save, naming the function.
    let e = Game::<u8>::from_save(&config(&v2), Backend::ArenaFull, &save)
        .map(|_| ())
        .expect_err("a coroutine suspended in changed code is refused under foreign trust")
        .to_string();
    assert!(e.contains("wander"), "{e}");
}

/// The way docs/updates.md gives for an update to reach a continued game: the suspended
/// function stays as it was, the new code has a new name, and a migration re-creates the
/// coroutines with it. Every coroutine then runs this version's code, under foreign trust too.
#[test]
fn a_migration_that_restarts_the_coroutines_with_new_code_reaches_a_continued_game() {
    let v2 = AI_V1
        .replace(
            "function G.init(players, seed) state = { cos = {}, last = {} } end",
            "local function wander_v2()\n  while true do coroutine.yield(2) end\nend\nfunction G.init(players, seed) state = { cos = {}, last = {}, version = 2 } end",
        )
        .replace(
            "  state.cos[#state.cos + 1] = coroutine.create(wander)",
            "  if state.version ~= 2 then\n    for i = 1, #state.cos do state.cos[i] = coroutine.create(wander_v2) end\n    state.version = 2\n  end\n  state.cos[#state.cos + 1] = coroutine.create(wander_v2)",
        );
    let save = saved(AI_V1, 3);
    for opts in [None, Some(&own())] {
        let (d, report) = continued(&v2, &save, opts);
        assert_eq!(d, Some(4), "{}", report.summary());
        assert!(report.kept.is_empty(), "{}", report.summary());
    }
}
