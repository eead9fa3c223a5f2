//! Saving and restoring a 10 MB game-like Lua heap three ways: incremental arena snapshots,
//! full arena snapshots, and the graph serializer (save-games). One frame writes ~10 pages.

use criterion::{criterion_group, criterion_main, Criterion};
use luasnap::alloc::TrackerPreference;
use luasnap::bridge::{workloads::HEAP_BUILDER, GcMode, SnapshotMode, Value, Vm};

fn heap(mode: SnapshotMode) -> Vm {
    let vm = Vm::builder()
        .capacity(1 << 30)
        .deterministic(1)
        .snapshot_mode(mode)
        .gc(GcMode::GENERATIONAL)
        .build()
        .unwrap();
    vm.exec(
        format!("H = (function() {HEAP_BUILDER} end)()"),
        "=heap_builder",
    )
    .unwrap();
    vm.call::<()>("H.build", &[Value::Integer(10 << 20)])
        .unwrap();
    vm.gc_collect().unwrap();
    vm
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("10MB_heap");
    g.sample_size(20);
    for (name, mode) in [
        (
            "incremental",
            SnapshotMode::Incremental(TrackerPreference::Auto),
        ),
        ("full", SnapshotMode::Full),
    ] {
        let mut vm = heap(mode);
        let mut id = vm.snapshot().unwrap();
        g.bench_function(format!("{name}/frame_save"), |b| {
            b.iter(|| {
                vm.call::<()>("H.touch", &[Value::Integer(10)]).unwrap();
                id = vm.snapshot().unwrap();
            })
        });
        g.bench_function(format!("{name}/frame_load"), |b| {
            b.iter(|| {
                vm.call::<()>("H.touch", &[Value::Integer(10)]).unwrap();
                vm.rollback(id).unwrap();
            })
        });
    }
    let mut vm = heap(SnapshotMode::Full);
    let bytes = vm.save_game().unwrap();
    g.bench_function("serialize/save", |b| b.iter(|| vm.save_game().unwrap()));
    g.bench_function("serialize/load", |b| {
        b.iter(|| {
            vm.load_game(&bytes, luasnap::bridge::persist::Trust::Own)
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
