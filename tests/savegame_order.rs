//! `pairs` order survives save and load: a table whose keys are numbers, booleans and
//! strings is rebuilt node for node (docs/save-games.md, "Iteration order"), so a game that
//! iterates with `pairs` goes on after a load exactly as a straight run, and later insertions
//! land in the same nodes. Forged layouts are refused before anything is placed.

mod common;

use common::{config, continuation};
use luasnap::bridge::persist::forge::{self, body_of, Node};
use luasnap::bridge::persist::Trust;
use luasnap::bridge::runtime::Backend;
use luasnap::bridge::simulate::{SimOptions, Simulation};
use luasnap::bridge::{Value, Vm};

/// Independent testers' repros (newcomer12): a string-keyed table built once and iterated
/// every frame.
const PAIRS_ORDER: &str = r#"
local G = {}
local S
function G.init(players, seed)
  S = { t = {}, order = "" }
  for _, k in ipairs({ "wheat", "iron", "silk", "salt", "wine", "wool", "tea", "gems", "fish", "oil", "rope", "clay" }) do S.t[k] = true end
end
function G.step(inputs)
  local o = {}
  for k in pairs(S.t) do o[#o + 1] = k end
  S.order = table.concat(o, ",")
end
return G
"#;

/// ... and entities keyed by sparse integer ids, processed in `pairs` order with a random
/// draw each, some removed and added as the game goes.
const INTKEY_ORDER: &str = r#"
local G = {}
local S
function G.init(players, seed)
  math.randomseed(seed)
  S = { ents = {}, next_id = 1000, log = "" }
  for i = 1, 40 do S.next_id = S.next_id + math.random(1, 50); S.ents[S.next_id] = { hp = 10 } end
end
function G.step(inputs)
  local o = {}
  for id, e in pairs(S.ents) do e.hp = e.hp + math.random(-1, 1); o[#o + 1] = id end
  S.log = table.concat(o, ",", 1, 5)
  if inputs[1] % 7 == 0 then
    S.next_id = S.next_id + 13; S.ents[S.next_id] = { hp = 5 }
    local victim = next(S.ents); S.ents[victim] = nil
  end
end
return G
"#;

/// Churn: string and sparse integer keys added and removed every frame (removed entries stay
/// in their chains, free nodes are used up and the tables grow; integer ids come back after
/// removal), mixed key types, and the order folded into the state. (A string key removed and
/// added again may take another node depending on when the collector cleared the removed
/// key, which a load changes: see docs/save-games.md, "Iteration order".)
const CHURN: &str = r#"
local G = {}
local S
function G.init(players, seed)
  math.randomseed(seed)
  S = { names = {}, ids = {}, mixed = { [true] = 1, [2.5] = 2, x = 3, [7] = 4 }, trail = "", n = 0 }
end
function G.step(inputs)
  S.n = S.n + 1
  local r = math.random(1, 1000)
  S.names["k" .. S.n .. "." .. r] = S.n
  for k, v in pairs(S.names) do
    if (v * 7 + r) % 3 == 0 then S.names[k] = nil end
  end
  S.ids[r * 1009] = S.n
  for id in pairs(S.ids) do
    if (id + S.n) % 5 == 0 then S.ids[id] = nil end
  end
  S.mixed["m" .. (S.n % 11)] = S.n
  local o = {}
  for k in pairs(S.names) do o[#o + 1] = k end
  for k in pairs(S.ids) do o[#o + 1] = tostring(k) end
  for k in pairs(S.mixed) do o[#o + 1] = tostring(k) end
  S.trail = table.concat(o, ",")
end
return G
"#;

/// Pools made at their final size (`table.create`) with a few entries each, iterated with
/// `pairs` every frame (the attacker's repro as a game): no layout is written for them, so
/// their order needs their node count back, which the serializer backend's own-trust loads
/// now give whatever the save's length.
const POOLS: &str = r#"
local G = {}
local S
function G.init(players, seed)
  math.randomseed(seed)
  S = { pools = {}, trail = "" }
  for i = 1, 300 do S.pools[i] = table.create(0, 512) end
end
function G.step(inputs)
  local o = {}
  for i, pool in ipairs(S.pools) do
    local r = math.random(1, 10000)
    if i % 5 == 0 then pool["e" .. r] = r; pool[r * 7] = true end
    for k, v in pairs(pool) do
      if math.random() < 0.3 then pool[k] = nil end
    end
    for k in pairs(pool) do o[#o + 1] = tostring(k) end
  end
  S.trail = table.concat(o, ",", 1, math.min(#o, 200))
end
return G
"#;

#[test]
fn games_that_iterate_with_pairs_match_with_the_serializer() {
    for (name, script) in [
        ("pairs_order", PAIRS_ORDER),
        ("intkey_order", INTKEY_ORDER),
        ("churn", CHURN),
        ("pools", POOLS),
    ] {
        let mut sim = Simulation::new(SimOptions {
            game: config(name, script, 2, 5),
            frames: 100,
            delay: 3,
            start: None,
            start_trust: luasnap::bridge::persist::Trust::Foreign,
            saving: luasnap::bridge::runtime::Saving::EveryFrame,
        })
        .unwrap();
        let (reference, _) = sim.reference(false).unwrap();
        let r = sim.run(Backend::Serialize, &reference).unwrap();
        if !r.matches_reference {
            panic!("{name}: {}", sim.explain(Backend::Serialize, 10).unwrap());
        }
    }
}

#[test]
fn a_save_at_n_plus_m_frames_equals_a_straight_run_for_games_iterating_with_pairs() {
    continuation("pairs_order", PAIRS_ORDER, 30, 30);
    continuation("intkey_order", INTKEY_ORDER, 40, 60);
    continuation("churn", CHURN, 45, 55);
}

fn vm(seed: u64) -> Vm {
    Vm::builder()
        .capacity(256 << 20)
        .deterministic(seed)
        .build()
        .unwrap()
}

/// Builds `t` with a history (collisions, removals), saves it.
const HISTORY: &str = r#"
    t = {}
    for i = 1, 300 do t["s" .. i] = i; t[i * 7919] = i end
    for i = 1, 300, 3 do t["s" .. i] = nil; t[i * 7919] = nil end
    for i = 1, 40 do t["n" .. i] = i end
    function order(x)
      local o = {}
      for k in pairs(x) do o[#o + 1] = tostring(k) end
      return table.concat(o, " ")
    end
    function more(x)
      for i = 1, 20 do x["late" .. i] = i; x[i * 104729] = i end
      for i = 2, 300, 3 do x["s" .. i] = nil end
      for i = 1, 300, 3 do x["s" .. i] = -i end
    end
"#;

fn order(vm: &Vm) -> Value {
    vm.exec("return order(t)", "order").unwrap().remove(0)
}

#[test]
fn next_order_and_later_insertions_match_the_saving_vm() {
    let a = vm(11);
    a.exec(HISTORY, "h").unwrap();
    let bytes = a.persist("t").unwrap();
    let mut b = vm(11);
    b.exec(HISTORY, "h").unwrap();
    b.exec("t = nil", "forget").unwrap();
    b.unpersist(&bytes, "t", Trust::Foreign).unwrap();
    assert_eq!(order(&a), order(&b));
    // Insertions after the load (into free nodes, reusing removed ones, growing the table)
    // land where they land in the saving VM. A removed string key's node is reused only until
    // the collector marks the key dead, which happens at another time after a load than in a
    // straight run (docs/save-games.md, "Iteration order"): a full collection in both VMs
    // first puts them in the same state, whatever collector work ran before.
    a.exec("collectgarbage() more(t)", "m").unwrap();
    b.exec("collectgarbage() more(t)", "m").unwrap();
    assert_eq!(order(&a), order(&b));
}

#[test]
fn another_hash_seed_loads_the_same_entries() {
    let a = vm(11);
    a.exec(HISTORY, "h").unwrap();
    let bytes = a.persist("t").unwrap();
    let mut b = vm(12);
    b.exec(HISTORY, "h").unwrap();
    b.exec("t = nil", "forget").unwrap();
    b.unpersist(&bytes, "t", Trust::Own).unwrap();
    let same = "local n = 0 for k, v in pairs(t) do n = n + 1 end
        return n == 440 and t.s2 == 2 and t.s1 == nil and t[2 * 7919] == 2 and t.n40 == 40";
    assert_eq!(b.exec(same, "c").unwrap(), vec![Value::Boolean(true)]);
}

/// `orders(x)`: the `pairs` order of every table in the list `x`, as a string.
macro_rules! orders_of_tables {
    () => {
        r#"
    function orders(x)
      local o = {}
      for i, t in ipairs(x) do
        local ks = {}
        for k in pairs(t) do ks[#ks + 1] = tostring(k) end
        o[i] = table.concat(ks, ",")
      end
      return table.concat(o, ";")
    end
"#
    };
}

/// Tables built alike (one constructor, as a game's objects are) share their layouts, which
/// the writer sorts once and reuses (`luasnap_table_layout`'s cache); here they differ in
/// removed keys, in which keys sit in the same nodes, and a `__persist` function runs Lua
/// code (new strings, a full collection) halfway through the save.
const ALIKE: &str = concat!(
    r#"
    local function shape(i)
      local t = { alpha = i, beta = i, gamma = i, delta = i, eps = i, zeta = i, eta = i }
      t["k" .. (i % 5)] = i
      if i % 3 == 0 then t.beta = nil end
      if i % 4 == 0 then t["k" .. (i % 5)] = nil; t["x" .. (i % 7)] = true end
      if i % 10 == 0 then t[i] = i; t[0.5] = false end
      if i % 20 == 0 then t[i] = nil end
      return t
    end
    T = {}
    for i = 1, 300 do T[#T + 1] = shape(i) end
    T[#T + 1] = setmetatable({}, { __persist = function()
      local junk = {}
      for j = 1, 3000 do junk[j] = { ["tmp" .. j] = j, ["alpha" .. j] = j } end
      junk = nil
      collectgarbage()
      return function() return {} end
    end })
    for i = 301, 600 do T[#T + 1] = shape(i) end
"#,
    orders_of_tables!()
);

#[test]
fn tables_built_alike_keep_their_own_order() {
    let a = vm(11);
    // Collected first, so that the collection in the save kills no removed key (which would
    // change the second save below).
    a.exec(ALIKE, "h").unwrap();
    a.gc_collect().unwrap();
    let bytes = a.persist("T").unwrap();
    let mut b = vm(11);
    b.exec(ALIKE, "h").unwrap();
    b.exec("T = nil", "forget").unwrap();
    b.unpersist(&bytes, "T", Trust::Own).unwrap();
    let (x, y) = (
        a.exec("return orders(T)", "o").unwrap(),
        b.exec("return orders(T)", "o").unwrap(),
    );
    assert_eq!(x, y);
    // A second save of the same state, from the writer's kept memory, writes the same bytes.
    assert_eq!(a.persist("T").unwrap(), bytes);
}

/// Tables laid out alike whose removed entries' keys differ (integers whose main position
/// the live key 1000 holds, so each went to the same free node): the writer's layout cache
/// matches them all, but the bytes it kept for the first must not serve the others (a removed
/// key is part of a layout). Also empty strings (written whole every time) and a string value
/// under a table key.
const REMOVED_ALIKE: &str = concat!(
    r#"
    T = {}
    for i = 1, 60 do
      local t = { [1000] = true, alpha = 1, beta = 2 }
      local k = 1003 + 3 * (i % 6)
      t[k] = i; t[k] = nil
      if i % 5 == 0 then t[""] = "" end
      T[i] = t
    end
    T.odd = { [{}] = "a string value under a table key", [""] = "", e = { "", "", "" } }
"#,
    orders_of_tables!(),
    r#"
    function reinsert(x)
      for i, t in ipairs(x) do t[1003 + 3 * (i % 6)] = -i end
    end
    function odd(x)
      local n = 0
      for k, v in pairs(x.odd) do
        if type(k) == "table" and v == "a string value under a table key" then n = n + 1 end
      end
      return n == 1 and x.odd[""] == "" and #x.odd.e == 3 and x.odd.e[3] == "" and x[5][""] == ""
    end
"#
);

/// Runs `script` in two VMs, saves `global` from the first and loads it into the second
/// (which forgets its own first): the saving VM, the loading VM and the save.
fn saved_and_loaded(script: &str, global: &str, trust: Trust) -> (Vm, Vm, Vec<u8>) {
    let a = vm(11);
    a.exec(script, "h").unwrap();
    let bytes = a.persist(global).unwrap();
    let mut b = vm(11);
    b.exec(script, "h").unwrap();
    b.exec(format!("{global} = nil"), "forget").unwrap();
    b.unpersist(&bytes, global, trust).unwrap();
    (a, b, bytes)
}

#[test]
fn tables_alike_but_for_their_removed_keys_keep_them() {
    let (a, b, _) = saved_and_loaded(REMOVED_ALIKE, "T", Trust::Own);
    let orders = |vm: &Vm| vm.exec("return orders(T)", "o").unwrap();
    assert_eq!(orders(&a), orders(&b));
    assert_eq!(
        b.exec("return odd(T)", "odd").unwrap(),
        vec![Value::Boolean(true)]
    );
    // Each table's own removed key goes back into the node that kept it, as in the saving VM
    // (a wrong removed key there would make the table grow instead: no free node is left).
    a.exec("collectgarbage() reinsert(T)", "r").unwrap();
    b.exec("collectgarbage() reinsert(T)", "r").unwrap();
    assert_eq!(orders(&a), orders(&b));
}

#[test]
fn tables_with_object_keys_still_round_trip() {
    let a = vm(11);
    a.exec(
        "k1, k2 = {}, {} t = { [k1] = 1, [k2] = 2, s = 3, [print] = 4 } saved = { t = t, k1 = k1, k2 = k2 }",
        "h",
    )
    .unwrap();
    let bytes = a.persist("saved").unwrap();
    let mut b = vm(11);
    b.unpersist(&bytes, "saved", Trust::Own).unwrap();
    let ok = "local t = saved.t return t[saved.k1] == 1 and t[saved.k2] == 2 and t.s == 3 and t[print] == 4";
    assert_eq!(b.exec(ok, "c").unwrap(), vec![Value::Boolean(true)]);
}

fn varint(b: &[u8], p: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let x = b[*p];
        *p += 1;
        v |= ((x & 0x7f) as u64) << shift;
        if x < 0x80 {
            return v;
        }
        shift += 7;
    }
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A decoded layout: seed, lastfree, per node (code, next, the raw bytes of a removed
/// entry's key).
type Layout = (u64, u64, Vec<(u64, i64, Vec<u8>)>);

fn decode_layout(b: &[u8]) -> Layout {
    let mut p = 0;
    let seed = varint(b, &mut p);
    let size = varint(b, &mut p);
    let lastfree = varint(b, &mut p);
    let nodes = (0..size)
        .map(|_| {
            let c = varint(b, &mut p);
            let nx = if c != 0 {
                let z = varint(b, &mut p);
                ((z >> 1) as i64) ^ -((z & 1) as i64)
            } else {
                0
            };
            let at = p;
            if c == 2 {
                match varint(b, &mut p) {
                    3 | 4 => {
                        varint(b, &mut p);
                    }
                    5 => {
                        let n = varint(b, &mut p) as usize;
                        p += n;
                    }
                    _ => {}
                }
            }
            (c, nx, b[at..p].to_vec())
        })
        .collect();
    assert_eq!(p, b.len());
    (seed, lastfree, nodes)
}

fn encode_layout((seed, lastfree, nodes): &Layout) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, *seed);
    put(&mut out, nodes.len() as u64);
    put(&mut out, *lastfree);
    for (c, nx, key) in nodes {
        put(&mut out, *c);
        if *c != 0 {
            put(&mut out, ((nx << 1) ^ (nx >> 63)) as u64);
        }
        out.extend_from_slice(key);
    }
    out
}

/// The layout blob of the saved root table.
fn root_layout(node: &mut Node) -> &mut Vec<u8> {
    let Node::Table { entries, .. } = node else {
        panic!("root is not a table")
    };
    match entries.last_mut() {
        Some((Node::Layout(b), _)) => b,
        _ => panic!("no layout saved"),
    }
}

#[test]
fn forged_layouts_are_refused_and_the_honest_one_loads() {
    let a = vm(11);
    a.exec(HISTORY, "h").unwrap();
    let bytes = a.persist("t").unwrap();
    let honest = forge::decode(body_of(&bytes).unwrap()).unwrap();
    let mut node = honest.clone();
    let lay = decode_layout(root_layout(&mut node));
    assert_eq!(encode_layout(&lay), *root_layout(&mut node));
    assert!(lay.2.iter().any(|n| n.0 == 2), "no removed entry kept");
    let chained = lay.2.iter().position(|n| n.0 >= 3 && n.1 != 0).unwrap();
    let live: Vec<usize> = (0..lay.2.len()).filter(|&i| lay.2[i].0 >= 3).collect();
    let free = lay.2.iter().position(|n| n.0 == 0).unwrap();
    let mut forgeries: Vec<(&str, Layout)> = Vec::new();
    let mut f = lay.clone();
    let (r0, r1) = (f.2[live[0]].0, f.2[live[1]].0);
    (f.2[live[0]].0, f.2[live[1]].0) = (r1, r0); // two keys in each other's nodes
    forgeries.push(("keys swapped", f));
    let mut f = lay.clone();
    f.2[chained].1 = -(chained as i64); // a link to node 0 ...
    f.2[0] = (f.2[0].0.max(1), chained as i64, f.2[0].2.clone()); // ... and back: a loop
    forgeries.push(("a loop", f));
    let mut f = lay.clone();
    f.2[chained].1 = free as i64 - chained as i64; // a link into a free node
    forgeries.push(("a link to a free node", f));
    let mut f = lay.clone();
    let r = f.2[live[0]].0;
    f.2[live[1]].0 = r; // one key in two nodes
    forgeries.push(("a rank twice", f));
    let mut f = lay.clone();
    f.2[live[0]].0 = 3 + live.len() as u64; // a rank past the entries
    forgeries.push(("a rank out of range", f));
    let mut f = lay.clone();
    f.1 = f.2.len() as u64 + 1;
    forgeries.push(("lastfree out of range", f));
    let mut f = lay.clone();
    f.2[chained].1 = 1 << 40;
    forgeries.push(("a link out of range", f));
    let mut f = lay.clone();
    let tomb = f.2.iter().position(|n| n.0 == 2).unwrap();
    f.2[tomb].2 = vec![8, 1]; // a removed entry's key that is no key (an object kind)
    forgeries.push(("a bad removed key", f));
    let mut f = lay.clone();
    f.2.truncate(f.2.len() / 2);
    forgeries.push(("another size", f));
    for (what, f) in forgeries {
        let mut node = honest.clone();
        *root_layout(&mut node) = encode_layout(&f);
        let mut b = vm(11);
        b.exec("t = 'untouched'", "h").unwrap();
        let r = b.unpersist(&forge::file(&node), "t", Trust::Foreign);
        match r {
            Err(e) => assert!(e.to_string().contains("layout"), "{what}: {e}"),
            Ok(()) => panic!("{what}: a forged layout was accepted"),
        }
        assert_eq!(
            b.exec("return t", "c").unwrap(),
            vec![Value::String("untouched".into())],
            "{what}"
        );
    }
    // The untouched file still loads (the forgeries were refused for what was changed), but
    // not as a format-4 file (layouts came with format 5).
    let mut b = vm(11);
    let mut file = forge::file(&honest);
    b.unpersist(&file, "t", Trust::Foreign).unwrap();
    file[8..10].copy_from_slice(&4u16.to_le_bytes());
    let err = b.unpersist(&file, "t", Trust::Foreign).unwrap_err();
    assert!(err.to_string().contains("layout"), "{err}");
}

/// Records of string keys (collisions, no removals): their layouts are placed by the loader's
/// batched build, not the general path.
const RECORDS: &str = r#"
    holder = { list = {} }
    for j = 1, 60 do
      local r = {}
      for i = 1, 12 do r["f" .. (i * j)] = i end
      holder.list[j] = r
    end
    function orders(h)
      local o = {}
      for j, r in ipairs(h.list) do
        for k in pairs(r) do o[#o + 1] = k end
        o[#o + 1] = "|"
      end
      return table.concat(o, " ")
    end
"#;

/// The layout blob of the first table below the root that carries one.
fn nested_layout(node: &mut Node, root: bool) -> Option<&mut Vec<u8>> {
    let Node::Table { entries, .. } = node else {
        return None;
    };
    if !root && matches!(entries.last(), Some((Node::Layout(_), _))) {
        return match entries.last_mut() {
            Some((Node::Layout(b), _)) => Some(b),
            _ => None,
        };
    }
    entries
        .iter_mut()
        .find_map(|(_, v)| nested_layout(v, false))
}

#[test]
fn nested_tables_keep_their_order_and_forged_nested_layouts_are_refused() {
    let (a, b, bytes) = saved_and_loaded(RECORDS, "holder", Trust::Foreign);
    let orders = |vm: &Vm| vm.exec("return orders(holder)", "o").unwrap();
    assert_eq!(orders(&a), orders(&b));

    let honest = forge::decode(body_of(&bytes).unwrap()).unwrap();
    let mut node = honest.clone();
    let lay = decode_layout(nested_layout(&mut node, true).expect("no nested layout"));
    assert!(
        lay.2.iter().all(|n| n.0 != 2),
        "a removed entry (general path)"
    );
    let live: Vec<usize> = (0..lay.2.len()).filter(|&i| lay.2[i].0 >= 3).collect();
    let chained = lay.2.iter().position(|n| n.0 >= 3 && n.1 != 0).unwrap();
    let free = lay.2.iter().position(|n| n.0 == 0).unwrap();
    let mut forgeries: Vec<(&str, Layout)> = Vec::new();
    let mut f = lay.clone();
    let (r0, r1) = (f.2[live[0]].0, f.2[live[1]].0);
    (f.2[live[0]].0, f.2[live[1]].0) = (r1, r0);
    forgeries.push(("keys swapped", f));
    let mut f = lay.clone();
    f.2[chained].1 = -(chained as i64);
    f.2[0] = (f.2[0].0.max(1), chained as i64, f.2[0].2.clone());
    forgeries.push(("a loop", f));
    let mut f = lay.clone();
    f.2[chained].1 = free as i64 - chained as i64;
    forgeries.push(("a link to a free node", f));
    let mut f = lay.clone();
    let r = f.2[live[0]].0;
    f.2[live[1]].0 = r;
    forgeries.push(("a rank twice", f));
    let mut f = lay.clone();
    f.2[live[0]].0 = 3 + live.len() as u64;
    forgeries.push(("a rank out of range", f));
    let mut f = lay.clone();
    f.1 = f.2.len() as u64 + 1;
    forgeries.push(("lastfree out of range", f));
    let mut f = lay.clone();
    f.2[chained].1 = 1 << 40;
    forgeries.push(("a link out of range", f));
    let mut f = lay.clone();
    f.2[live[0]].0 = 1; // a live entry's node marked dead: an entry left over
    forgeries.push(("an entry without a node", f));
    for (what, f) in forgeries {
        let mut node = honest.clone();
        *nested_layout(&mut node, true).unwrap() = encode_layout(&f);
        let mut b = vm(11);
        b.exec("holder = 'untouched'", "h").unwrap();
        match b.unpersist(&forge::file(&node), "holder", Trust::Foreign) {
            Err(e) => assert!(e.to_string().contains("layout"), "{what}: {e}"),
            Ok(()) => panic!("{what}: a forged layout was accepted"),
        }
        assert_eq!(
            b.exec("return holder", "c").unwrap(),
            vec![Value::String("untouched".into())],
            "{what}"
        );
    }
}

/// `orders(h)`: the `pairs` order of every record in `h.list`, as a string.
macro_rules! orders_of_records {
    () => {
        r#"
    function orders(h)
      local o = {}
      for j, r in ipairs(h.list) do
        for k, v in pairs(r) do o[#o + 1] = k .. "=" .. v end
        o[#o + 1] = "|"
      end
      return table.concat(o, " ")
    end
"#
    };
}

/// Records with an array part and sparse integer keys in the hash part (collisions, no
/// removals): the loader puts their entries into the nodes unhashed, in the order they come,
/// and the layout moves them (`LS_NEWTABLE_PLACED` in csrc/tbuild.c).
const INT_RECORDS: &str = concat!(
    r#"
    holder = { list = {} }
    for j = 1, 40 do
      local r = { "a", "b" }
      for i = 1, 12 do r[1000 + i * j * 7919] = i end
      holder.list[j] = r
    end
"#,
    orders_of_records!()
);

/// A table's entries in a forged tree.
type Entries = Vec<(Node, Node)>;

/// The entries of the `n`th table (0-based, depth first) that carries a layout (the layout
/// last).
fn nth_layout_entries<'a>(node: &'a mut Node, n: &mut usize) -> Option<&'a mut Entries> {
    let Node::Table { entries, .. } = node else {
        return None;
    };
    if matches!(entries.last(), Some((Node::Layout(_), _))) {
        if *n == 0 {
            return Some(entries);
        }
        *n -= 1;
    }
    entries
        .iter_mut()
        .find_map(|(_, v)| nth_layout_entries(v, n))
}

/// Loads each forged file into a VM that ran `setup` and holds `holder = 'untouched'`: each
/// must be refused with a message naming one of `words`, the global left as it was.
fn assert_refused(setup: &str, forgeries: Vec<(&str, Vec<u8>)>, words: &[&str]) {
    for (what, file) in forgeries {
        let mut b = vm(11);
        b.exec(setup, "setup").unwrap();
        b.exec("holder = 'untouched'", "h").unwrap();
        match b.unpersist(&file, "holder", Trust::Foreign) {
            Err(e) => {
                let msg = e.to_string();
                assert!(words.iter().any(|w| msg.contains(w)), "{what}: {msg}");
            }
            Ok(()) => panic!("{what}: forged entries were accepted"),
        }
        assert_eq!(
            b.exec("return holder", "c").unwrap(),
            vec![Value::String("untouched".into())],
            "{what}"
        );
    }
}

#[test]
fn placed_entries_in_any_order_load_and_forged_ones_are_refused() {
    let a = vm(11);
    a.exec(INT_RECORDS, "h").unwrap();
    let bytes = a.persist("holder").unwrap();
    let orders = |vm: &Vm| vm.exec("return orders(holder)", "o").unwrap();
    let honest = forge::decode(body_of(&bytes).unwrap()).unwrap();
    let mut node = honest.clone();
    let entries = nth_layout_entries(&mut node, &mut 0)
        .expect("no nested layout")
        .clone();
    // The hash part's entries: integer keys past the array part.
    let hash: Vec<usize> = (0..entries.len())
        .filter(|&i| matches!(entries[i].0, Node::Int(k) if k > 2))
        .collect();
    assert!(hash.len() >= 8, "{entries:?}");
    let Node::Int(k0) = entries[hash[0]].0 else {
        unreachable!()
    };
    let layout_at = entries.len() - 1;
    let forge_with = |f: &dyn Fn(&mut Entries)| {
        let mut node = honest.clone();
        f(nth_layout_entries(&mut node, &mut 0).unwrap());
        forge::file(&node)
    };

    // The same entries in another order load as the honest file: the layout places them.
    let reversed = forge_with(&|e| e[hash[0]..=hash[hash.len() - 1]].reverse());
    let mut b = vm(11);
    b.exec(INT_RECORDS, "h").unwrap();
    b.exec("holder = nil", "forget").unwrap();
    b.unpersist(&reversed, "holder", Trust::Foreign).unwrap();
    assert_eq!(orders(&a), orders(&b));

    let extra = |n: i64| {
        move |e: &mut Entries| {
            for i in 0..n {
                e.insert(layout_at, (Node::Int(7 + 2 * i), Node::Int(i)));
            }
        }
    };
    let forgeries: Vec<(&str, Vec<u8>)> = vec![
        (
            "a key twice",
            forge_with(&|e| e[hash[1]].0 = e[hash[0]].0.clone()),
        ),
        (
            "a NaN key",
            forge_with(&|e| e[hash[0]].0 = Node::Float(f64::NAN.to_bits())),
        ),
        (
            "a float key equal to an integer",
            forge_with(&|e| e[hash[0]].0 = Node::Float((k0 as f64).to_bits())),
        ),
        (
            "an array part's key among the nodes",
            forge_with(&|e| e[hash[0]].0 = Node::Int(1)),
        ),
        (
            "an entry missing",
            forge_with(&|e| {
                e.remove(hash[0]);
            }),
        ),
        ("one key more", forge_with(&extra(1))),
        ("more keys than nodes", forge_with(&extra(40))),
    ];
    assert_refused("", forgeries, &["layout", "NaN key"]);
}

/// Records built alike: the same keys (integers and strings, with collisions) in the same
/// order, so the loader places every record after the first from its memo of the last layout
/// (`ls_rmemo` in csrc/tbuild.c) instead of sorting and checking again.
const ALIKE_RECORDS: &str = concat!(
    r#"
    holder = { list = {} }
    for j = 1, 40 do
      local r = { "a", "b" }
      for i = 1, 12 do r[1000 + i * 7919] = i * j end
      for i = 1, 5 do r["name" .. i] = j end
      holder.list[j] = r
    end
"#,
    orders_of_records!(),
    r#"
    function lookups(h)
      for j, r in ipairs(h.list) do
        for i = 1, 12 do if r[1000 + i * 7919] ~= i * j then return false end end
        for i = 1, 5 do if r["name" .. i] ~= j then return false end end
      end
      return true
    end
"#
);

#[test]
fn records_laid_out_alike_load_and_forged_ones_after_them_are_refused() {
    let a = vm(11);
    a.exec(ALIKE_RECORDS, "h").unwrap();
    let bytes = a.persist("holder").unwrap();
    let orders = |vm: &Vm| vm.exec("return orders(holder)", "o").unwrap();
    let honest = forge::decode(body_of(&bytes).unwrap()).unwrap();
    let count = (0..)
        .take_while(|&i| nth_layout_entries(&mut honest.clone(), &mut { i }).is_some())
        .count();
    assert!(count >= 30, "records with a layout: {count}");

    let load = |file: &[u8]| {
        let mut b = vm(11);
        b.exec(ALIKE_RECORDS, "h").unwrap();
        b.exec("holder = 'untouched'", "forget").unwrap();
        let r = b.unpersist(file, "holder", Trust::Foreign);
        (b, r)
    };
    let (b, r) = load(&bytes);
    r.unwrap();
    assert_eq!(orders(&a), orders(&b));
    assert_eq!(
        b.exec("return lookups(holder)", "l").unwrap(),
        vec![Value::Boolean(true)]
    );

    // Forgeries of a record placed after others laid out alike: the memo of the last layout
    // must neither place them as their predecessors nor skip a check.
    let forge_nth = |n: usize, f: &dyn Fn(&mut Entries)| {
        let mut node = honest.clone();
        f(nth_layout_entries(&mut node, &mut { n }).unwrap());
        forge::file(&node)
    };
    let hash_keys = |e: &Entries| -> Vec<usize> {
        (0..e.len())
            .filter(|&i| match &e[i].0 {
                Node::Int(k) => *k > 2,
                Node::Str(_) | Node::StrRef(_) => true,
                _ => false,
            })
            .collect()
    };
    // Arrival order reversed: another permutation, the same table.
    let reversed = forge_nth(5, &|e| {
        let h = hash_keys(e);
        e[h[0]..=h[h.len() - 1]].reverse();
    });
    let (b, r) = load(&reversed);
    r.unwrap();
    assert_eq!(orders(&a), orders(&b));
    assert_eq!(
        b.exec("return lookups(holder)", "l").unwrap(),
        vec![Value::Boolean(true)]
    );
    // Two neighbours swapped in every record from the tenth: each differs from the memo of
    // the one before in the first place (the memo is refreshed each time), and all load.
    let mut node = honest.clone();
    for n in 9..count {
        let e = nth_layout_entries(&mut node, &mut { n }).unwrap();
        let h = hash_keys(e);
        e.swap(h[n % 4], h[n % 4 + 1]);
    }
    let (b, r) = load(&forge::file(&node));
    r.unwrap();
    assert_eq!(orders(&a), orders(&b));

    let forgeries: Vec<(&str, Vec<u8>)> = vec![
        (
            "a key twice",
            forge_nth(7, &|e| {
                let h = hash_keys(e);
                e[h[1]].0 = e[h[0]].0.clone();
            }),
        ),
        (
            "an array part's key among the nodes",
            forge_nth(7, &|e| {
                let h = hash_keys(e);
                e[h[0]].0 = Node::Int(1);
            }),
        ),
        (
            "a float key equal to an integer",
            forge_nth(7, &|e| {
                let h = hash_keys(e);
                if let Node::Int(k) = e[h[0]].0 {
                    e[h[0]].0 = Node::Float((k as f64).to_bits());
                }
            }),
        ),
        (
            "an entry missing",
            forge_nth(7, &|e| {
                let h = hash_keys(e);
                e.remove(h[0]);
            }),
        ),
    ];
    assert_refused(ALIKE_RECORDS, forgeries, &["layout"]);
    // Another key in a record's place: its rank among the keys changes, so the layout puts
    // other entries in other nodes. Refused, or loaded with every key found where it is.
    let other = forge_nth(7, &|e| {
        let h = hash_keys(e);
        e[h[0]].0 = Node::Int(3);
    });
    let (b, r) = load(&other);
    match r {
        Err(e) => assert!(e.to_string().contains("layout"), "{e}"),
        Ok(()) => {
            let found = "local r = holder.list[8] local n = 0
                for k, v in pairs(r) do n = n + 1 if r[k] ~= v then return false end end
                return n == 19 and r[3] ~= nil";
            assert_eq!(b.exec(found, "f").unwrap(), vec![Value::Boolean(true)]);
        }
    }
}

/// Sparse tables made at a large size (`table.create(0, 1024)`, a few keys: a pool): no
/// layout is written for them (their keys sit where a fresh table of that size puts them), so
/// their order comes back only with their node count. An own save's size hints are bounded by
/// its heap-growth cap, not by its length: found by an independent attacker, 1,097 of 2,000
/// such tables in a 300 KB save came back with another `pairs` order once the hints of the
/// file's length were spent. A foreign save keeps the file-length bound (a small file cannot
/// ask for a large heap): its tables get fewer nodes but every entry.
#[test]
fn large_sparse_tables_keep_their_order_in_own_loads() {
    const POOLS: &str = concat!(
        orders_of_tables!(),
        r#"
        P = {}
        for i = 1, 600 do
          local t = table.create(0, 1024)
          t["slot" .. i] = i; t[i * 7919] = true; t["n" .. (i * 3)] = -i
          P[i] = t
        end
        function intact(x)
          for i, t in ipairs(x) do
            if t["slot" .. i] ~= i or t[i * 7919] ~= true or t["n" .. (i * 3)] ~= -i then
              return false
            end
          end
          return #x == 600
        end
    "#
    );
    let (a, b, bytes) = saved_and_loaded(POOLS, "P", Trust::Own);
    assert!(bytes.len() < 100_000, "{}", bytes.len());
    let orders = |vm: &Vm| vm.exec("return orders(P)", "o").unwrap();
    assert_eq!(orders(&a), orders(&b));
    let (_, c, _) = saved_and_loaded(POOLS, "P", Trust::Foreign);
    assert_eq!(
        c.exec("return intact(P)", "i").unwrap(),
        vec![Value::Boolean(true)]
    );
}
