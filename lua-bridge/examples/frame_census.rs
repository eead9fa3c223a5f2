//! What changed on each page a frame writes, as the runtime runs the game.
//!
//! `cargo run --release -p luasnap-bridge --example frame_census -- GAME.lua [FRAMES] [WARM]`
//!
//! Runs the game (2 players, seed 7) as the runtime does (Lua's generational collector,
//! automatic, quiet; minor collections after `MINORMUL` percent of growth when that variable is
//! set, Lua's default otherwise; a folder game bundled first, see `benches/README.md`), with the tracker always
//! armed, and snapshots after each of FRAMES frames (default 40, after WARM, default 40). Each
//! page the frame wrote is put in one class by comparing its blocks before and after:
//! - *collector only*: the only changed blocks are table headers (48-byte blocks tagged as
//!   tables) whose colour, age or gray-list link changed (`marked`, `gclist`): the collector
//!   marked or aged them, or a write barrier touched them, and nothing else on the page changed
//!   (apart from blocks allocated or freed in the frame, counted as a class of their own);
//! - *mutated (n blocks)*: n blocks live before and after have other bytes;
//! - *new only*, *freed only*: only blocks allocated, or freed, in the frame;
//! - *free slots only*: no live block changed, none was allocated or freed, but bytes between
//!   them did: blocks made and freed within the frame (young objects a collection freed), or
//!   free-list links;
//! - *unchanged*: written, but every byte of the page is as it was (a store of the value a
//!   field held, or a change undone within the frame).
//!
//! A block counts on every page it overlaps, by its bytes on that page (blocks of most size
//! classes straddle page boundaries inside their span).
//! - the allocator's map, and pages of large blocks.
//!
//! Then the sparse pages (one or two changed blocks), by the changed blocks' size and kind (the
//! type tag at offset 8; `raw` for blocks that are not Lua objects: hash and array parts,
//! stacks, strings' bodies are inside their objects), where placing hot blocks together could
//! save pages; and the extent's split at the end (live blocks, free slots in spans, free runs).
//! Page counts do not depend on the machine's load. See `docs/gc.md`, "Where a churning
//! game's writes go".

use luasnap_alloc::{Arena, PageOwner, SpanBlocks, PAGE_SIZE};
use luasnap_bridge::runtime::scripted_input;
use luasnap_bridge::{GcMode, Table, Value, Vm};
use std::collections::{BTreeMap, HashMap};

fn build(script: &str) -> Vm {
    let vm = Vm::builder()
        .capacity(2 << 30)
        .deterministic(7)
        .full_copy_above(1.0)
        .quiet_collections(true)
        .gc(GcMode::Generational {
            minor_multiplier: std::env::var("MINORMUL")
                .ok()
                .map(|s| s.parse().expect("MINORMUL")),
            major_minor: None,
            minor_major: None,
        })
        .build()
        .expect("vm");
    {
        let g = vm.load(script, "=game").expect("load");
        vm.set("G", &g).expect("set G");
    }
    vm.call::<()>("G.init", &[Value::Integer(2), Value::Integer(7)])
        .expect("init");
    vm
}

fn step(vm: &Vm, f: u64) {
    let inputs = Table::from_array((0..2).map(|p| Value::Integer(scripted_input(7, f, p) as i64)));
    vm.call::<()>("G.step", &[Value::Table(inputs)])
        .expect("step");
}

/// Every span page's blocks, by page offset (each page of a span maps to the whole span).
fn spans(arena: &Arena) -> HashMap<usize, SpanBlocks> {
    let data = arena.state_ranges().data;
    let mut out = HashMap::new();
    for off in data.step_by(PAGE_SIZE) {
        if let PageOwner::Span { .. } = arena.page_owner(off) {
            if let Some(s) = arena.span_blocks(off) {
                out.insert(off, s);
            }
        }
    }
    out
}

/// Lua's type tag at offset 8 of a block (`CommonHeader`: `next`, then `tt`, `marked`).
fn kind(block: &[u8]) -> &'static str {
    match block.get(8) {
        Some(0x04) => "short string",
        Some(0x14) => "long string",
        Some(0x05) => "table",
        Some(0x06) => "Lua closure",
        Some(0x26) => "C closure",
        Some(0x07) => "userdata",
        Some(0x08) => "thread",
        Some(0x09) => "upvalue",
        Some(0x0a) => "prototype",
        _ => "raw",
    }
}

/// A 48-byte table whose bytes differ only in `marked` (offset 9) and `gclist` (40..48).
fn collector_only(size: usize, a: &[u8], b: &[u8]) -> bool {
    size == 48 && kind(b) == "table" && a[..9] == b[..9] && a[10..40] == b[10..40]
}

#[derive(Default)]
struct Census {
    pages: BTreeMap<String, f64>,
    sparse: BTreeMap<String, f64>,
}

impl Census {
    /// Classifies one written page at offset `off` of the arena.
    fn page(&mut self, off: usize, data_start: usize, old: &Spans, new: &Spans) {
        let class = if off < data_start {
            "allocator map".to_string()
        } else {
            match new.blocks.get(&off) {
                None => "large block or free run".to_string(),
                Some(s) => self.span_page(off, data_start, old, new, s),
            }
        };
        *self.pages.entry(class).or_default() += 1.0;
    }

    fn span_page(
        &mut self,
        off: usize,
        data_start: usize,
        old: &Spans,
        new: &Spans,
        s: &SpanBlocks,
    ) -> String {
        let head = data_start + s.head_page as usize * PAGE_SIZE;
        let size = s.block_size as usize;
        let before = old
            .blocks
            .get(&off)
            .filter(|o| o.block_size == s.block_size && o.head_page == s.head_page);
        let (mut new_blocks, mut freed, mut gc_only) = (0, 0, true);
        let mut changed = Vec::new();
        let page = off..off + PAGE_SIZE;
        for (i, &live) in s.live.iter().enumerate() {
            let lo = head + i * size;
            // A block counts on every page it overlaps, by its bytes on that page: a block
            // that starts on the page before and changed only here changed this page.
            if lo + size <= page.start || lo >= page.end {
                continue;
            }
            let hi = (lo + size).min(new.bytes.len()).min(old.bytes.len());
            let (a, b) = (lo.max(page.start), hi.min(page.end));
            let was = before.is_some_and(|o| o.live[i]);
            match (was, live) {
                (false, true) => new_blocks += 1,
                (true, false) => freed += 1,
                (true, true) if a < b && old.bytes[a..b] != new.bytes[a..b] => {
                    let (x, y) = (&old.bytes[lo..hi], &new.bytes[lo..hi]);
                    gc_only &= collector_only(size, x, y);
                    changed.push(format!("{size} B {}", kind(y)));
                }
                _ => {}
            }
        }
        if changed.len() <= 2 {
            for k in &changed {
                *self.sparse.entry(k.clone()).or_default() += 1.0 / changed.len() as f64;
            }
        }
        match changed.len() {
            0 if new_blocks > 0 => "new only".into(),
            0 if freed > 0 => "freed only".into(),
            0 if page.end <= old.bytes.len()
                && old.bytes[page.clone()] == new.bytes[page.clone()] =>
            {
                "unchanged".into()
            }
            // Only bytes outside live blocks differ: blocks made and freed within the frame
            // (young objects a collection freed), or free-list links.
            0 => "free slots only".into(),
            _ if gc_only && new_blocks + freed == 0 => "collector only (table headers)".into(),
            _ if gc_only => "collector's table headers + new/freed".into(),
            n if n > 4 => "mutated (more than 4 blocks)".into(),
            n => format!("mutated ({n} blocks)"),
        }
    }
}

/// The arena's bytes and span blocks at one moment.
struct Spans {
    bytes: Vec<u8>,
    blocks: HashMap<usize, SpanBlocks>,
}

fn state(vm: &Vm) -> Spans {
    let arena = vm.arena();
    Spans {
        bytes: arena.bytes(0..arena.state_ranges().data.end).to_vec(),
        blocks: spans(arena),
    }
}

fn print_sorted(title: &str, map: &BTreeMap<String, f64>, n: f64, rows: usize) {
    println!("{title}");
    let mut v: Vec<_> = map.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    for (k, x) in v.into_iter().take(rows) {
        println!("  {k:>34} {:8.1}", x / n);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: frame_census GAME.lua [FRAMES] [WARM]");
    let frames: u64 = args.get(2).map_or(40, |s| s.parse().expect("frames"));
    let warm: u64 = args
        .get(3)
        .map_or(40, |s| s.parse().expect("warm-up frames"));
    let script = std::fs::read_to_string(path).expect("read game");
    let mut vm = build(&script);
    for f in 0..warm {
        step(&vm, f);
    }
    vm.snapshot().expect("snapshot");
    let mut census = Census::default();
    let mut written = 0.0;
    for f in warm..warm + frames {
        let old = state(&vm);
        step(&vm, f);
        vm.snapshot().expect("snapshot");
        let new = state(&vm);
        let data_start = vm.arena().state_ranges().data.start;
        let runs = vm.snapshots().last_written().expect("tracked").to_vec();
        for off in runs.into_iter().flat_map(|r| r.step_by(PAGE_SIZE)) {
            written += 1.0;
            census.page(off, data_start, &old, &new);
        }
    }
    let n = frames as f64;
    println!("pages written per frame: {:.1}", written / n);
    print_sorted("by what changed on them:", &census.pages, n, 20);
    print_sorted(
        "pages with one or two changed blocks, by the blocks' size and kind:",
        &census.sparse,
        n,
        12,
    );
    let u = vm.arena().usage();
    let pages = |b: u64| b / PAGE_SIZE as u64;
    println!(
        "extent at the end: {} pages: live small blocks {}, large blocks {}, free slots in spans {}, span tails {}, free runs {}",
        vm.arena().state_ranges().data.len() / PAGE_SIZE,
        pages(u.small_blocks),
        pages(u.large_blocks),
        pages(u.span_free),
        pages(u.span_tails),
        pages(u.free_runs),
    );
}
