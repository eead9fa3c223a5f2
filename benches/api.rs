//! Reading one field of a large Lua table from Rust: copying the whole table out (the only way
//! before typed paths), a typed path read, and a lazy table handle. Also a call by path
//! against a call through a `Function` handle.

use criterion::{criterion_group, criterion_main, Criterion};
use luasnap::{Table, Value, Vm};

fn world() -> Vm {
    let vm = Vm::builder()
        .capacity(1 << 30)
        .deterministic(1)
        .build()
        .unwrap();
    vm.exec(
        "world = { players = {} }
         for i = 1, 1000 do
           local inv = {}
           for j = 1, 10 do inv[j] = 'item' .. j end
           world.players[i] = { name = 'p' .. i, hp = i, pos = { x = i, y = -i }, inventory = inv }
         end
         function add(a, b) return a + b end",
        "world",
    )
    .unwrap();
    vm
}

fn bench(c: &mut Criterion) {
    let vm = world();
    let mut g = c.benchmark_group("read_one_field_of_1000_players");
    g.sample_size(20);
    g.bench_function("copy_whole_table", |b| {
        b.iter(|| {
            let w: Table = vm.get("world").unwrap();
            let players = w.get("players").unwrap().as_table().unwrap();
            let p = players.get(500).unwrap().as_table().unwrap();
            p.get("hp").unwrap().as_integer().unwrap()
        })
    });
    g.bench_function("typed_path", |b| {
        b.iter(|| vm.get::<i64>("world.players[500].hp").unwrap())
    });
    let players = vm.table("world.players").unwrap();
    g.bench_function("table_handle", |b| {
        b.iter(|| players.table(500).unwrap().get::<_, i64>("hp").unwrap())
    });
    drop(players);
    g.finish();

    let mut g = c.benchmark_group("call_add");
    g.sample_size(20);
    g.bench_function("by_path", |b| {
        b.iter(|| vm.call::<i64>("add", (1, 2)).unwrap())
    });
    let add = vm.function("add").unwrap();
    g.bench_function("function_handle", |b| {
        b.iter(|| add.call::<i64>((1, 2)).unwrap())
    });
    g.bench_function("by_path_values", |b| {
        b.iter(|| {
            vm.call::<Value>("add", &[Value::Integer(1), Value::Integer(2)])
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
