//! Fuzzes the save-game loader with well-formed files: the input drives edits of decoded
//! honest saves (every kind of object, suspended coroutines at every kind of yield) and
//! generated subtrees (permanents by name from the dictionary of all of them, forged frames,
//! upvalues and counts), each written behind a valid header and checksum. Run: `cargo fuzz
//! run structured` (see fuzz/README.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use luasnap_bridge::persist::forge::Node;
use luasnap_bridge::persist::fuzz::{fuzz_seeds, fuzz_structured, fuzz_vm, permanent_names};
use luasnap_bridge::Vm;
use std::cell::RefCell;

struct State {
    vm: Vm,
    seeds: Vec<Node>,
    dict: Vec<String>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new({
        let vm = fuzz_vm();
        let seeds = fuzz_seeds(&vm);
        let dict = permanent_names(&vm);
        State { vm, seeds, dict }
    });
}

fuzz_target!(|data: &[u8]| {
    STATE.with(|s| {
        let s = &mut *s.borrow_mut();
        fuzz_structured(&mut s.vm, data, &s.seeds, &s.dict);
    });
});
