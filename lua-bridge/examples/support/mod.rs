//! What the page and collector examples share: a game's VM as they measure it, and its frames.

use luasnap_bridge::runtime::scripted_input;
use luasnap_bridge::{GcMode, Table, Value, Vm};

/// The game `script` for 2 players seeded `seed`, after `G.init`, under the collector `mode`,
/// with the tracker always armed (`full_copy_above(1.0)`: no whole-copy fallback, so every
/// count is the real number of pages written).
#[allow(dead_code)] // each example uses its own subset
pub fn build(script: &str, mode: GcMode, seed: u64) -> Vm {
    build_with(script, None, mode, seed, true)
}

/// As [`build`], the game's modules in `folder` (a game's folder: `script` is its `main.lua`),
/// with quiet collections or stock ones (`VmBuilder::quiet_collections`).
#[allow(dead_code)] // each example uses its own subset
pub fn build_with(
    script: &str,
    folder: Option<&std::path::Path>,
    mode: GcMode,
    seed: u64,
    quiet: bool,
) -> Vm {
    let mut b = Vm::builder()
        .capacity(2 << 30)
        .deterministic(seed)
        .full_copy_above(1.0)
        .quiet_collections(quiet)
        .gc(mode);
    if let Some(dir) = folder {
        b = b.module_folder(dir);
    }
    let vm = b.build().expect("vm");
    {
        let g = vm.load(script, "=game").expect("load");
        vm.set("G", &g).expect("set G");
    }
    vm.call::<()>("G.init", &[Value::Integer(2), Value::Integer(seed as i64)])
        .expect("init");
    vm
}

/// Frame `f` of the game, with `simulate`'s scripted inputs for `seed`.
pub fn step(vm: &Vm, seed: u64, f: u64) {
    let inputs =
        Table::from_array((0..2).map(|p| Value::Integer(scripted_input(seed, f, p) as i64)));
    vm.call::<()>("G.step", &[Value::Table(inputs)])
        .expect("step");
}
