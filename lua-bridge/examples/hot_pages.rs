//! How much of a frame's writes a "hot set" of recently written pages would cover.
//!
//! `cargo run --release -p luasnap-bridge --example hot_pages -- GAME [FRAMES] [WARM]`
//!
//! Runs the game (2 players, seed 7) with the tracker always armed, records the pages each
//! frame writes, and for a hot set made of the pages written in any of the last K frames
//! (K = 1, 2, 4, 8) prints per frame: the hot set's pages and runs, the frame's written pages
//! inside it (write faults a hot set would save) and outside it (faults left), and the pages a
//! save would copy (hot set plus the written pages outside it). Page counts only.

use luasnap_bridge::GcMode;
use std::collections::BTreeSet;

mod support;
use support::{build_with, step};

const SEED: u64 = 7;

fn runs(set: &BTreeSet<usize>) -> usize {
    let mut n = 0;
    let mut last = None;
    for &p in set {
        if last != Some(p.wrapping_sub(1)) {
            n += 1;
        }
        last = Some(p);
    }
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: hot_pages GAME [FRAMES] [WARM]");
    let frames: u64 = args.get(2).map_or(100, |s| s.parse().expect("frames"));
    let warm: u64 = args.get(3).map_or(40, |s| s.parse().expect("warm"));
    let path = std::path::Path::new(path);
    let (script, folder) = if path.is_dir() {
        (path.join("main.lua"), Some(path))
    } else {
        (path.to_path_buf(), None)
    };
    let script = std::fs::read_to_string(script).expect("read game");
    let mut vm = build_with(&script, folder, GcMode::GENERATIONAL, SEED, true);
    let mut written: Vec<BTreeSet<usize>> = Vec::new();
    let mut extent = 0;
    for f in 0..warm + frames {
        step(&vm, SEED, f);
        if f + 1 >= warm {
            vm.snapshot().expect("snapshot");
            if f >= warm {
                let set = vm
                    .snapshots()
                    .last_written()
                    .expect("page record")
                    .iter()
                    .flat_map(|r| (r.start / 4096)..(r.end / 4096))
                    .collect();
                written.push(set);
                extent = vm.arena_stats().extent_bytes as usize / 4096;
            }
        }
    }
    let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len().max(1) as f64;
    let w: Vec<usize> = written.iter().map(|s| s.len()).collect();
    let wr: Vec<usize> = written.iter().map(runs).collect();
    println!(
        "extent {extent} pages; written per frame mean {:.0}, runs {:.0}",
        mean(&w),
        mean(&wr)
    );
    println!("| K | hot pages | hot runs | written in hot (faults saved) | written outside (faults left) | copied per save | copy-equivalents (copy 1, fault 2) |");
    println!("|---|---|---|---|---|---|---|");
    for k in [1usize, 2, 3, 4, 8] {
        let (mut hot, mut hr, mut inside, mut outside, mut copied, mut cost) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for i in 8..written.len() {
            let h: BTreeSet<usize> = written[i - k..i].iter().flatten().copied().collect();
            let ins = written[i].intersection(&h).count();
            let out = written[i].len() - ins;
            hot.push(h.len());
            hr.push(runs(&h));
            inside.push(ins);
            outside.push(out);
            copied.push(h.len() + out);
            cost.push(h.len() + out * 3);
        }
        println!(
            "| {k} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} (tracked only: {:.0}) |",
            mean(&hot),
            mean(&hr),
            mean(&inside),
            mean(&outside),
            mean(&copied),
            mean(&cost),
            mean(&w[8..]) * 3.0
        );
    }
}
