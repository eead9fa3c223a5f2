//! Writes the hostile save-games of issue 21's acceptance, to measure what a foreign load costs
//! through each entry point (docs/save-games.md, "What a foreign load may cost").
//!
//! ```sh
//! cargo run --release --example foreign_costs -- DIR
//! ```
//!
//! writes into DIR:
//! - `tiny.lua`: a small game (`luasnap simulate DIR/tiny.lua --load ...`);
//! - `strings-{colliding,random}-{diff,sim,eris}.sav`: 100,000 distinct 8-byte strings, either
//!   sharing the low 20 bits of Lua's string hash under the seed of the VM that loads them
//!   (`luasnap diff`: 0; `simulate --seed 7`; `luasnap run --deterministic 0`: 0; each read
//!   from a table layout of a save that VM writes, as an attacker would), or drawn at random;
//!   the `diff` and `sim` ones are whole-game saves of `tiny.lua` with the strings in a global,
//!   the `eris` one a value for `eris.unpersist`;
//! - `gc-{concat,sort}.sav`: saves of `tiny.lua` whose objects have `__gc = table.concat`
//!   (1,900 references to one 1 MB string) or `table.sort` (50,000 references);
//! - `tiny-0.sav`: a save of `tiny.lua` (seed 0) to diff the others against;
//! - `deep-{a,b}.sav`: two whole-game saves of one-element tables nested 1,000,000 deep (about
//!   7 MB each), differing at the bottom (`luasnap diff DIR/deep-a.sav DIR/deep-b.sav`).

use luasnap::bridge::persist::forge::body_of;
use luasnap::bridge::persist::forge::{self, Node};
use luasnap::bridge::runtime::{Backend, Game, GameConfig};
use luasnap::bridge::Vm;
use std::path::{Path, PathBuf};

const TINY: &str = "local G = {}
function G.init(players, seed) world = { tick = 0 } end
function G.step(inputs) world.tick = world.tick + 1 end
function G.digest() return world.tick end
return G
";

const STRINGS: usize = 100_000;

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

fn array(items: impl IntoIterator<Item = Node>) -> Node {
    table(
        items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (Node::Int(i as i64 + 1), v))
            .collect(),
    )
}

/// The hash seed a VM shows in its saves (from a table layout).
fn seed_of(vm: &Vm) -> u32 {
    vm.exec(
        "shown = {} for i = 1, 50 do shown['k' .. i] = i end
         for i = 1, 50, 2 do shown['k' .. i] = nil end",
        "=t",
    )
    .unwrap();
    let node = forge::decode(body_of(&vm.persist("shown").unwrap()).unwrap()).unwrap();
    forge::layout_seed(&node).expect("a layout")
}

fn strings(seed: u32, colliding: bool) -> Vec<Vec<u8>> {
    if colliding {
        return forge::colliding_strings(seed, 20, STRINGS, 8, 0x9e37_79b9);
    }
    // Random strings of the same size, with the same generator's letters.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < STRINGS {
        let mut v = vec![0u8; 8];
        for b in &mut v {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            *b = b'a' + (rng % 26) as u8;
        }
        seen.insert(v);
    }
    seen.into_iter().collect()
}

/// A save of the tiny game at frame 1 (seed `seed`), decoded, with `extra` added to its
/// globals as `junk` (and, if `first`, the root's first entry `first = first`: its string
/// gets string id 1, after the key's).
fn tiny_save_with(dir: &Path, seed: u64, extra: Node) -> Vec<u8> {
    tiny_save_first(dir, seed, extra, None)
}

fn tiny_save_first(_dir: &Path, seed: u64, extra: Node, first: Option<Node>) -> Vec<u8> {
    let mut cfg = GameConfig::default_game(2, seed);
    cfg.script = TINY.into();
    cfg.chunk_name = "@tiny.lua".into();
    cfg.base_address = None;
    cfg.capacity = 1 << 30;
    let mut game = Game::new(&cfg, Backend::ArenaFull).unwrap();
    game.step(&[0, 0]).unwrap();
    let mut root = forge::decode(body_of(&game.save_game().unwrap()).unwrap()).unwrap();
    let Node::Table { entries, .. } = &mut root else {
        panic!("a game root")
    };
    if let Some(first) = first {
        entries.insert(0, (s("first"), first));
    }
    let globals = entries
        .iter_mut()
        .find(|(k, _)| *k == s("globals"))
        .map(|(_, v)| v)
        .expect("globals");
    let Node::Table { entries, .. } = globals else {
        panic!("a globals table")
    };
    // Appended last: object ids of the rest stay as they are. The table's layout (if any)
    // goes: it ends the entries and would not hold the new one.
    entries.retain(|(k, _)| !matches!(k, Node::Layout(_)));
    entries.push((s("junk"), extra));
    forge::file(&root)
}

fn tiny_seed(_dir: &Path, seed: u64) -> u32 {
    let mut cfg = GameConfig::default_game(2, seed);
    cfg.script = TINY.into();
    cfg.chunk_name = "@tiny.lua".into();
    cfg.base_address = None;
    cfg.capacity = 1 << 28;
    let game: Game = Game::new(&cfg, Backend::ArenaFull).unwrap();
    seed_of(game.vm())
}

fn deep(depth: usize, bottom: i64) -> Node {
    Node::Raw(forge::nested_tables(depth, bottom))
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: foreign_costs DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tiny.lua"), TINY).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(name), bytes).unwrap();
        println!("{name}: {} bytes", bytes.len());
    };
    // diff's VMs and run --deterministic 0 have seed 0; simulate --seed 7.
    let plain = Vm::builder().deterministic(0).build().unwrap();
    let diff_seed = seed_of(&plain);
    let sim_seed = tiny_seed(&dir, 7);
    for colliding in [true, false] {
        let kind = if colliding { "colliding" } else { "random" };
        let list = |seed| array(strings(seed, colliding).into_iter().map(Node::Str));
        write(
            &format!("strings-{kind}-diff.sav"),
            &tiny_save_with(&dir, 0, list(diff_seed)),
        );
        write(
            &format!("strings-{kind}-sim.sav"),
            &tiny_save_with(&dir, 7, list(sim_seed)),
        );
        write(
            &format!("strings-{kind}-eris.sav"),
            &forge::file(&list(diff_seed)),
        );
    }
    // Finalizers that are library functions, over many references.
    let finalized = |gc: &str, members: Vec<(Node, Node)>| {
        let mt = table(vec![(s("__gc"), Node::Perm(Box::new(s(gc))))]);
        let mut items = vec![Node::Table {
            narr: 0,
            nhash: 0,
            meta: Box::new(mt),
            entries: members,
        }];
        for _ in 1..50 {
            items.push(Node::Nil);
        }
        array(items)
    };
    // The 1 MB string is defined once, as the root's first entry (string id 1, after its key
    // "first"), and then referenced.
    let big = Node::Str(vec![b'x'; 1 << 20]);
    let concat: Vec<(Node, Node)> = (0..1900)
        .map(|i| (Node::Int(i + 1), Node::StrRef(1)))
        .collect();
    write(
        "gc-concat.sav",
        &tiny_save_first(&dir, 7, finalized("table.concat", concat), Some(big)),
    );
    let sort: Vec<(Node, Node)> = (0..50_000)
        .map(|i| (Node::Int(i + 1), Node::Int((i * 7919) % 50_000)))
        .collect();
    write(
        "gc-sort.sav",
        &tiny_save_with(&dir, 7, finalized("table.sort", sort)),
    );
    write("tiny-0.sav", &tiny_save_with(&dir, 0, Node::Int(0)));
    write("deep-a.sav", &tiny_save_with(&dir, 0, deep(1_000_000, 1)));
    write("deep-b.sav", &tiny_save_with(&dir, 0, deep(1_000_000, 2)));
}
