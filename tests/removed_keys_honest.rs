//! Honest suspended pairs() loops saved and loaded in another process (an outside tester's:
//! nested coroutines, keys shared by several tables, mixed key kinds, both collector modes).

mod common;

use luasnap::bridge::persist::Trust;
use luasnap::bridge::{GcMode, Vm};

const CHILD: &str = "LUASNAP_REMOVED_KEYS_CHILD";

const GAME: &str = "
local cfuns = { print, type, rawget, rawset, rawequal, rawlen, select, tostring,
                tonumber, pcall, error, assert, next, ipairs, setmetatable, getmetatable }
shared = {}
for i = 1, 16 do shared[i] = { id = i } end
A, B, C = {}, {}, {}
mixed = {}
for i = 1, 16 do
  A[shared[i]] = i; B[shared[i]] = -i; C[shared[17 - i]] = i * 10
  mixed[shared[i]] = i
  mixed['s' .. i] = i
  mixed[cfuns[i]] = i
  mixed[function() return i end] = i
  mixed[coroutine.create(function() end)] = i
  mixed[i * 1.5] = i
end
log = {}
local function walker(name, t)
  return coroutine.wrap(function()
    for k, v in pairs(t) do
      t[k] = nil
      coroutine.yield(name .. '=' .. tostring(v))
    end
    return name .. ' done'
  end)
end
-- nested: an outer walk over A resumes an inner walk over B at each step; both clear
local inner = walker('B', B)
local outer = coroutine.wrap(function()
  for k, v in pairs(A) do
    A[k] = nil
    -- the same key object removed from C too, when present
    C[k] = nil
    local ok, got = pcall(inner)
    coroutine.yield('A=' .. v .. '/' .. tostring(ok and got or 'err ' .. tostring(got)))
  end
  return 'A done'
end)
walks = { outer, walker('C', C), walker('mixed', mixed) }
function step()
  for i = 1, #walks do
    local w = walks[i]
    if w then
      local ok, got = pcall(w)
      log[#log + 1] = ok and got or ('w' .. i .. ' failed: ' .. tostring(got))
      if not ok or tostring(got):find(' done') then walks[i] = false end
    end
  end
  local n = 0
  for _ in pairs(mixed) do n = n + 1 end
  return table.concat(log, ',') .. ' #mixed=' .. n
end
";

fn vm(generational: bool) -> Vm {
    let b = Vm::builder().capacity(64 << 20).deterministic(5);
    let b = if generational {
        b.gc(GcMode::Generational {
            minor_multiplier: None,
            major_minor: None,
            minor_major: None,
        })
    } else {
        b
    };
    b.build().unwrap()
}

fn go_on(vm: &Vm, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| vm.call::<String>("step", ()).unwrap())
        .collect()
}

#[test]
fn removed_keys_child() {
    let Ok(task) = std::env::var(CHILD) else {
        return;
    };
    let (gen, save) = task.split_once(':').unwrap();
    let bytes = std::fs::read(save).unwrap();
    let mut v = vm(gen == "gen");
    v.load_game(&bytes, Trust::Own).unwrap();
    for line in go_on(&v, 70) {
        println!("STEP {line}");
    }
    v.arena().verify().unwrap();
}

#[test]
fn suspended_walks_of_many_key_kinds_go_on_alike_in_another_process() {
    let mut bad = Vec::new();
    for gen in [false, true] {
        for collected in [false, true] {
            for steps in [1usize, 5] {
                let v = vm(gen);
                v.exec(GAME, "=game").unwrap();
                go_on(&v, steps);
                if collected {
                    v.gc_collect().unwrap();
                }
                let file = v.save_game().unwrap();
                let straight = go_on(&v, 70);
                assert!(
                    !straight.last().unwrap().contains("failed"),
                    "{:?}",
                    straight.last()
                );
                let save = common::temp_file("luasnap-removed-keys-", ".sav");
                std::fs::write(&save, &file).unwrap();
                let task = format!(
                    "{}:{}",
                    if gen { "gen" } else { "inc" },
                    save.to_string_lossy()
                );
                let out = common::child::run_with("removed_keys_child", CHILD, &task);
                let loaded = common::child::fields(&out, "STEP ");
                if loaded != straight {
                    let i = (0..straight.len())
                        .find(|&i| loaded.get(i) != Some(&straight[i]))
                        .unwrap();
                    eprintln!(
                        "gen {gen} collected {collected} steps {steps}: first difference at step {i}\n straight {}\n loaded   {:?}",
                        straight[i],
                        loaded.get(i)
                    );
                    bad.push((gen, collected, steps));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}

/// The full profile (a random hash seed per VM): a walk that cleared its key, loaded into
/// another VM (whose seed differs, so layouts are skipped and the removed entry's node is
/// not rebuilt): it stops with "invalid key to 'next'". A known hole (docs/determinism.md):
/// games that save and load use the deterministic profile, whose seed every VM shares.
#[test]
#[ignore = "known hole, open (docs/determinism.md): under the full profile's random hash seed a \
            load rebuilds tables by insertion and drops removed entries; --ignored shows it"]
fn suspended_walk_in_the_full_profile_loaded_into_another_vm() {
    let mk = || Vm::builder().capacity(64 << 20).build().unwrap();
    let game = "
      t = {}
      for i = 1, 20 do t['k' .. i] = i end
      walk = coroutine.wrap(function()
        local n = 0
        for k, v in pairs(t) do t[k] = nil n = n + 1 coroutine.yield(n) end
        return 'done ' .. n
      end)
      walk() walk() walk()";
    let v = mk();
    v.exec(game, "=g").unwrap();
    let file = v.save_game().unwrap();
    let straight = v.exec("local r for _ = 1, 30 do local ok, x = pcall(walk) r = tostring(ok) .. ' ' .. tostring(x) if x == nil or tostring(x):find('done') or not ok then break end end return r", "=go");
    let mut w = mk();
    w.load_game(&file, Trust::Own).unwrap();
    let loaded = w.exec("local r for _ = 1, 30 do local ok, x = pcall(walk) r = tostring(ok) .. ' ' .. tostring(x) if x == nil or tostring(x):find('done') or not ok then break end end return r", "=go");
    eprintln!("straight {straight:?}\nloaded   {loaded:?}");
    assert_eq!(format!("{straight:?}"), format!("{loaded:?}"));
}
