//! Snapshot and rollback of arenas of 1, 10 and 100 MiB with 0.01% to 50% of pages written per
//! frame: memcpy of the used bytes (the physical limit), full snapshot, full rollback, and one
//! incremental frame (write, snapshot, write, rollback) with each page tracker available.
//!
//! Prints a markdown summary from criterion's estimates at the end (`benches/README.md`).

use criterion::{BenchmarkId, Criterion};
use luasnap::alloc::{probe_trackers, Arena, TrackerKind, TrackerPreference, PAGE_SIZE};
use luasnap::snap::{RingConfig, Snapshot, SnapshotMode, SnapshotRing};
use std::hint::black_box;
use std::ptr::NonNull;

const SIZES_MIB: [usize; 3] = [1, 10, 100];
const DIRTY: [f64; 5] = [0.0001, 0.001, 0.01, 0.1, 0.5];

/// An arena whose data extent is `mib` MiB, filled like a game heap: mostly small blocks, some
/// large ones. Returns the page-aligned start of each data page, for scattering writes.
fn game_like_arena(mib: usize) -> (Arena, Vec<NonNull<u8>>) {
    let mut a = Arena::new((mib * 2 + 16) << 20).unwrap();
    let target = (mib << 20) as u64;
    let mut i = 0u64;
    while a.stats().extent_bytes < target {
        let size = if i % 50 == 0 {
            40_000
        } else {
            16 + (i as usize * 37) % 200
        };
        let p = a.alloc(size).unwrap();
        // SAFETY: a fresh block of `size` bytes.
        unsafe { p.as_ptr().write_bytes(i as u8, size) };
        i += 1;
    }
    let data = a.state_ranges().data;
    let base = a.base().as_ptr();
    let pages = (data.start..data.end)
        .step_by(PAGE_SIZE)
        // SAFETY: inside the arena's data extent.
        .map(|off| NonNull::new(unsafe { base.add(off) }).unwrap())
        .collect();
    (a, pages)
}

fn touch(pages: &[NonNull<u8>], count: usize, salt: u8) {
    let stride = (pages.len() / count.max(1)).max(1);
    for p in pages.iter().step_by(stride).take(count) {
        // SAFETY: each page lies inside the arena's extent; one byte is written. The byte
        // belongs to a block or free space; either way the arena map is untouched.
        unsafe { p.as_ptr().add(2048).write_volatile(salt) };
    }
}

fn trackers() -> Vec<TrackerKind> {
    let s = probe_trackers();
    let mut v = Vec::new();
    if s.uffd.is_ok() {
        v.push(TrackerKind::Uffd);
    }
    if s.mprotect.is_ok() {
        v.push(TrackerKind::Mprotect);
    }
    v
}

fn bench_full(c: &mut Criterion) {
    let mut g = c.benchmark_group("full");
    g.sample_size(20);
    for mib in SIZES_MIB {
        let (mut arena, _) = game_like_arena(mib);
        let used = arena.state_ranges().total();
        let src: Vec<u8> = arena
            .state_ranges()
            .iter()
            .flat_map(|r| arena.bytes(r).to_vec())
            .collect();
        let mut dst = vec![1u8; used];
        g.throughput(criterion::Throughput::Bytes(used as u64));
        g.bench_function(BenchmarkId::new("memcpy", mib), |b| {
            b.iter(|| dst.copy_from_slice(black_box(&src)))
        });
        let mut snap = Snapshot::capture(&arena);
        g.bench_function(BenchmarkId::new("snapshot", mib), |b| {
            b.iter(|| snap.capture_from(black_box(&arena)))
        });
        g.bench_function(BenchmarkId::new("rollback", mib), |b| {
            b.iter(|| snap.restore(black_box(&mut arena)).unwrap())
        });
    }
    g.finish();
}

fn bench_incremental(c: &mut Criterion) {
    let mut g = c.benchmark_group("incremental_frame");
    g.sample_size(20);
    for kind in trackers() {
        for mib in SIZES_MIB {
            let (mut arena, pages) = game_like_arena(mib);
            let mode = SnapshotMode::Incremental(TrackerPreference::Only(kind));
            let points = DIRTY.iter().map(|f| {
                (
                    format!("{f}"),
                    ((pages.len() as f64 * f).round() as usize).max(1),
                )
            });
            for (label, count) in points.chain([("10pages".to_string(), 10)]) {
                // A fresh ring per point: heavy-write points pause tracking for a while, which
                // must not leak into the next point's measurement.
                let mut ring = SnapshotRing::new(
                    &mut arena,
                    RingConfig {
                        mode,
                        ..RingConfig::default()
                    },
                )
                .unwrap();
                ring.snapshot(&mut arena).unwrap();
                let id = BenchmarkId::new(format!("{kind}/{mib}MiB"), label);
                let mut salt = 0u8;
                g.bench_function(id, |b| {
                    b.iter(|| {
                        salt = salt.wrapping_add(1);
                        touch(&pages, count, salt);
                        let s = ring.snapshot(&mut arena).unwrap();
                        touch(&pages, count, salt ^ 0x80);
                        ring.rollback(&mut arena, s).unwrap();
                    })
                });
            }
        }
    }
    // The same frame with full copies, the baseline incremental mode must beat.
    for mib in SIZES_MIB {
        let (mut arena, pages) = game_like_arena(mib);
        let mut ring = SnapshotRing::new(
            &mut arena,
            RingConfig {
                mode: SnapshotMode::Full,
                ..RingConfig::default()
            },
        )
        .unwrap();
        ring.snapshot(&mut arena).unwrap();
        let count = ((pages.len() as f64 * 0.0001).round() as usize).max(1);
        let mut salt = 0u8;
        g.bench_function(BenchmarkId::new(format!("full/{mib}MiB"), "0.0001"), |b| {
            b.iter(|| {
                salt = salt.wrapping_add(1);
                touch(&pages, count, salt);
                let s = ring.snapshot(&mut arena).unwrap();
                touch(&pages, count, salt ^ 0x80);
                ring.rollback(&mut arena, s).unwrap();
            })
        });
    }
    g.finish();
}

fn mean_ns(path: &str) -> Option<f64> {
    let text =
        std::fs::read_to_string(format!("target/criterion/{path}/new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

fn fmt_ns(ns: Option<f64>) -> String {
    match ns {
        None => "-".into(),
        Some(ns) if ns < 1e3 => format!("{ns:.0} ns"),
        Some(ns) if ns < 1e6 => format!("{:.1} µs", ns / 1e3),
        Some(ns) => format!("{:.2} ms", ns / 1e6),
    }
}

fn summary() {
    println!("\n## Full copies\n\n| used MiB | memcpy | snapshot | rollback | snapshot/memcpy | rollback/memcpy |\n|---|---|---|---|---|---|");
    for mib in SIZES_MIB {
        let m = mean_ns(&format!("full/memcpy/{mib}"));
        let s = mean_ns(&format!("full/snapshot/{mib}"));
        let r = mean_ns(&format!("full/rollback/{mib}"));
        let ratio = |x: Option<f64>| match (x, m) {
            (Some(x), Some(m)) => format!("{:.2}×", x / m),
            _ => "-".into(),
        };
        println!(
            "| {mib} | {} | {} | {} | {} | {} |",
            fmt_ns(m),
            fmt_ns(s),
            fmt_ns(r),
            ratio(s),
            ratio(r)
        );
    }
    println!("\n## One incremental frame (write, snapshot, write, rollback), by share of pages written\n");
    let head: Vec<String> = DIRTY.iter().map(|f| format!("{}%", f * 100.0)).collect();
    println!(
        "| tracker | MiB | {} | 10 pages | 10 pages vs one memcpy of the arena |",
        head.join(" | ")
    );
    println!("|---|---|{}---|---|", "---|".repeat(DIRTY.len()));
    for kind in trackers() {
        for mib in SIZES_MIB {
            let cells: Vec<String> = DIRTY
                .iter()
                .map(|f| fmt_ns(mean_ns(&format!("incremental_frame/{kind}_{mib}MiB/{f}"))))
                .collect();
            let memcpy = mean_ns(&format!("full/memcpy/{mib}"));
            let ten = mean_ns(&format!("incremental_frame/{kind}_{mib}MiB/10pages"));
            let speedup = match (memcpy, ten) {
                (Some(f), Some(i)) => format!("{:.0}× faster", f / i),
                _ => "-".into(),
            };
            println!(
                "| {kind} | {mib} | {} | {} | {speedup} |",
                cells.join(" | "),
                fmt_ns(ten)
            );
        }
    }
    println!("\n| full-copy frame (same loop, full mode) | 1 MiB | 10 MiB | 100 MiB |\n|---|---|---|---|");
    let cells: Vec<String> = SIZES_MIB
        .iter()
        .map(|m| fmt_ns(mean_ns(&format!("incremental_frame/full_{m}MiB/0.0001"))))
        .collect();
    println!("| time | {} |", cells.join(" | "));
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench_full(&mut c);
    bench_incremental(&mut c);
    c.final_summary();
    summary();
}
