//! Functions a game compiles at run time with `load` (tiny-ecs builds its filters from
//! generated source text) load from a foreign save when the game declares `load`: the loading
//! VM compiles the text the save carries, never runs the chunk, and matches each saved
//! function by path and fingerprint as it does a game chunk's. Without the declaration the
//! refusal names it; the file's bytecode stays refused; the text is capped; such a function is
//! never one of "the game's own" (a foreign save's finalizer).
//!
//! The join runs the loading side in a child process (this test binary again, told what to do
//! by [`CHILD`]), as `tests/join.rs` does: another process has its code and arena elsewhere.

mod common;

use luasnap::bridge::persist::forge::{self, body_of};
use luasnap::bridge::persist::{LoadError, LoadOptions, Trust};
use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameConfig};
use luasnap::bridge::Module;
use luasnap::bridge::Vm;

/// Set in the child: the path of the save to load.
const CHILD: &str = "LUASNAP_COMPILED_CHILD";
const SAVE_AT: u64 = 50;
const END_AT: u64 = 100;
const PLAYERS: usize = 2;
const SEED: u64 = 3;

/// A tiny-ecs game without bump.lua (no weak grid, so no collector-timing divergence): its
/// filters are compiled in `G.init` and every 25 frames. It declares `G.permanents = { "load" }`.
const SWARM: &str = include_str!("lua/ecs_swarm.lua");
/// tiny-ecs as ecs_arena ships it (commit 8219147, MIT, unchanged).
const TINY: &str = include_str!("../lua-bridge/games/ecs_arena/lib/tiny.lua");

/// After each frame: (frame, value digest, `G.digest()`).
type Trace = Vec<(u64, u64, Option<i64>)>;

fn swarm(script: &str) -> GameConfig {
    GameConfig {
        script: script.into(),
        chunk_name: "@main.lua".into(),
        modules: vec![Module::new("lib.tiny", TINY)],
        base_address: None, // two games in one process
        ..GameConfig::default_game(PLAYERS, SEED)
    }
}

fn run_to(game: &mut Game, to: u64, trace: &mut Trace) {
    while game.frame() < to {
        let f = game.frame();
        let inputs: Vec<u8> = (0..PLAYERS).map(|p| scripted_input(SEED, f, p)).collect();
        game.step(&inputs).unwrap();
        trace.push((
            game.frame(),
            game.value_digest().unwrap(),
            game.game_digest().unwrap(),
        ));
    }
}

/// The child's side: loads the save with the default (foreign) trust, runs to [`END_AT`] and
/// prints its trace (`JOIN frame value game`) and how many functions it compiled.
#[test]
fn compiled_child() {
    let Ok(save) = std::env::var(CHILD) else {
        return; // run by the parent only
    };
    let bytes = std::fs::read(save).unwrap();
    let mut g = Game::from_save(&swarm(SWARM), Backend::ArenaIncremental, &bytes).unwrap();
    assert_eq!(g.frame(), SAVE_AT);
    println!("COMPILED {}", g.load_report().unwrap().compiled.len());
    let mut trace = Trace::new();
    run_to(&mut g, END_AT, &mut trace);
    for (f, v, d) in trace {
        println!("JOIN {f} {v} {}", d.unwrap());
    }
}

#[test]
fn a_tiny_ecs_game_continues_alike_from_a_foreign_save_in_a_new_process() {
    let cfg = swarm(SWARM);
    let mut g = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
    let mut straight = Trace::new();
    run_to(&mut g, SAVE_AT, &mut straight);
    let save = common::temp_file("luasnap-compiled-", ".sav");
    std::fs::write(&save, g.save_game().unwrap()).unwrap();
    straight.clear();
    run_to(&mut g, END_AT, &mut straight);

    let stdout = common::child::run_with("compiled_child", CHILD, &save.to_string_lossy());
    let field = |tag: &str| common::child::fields(&stdout, tag);
    // The filters of G.init (3) and of frames 25 and 50 (2): none compiled in the new process
    // before the load, so the load compiled each from the save's text.
    let compiled: usize = field("COMPILED ")[0].parse().unwrap();
    assert!(compiled >= 4, "{compiled} functions compiled\n{stdout}");
    let joined: Trace = field("JOIN ")
        .iter()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (
                w[0].parse().unwrap(),
                w[1].parse().unwrap(),
                w[2].parse().ok(),
            )
        })
        .collect();
    assert_eq!(joined.len(), straight.len(), "{stdout}");
    for (a, b) in straight.iter().zip(&joined) {
        assert_eq!(
            a, b,
            "(frame, value digest, G.digest()) after the load differ from the process that saved"
        );
    }
}

#[test]
fn without_load_declared_the_refusal_names_the_declaration() {
    let undeclared = SWARM.replace("local G = { permanents = { \"load\" } }", "local G = {}");
    assert_ne!(undeclared, SWARM);
    let cfg = swarm(&undeclared);
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..30 {
        g.step(&[scripted_input(SEED, f, 0), scripted_input(SEED, f, 1)])
            .unwrap();
    }
    let save = g.save_game().unwrap();
    let e = Game::<u8>::from_save(&cfg, Backend::ArenaFull, &save)
        .expect_err("refused without the declaration")
        .to_string();
    assert!(
        e.contains("load") && e.contains("G.permanents") && e.contains("GameConfig::permanents"),
        "{e}"
    );
    // Declared by the host instead of the script: loads, and compiles the filters.
    let declared = GameConfig {
        permanents: vec!["load".into()],
        ..swarm(&undeclared)
    };
    let loaded: Game = Game::from_save(&declared, Backend::ArenaFull, &save).unwrap();
    assert!(!loaded.load_report().unwrap().compiled.is_empty());
}

// --- one VM, hostile and edge cases ---

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder().capacity(256 * MIB).build().unwrap()
}

/// A foreign load that accepts `load` (what a game's declaration gives).
fn declaring_load() -> LoadOptions {
    let mut o = LoadOptions::foreign();
    o.allowed_permanents.push("load".into());
    o
}

fn int(vm: &Vm, code: &str) -> i64 {
    vm.exec(code, "=check").unwrap()[0].as_integer().unwrap()
}

/// `saved.f`, a function made by `load(text)()`, saved by a VM.
fn save_of_generated(text: &str) -> Vec<u8> {
    let a = vm();
    a.exec(format!("saved = {{ f = load({text:?})() }}"), "=setup")
        .unwrap();
    a.persist("saved").unwrap()
}

fn load_foreign(file: &[u8], opts: &LoadOptions) -> Result<Vm, String> {
    let mut b = vm();
    b.unpersist_with(file, "copy", opts)
        .map_err(|e| e.to_string())?;
    Ok(b)
}

/// Edits the chunk definition of the save's first new prototype.
fn with_first_chunk(file: &[u8], f: &mut dyn FnMut(&mut forge::ChunkDef<Vec<u8>>)) -> Vec<u8> {
    let mut node = forge::decode(body_of(file).unwrap()).unwrap();
    common::chunks::with_first_chunk(&mut node, f);
    forge::file(&node)
}

#[test]
fn a_generated_function_loads_only_when_load_is_declared() {
    let file = save_of_generated("return function(x) return x * 6 + 1 end");
    let e = load_foreign(&file, &LoadOptions::foreign()).err().unwrap();
    assert!(
        e.contains("compiled at run time with load")
            && e.contains("G.permanents = { \"load\" }")
            && e.contains("LoadOptions::allowed_permanents"),
        "{e}"
    );
    let b = load_foreign(&file, &declaring_load()).unwrap();
    assert_eq!(int(&b, "return copy.f(7)"), 43);
    // The bytecode of the same function (load(string.dump(...))) stays refused.
    let a = vm();
    a.exec(
        "saved = { f = load(string.dump(load('return function(x) return x * 6 + 1 end')())) }",
        "=setup",
    )
    .unwrap();
    let binary = a.persist("saved").unwrap();
    assert!(load_foreign(&binary, &declaring_load()).is_err());
}

#[test]
fn a_generated_chunk_is_compiled_never_run() {
    // Its main function would set a global and spin for ever: the load only compiles it.
    let text = "ran = true while spin do end return function() return 7 end";
    let a = vm();
    a.exec(
        format!("spin = false saved = {{ f = load({text:?})() }} ran = nil"),
        "=setup",
    )
    .unwrap();
    let file = a.persist("saved").unwrap();
    let mut b = vm();
    b.exec("spin = true", "=setup").unwrap();
    b.unpersist_with(&file, "copy", &declaring_load()).unwrap();
    assert_eq!(int(&b, "return copy.f()"), 7);
    assert_eq!(int(&b, "return ran == nil and 1 or 0"), 1);
}

#[test]
fn generated_text_that_does_not_compile_or_differs_is_refused() {
    let file = save_of_generated("return function(x) return x + 1 end");
    // (Name and text alike: `load(s)` names its chunk by `s`.)
    let broken = with_first_chunk(&file, &mut |d| {
        d.code = b"return function(x return".to_vec();
        d.name = d.code.clone();
    });
    let e = load_foreign(&broken, &declaring_load()).err().unwrap();
    assert!(e.contains("does not compile"), "{e}");
    // Other text under the saved fingerprint: another tree.
    let other = with_first_chunk(&file, &mut |d| {
        d.code = b"return function(x) return x + 2 end".to_vec();
        d.name = d.code.clone();
    });
    let e = load_foreign(&other, &declaring_load()).err().unwrap();
    assert!(e.contains("different prototype tree"), "{e}");
    // Other text with its own true main fingerprint, defining no function where the save's
    // closure says it is (at child 0 of the main function).
    let flat_text = "return 1";
    let probe = vm();
    probe
        .exec(format!("saved = {{ f = load({flat_text:?}) }}"), "=setup")
        .unwrap();
    let probe = probe.persist("saved").unwrap();
    let mut main_hash = 0;
    let _ = with_first_chunk(&probe, &mut |d| main_hash = d.main_hash);
    let nested = with_first_chunk(&file, &mut |d| {
        d.code = flat_text.as_bytes().to_vec();
        d.name = flat_text.as_bytes().to_vec();
        d.main_hash = main_hash;
    });
    let e = load_foreign(&nested, &declaring_load()).err().unwrap();
    assert!(e.contains("has no function at the position"), "{e}");
}

#[test]
fn generated_text_is_capped_per_chunk_and_per_load() {
    let file = save_of_generated("return function(x) return x + 1 end");
    let mut huge = b"return function(x) return x + 1 end --".to_vec();
    huge.resize(70 << 10, b'x');
    let big = with_first_chunk(&file, &mut |d| {
        d.code = huge.clone();
        d.name = huge.clone();
    });
    let e = load_foreign(&big, &declaring_load()).err().unwrap();
    assert!(e.contains("at most 65536 bytes"), "{e}");
    // Honest chunks under the per-chunk cap, more than a load's worth together.
    let a = vm();
    a.exec(
        "saved = {}
         for i = 1, 20 do
           saved[i] = load(('-- padding\\n'):rep(5000) .. 'return function() return ' .. i .. ' end')()
         end",
        "=setup",
    )
    .unwrap();
    let many = a.persist("saved").unwrap();
    let e = load_foreign(&many, &declaring_load()).err().unwrap();
    assert!(e.contains("more than 1048576 bytes"), "{e}");
    // An own load takes them all.
    let mut b = vm();
    b.unpersist(&many, "copy", Trust::Own).unwrap();
    assert_eq!(int(&b, "return copy[20]()"), 20);
}

#[test]
fn a_host_chunk_or_a_swapped_text_is_never_compiled_from_a_foreign_save() {
    // A host's chunk (named by the host) is not one the game made with load.
    let a = vm();
    a.exec("saved = { f = function() return 1 end }", "=setup")
        .unwrap();
    let e = load_foreign(&a.persist("saved").unwrap(), &declaring_load())
        .err()
        .unwrap();
    assert!(
        e.contains("not among the chunks") && !e.contains("compiled at run time"),
        "{e}"
    );
    // Text a file swapped in under the chunk's name: named otherwise than by itself.
    let file = save_of_generated("return function(x) return x + 1 end");
    let swapped = with_first_chunk(&file, &mut |d| {
        d.code = b"return function(x) return x + 2 end".to_vec()
    });
    let e = load_foreign(&swapped, &declaring_load()).err().unwrap();
    assert!(e.contains("not among the chunks"), "{e}");
}

#[test]
fn compiling_generated_text_is_charged_to_the_load_budget() {
    let file = save_of_generated("return function(x) return x + 1 end");
    let mut opts = declaring_load();
    opts.instruction_budget = 10;
    let e = load_foreign(&file, &opts).err().unwrap();
    assert!(e.contains("instruction budget"), "{e}");
}

#[test]
fn a_generated_function_is_never_a_foreign_finalizer() {
    let a = vm();
    a.exec(
        "local gc = load('return function(o) end')()
         saved = { obj = setmetatable({}, { __gc = gc }) }",
        "=setup",
    )
    .unwrap();
    let file = a.persist("saved").unwrap();
    let mut opts = declaring_load();
    opts.finalizers = true;
    let e = load_foreign(&file, &opts).err().unwrap();
    assert!(
        e.contains("finalizer compiled from the text the save carries"),
        "{e}"
    );
    // A second load of it into a VM that already compiled the text from a save: still not
    // the game's own.
    let mut b = vm();
    let plain = {
        let a = vm();
        a.exec("saved = { f = load('return function(o) end')() }", "=setup")
            .unwrap();
        a.persist("saved").unwrap()
    };
    b.unpersist_with(&plain, "first", &declaring_load())
        .unwrap();
    let e = b.unpersist_with(&file, "copy", &opts).unwrap_err();
    assert!(
        matches!(e, LoadError::Invalid { .. }) && e.to_string().contains("compiled from the text"),
        "{e}"
    );
    // The same finalizer compiled by the game itself is its own.
    let mut c = vm();
    c.exec("keep = load('return function(o) end')()", "=setup")
        .unwrap();
    c.unpersist_with(&file, "copy", &opts).unwrap();
}
