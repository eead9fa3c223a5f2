//! Coroutines suspended inside a `pairs()` loop after clearing the current key (`t[k] = nil`,
//! which the manual allows), and `pairs(_G)` / `pairs(package.loaded)` order, across a save
//! loaded in another process (docs/determinism.md).
//!
//! Before format 10 both failed: the table, function and C-function walks stopped with
//! "invalid key to 'next'" after the load (the string walk too once a collection had run),
//! and `pairs(_G)` visited the globals in another order.
//!
//! The loading side runs in a child process (this test binary again, told what to do by
//! [`CHILD`]), as `tests/key_identities.rs` does.

mod common;

use luasnap::bridge::persist::Trust;
use luasnap::bridge::Vm;

/// Set in the child: the path of the save to load.
const CHILD: &str = "LUASNAP_SUSPENDED_PAIRS_CHILD";

/// Tables keyed by tables, functions, C functions and strings, each walked by a coroutine
/// that clears the current key and yields inside the loop; `step()` resumes each once and
/// returns what the walks gave so far.
const GAME: &str = "
local cfuns = { print, type, rawget, rawset, rawequal, rawlen, select, tostring,
                tonumber, pcall, error, assert, next, ipairs, setmetatable, getmetatable }
sets = { tables = {}, functions = {}, cfunctions = {}, strings = {} }
for i = 1, 16 do
  sets.tables[{ id = i }] = i
  sets.functions[function() return i end] = i
  sets.cfunctions[cfuns[i]] = i
  sets.strings['key' .. i] = i
end
walks, names, log = {}, {}, {}
for name, t in pairs(sets) do
  names[#names + 1] = name
  walks[#walks + 1] = coroutine.wrap(function()
    for k, v in pairs(t) do
      t[k] = nil
      coroutine.yield(name .. '=' .. v)
    end
    return name .. ' done'
  end)
end
function step()
  for i = 1, #walks do
    local w = walks[i]
    if w then
      local ok, got = pcall(w)  -- a walk that fails is logged, the others go on
      log[#log + 1] = ok and got or names[i] .. ' failed: ' .. tostring(got)
      if not ok or got:find(' done') then walks[i] = false end
    end
  end
  return table.concat(log, ',')
end
function globals()
  local out = {}
  for k in pairs(_G) do out[#out + 1] = tostring(k) end
  -- package.loaded where the profile has it (the deterministic one leaves package out)
  for k in pairs(rawget(_G, 'package') and package.loaded or {}) do
    out[#out + 1] = 'loaded.' .. tostring(k)
  end
  return table.concat(out, ',')
end
for i = 1, 20 do _G['g' .. i] = i end
for i = 1, 20, 3 do _G['g' .. i] = nil end
";

/// The deterministic profile's VM, or (`full`) one with the whole standard library (which
/// has `package.loaded`).
fn vm(full: bool) -> Vm {
    let b = Vm::builder().capacity(64 << 20);
    if full { b } else { b.deterministic(3) }.build().unwrap()
}

/// The walks' log after each of `n` steps.
fn go_on(vm: &Vm, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| vm.call::<String>("step", ()).unwrap())
        .collect()
}

/// The child's side: loads the save, prints the globals' order and what the steps give.
#[test]
fn suspended_pairs_child() {
    let Ok(task) = std::env::var(CHILD) else {
        return; // run by the parent only
    };
    let (profile, save) = task.split_once(':').unwrap();
    let bytes = std::fs::read(save).unwrap();
    let mut v = vm(profile == "full");
    v.load_game(&bytes, Trust::Own).unwrap();
    println!("GLOBALS {}", v.call::<String>("globals", ()).unwrap());
    for line in go_on(&v, 20) {
        println!("STEP {line}");
    }
}

/// A run of the game saved after three steps and loaded in a child process: the globals'
/// order and the steps after the save, straight and loaded.
struct Runs {
    globals: String,
    straight: Vec<String>,
    loaded_globals: Vec<String>,
    loaded: Vec<String>,
    stdout: String,
}

/// `collected`: a full collection runs before the save, which makes every removed key dead
/// (strings too: Lua then finds the node by the string's address alone).
fn saved_and_loaded_in_a_child(full: bool, collected: bool) -> Runs {
    let v = vm(full);
    v.exec(GAME, "=game").unwrap();
    go_on(&v, 3);
    if collected {
        v.gc_collect().unwrap();
    }
    let file = v.save_game().unwrap();
    let globals = v.call::<String>("globals", ()).unwrap();
    let straight = go_on(&v, 20);
    let save = common::temp_file("luasnap-suspended-pairs-", ".sav");
    std::fs::write(&save, &file).unwrap();
    let task = format!(
        "{}:{}",
        if full { "full" } else { "det" },
        save.to_string_lossy()
    );
    let stdout = common::child::run_with("suspended_pairs_child", CHILD, &task);
    Runs {
        globals,
        straight,
        loaded_globals: common::child::fields(&stdout, "GLOBALS "),
        loaded: common::child::fields(&stdout, "STEP "),
        stdout,
    }
}

/// Format 9 and older wrote the removed entry's key of a table, function or C function
/// nowhere: the loaded walk stopped with "invalid key to 'next'" (and every one, strings
/// included, once a collection had cleared the keys). Format 10 gives the nodes their keys.
#[test]
fn loops_suspended_after_clearing_their_key_go_on_alike_in_another_process() {
    for collected in [false, true] {
        let runs = saved_and_loaded_in_a_child(false, collected);
        let last = runs.straight.last().unwrap();
        for name in ["tables", "functions", "cfunctions", "strings"] {
            assert!(last.contains(&format!("{name} done")), "{last}");
        }
        assert!(!last.contains("failed"), "{last}");
        assert_eq!(
            runs.loaded, runs.straight,
            "collected: {collected}\n{}",
            runs.stdout
        );
    }
}

/// `_G` and `package.loaded` are not written as tables (a load sets their entries into the
/// loading VM's own): format 10 writes their layouts in the game root and a load puts the
/// entries back in the saved nodes. Across processes under the deterministic profile (whose
/// hash seed is the same in both; it has no `package`, so `package.loaded` is not visible to
/// its code).
#[test]
fn pairs_of_globals_keep_their_order_in_another_process() {
    let runs = saved_and_loaded_in_a_child(false, false);
    assert_eq!(runs.loaded_globals, [runs.globals], "{}", runs.stdout);
}

/// The full library's hash seed is random per VM, so no table's order survives a load into
/// another VM; into the same one it does, `package.loaded` included, however the globals and
/// modules changed after the save.
#[test]
fn pairs_of_globals_and_loaded_modules_keep_their_order_after_a_load_into_the_same_vm() {
    let mut v = vm(true);
    v.exec(GAME, "=game").unwrap();
    go_on(&v, 3);
    let file = v.save_game().unwrap();
    let globals = v.call::<String>("globals", ()).unwrap();
    v.exec(
        "for i = 1, 200 do _G['x' .. i] = i end
         for i = 1, 200, 2 do _G['x' .. i] = nil end
         for i = 1, 50 do package.loaded['m' .. i] = {} end
         g2, g4 = nil, nil",
        "=churn",
    )
    .unwrap();
    assert_ne!(v.call::<String>("globals", ()).unwrap(), globals);
    v.load_game(&file, Trust::Own).unwrap();
    assert_eq!(v.call::<String>("globals", ()).unwrap(), globals);
}
