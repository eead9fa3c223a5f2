//! The corpus of real-style games (`lua-bridge/games/`): every backend of `simulate` ends in
//! the reference state for several player counts, delays and seeds, and a save at frame N
//! plus more frames equals a straight run. The games use what real Lua game code uses (the
//! string library, `math.random`, weak caches, coroutines, metatables, `utf8`, `goto`, ...).

mod common;

use common::{config, continuation, folder};
use luasnap::bridge::runtime::GameConfig;
use luasnap::bridge::runtime::{Backend, DEFAULT_GAME};
use luasnap::bridge::simulate::{SimOptions, Simulation};

const ARENA_SHOOTER: &str = include_str!("../lua-bridge/games/arena_shooter.lua");
const AI_VILLAGE: &str = include_str!("../lua-bridge/games/ai_village.lua");
const BULK_MARKET: &str = include_str!("../lua-bridge/games/bulk_market.lua");
const DUNGEON_CRAWL: &str = include_str!("../lua-bridge/games/dungeon_crawl.lua");
const FIRST_OF_SET: &str = include_str!("lua/first_of_set.lua");
const POOL_BY_FINALIZERS: &str = include_str!("lua/pool_by_finalizers.lua");

/// Runs the reference and `backends` on each (players, delay, seed); panics with the
/// divergence explained by path if one does not match.
fn check(
    name: &str,
    script: &str,
    frames: u64,
    setups: &[(usize, u64, u64)],
    backends: &[Backend],
) {
    check_game(
        name,
        &|p, s| config(name, script, p, s),
        frames,
        setups,
        backends,
    );
}

/// As [`check`], for the game `game(players, seed)` (a game's folder, say).
fn check_game(
    name: &str,
    game: &dyn Fn(usize, u64) -> GameConfig,
    frames: u64,
    setups: &[(usize, u64, u64)],
    backends: &[Backend],
) {
    for &(players, delay, seed) in setups {
        let opts = SimOptions {
            game: game(players, seed),
            frames,
            delay,
            start: None,
            start_trust: luasnap::bridge::persist::Trust::Foreign,
            saving: luasnap::bridge::runtime::Saving::EveryFrame,
        };
        let mut sim = Simulation::new(opts).unwrap();
        let (reference, _) = sim.reference(false).unwrap();
        for &b in backends {
            let r = sim.run(b, &reference).unwrap();
            if !r.matches_reference {
                let why = sim.explain(b, 10).unwrap();
                panic!("{name}, {players} players, delay {delay}, seed {seed}: {why}");
            }
            if players > 1 && delay > 0 {
                assert!(r.rollbacks > 0, "{name}: predictions must fail sometimes");
            }
        }
    }
}

const SETUPS: [(usize, u64, u64); 3] = [(1, 0, 1), (2, 3, 7), (4, 2, 11)];

#[test]
fn arena_shooter_matches_on_every_backend() {
    check("arena_shooter", ARENA_SHOOTER, 40, &SETUPS, &Backend::ALL);
}

#[test]
fn dungeon_crawl_matches_on_every_backend() {
    check("dungeon_crawl", DUNGEON_CRAWL, 60, &SETUPS, &Backend::ALL);
}

#[test]
fn bulk_market_matches_on_every_backend() {
    // A 22 MB heap: fewer setups, it is the slow one.
    check("bulk_market", BULK_MARKET, 25, &[(2, 3, 5)], &Backend::ALL);
}

#[test]
fn ai_village_matches_on_the_arena_backends() {
    let arena = [Backend::ArenaFull, Backend::ArenaIncremental];
    check("ai_village", AI_VILLAGE, 40, &SETUPS, &arena);
}

#[test]
fn ai_village_matches_with_the_serializer() {
    // 300 coroutines, some suspended with pending `<close>` variables, through save-games.
    check("ai_village", AI_VILLAGE, 40, &SETUPS, &[Backend::Serialize]);
}

#[test]
fn ecs_arena_matches_on_every_backend_serialize_included() {
    // tiny-ecs, bump.lua, middleclass, lume: about 1 MB live, 0.8 MB of garbage a frame. Its
    // order comes from identities (bump's queries) and from which of bump's weak-valued cells
    // survive: serialize mode rebuilds the heap, so its collector runs at other moments, and
    // matches because weak entries are cleared at collection points only (docs/gc.md). 70
    // frames: past the point at frame 60.
    check_game(
        "ecs_arena",
        &|p, s| folder("ecs_arena", p, s),
        70,
        &[(2, 4, 7), (3, 2, 11)],
        &Backend::ALL,
    );
}

#[test]
fn ecs_arena_matches_with_the_serializer_past_removed_keys_added_again() {
    // Entities leave bump's cells and come back: a removed key set again. Serialize mode
    // rebuilds the heap at every rollback, so its collector marks removed keys dead at other
    // moments than the reference's; with a collection point every 20 frames it parted at
    // frame 127, until such a key took a new node whatever the collector did (Lua patch 11).
    let game = |p, s| {
        let mut cfg = folder("ecs_arena", p, s);
        cfg.collect_every = Some(20);
        cfg
    };
    check_game("ecs_arena", &game, 150, &[(2, 3, 1)], &[Backend::Serialize]);
}

#[test]
fn a_pool_refilled_by_finalizers_matches_on_every_backend_serialize_included() {
    // Serialize mode loads each rollback's save into the VM that ran the game: the replaced
    // state's particles, unreachable then, were finalized at the next collection point into
    // the new state's globals (its pool and count) until a load dropped their marks (Lua
    // patch 14).
    check(
        "pool_by_finalizers",
        POOL_BY_FINALIZERS,
        60,
        &[(2, 4, 7), (3, 2, 11)],
        &Backend::ALL,
    );
}

#[test]
fn games_keyed_by_objects_match_on_every_backend_serialize_included() {
    // pairs() order over tables keyed by tables, closures and C functions: serialize mode
    // rolls back by save and load, which carry the objects' identities (format 7).
    check(
        "first_of_set",
        FIRST_OF_SET,
        60,
        &[(2, 4, 7), (3, 2, 11)],
        &Backend::ALL,
    );
    check_game(
        "keyed_by_functions",
        &|p, s| folder("keyed_by_functions", p, s),
        30,
        &[(2, 4, 7), (3, 2, 11)],
        &Backend::ALL,
    );
}

#[test]
fn json_town_matches_on_every_backend() {
    // json.lua, dkjson, serpent, inspect, middleclass: about 1 MB live, 0.55 MB of garbage
    // (mostly strings) a frame.
    check_game(
        "json_town",
        &|p, s| folder("json_town", p, s),
        30,
        &[(2, 4, 7), (3, 2, 11)],
        &Backend::ALL,
    );
}

#[test]
fn the_default_game_matches_on_every_backend() {
    check("default", DEFAULT_GAME, 20, &[(2, 3, 3)], &Backend::ALL);
}

#[test]
fn a_save_at_frame_50_plus_50_frames_equals_100_frames_straight() {
    // The arena shooter draws from math.random every frame (spawns, spread).
    continuation("arena_shooter", ARENA_SHOOTER, 50, 50);
    continuation("dungeon_crawl", DUNGEON_CRAWL, 50, 50);
}
