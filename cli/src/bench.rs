//! `luasnap bench`: arena snapshots against the graph serializer on game-like heaps.

use luasnap::bridge::{workloads::HEAP_BUILDER, GcMode, SnapshotMode, Value, Vm};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `luasnap bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Heap sizes, in MB of live Lua objects, each 1..=4096 (`--sizes 1 10 100` or
    /// `--sizes 1,10,100`).
    #[arg(long, num_args = 1.., value_delimiter = ',', default_values_t = [1usize, 10, 100], value_parser = crate::size::parse_heap_mb)]
    pub sizes: Vec<usize>,
    /// One JSON object per size, one per line.
    #[arg(long)]
    pub json: bool,
    /// Also draw cost against heap size as an SVG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Time everything (the memcpy reference included) by the thread's CPU time instead of
    /// the wall clock: on a shared machine, time spent waiting for a core is not counted.
    #[arg(long)]
    pub cpu_time: bool,
}

/// The clock every measurement of a run reads (see `BenchArgs::cpu_time`).
#[derive(Debug, Clone, Copy)]
enum Clock {
    Wall,
    ThreadCpu,
}

impl Clock {
    /// Milliseconds `f` takes on this clock.
    fn ms(self, f: impl FnOnce()) -> f64 {
        match self {
            Clock::Wall => {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            }
            Clock::ThreadCpu => {
                let t = cpu_time::ThreadTime::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            }
        }
    }
}

/// One size's measurements.
#[derive(Debug, Clone)]
pub struct Row {
    heap_mb: usize,
    arena_bytes: usize,
    memcpy_ms: f64,
    /// The same memcpy into each of a window's buffers in turn, as snapshots are taken.
    memcpy_window_ms: f64,
    snapshot_full_ms: f64,
    rollback_full_ms: f64,
    incremental_frame_us: f64,
    /// The same frame per copy mode: full, incremental, automatic.
    frames: [Frame; 3],
    /// A frame's Lua work (two `H.touch` calls) without snapshots, µs.
    touch_us: f64,
    persist_ms: f64,
    unpersist_ms: f64,
    persist_bytes: usize,
    tracker: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time_ms(clock: Clock, runs: usize, mut f: impl FnMut()) -> f64 {
    median((0..runs).map(|_| clock.ms(&mut f)).collect())
}

/// One copy mode's frame: a snapshot and a rollback with about 10 pages written before each.
#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    /// The whole frame, µs (median of rounds of 20 frames).
    total_us: f64,
    /// Its Lua work (`H.touch`, write faults included), µs.
    touch_us: f64,
}

const MODES: [(&str, SnapshotMode); 3] = [
    ("full", SnapshotMode::Full),
    (
        "incremental",
        SnapshotMode::Incremental(luasnap::alloc::TrackerPreference::Auto),
    ),
    (
        "auto",
        SnapshotMode::Auto(luasnap::alloc::TrackerPreference::Auto),
    ),
];

/// `H.touch(10)`: writes about 10 pages of the heap; its time is added to `acc` (ms).
fn touch(vm: &Vm, clock: Clock, acc: &mut f64) -> Result<(), luasnap::bridge::VmError> {
    let mut r = Ok(());
    *acc += clock.ms(|| r = vm.call::<()>("H.touch", &[Value::Integer(10)]));
    r
}

/// A round of 20 frames of `H.touch(10)`, a snapshot, `H.touch(10)` and a rollback to it (after
/// 10 untimed frames: a ring's first snapshot copies everything, and whole copies need a window
/// of buffers mapped); with `snapshots` false, the touches alone. Per frame, µs: the whole frame and the mean touch.
fn frame_round(vm: &mut Vm, clock: Clock, snapshots: bool) -> Result<(f64, f64), String> {
    let mut touch_ms = 0.0;
    let frame = |vm: &mut Vm, touch_ms: &mut f64| {
        touch(vm, clock, touch_ms)?;
        if !snapshots {
            return touch(vm, clock, touch_ms);
        }
        let id = vm.snapshot()?;
        touch(vm, clock, touch_ms)?;
        vm.rollback(id)
    };
    // Warm-up: the first snapshot copies everything, and a window of buffers is mapped.
    (0..10)
        .try_for_each(|_| frame(vm, &mut touch_ms))
        .map_err(|e| e.to_string())?;
    touch_ms = 0.0;
    let mut result = Ok(());
    let total_ms = clock.ms(|| result = (0..20).try_for_each(|_| frame(vm, &mut touch_ms)));
    result.map_err(|e| e.to_string())?;
    Ok((total_ms * 1e3 / 20.0, touch_ms * 1e3 / 40.0))
}

/// Frames in each copy mode and without snapshots, in alternating rounds (so that the machine's
/// drift hits every mode alike); medians over the rounds.
fn frames_by_mode(vm: &mut Vm, clock: Clock) -> Result<([Frame; 3], f64), String> {
    let rounds = 5;
    let mut totals = vec![Vec::new(); MODES.len()];
    let mut touches = vec![Vec::new(); MODES.len()];
    let mut plain = Vec::new();
    for _ in 0..rounds {
        for (i, (_, mode)) in MODES.iter().enumerate() {
            vm.reconfigure_snapshots(*mode, 8)
                .map_err(|e| e.to_string())?;
            let (total, touch) = frame_round(vm, clock, true)?;
            totals[i].push(total);
            touches[i].push(touch);
        }
        vm.reconfigure_snapshots(SnapshotMode::Full, 8)
            .map_err(|e| e.to_string())?;
        plain.push(frame_round(vm, clock, false)?.1);
    }
    let mut out = [Frame::default(); 3];
    for (i, f) in out.iter_mut().enumerate() {
        f.total_us = median(std::mem::take(&mut totals[i]));
        f.touch_us = median(std::mem::take(&mut touches[i]));
    }
    Ok((out, median(plain)))
}

fn measure(mb: usize, clock: Clock, progress: &dyn Fn(&str)) -> Result<Row, String> {
    let e = |e: luasnap::bridge::VmError| e.to_string();
    let vm = Vm::builder()
        .capacity((mb * 4 + 256) << 20)
        .deterministic(1)
        .snapshot_mode(SnapshotMode::Incremental(
            luasnap::alloc::TrackerPreference::Auto,
        ))
        .gc(GcMode::GENERATIONAL)
        .build()
        .map_err(e)?;
    progress(&format!("{mb} MB: building the heap"));
    vm.exec(
        format!("H = (function() {HEAP_BUILDER} end)()"),
        "=heap_builder",
    )
    .map_err(e)?;
    vm.call::<()>("H.build", &[Value::Integer((mb << 20) as i64)])
        .map_err(e)?;
    vm.gc_collect().map_err(e)?;
    let arena_bytes = vm.arena().state_ranges().total();
    let runs = if mb >= 100 { 5 } else { 15 };

    progress(&format!("{mb} MB: memcpy and full snapshots"));
    let src: Vec<u8> = vec![7; arena_bytes];
    let mut dst: Vec<u8> = vec![1; arena_bytes];
    let memcpy_ms = time_ms(clock, runs, || {
        dst.copy_from_slice(std::hint::black_box(&src))
    });
    // A snapshot's destination is the buffer the window's oldest snapshot used: written a
    // window of copies ago, so no longer in the caches near the core, where the memcpy above
    // finds its one destination. The same copy into the ring's 5 buffers in turn (window 4).
    let mut dsts: Vec<Vec<u8>> = (0..4).map(|_| vec![1; arena_bytes]).collect();
    dsts.push(dst);
    let mut turn = 0;
    let memcpy_window_ms = time_ms(clock, runs, || {
        turn = (turn + 1) % dsts.len();
        dsts[turn].copy_from_slice(std::hint::black_box(&src))
    });
    drop(dsts);
    // Full copies through the VM's snapshot ring (full mode), as a game would use them.
    let mut vm = vm;
    vm.reconfigure_snapshots(SnapshotMode::Full, 4).map_err(e)?;
    let mut last = vm.snapshot().map_err(e)?;
    // Warm up a whole window of buffers first: a first copy into fresh pages pays page faults.
    for _ in 0..6 {
        last = vm.snapshot().map_err(e)?;
        vm.rollback(last).map_err(e)?;
    }
    let snapshot_full_ms = time_ms(clock, runs, || last = vm.snapshot().expect("snapshot"));
    let rollback_full_ms = time_ms(clock, runs, || vm.rollback(last).expect("rollback"));
    vm.reconfigure_snapshots(
        SnapshotMode::Incremental(luasnap::alloc::TrackerPreference::Auto),
        8,
    )
    .map_err(e)?;
    vm.snapshot().map_err(e)?;

    progress(&format!("{mb} MB: frames in each copy mode"));
    let (frames, touch_us) = frames_by_mode(&mut vm, clock)?;
    let incremental_frame_us = frames[1].total_us;
    vm.reconfigure_snapshots(MODES[1].1, 8).map_err(e)?;
    vm.snapshot().map_err(e)?;
    let tracker = vm.snapshot_strategy().to_string();

    progress(&format!("{mb} MB: graph persist and load"));
    // Like the copies above, which run into warm buffers, both directions run warm: before each
    // run (untimed) the previous run's leftovers are collected, so a load reuses the pages the
    // last copy occupied instead of faulting in fresh ones.
    let mut bytes = Vec::new();
    let mut persists = Vec::new();
    let mut loads = Vec::new();
    for _ in 0..runs.min(9) {
        vm.gc_collect().map_err(e)?;
        let mut r = Ok(Vec::new());
        persists.push(clock.ms(|| r = vm.persist("H")));
        bytes = r.map_err(|e| e.to_string())?;
    }
    for _ in 0..runs.min(9) {
        vm.exec("H2 = nil", "=bench").map_err(e)?;
        vm.gc_collect().map_err(e)?;
        let mut r = Ok(());
        loads.push(
            clock.ms(|| r = vm.unpersist(&bytes, "H2", luasnap::bridge::persist::Trust::Own)),
        );
        r.map_err(|e| e.to_string())?;
    }
    let (persist_ms, unpersist_ms) = (median(persists), median(loads));
    Ok(Row {
        heap_mb: mb,
        arena_bytes,
        memcpy_ms,
        memcpy_window_ms,
        snapshot_full_ms,
        rollback_full_ms,
        incremental_frame_us,
        frames,
        touch_us,
        persist_ms,
        unpersist_ms,
        persist_bytes: bytes.len(),
        tracker,
    })
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let tty = std::io::stderr().is_terminal();
    let progress = |m: &str| {
        if tty {
            eprint!("\r\x1b[2K  {m}...");
        }
    };
    let clock = if args.cpu_time {
        Clock::ThreadCpu
    } else {
        Clock::Wall
    };
    let mut rows = Vec::new();
    for &mb in &args.sizes {
        let row = measure(mb, clock, &progress)?;
        if args.json {
            println!(
                "{}",
                json!({
                    "heap_mb": row.heap_mb, "arena_bytes": row.arena_bytes, "memcpy_ms": row.memcpy_ms, "memcpy_window_ms": row.memcpy_window_ms,
                    "snapshot_full_ms": row.snapshot_full_ms, "rollback_full_ms": row.rollback_full_ms,
                    "incremental_frame_us": row.incremental_frame_us, "persist_ms": row.persist_ms,
                    "unpersist_ms": row.unpersist_ms, "persist_bytes": row.persist_bytes, "tracker": row.tracker,
                    "frame_us": MODES.iter().zip(&row.frames).map(|((name, _), f)| (name.to_string(), json!(f.total_us))).collect::<serde_json::Map<_, _>>(),
                    "touch_us": MODES.iter().zip(&row.frames).map(|((name, _), f)| (name.to_string(), json!(f.touch_us)))
                        .chain([("none".to_string(), json!(row.touch_us))]).collect::<serde_json::Map<_, _>>(),
                })
            );
        }
        rows.push(row);
    }
    if tty {
        eprint!("\r\x1b[2K");
    }
    if !args.json {
        println!("| heap MB | arena bytes | memcpy ms | full snapshot ms | full rollback ms | incremental frame µs (~10 pages) | persist ms | load ms | persist bytes | load: serializer / incremental | tracker |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &rows {
            print_row(r);
        }
        println!("\nFull copies against memcpy: a snapshot writes into the buffer of the window's oldest snapshot (cold), a rollback into the arena (warm); ms, ratios to each memcpy:\n");
        println!("| heap MB | memcpy, one destination | memcpy into 5 buffers in turn | full snapshot | snapshot / memcpy, same / turns | full rollback | rollback / memcpy | snapshot + rollback / 2 memcpy | snapshot + rollback / memcpy in turns + memcpy |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {:.3} | {:.3} | {:.3} | {:.2}× / {:.2}× | {:.3} | {:.2}× | {:.2}× | {:.2}× |",
                r.heap_mb,
                r.memcpy_ms,
                r.memcpy_window_ms,
                r.snapshot_full_ms,
                r.snapshot_full_ms / r.memcpy_ms,
                r.snapshot_full_ms / r.memcpy_window_ms,
                r.rollback_full_ms,
                r.rollback_full_ms / r.memcpy_ms,
                (r.snapshot_full_ms + r.rollback_full_ms) / (2.0 * r.memcpy_ms),
                // Each against the copy of its own kind: a snapshot into a buffer written a
                // window of copies ago, a rollback into the arena.
                (r.snapshot_full_ms + r.rollback_full_ms) / (r.memcpy_window_ms + r.memcpy_ms),
            );
        }
        println!("\nFrames (two `H.touch(10)` calls, a snapshot after the first and a rollback after the second), µs per frame; `H.touch` alone in parentheses (write faults included); without snapshots the two calls take the last column:\n");
        println!("| heap MB | full | incremental | auto | incremental / full | two touches, no snapshots |");
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            let [full, inc, auto] = r.frames;
            println!(
                "| {} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.2} | {:.1} |",
                r.heap_mb,
                full.total_us,
                full.touch_us,
                inc.total_us,
                inc.touch_us,
                auto.total_us,
                auto.touch_us,
                inc.total_us / full.total_us,
                2.0 * r.touch_us
            );
        }
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, svg(&rows))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// One row of the snapshots-against-serializer table.
fn print_row(r: &Row) {
    {
        println!(
                "| {} | {} | {:.3} | {:.3} ({:.2}×) | {:.3} ({:.2}×) | {:.1} | {:.1} ({:.0}×) | {:.1} ({:.0}×) | {} ({:.2}× heap) | {:.0}× | {} |",
                r.heap_mb,
                r.arena_bytes,
                r.memcpy_ms,
                r.snapshot_full_ms,
                r.snapshot_full_ms / r.memcpy_ms,
                r.rollback_full_ms,
                r.rollback_full_ms / r.memcpy_ms,
                r.incremental_frame_us,
                r.persist_ms,
                r.persist_ms / r.memcpy_ms,
                r.unpersist_ms,
                r.unpersist_ms / r.memcpy_ms,
                r.persist_bytes,
                r.persist_bytes as f64 / (r.heap_mb << 20) as f64,
                r.unpersist_ms * 1e3 / r.incremental_frame_us,
                r.tracker,
            );
    }
}

/// A log-log chart of time against heap size for the three paths.
fn svg(rows: &[Row]) -> String {
    let (w, h, left, bottom, top, right) = (760.0, 460.0, 80.0, 60.0, 40.0, 200.0);
    type Series = (&'static str, &'static str, fn(&Row) -> f64);
    let series: [Series; 5] = [
        ("graph load", "#c0392b", |r| r.unpersist_ms),
        ("graph persist", "#e67e22", |r| r.persist_ms),
        ("full rollback", "#2980b9", |r| r.rollback_full_ms),
        ("full snapshot", "#16a085", |r| r.snapshot_full_ms),
        ("incremental frame", "#8e44ad", |r| {
            r.incremental_frame_us / 1e3
        }),
    ];
    let xs: Vec<f64> = rows.iter().map(|r| (r.heap_mb as f64).log10()).collect();
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| series.iter().map(move |s| (s.2)(r).max(1e-4).log10()))
        .collect();
    let (x0, x1) = (
        xs.iter().cloned().fold(f64::INFINITY, f64::min) - 0.1,
        xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max) + 0.1,
    );
    let (y0, y1) = (
        all.iter().cloned().fold(f64::INFINITY, f64::min).floor(),
        all.iter().cloned().fold(f64::NEG_INFINITY, f64::max).ceil(),
    );
    let px = |x: f64| left + (x - x0) / (x1 - x0).max(1e-9) * (w - left - right);
    let py = |y: f64| h - bottom - (y - y0) / (y1 - y0).max(1e-9) * (h - top - bottom);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    s += &format!(
        r#"<rect width="{w}" height="{h}" fill="white"/><text x="{}" y="24" font-size="15">luasnap: cost of save and restore against heap size (log-log)</text>"#,
        left
    );
    let mut e = y0 as i32;
    while e as f64 <= y1 {
        let y = py(e as f64);
        let label = match e {
            -3 => "1 µs".to_string(),
            -2 => "10 µs".into(),
            -1 => "100 µs".into(),
            0 => "1 ms".into(),
            1 => "10 ms".into(),
            2 => "100 ms".into(),
            3 => "1 s".into(),
            _ => format!("1e{e} ms"),
        };
        s += &format!(
            r##"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{label}</text>"##,
            w - right,
            left - 6.0,
            y + 4.0
        );
        e += 1;
    }
    for (r, x) in rows.iter().zip(&xs) {
        let cx = px(*x);
        s += &format!(
            r##"<line x1="{cx}" x2="{cx}" y1="{}" y2="{}" stroke="#eee"/><text x="{cx}" y="{}" text-anchor="middle">{} MB</text>"##,
            top,
            h - bottom,
            h - bottom + 18.0,
            r.heap_mb
        );
    }
    s += &format!(
        r#"<text x="{}" y="{}" text-anchor="middle">Lua heap</text>"#,
        (left + w - right) / 2.0,
        h - 12.0
    );
    for (i, (name, color, f)) in series.iter().enumerate() {
        let pts: Vec<String> = rows
            .iter()
            .zip(&xs)
            .map(|(r, x)| format!("{:.1},{:.1}", px(*x), py(f(r).max(1e-4).log10())))
            .collect();
        s += &format!(
            r#"<polyline fill="none" stroke="{color}" stroke-width="2.5" points="{}"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (a, b) = p.split_once(',').unwrap();
            s += &format!(r#"<circle cx="{a}" cy="{b}" r="3.5" fill="{color}"/>"#);
        }
        let ly = top + 20.0 + i as f64 * 22.0;
        s += &format!(
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{name}</text>"#,
            w - right + 15.0,
            w - right + 40.0,
            w - right + 46.0,
            ly + 4.0
        );
    }
    s += "</svg>\n";
    s
}
