//! The client runtime and `luasnap simulate`: every backend ends in the reference state, save
//! and load continue a run exactly, and bad games and options get clear messages.

use luasnap::bridge::runtime::{
    scripted_input, Backend, Game, GameConfig, GameError, PredictiveClient,
};
use luasnap::bridge::simulate::{SimOptions, Simulation};

const TINY: &str = include_str!("lua/tiny_game.lua");

fn tiny(players: usize, seed: u64) -> GameConfig {
    GameConfig {
        script: TINY.into(),
        chunk_name: "=tiny".into(),
        players,
        seed,
        base_address: None,
        window: 10,
        capacity: 256 << 20,
        setup: Default::default(),
        step_budget: Some(luasnap::bridge::runtime::DEFAULT_STEP_BUDGET),
        ..GameConfig::default_game(players, seed)
    }
}

#[test]
fn every_backend_ends_in_the_reference_state() {
    for (players, delay) in [(2usize, 3u64), (4, 7), (1, 0)] {
        let opts = SimOptions {
            game: tiny(players, 5),
            frames: 200,
            delay,
            start: None,
            start_trust: luasnap::bridge::persist::Trust::Foreign,
            saving: luasnap::bridge::runtime::Saving::EveryFrame,
        };
        let mut sim = Simulation::new(opts).unwrap();
        let (reference, _) = sim.reference(false).unwrap();
        for b in Backend::ALL {
            let r = sim.run(b, &reference).unwrap();
            assert!(r.matches_reference, "{b:?} players {players} delay {delay}");
            if players > 1 && delay > 0 {
                assert!(
                    r.rollbacks > 0,
                    "remote inputs change, so predictions must fail sometimes"
                );
                assert!(r.resimulated >= r.rollbacks);
            } else {
                assert_eq!(r.rollbacks, 0);
            }
            // Every step is timed with its frame (re-simulated ones too), and each rollback
            // knows which steps re-simulated its frames.
            assert_eq!(r.step_times().len() as u64, 200 + r.resimulated, "{b:?}");
            assert_eq!(r.resimulated_steps().len() as u64, r.rollbacks);
            let resimulated: usize = r.resimulated_steps().iter().sum();
            assert_eq!(resimulated as u64, r.resimulated);
            assert_eq!(
                r.rollbacks_with_tracking_us(&reference).len() as u64,
                r.rollbacks
            );
            assert_eq!(reference.step_times.len(), 200);
            if b != Backend::Serialize {
                assert_eq!(
                    r.final_digest, reference.arena_digest,
                    "arena runs end byte-identical"
                );
            }
        }
    }
}

#[test]
fn the_embedded_game_rolls_back_exactly_on_every_backend() {
    let mut game = GameConfig::default_game(2, 3);
    game.base_address = None;
    let opts = SimOptions {
        game,
        frames: 40,
        delay: 2,
        start: None,
        start_trust: luasnap::bridge::persist::Trust::Foreign,
        saving: luasnap::bridge::runtime::Saving::EveryFrame,
    };
    let mut sim = Simulation::new(opts).unwrap();
    let (reference, _) = sim.reference(false).unwrap();
    assert!(
        reference.heap_bytes > 8 << 20,
        "the default game is about 10 MB: {}",
        reference.heap_bytes
    );
    for b in Backend::ALL {
        let r = sim.run(b, &reference).unwrap();
        assert!(r.matches_reference, "{b:?}");
        assert!(r.rollbacks > 0);
    }
}

#[test]
fn save_then_load_continues_exactly() {
    // 30 frames, save, load into a fresh VM, 30 more == 60 straight.
    let straight = {
        let mut sim = Simulation::new(SimOptions {
            game: tiny(2, 9),
            frames: 60,
            delay: 0,
            start: None,
            start_trust: luasnap::bridge::persist::Trust::Foreign,
            saving: luasnap::bridge::runtime::Saving::EveryFrame,
        })
        .unwrap();
        sim.reference(false).unwrap().0
    };
    let (first, save) = {
        let mut sim = Simulation::new(SimOptions {
            game: tiny(2, 9),
            frames: 30,
            delay: 0,
            start: None,
            start_trust: luasnap::bridge::persist::Trust::Foreign,
            saving: luasnap::bridge::runtime::Saving::EveryFrame,
        })
        .unwrap();
        sim.reference(true).unwrap()
    };
    assert_eq!(first.end_frame, 30);
    let mut sim = Simulation::new(SimOptions {
        game: tiny(2, 9),
        frames: 30,
        delay: 3,
        start: save,
        start_trust: luasnap::bridge::persist::Trust::Foreign,
        saving: luasnap::bridge::runtime::Saving::EveryFrame,
    })
    .unwrap();
    let (second, _) = sim.reference(false).unwrap();
    assert_eq!((second.start_frame, second.end_frame), (30, 60));
    assert_eq!(second.value_digest, straight.value_digest);
    // And a run with rollbacks from the loaded state ends there too.
    let r = sim.run(Backend::ArenaIncremental, &second).unwrap();
    assert!(r.matches_reference);
}

#[test]
fn the_predictive_client_ends_where_lockstep_does() {
    for backend in Backend::ALL {
        let cfg = tiny(2, 4);
        let mut lock = Game::new(&cfg, Backend::ArenaFull).unwrap();
        let client_game = Game::new(&cfg, backend).unwrap();
        let mut client = PredictiveClient::new(client_game).unwrap();
        let truth = |f: u64| (0..2).map(|p| scripted_input(4, f, p)).collect::<Vec<u8>>();
        // Predict 4 frames ahead (remote input repeated), then confirm one frame at a time.
        let guess = |f: u64, known: u64| vec![scripted_input(4, f, 0), scripted_input(4, known, 1)];
        for f in 0..4 {
            client.predict(guess(f, 0)).unwrap();
        }
        for f in 0..100u64 {
            lock.step(&truth(f)).unwrap();
            client.confirm(&truth(f), |g| guess(g, f)).unwrap();
            client.predict(guess(f + 4, f)).unwrap();
        }
        assert_eq!(client.pending(), 4);
        assert!(client.rollbacks > 0);
        // Drop the predictions: go back to the synchronous form by confirming nothing more;
        // compare the confirmed state through a fresh lockstep with the same frames.
        let mut sync_check = Game::new(&cfg, Backend::ArenaFull).unwrap();
        for f in 0..100u64 {
            sync_check.step(&truth(f)).unwrap();
        }
        assert_eq!(
            sync_check.value_digest().unwrap(),
            lock.value_digest().unwrap()
        );
        let _ = client.game_mut().value_digest().unwrap();
    }
}

/// An error and its `source()` chain as a report prints them (anyhow's `{:#}`, `Report`).
#[test]
fn a_wrong_repredicted_frame_is_refused_and_the_predictions_kept() {
    let cfg = tiny(2, 4);
    let mut client = PredictiveClient::new(Game::new(&cfg, Backend::ArenaFull).unwrap()).unwrap();
    let truth = |f: u64| (0..2).map(|p| scripted_input(4, f, p)).collect::<Vec<u8>>();
    for f in 0..3 {
        client.predict(vec![scripted_input(4, f, 0), 0]).unwrap();
    }
    let before = client.game_mut().value_digest().unwrap();
    // One input where the game has two players, for the second frame re-predicted.
    let e = client
        .confirm(&truth(0), |f| if f == 2 { vec![1] } else { truth(f) })
        .unwrap_err();
    let said = e.to_string();
    assert!(
        said.contains("repredict returned 1 inputs for frame 2, for 2 players"),
        "{said}"
    );
    assert!(said.contains("still holds its 3 predictions"), "{said}");
    assert_eq!(client.pending(), 3, "the predictions are kept");
    assert_eq!(client.sync_frame(), 0);
    assert_eq!(
        client.game_mut().value_digest().unwrap(),
        before,
        "nothing ran"
    );
    // A confirmed frame of the wrong size is refused the same way.
    let e = client.confirm(&[7], truth).unwrap_err().to_string();
    assert!(
        e.contains("the confirmed frames give 1 inputs for frame 0"),
        "{e}"
    );
    // Then a right confirmation goes on as if nothing had happened.
    client.confirm(&truth(0), truth).unwrap();
    assert_eq!((client.pending(), client.sync_frame()), (2, 1));
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out += &format!(": {s}");
        next = s.source();
    }
    out
}

/// Lua's message is in a game error's own message, so its chain must not repeat it (it did:
/// `source` was both in the message and the `source()`).
#[test]
fn a_game_error_chain_prints_lua_s_message_once() {
    let mut cfg = tiny(2, 1);
    let once = |e: &GameError, what: &str| {
        let text = chain(e);
        assert_eq!(text.matches(what).count(), 1, "{text}");
    };
    cfg.script =
        "local G = {} function G.init() error('bad init') end function G.step() end return G"
            .into();
    once(
        &Game::<u8>::new(&cfg, Backend::ArenaFull).unwrap_err(),
        "bad init",
    );
    cfg.script =
        "local G = {} function G.init() end function G.step() error('bad step') end return G"
            .into();
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    once(&g.step(&[0, 0]).unwrap_err(), "bad step");
    cfg.script = "local G = {} function G.init() end function G.step() end function G.digest() error('bad digest') end return G".into();
    let g: Game = Game::new(&cfg, Backend::ArenaFull).unwrap();
    let e = g.game_digest().unwrap_err();
    assert!(matches!(e, GameError::DigestFailed { .. }), "{e:?}");
    once(&e, "bad digest");
    // Through the umbrella error too.
    let umbrella = luasnap::Error::from(e);
    assert_eq!(chain(&umbrella).matches("bad digest").count(), 1);
}

#[test]
fn bad_games_get_clear_messages() {
    let mut cfg = tiny(2, 1);
    cfg.script = "return 42".into();
    let err = Game::<u8>::new(&cfg, Backend::ArenaFull)
        .unwrap_err()
        .to_string();
    assert!(err.contains("returned number, not a table"), "{err}");
    cfg.script = "return { init = function() end }".into();
    let err = Game::<u8>::new(&cfg, Backend::ArenaFull)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no function G.step"), "{err}");
    cfg.script = "local G = {} function G.init() end function G.step(i) if i[1] > 20 then error('boom') end end return G".into();
    let mut sim = Simulation::new(SimOptions {
        game: cfg.clone(),
        frames: 500,
        delay: 0,
        start: None,
        start_trust: luasnap::bridge::persist::Trust::Foreign,
        saving: luasnap::bridge::runtime::Saving::EveryFrame,
    })
    .unwrap();
    match sim.reference(false) {
        Err(GameError::Script { frame, error }) => {
            assert!(
                error.to_string().contains("boom") && error.to_string().contains("stack traceback"),
                "{error}"
            );
            assert!(frame < 500);
        }
        other => panic!("{other:?}"),
    }
    // G.init's errors are not blamed on a frame.
    cfg.script =
        "local G = {} function G.init() error('bad init') end function G.step() end return G"
            .into();
    let err = Game::<u8>::new(&cfg, Backend::ArenaFull).unwrap_err();
    assert!(
        matches!(err, GameError::Init { .. }) && err.to_string().contains("bad init"),
        "{err:?}"
    );
    cfg.script = "syntax error here".into();
    let err = Game::<u8>::new(&cfg, Backend::ArenaFull).unwrap_err();
    assert!(matches!(err, GameError::Syntax { .. }), "{err:?}");
    assert!(err.to_string().contains("syntax error: tiny:1:"), "{err}");
    // The deterministic profile's missing libraries are named as such.
    for (lib, use_) in [("os", "os.time()"), ("io", "io.write('x')")] {
        cfg.script =
            format!("local G = {{}} function G.init() end function G.step() {use_} end return G");
        let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
        let err = g.step(&[0, 0]).unwrap_err().to_string();
        assert!(
            err.contains(&format!("'{lib}' is left out of the deterministic profile")),
            "{err}"
        );
    }
}

#[test]
fn the_script_is_its_own_chunk_with_lua_s_lines_and_messages() {
    let mut cfg = tiny(2, 1);
    // An unclosed function: Lua reports the end of the script, as `lua` does for the file.
    cfg.script = "local G = {}\nfunction G.init() end\nfunction G.step(i)\n  if i[1] then\n  end\nreturn G\n".into();
    let err = Game::<u8>::new(&cfg, Backend::ArenaFull)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tiny:7: 'end' expected (to close 'function' at line 3) near <eof>"),
        "{err}"
    );
    cfg.script = "local G = {}\n--[[ never closed\nreturn G".into();
    let err = Game::<u8>::new(&cfg, Backend::ArenaFull)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tiny:3: unfinished long comment"), "{err}");
    // A runtime error's traceback names the script's lines under the script's name and the
    // runtime's glue under its own.
    cfg.script =
        "local G = {}\nfunction G.init() end\nfunction G.step(i)\n  error('boom')\nend\nreturn G\n"
            .into();
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    let err = g.step(&[0u8, 0]).unwrap_err().to_string();
    assert!(err.contains("tiny:4: boom"), "{err}");
    assert!(err.contains("[luasnap runtime]:"), "{err}");
    for line in err.lines().filter(|l| l.contains("tiny:")) {
        let n: usize = line
            .split("tiny:")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!((1..=6).contains(&n), "line outside the script: {err}");
    }
    // A `#!` first line is skipped, as Lua's standalone loader does, lines unchanged.
    cfg.script = "#!/usr/bin/env lua\nlocal G = {}\nfunction G.init() end\nfunction G.step(i) error('x') end\nreturn G\n".into();
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    let err = g.step(&[0u8, 0]).unwrap_err().to_string();
    assert!(err.contains("tiny:4: x"), "{err}");
}

#[test]
fn simulate_checks_g_digest_at_the_start_and_the_end() {
    let base = "local G = {} function G.init() G.n = 0 end function G.step(i) G.n = G.n + 1 end ";
    let run = |digest: &str| {
        let mut cfg = tiny(2, 1);
        cfg.script = format!("{base} function G.digest() {digest} end return G");
        Simulation::new(SimOptions {
            game: cfg,
            frames: 20,
            delay: 0,
            start: None,
            start_trust: luasnap::bridge::persist::Trust::Foreign,
            saving: luasnap::bridge::runtime::Saving::EveryFrame,
        })?
        .reference(false)
        .map(|_| ())
    };
    run("return G.n").unwrap();
    run("return 'n=' .. G.n").unwrap();
    let err = run("return { G.n }").unwrap_err().to_string();
    assert!(
        err.contains(
            "G.digest() returned a table at frame 0; it must return an integer or a string"
        ),
        "{err}"
    );
    // Wrong only at the end of the run.
    let err = run("if G.n > 10 then return nil end return G.n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("returned nil at frame 20"), "{err}");
    let err = run("if G.n > 10 then return G.n / 2 end return G.n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("returned the float 10.0 at frame 20"), "{err}");
    // A digest that changes the state (an in-place sort, a random draw) would desync peers
    // that checksum at other frames; simulate restores the VM around it, so it checks, from
    // its first call on (a sort in place changes the state only the first time).
    let err = run("G.n = G.n + 1 return G.n").unwrap_err().to_string();
    assert!(
        err.contains("G.digest() changed the game's state at frame 0"),
        "{err}"
    );
    let err = run("return math.random(1000)").unwrap_err().to_string();
    assert!(err.contains("changed the game's state"), "{err}");
    // Keying an object for the first time numbers it: no value changes, but the numbering
    // orders pairs() for good, so peers that take digests at other frames part (an outside
    // tester's p2p game desynced this way while simulate matched).
    let err = run("local seen = {} seen[G] = true return G.n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("G.digest() at frame 0 made 1 object(s) table keys for the first time"),
        "{err}"
    );
    run("local seen = {} seen[G.n] = true return G.n").unwrap();
    // A collection asked for is a collection point (weak entries cleared, finalizers run) at
    // a frame only the peer that checksums has: p2p desynced, simulate matched.
    let err = run("collectgarbage() return G.n").unwrap_err().to_string();
    assert!(
        err.contains("collectgarbage() called while the host reads the state"),
        "{err}"
    );
    run("return G.n + math.floor(collectgarbage('count') * 0)").unwrap();
    run("local c = {} for k, v in pairs(G) do c[#c + 1] = tostring(k) end table.sort(c) return #c")
        .unwrap();
    let err = run("error('no digest today')").unwrap_err().to_string();
    assert!(
        err.contains("G.digest() failed at frame 0") && err.contains("no digest today"),
        "{err}"
    );
}

/// What `Game::new` refuses `cfg` with.
fn refusal(cfg: &GameConfig) -> String {
    Game::<u8>::new(cfg, Backend::ArenaFull)
        .expect_err("refused")
        .to_string()
}

/// A script of one's own under the embedded game's chunk name is refused (its errors would
/// point at `arena_brawl` and saves of any other script so named would load into it); named,
/// its errors carry its name and another script's saves do not bind to it.
#[test]
fn a_script_of_its_own_needs_a_name_of_its_own() {
    let mut cfg = GameConfig::default_game(2, 1);
    cfg.base_address = None;
    cfg.capacity = 64 << 20;
    cfg.script = "local G = {} function G.init() end function G.step() end return G".into();
    let err = refusal(&cfg);
    assert!(
        err.contains("chunk name is still the default game's") && err.contains("with_script"),
        "{err}"
    );
    let a = cfg.clone().with_script(
        "game_a",
        "local G, s = {}, {} function G.init() s.n = 0 end
         function G.step() s.n = s.n + 1 end return G",
    );
    let b = cfg.clone().with_script(
        "game_b",
        "local G, t = {}, {} function G.init() t.k = 'x' end
         function G.step() error('boom') end return G",
    );
    let mut ga = Game::<u8>::new(&a, Backend::ArenaFull).unwrap();
    ga.step(&[0, 0]).unwrap();
    let save = ga.save_game().unwrap();
    let err = Game::<u8>::from_save(&b, Backend::ArenaFull, &save)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("game_a"), "{err}");
    let mut gb = Game::<u8>::new(&b, Backend::ArenaFull).unwrap();
    let err = gb.step(&[0, 0]).unwrap_err().to_string();
    assert!(err.contains("game_b:2: boom"), "{err}");
}

/// Running out of the arena while the script loads or `G.init` runs says so, as in a step.
#[test]
fn out_of_memory_at_init_names_the_capacity() {
    let mut cfg = tiny(2, 1);
    cfg.capacity = 64 << 10;
    let err = refusal(&cfg);
    assert!(
        err.contains("ran out of memory at frame 0") && err.contains("GameConfig::capacity"),
        "{err}"
    );
    cfg.capacity = 4 << 20;
    cfg.script = "local G = {} function G.init() local t = {} for i = 1, 1e7 do t[i] = i end end
                  function G.step() end return G"
        .into();
    let err = refusal(&cfg);
    assert!(
        err.contains("ran out of memory at frame 0") && err.contains("GameConfig::capacity"),
        "{err}"
    );
}
