//! Persist-side measurements apart from heap building (for `perf`), and a dump of the bytes
//! the writer produces for a fixed set of states (to check that a change to the writer keeps
//! its output byte for byte).
//!
//! ```text
//! cargo run --release --example persist_profile -- time MB RUNS   # persist the bench heap RUNS times
//! cargo run --release --example persist_profile -- load MB RUNS   # load its save RUNS times
//! cargo run --release --example persist_profile -- load-fixed MB RUNS  # a tiny save, loaded
//! cargo run --release --example persist_profile -- dump DIR        # write DIR/<state>.bin
//! cargo run --release --example persist_profile -- games RUNS      # each corpus game's save:
//!                                                                  # bytes, save and load time
//! ```

use luasnap::bridge::{workloads::HEAP_BUILDER, GcMode, Value, Vm};

fn vm(mb: usize) -> Vm {
    Vm::builder()
        .capacity((mb * 4 + 256) << 20)
        .deterministic(1)
        // A fixed address: keys that are objects hash by address, so their order (and the
        // bytes written) would change from run to run.
        .base_address(0x2000_0000_0000)
        .gc(GcMode::GENERATIONAL)
        .build()
        .expect("vm")
}

fn heap(mb: usize) -> Vm {
    let vm = vm(mb);
    vm.exec(
        format!("H = (function() {HEAP_BUILDER} end)()"),
        "=heap_builder",
    )
    .expect("heap builder");
    vm.call::<()>("H.build", &[Value::Integer((mb << 20) as i64)])
        .expect("build");
    vm.gc_collect().expect("collect");
    vm
}

const GAMES: &[(&str, &str)] = &[
    (
        "ai_village",
        include_str!("../lua-bridge/games/ai_village.lua"),
    ),
    (
        "arena_brawl",
        include_str!("../lua-bridge/games/arena_brawl.lua"),
    ),
    (
        "arena_shooter",
        include_str!("../lua-bridge/games/arena_shooter.lua"),
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

/// A corpus game in a fresh VM after `frames` frames.
fn game_at(src: &str, name: &str, frames: i64) -> Vm {
    let g = vm(64);
    g.exec(
        format!("G = (function() {src} end)()"),
        &format!("@{name}.lua"),
    )
    .expect("game");
    g.call::<()>("G.init", &[Value::Integer(2), Value::Integer(7)])
        .expect("init");
    for f in 0..frames {
        g.exec(
            format!("G.step({{ {}, {} }})", f % 32, (f * 7) % 32),
            "=step",
        )
        .expect("step");
    }
    g
}

/// Each corpus game after 40 frames: its whole-game save's size, and the median CPU time of
/// `runs` saves and of `runs` own-trust loads into a fresh VM (each load into its own VM; the
/// VM's building is not timed).
fn games(runs: usize) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (name, src) in GAMES {
        let g = game_at(src, name, 40);
        let mut bytes = Vec::new();
        let mut save = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = cpu_time::ThreadTime::now();
            bytes = g.save_game().expect("save");
            save.push(t.elapsed().as_secs_f64() * 1e3);
        }
        drop(g);
        let mut load = Vec::with_capacity(runs);
        for _ in 0..runs {
            let mut v = vm(64);
            let t = cpu_time::ThreadTime::now();
            v.load_game(&bytes, luasnap::bridge::persist::Trust::Own)
                .expect("load");
            load.push(t.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "{name}: {} bytes, save median {:.3} ms, load median {:.3} ms (CPU time)",
            bytes.len(),
            median(save),
            median(load)
        );
    }
}

/// A state with a bit of everything the writer distinguishes.
const MIXED: &str = r#"
local shared = 0
local function counter() shared = shared + 1; return shared end
local mt = { __index = function(t, k) return k end }
local t = setmetatable({}, mt)
for i = 1, 300 do t[i] = i * 1.5 end
for i = 1, 300 do t["k" .. i] = (i % 3 == 0) and true or (i % 3 == 1) and false or ("v" .. i) end
for i = 1, 200, 3 do t["k" .. i] = nil end          -- removed entries: layouts with dead keys
t[2^53] = "big"; t[-0.5] = "neg"; t[true] = "yes"
local keyt = {}
t[keyt] = { keyt, t }                                -- a table key seen first as a key
t.f1, t.f2 = counter, function() return counter() + shared end
t.long = string.rep("abcdefgh", 400)
t.again = t.long
t.co = coroutine.create(function(a) local x <const> = a; coroutine.yield(x); return x end)
coroutine.resume(t.co, 5)
t.wrapped = coroutine.wrap(function() coroutine.yield(1) end)
t.deep = {}
local d = t.deep
for i = 1, 2000 do d.next = { i = i }; d = d.next end
t.special = setmetatable({ secret = 1 }, { __persist = function(o) local s = o.secret; return function() return { secret = s } end end })
t.empty = {}
t.sparse = { [1] = 1, [3] = 3, [100] = 100, [1000] = "x" }
t.mathy = { math.pi, math.huge, -math.huge, 0/0 ~= 0/0, math.mininteger, math.maxinteger }
M = t
"#;

fn dump(dir: &str) {
    std::fs::create_dir_all(dir).expect("dir");
    let write = |name: &str, bytes: Vec<u8>| {
        std::fs::write(format!("{dir}/{name}.bin"), &bytes).expect("write");
        println!("{name}: {} bytes", bytes.len());
    };
    let h = heap(3);
    write("heap", h.persist("H").expect("persist"));
    write("heap_game", h.save_game().expect("save"));
    drop(h);
    let m = vm(1);
    m.exec(MIXED, "=mixed").expect("mixed");
    write("mixed", m.persist("M").expect("persist"));
    write("mixed_game", m.save_game().expect("save"));
    drop(m);
    for (name, src) in GAMES {
        write(name, game_at(src, name, 40).save_game().expect("save"));
    }
}

fn time(mb: usize, runs: usize) {
    let vm = heap(mb);
    let mut out = Vec::new();
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = cpu_time::ThreadTime::now();
        out = vm.persist("H").expect("persist");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{mb} MB: persist median {:.3} ms (min {:.3}) CPU time, output {} bytes",
        ms[ms.len() / 2],
        ms[0],
        out.len()
    );
}

/// Loads the bench heap's save `runs` times into the same VM, as `luasnap bench` does (the
/// previous copy collected first, untimed).
fn load(mb: usize, runs: usize) {
    let mut vm = heap(mb);
    let bytes = vm.persist("H").expect("persist");
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        vm.exec("H2 = nil", "=clear").expect("clear");
        vm.gc_collect().expect("collect");
        let t = cpu_time::ThreadTime::now();
        vm.unpersist(&bytes, "H2", luasnap::bridge::persist::Trust::Own)
            .expect("load");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{mb} MB: load median {:.3} ms (min {:.3}) CPU time, input {} bytes",
        ms[ms.len() / 2],
        ms[0],
        bytes.len()
    );
}

/// A load's fixed costs: a tiny save loaded `runs` times into the bench heap's VM.
fn load_fixed(mb: usize, runs: usize) {
    let mut vm = heap(mb);
    vm.exec("S = { 1, 2, x = 'y' }", "=small").expect("small");
    let bytes = vm.persist("S").expect("persist");
    let mut us = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = cpu_time::ThreadTime::now();
        vm.unpersist(&bytes, "S2", luasnap::bridge::persist::Trust::Own)
            .expect("load");
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    println!(
        "{mb} MB heap, a small table: load median {:.1} us (min {:.1})",
        us[us.len() / 2],
        us[0]
    );
}

/// A save's fixed costs: a tiny value, persisted `runs` times after one save of the bench
/// heap (whose working memory the thread keeps).
fn fixed(mb: usize, runs: usize) {
    let vm = heap(mb);
    vm.exec("S = { 1, 2, x = 'y' }", "=small").expect("small");
    vm.persist("H").expect("persist");
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = cpu_time::ThreadTime::now();
        vm.persist("S").expect("persist");
        ms.push(t.elapsed().as_secs_f64() * 1e6);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "{mb} MB heap, a small table: persist median {:.1} us (min {:.1})",
        ms[ms.len() / 2],
        ms[0]
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("games") => games(args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20)),
        Some("dump") => dump(args.get(1).map(String::as_str).unwrap_or("persist-dump")),
        Some("time") => time(
            args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1),
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200),
        ),
        Some("load") => load(
            args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1),
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200),
        ),
        Some("load-fixed") => load_fixed(
            args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1),
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000),
        ),
        Some("fixed") => fixed(
            args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1),
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000),
        ),
        _ => eprintln!(
            "usage: persist_profile (time MB RUNS | load MB RUNS | load-fixed MB RUNS | fixed MB RUNS | dump DIR | games RUNS)"
        ),
    }
}
