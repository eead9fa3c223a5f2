//! The README's Rust example, kept compiling and running.

use luasnap::bridge::Vm;

#[test]
fn the_readme_example_runs() -> Result<(), Box<dyn std::error::Error>> {
    let mut vm = Vm::builder()
        .deterministic(42) // fixed hash seed, seeded math.random, no io/os
        .native("host.add", |call| {
            // Rust functions, registered before the first snapshot
            let sum = call.integer(0)? + call.integer(1)?;
            call.ret(sum);
            Ok(())
        })
        .build()?;
    vm.exec(
        "score = 0 function step(n) score = score + host.add(n, 1) end",
        "game",
    )?;
    let before = vm.snapshot()?;
    vm.call::<()>("step", 41)?; // typed arguments and results
    assert_eq!(vm.get::<i64>("score")?, 42);
    vm.rollback(before)?; // byte for byte; newer snapshots are invalidated
    assert_eq!(vm.get::<i64>("score")?, 0);
    let save = vm.save_game()?; // portable: load it in another process
    assert!(!save.is_empty());
    Ok(())
}
