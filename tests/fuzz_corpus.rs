//! Replays the committed fuzz corpus through the loader (the same body the fuzz target runs),
//! and writes the seed files on demand.

use luasnap::bridge::persist::{fuzz_load, FUZZ_GAME};
use luasnap::bridge::Vm;
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/load")
}

fn vm() -> Vm {
    let vm = Vm::builder()
        .capacity(1 << 30)
        .memory_limit(256 << 20)
        .deterministic(1)
        .build()
        .unwrap();
    vm.exec(FUZZ_GAME, "game").unwrap();
    vm
}

#[test]
fn the_committed_corpus_loads_or_fails_cleanly() {
    let mut vm = vm();
    let mut files: Vec<_> = std::fs::read_dir(corpus())
        .expect("fuzz/corpus/load is committed")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "the corpus should hold the seeds at least"
    );
    for f in &files {
        fuzz_load(&mut vm, &std::fs::read(f).unwrap());
    }
    // The VM is still healthy after every hostile input.
    vm.arena().verify().unwrap();
    assert_eq!(
        vm.exec("return 6 * 7", "alive").unwrap(),
        vec![luasnap::bridge::Value::Integer(42)]
    );
}

/// Regenerates the seed files: valid saves of each kind of value, and their bodies.
#[test]
#[ignore]
fn write_seeds() {
    let vm = vm();
    let dir = corpus();
    std::fs::create_dir_all(&dir).unwrap();
    let seeds = [
        ("nil", "saved = nil"),
        (
            "numbers",
            "saved = { 1, -2, 3.5, 0/0, -0.0, 1/0, math.maxinteger, math.mininteger }",
        ),
        (
            "strings",
            "saved = { 'a', ('b'):rep(300), string.char(0, 255) }",
        ),
        ("nested", "saved = { a = { b = { c = { 'd' } } } }"),
        ("cycle", "saved = {} saved.me = saved"),
        ("state", "saved = make_state()"),
        ("closure", "local s = make_state() saved = s.counter"),
        ("coroutine", "local s = make_state() saved = s.co"),
        ("special", "local s = make_state() saved = s.v"),
        ("perms", "saved = { print, string, coroutine.yield }"),
        ("weak", "saved = setmetatable({}, { __mode = 'kv' })"),
        (
            "strrefs",
            "local s = ('name'):rep(3) saved = { s, s, [s] = s, x = 'abcd', y = 'abcd', z = 'ab' }",
        ),
        (
            "batches",
            "local function mk(i) local n = i return function() n = n + 1 return n end, function() return n end end
             local mt = { __index = {} }
             saved = {}
             for i = 1, 30 do
               local a, b = mk(i)
               saved[i] = setmetatable({ i, i + 0.5, 'k' .. i, t = { x = i, y = { z = 'zz' } }, a = a, b = b }, mt)
             end",
        ),
    ];
    for (name, code) in seeds {
        vm.exec(code, "seed").unwrap();
        let file = vm.persist("saved").unwrap();
        std::fs::write(dir.join(format!("seed-{name}.sav")), &file).unwrap();
        let body = luasnap::bridge::persist::body_of(&file).unwrap();
        std::fs::write(dir.join(format!("seed-{name}.body")), body).unwrap();
    }
}
