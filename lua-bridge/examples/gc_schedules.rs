//! Pages written per frame and the arena's extent under several collector schedules.
//!
//! `cargo run --release -p luasnap-bridge --example gc_schedules -- GAME [FRAMES] [WARM] [SCHEDULES]`
//!
//! GAME is a game's script or its folder (`main.lua` in it, its modules beside).
//! Runs the game (2 players, seed 7) with the tracker always armed, so every count is the real
//! number of pages written, after WARM frames (default 40) for FRAMES frames (default 150),
//! under each schedule of the comma-separated list (default all of them):
//! - `gen`: Lua's generational collector, automatic, quiet (Lua patch 10: no weak entry
//!   cleared, no finalizer called), without collection points;
//! - `stock`: the same with stock collections (what the runtime ran before collection points);
//! - `pointsN` (`points60`, ...): `gen` with a full collection, a collection point, after
//!   every N-th frame (what the runtime runs, N = `G.collect_every`, default 60);
//! - `inc`: the incremental collector, automatic;
//! - `roomy8`: automatic collection stopped, a full collection after a frame once the heap has
//!   grown by `max(live, 8 MiB)` (what the runtime did for heaps of 1 MiB and more until
//!   issue 24);
//! - `growK` (`grow1`, `grow2`, ...): stopped, a full collection once the heap has grown by K
//!   times the live heap (at least 256 KiB).
//!
//! Whole copies cost in proportion to the extent, incremental ones to the pages written (plus a
//! write fault for each): docs/gc.md, "The runtime: one collector, copies chosen by cost".

use luasnap_bridge::GcMode;

mod support;
use support::{build_with, step};

/// The seed of the game's run (its VM and scripted inputs).
const SEED: u64 = 7;

/// Heap growth, in bytes, after which a stopped schedule collects (`None`: automatic).
fn growth(schedule: &str, live: f64) -> Option<f64> {
    match schedule {
        "roomy8" => Some(live.max(8.0 * 1048576.0)),
        s => s
            .strip_prefix("grow")
            .map(|k| (live * k.parse::<f64>().expect("growK")).max(256.0 * 1024.0)),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: gc_schedules GAME [FRAMES] [WARM] [SCHEDULES]");
    let frames: u64 = args.get(2).map_or(150, |s| s.parse().expect("frames"));
    let warm: u64 = args
        .get(3)
        .map_or(40, |s| s.parse().expect("warm-up frames"));
    let schedules: Vec<String> = args.get(4).map_or_else(
        || {
            [
                "stock", "gen", "points60", "inc", "roomy8", "grow1", "grow2", "grow4",
            ]
            .map(String::from)
            .to_vec()
        },
        |s| s.split(',').map(String::from).collect(),
    );
    let path = std::path::Path::new(path);
    let (script, folder) = if path.is_dir() {
        (path.join("main.lua"), Some(path))
    } else {
        (path.to_path_buf(), None)
    };
    let script = std::fs::read_to_string(script).expect("read game");
    println!("| schedule | written median | written mean | written max | extent mean | extent max | collections | heap at the end | heap peak | step µs median / mean / max |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for schedule in schedules {
        let points: Option<u64> = schedule
            .strip_prefix("points")
            .map(|n| n.parse().expect("pointsN"));
        let mode = if schedule == "gen" || schedule == "stock" || points.is_some() {
            GcMode::GENERATIONAL
        } else {
            GcMode::INCREMENTAL
        };
        let mut vm = build_with(&script, folder, mode, SEED, schedule != "stock");
        vm.gc_collect().expect("collect");
        let stopped = growth(&schedule, 0.0).is_some();
        if stopped {
            vm.gc_running(false);
        }
        let mut live = vm.lua_memory() as f64;
        let (mut written, mut extent, mut collections) = (Vec::new(), Vec::new(), 0);
        let (mut times, mut peak) = (Vec::new(), 0usize);
        for f in 0..warm + frames {
            let t = std::time::Instant::now();
            step(&vm, SEED, f);
            if points.is_some_and(|n| n > 0 && (f + 1) % n == 0) {
                vm.gc_collect().expect("collect");
                collections += u32::from(f >= warm);
            }
            if f >= warm {
                times.push(t.elapsed().as_micros() as usize);
                peak = peak.max(vm.lua_memory());
            }
            if growth(&schedule, live).is_some_and(|g| vm.lua_memory() as f64 >= live + g) {
                vm.gc_collect().expect("collect");
                live = vm.lua_memory() as f64;
                collections += u32::from(f >= warm);
            }
            if f + 1 >= warm {
                vm.snapshot().expect("snapshot");
                if f >= warm {
                    written.push(vm.snapshots().stats().last_dirty_pages);
                    extent.push(vm.arena_stats().extent_bytes as usize / 4096);
                }
            }
        }
        let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len() as f64;
        let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        let mut sorted = written.clone();
        sorted.sort_unstable();
        times.sort_unstable();
        println!(
            "| {schedule} | {} | {:.1} | {} | {:.0} | {} | {collections} | {:.2} MiB | {:.2} MiB | {} / {:.0} / {} |",
            sorted[sorted.len() / 2],
            mean(&written),
            max(&written),
            mean(&extent),
            max(&extent),
            vm.lua_memory() as f64 / 1048576.0,
            peak as f64 / 1048576.0,
            times[times.len() / 2],
            mean(&times),
            max(&times)
        );
    }
}
