//! The safe Rust API under attack (issue 21, item 6): snapshots and captures of other VMs,
//! natives that panic or reach their VM again, budgets and finalizers on VMs of several
//! threads at once. Each must end in a typed error or a correct result, with the VM usable and
//! its arena intact; none may crash or roll back into another VM's state.

use luasnap::bridge::{NativeError, Vm, VmError};
use std::cell::RefCell;
use std::rc::{Rc, Weak};

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder()
        .capacity(64 * MIB)
        .deterministic(3)
        .build()
        .unwrap()
}

#[test]
fn a_snapshot_or_capture_of_another_vm_is_refused() {
    let (mut a, mut b) = (vm(), vm());
    a.exec("x = 'a'", "=a").unwrap();
    b.exec("x = 'b'", "=b").unwrap();
    let _ida = a.snapshot().unwrap();
    let idb = b.snapshot().unwrap();
    assert!(a.rollback(idb).is_err(), "a rolled back to b's snapshot id");
    assert!(a.restore(&b.capture()).is_err(), "a restored b's capture");
    assert_eq!(a.get::<String>("x").unwrap(), "a");
    a.arena().verify().unwrap();
}

#[test]
fn a_native_that_panics_fails_its_call_and_leaves_the_vm_usable() {
    let mut vm = vm();
    vm.register_native("boom", |_| -> Result<(), NativeError> {
        panic!("on purpose")
    })
    .unwrap();
    let id = vm.snapshot().unwrap();
    let out = vm
        .exec("local ok, e = pcall(boom) return ok, tostring(e)", "=p")
        .unwrap();
    let text = format!("{out:?}");
    assert!(text.contains("native panicked: on purpose"), "{text}");
    // Outside a pcall too, then a rollback and a collection.
    assert!(vm.exec("boom()", "=q").is_err());
    vm.rollback(id).unwrap();
    vm.exec("collectgarbage()", "=gc").unwrap();
    vm.arena().verify().unwrap();
}

#[test]
fn a_native_that_reaches_its_vm_again_gets_an_error() {
    // A native cannot borrow its Vm, but it can own a way back to it (an Rc it was handed).
    let slot: Rc<RefCell<Weak<Vm>>> = Rc::new(RefCell::new(Weak::new()));
    let mut vm = vm();
    let back = slot.clone();
    vm.register_native("again", move |call| {
        let vm = back.borrow().upgrade().expect("the VM");
        // Host calls from inside a native: refused or run to completion, never UB.
        let r = vm.exec("return 1 + 1", "=inner");
        let g = vm.get::<i64>("x[2]");
        call.ret(format!("{} {}", r.is_ok(), g.is_ok()));
        Ok(())
    })
    .unwrap();
    vm.exec("x = { 1, 2, 3 }", "=x").unwrap();
    let vm = Rc::new(vm);
    *slot.borrow_mut() = Rc::downgrade(&vm);
    // Whatever the inner calls answer, the outer call ends and the VM stays whole.
    let out = vm.exec("return again()", "=outer").unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(vm.get::<i64>("x[3]").unwrap(), 3);
    vm.exec("collectgarbage()", "=gc").unwrap();
    vm.arena().verify().unwrap();
}

#[test]
fn budgets_and_finalizers_on_vms_of_several_threads_stay_apart() {
    // The budget hooks are registered process-wide (coroutines and finalizers pass them on);
    // each VM's budget state is its own.
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let vm = vm();
                vm.exec(
                    "function churn()
                       for i = 1, 1e9 do
                         setmetatable({}, { __gc = function() local s = 0 for j = 1, 100 do s = s + j end end })
                       end
                     end
                     function small() return 42 end",
                    "=t",
                )
                .unwrap();
                let e = vm.call_with_budget::<()>("churn", (), 2_000_000 + i * 1000);
                assert!(matches!(e, Err(VmError::InstructionBudget { .. })), "{e:?}");
                assert_eq!(vm.call_with_budget::<i64>("small", (), 1000).unwrap(), 42);
                vm.exec("collectgarbage()", "=gc").unwrap();
                vm.arena().verify().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
