//! Real Lua workloads on the arena against Lua's default allocator (`realloc`).
//!
//! Also prints, per workload, the arena's footprint against Lua's own heap count at the end
//! (target: within 1.15×).

use criterion::{criterion_group, criterion_main, Criterion};
use luasnap::bridge::{Value, Vm};
use mlua_sys as ffi;
use std::ffi::CString;

const WORKLOADS: [(&str, &str, i64); 3] = [
    ("binary_trees", include_str!("lua/binary_trees.lua"), 14),
    ("strings", include_str!("lua/strings.lua"), 20_000),
    ("table_churn", include_str!("lua/table_churn.lua"), 200),
];

/// A state on Lua's default allocator, with the standard library.
struct Plain(*mut ffi::lua_State);

impl Plain {
    fn new() -> Plain {
        // SAFETY: creating a state with the library's default allocator and opening its
        // libraries; the state is closed in Drop.
        unsafe {
            let l = ffi::luaL_newstate();
            ffi::luaL_openlibs(l);
            Plain(l)
        }
    }

    fn run(&self, src: &str, arg: i64) -> i64 {
        let c = CString::new(src).unwrap();
        // SAFETY: loads and runs a chunk in protected mode on our own state; pops the result.
        unsafe {
            assert_eq!(ffi::luaL_loadstring(self.0, c.as_ptr()), 0);
            ffi::lua_pushinteger(self.0, arg);
            assert_eq!(ffi::lua_pcall(self.0, 1, 1, 0), 0);
            let r = ffi::lua_tointegerx(self.0, -1, std::ptr::null_mut());
            ffi::lua_settop(self.0, 0);
            r
        }
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        // SAFETY: closing our own state once.
        unsafe { ffi::lua_close(self.0) };
    }
}

fn arena_vm() -> Vm {
    Vm::builder().capacity(1 << 30).build().unwrap()
}

fn bench(c: &mut Criterion) {
    for (name, src, arg) in WORKLOADS {
        // Footprint, once: peak extent against peak live bytes (Lua's count).
        let vm = arena_vm();
        for _ in 0..3 {
            vm.exec_with_args(src, name, &[Value::Integer(arg)])
                .unwrap();
        }
        let s = vm.arena_stats();
        eprintln!(
            "{name}: peak Lua heap {} KiB, peak arena extent {} KiB: {:.3}× (rounding now {:.1}%)",
            s.peak_bytes_in_use / 1024,
            s.peak_extent_bytes / 1024,
            s.peak_overhead(),
            100.0 * s.rounding_loss() as f64 / s.bytes_allocated.max(1) as f64,
        );
        let mut g = c.benchmark_group(name);
        g.sample_size(10);
        g.bench_function("arena", |b| {
            b.iter(|| {
                vm.exec_with_args(src, name, &[Value::Integer(arg)])
                    .unwrap()
            })
        });
        let plain = Plain::new();
        g.bench_function("default_allocator", |b| b.iter(|| plain.run(src, arg)));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
