//! Save-games that stand alone: the code travels with the save (once per chunk, as source
//! text compiled at load by Lua's own compiler), the identical chunk is reused, old saves
//! survive game updates, and what a trust level refuses is said clearly.

mod common;

use common::chunks::with_first_chunk;
use luasnap::bridge::persist::forge::{self, body_of, Node, Proto};
use luasnap::bridge::persist::{LoadError, LoadOptions, Trust};
use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameConfig};
use luasnap::bridge::{GcMode, Value, Vm};

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder().capacity(256 * MIB).build().unwrap()
}

fn int(vm: &Vm, code: &str) -> i64 {
    vm.exec(code, "=check").unwrap()[0]
        .as_integer()
        .unwrap_or_else(|| panic!("{code}: not an integer"))
}

fn text(vm: &Vm, code: &str) -> String {
    match &vm.exec(code, "=check").unwrap()[0] {
        Value::String(s) => String::from_utf8_lossy(s).into_owned(),
        other => panic!("{code}: {other:?}"),
    }
}

const GAME_V1: &str = r#"
Player = {}
Player.__index = Player
function Player.new(name) return setmetatable({ name = name, hp = 10 }, Player) end
function Player:hit(n) self.hp = self.hp - n return self.hp end
function make_counter() local n = 0 return function() n = n + 1 return n end end
function version() return 1 end
"#;

/// Version 2: `Player:hit` halves damage, `version` says 2, and `Player:heal` is new.
const GAME_V2: &str = r#"
Player = {}
Player.__index = Player
function Player.new(name) return setmetatable({ name = name, hp = 10 }, Player) end
function Player:hit(n) self.hp = self.hp - n // 2 return self.hp end
function Player:heal(n) self.hp = self.hp + n return self.hp end
function make_counter() local n = 100 return function() n = n + 10 return n end end
function version() return 2 end
"#;

#[test]
fn saves_survive_game_updates() {
    let a = vm();
    a.exec(GAME_V1, "@game.lua").unwrap();
    a.exec(
        "local p = Player.new('ann') p:hit(2)
         local c = make_counter() c() c()
         saved = { player = p, counter = c, version = version }",
        "=setup",
    )
    .unwrap();
    let file = a.persist("saved").unwrap();
    // A fresh VM that ran version 2 of the script.
    let mut b = vm();
    b.exec(GAME_V2, "@game.lua").unwrap();
    b.unpersist(&file, "saved", Trust::Own).unwrap();
    // The saved closures run version 1's code, with their state.
    assert_eq!(int(&b, "return saved.player:hit(4)"), 4);
    assert_eq!(int(&b, "return saved.counter()"), 3);
    assert_eq!(int(&b, "return saved.version()"), 1);
    // Code loaded fresh runs version 2's; the new function exists, and the saved object can
    // be migrated onto version 2's class by rebinding its metatable.
    assert_eq!(int(&b, "return version()"), 2);
    assert_eq!(int(&b, "return make_counter()()"), 110);
    assert_eq!(int(&b, "return Player.new('bob'):hit(4)"), 8);
    assert_eq!(
        int(
            &b,
            "local p = saved.player
             local v2 = getmetatable(Player.new('x'))
             setmetatable(p, v2)
             return p:heal(1) * 100 + p:hit(4)"
        ),
        5 * 100 + 3
    );
    // Debug info survives: the saved function's source and lines are version 1's.
    assert_eq!(
        text(
            &b,
            "local i = debug.getinfo(saved.version, 'S')
             return i.source .. ':' .. i.linedefined"
        ),
        "@game.lua:7"
    );
}

#[test]
fn a_fresh_vm_compiles_the_saved_source_with_its_debug_info() {
    let a = vm();
    a.exec(
        "local secret = 'abc'
         function describe(first, second)
           local joined = first .. secret .. second
           if #joined > 100 then error('too long') end
           return joined
         end
         function fail() error('failed here') end
         saved = { describe = describe, fail = fail }",
        "@scripts/lib.lua",
    )
    .unwrap();
    let file = a.persist("saved").unwrap();
    let mut b = vm();
    b.unpersist(&file, "saved", Trust::Own).unwrap();
    assert_eq!(text(&b, "return saved.describe('x', 'y')"), "xabcy");
    // Local names, line numbers and the chunk name, as compiled from the source.
    assert_eq!(
        text(
            &b,
            "local names = {}
             for i = 1, 2 do names[i] = debug.getlocal(saved.describe, i) end
             local i = debug.getinfo(saved.describe, 'S')
             return table.concat(names, ',') .. ' ' .. i.short_src .. ':' .. i.linedefined .. '-' .. i.lastlinedefined"
        ),
        "first,second scripts/lib.lua:2-6"
    );
    assert_eq!(
        text(&b, "local ok, e = pcall(saved.fail) return e"),
        "scripts/lib.lua:7: failed here"
    );
    // The VM now keeps that chunk: a save from b carries it again and loads elsewhere.
    let again = b.persist("saved").unwrap();
    let mut c = vm();
    c.unpersist(&again, "saved", Trust::Own).unwrap();
    assert_eq!(text(&c, "return saved.describe('1', '2')"), "1abc2");
}

#[test]
fn the_identical_chunk_is_reused_not_compiled_again() {
    // A chunk with many functions: compiling it again would cost far more than a closure.
    let mut src = String::from("fns = {}\n");
    for i in 0..300 {
        src.push_str(&format!(
            "fns[{i}] = function(x) local t = {{ {i}, x, 'k{i}' }} return t[1] + t[2] end\n"
        ));
    }
    let a = vm();
    a.exec(&src, "=many").unwrap();
    a.exec("saved = { f = fns[7], g = fns[250] }", "=s")
        .unwrap();
    let file = a.persist("saved").unwrap();
    // The same VM (the chunk is live): the load costs a few closures, not a compile.
    let mut a = a;
    let used = |vm: &Vm| {
        vm.gc_collect().unwrap();
        int(vm, "return collectgarbage('count') * 1024 // 1")
    };
    let before = used(&a);
    a.unpersist(&file, "copy", Trust::Own).unwrap();
    let reused = used(&a) - before;
    assert_eq!(int(&a, "return copy.f(1) + copy.g(2)"), 8 + 252);
    // A VM without it compiles the chunk: many times the cost.
    let mut b = vm();
    let before = used(&b);
    b.unpersist(&file, "copy", Trust::Own).unwrap();
    let compiled = used(&b) - before;
    assert_eq!(int(&b, "return copy.f(1) + copy.g(2)"), 8 + 252);
    assert!(
        compiled > 20 * reused.max(1) && reused < 4096,
        "reused {reused} bytes, compiled {compiled} bytes"
    );
    // Loading the same save again in b reuses the chunk b compiled the first time.
    let before = used(&b);
    b.unpersist(&file, "copy2", Trust::Own).unwrap();
    assert!(used(&b) - before < 4096);
}

#[test]
fn embedded_source_that_does_not_compile_or_differs_is_refused_naming_the_chunk() {
    let a = vm();
    a.exec(
        "function f() return 42 end saved = { f = f }",
        "@mods/hero.lua",
    )
    .unwrap();
    let file = a.persist("saved").unwrap();
    let node = forge::decode(body_of(&file).unwrap()).unwrap();
    let load = |node: &Node| {
        let mut b = vm();
        b.unpersist(&forge::file(node), "saved", Trust::Own)
            .map_err(|e| e.to_string())
    };
    load(&node).unwrap();
    let mut broken = node.clone();
    with_first_chunk(&mut broken, &mut |d| {
        d.code = b"function f( return".to_vec()
    });
    let e = load(&broken).unwrap_err();
    assert!(
        e.contains("chunk @mods/hero.lua") && e.contains("does not compile"),
        "{e}"
    );
    let mut other = node.clone();
    with_first_chunk(&mut other, &mut |d| {
        d.code = b"function f() return 43 end saved = { f = f }".to_vec()
    });
    let e = load(&other).unwrap_err();
    assert!(
        e.contains("chunk @mods/hero.lua") && e.contains("different prototype tree"),
        "{e}"
    );
    // A path past the tree, and a fingerprint that does not match the function there.
    let mut bad_path = node.clone();
    forge::walk_mut(&mut bad_path, &mut |n| {
        if let Node::LClosure {
            proto: Proto::New {
                home: Some(home), ..
            },
            ..
        } = n
        {
            home.path = vec![5];
        }
    });
    let e = load(&bad_path).unwrap_err();
    assert!(e.contains("no function at the position"), "{e}");
    let mut bad_hash = node;
    forge::walk_mut(&mut bad_hash, &mut |n| {
        if let Node::LClosure {
            proto: Proto::New { hash, .. },
            ..
        } = n
        {
            *hash ^= 1;
        }
    });
    let e = load(&bad_hash).unwrap_err();
    assert!(
        e.contains("chunk @mods/hero.lua") && e.contains("differs"),
        "{e}"
    );
}

#[test]
fn binary_chunks_travel_as_bytecode_only_for_own_loads_that_allow_it() {
    let a = vm();
    a.exec(
        "local src = function(x) return x * 7 end
         f = load(string.dump(src), '=dumped', 'b')
         saved = { f = f }",
        "=s",
    )
    .unwrap();
    let file = a.persist("saved").unwrap();
    let mut b = vm();
    let e = b.unpersist(&file, "saved", Trust::Own).unwrap_err();
    assert!(
        e.to_string().contains("loaded as binary") && e.to_string().contains("bytecode"),
        "{e}"
    );
    let e = b.unpersist(&file, "saved", Trust::Foreign).unwrap_err();
    assert!(e.to_string().contains("own-trust"), "{e}");
    let opts = LoadOptions {
        bytecode: true,
        ..LoadOptions::own()
    };
    b.unpersist_with(&file, "saved", &opts).unwrap();
    assert_eq!(int(&b, "return saved.f(6)"), 42);
    // Foreign loads ignore it even when asked.
    let opts = LoadOptions {
        bytecode: true,
        ..LoadOptions::foreign()
    };
    let mut c = vm();
    assert!(c.unpersist_with(&file, "saved", &opts).is_err());
}

#[test]
fn foreign_loads_take_no_code_but_match_the_vms_own_chunks() {
    let game = "function score(n) return n * 10 end saved = { f = score }";
    let a = vm();
    a.exec(game, "@game.lua").unwrap();
    let file = a.persist("saved").unwrap();
    let mut fresh = vm();
    match fresh.unpersist(&file, "saved", Trust::Foreign) {
        Err(e @ LoadError::Refused { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("game.lua:1") && message.contains("Trust::Own"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Nothing was compiled: no function of that chunk exists in the VM.
    assert_eq!(int(&fresh, "return score == nil and 1 or 0"), 1);
    let mut same = vm();
    same.exec(game, "@game.lua").unwrap();
    same.unpersist(&file, "saved", Trust::Foreign).unwrap();
    assert_eq!(int(&same, "return saved.f(4)"), 40);
}

#[test]
fn user_permanents_add_to_the_standard_librarys() {
    let a = vm();
    a.exec(
        "function host_fn() return 1 end
         co = coroutine.create(function() pcall(coroutine.yield, 1) return 'done' end)
         coroutine.resume(co)
         w = coroutine.wrap(function() coroutine.yield(5) return 6 end)
         saved = { co = co, w = w, host = host_fn, p = print }
         data = eris.persist({ [host_fn] = 'HOST', [print] = 'myprint' }, saved)",
        "=s",
    )
    .unwrap();
    a.exec(
        "local other = function() return 2 end
         loaded = eris.unpersist({ HOST = other, myprint = 'not print' }, data)",
        "=l",
    )
    .unwrap();
    // The library's own permanents still work (pcall's continuation, the wrap helper); the
    // user's names win where both name a value.
    assert_eq!(
        text(
            &a,
            "local ok, v = coroutine.resume(loaded.co)
             return v .. ' ' .. loaded.w() .. loaded.w() .. ' ' .. loaded.host() .. ' ' .. loaded.p"
        ),
        "done 56 2 not print"
    );
}

#[test]
fn the_main_thread_and_the_running_coroutine_are_refused() {
    let a = vm();
    let refusal = |code: &str| match &a.exec(code, "=m").unwrap()[0] {
        Value::String(s) => String::from_utf8_lossy(s).into_owned(),
        other => panic!("{other:?}"),
    };
    // The running thread (here the main thread, running this code).
    let e = refusal("local ok, e = pcall(eris.persist, (coroutine.running())) return e");
    assert!(e.contains("running coroutine"), "{e}");
    // A running coroutine, and the main thread from inside one.
    let e = refusal(
        "local co = coroutine.create(function()
           return pcall(eris.persist, { me = coroutine.running() })
         end)
         local _, ok, e = coroutine.resume(co)
         return e",
    );
    assert!(e.contains("running coroutine"), "{e}");
    let e = refusal(
        "local main = coroutine.running()
         local co = coroutine.create(function() return pcall(eris.persist, { main = main }) end)
         local _, ok, e = coroutine.resume(co)
         return e",
    );
    assert!(e.contains("main thread"), "{e}");
    // One-argument forms, as Eris's.
    assert_eq!(
        int(&a, "return eris.unpersist(eris.persist({ 41 }))[1] + 1"),
        42
    );
}

/// Format 3 wrote each prototype as fingerprint, short source, line, bytecode: still read.
#[test]
fn format_3_files_with_functions_still_load() {
    let a = vm();
    a.exec("function old(x) return x + 1 end", "=old").unwrap();
    a.exec("saved = old", "=s").unwrap();
    let file = a.persist("saved").unwrap();
    let Node::LClosure {
        proto: Proto::New { hash, line, .. },
        n,
        ..
    } = forge::decode(body_of(&file).unwrap()).unwrap()
    else {
        panic!("a closure");
    };
    assert_eq!(n, 0);
    let mut body = vec![21u8, 0];
    body.extend_from_slice(&hash.to_le_bytes());
    body.extend_from_slice(&[3, b'o', b'l', b'd', line as u8, 0, 0]); // no code, no upvalues
    let v3 = forge::seal_old_body(&body, 3, 0);
    let mut b = vm();
    b.exec("function old(x) return x + 1 end", "=old").unwrap();
    b.unpersist(&v3, "loaded", Trust::Own).unwrap();
    assert_eq!(int(&b, "return loaded(1)"), 2);
}

// ----- the default game, loaded in a process that never ran its script -----

const FRAMES_BEFORE: u64 = 30;
const FRAMES_AFTER: u64 = 20;
const PLAYERS: usize = 2;
const SEED: u64 = 5;

fn inputs(frame: u64) -> Vec<u8> {
    (0..PLAYERS)
        .map(|p| scripted_input(SEED, frame, p))
        .collect()
}

fn step(vm: &Vm, frame: u64) {
    let t = luasnap::bridge::Table::from_array(
        inputs(frame).into_iter().map(|i| Value::Integer(i as i64)),
    );
    vm.call::<()>("luasnap_step", &[Value::Table(t)]).unwrap();
}

#[test]
fn a_default_game_save_loads_in_a_process_that_never_ran_the_script() {
    if let Ok(path) = std::env::var("LUASNAP_FRESH_LOAD") {
        // The child: a VM that never saw the game's script.
        let data = std::fs::read(&path).unwrap();
        let mut vm = Vm::builder()
            .capacity(2048 * MIB)
            .deterministic(SEED)
            .gc(GcMode::GENERATIONAL)
            .build()
            .unwrap();
        vm.load_game(&data, Trust::Own).unwrap();
        for f in FRAMES_BEFORE..FRAMES_BEFORE + FRAMES_AFTER {
            step(&vm, f);
        }
        let d = vm.call::<Value>("luasnap_game.digest", ()).unwrap();
        println!("DIGEST {d:?}");
        return;
    }
    let cfg = GameConfig::default_game(PLAYERS, SEED);
    let mut game = Game::new(&cfg, Backend::Serialize).unwrap();
    for f in 0..FRAMES_BEFORE {
        game.step(&inputs(f)).unwrap();
    }
    let save = game.save_game().unwrap();
    for f in FRAMES_BEFORE..FRAMES_BEFORE + FRAMES_AFTER {
        game.step(&inputs(f)).unwrap();
    }
    let want = format!(
        "{:?}",
        game.vm().call::<Value>("luasnap_game.digest", ()).unwrap()
    );
    drop(game);
    let path = common::temp_file("luasnap-fresh-", ".sav");
    std::fs::write(&path, &save).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_default_game_save_loads_in_a_process_that_never_ran_the_script",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LUASNAP_FRESH_LOAD", &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: String = stdout
        .lines()
        .find_map(|l| l.split("DIGEST ").nth(1))
        .unwrap_or_else(|| {
            panic!(
                "no digest from the child:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .trim()
        .to_string();
    assert_eq!(got, want, "the loaded game continued differently");
}

/// The library's iterators that are plain C functions are permanents: loops over them
/// suspended in a coroutine persist (`utf8.codes`, `ipairs`, `pairs`/`next`).
#[test]
fn loops_over_library_iterators_persist_in_suspended_coroutines() {
    let a = vm();
    a.exec(
        "co = coroutine.create(function()
           local n = 0
           for _, c in utf8.codes('añb') do n = n + c coroutine.yield(c) end
           for _, v in ipairs({ 5, 6 }) do n = n + v coroutine.yield(v) end
           for k, v in pairs({ x = 7 }) do n = n + v coroutine.yield(v) end
           return n
         end)
         coroutine.resume(co)",
        "=s",
    )
    .unwrap();
    let file = a.persist("co").unwrap();
    let mut b = vm();
    b.unpersist(&file, "co", Trust::Own).unwrap();
    assert_eq!(
        int(
            &b,
            "local last
             while coroutine.status(co) ~= 'dead' do local _, v = coroutine.resume(co) last = v end
             return last"
        ),
        97 + 0xf1 + 98 + 5 + 6 + 7
    );
}

/// Forged lists of pending to-be-closed variables are refused before the coroutine can run:
/// out of order, outside the stack, outside a Lua frame's registers, on a value without
/// `__close`. Whatever loads is resumed and closed, and the heap checked.
#[test]
fn forged_to_be_closed_lists_are_refused() {
    let a = vm();
    a.exec(
        "local mt = { __close = function() end }
         co = coroutine.create(function(x)
           local plain = 5
           local c <close> = setmetatable({}, mt)
           local d <close> = setmetatable({}, mt)
           coroutine.yield(plain)
         end)
         coroutine.resume(co)",
        "=s",
    )
    .unwrap();
    let file = a.persist("co").unwrap();
    let node = forge::decode(body_of(&file).unwrap()).unwrap();
    let mut honest = None;
    forge::walk_mut(&mut node.clone(), &mut |n| {
        if let Node::ThreadSuspended { tbc, .. } = n {
            honest = Some(tbc.clone());
        }
    });
    let honest = honest.expect("a suspended coroutine");
    assert_eq!(honest.len(), 2, "{honest:?}");
    let (c, d) = (honest[0], honest[1]);
    let forged: Vec<Vec<u64>> = vec![
        vec![d, c],          // descending
        vec![c, c],          // repeated
        vec![0],             // the stack's base
        vec![1],             // the coroutine's function slot (no Lua frame's register)
        vec![c - 1],         // `plain`: no __close
        vec![c, d, 1 << 20], // past the stack
        vec![u32::MAX as u64 + 5],
    ];
    for tbc in forged {
        let mut n = node.clone();
        forge::walk_mut(&mut n, &mut |x| {
            if let Node::ThreadSuspended { tbc: t, .. } = x {
                *t = tbc.clone();
            }
        });
        let mut b = vm();
        let r = b.unpersist(&forge::file(&n), "co", Trust::Own);
        assert!(r.is_err(), "{tbc:?} was accepted");
        b.exec("collectgarbage()", "=gc").unwrap();
        b.arena().verify().unwrap();
    }
    // The honest list loads, and closing the coroutine closes both variables.
    let mut b = vm();
    b.unpersist(&file, "co", Trust::Own).unwrap();
    assert_eq!(
        int(&b, "local ok = coroutine.close(co) return ok and 1 or 0"),
        1
    );
    b.arena().verify().unwrap();
}
