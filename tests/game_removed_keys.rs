//! The removed keys of the loading VM's own `_G` and `package.loaded` (format 11,
//! `After::GameRemovedKeys`, docs/save-games.md "Iteration order"): a coroutine suspended in a
//! `pairs()` loop over `_G` that cleared globals goes on after a whole-game load, a collection
//! before the save included, in another process too; a forged part is refused or harmless (no
//! global lost or shadowed, no key visited twice, no endless `pairs()`), in both profiles.

mod common;

use luasnap::bridge::persist::forge::{self, body_of, Node};
use luasnap::bridge::persist::Trust;
use luasnap::bridge::Vm;

const MIB: usize = 1 << 20;

fn det() -> Vm {
    common::det_vm(256 * MIB, 7)
}

fn full() -> Vm {
    common::full_vm(256 * MIB)
}

/// 30 game globals, a walk over `_G` that clears them, four steps, then a collection: the
/// removed entries' keys are dead, so the layout in the game root names them as code 1 and
/// their keys come after the root.
const GAME: &str = "
for i = 1, 30 do _G['gv' .. i] = { i } end
walk = coroutine.wrap(function()
  for k in next, _G do
    if type(k) == 'string' and k:sub(1, 2) == 'gv' then
      _G[k] = nil
      coroutine.yield(k)
    end
  end
  return 'done'
end)
for i = 1, 4 do walk() end
collectgarbage() collectgarbage()";

/// The same over `package.loaded` (the full profile has `package`).
const LOADED_GAME: &str = "
for i = 1, 30 do package.loaded['gv' .. i] = { i } end
walk = coroutine.wrap(function()
  for k in next, package.loaded do
    if type(k) == 'string' and k:sub(1, 2) == 'gv' then
      package.loaded[k] = nil
      coroutine.yield(k)
    end
  end
  return 'done'
end)
for i = 1, 4 do walk() end
collectgarbage() collectgarbage()";

/// Finishes the walk: how many more entries it cleared, or its error.
const FINISH: &str = "local n = 0
for i = 1, 1000 do
  if walk() == 'done' then return 'done ' .. n end
  n = n + 1
end
return 'endless'";

/// The entries of `_G` (or the table `expr`) as `key=type`, sorted; a key `next` gives that a
/// lookup does not find, or an endless traversal, is reported instead.
fn entries(vm: &Vm, expr: &str) -> String {
    let r = vm.exec(
        format!(
            "local t, ks, n = {expr}, {{}}, 0
             for k, v in next, t do
               n = n + 1
               if n > 100000 then return 'endless' end
               if rawget(t, k) ~= v then return 'lookup differs: ' .. tostring(k) end
               ks[#ks + 1] = tostring(k) .. '=' .. type(v)
             end
             table.sort(ks)
             return table.concat(ks, ' ')"
        ),
        "=entries",
    );
    vm.arena().verify().unwrap();
    match r {
        Ok(v) => v[0].as_str().unwrap_or("not a string").to_string(),
        Err(e) => format!("error: {e}"),
    }
}

fn finish(vm: &Vm) -> String {
    match vm.exec(FINISH, "=finish") {
        Ok(v) => v[0].as_str().unwrap_or("not a string").to_string(),
        Err(e) => format!("error: {e}"),
    }
}

/// The game run in a VM of `make`: its save, decoded.
fn honest(make: fn() -> Vm, game: &str) -> (Vec<u8>, Node) {
    let src = make();
    src.exec(game, "=game").unwrap();
    let file = src.save_game().unwrap();
    let node = forge::decode(body_of(&file).unwrap()).expect("an honest save decodes");
    (file, node)
}

type Entries = Vec<(u64, u64, u64, Node)>;

/// `honest` with its game part's count and entries changed by `f`.
fn forged(honest: &Node, f: &dyn Fn(&mut u64, &mut Entries)) -> Node {
    let mut node = honest.clone();
    let Node::GameRemovedKeys { n, entries, .. } = &mut node else {
        panic!("no removed keys of _G after the root: {honest:?}")
    };
    f(n, entries);
    node
}

#[test]
fn a_walk_over_globals_goes_on_after_a_collection_and_a_load() {
    for (profile, make) in [("det", det as fn() -> Vm), ("full", full)] {
        let src = make();
        src.exec(GAME, "=game").unwrap();
        let file = src.save_game().unwrap();
        let node = forge::decode(body_of(&file).unwrap()).unwrap();
        let Node::GameRemovedKeys { entries, .. } = &node else {
            panic!("{profile}: no removed keys of _G after the root")
        };
        // The key the walk holds is written (the other cleared names are garbage).
        assert!(!entries.is_empty(), "{profile}");
        for (table, _, dead, key) in entries {
            assert_eq!((*table, *dead), (0, 1), "{profile}: {key:?}");
            assert!(matches!(key, Node::StrRef(_)), "{profile}: {key:?}");
        }
        let mut dst = make();
        dst.load_game(&file, Trust::Own).unwrap();
        let after = finish(&dst);
        let straight = finish(&src);
        assert_eq!(straight, "done 26", "{profile}");
        if profile == "det" {
            // The same seed: the layout applies and the key is laid into its node.
            assert_eq!(after, straight, "{profile}");
        } else {
            // Another seed: the key goes in by insertion; the walk goes on and ends.
            assert!(after.starts_with("done"), "{profile}: {after}");
        }
        if profile == "det" {
            assert!(!entries_of(&dst).contains("gv"), "{profile}");
        }
    }
}

fn entries_of(vm: &Vm) -> String {
    entries(vm, "_G")
}

#[test]
fn a_walk_over_package_loaded_goes_on_after_a_collection_and_a_load() {
    for round in 0..3 {
        let (file, node) = honest(full, LOADED_GAME);
        let Node::GameRemovedKeys { entries, .. } = &node else {
            panic!("no removed keys after the root")
        };
        assert!(entries.iter().all(|e| e.0 == 1), "{entries:?}");
        let mut dst = full();
        dst.load_game(&file, Trust::Own).unwrap();
        let after = finish(&dst);
        assert!(after.starts_with("done"), "round {round}: {after}");
    }
}

const CHILD: &str = "LUASNAP_GAME_REMOVED_KEYS_CHILD";

#[test]
fn globals_walk_child() {
    let Ok(arg) = std::env::var(CHILD) else {
        return;
    };
    let (profile, save) = arg.split_once(':').unwrap();
    let mut vm = if profile == "det" { det() } else { full() };
    vm.load_game(&std::fs::read(save).unwrap(), Trust::Own)
        .unwrap();
    vm.gc_collect().unwrap();
    println!("RESULT {}", finish(&vm));
}

/// The walk over `_G`, saved after a collection, loaded in another process (which collects
/// first), in both profiles.
#[test]
fn a_walk_over_globals_goes_on_in_another_process() {
    for (profile, make) in [("det", det as fn() -> Vm), ("full", full)] {
        let src = make();
        src.exec(GAME, "=game").unwrap();
        let save = common::temp_file("luasnap-game-removed-", ".sav");
        std::fs::write(&save, src.save_game().unwrap()).unwrap();
        let out = common::child::run_with(
            "globals_walk_child",
            CHILD,
            &format!("{profile}:{}", save.to_string_lossy()),
        );
        let r = common::child::fields(&out, "RESULT ");
        assert_eq!(r.len(), 1, "{out}");
        if profile == "det" {
            assert_eq!(r[0], finish(&src), "{profile}");
        } else {
            assert!(r[0].starts_with("done"), "{profile}: {}", r[0]);
        }
    }
}

/// A forged part is refused where its bytes are no such part (with the loader's message),
/// and the refused load leaves the VM as it was.
#[test]
fn forged_game_removed_keys_are_refused() {
    let (file, honest) = honest(det, GAME);
    let cases: Vec<(&str, Node, &str)> = vec![
        (
            "a count past the end",
            forged(&honest, &|n, _| *n = 1000),
            "a count of removed keys larger than the file",
        ),
        (
            "an empty list",
            forged(&honest, &|n, e| {
                *n = 0;
                e.clear();
            }),
            "an empty list of removed keys",
        ),
        (
            "a table that is neither _G nor package.loaded",
            forged(&honest, &|_, e| e[0].0 = 2),
            "neither _G nor package.loaded",
        ),
        (
            "a flag that is neither dead nor not",
            forged(&honest, &|_, e| e[0].2 = 2),
            "a removed key's entry that is not one",
        ),
        (
            "a node past 2^30",
            forged(&honest, &|_, e| e[0].1 = 1 << 31),
            "a removed key's entry that is not one",
        ),
        (
            "a key that is a number",
            forged(&honest, &|_, e| e[0].3 = Node::Int(3)),
            "a removed key that is not a reference nor a permanent",
        ),
        (
            "a key that is a new table",
            forged(&honest, &|_, e| e[0].3 = forge::table(vec![])),
            "a removed key that is not a reference nor a permanent",
        ),
        (
            "a key naming an object not in the file",
            forged(&honest, &|_, e| e[0].3 = Node::Ref(1 << 20)),
            "reference to an object not yet defined",
        ),
        (
            "a key naming a string not in the file",
            forged(&honest, &|_, e| e[0].3 = Node::StrRef(1 << 20)),
            "",
        ),
        (
            "a short string as a key not cleared",
            forged(&honest, &|_, e| e[0].2 = 0),
            "a removed key of a kind no removed entry has",
        ),
    ];
    let mut control = det();
    control.load_game(&file, Trust::Own).unwrap();
    let before = entries_of(&control);
    for (what, node, expect) in cases {
        let mut dst = det();
        dst.load_game(&file, Trust::Own).unwrap();
        let e = dst
            .load_game(&forge::file(&node), Trust::Own)
            .expect_err(what)
            .to_string();
        assert!(e.contains(expect), "{what}: {e}");
        // Refused before the restore: the game loaded first is whole.
        assert_eq!(entries_of(&dst), before, "{what}");
        assert_eq!(finish(&dst), "done 26", "{what}");
    }
    // The part in a file of format 10, or out of order: an unknown part.
    let body = forge::encode(&honest);
    let old = forge::seal_old_body(&body, 10, forge::CURRENT_FLAGS);
    let e = det().load_game(&old, Trust::Own).unwrap_err().to_string();
    assert!(e.contains("unknown or out of order"), "format 10: {e}");
    for tail in [&[2u8, 1, 0, 0, 0, 10, 0][..], &[3u8, 1, 0, 0, 1, 10, 0][..]] {
        let e = det()
            .load_game(
                &forge::seal_body(&[&body[..], tail].concat(), true),
                Trust::Own,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown or out of order"), "{tail:?}: {e}");
    }
}

/// Forged entries the loader reads (references and names of the right kinds) but the tables
/// refuse: a node that is no removed entry, keys naming live globals, keys named again, in
/// both profiles (the laid path and the insertion path). Each load succeeds, every global is
/// there once and found by lookup, no removed key is visited, and the walk ends (done, or
/// "invalid key to 'next'" where the honest key was displaced).
#[test]
fn forged_game_removed_keys_shadow_nothing() {
    for (profile, make) in [("det", det as fn() -> Vm), ("full", full)] {
        let (file, honest) = honest(make, GAME);
        let Node::GameRemovedKeys { entries: real, .. } = &honest else {
            panic!("{profile}: no part")
        };
        let real = real[0].clone();
        // The string ids the file numbers: every one a key could name.
        let mut sids = 0u64;
        forge::walk_mut(&mut honest.clone(), &mut |n| {
            if matches!(n, Node::Str(b) if !b.is_empty()) {
                sids += 1;
            }
        });
        let mut control = make();
        control.load_game(&file, Trust::Own).unwrap();
        let want = entries_of(&control);
        assert!(want.contains("walk=function"), "{want}");
        let mut cases: Vec<(String, Node)> = Vec::new();
        for node in [0u64, 1, 5, 63, 1 << 29] {
            cases.push((
                format!("node {node}"),
                forged(&honest, &|_, e| e[0].1 = node),
            ));
        }
        for sid in 1..=sids {
            for dead in [0u64, 1] {
                // A live global's name (or any string of the file) first, the honest key
                // after it: whichever the table takes, no live key is shadowed.
                cases.push((
                    format!("string {sid} dead {dead}"),
                    forged(&honest, &|n, e| {
                        let mut x = e[0].clone();
                        x.2 = dead;
                        x.3 = Node::StrRef(sid);
                        e.insert(0, x);
                        *n += 1;
                    }),
                ));
            }
        }
        cases.push((
            "the honest key five times".into(),
            forged(&honest, &|n, e| {
                for _ in 0..4 {
                    e.push(real.clone());
                }
                *n += 4;
            }),
        ));
        cases.push((
            "the honest key at other nodes too".into(),
            forged(&honest, &|n, e| {
                for node in [0, 2, 3, 7, 11] {
                    let mut x = real.clone();
                    x.1 = node;
                    e.insert(0, x);
                }
                *n += 5;
            }),
        ));
        cases.push((
            "library functions and tables as keys".into(),
            forged(&honest, &|n, e| {
                for name in ["print", "_G", "string", "next"] {
                    let mut x = real.clone();
                    x.2 = 0;
                    x.3 = forge::perm(name);
                    e.insert(0, x);
                }
                *n += 4;
            }),
        ));
        let mut refused = 0;
        for (what, node) in &cases {
            let mut dst = make();
            match dst.load_game(&forge::file(node), Trust::Own) {
                Ok(()) => {}
                Err(e) => {
                    // A short string not cleared by a collection is of no kind a code-1 node
                    // has; an id the file gives no string is no reference.
                    let e = e.to_string();
                    assert!(
                        e.contains("a kind no removed entry has")
                            || e.contains("bad string reference"),
                        "{what}: {e}"
                    );
                    refused += 1;
                    continue;
                }
            }
            assert_eq!(entries_of(&dst), want, "{profile} {what}");
            let r = finish(&dst);
            assert!(
                r.starts_with("done") || r.contains("invalid key to 'next'"),
                "{profile} {what}: {r}"
            );
            if profile == "det" && what.starts_with("the honest key") {
                assert_eq!(r, "done 26", "{profile} {what}");
            }
        }
        // Every string the file numbers named dead, live globals' names among them, loads.
        assert!(
            refused > 0 && cases.len() - refused > sids as usize / 2,
            "{profile}: {refused} of {} refused",
            cases.len()
        );
    }
}
