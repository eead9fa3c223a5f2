//! Whose pages a game's frame writes: the allocator's size classes and placement groups.
//!
//! `cargo run --release -p luasnap-bridge --example page_owners -- GAME.lua [FRAMES]`
//!
//! Runs the game as the runtime does for heaps of 1 MiB and more (incremental collector,
//! automatic collection stopped; 40 warm-up frames), takes an incremental snapshot after each
//! frame with the tracker always armed, and prints, per owner of the written pages (a span's
//! block size and group, large blocks, the allocator's map, pages the frame added to the
//! extent), the pages written per frame, how many of those have bytes that actually changed,
//! and how many blocks on them changed. Pages written but unchanged point at code that stores
//! what a field already holds; many changed pages with few changed blocks each point at
//! placement (hot blocks spread among cold ones). See `docs/gc.md`, "What writes the pages".

use luasnap_alloc::{PageOwner, PAGE_SIZE};
use luasnap_bridge::GcMode;
use std::collections::BTreeMap;

mod support;
use support::{build, step};

/// The seed of the game's run (its VM and scripted inputs).
const SEED: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    Page(PageOwner),
    Map,
    Fresh,
}

#[derive(Default)]
struct Count {
    written: u64,
    changed: u64,
    blocks: u64,
}

/// Blocks of `size` bytes from the start of the page whose bytes differ.
fn changed_blocks(a: &[u8], b: &[u8], size: usize) -> u64 {
    let mut n = 0;
    let mut last = usize::MAX;
    for g in (0..PAGE_SIZE).step_by(16) {
        if a[g..g + 16] != b[g..g + 16] {
            let block = g / size;
            if block != last {
                n += 1;
                last = block;
            }
        }
    }
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: page_owners GAME.lua [FRAMES]");
    let frames: u64 = args.get(2).map_or(50, |s| s.parse().expect("frames"));
    let script = std::fs::read_to_string(path).expect("read game");
    let mut vm = build(&script, GcMode::INCREMENTAL, SEED);
    vm.gc_collect().expect("collect");
    vm.gc_running(false);
    for f in 0..40 {
        step(&vm, SEED, f);
    }
    vm.snapshot().expect("snapshot");

    let mut counts: BTreeMap<Owner, Count> = BTreeMap::new();
    let mut total = 0u64;
    for f in 40..40 + frames {
        let old_end = vm.arena().state_ranges().data.end;
        let old = vm.arena().bytes(0..old_end).to_vec();
        step(&vm, SEED, f);
        vm.snapshot().expect("snapshot");
        let arena = vm.arena();
        let r = arena.state_ranges();
        let now = arena.bytes(0..r.data.end);
        let runs = vm
            .snapshots()
            .last_written()
            .expect("an incremental snapshot (a tracker works here)")
            .to_vec();
        for off in runs.into_iter().flat_map(|run| run.step_by(PAGE_SIZE)) {
            total += 1;
            let owner = if off < r.data.start {
                Owner::Map
            } else if off >= old_end {
                Owner::Fresh
            } else {
                Owner::Page(arena.page_owner(off))
            };
            let c = counts.entry(owner).or_default();
            c.written += 1;
            if off + PAGE_SIZE > old.len() {
                continue;
            }
            let (a, b) = (&old[off..off + PAGE_SIZE], &now[off..off + PAGE_SIZE]);
            if a != b {
                c.changed += 1;
                if let Owner::Page(PageOwner::Span { block_size, .. }) = owner {
                    // Counted as if the span started on this page: exact for one-page spans,
                    // an estimate for the larger classes' multi-page spans.
                    c.blocks += changed_blocks(a, b, block_size as usize);
                }
            }
        }
    }
    let n = frames as f64;
    println!("pages written per frame: {:.1}", total as f64 / n);
    println!(
        "{:>28} {:>8} {:>8} {:>8}",
        "owner", "written", "changed", "blocks"
    );
    for (owner, c) in &counts {
        let name = match owner {
            Owner::Page(PageOwner::Span { block_size, group }) => {
                format!("span of {block_size} B, group {group}")
            }
            Owner::Page(other) => format!("{other:?}"),
            Owner::Map => "allocator map".into(),
            Owner::Fresh => "new in the extent".into(),
        };
        println!(
            "{name:>28} {:8.1} {:8.1} {:8.1}",
            c.written as f64 / n,
            c.changed as f64 / n,
            c.blocks as f64 / n
        );
    }
}
