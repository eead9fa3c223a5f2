//! Fuzzes the save-game loader with bytes: arbitrary input must give an error or a value,
//! never a crash, a hang, or unbounded memory. Run: `cargo fuzz run load` with the
//! dictionary of permanent names (see fuzz/README.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use luasnap_bridge::persist::fuzz::{fuzz_load, fuzz_vm};
use luasnap_bridge::Vm;
use std::cell::RefCell;

thread_local! {
    static VM: RefCell<Vm> = RefCell::new(fuzz_vm());
}

fuzz_target!(|data: &[u8]| {
    VM.with(|vm| fuzz_load(&mut vm.borrow_mut(), data));
});
