//! Fuzzes the save-game loader: arbitrary bytes must give an error or a value, never a crash,
//! a hang, or unbounded memory. Run: `cargo fuzz run load` (see fuzz/README.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use luasnap_bridge::persist::{fuzz_load, FUZZ_GAME};
use luasnap_bridge::Vm;
use std::cell::RefCell;

thread_local! {
    static VM: RefCell<Vm> = RefCell::new({
        let vm = Vm::builder().capacity(1 << 30).memory_limit(256 << 20).deterministic(1).build().unwrap();
        vm.exec(FUZZ_GAME, "game").unwrap();
        vm
    });
}

fuzz_target!(|data: &[u8]| {
    VM.with(|vm| fuzz_load(&mut vm.borrow_mut(), data));
});
