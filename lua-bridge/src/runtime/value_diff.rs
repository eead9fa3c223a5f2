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
//! by its name, see below), `@name` for the upvalue `name` of a function (`@upvalue[i]` when Lua has no
//! name), `@metatable`, `@uservalue[i]`, `@stack[i]` for a coroutine's stack slot, `@key` for
//! a key object itself (`world.all[table #17]@key.hp`: a field of the entity that keys the set).
//!
//! Keys that are objects: an entry's key is matched first by content (equal keys), then, among
//! the keys left, by key identity (docs/determinism.md, "Key order": format 7 saves carry them),
//! so an entity present on both sides whose fields changed is one pair, compared field by field
//! under `@key`, not one key absent and another present. Keys without identities (0) fall back
//! to content only. C functions as keys are matched by content and their names among each
//! side's permanents (`set[assert]` with `set[assert]`; the digest hashes every C function
//! alike). A key object is named by its shortest path from the globals through values
//! (`world.all[world.workers[3]]`), else by its kind and identity (`[table #17]`); either way,
//! a table with a field `id` or `name` holding a number or string shows it (`[table #17 {id=4}]`).
//! Membership lines (an entry on one side only) come after all other differences.

use crate::bridge::error::VmError;
use crate::bridge::vm::Vm;
use crate::persist::{FunctionBinding, LoadError, LoadOptions, Trust};
use crate::runtime::graph::{extract, mix, tag, Graph, Item, Kind, Part, Prim};
use crate::runtime::{Game, GameConfig, GameError};
use luasnap_snap::Snapshot;
use mlua_sys as ffi;
use std::collections::{HashMap, HashSet, VecDeque};

/// The values reachable from the globals, as a graph (see [`crate::runtime::digest`]).
pub struct ValueGraph {
    graph: Graph,
    root: Item,
    /// Whether its objects' key identities are the game's own (a live VM, a format 7 save),
    /// not ones a load of an older save gave in load order: [`ValueGraph::diff`] pairs keys
    /// by identity only between two such graphs.
    identities: bool,
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

/// The keys one table holds on one side only, counted: the grouped form of the `(absent)`
/// lines of [`ValueDiff::differences`], which lists at most the limit of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysOnOneSide {
    /// The table, by path from the globals (`(globals)` for the globals themselves).
    pub table: String,
    /// Keys only on the left.
    pub only_left: usize,
    /// Keys only on the right.
    pub only_right: usize,
}

impl std::fmt::Display for KeysOnOneSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = |n: usize| match n {
            1 => "1 key".to_string(),
            n => format!("{n} keys"),
        };
        write!(f, "{}: ", self.table)?;
        match (self.only_left, self.only_right) {
            (l, 0) => write!(f, "{} only on the left", keys(l)),
            (0, r) => write!(f, "{} only on the right", keys(r)),
            (l, r) => write!(f, "{} only on the left, {r} only on the right", keys(l)),
        }
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
    /// Per table with keys on one side only, how many, in the order the walk met the
    /// tables: every such key the walk reached, listed or not. The walk stops early only
    /// when [`ValueDiff::truncated`] is set by other differences past the limit (or its step
    /// bound); then these counts are of what it reached.
    pub keys_on_one_side: Vec<KeysOnOneSide>,
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

    /// Bytes the graph holds (what [`Vm::value_graph_within`]'s limit bounds).
    pub fn bytes(&self) -> usize {
        self.graph.bytes()
    }

    /// The differences between `self` (left) and `other` (right), at most `limit` of them.
    /// The walk visits each pair of objects once and stops (as truncated, with a note) after
    /// a number of steps proportional to the two graphs' sizes, so its memory stays within a
    /// small multiple of theirs.
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
            ra: self.root,
            rb: other.root,
            by_identity: self.identities && other.identities,
            va: std::cell::OnceCell::new(),
            vb: std::cell::OnceCell::new(),
            paths: Vec::new(),
            out: Vec::new(),
            members: Vec::new(),
            members_over: false,
            member_tables: Vec::new(),
            member_table_at: HashMap::new(),
            limit,
            truncated: false,
        };
        if !equal {
            d.walk(self.root, other.root);
            if d.out.is_empty() && d.members.is_empty() && !d.truncated {
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
        let keys_on_one_side = d
            .member_tables
            .iter()
            .map(|&(at, only_left, only_right)| KeysOnOneSide {
                table: match d.path(at) {
                    p if p.is_empty() => "(globals)".into(),
                    p => p,
                },
                only_left,
                only_right,
            })
            .collect();
        let mut differences = d.out;
        let room = limit - differences.len().min(limit);
        let truncated = d.truncated || d.members_over || d.members.len() > room;
        differences.extend(d.members.into_iter().take(room));
        ValueDiff {
            differences,
            truncated,
            equal,
            keys_on_one_side,
        }
    }
}

/// Which graph a step's item or part belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// The last step of a path: a table key, a part, or the key object of the entry at the parent.
#[derive(Clone, Copy)]
enum Step {
    Key(Side, Item),
    Part(Side, Part),
    KeyObject,
}

/// A step of a value path ([`value_paths`]): an entry's value, or a part.
#[derive(Clone, Copy)]
enum VStep {
    Key(Item),
    Part(Part),
}

/// For each node of `g`, its parent on a shortest path from `root` through values and parts
/// (never through keys), and the step from there; `None` where no such path exists.
fn value_paths(g: &Graph, root: Item) -> Vec<Option<(u32, VStep)>> {
    let mut tree: Vec<Option<(u32, VStep)>> = vec![None; g.nodes.len()];
    let Some(r) = root.as_node() else {
        return tree;
    };
    tree[r as usize] = Some((ROOT, VStep::Part(Part::Metatable)));
    let mut queue = VecDeque::from([r]);
    while let Some(n) = queue.pop_front() {
        let parts = g.parts(n).iter().map(|&(p, v)| (VStep::Part(p), v));
        let entries = g.entries(n).iter().map(|&(k, v)| (VStep::Key(k), v));
        for (step, v) in parts.chain(entries) {
            if let Some(c) = v.as_node() {
                if tree[c as usize].is_none() {
                    tree[c as usize] = Some((n, step));
                    queue.push_back(c);
                }
            }
        }
    }
    tree
}

/// A path, built only when reported: its parent (`u32::MAX`: the globals) and last step.
#[derive(Clone, Copy)]
struct PathNode {
    parent: u32,
    step: Step,
}

const ROOT: u32 = u32::MAX;

struct Differ<'a> {
    a: &'a Graph,
    b: &'a Graph,
    ha: &'a [u64],
    hb: &'a [u64],
    ra: Item,
    rb: Item,
    /// Whether keys are paired by identity (both graphs carry the game's identities).
    by_identity: bool,
    /// Shortest value paths of each side's nodes, made when a key object is first named.
    va: std::cell::OnceCell<Vec<Option<(u32, VStep)>>>,
    vb: std::cell::OnceCell<Vec<Option<(u32, VStep)>>>,
    /// The paths of the pairs queued so far.
    paths: Vec<PathNode>,
    out: Vec<Difference>,
    /// Entries on one side only, listed after `out` (at most `limit`; `members_over` past it).
    members: Vec<Difference>,
    members_over: bool,
    /// Per table with keys on one side only (its path): how many on the left, on the right;
    /// every one, past the limit too.
    member_tables: Vec<(u32, usize, usize)>,
    /// Where each table's counts are in `member_tables`.
    member_table_at: HashMap<u32, usize>,
    limit: usize,
    truncated: bool,
}

fn is_ident(b: &[u8]) -> bool {
    !b.is_empty()
        && (b[0] == b'_' || b[0].is_ascii_alphabetic())
        && b.iter().all(|&c| c == b'_' || c.is_ascii_alphanumeric())
}

/// A primitive as reports show it (strings quoted, cut at 57 bytes).
fn show_prim(g: &Graph, p: Prim) -> String {
    match p {
        Prim::Nil => "nil".into(),
        Prim::Bool(b) => b.to_string(),
        Prim::Int(i) => i.to_string(),
        Prim::Float(x) => {
            if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
                format!("{x:.1}")
            } else if x.is_finite() && x != 0.0 && (x.abs() >= 1e15 || x.abs() < 1e-4) {
                // Not 300 digits for 1e300.
                format!("{x:e}")
            } else {
                format!("{x}")
            }
        }
        Prim::Str { .. } => str_window(g.bytes_of(p), 0, 57),
        Prim::Light => "light userdata".into(),
    }
}

impl Differ<'_> {
    fn graph(&self, side: Side) -> &Graph {
        match side {
            Side::Left => self.a,
            Side::Right => self.b,
        }
    }

    fn hash(&self, side: Side, it: Item) -> u64 {
        match it.as_node() {
            None => self.graph(side).prim_hash(it).expect("a primitive"),
            Some(id) => {
                let h = if side == Side::Left { self.ha } else { self.hb };
                h[id as usize] ^ 0x5245_4600_0000_0000
            }
        }
    }

    /// What an entry's key is matched by across the sides: its hash, and a C function's name,
    /// which the hash lacks (every C function hashes alike, so `set[assert]` would pair with
    /// whichever C function key came first on the other side).
    fn key_hash(&self, side: Side, it: Item) -> u64 {
        let h = self.hash(side, it);
        let g = self.graph(side);
        match it.as_node().map(|id| g.kind(id)) {
            Some(Kind::CFunction(name)) if !name.is_empty() => {
                mix(h, tag(b"cfname", name.as_bytes()))
            }
            _ => h,
        }
    }

    fn describe(&self, side: Side, it: Item) -> String {
        let g = self.graph(side);
        match it.as_node() {
            None => show_prim(g, g.prim(it).expect("a primitive")),
            Some(id) => g.kind(id).to_string(),
        }
    }

    /// The text a step adds to its parent's path `base`.
    fn step_text(&self, base: &str, step: Step) -> String {
        match step {
            Step::Key(side, key) => {
                let g = self.graph(side);
                match g.prim(key) {
                    Some(p @ Prim::Str { .. }) if is_ident(g.bytes_of(p)) => {
                        let name = String::from_utf8_lossy(g.bytes_of(p));
                        if base.is_empty() {
                            name.into_owned()
                        } else {
                            format!("{base}.{name}")
                        }
                    }
                    _ => match key.as_node() {
                        Some(id) => format!("{base}[{}]", self.key_name(side, id)),
                        None => format!("{base}[{}]", self.describe(side, key)),
                    },
                }
            }
            Step::KeyObject => format!("{base}@key"),
            Step::Part(side, part) => match part {
                Part::Metatable => format!("{base}@metatable"),
                Part::Upvalue(i, 0) => format!("{base}@upvalue[{i}]"),
                Part::Upvalue(_, name) => format!("{base}@{}", self.graph(side).name(name)),
                Part::UserValue(i) => format!("{base}@uservalue[{i}]"),
                Part::Stack(i) => format!("{base}@stack[{i}]"),
            },
        }
    }

    /// A key object's name: its shortest value path from the globals, else its kind and
    /// identity; then a table's `id` or `name` field (a number or string), if it has one.
    fn key_name(&self, side: Side, id: u32) -> String {
        let g = self.graph(side);
        let (cell, root) = match side {
            Side::Left => (&self.va, self.ra),
            Side::Right => (&self.vb, self.rb),
        };
        let tree = cell.get_or_init(|| value_paths(g, root));
        let mut name = match tree[id as usize] {
            Some((ROOT, _)) => "(globals)".to_string(),
            Some(_) => {
                let mut steps = Vec::new();
                let mut n = id;
                while let Some((p, step)) = tree[n as usize] {
                    if p == ROOT {
                        break;
                    }
                    steps.push(step);
                    n = p;
                }
                steps
                    .into_iter()
                    .rev()
                    .fold(String::new(), |base, step| match step {
                        // Keys inside a key's name by identity only (no names within names).
                        VStep::Key(k) if k.as_node().is_some() => {
                            let k = k.as_node().expect("a node");
                            format!("{base}[{}]", self.ident_name(side, k))
                        }
                        VStep::Key(k) => self.step_text(&base, Step::Key(side, k)),
                        VStep::Part(p) => self.step_text(&base, Step::Part(side, p)),
                    })
            }
            None => self.ident_name(side, id),
        };
        if *g.kind(id) == Kind::Table {
            let field = g.entries(id).iter().find_map(|&(k, v)| {
                let key = g.bytes_of(g.prim(k)?);
                let shown = matches!(g.prim(v)?, Prim::Int(_) | Prim::Float(_) | Prim::Str { .. });
                (shown && (key == b"id" || key == b"name")).then(|| {
                    let key = String::from_utf8_lossy(key);
                    format!("{key}={}", show_prim(g, g.prim(v).expect("a primitive")))
                })
            });
            if let Some(f) = field {
                name = format!("{name} {{{f}}}");
            }
        }
        name
    }

    /// `table #17`: a node's kind and key identity (`table` alone if it has none).
    fn ident_name(&self, side: Side, id: u32) -> String {
        let g = self.graph(side);
        match g.nodes[id as usize].ident {
            0 => g.kind(id).to_string(),
            n => format!("{} #{n}", g.kind(id)),
        }
    }

    /// The path `at` as text.
    fn path(&self, at: u32) -> String {
        let mut steps = Vec::new();
        let mut p = at;
        while p != ROOT {
            steps.push(self.paths[p as usize].step);
            p = self.paths[p as usize].parent;
        }
        steps
            .into_iter()
            .rev()
            .fold(String::new(), |base, step| self.step_text(&base, step))
    }

    /// One more key of the table at `table` on one side only (the left if `left`).
    fn count_member(&mut self, table: u32, left: bool) {
        let at = *self.member_table_at.entry(table).or_insert_with(|| {
            self.member_tables.push((table, 0, 0));
            self.member_tables.len() - 1
        });
        let counts = &mut self.member_tables[at];
        if left {
            counts.1 += 1;
        } else {
            counts.2 += 1;
        }
    }

    fn push_path(&mut self, parent: u32, step: Step) -> u32 {
        self.paths.push(PathNode { parent, step });
        (self.paths.len() - 1) as u32
    }

    fn report(&mut self, path: u32, a: Option<Item>, b: Option<Item>, note: Option<String>) {
        let member = (a.is_none() || b.is_none())
            && path != ROOT
            && matches!(self.paths[path as usize].step, Step::Key(..));
        if member {
            self.count_member(self.paths[path as usize].parent, a.is_some());
        }
        if member && self.members.len() >= self.limit {
            self.members_over = true;
            return;
        }
        if !member && self.out.len() >= self.limit {
            self.truncated = true;
            return;
        }
        let path = self.path(path);
        let note = if path.starts_with("math.random@") || path.starts_with("math.randomseed@") {
            Some("math.random state".to_string())
        } else {
            note
        };
        let strings = match (
            a.and_then(|i| self.a.prim(i)),
            b.and_then(|i| self.b.prim(i)),
        ) {
            (Some(x @ Prim::Str { .. }), Some(y @ Prim::Str { .. })) => {
                Some((self.a.bytes_of(x), self.b.bytes_of(y)))
            }
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
                a.map_or("(absent)".into(), |i| self.describe(Side::Left, i)),
                b.map_or("(absent)".into(), |i| self.describe(Side::Right, i)),
                note,
            ),
        };
        let d = Difference {
            path: if path.is_empty() {
                "(globals)".into()
            } else {
                path
            },
            left,
            right,
            note,
        };
        if member {
            self.members.push(d);
        } else {
            self.out.push(d);
        }
    }

    /// Walks both graphs from their roots, breadth first, where their hashes differ.
    fn walk(&mut self, ra: Item, rb: Item) {
        // Steps past this many, the walk stops (truncated): each pair of objects is visited
        // once, so honest walks stay far below.
        let budget = 4 * (self.a.bytes() + self.b.bytes()) / 8 + 1024;
        let mut steps = 0usize;
        let mut queue: VecDeque<(u32, Item, Item)> = VecDeque::new();
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        queue.push_back((ROOT, ra, rb));
        while let Some((path, ia, ib)) = queue.pop_front() {
            if self.truncated {
                return;
            }
            steps += 1;
            if steps > budget {
                self.truncated = true;
                return;
            }
            if self.hash(Side::Left, ia) == self.hash(Side::Right, ib) {
                continue;
            }
            let (Some(na), Some(nb)) = (ia.as_node(), ib.as_node()) else {
                self.report(path, Some(ia), Some(ib), None);
                continue;
            };
            if !seen.insert((na, nb)) {
                continue;
            }
            self.compare(path, na, nb, &mut queue);
        }
    }

    /// Two objects with differing hashes at `path`: their kinds, parts and entries; pairs
    /// whose hashes differ are queued.
    fn compare(&mut self, path: u32, na: u32, nb: u32, queue: &mut VecDeque<(u32, Item, Item)>) {
        let (ia, ib) = (Item::node(na), Item::node(nb));
        let (ka, kb) = (self.a.kind(na), self.b.kind(nb));
        if ka != kb {
            self.report(path, Some(ia), Some(ib), None);
            return;
        }
        if self.a.nodes[na as usize].kind_hash != self.b.nodes[nb as usize].kind_hash {
            let what = match ka {
                Kind::UserData(_) => "contents differ",
                Kind::Thread(_) => "status differs",
                _ => "identity differs",
            };
            self.report(path, Some(ia), Some(ib), Some(what.into()));
        }
        // Ordered parts, position by position.
        let (pa, pb) = (self.a.parts(na), self.b.parts(nb));
        for i in 0..pa.len().max(pb.len()) {
            let step = match (pa.get(i), pb.get(i)) {
                (Some((p, _)), _) => Step::Part(Side::Left, *p),
                (None, Some((p, _))) => Step::Part(Side::Right, *p),
                (None, None) => unreachable!("i < len"),
            };
            match (pa.get(i), pb.get(i)) {
                (Some((_, x)), Some((_, y))) => {
                    if self.hash(Side::Left, *x) != self.hash(Side::Right, *y) {
                        let sub = self.push_path(path, step);
                        queue.push_back((sub, *x, *y));
                    }
                }
                (x, y) => {
                    let sub = self.push_path(path, step);
                    self.report(sub, x.map(|p| p.1), y.map(|p| p.1), None);
                }
            }
        }
        self.entries(path, na, nb, queue);
    }

    /// The entries of two tables, matched by the content of their keys.
    fn entries(&mut self, path: u32, na: u32, nb: u32, queue: &mut VecDeque<(u32, Item, Item)>) {
        let mut right: HashMap<u64, Vec<(Item, Item)>> = HashMap::new();
        for &(k, v) in self.b.entries(nb) {
            right
                .entry(self.key_hash(Side::Right, k))
                .or_default()
                .push((k, v));
        }
        let mut left_only = Vec::new();
        let mut matched = Vec::new();
        for &(k, v) in self.a.entries(na) {
            match right
                .get_mut(&self.key_hash(Side::Left, k))
                .and_then(|l| l.pop())
            {
                Some((_, w)) => {
                    if self.hash(Side::Left, v) != self.hash(Side::Right, w) {
                        matched.push((k, v, w));
                    }
                }
                None => left_only.push((k, v)),
            }
        }
        let mut right_only: Vec<(Item, Item)> = right.into_values().flatten().collect();
        self.pair_by_identity(path, &mut left_only, &mut right_only, &mut matched, queue);
        // In key order (numbers by value, so `[2]` comes before `[10]`, then strings, see
        // `key_order`; objects by identity), so that of two equally short paths to a value
        // the first in key order names it, the same way every time.
        matched.sort_by(|x, y| {
            key_order(self.a, x.0, self.a, y.0)
                .then_with(|| {
                    self.ident(Side::Left, x.0)
                        .cmp(&self.ident(Side::Left, y.0))
                })
                .then_with(|| {
                    self.step_text("", Step::Key(Side::Left, x.0))
                        .cmp(&self.step_text("", Step::Key(Side::Left, y.0)))
                })
        });
        for (k, v, w) in matched {
            let sub = self.push_path(path, Step::Key(Side::Left, k));
            queue.push_back((sub, v, w));
        }
        left_only.sort_by(|x, y| {
            key_order(self.a, x.0, self.a, y.0)
                .then_with(|| {
                    self.ident(Side::Left, x.0)
                        .cmp(&self.ident(Side::Left, y.0))
                })
                .then_with(|| {
                    self.describe(Side::Left, x.0)
                        .cmp(&self.describe(Side::Left, y.0))
                })
        });
        for (k, v) in left_only {
            let sub = self.push_path(path, Step::Key(Side::Left, k));
            self.report(sub, Some(v), None, None);
        }
        right_only.sort_by(|x, y| {
            key_order(self.b, x.0, self.b, y.0)
                .then_with(|| {
                    self.ident(Side::Right, x.0)
                        .cmp(&self.ident(Side::Right, y.0))
                })
                .then_with(|| {
                    self.describe(Side::Right, x.0)
                        .cmp(&self.describe(Side::Right, y.0))
                })
        });
        for (k, w) in right_only {
            let sub = self.push_path(path, Step::Key(Side::Right, k));
            self.report(sub, None, Some(w), None);
        }
    }

    /// A key's identity (0: a primitive, or an object that has none).
    fn ident(&self, side: Side, k: Item) -> u32 {
        k.as_node()
            .map_or(0, |n| self.graph(side).nodes[n as usize].ident)
    }

    /// Pairs the object keys left unmatched by content on both sides by their identities
    /// (same kind, nonzero identity): the entity keyed on both sides, with other contents.
    /// Its key objects are queued under `@key`; its values join `matched` if they differ.
    fn pair_by_identity(
        &mut self,
        path: u32,
        left_only: &mut Vec<(Item, Item)>,
        right_only: &mut Vec<(Item, Item)>,
        matched: &mut Vec<(Item, Item, Item)>,
        queue: &mut VecDeque<(u32, Item, Item)>,
    ) {
        let mut by_ident: HashMap<u32, usize> = HashMap::new();
        for (i, &(k, _)) in right_only.iter().enumerate() {
            let id = self.ident(Side::Right, k);
            if id != 0 {
                by_ident.insert(id, i);
            }
        }
        if by_ident.is_empty() || !self.by_identity {
            return;
        }
        let mut taken = vec![false; right_only.len()];
        let mut keys = Vec::new();
        left_only.retain(|&(k, v)| {
            let id = self.ident(Side::Left, k);
            let Some(&i) = by_ident.get(&id).filter(|_| id != 0) else {
                return true;
            };
            let (k2, w) = right_only[i];
            let same_kind = match (k.as_node(), k2.as_node()) {
                (Some(x), Some(y)) => self.a.kind(x) == self.b.kind(y),
                _ => false,
            };
            if taken[i] || !same_kind {
                return true;
            }
            taken[i] = true;
            if self.hash(Side::Left, v) != self.hash(Side::Right, w) {
                matched.push((k, v, w));
            }
            keys.push((k, k2));
            false
        });
        let mut i = 0;
        right_only.retain(|_| {
            i += 1;
            !taken[i - 1]
        });
        keys.sort_by_key(|&(k, _)| self.ident(Side::Left, k));
        for (k, k2) in keys {
            let entry = self.push_path(path, Step::Key(Side::Left, k));
            let sub = self.push_path(entry, Step::KeyObject);
            queue.push_back((sub, k, k2));
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
    fn class(p: Option<Prim>) -> u8 {
        match p {
            Some(Prim::Int(_) | Prim::Float(_)) => 0,
            Some(Prim::Str { .. }) => 1,
            Some(Prim::Bool(_)) => 2,
            _ => 3,
        }
    }
    let (pa, pb) = (ga.prim(a), gb.prim(b));
    class(pa).cmp(&class(pb)).then_with(|| match (pa, pb) {
        (Some(Prim::Int(x)), Some(Prim::Int(y))) => x.cmp(&y),
        (Some(Prim::Float(x)), Some(Prim::Float(y))) => x.total_cmp(&y),
        // An integer and a float: by value, exactly (an i64 may not fit an f64).
        (Some(Prim::Int(x)), Some(Prim::Float(y))) => int_float(x, y),
        (Some(Prim::Float(x)), Some(Prim::Int(y))) => int_float(y, x).reverse(),
        (Some(x @ Prim::Str { .. }), Some(y @ Prim::Str { .. })) => {
            ga.bytes_of(x).cmp(gb.bytes_of(y))
        }
        (Some(Prim::Bool(x)), Some(Prim::Bool(y))) => x.cmp(&y),
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

// Here, not in runtime/mod.rs, so that the game's module does not import this one (which
// imports it: layers test).
impl Game {
    /// The values reachable from the globals, for a path-by-path diff with another state.
    pub fn value_graph(&mut self) -> Result<ValueGraph, GameError> {
        let graph = self.vm.value_graph();
        graph.map_err(|e| self.memory_failure(e.into()))
    }
}

impl Vm {
    /// The graph of values reachable from the globals (what [`Vm::value_digest`] hashes), for
    /// [`ValueGraph::diff`]. Like the digest, it captures the VM and restores it after: the
    /// arena is byte-identical afterwards.
    pub fn value_graph(&mut self) -> Result<ValueGraph, VmError> {
        self.value_graph_within(usize::MAX)
    }

    /// [`value_graph`](Vm::value_graph), failing with [`VmError::ValueGraphTooLarge`] once the
    /// graph would hold more than `max_bytes` ([`ValueGraph::bytes`]: about 50 bytes per
    /// object, 8 per table entry, 16 per upvalue or other part, plus the primitives and each
    /// distinct string's bytes).
    pub fn value_graph_within(&mut self, max_bytes: usize) -> Result<ValueGraph, VmError> {
        self.check_idle("extract the value graph")?;
        let saved = Snapshot::capture(&self.arena);
        let graph = self.extract_graph(max_bytes);
        saved.restore(&mut self.arena)?;
        graph
    }

    /// [`value_graph_within`](Vm::value_graph_within) for a VM that is not needed afterwards
    /// (`luasnap diff`'s): no copy of the heap is taken to restore it.
    pub fn into_value_graph(mut self, max_bytes: usize) -> Result<ValueGraph, VmError> {
        self.check_idle("extract the value graph")?;
        self.extract_graph(max_bytes)
    }

    fn extract_graph(&mut self, max_bytes: usize) -> Result<ValueGraph, VmError> {
        let mut graph = Graph::with_limit(max_bytes).naming_cfunctions();
        let mut root = None;
        self.run(
            &mut |L| {
                // SAFETY: protected body; the caller restores or drops the state.
                unsafe {
                    ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
                    root = Some(extract(L, &mut graph));
                }
                0
            },
            |_, _| (),
        )?;
        Ok(ValueGraph {
            graph,
            root: root.expect("extract ran")?,
            identities: true,
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
/// error of a failed load is the most telling attempt's. The permanents `game` declares in
/// [`GameConfig::permanents`] are accepted (its script's `G.permanents` is not read: the game
/// is not run). Within [`DEFAULT_MAX_MEMORY`]: see [`save_graph_within`].
pub fn save_graph(
    game: Option<&GameConfig>,
    save: &[u8],
    trust: Trust,
) -> Result<ValueGraph, GameError> {
    save_graph_within(game, save, trust, DEFAULT_MAX_MEMORY)
}

/// The memory [`save_graph`] and [`diff_saves`] may use per save, in bytes (`luasnap diff
/// --max-memory`'s default).
pub const DEFAULT_MAX_MEMORY: usize = 512 << 20;

/// [`save_graph`] within `max_memory` bytes: the load may grow the reading VM's heap by half
/// of it ([`LoadOptions::max_heap_growth`]), the graph hold a quarter
/// ([`Vm::into_value_graph`]), and the VM is dropped before the graph is returned. Past
/// either it fails with an error that [`needs_more_memory`] recognizes (no other VM is tried:
/// it would need as much).
pub fn save_graph_within(
    game: Option<&GameConfig>,
    save: &[u8],
    trust: Trust,
    max_memory: usize,
) -> Result<ValueGraph, GameError> {
    save_graph_allowing(game, save, trust, max_memory, &[])
}

/// [`save_graph_within`] that also accepts the permanents named in `allowed` (added to
/// `game`'s [`GameConfig::permanents`], as [`LoadOptions::allowed_permanents`]), with or
/// without a game: `luasnap diff --allow-permanent NAME`.
pub fn save_graph_allowing(
    game: Option<&GameConfig>,
    save: &[u8],
    trust: Trust,
    max_memory: usize,
    allowed: &[String],
) -> Result<ValueGraph, GameError> {
    let mut permanents = allowed.to_vec();
    if let Some(game) = game {
        permanents.extend(game.permanents.iter().cloned());
    }
    let read = |mut vm: Vm| -> Result<ValueGraph, GameError> {
        let mut opts = LoadOptions::new(trust);
        opts.allowed_permanents = permanents.clone();
        opts.finalizers = false;
        opts.inert_finalizers = true;
        opts.stand_ins = true;
        opts.max_heap_growth = Some(max_memory / 2);
        opts.chunk_sources = game.and_then(Game::folder_chunks);
        if game.is_some() {
            // As a game's own loads do: a save of an older version compares with its
            // functions bound to this version's at their places (`docs/updates.md`), not
            // refused for code that changed.
            opts.functions = FunctionBinding::Current;
        }
        vm.load_game_with(save, &opts)?;
        // The VM only lives to be read: no copy of its heap to restore it.
        let mut g = vm.into_value_graph(max_memory / 4)?;
        // Saves before format 7 carry no identities: the load gave them in load order.
        g.identities = save.get(8..10).map(|f| u16::from_le_bytes([f[0], f[1]])) >= Some(7);
        Ok(g)
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
    match read(plain) {
        Ok(g) => return Ok(g),
        Err(e) if needs_more_memory(&e) => return Err(e),
        Err(_) => {}
    }
    // Saves written by the runtime hold its glue functions too: a runtime VM with an empty
    // game names the game's own functions in its error, the thing the user can act on.
    let empty = "return { init = function() end, step = function() end }";
    let runtime_error = match read(reader(empty, "=[empty game]")?) {
        Ok(g) => return Ok(g),
        Err(e) if needs_more_memory(&e) => return Err(e),
        Err(e) => e,
    };
    let d = GameConfig::default_game(1, 0);
    read(reader(&d.script, &d.chunk_name)?).map_err(|_| runtime_error)
}

/// Whether [`save_graph_within`] failed for want of memory: the load's heap-growth cap
/// ([`LoadError::NeedsMoreMemory`]), Lua's memory error, or the graph's limit
/// ([`VmError::ValueGraphTooLarge`]). Raising the memory is what to do.
pub fn needs_more_memory(e: &GameError) -> bool {
    match e {
        GameError::Vm(VmError::ValueGraphTooLarge { .. })
        | GameError::Load(LoadError::NeedsMoreMemory { .. }) => true,
        GameError::Vm(v) | GameError::Load(LoadError::Lua(v)) => v.is_out_of_memory(),
        _ => false,
    }
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
