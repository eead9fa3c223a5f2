//! Foreign-trust loads, round four (issue 21): whatever a load does is bounded by its file,
//! it writes only into objects it built, finalizers come only from the game's own functions,
//! and the globals are permanents only where the host opts in. One test per class found;
//! each failed (or crashed) before its fix.
//!
//! Loads that crashed before their fix run in a child process (`in_child`): the test fails,
//! rather than the whole suite dying, if one comes back.

mod common;

use common::child::in_child;
use luasnap::bridge::persist::forge::{self, Node, Proto};
use luasnap::bridge::persist::Trust;
use luasnap::bridge::Vm;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// A VM with the whole standard library (os, io and debug included: what an attack reaches).
fn vm() -> Vm {
    Vm::builder()
        .capacity(2048 * MIB)
        .memory_limit(1536 * MIB)
        .build()
        .unwrap()
}

// ----- prototypes a failed compile leaves behind -----

#[test]
fn a_failed_compile_leaves_no_prototype_a_foreign_load_can_reach() {
    // A compile that fails leaves its half-built main prototype alive (NULL child slots, code
    // without its final return) until the collector frees it. A foreign load that names a
    // fingerprint the registered chunks lack searches every live prototype, and hashed that
    // one: a segfault.
    in_child(
        "a_failed_compile_leaves_no_prototype_a_foreign_load_can_reach",
        || {
            let mut vm = vm();
            vm.exec(
                "load('local function a() end local function b() end }')",
                "=x",
            )
            .unwrap();
            let node = Node::LClosure {
                proto: Proto::New {
                    index: 0,
                    hash: 12345,
                    src: b"=f".to_vec(),
                    line: 1,
                    code: vec![],
                    home: None,
                },
                n: 0,
                upvals: vec![],
            };
            let e = vm
                .unpersist(&forge::file(&node), "x", Trust::Foreign)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not among the chunks this VM has loaded"), "{e}");
        },
    );
}

// ----- building saves -----

fn s(x: &str) -> Node {
    Node::Str(x.as_bytes().to_vec())
}

fn table(entries: Vec<(Node, Node)>) -> Node {
    Node::Table {
        narr: 0,
        nhash: 0,
        meta: Box::new(Node::Nil),
        entries,
    }
}

fn names(list: &[&str]) -> Node {
    table(
        list.iter()
            .enumerate()
            .map(|(i, n)| (Node::Int(i as i64 + 1), s(n)))
            .collect(),
    )
}

fn perm(name: &str) -> Node {
    Node::Perm(Box::new(s(name)))
}

/// A whole-game root: `globals` (object 1) holds `player` (object 2) and keeps the library
/// bindings the checks use, then `rest`.
fn game_root(rest: Vec<(Node, Node)>) -> Node {
    let player = table(vec![(s("hp"), Node::Int(10))]);
    let mut entries = vec![
        (s("globals"), table(vec![(s("player"), player)])),
        (
            s("globals_kept"),
            names(&[
                "rawget", "type", "print", "string", "package", "os", "io", "_G",
            ]),
        ),
    ];
    entries.extend(rest);
    table(entries)
}

fn load_game(vm: &mut Vm, root: &Node) -> Result<(), String> {
    vm.load_game(&forge::file(root), Trust::Foreign)
        .map_err(|e| e.to_string())
}

// ----- the game root's kept-name lists -----

#[test]
fn kept_names_plant_nothing_in_a_game_table() {
    // root.loaded is the game's player table, and its kept list names denied libraries: the
    // load used to set player.os = os (and io, debug, package) before making package.loaded
    // hold the player's entries.
    let root = game_root(vec![
        (s("loaded"), Node::Ref(2)),
        (s("loaded_kept"), names(&["os", "io", "debug", "package"])),
    ]);
    for deny_globals in [false, true] {
        let mut vm = vm();
        let r = if deny_globals {
            let mut opts = luasnap::bridge::persist::LoadOptions::foreign();
            opts.denied_permanents.push("_G".into());
            vm.load_game_with(&forge::file(&root), &opts)
                .map_err(|e| e.to_string())
        } else {
            load_game(&mut vm, &root)
        };
        let _ = r; // refused or loaded: either way nothing may be planted
        let seen = vm
            .exec(
                "local p = rawget(_G, 'player') or {}
                 return rawget(p, 'os') == nil and rawget(p, 'io') == nil
                    and rawget(p, 'debug') == nil and rawget(p, 'package') == nil",
                "=check",
            )
            .unwrap();
        assert_eq!(seen, vec![luasnap::bridge::Value::Boolean(true)]);
        // The VM's own package.loaded keeps the libraries the list names, where they were.
        let libs = vm
            .exec(
                "return package.loaded.os == os and package.loaded.io == io",
                "=c",
            )
            .unwrap();
        assert_eq!(libs, vec![luasnap::bridge::Value::Boolean(true)]);
    }
}

#[test]
fn kept_names_never_change_a_library_table() {
    // root.loaded (or root.globals) is the string library: the load used to give it _G,
    // table and math, so that ("x")._G == _G; and root.globals = string replaced every global
    // with string's functions.
    for field in ["loaded", "globals"] {
        let mut vm = vm();
        let lib = vec![
            (s(field), perm("string")),
            (
                s(&format!("{field}_kept")),
                names(&["_G", "table", "math", "os"]),
            ),
        ];
        let root = match field {
            "loaded" => game_root(lib),
            _ => table(lib),
        };
        let e = load_game(&mut vm, &root).unwrap_err();
        assert!(e.contains("not one the save built"), "{field}: {e}");
        let out = vm
            .exec(
                "return rawget(string, '_G') == nil and rawget(string, 'table') == nil
                    and rawget(string, 'os') == nil and ('x')._G == nil
                    and type(print) == 'function' and rawget(_G, 'len') == nil",
                "=check",
            )
            .unwrap();
        assert_eq!(out, vec![luasnap::bridge::Value::Boolean(true)], "{field}");
    }
}

#[test]
fn an_honest_foreign_game_load_keeps_the_hosts_libraries() {
    let a = vm();
    a.exec(
        "player = { hp = 3 } local s = string.rep('x', 3) mine = s",
        "=g",
    )
    .unwrap();
    let save = a.save_game().unwrap();
    let mut b = vm();
    b.exec("player = { hp = 1 } extra = true", "=g").unwrap();
    b.load_game(&save, Trust::Foreign).unwrap();
    let out = b
        .exec(
            "return player.hp, extra == nil, os == package.loaded.os, _G._G == _G,
                    package.loaded._G == _G, type(io.open)",
            "=check",
        )
        .unwrap();
    use luasnap::bridge::Value::*;
    assert_eq!(
        out,
        vec![
            Integer(3),
            Boolean(true),
            Boolean(true),
            Boolean(true),
            Boolean(true),
            String(b"function".to_vec())
        ]
    );
}

#[test]
fn the_random_state_holder_is_the_vms_own_after_a_load() {
    // A save whose package.loaded["luasnap.random_state"] is the string library: the next
    // save copied math.random's state words into string[1..4].
    let root = game_root(vec![(
        s("loaded"),
        table(vec![(s("luasnap.random_state"), perm("string"))]),
    )]);
    let mut vm = vm();
    load_game(&mut vm, &root).unwrap();
    vm.save_game().unwrap();
    let out = vm
        .exec(
            "return rawget(string, 1) == nil and rawget(string, 4) == nil",
            "=c",
        )
        .unwrap();
    assert_eq!(out, vec![luasnap::bridge::Value::Boolean(true)]);
}

// ----- finalizers of foreign saves -----

/// A foreign load that keeps finalizers, as `Game::from_save` (`simulate --load`) loads.
fn with_finalizers() -> luasnap::bridge::persist::LoadOptions {
    let mut opts = luasnap::bridge::persist::LoadOptions::foreign();
    opts.finalizers = true;
    opts
}

/// `{ victim, ... }` whose members have the metatable `{ __gc = gc }`.
fn finalized(gc: Node, members: usize) -> Node {
    let mt = table(vec![(s("__gc"), gc)]);
    let mut entries = vec![(
        Node::Int(1),
        Node::Table {
            narr: 0,
            nhash: 0,
            meta: Box::new(mt),
            entries: vec![(s("x"), Node::Int(1))],
        },
    )];
    // Objects 0 (the list), 1 (the first member), 2 (the metatable): the others share it.
    for i in 1..members {
        entries.push((
            Node::Int(i as i64 + 1),
            Node::Table {
                narr: 0,
                nhash: 0,
                meta: Box::new(Node::Ref(2)),
                entries: vec![],
            },
        ));
    }
    table(entries)
}

#[test]
fn foreign_finalizers_are_never_library_or_host_functions() {
    // simulate --load (foreign, finalizers on) took any permanent as __gc: table.concat over
    // 1,900 references to a 1 MB string grew the heap to 2 GB, table.sort over 50,000 took
    // 17 s, both with hooks off, even after a refused load. A host native counts here.
    let mut vm = vm();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    vm.register_native("host.touch", move |call| {
        c.fetch_add(1, Ordering::SeqCst);
        call.ret(1);
        Ok(())
    })
    .unwrap();
    for gc in ["host.touch", "table.concat", "table.sort", "print"] {
        let file = forge::file(&finalized(perm(gc), 100));
        let e = vm
            .unpersist_with(&file, "loaded", &with_finalizers())
            .unwrap_err()
            .to_string();
        assert!(e.contains("C function as its finalizer"), "{gc}: {e}");
    }
    // A table with __call is no finalizer either.
    let callable = Node::Table {
        narr: 0,
        nhash: 0,
        meta: Box::new(table(vec![(s("__call"), perm("host.touch"))])),
        entries: vec![],
    };
    let e = vm
        .unpersist_with(
            &forge::file(&finalized(callable, 3)),
            "loaded",
            &with_finalizers(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a function"), "{e}");
    vm.exec("collectgarbage() collectgarbage()", "=gc").unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a refused load left a finalizer"
    );
}

/// The game: `note` counts finalizations, `spin` never returns.
const FINALIZING_GAME: &str = "finalized = 0
function note() finalized = finalized + 1 end
function spin() local n = 0 while true do n = n + 1 end end
function collect() collectgarbage() collectgarbage() return finalized end";

/// A foreign file whose 50 members are finalized by the game's global function `name`.
fn game_finalized(vm: &Vm, name: &str) -> Vec<u8> {
    let body = forge::decode(forge::body_of(&vm.persist(name).unwrap()).unwrap()).unwrap();
    forge::file(&finalized(body, 50))
}

#[test]
fn foreign_finalizers_of_the_games_own_functions_run() {
    let mut vm = vm();
    vm.exec(FINALIZING_GAME, "=game").unwrap();
    let file = game_finalized(&vm, "note");
    vm.unpersist_with(&file, "loaded", &with_finalizers())
        .unwrap();
    vm.exec("loaded = nil", "=drop").unwrap();
    // Marked when the load ended: each member runs note once.
    assert_eq!(
        vm.call::<i64>("collect", ()).unwrap(),
        50,
        "the loaded objects lost their finalizers"
    );
}

#[test]
fn finalizers_run_under_the_calls_instruction_budget() {
    // Lua runs finalizers with hooks off: a game function a foreign save made a finalizer ran
    // outside every budget (here it never returns).
    in_child("finalizers_run_under_the_calls_instruction_budget", || {
        let mut vm = vm();
        vm.exec(FINALIZING_GAME, "=game").unwrap();
        let file = game_finalized(&vm, "spin");
        vm.unpersist_with(&file, "loaded", &with_finalizers())
            .unwrap();
        vm.exec("loaded = nil", "=drop").unwrap();
        let e = vm
            .call_with_budget::<i64>("collect", (), 1_000_000)
            .unwrap_err();
        assert!(
            matches!(e, luasnap::VmError::InstructionBudget { .. }),
            "{e}"
        );
    });
}

#[test]
fn a_vm_dropped_with_finalizers_that_never_end_closes_and_reports_them() {
    // Dropping a VM runs the finalizers left (Lua's lua_close), which stock Lua runs with hooks
    // off: a game function a foreign save made a finalizer kept the drop from returning. They
    // run under CLOSE_BUDGET (Lua patch 8), and each one stopped is Lua's `__gc` warning.
    let Some(stderr) = in_child(
        "a_vm_dropped_with_finalizers_that_never_end_closes_and_reports_them",
        || {
            let mut vm = vm();
            vm.exec("warn('@on')", "=on").unwrap();
            vm.exec(FINALIZING_GAME, "=game").unwrap();
            let file = game_finalized(&vm, "spin");
            vm.unpersist_with(&file, "loaded", &with_finalizers())
                .unwrap();
            drop(vm);
        },
    ) else {
        return;
    };
    assert!(
        stderr.contains("error in __gc") && stderr.contains("instruction budget spent"),
        "{stderr}"
    );
    // Named as the budget that stopped them (not a call's, which the drop is not).
    assert!(
        stderr.contains("CLOSE_BUDGET") && !stderr.contains("Vm::call_with_budget"),
        "{stderr}"
    );
}

// ----- the globals as a permanent -----

#[test]
fn foreign_saves_name_the_globals_only_where_the_host_allows() {
    // A file that names _G can put it where game code writes (player.inventory = _G).
    let root = table(vec![(s("inventory"), perm("_G"))]);
    let file = forge::file(&root);
    let mut vm = vm();
    let e = vm.unpersist(&file, "player", Trust::Foreign).unwrap_err();
    assert!(e.to_string().contains("_G"), "{e}");
    let mut opts = luasnap::bridge::persist::LoadOptions::foreign();
    opts.denied_permanents.retain(|d| d != "_G");
    vm.unpersist_with(&file, "player", &opts).unwrap();
    assert_eq!(
        vm.exec("return player.inventory == _G", "=c").unwrap(),
        vec![luasnap::bridge::Value::Boolean(true)]
    );
    // Own saves name it as before.
    vm.unpersist(&file, "mine", Trust::Own).unwrap();
}

/// `{ f, g }` of a game where `f` reads a global (its one upvalue is `_ENV`) and `g` returns
/// its upvalue `t`, decoded: the root is object 0, `f` object 1 whose `_ENV` is the first
/// permanent (`_G`, object 2), `g` object 3 (prototype 1), its `t` object 4.
fn env_and_local() -> (Vm, Node) {
    let vm = vm();
    vm.exec(
        "local t = {} function f() return print end function g() return t end
         pair = { f, g }",
        "=game",
    )
    .unwrap();
    let node = forge::decode(forge::body_of(&vm.persist("pair").unwrap()).unwrap()).unwrap();
    (vm, node)
}

/// The closure of `node` (a table) under the key `key`.
fn closure_at(node: &mut Node, key: i64) -> &mut Node {
    let Node::Table { entries, .. } = node else {
        panic!("a table")
    };
    &mut entries
        .iter_mut()
        .find(|(k, _)| *k == Node::Int(key))
        .expect("the key")
        .1
}

#[test]
fn the_globals_are_only_ever_a_functions_env_in_a_foreign_load() {
    use luasnap::bridge::persist::forge::Upval;
    let (mut vm, honest) = env_and_local();
    // The honest save: f's _ENV is _G, named by the file.
    vm.unpersist(&forge::file(&honest), "copy", Trust::Foreign)
        .unwrap();
    assert_eq!(
        vm.exec("return copy[1]() == print", "=c").unwrap(),
        vec![luasnap::bridge::Value::Boolean(true)]
    );
    let g_env_index = |node: &Node| match node {
        Node::LClosure { upvals, .. } => upvals.len() as u64,
        _ => panic!("a closure"),
    };
    let mut forged = Vec::new();
    // _G (object 2) again, as an entry: game code writing pair.inv writes the globals.
    let mut entry = honest.clone();
    if let Node::Table { entries, .. } = &mut entry {
        entries.push((s("inv"), Node::Ref(2)));
    }
    forged.push(("an entry", entry));
    // As g's upvalue t.
    let mut upval = honest.clone();
    if let Node::LClosure { upvals, .. } = closure_at(&mut upval, 2) {
        upvals[0] = Upval::New(Node::Ref(2));
    }
    forged.push(("another upvalue", upval));
    // g's t shared with f's _ENV.
    let mut join = honest.clone();
    let n = g_env_index(closure_at(&mut join, 1));
    if let Node::LClosure { upvals, .. } = closure_at(&mut join, 2) {
        upvals[0] = Upval::Ref {
            closure: 1,
            index: n,
        };
    }
    forged.push(("a shared upvalue under another name", join));
    // As a metatable.
    let mut meta = honest.clone();
    if let Node::Table { entries, .. } = &mut meta {
        entries.push((
            s("obj"),
            Node::Table {
                narr: 0,
                nhash: 0,
                meta: Box::new(Node::Ref(2)),
                entries: vec![],
            },
        ));
    }
    forged.push(("a metatable", meta));
    for (what, node) in forged {
        let e = vm
            .unpersist(&forge::file(&node), "bad", Trust::Foreign)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("_ENV") || e.contains("another variable's name"),
            "{what}: {e}"
        );
        // Own loads take the file as it is.
        vm.unpersist(&forge::file(&node), "mine", Trust::Own)
            .unwrap();
    }
    assert_eq!(
        vm.exec("return rawget(_G, 'bad') == nil", "=c").unwrap(),
        vec![luasnap::bridge::Value::Boolean(true)]
    );
}

#[test]
fn foreign_closures_share_no_upvalue_with_a_permanent() {
    use luasnap::bridge::persist::forge::Upval;
    // A closure joined to a live function's upvalue writes that function's variable.
    let (mut vm, honest) = env_and_local();
    vm.register_permanent("live_g", "g").unwrap();
    // pair.h: a closure of g's prototype whose t is the permanent live_g's t.
    let mut node = honest.clone();
    let g = closure_at(&mut node, 2).clone();
    if let Node::Table { entries, .. } = &mut node {
        entries.push((s("live"), perm("live_g")));
        let mut h = g;
        if let Node::LClosure { proto, upvals, .. } = &mut h {
            *proto = Proto::Index(1);
            upvals[0] = Upval::Ref {
                closure: 5,
                index: 1,
            };
        }
        entries.push((s("h"), h));
    }
    let e = vm
        .unpersist(&forge::file(&node), "bad", Trust::Foreign)
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not build"), "{e}");
}

// ----- strings chosen to collide for the VM's seed -----

/// The hash seed `vm` shows in its saves (any table layout holds it).
fn seed_shown_by(vm: &Vm) -> u32 {
    vm.exec(
        "shown = {} for i = 1, 50 do shown['k' .. i] = i end
         for i = 1, 50, 2 do shown['k' .. i] = nil end",
        "=t",
    )
    .unwrap();
    let node = forge::decode(forge::body_of(&vm.persist("shown").unwrap()).unwrap()).unwrap();
    forge::layout_seed(&node).expect("a layout")
}

#[test]
fn strings_chosen_to_collide_share_no_string_table_chain() {
    // Every short string is interned through Lua's string table, chained by its seeded hash:
    // strings sharing its low bits made each intern walk one chain (100K 8-byte strings:
    // `luasnap diff` 19.7 s instead of 0.05 s). The seed is fixed by the deterministic
    // profile and shown by every table layout a save carries.
    for mut vm in [
        Vm::builder()
            .capacity(512 * MIB)
            .deterministic(7)
            .build()
            .unwrap(),
        vm(),
    ] {
        let seed = seed_shown_by(&vm);
        let strings = forge::colliding_strings(seed, 16, 20_000, 8, 1);
        assert!(strings
            .iter()
            .all(|s| forge::lua_string_hash(s, seed) & 0xffff
                == forge::lua_string_hash(&strings[0], seed) & 0xffff));
        let file = forge::file(&table(
            strings
                .into_iter()
                .enumerate()
                .map(|(i, s)| (Node::Int(i as i64 + 1), Node::Str(s)))
                .collect(),
        ));
        vm.unpersist(&file, "many", Trust::Foreign).unwrap();
        let longest = vm.string_table_longest_chain();
        assert!(longest < 40, "a chain of {longest} strings");
        assert_eq!(
            vm.exec("return #many", "=n").unwrap(),
            vec![luasnap::bridge::Value::Integer(20_000)]
        );
    }
}

// ----- the value graph `luasnap diff` compares -----

#[test]
fn the_value_graph_of_a_deep_save_is_compact_and_capped() {
    // `luasnap diff` built its graph after two capped loads, with no cap of its own, at about
    // 600-700 bytes per object: two 7 MB saves of tables nested a million deep took 1.2 GB.
    let mut vm = Vm::builder()
        .capacity(512 * MIB)
        .deterministic(0)
        .build()
        .unwrap();
    let file = forge::file(&Node::Raw(forge::nested_tables(200_000, 1)));
    vm.unpersist(&file, "deep", Trust::Foreign).unwrap();
    let graph = vm.value_graph().unwrap();
    assert!(graph.objects() > 200_000, "{} objects", graph.objects());
    let per_object = graph.bytes() / graph.objects();
    assert!(per_object < 100, "{per_object} bytes per object");
    match vm.value_graph_within(4 * MIB) {
        Err(e @ luasnap::VmError::ValueGraphTooLarge { .. }) => {
            assert!(e.to_string().contains("--max-memory"), "{e}")
        }
        Err(e) => panic!("another error: {e}"),
        Ok(g) => panic!("a graph of {} bytes within 4 MiB", g.bytes()),
    }
    // The VM is unchanged by an extraction that stopped half-way.
    let again = vm.value_graph().unwrap();
    assert_eq!(again.digest(), graph.digest());
}

// ----- refused permanents, all named at once -----

/// json_town's state holds what serpent maps by name (`require`, `load`, `debug`, ...): a
/// foreign load used to name only the first, so a user allowed them one try at a time (about
/// six tries). One load now names them all, in one typed refusal, and allowing exactly those
/// loads the save.
#[test]
fn a_foreign_load_of_json_town_names_every_refused_permanent_at_once() {
    use luasnap::bridge::persist::{Accept, LoadError, LoadOptions};
    use luasnap::bridge::runtime::{scripted_input, Backend, Game, GameError};
    let cfg = common::folder("json_town", 2, 7);
    let mut game: Game = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..3 {
        game.step(&[scripted_input(7, f, 0), scripted_input(7, f, 1)])
            .unwrap();
    }
    let save = game.save_game().unwrap();
    let e = match Game::<u8>::from_save(&cfg, Backend::Serialize, &save) {
        Err(e) => e,
        Ok(_) => panic!("a foreign load of json_town took its permanents"),
    };
    let GameError::Load(LoadError::Refused {
        message,
        accept: Accept::Permanents { names, more },
    }) = &e
    else {
        panic!("not one refusal naming the permanents: {e}")
    };
    eprintln!("{e}");
    assert_eq!(*more, 0);
    for name in ["require", "load", "collectgarbage"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(names.len() >= 4, "{names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a name twice: {names:?}");
    assert!(
        message.contains(&format!("{} permanents", names.len())),
        "{message}"
    );
    assert!(e.to_string().contains("G.permanents"), "{e}");
    // Allowing the names of that one error is enough.
    let mut opts = LoadOptions::new(luasnap::bridge::persist::Trust::Foreign);
    opts.finalizers = true;
    opts.functions = luasnap::bridge::persist::FunctionBinding::Current;
    opts.allowed_permanents = names.clone();
    let loaded = Game::<u8>::from_save_with(&cfg, Backend::Serialize, &save, &opts);
    assert!(loaded.is_ok(), "{:?}", loaded.err().map(|e| e.to_string()));
}

/// Past `REFUSED_NAMES` refused permanents the error lists that many and counts the rest; one
/// refused permanent keeps the single-name refusal.
#[test]
fn refused_permanents_are_listed_up_to_a_cap_and_counted_past_it() {
    use luasnap::bridge::persist::{Accept, LoadError, REFUSED_NAMES};
    let src = vm();
    src.exec(
        "held = {}
         for _, lib in ipairs({ debug, os, io, package, string, table, math, coroutine, utf8 }) do
           for _, f in pairs(lib) do
             if type(f) == 'function' then held[#held + 1] = f end
           end
         end
         for _, f in pairs(_G) do
           if type(f) == 'function' then held[#held + 1] = f end
         end",
        "=held",
    )
    .unwrap();
    let save = src.save_game().unwrap();
    let mut dst = vm();
    let e = dst.load_game(&save, Trust::Foreign).unwrap_err();
    let LoadError::Refused {
        accept: Accept::Permanents { names, more },
        message,
    } = &e
    else {
        panic!("{e}")
    };
    eprintln!("{e}");
    assert_eq!(names.len(), REFUSED_NAMES, "{names:?}");
    assert!(*more > 0, "{message}");
    assert!(message.contains(&format!(" and {more} more")), "{message}");
    assert!(e.to_string().contains("the next load names"), "{e}");
    // Allowing those: the next load names the rest, none of them again.
    let mut opts = luasnap::bridge::persist::LoadOptions::new(Trust::Foreign);
    opts.allowed_permanents = names.clone();
    let mut dst = vm();
    let e2 = dst.load_game_with(&save, &opts).unwrap_err();
    let rest = match &e2 {
        LoadError::Refused {
            accept:
                Accept::Permanents {
                    names: rest,
                    more: 0,
                },
            ..
        } => rest.clone(),
        LoadError::Refused {
            accept: Accept::Permanent(name),
            ..
        } => vec![name.clone()],
        _ => panic!("{e2}"),
    };
    assert_eq!(rest.len(), *more, "{e2}");
    assert!(rest.iter().all(|n| !names.contains(n)), "{e2}");

    // One refused permanent: the single-name refusal, as before.
    let src = vm();
    src.exec("held = { os.exit }", "=one").unwrap();
    let mut dst = vm();
    let e = dst
        .load_game(&src.save_game().unwrap(), Trust::Foreign)
        .unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { accept: Accept::Permanent(n), .. } if n == "os.exit"),
        "{e}"
    );
}

/// A refused permanent is recorded and the load goes on, but no Lua code runs while the load
/// holds one: a registered constructor's rebuild closure whose upvalue is a refused permanent
/// is not called (the refusal comes first).
#[test]
fn no_load_time_call_runs_while_a_refused_permanent_is_held() {
    use luasnap::bridge::persist::{Accept, LoadError};
    let game = "Vec = {} Vec.__index = Vec
        Vec.__persist = function(v)
          local f = v.f
          return function() called = true return setmetatable({ r = f('PATH') }, Vec) end
        end";
    let a = vm();
    a.exec(game, "game").unwrap();
    a.exec("saved = { p = setmetatable({ f = os.getenv }, Vec) }", "s")
        .unwrap();
    let file = a.persist("saved").unwrap();
    let mut b = vm();
    b.exec(game, "game").unwrap();
    b.register_constructor("Vec.__persist").unwrap();
    let e = b.unpersist(&file, "loaded", Trust::Foreign).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { accept: Accept::Permanent(n), .. } if n == "os.getenv"),
        "{e}"
    );
    assert_eq!(
        b.exec("return called == nil", "probe").unwrap(),
        vec![luasnap::bridge::Value::Boolean(true)],
        "the rebuild ran"
    );
}
