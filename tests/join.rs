//! Joining a match from a save-game stays in lockstep (issue 23, item 3): a game saved after
//! frame 50 and loaded in a new process, with own and with foreign trust, runs frames 51..=100
//! with the same value digest and `G.digest()` after every frame as the process that saved it.
//! Tables keyed by tables, closures and C functions iterate by the identities the save carries
//! (docs/determinism.md, "Key order"), so a game acting on the first key of `pairs()`
//! continues as it would have.
//!
//! The loading side runs in a child process (this test binary again, told what to do by
//! [`CHILD`]): another process has its executable, and so its C functions, at other addresses,
//! and its arena elsewhere.

mod common;

use common::{config, folder, temp_file};
use luasnap::bridge::persist::{LoadOptions, Trust};
use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameConfig};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child: `TRUST\tSAVE\tEND\tGAME`, what to load, to which frame to run, and from
/// which game.
const CHILD: &str = "LUASNAP_JOIN_CHILD";
const SAVE_AT: u64 = 50;
const END_AT: u64 = 100;
const PLAYERS: usize = 2;
const SEED: u64 = 1;

/// After each frame: (frame, value digest, `G.digest()`).
type Trace = Vec<(u64, u64, Option<i64>)>;

fn games_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lua-bridge/games")
}

/// The game: a script given here, a game folder, or a corpus file (its folder the games').
fn game_config(game: &str) -> GameConfig {
    match game {
        "first_of_set" => config(game, FIRST_OF_SET, PLAYERS, SEED),
        "weak_cache" => config(game, WEAK_CACHE, PLAYERS, SEED),
        "removed_cfunction_keys" => config(game, REMOVED_CFUNCTION_KEYS, PLAYERS, SEED),
        "refinal" => config(game, REFINAL, PLAYERS, SEED),
        "refinal_pool" => config(game, REFINAL_POOL, PLAYERS, SEED),
        "lategc" => config(game, LATE_GC, PLAYERS, SEED),
        "pending_order" => config(game, PENDING_ORDER, PLAYERS, SEED),
        _ if games_dir().join(game).is_dir() => folder(game, PLAYERS, SEED),
        _ => config(game, "", PLAYERS, SEED)
            .game_at(&games_dir().join(format!("{game}.lua")))
            .unwrap(),
    }
}

/// Steps `game` to frame `to`, recording the digests after each frame.
fn run_to(game: &mut Game, to: u64, trace: &mut Trace) {
    while game.frame() < to {
        let f = game.frame();
        let inputs: Vec<u8> = (0..PLAYERS).map(|p| scripted_input(SEED, f, p)).collect();
        game.step(&inputs).unwrap();
        let digest = game.game_digest().unwrap();
        trace.push((game.frame(), game.value_digest().unwrap(), digest));
    }
}

/// A game that acts on the first key of `pairs()` over sets of tables, closures and C
/// functions (see the file).
const FIRST_OF_SET: &str = include_str!("lua/first_of_set.lua");

/// A game that removes library C functions from a table keyed by them and sets them again,
/// acting on `pairs()` order (an outside tester's).
const REMOVED_CFUNCTION_KEYS: &str = include_str!("lua/removed_cfunction_keys.lua");

/// An outside tester's games around finalizers (docs/determinism.md, "Finalizers after a
/// load"): an object finalized at a collection point and still a key of a weak-keyed table
/// (Lua clears resurrected keys one collection later) when the game is saved; particles
/// recycled into a pool by their finalizer (Lua finalizes an object once); a metatable given
/// its `__gc` after `setmetatable` (Lua never marks the object).
const REFINAL: &str = include_str!("lua/refinal.lua");
const REFINAL_POOL: &str = include_str!("lua/refinal_pool.lua");
const LATE_GC: &str = include_str!("lua/lategc.lua");
const PENDING_ORDER: &str = include_str!("lua/pending_order.lua");

/// A game whose counters follow what a weak-valued cache still holds and how many objects
/// were finalized (see the file).
const WEAK_CACHE: &str = include_str!("lua/weak_cache.lua");

/// The child's side: loads the save (trust, paths and last frame from [`CHILD`]), runs on and
/// prints its trace, one `JOIN frame value game` line per frame.
#[test]
fn join_child() {
    let Ok(what) = std::env::var(CHILD) else {
        return; // run by the parent only
    };
    let mut parts = what.splitn(4, '\t');
    let (trust, save, end, game) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap(),
    );
    let trust = if trust == "own" {
        Trust::Own
    } else {
        Trust::Foreign
    };
    let bytes = std::fs::read(save).unwrap();
    let cfg = game_config(game);
    let mut opts = LoadOptions::new(trust);
    opts.finalizers = true; // dungeon_crawl has a __gc; foreign loads refuse it by default
    let mut g = Game::from_save_with(&cfg, Backend::ArenaIncremental, &bytes, &opts).unwrap();
    let mut trace = Trace::new();
    run_to(&mut g, end, &mut trace);
    for (f, v, d) in trace {
        println!("JOIN {f} {v} {}", d.map_or("-".into(), |d| d.to_string()));
    }
}

/// Runs the child for `game` with this trust to frame `end` and returns its trace.
fn joined(game: &str, save: &Path, trust: &str, end: u64) -> Trace {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["join_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{trust}\t{}\t{end}\t{game}", save.display()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{game}, {trust} trust: the loading process failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        // (The harness's "test join_child ... " may share the first line.)
        .filter_map(|l| l.find("JOIN ").map(|at| &l[at + 5..]))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (
                w[0].parse().unwrap(),
                w[1].parse().unwrap(),
                w[2].parse().ok(),
            )
        })
        .collect()
}

/// The straight run to [`END_AT`], saving after [`SAVE_AT`]; then a new process loads the save
/// with own and foreign trust and must match every frame after it.
fn check_join(game: &str) {
    check_join_with(game, &["own", "foreign"]);
}

/// As [`check_join`], with these trust levels.
fn check_join_with(game: &str, trusts: &[&str]) {
    check_join_span(game, trusts, SAVE_AT, END_AT);
}

/// As [`check_join_with`], saving after frame `save_at` and running to `end_at`.
fn check_join_span(game: &str, trusts: &[&str], save_at: u64, end_at: u64) {
    let cfg = game_config(game);
    let mut g = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
    let mut straight = Trace::new();
    run_to(&mut g, save_at, &mut straight);
    let save = temp_file(&format!("luasnap-join-{game}-"), ".sav");
    std::fs::write(&save, g.save_game().unwrap()).unwrap();
    straight.clear();
    run_to(&mut g, end_at, &mut straight);
    for &trust in trusts {
        let joined = joined(game, &save, trust, end_at);
        assert_eq!(joined.len(), straight.len(), "{game}, {trust} trust");
        for (a, b) in straight.iter().zip(&joined) {
            assert_eq!(
                a, b,
                "{game}, {trust} trust: (frame, value digest, G.digest()) after the load differ \
                 from the process that saved"
            );
        }
    }
}

#[test]
fn a_set_keyed_by_tables_continues_alike_after_a_load_in_a_new_process() {
    check_join("first_of_set");
}

#[test]
fn a_weak_cache_continues_alike_after_a_load_in_a_new_process() {
    // The loaded heap has no garbage and other ages, so the collector runs at other moments
    // than in the process that saved: weak entries are cleared and finalizers called at the
    // runtime's collection points only (docs/gc.md), at the same frames in both.
    check_join("weak_cache");
}

#[test]
fn a_weak_cache_gives_the_same_results_under_any_collector_tuning() {
    use luasnap::bridge::runtime::VmSetup;
    use luasnap::bridge::GcMode;
    let run = |setup: VmSetup| {
        let mut cfg = game_config("weak_cache");
        cfg.setup = setup;
        let mut g = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
        let mut trace = Trace::new();
        run_to(&mut g, END_AT, &mut trace);
        trace
    };
    let stock = run(VmSetup::default());
    let tunings = [
        GcMode::Generational {
            minor_multiplier: Some(5),
            major_minor: None,
            minor_major: None,
        },
        GcMode::Generational {
            minor_multiplier: Some(100),
            major_minor: Some(20),
            minor_major: Some(20),
        },
        GcMode::Incremental {
            pause: Some(100),
            step_multiplier: Some(400),
            step_size: None,
        },
    ];
    for mode in tunings {
        let tuned = run(VmSetup::new(move |b| b.gc(mode)));
        let first = stock.iter().zip(&tuned).find(|(a, b)| a != b);
        assert!(
            first.is_none() && stock.len() == tuned.len(),
            "{mode:?}: (frame, value digest, G.digest()) differ from the default collector's \
             first at {first:?}"
        );
    }
    // The game's counters did move: hits, misses and finalized objects all counted.
    let last = stock.last().unwrap().2.unwrap();
    assert!(
        last % 1000 > 0 && last / 1000 % 1000 > 0 && last / 1_000_000 > 0,
        "{last}"
    );
}

#[test]
fn library_games_keyed_by_tables_and_c_functions_continue_alike_after_a_load() {
    check_join("keyed_by_functions");
    // Own trust only: its state holds library functions a foreign load refuses (require,
    // collectgarbage, debug, string.dump).
    check_join_with("json_town", &["own"]);
}

#[test]
fn every_corpus_game_continues_alike_after_a_load_in_a_new_process() {
    for game in [
        "arena_shooter",
        "ai_village",
        "bulk_market",
        "dungeon_crawl",
        "arena_brawl",
    ] {
        check_join(game);
    }
    // tiny-ecs compiles its filters from source text as the game runs: the game declares
    // `load`, so a foreign load compiles them from the save's text; its modules are required
    // in G.init, so the loading VM compiles the game's folder first. Its weak-valued grid
    // cells (bump.lua) kept it from continuing alike until weak entries were cleared at
    // collection points only.
    check_join("ecs_arena");
}

#[test]
fn entities_removed_from_a_set_and_added_again_continue_alike_after_a_load() {
    // ecs_arena saved after frame 100 parted from the saving process at frame 144 (a drone's
    // target, the first entity of bump's `queryRect`), before a removed key set again took a
    // new node whatever the collector did (Lua patch 11; docs/determinism.md).
    check_join_span("ecs_arena", &["own"], 100, 160);
    // Library C functions are never marked dead by the collector, and a save writes their
    // removed entries as dead keys: the straight run reused the node, the loaded one did not.
    check_join_span("removed_cfunction_keys", &["own", "foreign"], 40, 100);
}

#[test]
fn a_loaded_game_finalizes_the_objects_the_saving_process_would() {
    // Loads marked every object whose metatable had __gc: the finalized object held by a
    // weak-keyed table was finalized again (refinal: fin[1] 2 instead of 1), the object whose
    // metatable got __gc late was finalized (lategc: 1 instead of 0), and the pool counted 204
    // recycled particles instead of 194. A save of format 8 records which objects are marked,
    // and in which order (the order finalizers run in).
    check_join_span("refinal", &["own", "foreign"], 7, 20);
    check_join_span("lategc", &["own", "foreign"], 6, 20);
    check_join_span("refinal_pool", &["own", "foreign"], 30, 100);
    // Saved between two collection points: the particles dropped since the last one are
    // finalized (resurrected into the pool) at the next, but no save carried them (74 recycled
    // instead of 70 at frame 40). A save of format 9 writes them after the root.
    check_join_span("refinal_pool", &["own", "foreign"], 35, 100);
    // Many dropped objects, some held only by another dropped one: finalized in the saving
    // process's order (the digest hashes it).
    check_join_span("pending_order", &["own", "foreign"], 37, 60);
    // The straight runs did finalize: the marks matter.
    let digest_at = |game: &str, end: u64| {
        let mut g = Game::new(&game_config(game), Backend::ArenaIncremental).unwrap();
        let mut trace = Trace::new();
        run_to(&mut g, end, &mut trace);
        trace.last().unwrap().2.unwrap()
    };
    assert_eq!(digest_at("refinal", 20), 1, "refinal: finalized once");
    assert_eq!(digest_at("lategc", 20), 0, "lategc: never finalized");
    assert!(
        digest_at("refinal_pool", 100) % 100_000 > 0,
        "refinal_pool: recycled"
    );
    assert!(
        digest_at("pending_order", 60) % 1000 > 0,
        "pending_order: finalized"
    );
}
