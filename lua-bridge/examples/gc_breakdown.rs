//! Who writes the pages of a frame: the game, the collector, or the allocator's reuse of holes.
//!
//! `cargo run --release -p luasnap-bridge --example gc_breakdown -- GAME.lua [FRAMES]`
//!
//! Runs the game with the tracker always armed (no full-copy fallback, so every count is the
//! real number of pages written) under several collector settings and prints, per setting,
//! the median pages written per frame, split into pages that were already in the extent before
//! the frame ("old") and pages the frame added to the extent ("fresh").

use luasnap_bridge::{GcMode, Vm};

mod support;
use support::{build, step};

/// The seed of the game's run (its VM and scripted inputs).
const SEED: u64 = 1;

struct Counts {
    old: Vec<usize>,
    fresh: Vec<usize>,
}

impl Counts {
    fn new() -> Counts {
        Counts {
            old: Vec::new(),
            fresh: Vec::new(),
        }
    }
    fn median(v: &[usize]) -> usize {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
    fn push(&mut self, total: usize, grown: usize) {
        self.old.push(total - grown.min(total));
        self.fresh.push(grown.min(total));
    }
    fn line(&self) -> String {
        let tot: Vec<usize> = self
            .old
            .iter()
            .zip(&self.fresh)
            .map(|(a, b)| a + b)
            .collect();
        let mean = tot.iter().sum::<usize>() as f64 / tot.len().max(1) as f64;
        format!(
            "median {:5} (old {:5} + fresh {:4}), mean {:7.1}, max {:5}",
            Counts::median(&tot),
            Counts::median(&self.old),
            Counts::median(&self.fresh),
            mean,
            tot.iter().max().copied().unwrap_or(0)
        )
    }
}

fn extent_pages(vm: &Vm) -> usize {
    vm.arena_stats().extent_bytes as usize / 4096
}

fn snap(vm: &mut Vm, before: usize, c: &mut Counts) {
    let after = extent_pages(vm);
    vm.snapshot().expect("snapshot");
    c.push(
        vm.snapshots().stats().last_dirty_pages,
        after.saturating_sub(before),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: gc_breakdown GAME.lua [FRAMES]");
    let frames: u64 = args.get(2).map_or(100, |s| s.parse().expect("frames"));
    let script = std::fs::read_to_string(path).expect("read game");
    let warm = 40u64;

    let gen = GcMode::GENERATIONAL;
    let settings: [(&str, GcMode); 2] =
        [("generational", gen), ("incremental", GcMode::INCREMENTAL)];
    for (label, mode) in settings {
        let mut vm = build(&script, mode, SEED);
        vm.gc_collect().expect("collect");
        for f in 0..warm {
            step(&vm, SEED, f);
        }
        vm.snapshot().expect("snapshot");
        let mut c = Counts::new();
        for f in warm..warm + frames {
            let before = extent_pages(&vm);
            step(&vm, SEED, f);
            snap(&mut vm, before, &mut c);
        }
        println!(
            "{label:>34}: {} | extent {} pages, heap {} KiB",
            c.line(),
            extent_pages(&vm),
            vm.lua_memory() / 1024
        );
    }

    // The collector stopped: the game's own writes plus where its new objects land.
    {
        let mut vm = build(&script, gen, SEED);
        vm.gc_collect().expect("collect");
        for f in 0..warm {
            step(&vm, SEED, f);
        }
        vm.gc_collect().expect("collect");
        vm.gc_running(false);
        vm.snapshot().expect("snapshot");
        let (mut early, mut late) = (Counts::new(), Counts::new());
        for f in warm..warm + frames {
            let before = extent_pages(&vm);
            step(&vm, SEED, f);
            if f < warm + 5 {
                snap(&mut vm, before, &mut early);
            } else {
                snap(&mut vm, before, &mut late);
            }
        }
        println!(
            "{:>34}: {}",
            "stopped, 5 frames after a collect",
            early.line()
        );
        println!("{:>34}: {}", "stopped, later frames", late.line());
        println!(
            "{:>34}  extent {} pages, heap {} KiB",
            "",
            extent_pages(&vm),
            vm.lua_memory() / 1024
        );
    }

    // Stopped during the step; the collector's work measured on its own, after the step.
    for every in [1u64, 4, 16] {
        let mut vm = build(&script, gen, SEED);
        vm.gc_collect().expect("collect");
        vm.gc_running(false);
        for f in 0..warm {
            step(&vm, SEED, f);
            if f % every == 0 {
                vm.gc_step().expect("gc step");
            }
        }
        vm.snapshot().expect("snapshot");
        let (mut game, mut gc) = (Counts::new(), Counts::new());
        for f in warm..warm + frames {
            let before = extent_pages(&vm);
            step(&vm, SEED, f);
            snap(&mut vm, before, &mut game);
            if f % every == 0 {
                let before = extent_pages(&vm);
                vm.gc_step().expect("gc step");
                snap(&mut vm, before, &mut gc);
            }
        }
        println!(
            "{:>34}: {}",
            format!("gen, minor step every {every}: step"),
            game.line()
        );
        println!("{:>34}: {}", "collector", gc.line());
        println!(
            "{:>34}  extent {} pages, heap {} KiB",
            "",
            extent_pages(&vm),
            vm.lua_memory() / 1024
        );
    }
}
