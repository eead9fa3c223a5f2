//! Every call into a game runs under the step budget, not only `G.step`: an endless loop at
//! the script's top level (or a module's it requires there), in `G.init` or in `G.digest()`
//! ends every command with an error naming the call and `--step-budget`, instead of a silent
//! hang (the outside tester's finding 2); so does one in a save's `__persist` function or in
//! a metamethod the runtime's reads of `G` and of its globals run. The tests end by the
//! budget, not by a clock.

mod support;

use luasnap::bridge::runtime::{Backend, Game, GameCall, GameConfig, GameError};
use support::{output, spawn, stderr, temp_dir};

fn config(script: &str) -> GameConfig {
    GameConfig {
        script: script.into(),
        chunk_name: "@main.lua".into(),
        base_address: None,
        capacity: 256 << 20,
        step_budget: Some(1_000_000),
        ..GameConfig::default_game(2, 3)
    }
}

#[test]
fn an_endless_loop_in_g_init_is_stopped_with_an_error() {
    let script = "local G = {}
        function G.init(players, seed) while true do end end
        function G.step(inputs) end
        return G";
    let e = Game::<u8>::new(&config(script), Backend::ArenaFull).expect_err("an endless G.init");
    assert!(
        matches!(
            &e,
            GameError::CallBudget {
                call: GameCall::Init,
                budget: 1_000_000,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("G.init"), "{e}");
    assert!(e.to_string().contains("--step-budget"), "{e}");
}

#[test]
fn an_endless_loop_in_g_digest_is_stopped_with_an_error() {
    let script = "local G = {} local n = 0
        function G.init(players, seed) n = 0 end
        function G.step(inputs) n = n + 1 end
        function G.digest() while true do end end
        return G";
    let mut g = Game::<u8>::new(&config(script), Backend::ArenaFull).unwrap();
    g.step(&[0, 0]).unwrap();
    let e = g.game_digest().expect_err("an endless G.digest");
    assert!(
        matches!(
            &e,
            GameError::CallBudget {
                call: GameCall::Digest(1),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("G.digest() at frame 1"), "{e}");
}

#[test]
fn an_endless_loop_at_the_top_level_is_stopped_with_an_error() {
    let e = Game::<u8>::new(&config("while true do end"), Backend::ArenaFull)
        .expect_err("an endless top level");
    assert!(
        matches!(&e, GameError::CallBudget { call: GameCall::TopLevel(s), .. } if s == "main.lua"),
        "{e:?}"
    );
}

#[test]
fn without_a_budget_the_calls_run_unbounded_as_before() {
    // A top level and an init that take more than a budget of 1000 instructions, with none.
    let script = "local n = 0 for i = 1, 10000 do n = n + i end
        local G = {}
        function G.init() for i = 1, 10000 do n = n - i end end
        function G.step(inputs) end
        function G.digest() local s = 0 for i = 1, 10000 do s = s + i end return s + n end
        return G";
    let mut cfg = config(script);
    cfg.step_budget = Some(1000);
    assert!(Game::<u8>::new(&cfg, Backend::ArenaFull).is_err());
    cfg.step_budget = None;
    let g = Game::<u8>::new(&cfg, Backend::ArenaFull).unwrap();
    assert_eq!(g.game_digest().unwrap(), Some(50_005_000));
}

/// A loop that runs well past the budget of [`config`] (1 million instructions) and then
/// ends: without a budget the call finishes, so a test of a call the budget does not cover
/// fails instead of hanging.
const LONG_LOOP: &str = "for _ = 1, 20000000 do end";

#[test]
fn a_long_persist_function_is_stopped_when_the_game_saves() {
    let script = format!(
        "local G = {{}}
        function G.init() kept = setmetatable({{}}, {{ __persist = function()
          {LONG_LOOP} return function() return {{}} end end }}) end
        function G.step(inputs) end
        return G"
    );
    for backend in [Backend::ArenaFull, Backend::Serialize] {
        let mut g = Game::<u8>::new(&config(&script), backend).unwrap();
        g.step(&[0, 0]).unwrap();
        let e = match backend {
            Backend::Serialize => g.save().map(|_| ()),
            _ => g.save_game().map(|_| ()),
        }
        .expect_err("a __persist function over the budget");
        assert!(
            matches!(
                &e,
                GameError::CallBudget {
                    call: GameCall::Save(1),
                    budget: 1_000_000,
                    ..
                }
            ),
            "{backend:?}: {e:?}"
        );
        assert!(e.to_string().contains("__persist"), "{e}");
        assert!(e.to_string().contains("--step-budget"), "{e}");
    }
}

/// A game whose `G` has an `__index` metamethod that loops long when the runtime reads `G[key]`
/// (absent from `G`, so the metamethod runs).
fn g_with_long_index(key: &str) -> String {
    format!(
        "local G = setmetatable({{}}, {{ __index = function(_, k)
          if k == '{key}' then {LONG_LOOP} end end }})
        function G.init() end
        function G.step(inputs) end
        return G"
    )
}

/// The access a [`GameError::CallBudget`] names, if it names one.
fn access_of(e: &GameError) -> Option<&str> {
    match e {
        GameError::CallBudget {
            call: GameCall::Access(what),
            ..
        } => Some(what),
        _ => None,
    }
}

#[test]
fn metamethods_of_g_the_runtime_reads_through_are_stopped() {
    for key in ["collect_every", "renamed", "removed", "digest"] {
        let e = Game::<u8>::new(&config(&g_with_long_index(key)), Backend::ArenaFull)
            .err()
            .unwrap_or_else(|| panic!("G.{key}'s __index over the budget must be stopped"));
        let what = access_of(&e).unwrap_or_else(|| panic!("G.{key}: {e:?}"));
        assert!(what.contains(&format!("G.{key}")), "G.{key}: {e}");
        assert!(e.to_string().contains("--step-budget"), "{e}");
    }
    // `G.permanents` is read when a game continues from a save.
    let cfg = config(&g_with_long_index("permanents"));
    let save = Game::<u8>::new(&cfg, Backend::ArenaFull)
        .unwrap()
        .save_game()
        .unwrap();
    let e = Game::<u8>::from_save(&cfg, Backend::ArenaFull, &save)
        .expect_err("G.permanents's __index over the budget must be stopped");
    assert_eq!(access_of(&e), Some("G.permanents"), "{e:?}");
}

#[test]
fn a_newindex_metamethod_of_the_globals_the_runtime_sets_is_stopped() {
    let script = format!(
        "setmetatable(_G, {{ __newindex = function(t, k, v)
          if k == 'luasnap_players' then {LONG_LOOP} end rawset(t, k, v) end }})
        local G = {{}} function G.init() end function G.step(inputs) end return G"
    );
    let e = Game::<u8>::new(&config(&script), Backend::ArenaFull)
        .expect_err("_G's __newindex over the budget must be stopped");
    assert_eq!(access_of(&e), Some("the global luasnap_players"), "{e:?}");
}

/// A game folder whose main script requires `looping`, whose top level never ends.
fn looping_module_game() -> tempfile::TempDir {
    let dir = temp_dir("hang-module");
    std::fs::write(
        dir.path().join("main.lua"),
        "local l = require 'looping'
         local G = {} function G.init() end function G.step(i) end return G",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("looping.lua"),
        "while true do end return {}",
    )
    .unwrap();
    dir
}

#[test]
fn simulate_stops_a_module_whose_top_level_never_ends_and_names_it() {
    let dir = looping_module_game();
    let game = dir.path().to_str().unwrap();
    let out = output(&[
        "simulate",
        game,
        "--frames",
        "5",
        "--step-budget",
        "1000000",
        "--second-process",
        "off",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("the top level of main.lua"), "{err}");
    assert!(err.contains("looping.lua:1"), "{err}");
    assert!(err.contains("--step-budget"), "{err}");
}

#[test]
fn p2p_stops_an_endless_g_init_with_an_error() {
    let dir = temp_dir("hang-p2p");
    let main = dir.path().join("main.lua");
    std::fs::write(
        &main,
        "local G = {} function G.init() while true do end end function G.step(i) end return G",
    )
    .unwrap();
    let out = output(&[
        "p2p",
        main.to_str().unwrap(),
        "--frames",
        "5",
        "--step-budget",
        "1000000",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("G.init(players, seed) did not finish"),
        "{err}"
    );
    assert!(err.contains("--step-budget"), "{err}");
}

#[test]
fn serve_stops_an_endless_g_digest_with_an_error() {
    let dir = temp_dir("hang-serve");
    let main = dir.path().join("main.lua");
    std::fs::write(
        &main,
        "local G = {} function G.init() end function G.step(i) end
         function G.digest() while true do end end return G",
    )
    .unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let game = main.to_str().unwrap();
    let server = spawn(&[
        "serve",
        game,
        "--bind",
        "127.0.0.1",
        "--port",
        &port,
        "--players",
        "1",
        "--frames",
        "60",
        "--step-budget",
        "1000000",
    ]);
    let client = output(&[
        "client",
        game,
        "--connect",
        &format!("127.0.0.1:{port}"),
        "--step-budget",
        "1000000",
    ]);
    let server = server.wait_with_output().unwrap();
    for (who, out) in [("server", &server), ("client", &client)] {
        let err = stderr(out);
        assert!(!out.status.success(), "{who}: {err}");
        assert!(err.contains("G.digest() at frame"), "{who}: {err}");
    }
}

/// `simulate` refuses a digest that sorts the state in place: checked at its first call too,
/// which sorts the list (later calls find it sorted and change nothing).
#[test]
fn simulate_refuses_a_digest_that_sorts_the_state_in_place() {
    use luasnap::bridge::persist::Trust;
    use luasnap::bridge::runtime::simulate::{SimOptions, Simulation};
    let script = "local G = {} local t, ents = 0, {}
        function G.init(players, seed) t = 0 for i = 1, 5 do ents[i] = { id = i } end end
        function G.step(inputs) t = t + 1 end
        function G.digest()
          table.sort(ents, function(a, b) return a.id > b.id end)
          return t * 100 + ents[1].id
        end
        return G";
    let r = Simulation::new(SimOptions {
        game: config(script),
        frames: 20,
        delay: 0,
        start: None,
        start_trust: Trust::Foreign,
        saving: luasnap::bridge::runtime::Saving::EveryFrame,
    })
    .and_then(|mut sim| sim.reference(false).map(|_| ()));
    let e = r.expect_err("a digest that sorts the game's list in place must be refused");
    assert!(
        matches!(e, GameError::DigestChangesState { frame: 0 }),
        "{e}"
    );
}
