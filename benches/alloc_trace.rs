//! The arena allocator against the system allocator on a Lua-like allocation trace.
//!
//! Also prints the arena's loss to rounding and fragmentation at the trace's peak (target:
//! at most 15% of the arena's extent).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use luasnap::alloc::Arena;
use luasnap::snap::Snapshot;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;

#[path = "support/trace.rs"]
mod trace;
use trace::{lua_like_trace, slots, TraceOp};

fn replay_arena(arena: &mut Arena, trace: &[TraceOp], table: &mut [Option<NonNull<u8>>]) {
    for op in trace {
        match *op {
            TraceOp::Alloc { slot, size } => table[slot as usize] = arena.alloc(size as usize),
            TraceOp::Realloc { slot, old, new } => {
                let p = table[slot as usize].unwrap();
                // SAFETY: p is live with size `old`; replaced by the result.
                table[slot as usize] = unsafe { arena.realloc(p, old as usize, new as usize) };
            }
            TraceOp::Free { slot, size } => {
                let p = table[slot as usize].take().unwrap();
                // SAFETY: p is live with its size and dropped from the table.
                unsafe { arena.free(p, size as usize) };
            }
        }
    }
}

fn layout(size: u32) -> Layout {
    Layout::from_size_align(size as usize, 16).unwrap()
}

fn replay_system(trace: &[TraceOp], table: &mut [*mut u8]) {
    for op in trace {
        // SAFETY: the trace allocates before use and frees/reallocs with the size it last asked for.
        unsafe {
            match *op {
                TraceOp::Alloc { slot, size } => table[slot as usize] = System.alloc(layout(size)),
                TraceOp::Realloc { slot, old, new } => {
                    let p = table[slot as usize];
                    table[slot as usize] = System.realloc(p, layout(old), new as usize);
                }
                TraceOp::Free { slot, size } => System.dealloc(table[slot as usize], layout(size)),
            }
        }
    }
}

fn report_loss(trace: &[TraceOp]) {
    let mut arena = Arena::new(1 << 30).unwrap();
    let mut table = vec![None; slots(trace)];
    let (mut peak_extent, mut at_peak, mut peak_live) = (0u64, (0u64, 0u64), 0u64);
    for chunk in trace.chunks(100) {
        replay_arena(&mut arena, chunk, &mut table);
        let s = arena.stats();
        peak_live = peak_live.max(s.bytes_in_use);
        if s.extent_bytes > peak_extent {
            peak_extent = s.extent_bytes;
            at_peak = (s.bytes_in_use, s.bytes_allocated);
            if std::env::var_os("LUASNAP_USAGE").is_some() {
                eprintln!("{:?}", arena.usage());
            }
        }
    }
    let s = arena.stats();
    let pct = |x: u64, of: u64| 100.0 * x as f64 / of as f64;
    eprintln!(
        "arena loss on the trace: peak extent {} KiB vs peak live {} KiB: {:.1}% of the extent",
        peak_extent / 1024,
        peak_live / 1024,
        pct(peak_extent - peak_live, peak_extent)
    );
    eprintln!(
        "  at peak extent {} KiB: rounding {:.1}%, fragmentation {:.1}%, total {:.1}%; at end: total {:.1}% of {} KiB",
        peak_extent / 1024,
        pct(at_peak.1 - at_peak.0, peak_extent),
        pct(peak_extent - at_peak.1, peak_extent),
        pct(peak_extent - at_peak.0, peak_extent),
        pct(s.extent_bytes - s.bytes_in_use, s.extent_bytes),
        s.extent_bytes / 1024,
    );
}

fn bench(c: &mut Criterion) {
    let trace = lua_like_trace(200_000, 20_000, 42);
    report_loss(&trace);
    let n = slots(&trace);
    let mut g = c.benchmark_group("lua_like_trace");
    g.throughput(Throughput::Elements(trace.len() as u64));
    g.sample_size(20);
    // One warm arena, reset to empty before each run by restoring a snapshot of it empty, as
    // the system allocator reuses its warm heap: neither pays first-touch page faults.
    let mut arena = Arena::new(1 << 30).unwrap();
    let empty = Snapshot::capture(&arena);
    g.bench_function("arena", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            let mut table = vec![None; n];
            for _ in 0..iters {
                empty.restore(&mut arena).unwrap();
                table.fill(None);
                let t = std::time::Instant::now();
                replay_arena(&mut arena, black_box(&trace), &mut table);
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("system", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            let mut table = vec![std::ptr::null_mut(); n];
            for _ in 0..iters {
                let t = std::time::Instant::now();
                replay_system(black_box(&trace), &mut table);
                total += t.elapsed();
                // Free what the trace left live so the next run starts clean (not timed).
                let mut live = vec![None; n];
                for op in trace.iter() {
                    match *op {
                        TraceOp::Alloc { slot, size } => live[slot as usize] = Some(size),
                        TraceOp::Realloc { slot, new, .. } => live[slot as usize] = Some(new),
                        TraceOp::Free { slot, .. } => live[slot as usize] = None,
                    }
                }
                for (i, s) in live.iter().enumerate() {
                    if let Some(size) = s {
                        // SAFETY: still live with this size.
                        unsafe { System.dealloc(table[i], layout(*size)) };
                    }
                }
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
