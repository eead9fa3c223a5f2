//! The bodies of the fuzz targets (`fuzz/fuzz_targets/`), here so that `cargo test` replays
//! their corpora with the same code (`tests/fuzz_corpus.rs`).
//!
//! Two targets share one VM setup, one dictionary and one way of using what loaded:
//! - `load` ([`fuzz_load`]): the input as a file, then as a body behind a valid header;
//! - `structured` ([`fuzz_structured`]): the input drives edits of well-formed trees
//!   (decoded honest saves of every kind of object, see [`fuzz_seeds`]) and generated
//!   subtrees: permanents by name from the dictionary, forged frames, upvalues and counts.
//!
//! Every file is loaded as an own save (with a deny list for what would touch the process:
//! files, the shell, stdin) and as a foreign one; whatever loads is then used (functions
//! called, coroutines resumed, tables iterated), everything collected and the arena's map
//! verified, so damage that does not crash at once still fails the run.

use super::forge::{self, seal_body, FrameRec, Node, Proto, Upval};
use super::format::{CallFrame, LayoutNode, RemovedKey};
use super::options::LoadOptions;
use super::permanents::UNPERMS_KEY;
use crate::bridge::vm::Vm;
use mlua_sys::{self as ffi, lua_State};
use std::cell::Cell;
use std::ffi::c_int;

/// Game code the fuzz VM runs, so fuzzed files can name real prototypes: every kind of
/// object, and coroutines suspended at every kind of instruction that can yield.
#[doc(hidden)]
pub const FUZZ_GAME: &str = r#"
local Vec = {} Vec.__index = Vec
Vec.__persist = function(v) local x, y = v.x, v.y return function() return setmetatable({ x = x, y = y }, Vec) end end
VecType = Vec
Pair = {}
Pair.__persist = function(p) local a = p.a return function() return setmetatable({}, Pair) end, function(o) o.a = a end end
function make_state()
  local n = 0
  local function counter() n = n + 1 return n end
  local co = coroutine.create(function(a)
    local total = a
    while true do
      local ok, v = pcall(function() return coroutine.yield(total) end)
      total = total + (tonumber(v) or 0)
    end
  end)
  coroutine.resume(co, 1)
  local t = { 1, 2.5, "three", true, counter = counter, co = co, v = setmetatable({ x = 1, y = 2 }, Vec) }
  t.self = t
  t.pair = setmetatable({ a = t }, Pair)
  return t
end
local function started(f, ...) local co = coroutine.create(f) coroutine.resume(co, ...) return co end
function shapes()
  local up = 0
  local s = {}
  s.call = started(function(a) local t = { 1, 2, coroutine.yield(a) } return #t end, 1)
  s.pcall = started(function() local ok, v = pcall(coroutine.yield, 1) return v end)
  s.xpcall = started(function() return xpcall(function() local x = 'a' .. coroutine.yield('x') return x end, tostring) end)
  s.index = started(function() local t = setmetatable({}, { __index = function(_, k) return coroutine.yield(k) end }) return t.x end)
  s.newindex = started(function() local t = setmetatable({}, { __newindex = function(_, k, v) coroutine.yield(v) end }) t.x = 1 return 2 end)
  s.arith = started(function() local t = setmetatable({}, { __add = function(a, b) return coroutine.yield(b) end }) return t + 1 end)
  s.lt = started(function() local m = { __lt = function() return coroutine.yield() end } local a, b = setmetatable({}, m), setmetatable({}, m) if a < b then return 1 end return 0 end)
  s.concat = started(function() local m = { __concat = function(a, b) return coroutine.yield('c') end } local t = setmetatable({}, m) return 'a' .. 'b' .. t .. 'd' end)
  s.forin = started(function() local n = 0 for v in coroutine.yield do n = n + v end return n end)
  s.tail = started(function() return coroutine.yield(1) end)
  s.vararg = started(function(...) local a, b = ... coroutine.yield(a) return select('#', ...) end, 1, 2, 3)
  s.shared = started(function() local x = 1 s.get = function() x = x + 1 return x end coroutine.yield() return x end)
  s.wrap = coroutine.wrap(function() coroutine.yield(1) coroutine.yield(2) end)
  s.wrap()
  s.notstarted = coroutine.create(function(a, b) return a + b end)
  s.dead = started(function() end)
  s.bump = function() up = up + 1 return up end
  s.weak = setmetatable({ {} }, { __mode = "k" })
  return s
end
-- Registers the VM trusts in a resumed frame, and a frame without a captured local.
function shapes2()
  local s = {}
  s.fornum = started(function() local n = 0 for i = 1, 10 do n = n + coroutine.yield(i) end return n end)
  s.forfloat = started(function() local n = 0 for x = 0.5, 9.5 do n = n + coroutine.yield(x) end return n end)
  s.vatab = started(function(...t) local u = t coroutine.yield(u.n) return select('#', ...) end, 1, 2)
  s.noclose = started(function(a) local b, c = a, a coroutine.yield(b) return c end, 4)
  s.bump = function() return s end
  return s
end
-- Tables whose hash parts keep a layout (format 5): collisions, removed entries, lastfree.
function layouts()
  local t = {}
  for i = 1, 40 do t["k" .. i] = i end
  for i = 1, 40, 3 do t["k" .. i] = nil end
  t.z = true
  local u = { [1.5] = 1, [true] = 2, [false] = 3, [-7] = 4, [2^53] = 5, x = 6 }
  u[-7] = nil
  local w = {}
  for i = 1, 12 do w[i * 1000] = i end
  w[2000] = nil w[5000] = nil w.s = "s"
  return { t = t, u = u, w = w, list = { 1, 2, 3, key = "v" } }
end
-- Coroutines suspended in pairs() loops that cleared their current entry (format 10's removed
-- keys after the root): keys that are tables, functions, C functions and strings.
function removed()
  local sets = { t = {}, f = {}, c = {}, s = {} }
  local cf = { type, rawget, rawset, rawequal, rawlen, select, tostring, tonumber }
  for i = 1, 8 do
    sets.t[{}] = i sets.f[function() return i end] = i sets.c[cf[i]] = i sets.s['s' .. i] = i
  end
  local walks = {}
  for name, t in pairs(sets) do
    local w = coroutine.wrap(function()
      for k in pairs(t) do t[k] = nil coroutine.yield(name) end
    end)
    w() w()
    walks[name] = w
  end
  return { sets = sets, walks = walks }
end
-- Tables marked for finalization (format 8 marks), one dropped from the saved graph.
finalized = 0
function finals()
  local Fin = { __gc = function(o) finalized = finalized + (o.n or 1) end }
  local a, b = setmetatable({ n = 1 }, Fin), setmetatable({ n = 10 }, Fin)
  setmetatable({ n = 100 }, Fin)
  local c = setmetatable({ n = 1000 }, Fin)
  return { a = a, b = b, c = c, list = { a, c }, plain = setmetatable({}, { __index = Fin }) }
end
"#;

/// Permanents the fuzz VM's own-save loads may not name: what would touch the process
/// (files, stdin, stdout) rather than the VM.
const FUZZ_OWN_DENIED: [&str; 8] = [
    "os", "io", "load", "loadfile", "dofile", "require", "package", "print",
];

/// A VM for fuzzing: deterministic profile (no os, io or debug), [`FUZZ_GAME`] loaded, its
/// `__persist` functions registered as constructors.
#[doc(hidden)]
pub fn fuzz_vm() -> Vm {
    fuzz_vm_at(None)
}

/// As [`fuzz_vm`], with its arena at `base` if given: the same addresses in every process, so
/// what two builds make of the same input compares byte for byte (`examples/diffload.rs`).
#[doc(hidden)]
pub fn fuzz_vm_at(base: Option<usize>) -> Vm {
    let mut builder = Vm::builder()
        .capacity(1 << 30)
        .memory_limit(256 << 20)
        .deterministic(1);
    if let Some(base) = base {
        builder = builder.base_address(base);
    }
    let mut vm = builder.build().expect("a fuzz VM");
    vm.exec(FUZZ_GAME, "game").expect("the fuzz game loads");
    vm.register_constructor("VecType.__persist")
        .expect("a function");
    vm.register_constructor("Pair.__persist")
        .expect("a function");
    vm
}

/// The names of every permanent of `vm` (the dictionary both targets draw names from).
#[doc(hidden)]
pub fn permanent_names(vm: &Vm) -> Vec<String> {
    let mut names = Vec::new();
    let _ = vm.run(
        &mut |L| {
            // SAFETY: protected body; reads the registry's unperms table, balanced pushes.
            unsafe {
                if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr())
                    == ffi::LUA_TTABLE
                {
                    ffi::lua_pushnil(L);
                    while ffi::lua_next(L, -2) != 0 {
                        if ffi::lua_type(L, -2) == ffi::LUA_TSTRING {
                            let mut len = 0;
                            let p = ffi::lua_tolstring(L, -2, &mut len);
                            let b = std::slice::from_raw_parts(p.cast::<u8>(), len);
                            names.push(String::from_utf8_lossy(b).into_owned());
                        }
                        ffi::lua_settop(L, -2);
                    }
                }
                ffi::lua_settop(L, 0);
            }
            0
        },
        |_, _| (),
    );
    names.sort();
    names
}

/// Decoded honest saves of everything [`FUZZ_GAME`] makes: the trees the structured target
/// edits.
#[doc(hidden)]
pub fn fuzz_seeds(vm: &Vm) -> Vec<Node> {
    let mut seeds = Vec::new();
    for code in [
        "fuzz_saved = make_state()",
        "fuzz_saved = shapes()",
        "local s = shapes() fuzz_saved = { s.call, s.pcall, s.xpcall }",
        "local s = shapes() fuzz_saved = { s.index, s.newindex, s.arith, s.lt }",
        "local s = shapes() fuzz_saved = { s.concat, s.forin, s.tail, s.vararg }",
        "local s = shapes() fuzz_saved = { s.shared, s.get, s.wrap, s.bump }",
        "fuzz_saved = { 1, -2, 3.5, 'str', true, false, { a = { b = {} } } }",
        "fuzz_saved = shapes2()",
        "fuzz_saved = layouts()",
        "local s = shapes2() fuzz_saved = { s.fornum, s.forfloat, s.vatab, s.noclose, s.bump }",
        "fuzz_saved = finals()",
        "fuzz_saved = removed()",
    ] {
        if vm.exec(code, "seed").is_err() {
            continue;
        }
        if let Ok(file) = vm.persist("fuzz_saved") {
            if let Some(n) = forge::body_of(&file).and_then(forge::decode) {
                seeds.push(n);
            }
        }
    }
    let _ = vm.exec("fuzz_saved = nil", "seed");
    seeds
}

/// The options of the own-save load of a fuzz input.
#[doc(hidden)]
pub fn own_options() -> LoadOptions {
    LoadOptions {
        instruction_budget: 200_000,
        max_heap_growth: Some(64 << 20),
        denied_permanents: FUZZ_OWN_DENIED.iter().map(|s| s.to_string()).collect(),
        ..LoadOptions::own()
    }
}

/// The options of the foreign-save load of a fuzz input.
#[doc(hidden)]
pub fn foreign_options() -> LoadOptions {
    let mut opts = LoadOptions {
        instruction_budget: 200_000,
        max_heap_growth: Some(64 << 20),
        ..LoadOptions::foreign()
    };
    opts.denied_permanents.push("print".into());
    opts
}

/// A foreign load that keeps finalizers, as `Game::from_save` (`simulate --load`) loads.
fn foreign_finalizer_options() -> LoadOptions {
    LoadOptions {
        finalizers: true,
        ..foreign_options()
    }
}

/// The graph `luasnap diff` compares may hold this much of a fuzz input's state.
const GRAPH_CAP: usize = 32 << 20;

/// Drops what loaded and runs a full collection, with the finalizers it runs (game functions
/// a foreign save made finalizers) under an instruction budget.
fn clear(vm: &Vm) {
    let _ = vm.exec(
        "function fuzz_clear() loaded = nil collectgarbage() end",
        "clear",
    );
    let _ = vm.call_with_budget::<()>("fuzz_clear", (), 2_000_000);
}

/// Loads `file` as an own save and as a foreign one into a VM from [`fuzz_vm`], uses
/// whatever loaded, collects everything and verifies the arena (panics if it is damaged).
#[doc(hidden)]
pub fn load_and_use(vm: &mut Vm, file: &[u8]) {
    for opts in [
        own_options(),
        foreign_options(),
        foreign_finalizer_options(),
    ] {
        if vm.unpersist_with(file, "loaded", &opts).is_ok() {
            poke(vm);
        }
        // A full collection walks every live object, so a load (or a resumed coroutine) that
        // damaged the heap without crashing is caught here rather than never.
        clear(vm);
        if let Err(e) = vm.arena().verify() {
            panic!("the arena is damaged after loading a fuzzed file: {e}");
        }
    }
}

/// Loads `file` as a foreign whole-game save (its root's `globals`, `loaded` and kept-name
/// lists restore the VM's `_G` and `package.loaded`), checks that no library table changed
/// (kept-name lists used to plant `_G`, `os`... in them, or in whatever table the file put at
/// `root.loaded`), then rolls the VM back.
#[doc(hidden)]
pub fn load_game_and_use(vm: &mut Vm, file: &[u8]) {
    let Ok(before) = vm.snapshot() else {
        return;
    };
    let libraries = library_sizes(vm);
    for opts in [foreign_options(), foreign_finalizer_options()] {
        if vm.load_game_with(file, &opts).is_ok() {
            assert_eq!(
                library_sizes(vm),
                libraries,
                "a foreign game load changed a library table"
            );
            poke(vm);
        }
        clear(vm);
        if let Err(e) = vm.arena().verify() {
            panic!("the arena is damaged after loading a fuzzed game: {e}");
        }
        vm.rollback(before)
            .expect("the snapshot before the game load");
    }
}

/// The number of entries of every table among the VM's permanents (the libraries), by name,
/// but the two a game load restores (`_G` and `package.loaded`).
fn library_sizes(vm: &Vm) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let _ = vm.run(
        &mut |L| {
            // SAFETY: protected body; raw reads of the registry's permanents table and of
            // the tables among its keys; balanced pushes.
            unsafe {
                if ffi::lua_getfield(
                    L,
                    ffi::LUA_REGISTRYINDEX,
                    super::permanents::PERMS_KEY.as_ptr(),
                ) == ffi::LUA_TTABLE
                {
                    let perms = ffi::lua_gettop(L);
                    ffi::lua_pushnil(L);
                    while ffi::lua_next(L, perms) != 0 {
                        if ffi::lua_type(L, perms + 1) == ffi::LUA_TTABLE
                            && ffi::lua_type(L, perms + 2) == ffi::LUA_TSTRING
                        {
                            let mut len = 0usize;
                            let p = ffi::lua_tolstring(L, perms + 2, &mut len);
                            let name = String::from_utf8_lossy(std::slice::from_raw_parts(
                                p.cast::<u8>(),
                                len,
                            ))
                            .into_owned();
                            let mut n = 0usize;
                            ffi::lua_pushnil(L);
                            while ffi::lua_next(L, perms + 1) != 0 {
                                n += 1;
                                ffi::lua_settop(L, -2);
                            }
                            if name != "_G" && name != "package.loaded" {
                                out.push((name, n));
                            }
                        }
                        ffi::lua_settop(L, perms + 1);
                    }
                }
            }
            0
        },
        |_, _| (),
    );
    out.sort();
    out
}

/// Extracts the value graph `luasnap diff` compares, under a cap, twice: a graph is equal to
/// itself (no differences), or extraction stops with its typed error.
fn graph_of_state(vm: &mut Vm) {
    let Ok(a) = vm.value_graph_within(GRAPH_CAP) else {
        return;
    };
    let b = vm
        .value_graph_within(GRAPH_CAP)
        .expect("a second extraction of the same state");
    let d = a.diff(&b, 4);
    assert!(
        d.equal && d.differences.is_empty(),
        "a state differs from itself: {:?}",
        d.differences
    );
}

/// One input of the byte target: the bytes as a file, then as a body behind a valid header
/// (past the checksum, so the parser itself is exercised).
#[doc(hidden)]
pub fn fuzz_load(vm: &mut Vm, data: &[u8]) {
    load_and_use(vm, data);
    load_and_use(vm, &seal_body(data, true));
}

/// One input of the structured target: a tree built from `seeds` and `dict` as the input's
/// bytes direct, encoded behind a valid header, then loaded and used as by [`fuzz_load`].
#[doc(hidden)]
pub fn fuzz_structured(vm: &mut Vm, data: &[u8], seeds: &[Node], dict: &[String]) {
    let node = structured(data, seeds, dict);
    let file = forge::file(&node);
    match Attack::of(data) {
        Some(Attack::KeptLists) => load_game_and_use(vm, &file),
        Some(Attack::Deep) => {
            if vm
                .unpersist_with(&file, "loaded", &foreign_options())
                .is_ok()
            {
                graph_of_state(vm);
            }
            clear(vm);
        }
        _ => load_and_use(vm, &file),
    }
}

/// The classes of attack on foreign loads that the structured target builds into a tree
/// besides its edits (issue 21), chosen by the input's last byte.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Attack {
    /// Strings that share the low bits of their hash for the VM's seed (which every table
    /// layout shows).
    CollidingStrings,
    /// A whole-game root whose `globals` and `loaded` are permanents or shared tables, with
    /// kept-name lists naming denied libraries.
    KeptLists,
    /// Objects whose metatable's `__gc` is a permanent (a library function or table).
    PermanentFinalizer,
    /// Tables nested deep, then compared as `luasnap diff` compares.
    Deep,
    /// Objects awaiting finalization after the root (format 9): marked tables with a
    /// permanent `__gc`, any generated value, forged counts.
    Pending,
    /// Removed keys after the root (format 10): entries naming any object id, node and dead
    /// flag, with references, permanents or any generated value as keys, forged counts.
    RemovedKeys,
}

impl Attack {
    /// None for an empty input: it stands for a seed unchanged.
    fn of(data: &[u8]) -> Option<Attack> {
        match data.last()? % 12 {
            0 => Some(Attack::CollidingStrings),
            1 => Some(Attack::KeptLists),
            2 => Some(Attack::PermanentFinalizer),
            3 => Some(Attack::Deep),
            4 => Some(Attack::Pending),
            5 => Some(Attack::RemovedKeys),
            _ => None,
        }
    }

    /// Builds the attack into `node` (a tree of the structured target).
    fn build(self, node: Node, g: &mut Gen<'_>) -> Node {
        match self {
            Attack::CollidingStrings => {
                let seed = g
                    .layouts
                    .first()
                    .and_then(|b| super::format::Reader::new(b).varint())
                    .unwrap_or(0) as u32;
                let n = 1 + g.below(3000);
                let strings = forge::colliding_strings(seed, 12, n, 8, g.u8() as u64);
                let list = Node::Table {
                    narr: n as u64,
                    nhash: 0,
                    meta: Box::new(Node::Nil),
                    entries: (1..)
                        .zip(strings)
                        .map(|(i, s)| (Node::Int(i), Node::Str(s)))
                        .collect(),
                };
                push_entry(node, list)
            }
            Attack::KeptLists => {
                // The root's own table (object 0) is one choice: the ids of the tree stay
                // as they were, the new objects go last.
                let place = |g: &mut Gen<'_>| match g.below(4) {
                    0 => Node::Perm(Box::new(g.name())),
                    1 => Node::Perm(Box::new(forge::str(
                        ["string", "table", "_G", "package.loaded", "math"][g.below(5)],
                    ))),
                    2 => Node::Ref(g.small()),
                    _ => Node::Ref(0),
                };
                let names = |g: &mut Gen<'_>| {
                    let n = g.below(6);
                    Node::Table {
                        narr: n as u64,
                        nhash: 0,
                        meta: Box::new(Node::Nil),
                        entries: (1..=n as i64)
                            .map(|i| {
                                let name = match g.below(3) {
                                    0 => g.name(),
                                    _ => forge::str(
                                        ["os", "io", "debug", "package", "_G", "string"]
                                            [g.below(6)],
                                    ),
                                };
                                (Node::Int(i), name)
                            })
                            .collect(),
                    }
                };
                let mut node = node;
                for key in ["globals", "globals_kept", "loaded", "loaded_kept"] {
                    let v = if key.ends_with("kept") {
                        names(g)
                    } else {
                        place(g)
                    };
                    node = push_keyed(node, forge::str(key), v);
                }
                node
            }
            Attack::PermanentFinalizer => {
                let gc = Node::Perm(Box::new(match g.below(3) {
                    0 => g.name(),
                    _ => forge::str(["table.concat", "table.sort", "make_state"][g.below(3)]),
                }));
                let members = g.below(200) as i64;
                let victim = Node::Table {
                    narr: members as u64,
                    nhash: 0,
                    meta: Box::new(forge::table(vec![("__gc", gc)])),
                    entries: (1..=members)
                        .map(|i| (Node::Int(i), forge::str("x")))
                        .collect(),
                };
                push_entry(node, victim)
            }
            Attack::Pending => {
                let k = 1 + g.below(4);
                let list: Vec<Node> = (0..k)
                    .map(|i| match g.below(3) {
                        0 => g.node(1),
                        _ => Node::Final(
                            g.delta(i as u64 + 1),
                            Box::new(Node::Table {
                                narr: 0,
                                nhash: 1,
                                meta: Box::new(forge::table(vec![(
                                    "__gc",
                                    Node::Perm(Box::new(forge::str("table.concat"))),
                                )])),
                                entries: vec![(forge::str("id"), Node::Int(i as i64))],
                            }),
                        ),
                    })
                    .collect();
                Node::Pending {
                    root: Box::new(node),
                    n: if g.below(4) == 0 {
                        g.delta(k as u64)
                    } else {
                        k as u64
                    },
                    list,
                }
            }
            Attack::RemovedKeys => {
                let k = 1 + g.below(6);
                let entries: Vec<(u64, u64, u64, Node)> = (0..k)
                    .map(|_| {
                        let key = match g.below(4) {
                            0 => Node::Ref(g.delta(1)),
                            1 => Node::StrRef(g.delta(1)),
                            2 => Node::Perm(Box::new(g.name())),
                            _ => g.node(1),
                        };
                        (g.delta(0), g.delta(1), g.delta(0), key)
                    })
                    .collect();
                Node::RemovedKeys {
                    root: Box::new(node),
                    n: if g.below(4) == 0 {
                        g.delta(k as u64)
                    } else {
                        k as u64
                    },
                    entries,
                }
            }
            Attack::Deep => {
                let depth = 1 + g.below(60_000);
                push_entry(
                    node,
                    Node::Raw(forge::nested_tables(depth, g.small() as i64)),
                )
            }
        }
    }
}

/// `node` with `v` added at a new integer key, if it is a table (else `{ node, v }`).
fn push_entry(node: Node, v: Node) -> Node {
    let k = match &node {
        Node::Table { entries, .. } => Node::Int(2000 + entries.len() as i64),
        _ => Node::Int(2000),
    };
    push_keyed(node, k, v)
}

/// `node` with `v` added at `k`, if it is a table (else `{ node, v }`).
fn push_keyed(node: Node, k: Node, v: Node) -> Node {
    match node {
        Node::Table {
            narr,
            nhash,
            meta,
            mut entries,
        } => {
            entries.push((k, v));
            Node::Table {
                narr,
                nhash,
                meta,
                entries,
            }
        }
        other => Node::Table {
            narr: 2,
            nhash: 0,
            meta: Box::new(Node::Nil),
            entries: vec![(Node::Int(1), other), (Node::Int(2), v)],
        },
    }
}

/// The tree an input of the structured target stands for (also used to write its corpus).
#[doc(hidden)]
pub fn structured(data: &[u8], seeds: &[Node], dict: &[String]) -> Node {
    let mut g = Gen {
        data,
        pos: 0,
        dict,
        protos: Vec::new(),
        layouts: Vec::new(),
    };
    let mut node = if seeds.is_empty() || g.below(8) == 7 {
        forge::table(vec![])
    } else {
        seeds[g.below(seeds.len())].clone()
    };
    g.protos = protos_of(&node);
    g.layouts = layouts_of(&node);
    // Edits in place: ids and prototype numbers stay consistent, so most files get deep.
    let edits = g.below(6);
    for _ in 0..edits {
        let mut nodes = 0usize;
        forge::walk_mut(&mut node, &mut |_| nodes += 1);
        let target = g.below(nodes.max(1));
        let mut i = 0;
        let mut edit = g.below(100);
        let mut gen_data = g.take(24);
        forge::walk_mut(&mut node, &mut |n| {
            if i == target {
                let mut sub = Gen {
                    data: gen_data,
                    pos: 0,
                    dict: g.dict,
                    protos: g.protos.clone(),
                    layouts: g.layouts.clone(),
                };
                edit_node(n, edit, &mut sub);
                gen_data = &[];
                edit = 0;
            }
            i += 1;
        });
    }
    // New objects go last (after every object the tree numbers), so ids stay consistent.
    if let Node::Table { entries, .. } = &mut node {
        for _ in 0..g.below(4) {
            let k = Node::Int(1000 + entries.len() as i64);
            let v = g.node(0);
            entries.push((k, v));
        }
    }
    match Attack::of(data) {
        Some(a) => a.build(node, &mut g),
        None => node,
    }
}

/// Prototypes listed in a tree, in order (index, and the `New` record).
fn protos_of(node: &Node) -> Vec<Proto> {
    let mut out = Vec::new();
    let mut n = node.clone();
    forge::walk_mut(&mut n, &mut |x| {
        if let Node::LClosure {
            proto: p @ Proto::New { .. },
            ..
        } = x
        {
            out.push(p.clone());
        }
    });
    out
}

/// The table layouts (format 5) in a tree, in order.
fn layouts_of(node: &Node) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut n = node.clone();
    forge::walk_mut(&mut n, &mut |x| {
        if let Node::Table { entries, .. } = x {
            for (k, _) in entries.iter() {
                if let Node::Layout(b) = k {
                    out.push(b.clone());
                }
            }
        }
    });
    out
}

/// Input bytes as choices (zeros once they run out).
struct Gen<'a> {
    data: &'a [u8],
    pos: usize,
    dict: &'a [String],
    protos: Vec<Proto>,
    /// Honest table layouts of the tree (their hash seed is the VM's).
    layouts: Vec<Vec<u8>>,
}

impl<'a> Gen<'a> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let v = if n <= 256 {
            self.u8() as usize
        } else {
            u16::from_le_bytes([self.u8(), self.u8()]) as usize
        };
        v % n
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos += n;
        &self.data[start..end]
    }

    /// Numbers that sit on boundaries: counts, levels, slots.
    fn small(&mut self) -> u64 {
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => self.below(8) as u64,
            3 => self.below(300) as u64,
            4 => 255 + self.below(3) as u64,
            5 => u32::MAX as u64 - self.below(3) as u64,
            6 => 1 << (self.below(63) as u64),
            _ => self.below(65536) as u64,
        }
    }

    fn delta(&mut self, v: u64) -> u64 {
        match self.below(6) {
            0 => v.wrapping_add(1),
            1 => v.wrapping_sub(1),
            2 => v.wrapping_add(2),
            3 => v.wrapping_sub(2),
            4 => v ^ (1 << self.below(16)),
            _ => self.small(),
        }
    }

    fn name(&mut self) -> Node {
        if self.dict.is_empty() {
            return forge::str("print");
        }
        let i = self.below(self.dict.len());
        forge::str(&self.dict[i].clone())
    }

    fn proto(&mut self) -> Proto {
        if self.protos.is_empty() || self.below(8) == 0 {
            Proto::Index(self.small())
        } else {
            // An index into those the tree listed: always already defined by the end.
            Proto::Index(self.below(self.protos.len()) as u64)
        }
    }

    /// A table layout (the bytes after `Tag::Layout`): an honest one of the tree with a few
    /// bytes changed, or one generated node by node (free, removed with a dead key, removed
    /// with an inline key, or a live entry by rank; chain links; `lastfree`), with the VM's
    /// hash seed when the tree has one (else the layout is skipped, not checked).
    fn layout(&mut self) -> Vec<u8> {
        if !self.layouts.is_empty() && self.below(3) == 0 {
            let i = self.below(self.layouts.len());
            let mut b = self.layouts[i].clone();
            for _ in 0..1 + self.below(3) {
                if !b.is_empty() {
                    let i = self.below(b.len());
                    b[i] = match self.below(3) {
                        0 => b[i].wrapping_add(1),
                        1 => b[i].wrapping_sub(1),
                        _ => self.u8(),
                    };
                }
            }
            return b;
        }
        let honest = self.below(8) != 0;
        let seed = match self.layouts.first() {
            Some(b) if honest => super::format::Reader::new(b).varint().unwrap_or(0),
            _ => self.small(),
        };
        let size: u64 = if self.below(8) == 0 {
            self.small()
        } else {
            2u64 << self.below(4)
        };
        let mut w = super::format::Writer::default();
        w.varint(seed);
        w.varint(size);
        w.varint(self.delta(size));
        for _ in 0..size.min(64) {
            let code = match self.below(5) {
                0 => 0,
                1 => 1,
                2 => LayoutNode::REMOVED,
                _ => 3 + self.below(size.min(64) as usize) as u32,
            };
            let link = if code != 0 {
                let span = 2 * size.min(64) as usize;
                (self.below(span + 1) as i64 - size.min(64) as i64) as i32
            } else {
                0
            };
            LayoutNode { code, link }.encode(&mut w);
            if code == LayoutNode::REMOVED {
                let key = match self.below(4) {
                    0 => RemovedKey::True,
                    1 => RemovedKey::Int(self.small() as i64),
                    2 => RemovedKey::Float((self.small() as f64 + 0.5).to_bits()),
                    _ => {
                        let n = self.below(6);
                        RemovedKey::Str(self.take(n))
                    }
                };
                key.encode(&mut w);
            }
        }
        w.buf
    }

    /// A generated subtree: any kind of value, objects only above depth 5. (Each kind's
    /// generator draws its choices in a fixed order: the committed corpus replays the same
    /// trees.)
    fn node(&mut self, depth: usize) -> Node {
        let pick = if depth > 5 {
            self.below(8)
        } else {
            self.below(23)
        };
        match pick {
            0 => Node::Nil,
            1 => Node::True,
            2 => Node::Int(match self.below(4) {
                0 => i64::MIN,
                1 => -1,
                _ => self.small() as i64,
            }),
            3 => Node::Float(match self.below(3) {
                0 => f64::NAN.to_bits(),
                1 => (-0.0f64).to_bits(),
                _ => (self.small() as f64).to_bits(),
            }),
            4 => {
                let n = self.below(12);
                Node::Str(self.take(n).to_vec())
            }
            5 => Node::StrRef(self.small()),
            6 => Node::Ref(self.small()),
            7 => forge::perm(""),
            8 | 9 => Node::Perm(Box::new(self.name())),
            10 => self.table(depth),
            11 => self.lclosure(depth),
            12 => self.cclosure(depth),
            13 => self.userdata(depth),
            14 => Node::Thunk(Box::new(self.node(depth + 1))),
            15 => {
                let a = self.node(depth + 1);
                Node::TwoPhase(Box::new(a), Box::new(self.node(depth + 1)))
            }
            16 => Node::ThreadDead,
            17 => {
                let n = 1 + self.below(3);
                Node::ThreadNotStarted {
                    n: n as u64,
                    stack: (0..n).map(|_| self.node(depth + 1)).collect(),
                }
            }
            18 | 19 => self.suspended(depth),
            20 => Node::MainThread,
            21 => self.laid_out_table(depth),
            _ => Node::UdPlain {
                name: self.take(4).to_vec(),
                bytes: self.take(8).to_vec(),
            },
        }
    }

    /// A table with up to three entries and forged size hints, sometimes a metatable.
    fn table(&mut self, depth: usize) -> Node {
        let n = self.below(4);
        Node::Table {
            narr: self.small(),
            nhash: self.small(),
            meta: Box::new(if self.below(4) == 0 {
                self.node(depth + 1)
            } else {
                Node::Nil
            }),
            entries: (0..n)
                .map(|_| (self.node(depth + 1), self.node(depth + 1)))
                .collect(),
        }
    }

    /// A table whose entries end with a layout of its hash part.
    fn laid_out_table(&mut self, depth: usize) -> Node {
        let n = self.below(6);
        let mut entries: Vec<(Node, Node)> = (0..n)
            .map(|i| {
                let k = match self.below(3) {
                    0 => Node::Int(self.small() as i64),
                    1 => forge::str(&format!("k{i}")),
                    _ => self.node(depth + 1),
                };
                (k, self.node(depth + 1))
            })
            .collect();
        entries.push((Node::Layout(self.layout()), Node::Nil));
        Node::Table {
            narr: self.small(),
            nhash: self.small(),
            meta: Box::new(Node::Nil),
            entries,
        }
    }

    /// A Lua closure of a listed prototype (or a forged index), with a count that may
    /// disagree with its upvalues: new, shared or open ones.
    fn lclosure(&mut self, depth: usize) -> Node {
        let n = self.below(4);
        let proto = self.proto();
        let count = if self.below(4) == 0 {
            self.small()
        } else {
            n as u64
        };
        Node::LClosure {
            proto,
            n: count,
            upvals: (0..n)
                .map(|_| match self.below(4) {
                    0 => Upval::Ref {
                        closure: self.small(),
                        index: self.small(),
                    },
                    1 => Upval::Open {
                        level: self.small(),
                        thread: self.node(depth + 1),
                    },
                    _ => Upval::New(self.node(depth + 1)),
                })
                .collect(),
        }
    }

    /// A C closure of `coroutine.wrap`'s helper or a permanent from the dictionary.
    fn cclosure(&mut self, depth: usize) -> Node {
        let n = self.below(4);
        Node::CClosure {
            name: Box::new(if self.below(2) == 0 {
                forge::str("coroutine.wrap#aux")
            } else {
                self.name()
            }),
            n: if self.below(4) == 0 {
                self.small()
            } else {
                n as u64
            },
            upvals: (0..n).map(|_| self.node(depth + 1)).collect(),
        }
    }

    /// A userdata by bytes, with a metatable and user values.
    fn userdata(&mut self, depth: usize) -> Node {
        let n = self.below(3);
        let len = self.below(32);
        Node::UdBytes {
            bytes: self.take(len).to_vec(),
            nuv: n as u64,
            meta: Box::new(self.node(depth + 1)),
            uvs: (0..n).map(|_| self.node(depth + 1)).collect(),
        }
    }

    /// A suspended coroutine with forged frame records and to-be-closed slots.
    fn suspended(&mut self, depth: usize) -> Node {
        let n = 1 + self.below(6);
        let nci = 1 + self.below(4);
        Node::ThreadSuspended {
            n: n as u64,
            errfunc: self.small() as i64 - 1,
            stack: (0..n).map(|_| self.node(depth + 1)).collect(),
            nci: nci as u64,
            frames: (0..nci).map(|_| self.frame()).collect(),
            tbc: (0..self.below(3)).map(|_| self.small()).collect(),
        }
    }

    fn frame(&mut self) -> FrameRec {
        let c = self.below(2) == 0;
        let frame = CallFrame {
            func: self.small(),
            top: self.small(),
            callstatus: if c {
                (forge::cist::C | self.below(256) as u32) as u64
            } else {
                ((forge::cist::FRESH * self.below(2) as u32) | self.below(256) as u32) as u64
            },
            u2: self.small() as i64,
            pc: self.small(),
            extra: self.small(),
            old_errfunc: self.small() as i64 - 1,
            ctx: self.below(3) as i64,
        };
        FrameRec {
            frame,
            k: if c && self.below(2) == 0 {
                Some(forge::str("pcall#k"))
            } else {
                None
            },
        }
    }
}

/// Edits one node in place: numbers and counts moved to boundaries, permanents renamed from
/// the dictionary, frame fields forged, or the node replaced by a generated one.
fn edit_node(n: &mut Node, edit: usize, g: &mut Gen<'_>) {
    match n {
        Node::ThreadSuspended {
            n: count,
            errfunc,
            nci,
            frames,
            ..
        } if edit < 80 => {
            if frames.is_empty() || edit < 5 {
                match edit % 3 {
                    0 => *count = g.delta(*count),
                    1 => *nci = g.delta(*nci),
                    _ => *errfunc = g.delta(*errfunc as u64) as i64,
                }
                return;
            }
            let i = g.below(frames.len());
            let f = &mut frames[i];
            match g.below(10) {
                0 => f.frame.func = g.delta(f.frame.func),
                1 => f.frame.top = g.delta(f.frame.top),
                2 => f.frame.callstatus = g.delta(f.frame.callstatus),
                3 => f.frame.u2 = g.delta(f.frame.u2 as u64) as i64,
                4 => f.frame.pc = g.delta(f.frame.pc),
                5 => f.frame.extra = g.delta(f.frame.extra),
                6 => f.frame.old_errfunc = g.delta(f.frame.old_errfunc as u64) as i64,
                7 => f.frame.ctx = g.delta(f.frame.ctx as u64) as i64,
                8 => {
                    let d = g.delta(0);
                    f.frame.func = f.frame.func.wrapping_add(d);
                    f.frame.top = f.frame.top.wrapping_add(d);
                }
                _ => f.k = if f.k.is_some() { None } else { Some(g.name()) },
            }
        }
        Node::Perm(k) if edit < 70 => **k = g.name(),
        Node::Ident(ident, _) if edit < 70 => *ident = g.delta(*ident),
        Node::Final(mark, _) if edit < 70 => *mark = g.delta(*mark),
        Node::RemovedKeys { n, entries, .. } | Node::GameRemovedKeys { n, entries, .. }
            if edit < 70 && !entries.is_empty() =>
        {
            let i = g.below(entries.len());
            match edit % 5 {
                0 => *n = g.delta(*n),
                1 => entries[i].0 = g.delta(entries[i].0),
                2 => entries[i].1 = g.delta(entries[i].1),
                3 => entries[i].2 = g.delta(entries[i].2),
                _ => entries[i].3 = g.node(1),
            }
        }
        Node::Pending { n, list, .. } if edit < 70 => match edit % 3 {
            0 => *n = g.delta(*n),
            1 => list.push(g.node(2)),
            _ => {
                list.pop();
            }
        },
        Node::CClosure { name, n, .. } if edit < 70 => {
            if edit < 35 {
                **name = g.name();
            } else {
                *n = g.delta(*n);
            }
        }
        Node::LClosure { n, upvals, .. } if edit < 70 => {
            if edit < 20 || upvals.is_empty() {
                *n = g.delta(*n);
            } else {
                let i = g.below(upvals.len());
                upvals[i] = match (&upvals[i], g.below(3)) {
                    (Upval::Open { level, thread }, 0) => Upval::Open {
                        level: g.delta(*level),
                        thread: thread.clone(),
                    },
                    (Upval::Ref { closure, index }, 0) => Upval::Ref {
                        closure: *closure,
                        index: g.delta(*index),
                    },
                    (_, 1) => Upval::Open {
                        level: g.small(),
                        thread: Node::MainThread,
                    },
                    _ => Upval::New(g.node(2)),
                };
            }
        }
        Node::Layout(b) if edit < 70 => *b = g.layout(),
        Node::Table { entries, .. }
            if (40..60).contains(&edit)
                && entries.len() > 2
                && matches!(entries.last(), Some((Node::Layout(_), _))) =>
        {
            // A table that carries its layout, whose entries the loader may put into its
            // nodes in the order they come: in another order, one twice, or one fewer.
            let n = entries.len() - 1;
            let (i, j) = (g.below(n), g.below(n));
            match edit % 3 {
                0 => entries.swap(i, j),
                1 => {
                    let e = entries[i].clone();
                    entries.insert(j, e);
                }
                _ => {
                    entries.remove(i);
                }
            }
        }
        Node::Table { .. } | Node::UdBytes { .. } if (60..85).contains(&edit) => {
            // A mark where the save had none (or a second one): the loader must refuse a
            // mark on an object already marked, out of order, or on one it did not build.
            let object = std::mem::replace(n, Node::Nil);
            *n = Node::Final(1 + g.below(8) as u64, Box::new(object));
        }
        Node::Table { narr, nhash, .. } if edit < 40 => {
            *narr = g.delta(*narr);
            *nhash = g.delta(*nhash);
        }
        Node::UdBytes { nuv, .. } if edit < 40 => *nuv = g.delta(*nuv),
        Node::ThreadNotStarted { n, .. } if edit < 40 => *n = g.delta(*n),
        Node::Int(v) if edit < 50 => *v = g.delta(*v as u64) as i64,
        Node::Ref(v) | Node::StrRef(v) if edit < 50 => *v = g.delta(*v),
        _ => *n = g.node(1),
    }
}

thread_local! {
    /// Instructions the poke of one load may still run (on any thread).
    static POKE_LEFT: Cell<i64> = const { Cell::new(0) };
}

/// Count hook of a poke: fails every call once the poke's budget is spent.
unsafe extern "C-unwind" fn poke_hook(L: *mut lua_State, _ar: *mut ffi::lua_Debug) {
    let left = POKE_LEFT.get() - 1000;
    POKE_LEFT.set(left);
    if left < 0 {
        // SAFETY: raising from a count hook is allowed; nothing to drop here. From now on at
        // every instruction (see `budget_hook`).
        unsafe {
            ffi::lua_sethook(L, Some(poke_hook), ffi::LUA_MASKCOUNT, 1);
            ffi::lua_pushstring(L, c"poke budget".as_ptr());
            ffi::lua_error(L);
        }
    }
}

/// `fuzz_hook(v)`: puts the poke's hook on the coroutine `v`, or on the one a
/// `coroutine.wrap` function `v` resumes.
unsafe extern "C-unwind" fn poke_sethook(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua; queries and a hook on a thread, balanced pushes.
    unsafe {
        let mut co = ffi::lua_tothread(L, 1);
        if co.is_null()
            && ffi::lua_iscfunction(L, 1) != 0
            && !ffi::lua_getupvalue(L, 1, 1).is_null()
        {
            co = ffi::lua_tothread(L, -1);
        }
        if !co.is_null() {
            ffi::lua_sethook(co, Some(poke_hook), ffi::LUA_MASKCOUNT, 1000);
        }
    }
    0
}

/// Uses what loaded (`loaded`): iterates tables, calls functions, resumes coroutines, under
/// an instruction budget that covers the coroutines it resumes.
fn poke(vm: &Vm) {
    POKE_LEFT.set(200_000);
    let _ = vm.run(
        &mut |L| {
            // SAFETY: protected body; the hook is removed before returning, errors of the
            // poke are caught by its pcall.
            unsafe {
                ffi::lua_pushcclosure(L, poke_sethook, 0);
                ffi::lua_setglobal(L, c"fuzz_hook".as_ptr());
                if ffi::luaL_loadbufferx(
                    L,
                    POKE.as_ptr().cast(),
                    POKE.len(),
                    c"=poke".as_ptr(),
                    c"t".as_ptr(),
                ) == ffi::LUA_OK
                {
                    ffi::lua_sethook(L, Some(poke_hook), ffi::LUA_MASKCOUNT, 1000);
                    ffi::lua_pcallk(L, 0, 0, 0, 0, None);
                    ffi::lua_sethook(L, None, 0, 0);
                }
                ffi::lua_pushnil(L);
                ffi::lua_setglobal(L, c"fuzz_hook".as_ptr());
                ffi::lua_settop(L, 0);
            }
            0
        },
        |_, _| (),
    );
}

#[doc(hidden)]
const POKE: &str = r#"
local seen, budget, threads = {}, 2000, {}
local function poke(v, depth)
  budget = budget - 1
  if budget < 0 or depth > 20 or seen[v] then return end
  local t = type(v)
  if t == "table" then
    seen[v] = true
    for k, x in next, v do poke(k, depth + 1) poke(x, depth + 1) end
    poke(getmetatable(v), depth + 1)
  elseif t == "function" then
    seen[v] = true
    fuzz_hook(v)
    pcall(v, 1, "x")
  elseif t == "thread" then
    seen[v] = true
    fuzz_hook(v)
    for _ = 1, 3 do coroutine.resume(v, 1, "x") end
    threads[#threads + 1] = v
  end
end
pcall(poke, loaded, 0)
-- What loaded must also survive: saving it again, both collectors, closing its coroutines.
pcall(eris.persist, loaded)
collectgarbage("generational") collectgarbage("step") collectgarbage()
collectgarbage("incremental")
for _, co in ipairs(threads) do pcall(coroutine.close, co) end
"#;
