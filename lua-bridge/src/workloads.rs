//! Embedded Lua workloads for benchmarks and measurements.

/// A script returning a module `H` that builds game-like heaps: `H.build(bytes)`,
/// `H.touch(n)` (write `n` scattered entities, allocating nothing) and `H.frame()` (a light
/// game frame that makes some garbage).
pub const HEAP_BUILDER: &str = include_str!("../lua/heap_builder.lua");
