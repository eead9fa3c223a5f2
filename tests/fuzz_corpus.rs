//! Replays the committed fuzz corpora through the loader with the targets' own bodies
//! (`persist::fuzz`), and writes the seed files and the dictionary on demand.

use luasnap::bridge::persist::forge::{self, body_of};
use luasnap::bridge::persist::fuzz::{
    fuzz_load, fuzz_seeds, fuzz_structured, fuzz_vm, permanent_names, structured,
};
use luasnap::bridge::Value;
use std::path::PathBuf;

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn files(corpus: &str) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(fuzz_dir().join("corpus").join(corpus))
        .unwrap_or_else(|_| panic!("fuzz/corpus/{corpus} is committed"))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn the_committed_byte_corpus_loads_or_fails_cleanly() {
    let mut vm = fuzz_vm();
    let files = files("load");
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
        vec![Value::Integer(42)]
    );
}

#[test]
fn the_committed_structured_corpus_loads_or_fails_cleanly() {
    let mut vm = fuzz_vm();
    let seeds = fuzz_seeds(&vm);
    let dict = permanent_names(&vm);
    assert!(seeds.len() >= 5, "{}", seeds.len());
    let files = files("structured");
    assert!(!files.is_empty());
    for f in &files {
        fuzz_structured(&mut vm, &std::fs::read(f).unwrap(), &seeds, &dict);
    }
    vm.arena().verify().unwrap();
    assert_eq!(
        vm.exec("return 6 * 7", "alive").unwrap(),
        vec![Value::Integer(42)]
    );
}

/// The seeds decode and encode back to the same bytes, and an empty input stands for one of
/// them unchanged (so the structured target starts from honest files).
#[test]
fn seeds_round_trip_through_the_forge() {
    let vm = fuzz_vm();
    let seeds = fuzz_seeds(&vm);
    for s in &seeds {
        let file = forge::file(s);
        assert_eq!(forge::decode(body_of(&file).unwrap()).as_ref(), Some(s));
    }
    assert_eq!(structured(&[], &seeds, &[]), seeds[0]);
}

/// The structured target reaches format 5: its seeds hold table layouts, and its generator
/// makes and edits them (so the loader's layout checks are fuzzed, not only replayed).
#[test]
fn the_structured_target_generates_table_layouts() {
    let vm = fuzz_vm();
    let seeds = fuzz_seeds(&vm);
    let layouts = |n: &forge::Node| {
        let mut n = n.clone();
        let mut count = 0;
        forge::walk_mut(&mut n, &mut |x| {
            if let forge::Node::Layout(_) = x {
                count += 1;
            }
        });
        count
    };
    assert!(seeds.iter().any(|s| layouts(s) > 0), "no seed has a layout");
    let dict = permanent_names(&vm);
    let generated = (0..2000u32)
        .map(|i| {
            let input: Vec<u8> = (0..64u32)
                .map(|j| {
                    (i.wrapping_mul(2654435761) ^ j.wrapping_mul(40503)).to_le_bytes()
                        [j as usize % 4]
                })
                .collect();
            layouts(&structured(&input, &seeds, &dict))
        })
        .filter(|&n| n > 0)
        .count();
    assert!(generated > 100, "{generated} of 2000 inputs had a layout");
}

/// The structured target edits the entries of tables that carry a layout (which the loader
/// puts into their nodes in the order they come): reordered, doubled or dropped entries load
/// or fail cleanly.
#[test]
fn edited_entries_of_tables_with_layouts_load_or_fail_cleanly() {
    let mut vm = fuzz_vm();
    let seeds = fuzz_seeds(&vm);
    let dict = permanent_names(&vm);
    let entries_of_layout_tables = |n: &forge::Node| {
        let mut n = n.clone();
        let mut out = Vec::new();
        forge::walk_mut(&mut n, &mut |x| {
            if let forge::Node::Table { entries, .. } = x {
                if matches!(entries.last(), Some((forge::Node::Layout(_), _))) {
                    out.push(entries.clone());
                }
            }
        });
        out
    };
    let honest: Vec<_> = seeds.iter().flat_map(entries_of_layout_tables).collect();
    let mut edited = 0;
    for i in 0..3000u32 {
        let input: Vec<u8> = (0..64u32)
            .map(|j| (i.wrapping_mul(2246822519) ^ j.wrapping_mul(3266489917)).to_le_bytes()[1])
            .collect();
        let tree = structured(&input, &seeds, &dict);
        if entries_of_layout_tables(&tree)
            .iter()
            .any(|e| !honest.contains(e))
        {
            edited += 1;
            fuzz_structured(&mut vm, &input, &seeds, &dict);
        }
    }
    vm.arena().verify().unwrap();
    assert!(edited > 30, "{edited} of 3000 inputs edited such entries");
}

/// The seeds hold finalization marks (format 8), and the structured target puts marks where
/// the save had none, besides editing the ones it had: the loader's checks on marks (an
/// object marked twice, out of order, one it did not build) are fuzzed, not only replayed.
#[test]
fn the_structured_target_inserts_finalization_marks() {
    let mut vm = fuzz_vm();
    let seeds = fuzz_seeds(&vm);
    // Marks on any object, and marks an honest save never writes: on an object without a
    // metatable (so without `__gc`).
    let marks = |n: &forge::Node| {
        let mut n = n.clone();
        let (mut all, mut forged) = (0, 0);
        forge::walk_mut(&mut n, &mut |x| {
            if let forge::Node::Final(mark, object) = x {
                all += usize::from(*mark > 0);
                if let forge::Node::Table { meta, .. } | forge::Node::UdBytes { meta, .. } =
                    &**object
                {
                    forged += usize::from(*mark > 0 && **meta == forge::Node::Nil);
                }
            }
        });
        (all, forged)
    };
    assert!(seeds.iter().any(|s| marks(s).0 > 0), "no seed has a mark");
    assert!(seeds.iter().all(|s| marks(s).1 == 0));
    let dict = permanent_names(&vm);
    let mut inserted = 0;
    for i in 0..3000u32 {
        let input: Vec<u8> = (0..64u32)
            .map(|j| (i.wrapping_mul(2654435761) ^ j.wrapping_mul(97)).to_le_bytes()[2])
            .collect();
        if marks(&structured(&input, &seeds, &dict)).1 > 0 {
            inserted += 1;
            fuzz_structured(&mut vm, &input, &seeds, &dict);
        }
    }
    vm.arena().verify().unwrap();
    assert!(inserted > 15, "{inserted} of 3000 inputs added a mark");
}

/// A seed holds removed keys after its root (format 10: coroutines suspended in `pairs()`
/// loops that cleared their entry), and the structured target forges such parts (entries
/// naming any object, node and flag, with any value as the key) and edits honest ones: the
/// loader's checks on them are fuzzed, not only replayed.
#[test]
fn the_structured_target_forges_removed_keys() {
    let mut vm = fuzz_vm();
    let seeds = fuzz_seeds(&vm);
    let removed = |n: &forge::Node| match n {
        forge::Node::RemovedKeys { entries, .. } => entries.len(),
        _ => 0,
    };
    assert!(
        seeds.iter().any(|s| removed(s) >= 4),
        "no seed has removed keys of tables, functions, C functions and strings"
    );
    let dict = permanent_names(&vm);
    let mut forged = 0;
    for i in 0..3000u32 {
        let input: Vec<u8> = (0..64u32)
            .map(|j| (i.wrapping_mul(2246822519) ^ j.wrapping_mul(31)).to_le_bytes()[1])
            .collect();
        if removed(&structured(&input, &seeds, &dict)) > 0 {
            forged += 1;
            fuzz_structured(&mut vm, &input, &seeds, &dict);
        }
    }
    vm.arena().verify().unwrap();
    assert!(forged > 30, "{forged} of 3000 inputs had removed keys");
}

/// Every seed file of the byte corpus is a save of this build (format and flags), so the
/// fuzzer starts from what the writer writes today.
#[test]
fn the_seed_files_are_of_this_format() {
    for f in files("load") {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("seed-") && name.ends_with(".sav") {
            let bytes = std::fs::read(&f).unwrap();
            assert_eq!(
                u16::from_le_bytes([bytes[8], bytes[9]]),
                luasnap::bridge::persist::FORMAT_VERSION,
                "{name}: regenerate with `cargo test --test fuzz_corpus -- --ignored write_seeds`"
            );
            assert_ne!(bytes[32] & forge::CURRENT_FLAGS, 0, "{name}");
        }
    }
}

/// Regenerates the seed files of both corpora and the byte target's dictionary (every
/// permanent's name, and the format's tags): `cargo test --test fuzz_corpus -- --ignored`.
#[test]
#[ignore]
fn write_seeds() {
    let vm = fuzz_vm();
    let dir = fuzz_dir().join("corpus");
    std::fs::create_dir_all(dir.join("load")).unwrap();
    std::fs::create_dir_all(dir.join("structured")).unwrap();
    for (i, s) in fuzz_seeds(&vm).iter().enumerate() {
        let file = forge::file(s);
        std::fs::write(dir.join("load").join(format!("seed-{i}.sav")), &file).unwrap();
        std::fs::write(
            dir.join("load").join(format!("seed-{i}.body")),
            body_of(&file).unwrap(),
        )
        .unwrap();
    }
    for i in 0..16u8 {
        std::fs::write(
            dir.join("structured").join(format!("seed-{i}")),
            [i, i.wrapping_mul(37), 3, i, 200, 7, i ^ 0x55, 1],
        )
        .unwrap();
    }
    // Inputs that start from the seeds of table layouts (format 5) and of the registers a
    // resumed frame trusts, with a few edits each.
    let seeds = fuzz_seeds(&vm);
    for j in seeds.len().saturating_sub(3)..seeds.len() {
        for k in 0..6u8 {
            let mut input = vec![0, j as u8, 1 + k % 5];
            input.extend((0..40u8).map(|i| i.wrapping_mul(31).wrapping_add(k.wrapping_mul(57))));
            std::fs::write(
                dir.join("structured").join(format!("seed-fmt5-{j}-{k}")),
                input,
            )
            .unwrap();
        }
    }
    let mut dict = String::from("# Permanent names of the fuzz VM, and the format's tags.\n");
    for name in permanent_names(&vm) {
        dict.push_str(&format!("\"{}\"\n", name.escape_default()));
    }
    for (name, tag) in [
        ("perm", 11u8),
        ("thread", 29),
        ("upval_open", 42),
        ("cclosure", 22),
    ] {
        dict.push_str(&format!("tag_{name}=\"\\x{tag:02x}\"\n"));
    }
    std::fs::write(fuzz_dir().join("load.dict"), dict).unwrap();
}
