//! Value-level differences between two game states, by path.
//!
//! [`Vm::value_graph`] extracts the graph the value digest hashes ([`crate::runtime::digest`]: the
//! same coverage, weak-table rules included); [`ValueGraph::diff`] walks two of them from
//! their roots in parallel, breadth first, descending only where the refined hashes differ,
//! and reports each differing value once, at the shortest path that reaches it:
//!
//! ```text
//! luasnap_game.step@world.ents[17].x: 3.5 vs 3.25
//! math.random@upvalue[1]: userdata (32 bytes) with other contents (math.random state)
//! ```
//!
//! Paths: `.name` for a string key that is an identifier, `[k]` for other keys (a table key
//! as `[table]`), `@name` for the upvalue `name` of a function (`@upvalue[i]` when Lua has no
//! name), `@metatable`, `@uservalue[i]`, `@stack[i]` for a coroutine's stack slot.
//! Table keys that are objects are matched by their content.

use crate::bridge::error::VmError;
use crate::bridge::vm::Vm;
use crate::persist::{LoadOptions, Trust};
use crate::runtime::digest::{Graph, Item, Kind, Part, Prim};
use crate::runtime::{Game, GameConfig, GameError};
use luasnap_snap::Snapshot;
use mlua_sys as ffi;
use std::collections::{HashMap, HashSet, VecDeque};

/// The values reachable from the globals, as a graph (see [`crate::runtime::digest`]).
pub struct ValueGraph {
    graph: Graph,
    root: Item,
}

impl std::fmt::Debug for ValueGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueGraph")
            .field("graph", &self.graph)
            .finish()
    }
}

/// One differing value.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// Where, from the globals.
    pub path: String,
    /// The value on the left.
    pub left: String,
    /// The value on the right.
    pub right: String,
    /// What the path is, when luasnap knows (`math.random state`).
    pub note: Option<String>,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} vs {}", self.path, self.left, self.right)?;
        if let Some(n) = &self.note {
            write!(f, " ({n})")?;
        }
        Ok(())
    }
}

/// The result of [`ValueGraph::diff`].
#[derive(Debug, Clone)]
pub struct ValueDiff {
    /// The differences found, breadth first, at most the limit asked for.
    pub differences: Vec<Difference>,
    /// Whether more differences exist than were listed.
    pub truncated: bool,
    /// Whether the two states are equal (equal value digests).
    pub equal: bool,
}

impl ValueGraph {
    /// The value digest of this state (as [`Vm::value_digest`]).
    pub fn digest(&self) -> u64 {
        self.graph.digest(self.root)
    }

    /// Number of objects in the graph.
    pub fn objects(&self) -> usize {
        self.graph.nodes.len()
    }

    /// The differences between `self` (left) and `other` (right), at most `limit` of them.
    pub fn diff(&self, other: &ValueGraph, limit: usize) -> ValueDiff {
        let (ra, ha) = self.graph.refine_until_stable();
        let (rb, hb) = other.graph.refine_until_stable();
        let rounds = ra.max(rb);
        let (ha, hb) = match ra.cmp(&rb) {
            std::cmp::Ordering::Equal => (ha, hb),
            std::cmp::Ordering::Less => (self.graph.refine(rounds), hb),
            std::cmp::Ordering::Greater => (ha, other.graph.refine(rounds)),
        };
        let equal = self.digest() == other.digest();
        let mut d = Differ {
            a: &self.graph,
            b: &other.graph,
            ha: &ha,
            hb: &hb,
            out: Vec::new(),
            limit,
            truncated: false,
        };
        if !equal {
            d.walk(self.root, other.root);
            if d.out.is_empty() && !d.truncated {
                d.out.push(Difference {
                    path: "(globals)".into(),
                    left: "a state".into(),
                    right: "another".into(),
                    note: Some(format!(
                        "the difference lies deeper than {rounds} references from any object that differs on the way; no single path found"
                    )),
                });
            }
        }
        ValueDiff {
            differences: d.out,
            truncated: d.truncated,
            equal,
        }
    }
}

struct Differ<'a> {
    a: &'a Graph,
    b: &'a Graph,
    ha: &'a [u64],
    hb: &'a [u64],
    out: Vec<Difference>,
    limit: usize,
    truncated: bool,
}

fn is_ident(b: &[u8]) -> bool {
    !b.is_empty()
        && (b[0] == b'_' || b[0].is_ascii_alphabetic())
        && b.iter().all(|&c| c == b'_' || c.is_ascii_alphanumeric())
}

impl Differ<'_> {
    fn hash(&self, left: bool, it: Item) -> u64 {
        match it {
            Item::Prim { hash, .. } => hash,
            Item::Ref(id) => {
                let h = if left { self.ha } else { self.hb };
                h[id as usize] ^ 0x5245_4600_0000_0000
            }
        }
    }

    fn describe(&self, left: bool, it: Item) -> String {
        let g = if left { self.a } else { self.b };
        match it {
            Item::Prim { at, .. } => match &g.prims[at as usize] {
                Prim::Str(b) => str_window(b, 0, 57),
                p => p.to_string(),
            },
            Item::Ref(id) => match &g.nodes[id as usize].kind {
                Some(k) => k.to_string(),
                None => "object".into(),
            },
        }
    }

    fn key_path(&self, base: &str, key: Item) -> String {
        match self.a.prim(key) {
            Some(Prim::Str(b)) if is_ident(b) => {
                let name = String::from_utf8_lossy(b);
                if base.is_empty() {
                    name.into_owned()
                } else {
                    format!("{base}.{name}")
                }
            }
            Some(Prim::Str(b)) => format!("{base}[{}]", str_window(b, 0, 57)),
            Some(p) => format!("{base}[{p}]"),
            None => format!("{base}[{}]", self.describe(true, key)),
        }
    }

    fn report(&mut self, path: String, a: Option<Item>, b: Option<Item>, note: Option<String>) {
        if self.out.len() >= self.limit {
            self.truncated = true;
            return;
        }
        let note = if path.starts_with("math.random@") || path.starts_with("math.randomseed@") {
            Some("math.random state".to_string())
        } else {
            note
        };
        let strings = match (
            a.and_then(|i| self.a.prim(i)),
            b.and_then(|i| self.b.prim(i)),
        ) {
            (Some(Prim::Str(x)), Some(Prim::Str(y))) => Some((x, y)),
            _ => None,
        };
        let (left, right, note) = match strings {
            // Two strings: a window around the first differing byte, the same on both sides.
            Some((x, y)) => {
                let at = x.iter().zip(y.iter()).take_while(|(p, q)| p == q).count();
                let from = if x.len().max(y.len()) <= 57 {
                    0
                } else {
                    at.saturating_sub(20)
                };
                let what = format!(
                    "strings of {} and {} bytes, first differing at byte {at}",
                    x.len(),
                    y.len()
                );
                let note = Some(match note {
                    Some(n) => format!("{n}; {what}"),
                    None => what,
                });
                (str_window(x, from, 57), str_window(y, from, 57), note)
            }
            None => (
                a.map_or("(absent)".into(), |i| self.describe(true, i)),
                b.map_or("(absent)".into(), |i| self.describe(false, i)),
                note,
            ),
        };
        self.out.push(Difference {
            path: if path.is_empty() {
                "(globals)".into()
            } else {
                path
            },
            left,
            right,
            note,
        });
    }

    fn walk(&mut self, ra: Item, rb: Item) {
        let mut queue: VecDeque<(String, Item, Item)> = VecDeque::new();
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        queue.push_back((String::new(), ra, rb));
        while let Some((path, ia, ib)) = queue.pop_front() {
            if self.truncated {
                return;
            }
            if self.hash(true, ia) == self.hash(false, ib) {
                continue;
            }
            let (Item::Ref(na), Item::Ref(nb)) = (ia, ib) else {
                self.report(path, Some(ia), Some(ib), None);
                continue;
            };
            if !seen.insert((na, nb)) {
                continue;
            }
            let (a, b) = (&self.a.nodes[na as usize], &self.b.nodes[nb as usize]);
            if a.kind != b.kind {
                self.report(path, Some(ia), Some(ib), None);
                continue;
            }
            if a.kind_hash != b.kind_hash {
                let what = match &a.kind {
                    Some(Kind::UserData(_)) => "contents differ",
                    Some(Kind::Thread(_)) => "status differs",
                    _ => "identity differs",
                };
                self.report(path.clone(), Some(ia), Some(ib), Some(what.into()));
            }
            // Ordered parts, position by position.
            let n = a.parts.len().max(b.parts.len());
            for i in 0..n {
                let (pa, pb) = (a.parts.get(i), b.parts.get(i));
                let label = pa.or(pb).map(|(p, _)| p.clone()).expect("i < len");
                let sub = match &label {
                    Part::Metatable => format!("{path}@metatable"),
                    Part::Upvalue(i, name) if name.is_empty() => format!("{path}@upvalue[{i}]"),
                    Part::Upvalue(_, name) => format!("{path}@{name}"),
                    Part::UserValue(i) => format!("{path}@uservalue[{i}]"),
                    Part::Stack(i) => format!("{path}@stack[{i}]"),
                };
                match (pa, pb) {
                    (Some((_, x)), Some((_, y))) => queue.push_back((sub, *x, *y)),
                    (x, y) => self.report(sub, x.map(|p| p.1), y.map(|p| p.1), None),
                }
            }
            // Entries, matched by the content of their keys.
            let mut right: HashMap<u64, Vec<(Item, Item)>> = HashMap::new();
            for &(k, v) in &b.entries {
                right.entry(self.hash(false, k)).or_default().push((k, v));
            }
            let mut left_only = Vec::new();
            let mut matched = Vec::new();
            for &(k, v) in &a.entries {
                match right.get_mut(&self.hash(true, k)).and_then(|l| l.pop()) {
                    Some((_, w)) => matched.push((k, self.key_path(&path, k), v, w)),
                    None => left_only.push((k, v)),
                }
            }
            // In key order (numbers by value, so `[2]` comes before `[10]`, then strings, see
            // `key_order`), so that of two equally short paths to a value the first in key
            // order names it, the same way every time.
            matched.sort_by(|x, y| key_order(self.a, x.0, self.a, y.0).then_with(|| x.1.cmp(&y.1)));
            queue.extend(matched.into_iter().map(|(_, p, v, w)| (p, v, w)));
            left_only.sort_by(|x, y| key_order(self.a, x.0, self.a, y.0));
            for (k, v) in left_only {
                let p = self.key_path(&path, k);
                self.report(p, Some(v), None, None);
            }
            let mut right_only: Vec<(Item, Item)> = right.into_values().flatten().collect();
            right_only.sort_by(|x, y| {
                key_order(self.b, x.0, self.b, y.0)
                    .then_with(|| self.describe(false, x.0).cmp(&self.describe(false, y.0)))
            });
            for (k, w) in right_only {
                let p = match other_key(self.b, k) {
                    Some(name) if is_ident(name.as_bytes()) && path.is_empty() => name,
                    Some(name) if is_ident(name.as_bytes()) => format!("{path}.{name}"),
                    _ => format!("{path}[{}]", self.describe(false, k)),
                };
                self.report(p, None, Some(w), None);
            }
        }
    }
}

/// Up to `width` bytes of `b` from byte `from`, quoted the way Lua source would write them:
/// printable ASCII and valid UTF-8 as is, other bytes as `\xNN`; `...` marks cut ends.
fn str_window(b: &[u8], from: usize, width: usize) -> String {
    let from = from.min(b.len());
    let mut end = (from + width).min(b.len());
    // Do not cut a UTF-8 sequence in two at the end (the start may fall inside one: its
    // continuation bytes then show as escapes).
    while end < b.len() && end > from && (b[end] & 0xc0) == 0x80 {
        end -= 1;
    }
    let mut out = String::new();
    if from > 0 {
        out.push_str("...");
    }
    out.push('"');
    for chunk in b[from..end].utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    out.push_str(&format!("\\x{:02X}", c as u32))
                }
                c => out.push(c),
            }
        }
        for &x in chunk.invalid() {
            out.push_str(&format!("\\x{x:02X}"));
        }
    }
    out.push('"');
    if end < b.len() {
        out.push_str(&format!("... ({} bytes)", b.len()));
    }
    out
}

/// The order differences are listed in within a table: numbers by value (an integer before
/// an equal float), then strings by their bytes, then booleans (false first), then keys that
/// are objects (their order left to the caller).
fn key_order(ga: &Graph, a: Item, gb: &Graph, b: Item) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    fn class(p: Option<&Prim>) -> u8 {
        match p {
            Some(Prim::Int(_) | Prim::Float(_)) => 0,
            Some(Prim::Str(_)) => 1,
            Some(Prim::Bool(_)) => 2,
            _ => 3,
        }
    }
    let (pa, pb) = (ga.prim(a), gb.prim(b));
    class(pa).cmp(&class(pb)).then_with(|| match (pa, pb) {
        (Some(Prim::Int(x)), Some(Prim::Int(y))) => x.cmp(y),
        (Some(Prim::Float(x)), Some(Prim::Float(y))) => x.total_cmp(y),
        // An integer and a float: by value, exactly (an i64 may not fit an f64).
        (Some(Prim::Int(x)), Some(Prim::Float(y))) => int_float(*x, *y),
        (Some(Prim::Float(x)), Some(Prim::Int(y))) => int_float(*y, *x).reverse(),
        (Some(Prim::Str(x)), Some(Prim::Str(y))) => x.cmp(y),
        (Some(Prim::Bool(x)), Some(Prim::Bool(y))) => x.cmp(y),
        _ => Ordering::Equal,
    })
}

/// An integer against a float, by value (NaN last; an integer before an equal float).
fn int_float(i: i64, f: f64) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    if f.is_nan() {
        return Ordering::Less;
    }
    // 2^63 as a float: every i64 is below it, and a float at or above it is above every i64.
    if f >= 9_223_372_036_854_775_808.0 {
        return Ordering::Less;
    }
    if f < -9_223_372_036_854_775_808.0 {
        return Ordering::Greater;
    }
    let t = f.trunc() as i64; // exact: |f| < 2^63
    match i.cmp(&t) {
        Ordering::Equal if f.fract() > 0.0 => Ordering::Less,
        Ordering::Equal if f.fract() < 0.0 => Ordering::Greater,
        Ordering::Equal => Ordering::Less,
        o => o,
    }
}

fn other_key(g: &Graph, k: Item) -> Option<String> {
    match g.prim(k) {
        Some(Prim::Str(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

// Here, not in runtime/mod.rs, so that the game's module does not import this one (which
// imports it: layers test).
impl Game {
    /// The values reachable from the globals, for a path-by-path diff with another state.
    pub fn value_graph(&mut self) -> Result<ValueGraph, GameError> {
        Ok(self.vm.value_graph()?)
    }
}

impl Vm {
    /// The graph of values reachable from the globals (what [`Vm::value_digest`] hashes), for
    /// [`ValueGraph::diff`]. Like the digest, it captures the VM and restores it after: the
    /// arena is byte-identical afterwards.
    pub fn value_graph(&mut self) -> Result<ValueGraph, VmError> {
        self.check_idle("extract the value graph")?;
        let saved = Snapshot::capture(&self.arena);
        let mut graph = Graph::default();
        let mut root = None;
        let result = self.run(
            &mut |L| {
                // SAFETY: protected body; the state is restored below whatever happens.
                unsafe {
                    ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
                    root = Some(crate::runtime::digest::extract(L, &mut graph));
                }
                0
            },
            |_, _| (),
        );
        saved.restore(&mut self.arena)?;
        result?;
        Ok(ValueGraph {
            graph,
            root: root.expect("extract ran"),
        })
    }
}

/// The values of a save-game, read as `luasnap diff` reads them: into a VM that only reads
/// ([`Game::reader_vm`] of `game`, the game that wrote it, natives and userdata types from its
/// setup), or without a game into a plain VM, then into the runtime with an empty game (saves
/// of `luasnap simulate`, whose own code travels with them under [`Trust::Own`]), then into
/// the embedded default game. What the reading VM lacks (natives, userdata types of a host
/// not given) loads as named stand-ins ([`LoadOptions::stand_ins`]), objects with finalizers
/// load but never run them, and under [`Trust::Foreign`] no code comes from the file. The
/// error of a failed load is the most telling attempt's.
pub fn save_graph(
    game: Option<&GameConfig>,
    save: &[u8],
    trust: Trust,
) -> Result<ValueGraph, GameError> {
    let read = |mut vm: Vm| -> Result<ValueGraph, GameError> {
        let mut opts = LoadOptions::new(trust);
        opts.finalizers = false;
        opts.inert_finalizers = true;
        opts.stand_ins = true;
        vm.load_game_with(save, &opts)?;
        Ok(vm.value_graph()?)
    };
    let reader = |script: &str, chunk_name: &str| {
        let mut cfg = GameConfig::default_game(1, 0);
        cfg.script = script.into();
        cfg.chunk_name = chunk_name.into();
        cfg.capacity = READER_CAPACITY;
        Game::reader_vm(&cfg)
    };
    if let Some(game) = game {
        let mut cfg = game.clone();
        cfg.capacity = cfg.capacity.max(READER_CAPACITY);
        return read(Game::reader_vm(&cfg)?);
    }
    let plain = Vm::builder()
        .capacity(READER_CAPACITY)
        .deterministic(0)
        .build()?;
    if let Ok(g) = read(plain) {
        return Ok(g);
    }
    // Saves written by the runtime hold its glue functions too: a runtime VM with an empty
    // game names the game's own functions in its error, the thing the user can act on.
    let empty = "return { init = function() end, step = function() end }";
    let runtime_error = match read(reader(empty, "=[empty game]")?) {
        Ok(g) => return Ok(g),
        Err(e) => e,
    };
    let d = GameConfig::default_game(1, 0);
    read(reader(&d.script, &d.chunk_name)?).map_err(|_| runtime_error)
}

/// Address space of a VM that reads a save-game ([`save_graph`]).
const READER_CAPACITY: usize = 8 << 30;

/// Two save-games compared ([`diff_saves`]).
#[derive(Debug)]
pub struct SaveDiff {
    /// The left save's values.
    pub left: ValueGraph,
    /// The right save's values.
    pub right: ValueGraph,
    /// Their differences.
    pub diff: ValueDiff,
}

/// `luasnap diff` as a library function: the values of two save-games of `game` read as
/// [`save_graph`] reads them, and their differences (at most `limit` listed). A host whose
/// game has natives and userdata passes its [`GameConfig`] (its setup registers them); without
/// it they load as named stand-ins and everything else still compares.
pub fn diff_saves(
    game: Option<&GameConfig>,
    left: &[u8],
    right: &[u8],
    trust: Trust,
    limit: usize,
) -> Result<SaveDiff, GameError> {
    let left = save_graph(game, left, trust)?;
    let right = save_graph(game, right, trust)?;
    let diff = left.diff(&right, limit);
    Ok(SaveDiff { left, right, diff })
}
