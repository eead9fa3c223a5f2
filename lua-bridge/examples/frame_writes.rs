//! Pages a frame writes against the least it could: its allocation volume plus the pages of
//! older objects it changes.
//!
//! `cargo run --release -p luasnap-bridge --example frame_writes -- GAME.lua [FRAMES] [WARM]`
//!
//! Runs the game (2 players, seed 7) as the runtime does (Lua's generational collector,
//! automatic), with the tracker always armed. Each of FRAMES frames (default 60, after WARM,
//! default 40) runs twice from the same snapshot:
//! - with the collector stopped for that frame: the pages it writes are split by what changed
//!   on them: *mutated* (a block that was live before the frame and still is has other bytes:
//!   the game's own writes to its objects, stacks, the string table), *allocated only* (only
//!   blocks new in the frame changed), the allocator's map. Its *allocation volume* is the
//!   bytes of the blocks new in the frame (still live at its end), in pages;
//! - then rolled back and run as the runtime runs it: the pages written, of which pages whose
//!   bytes did not change.
//!
//! The floor is allocation volume plus mutated pages: what a frame must write if its new
//! objects were packed on pages of their own and nothing else were touched. Issue 24 asks the
//! runtime's pages within 1.5× of it. Page counts do not depend on the machine's load.

use luasnap_alloc::{Arena, PageOwner, SpanBlocks, PAGE_SIZE};
use luasnap_bridge::{GcMode, Vm};

mod support;
use support::{build, step};

/// The seed of the game's run (its VM and scripted inputs).
const SEED: u64 = 7;
use std::collections::HashMap;

/// Each span's blocks, by head page offset, and which offsets hold large blocks.
struct Liveness {
    spans: HashMap<usize, SpanBlocks>,
    large: Vec<bool>,
}

fn liveness(arena: &Arena) -> Liveness {
    let data = arena.state_ranges().data;
    let mut spans = HashMap::new();
    let mut large = vec![false; data.end / PAGE_SIZE + 1];
    for off in data.step_by(PAGE_SIZE) {
        match arena.page_owner(off) {
            PageOwner::Span { .. } => {
                if let Some(s) = arena.span_blocks(off) {
                    spans.insert(off, s);
                }
            }
            PageOwner::Large => large[off / PAGE_SIZE] = true,
            _ => {}
        }
    }
    Liveness { spans, large }
}

/// What the stopped frame wrote, per frame.
#[derive(Default)]
struct Stopped {
    mutated: f64,
    allocated_only: f64,
    map: f64,
    new_bytes: f64,
}

/// Pages written by the frame run with the collector stopped, classified; `before` is the
/// arena's bytes and `live` its blocks before the frame.
fn classify(vm: &Vm, before: &[u8], live: &Liveness, out: &mut Stopped) {
    let arena = vm.arena();
    let data_start = arena.state_ranges().data.start;
    let now = arena.bytes(0..arena.state_ranges().data.end);
    let after = liveness(arena);
    // Bytes of blocks new in the frame.
    for (off, s) in &after.spans {
        let old = live.spans.get(off).filter(|o| o.block_size == s.block_size);
        for (i, &l) in s.live.iter().enumerate() {
            if l && !old.is_some_and(|o| o.live[i]) {
                out.new_bytes += f64::from(s.block_size);
            }
        }
    }
    for (p, &l) in after.large.iter().enumerate() {
        if l && !live.large.get(p).copied().unwrap_or(false) {
            out.new_bytes += PAGE_SIZE as f64;
        }
    }
    let runs = vm.snapshots().last_written().expect("tracked").to_vec();
    for off in runs.into_iter().flat_map(|r| r.step_by(PAGE_SIZE)) {
        if off < data_start {
            out.map += 1.0;
            continue;
        }
        let page = off..off + PAGE_SIZE;
        let (Some(a), Some(b)) = (before.get(page.clone()), now.get(page)) else {
            out.allocated_only += 1.0;
            continue;
        };
        let mutated = match after
            .spans
            .iter()
            .find(|(h, s)| (**h..**h + s.live.len() * s.block_size as usize).contains(&off))
        {
            Some((head, s)) => {
                let old = live
                    .spans
                    .get(head)
                    .filter(|o| o.block_size == s.block_size);
                let size = s.block_size as usize;
                (0..s.live.len()).any(|i| {
                    let (lo, hi) = (head + i * size, head + (i + 1) * size);
                    let (lo, hi) = (lo.max(off), hi.min(off + PAGE_SIZE));
                    lo < hi
                        && s.live[i]
                        && old.is_some_and(|o| o.live[i])
                        && a[lo - off..hi - off] != b[lo - off..hi - off]
                })
            }
            // A large block live before, or a page that left a span: changed bytes count.
            None => live.large.get(off / PAGE_SIZE).copied().unwrap_or(false) && a != b,
        };
        if mutated {
            out.mutated += 1.0;
        } else {
            out.allocated_only += 1.0;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: frame_writes GAME.lua [FRAMES] [WARM]");
    let frames: u64 = args.get(2).map_or(60, |s| s.parse().expect("frames"));
    let warm: u64 = args
        .get(3)
        .map_or(40, |s| s.parse().expect("warm-up frames"));
    let script = std::fs::read_to_string(path).expect("read game");
    let mut vm = build(&script, GcMode::GENERATIONAL, SEED);
    for f in 0..warm {
        step(&vm, SEED, f);
    }
    let mut id = vm.snapshot().expect("snapshot");
    let mut stopped = Stopped::default();
    let (mut written, mut unchanged) = (0.0, 0.0);
    for f in warm..warm + frames {
        let before = vm
            .arena()
            .bytes(0..vm.arena().state_ranges().data.end)
            .to_vec();
        let live = liveness(vm.arena());
        vm.gc_running(false);
        step(&vm, SEED, f);
        vm.snapshot().expect("snapshot");
        classify(&vm, &before, &live, &mut stopped);
        vm.rollback(id).expect("rollback");
        // A rollback leaves the pages it restored open for the frames re-simulated after it
        // (docs/gc.md, "Where a rollback's time goes"): a snapshot now arms them again, so
        // the pages counted below are the frame's own writes, not the restore's (without it
        // the count took in about 300 restored pages a frame and read 1.68× the floor).
        vm.snapshot().expect("snapshot");
        vm.gc_running(true);
        step(&vm, SEED, f);
        id = vm.snapshot().expect("snapshot");
        let now = vm.arena().bytes(0..vm.arena().state_ranges().data.end);
        for off in vm
            .snapshots()
            .last_written()
            .expect("tracked")
            .iter()
            .flat_map(|r| r.clone().step_by(PAGE_SIZE))
        {
            written += 1.0;
            let page = off..off + PAGE_SIZE;
            if before
                .get(page.clone())
                .is_some_and(|a| now.get(page) == Some(a))
            {
                unchanged += 1.0;
            }
        }
    }
    let n = frames as f64;
    let alloc_pages = stopped.new_bytes / n / PAGE_SIZE as f64;
    let floor = alloc_pages + stopped.mutated / n;
    let name = std::path::Path::new(path)
        .file_stem()
        .map_or(path.clone(), |s| s.to_string_lossy().into_owned());
    println!("| game | allocation volume, pages | collector stopped: mutated / allocated only / map | floor | runtime: written (unchanged) | written / floor | extent pages |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {name} | {alloc_pages:.0} | {:.0} / {:.0} / {:.0} | {floor:.0} | {:.0} ({:.0}) | {:.2} | {} |",
        stopped.mutated / n,
        stopped.allocated_only / n,
        stopped.map / n,
        written / n,
        unchanged / n,
        written / n / floor,
        vm.arena().state_ranges().data.len() / PAGE_SIZE,
    );
}
