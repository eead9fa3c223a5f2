//! `luasnap gc-pages`: how the collector's mode changes the pages written per frame.
//!
//! Incremental snapshots copy the pages written since the last one, and Lua's collector
//! writes to every object it marks or sweeps; so the GC mode decides whether they pay off.

use luasnap::bridge::{workloads::HEAP_BUILDER, GcMode, Value, Vm};
use std::time::Instant;

/// Options of `luasnap gc-pages`.
#[derive(Debug, clap::Args)]
pub struct GcPagesArgs {
    /// Heap sizes in MB of live Lua objects, each 1..=4096 (`--sizes 1 10 50` or
    /// `--sizes 1,10,50`).
    #[arg(long, num_args = 1.., value_delimiter = ',', default_values_t = [1usize, 10, 50], value_parser = crate::size::parse_heap_mb)]
    pub sizes: Vec<usize>,
    /// Frames measured per case (after 30 warm-up frames).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub frames: u32,
    /// Garbage made per frame, in bytes (e.g. 64K).
    #[arg(long, default_value = "64K", value_parser = crate::size::parse_size)]
    pub garbage: usize,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prints, per heap size and GC mode, the pages written per light frame.
pub fn run(args: GcPagesArgs) -> Result<(), String> {
    let modes: [(&str, GcMode); 4] = [
        ("incremental (default)", GcMode::INCREMENTAL),
        (
            "incremental, pause 400",
            GcMode::Incremental {
                pause: Some(400),
                step_multiplier: None,
                step_size: None,
            },
        ),
        ("generational (default)", GcMode::GENERATIONAL),
        ("stopped (no collection at all)", GcMode::INCREMENTAL),
    ];
    println!(
        "garbage per frame: {} KiB, {} frames measured\n",
        args.garbage / 1024,
        args.frames
    );
    println!("| heap MB | GC mode | extent pages | written pages per frame: mean | median | p90 | max | mean share | frame ms (mean) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &mb in &args.sizes {
        for (i, (label, mode)) in modes.iter().enumerate() {
            let vm = Vm::builder()
                .capacity((mb * 3 + 64) << 20)
                .deterministic(1)
                .full_copy_above(1.0)
                .gc(*mode)
                .build()
                .map_err(|e| e.to_string())?;
            let mut vm = vm;
            vm.exec(
                format!("H = (function() {HEAP_BUILDER} end)()"),
                "heap_builder",
            )
            .map_err(|e| e.to_string())?;
            vm.call::<()>("H.build", &[Value::Integer((mb << 20) as i64)])
                .map_err(|e| e.to_string())?;
            let stopped = i == 3;
            vm.gc_running(!stopped);
            let mut pages = Vec::new();
            let mut times = Vec::new();
            for f in 0..(30 + args.frames) {
                let t = Instant::now();
                vm.call::<()>("H.frame", &[Value::Integer(args.garbage as i64)])
                    .map_err(|e| e.to_string())?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                vm.snapshot().map_err(|e| e.to_string())?;
                if f >= 30 {
                    pages.push(vm.snapshots().stats().last_dirty_pages as f64);
                }
            }
            let extent = vm.snapshots().stats().base_bytes / luasnap::alloc::PAGE_SIZE;
            let mean = pages.iter().sum::<f64>() / pages.len() as f64;
            let max = pages.iter().cloned().fold(0.0, f64::max);
            let med = median(&mut pages);
            let p90 = pages[pages.len() * 9 / 10];
            let tmean = times.iter().sum::<f64>() / times.len() as f64;
            println!(
                "| {mb} | {label} | {extent} | {mean:.0} | {med:.0} | {p90:.0} | {max:.0} | {:.1}% | {tmean:.2} |",
                100.0 * mean / extent as f64,
            );
        }
    }
    Ok(())
}
