//! The value digest: a canonical hash of the Lua values reachable from a root, and the graph
//! it is computed from (which [`crate::runtime::value_diff`] compares path by path).
//!
//! Unlike the arena digest it depends neither on addresses nor on `pairs()` order, so it is
//! equal for equal game states across processes, machines and save/load round trips.
//!
//! # What it covers
//! Everything reachable from the root (the globals table) through strong references:
//! - tables: entries and metatable;
//! - Lua functions: `source:linedefined:lastlinedefined`, then their upvalues in order;
//!   C functions: their upvalues (so `math.random`'s generator state is covered);
//! - full userdata: bytes, metatable, user values; coroutines: status and live stack values
//!   (the main thread's stack, which holds the traversal itself, is left out);
//! - primitives by value: integers and floats kept apart, strings by bytes; light userdata
//!   only as "a light userdata" (its address is not a value).
//!
//! **Weak tables** (`__mode` in the metatable, read raw): an entry counts only if its
//! presence does not depend on the collector, that is, if each weak part of it (the key for
//! `"k"`, the value for `"v"`, both for `"kv"`) is either not removable by the collector
//! (strings, numbers, booleans, light values) or strongly reachable from the root. An entry
//! whose weak part is reachable only through weak references (a cache entry nothing else
//! holds, a pooled object waiting for the collector) may be present or not depending on when
//! the collector ran, so it is left out. Weak-key tables are ephemerons: an included entry
//! makes its value reachable, which can include further entries; extraction repeats until
//! nothing more is included, as Lua's own collector does. Objects reachable only from the
//! registry are not roots.
//!
//! # How
//! 1. Extract the graph described above.
//! 2. Refine hashes over it Weisfeiler-Lehman style: each round, a node's hash becomes a hash
//!    of its kind, its ordered parts and the *order-independent* combination (wrapping sum of
//!    mixed pairs) of its table entries, using the previous round's hashes for references.
//!    The digest uses 8 rounds (`ROUNDS`); [`crate::runtime::value_diff`] refines until the partition into
//!    equal hashes stops growing (at most 64, `MAX_ROUNDS`), so that equal hashes mean equal
//!    subgraphs as far as it needs to prune.
//! 3. The digest combines the root's hash with the order-independent sum of *every* node's
//!    hash: a value that differs changes its own object's hash, so it changes the digest
//!    however deep it lies.
//!
//! Traversing through the Lua API writes to the heap (stack slots, a work list, collector
//! state), so the VM is captured before and restored after: the arena is byte-identical
//! afterwards.

use crate::bridge::error::VmError;
use crate::bridge::ffi::{self as raw};
use crate::bridge::vm::Vm;
use luasnap_snap::Snapshot;
use mlua_sys::{self as ffi, lua_State};
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr, CString};
use xxhash_rust::xxh3::Xxh3;

/// The value digest of a VM. (The bridge's `Vm` knows nothing of this module: the runtime
/// layer adds these methods.)
impl Vm {
    /// A canonical hash of the values reachable from the globals table: independent of
    /// addresses and `pairs()` order, so equal for equal states across processes and across a
    /// save and load. See [the module](self) for exactly what it covers.
    ///
    /// It walks the heap through the Lua API, which writes to it, so the VM is captured first
    /// and restored after: the arena is byte-identical afterwards. Cost: two copies of the
    /// heap plus a walk of every reachable object.
    pub fn value_digest(&mut self) -> Result<u64, VmError> {
        self.value_digest_at(None)
    }

    /// Like [`value_digest`](Vm::value_digest), for the value at a dotted global path.
    pub fn value_digest_of(&mut self, path: &str) -> Result<u64, VmError> {
        let p = self.checked_path(path)?;
        self.value_digest_at(Some(p))
    }

    fn value_digest_at(&mut self, path: Option<CString>) -> Result<u64, VmError> {
        self.check_idle("compute a value digest")?;
        let saved = Snapshot::capture(&self.arena);
        let mut graph = Graph::default();
        let mut root = None;
        let result = self.run(
            &mut |L| {
                // SAFETY: protected body; the state is restored below whatever happens.
                unsafe {
                    match &path {
                        Some(p) => raw::push_path(L, p),
                        None => {
                            ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
                        }
                    }
                    root = Some(extract(L, &mut graph));
                }
                0
            },
            |_, _| (),
        );
        saved.restore(&mut self.arena)?;
        result?;
        Ok(graph.digest(root.expect("extract ran")))
    }
}

/// Refinement rounds at least.
pub(crate) const ROUNDS: usize = 8;
/// Refinement rounds at most (a long linked list would otherwise need one per element).
pub(crate) const MAX_ROUNDS: usize = 64;

/// A primitive value, kept for reports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Prim {
    /// `nil` (also: no metatable).
    Nil,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string's bytes.
    Str(Box<[u8]>),
    /// A light userdata (its address is not compared).
    Light,
}

impl std::fmt::Display for Prim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prim::Nil => write!(f, "nil"),
            Prim::Bool(b) => write!(f, "{b}"),
            Prim::Int(i) => write!(f, "{i}"),
            Prim::Float(x) => {
                if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
                    write!(f, "{x:.1}")
                } else if x.is_finite() && *x != 0.0 && (x.abs() >= 1e15 || x.abs() < 1e-4) {
                    // Not 300 digits for 1e300.
                    write!(f, "{x:e}")
                } else {
                    write!(f, "{x}")
                }
            }
            Prim::Str(b) => {
                let s = String::from_utf8_lossy(b);
                if s.chars().count() > 60 {
                    let cut: String = s.chars().take(57).collect();
                    write!(f, "{:?}... ({} bytes)", cut, b.len())
                } else {
                    write!(f, "{s:?}")
                }
            }
            Prim::Light => write!(f, "light userdata"),
        }
    }
}

/// A value in the graph: a primitive (its hash and its index in [`Graph::prims`]) or a node.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Item {
    /// A primitive.
    Prim {
        /// Its hash.
        hash: u64,
        /// Index in [`Graph::prims`].
        at: u32,
    },
    /// A node (table, function, userdata, thread).
    Ref(u32),
}

/// What an ordered part of a node is, for paths.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Part {
    /// The metatable (nil if none).
    Metatable,
    /// An upvalue, with its name if Lua knows it.
    Upvalue(u32, String),
    /// A userdata's user value.
    UserValue(u32),
    /// A coroutine's stack slot.
    Stack(u32),
}

/// The kind of a node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    /// A table.
    Table,
    /// A Lua function (`source:linedefined`).
    LuaFunction(String),
    /// A C function.
    CFunction,
    /// A full userdata of this many bytes.
    UserData(usize),
    /// A coroutine with this status code.
    Thread(i32),
    /// Something else (type name).
    Other(String),
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Table => write!(f, "table"),
            Kind::LuaFunction(at) => write!(f, "function {at}"),
            Kind::CFunction => write!(f, "C function"),
            Kind::UserData(n) => write!(f, "userdata ({n} bytes)"),
            Kind::Thread(s) => write!(f, "coroutine (status {s})"),
            Kind::Other(t) => write!(f, "{t}"),
        }
    }
}

/// One object of the graph.
#[derive(Default, Debug)]
pub(crate) struct Node {
    /// Hash of the kind and own bytes (userdata contents, function identity).
    pub(crate) kind_hash: u64,
    /// The kind (None until visited).
    pub(crate) kind: Option<Kind>,
    /// Table entries (order-independent).
    pub(crate) entries: Vec<(Item, Item)>,
    /// Ordered parts: metatable, upvalues, user values, stack slots.
    pub(crate) parts: Vec<(Part, Item)>,
}

/// The graph extracted from the heap.
#[derive(Default)]
pub(crate) struct Graph {
    ids: HashMap<*const c_void, u32>,
    /// Strings already in `prims`, by the address of their bytes (one entry per Lua string).
    strs: HashMap<*const u8, Item>,
    /// The nodes; node 0 is the root if the root is an object.
    pub(crate) nodes: Vec<Node>,
    /// Primitive values referred to by [`Item::Prim`].
    pub(crate) prims: Vec<Prim>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("nodes", &self.nodes.len())
            .field("prims", &self.prims.len())
            .finish()
    }
}

fn tag(t: &[u8], bytes: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(t);
    h.update(bytes);
    h.digest()
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Graph {
    /// The primitive an item refers to, if it is one.
    pub(crate) fn prim(&self, it: Item) -> Option<&Prim> {
        match it {
            Item::Prim { at, .. } => Some(&self.prims[at as usize]),
            Item::Ref(_) => None,
        }
    }

    fn add_prim(&mut self, t: &[u8], bytes: &[u8], p: Prim) -> Item {
        let at = self.prims.len() as u32;
        self.prims.push(p);
        Item::Prim {
            hash: tag(t, bytes),
            at,
        }
    }

    /// Each node's hash after `rounds` refinement rounds.
    pub(crate) fn refine(&self, rounds: usize) -> Vec<u64> {
        let mut h: Vec<u64> = self.nodes.iter().map(|n| n.kind_hash).collect();
        for _ in 0..rounds {
            h = self.round(&h);
        }
        h
    }

    fn round(&self, h: &[u64]) -> Vec<u64> {
        let val = |it: Item| match it {
            Item::Prim { hash, .. } => hash,
            Item::Ref(id) => mix(h[id as usize], 0x0052_4546),
        };
        self.nodes
            .iter()
            .map(|n| {
                let mut sum = 0u64;
                for &(k, v) in &n.entries {
                    sum = sum.wrapping_add(mix(val(k), val(v)));
                }
                let mut acc = mix(n.kind_hash, sum);
                for (_, p) in &n.parts {
                    acc = mix(acc, val(*p));
                }
                mix(acc, n.entries.len() as u64)
            })
            .collect()
    }

    /// The rounds after which the partition of nodes into equal hashes stops growing (within
    /// [`ROUNDS`]..=[`MAX_ROUNDS`]), and the hashes after that many rounds.
    pub(crate) fn refine_until_stable(&self) -> (usize, Vec<u64>) {
        let distinct = |h: &[u64]| {
            let mut v = h.to_vec();
            v.sort_unstable();
            v.dedup();
            v.len()
        };
        let mut h: Vec<u64> = self.nodes.iter().map(|n| n.kind_hash).collect();
        let mut classes = distinct(&h);
        for r in 1..=MAX_ROUNDS {
            h = self.round(&h);
            let now = distinct(&h);
            if now == classes && r >= ROUNDS {
                return (r, h);
            }
            classes = now;
        }
        (MAX_ROUNDS, h)
    }

    fn combine(h: &[u64], root: usize) -> u64 {
        let all = h
            .iter()
            .fold(0u64, |acc, &x| acc.wrapping_add(mix(x, 0x0041_4c4c)));
        mix(h[root], all)
    }

    /// The digest of the graph rooted at `root`: the root's hash combined with the
    /// order-independent sum of every node's hash, after `rounds` rounds.
    pub(crate) fn digest_with(&self, root: Item, rounds: usize) -> u64 {
        let root = match root {
            Item::Prim { hash, .. } => return hash,
            Item::Ref(id) => id as usize,
        };
        Self::combine(&self.refine(rounds), root)
    }

    /// The digest of the graph rooted at `root` (see the module documentation).
    pub(crate) fn digest(&self, root: Item) -> u64 {
        self.digest_with(root, ROUNDS)
    }

    fn id(&mut self, p: *const c_void) -> (u32, bool) {
        let next = self.nodes.len() as u32;
        match self.ids.get(&p) {
            Some(&id) => (id, false),
            None => {
                self.ids.insert(p, next);
                self.nodes.push(Node::default());
                (next, true)
            }
        }
    }
}

/// Extraction state: the graph, the Lua work list and the weak tables seen.
struct Walk<'g> {
    g: &'g mut Graph,
    /// Absolute stack index of the work list (a Lua table of objects, 1..=tail).
    pending: c_int,
    tail: i64,
    /// Weak tables: (node id, position in the work list, weak keys, weak values, entries
    /// decided so far by iteration position).
    weak: Vec<(u32, i64, bool, bool, Vec<bool>)>,
}

impl Walk<'_> {
    /// Classifies the value on top of the stack: a primitive, or a node id (enqueued in the
    /// work list if new). Pops the value.
    ///
    /// # Safety
    /// Protected context (may raise), a value on top.
    unsafe fn classify(&mut self, L: *mut lua_State) -> Item {
        // SAFETY: valid state with the value on top (callers' contract).
        unsafe {
            let t = ffi::lua_type(L, -1);
            let item = match t {
                ffi::LUA_TNIL => self.g.add_prim(b"nil", &[], Prim::Nil),
                ffi::LUA_TBOOLEAN => {
                    let b = ffi::lua_toboolean(L, -1) != 0;
                    self.g.add_prim(b"bool", &[b as u8], Prim::Bool(b))
                }
                ffi::LUA_TNUMBER => {
                    if ffi::lua_isinteger(L, -1) != 0 {
                        let i = ffi::lua_tointegerx(L, -1, std::ptr::null_mut());
                        self.g.add_prim(b"int", &i.to_le_bytes(), Prim::Int(i))
                    } else {
                        let f = ffi::lua_tonumberx(L, -1, std::ptr::null_mut());
                        self.g
                            .add_prim(b"flt", &f.to_bits().to_le_bytes(), Prim::Float(f))
                    }
                }
                ffi::LUA_TSTRING => {
                    let mut len = 0;
                    let p = ffi::lua_tolstring(L, -1, &mut len).cast::<u8>();
                    // A Lua string's bytes do not move while it lives, and nothing is
                    // collected during the walk (the collector is stopped).
                    match self.g.strs.get(&p) {
                        Some(&item) => item,
                        None => {
                            let b = std::slice::from_raw_parts(p, len);
                            let item = self.g.add_prim(b"str", b, Prim::Str(b.into()));
                            self.g.strs.insert(p, item);
                            item
                        }
                    }
                }
                ffi::LUA_TLIGHTUSERDATA => self.g.add_prim(b"light", &[], Prim::Light),
                _ => {
                    let (id, new) = self.g.id(ffi::lua_topointer(L, -1));
                    if new {
                        self.tail += 1;
                        ffi::lua_pushvalue(L, -1);
                        ffi::lua_rawseti(L, self.pending, self.tail);
                    }
                    Item::Ref(id)
                }
            };
            ffi::lua_settop(L, -2);
            item
        }
    }

    /// Visits the work list from `head` to its end (which grows while visiting).
    unsafe fn drain(&mut self, L: *mut lua_State, head: &mut i64) {
        // SAFETY: protected context; every object in the work list is anchored by it.
        unsafe {
            while *head <= self.tail {
                ffi::lua_rawgeti(L, self.pending, *head);
                let id = self.g.ids[&ffi::lua_topointer(L, -1)];
                let position = *head;
                *head += 1;
                let node = self.visit(L, id, position);
                self.g.nodes[id as usize] = node;
                ffi::lua_settop(L, self.pending);
            }
        }
    }

    /// Whether the value at absolute index `idx` may be kept as a weak part: not removable by
    /// the collector, or strongly reached already.
    unsafe fn weak_part_kept(&self, L: *mut lua_State, idx: c_int) -> bool {
        // SAFETY: valid absolute index (caller's contract); reads only.
        unsafe {
            !crate::bridge::canonical::is_weak_removable(L, idx)
                || self.g.ids.contains_key(&ffi::lua_topointer(L, idx))
        }
    }

    /// One pass over the weak tables: includes the entries whose weak parts are kept now.
    /// Returns whether any entry was included.
    unsafe fn weak_pass(&mut self, L: *mut lua_State) -> bool {
        let mut any = false;
        // SAFETY: protected context; each weak table is anchored in the work list.
        unsafe {
            for w in 0..self.weak.len() {
                let (id, position, wk, wv) = {
                    let e = &self.weak[w];
                    (e.0, e.1, e.2, e.3)
                };
                ffi::lua_rawgeti(L, self.pending, position);
                let at = ffi::lua_gettop(L);
                let mut i = 0usize;
                ffi::lua_pushnil(L);
                while ffi::lua_next(L, at) != 0 {
                    if self.weak[w].4.len() <= i {
                        self.weak[w].4.push(false);
                    }
                    let (k, v) = (ffi::lua_gettop(L) - 1, ffi::lua_gettop(L));
                    if !self.weak[w].4[i]
                        && (!wk || self.weak_part_kept(L, k))
                        && (!wv || self.weak_part_kept(L, v))
                    {
                        self.weak[w].4[i] = true;
                        any = true;
                        ffi::lua_pushvalue(L, k);
                        let ki = self.classify(L);
                        ffi::lua_pushvalue(L, v);
                        let vi = self.classify(L);
                        self.g.nodes[id as usize].entries.push((ki, vi));
                    }
                    ffi::lua_settop(L, k);
                    i += 1;
                }
                ffi::lua_settop(L, at - 1);
            }
        }
        any
    }

    /// Reads the node on top of the stack (left there).
    ///
    /// # Safety
    /// Protected context (may raise); the node on top, anchored in the work list.
    unsafe fn visit(&mut self, L: *mut lua_State, id: u32, position: i64) -> Node {
        // SAFETY: callers' contract: a valid state with the node on top.
        let (at, t) = unsafe { (ffi::lua_gettop(L), ffi::lua_type(L, -1)) };
        let mut n = Node::default();
        match t {
            // SAFETY: callers' contract; a table at `at`.
            ffi::LUA_TTABLE => unsafe { self.visit_table(L, at, id, position, &mut n) },
            // SAFETY: callers' contract; a function at `at`.
            ffi::LUA_TFUNCTION => unsafe { self.visit_function(L, at, &mut n) },
            // SAFETY: callers' contract; a full userdata at `at`.
            ffi::LUA_TUSERDATA => unsafe { self.visit_userdata(L, at, &mut n) },
            // SAFETY: callers' contract; a thread at `at`.
            ffi::LUA_TTHREAD => unsafe { self.visit_thread(L, at, &mut n) },
            _ => {
                // SAFETY: `at` is a valid index (callers' contract).
                let t = unsafe { raw::type_name(L, at) };
                n.kind_hash = tag(b"other", t.as_bytes());
                n.kind = Some(Kind::Other(t));
            }
        }
        n
    }

    /// Adds the metatable of the object at `at` (nil if it has none) to `parts`, and returns
    /// the metatable's `__mode` string (empty if none).
    ///
    /// # Safety
    /// Protected context (may raise); `at` a valid absolute index; two free stack slots.
    unsafe fn metatable(
        &mut self,
        L: *mut lua_State,
        at: c_int,
        parts: &mut Vec<(Part, Item)>,
    ) -> Vec<u8> {
        // SAFETY: callers' contract; pushes the metatable if there is one.
        if unsafe { ffi::lua_getmetatable(L, at) } == 0 {
            parts.push((Part::Metatable, self.g.add_prim(b"nil", &[], Prim::Nil)));
            return Vec::new();
        }
        // SAFETY: the metatable on top and a free slot (callers' contract): a raw read of its
        // `__mode`, copied out before the value is popped (the metatable stays).
        let mode = unsafe {
            ffi::lua_pushstring(L, c"__mode".as_ptr());
            ffi::lua_rawget(L, -2);
            let m = if ffi::lua_type(L, -1) == ffi::LUA_TSTRING {
                CStr::from_ptr(ffi::lua_tolstring(L, -1, std::ptr::null_mut()))
                    .to_bytes()
                    .to_vec()
            } else {
                Vec::new()
            };
            ffi::lua_settop(L, -2);
            m
        };
        // SAFETY: callers' contract; the metatable on top (popped).
        parts.push((Part::Metatable, unsafe { self.classify(L) }));
        mode
    }

    /// A table's node: its metatable, then its entries (a weak table's entries are decided
    /// later, once the strong graph is known: see `extract`).
    ///
    /// # Safety
    /// As [`Walk::visit`], with a table at `at`, the work list's entry `position`.
    unsafe fn visit_table(
        &mut self,
        L: *mut lua_State,
        at: c_int,
        id: u32,
        position: i64,
        n: &mut Node,
    ) {
        n.kind_hash = tag(b"table", &[]);
        n.kind = Some(Kind::Table);
        // SAFETY: callers' contract.
        let mode = unsafe { self.metatable(L, at, &mut n.parts) };
        let (wk, wv) = (mode.contains(&b'k'), mode.contains(&b'v'));
        if wk || wv {
            self.weak.push((id, position, wk, wv, Vec::new()));
            return;
        }
        // SAFETY: callers' contract, a table at `at`: each step of lua_next leaves a key and a
        // value; the key's copy and the value are popped by classify, the key stays for the
        // next step.
        unsafe {
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, at) != 0 {
                ffi::lua_pushvalue(L, -2);
                let k = self.classify(L);
                let v = self.classify(L);
                n.entries.push((k, v));
            }
        }
    }

    /// A function's node: C or Lua (by its source and lines), then its upvalues.
    ///
    /// # Safety
    /// As [`Walk::visit`], with a function at `at`.
    unsafe fn visit_function(&mut self, L: *mut lua_State, at: c_int, n: &mut Node) {
        // SAFETY: callers' contract: a function at `at`.
        if unsafe { ffi::lua_iscfunction(L, at) } != 0 {
            n.kind_hash = tag(b"cfunction", &[]);
            n.kind = Some(Kind::CFunction);
        } else {
            // SAFETY: callers' contract: a Lua function at `at`.
            unsafe { lua_function_kind(L, at, n) };
        }
        let mut i = 1;
        loop {
            // SAFETY: callers' contract: a function at `at`; pushes upvalue i if it has one.
            let name = unsafe { ffi::lua_getupvalue(L, at, i) };
            if name.is_null() {
                break;
            }
            // SAFETY: a non-null upvalue name is a NUL-terminated string owned by the function
            // (or its prototype), which lives at `at`.
            let name = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: callers' contract; the upvalue on top (popped).
            let item = unsafe { self.classify(L) };
            n.parts.push((Part::Upvalue(i as u32, name), item));
            i += 1;
        }
    }

    /// A full userdata's node: its bytes, its metatable, then its user values.
    ///
    /// # Safety
    /// As [`Walk::visit`], with a full userdata at `at`.
    unsafe fn visit_userdata(&mut self, L: *mut lua_State, at: c_int, n: &mut Node) {
        // SAFETY: callers' contract: a full userdata at `at`, whose block of lua_rawlen bytes
        // at lua_touserdata (never null for a full userdata) lives and stays put while it is
        // on the stack; nothing writes it during the walk.
        let bytes = unsafe {
            let len = ffi::lua_rawlen(L, at) as usize;
            std::slice::from_raw_parts(ffi::lua_touserdata(L, at).cast::<u8>(), len)
        };
        n.kind_hash = tag(b"userdata", bytes);
        n.kind = Some(Kind::UserData(bytes.len()));
        // SAFETY: callers' contract.
        unsafe { self.metatable(L, at, &mut n.parts) };
        let mut i = 1;
        // SAFETY: callers' contract; pushes user value i (nil, and LUA_TNONE, past the last).
        while unsafe { ffi::lua_getiuservalue(L, at, i) } != ffi::LUA_TNONE {
            // SAFETY: callers' contract; user value i on top (popped).
            let item = unsafe { self.classify(L) };
            n.parts.push((Part::UserValue(i as u32), item));
            i += 1;
        }
        // SAFETY: pops the nil pushed past the last user value.
        unsafe { ffi::lua_settop(L, -2) };
    }

    /// A coroutine's node: its status, then its live stack values.
    ///
    /// # Safety
    /// As [`Walk::visit`], with a thread at `at`.
    unsafe fn visit_thread(&mut self, L: *mut lua_State, at: c_int, n: &mut Node) {
        // SAFETY: callers' contract: a thread at `at`, kept alive there; reads its status and
        // its top.
        let (status, top, co) = unsafe {
            let co = ffi::lua_tothread(L, at);
            // The main thread's stack holds this traversal itself: leave it out.
            let top = if co == L { 0 } else { ffi::lua_gettop(co) };
            (ffi::lua_status(co), top, co)
        };
        n.kind_hash = tag(b"thread", &[status as u8]);
        n.kind = Some(Kind::Thread(status));
        for i in 1..=top {
            // SAFETY: `co` is live (anchored at `at`) with at least `i` values; a slot is
            // checked before the push; co and L share one global state, so xmove is allowed.
            unsafe {
                ffi::luaL_checkstack(co, 1, c"value digest".as_ptr());
                ffi::lua_pushvalue(co, i);
                ffi::lua_xmove(co, L, 1);
            }
            // SAFETY: callers' contract; the stack value on top (popped).
            let item = unsafe { self.classify(L) };
            n.parts.push((Part::Stack(i as u32), item));
        }
    }
}

/// A Lua function's kind: its source and lines (its identity across processes).
///
/// # Safety
/// A Lua function at the valid absolute index `at`; a free stack slot.
unsafe fn lua_function_kind(L: *mut lua_State, at: c_int, n: &mut Node) {
    // SAFETY: callers' contract: lua_getinfo with '>' pops the copy pushed here; `source` is
    // a NUL-terminated string of the function's prototype, which lives at `at` while it is
    // read here.
    let (ar, src) = unsafe {
        let mut ar: ffi::lua_Debug = std::mem::zeroed();
        ffi::lua_pushvalue(L, at);
        ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar);
        let src = CStr::from_ptr(ar.source).to_bytes();
        (ar, src)
    };
    let mut fid = src.to_vec();
    fid.extend_from_slice(&ar.linedefined.to_le_bytes());
    fid.extend_from_slice(&ar.lastlinedefined.to_le_bytes());
    n.kind_hash = tag(b"lfunction", &fid);
    n.kind = Some(Kind::LuaFunction(format!(
        "{}:{}",
        String::from_utf8_lossy(src),
        ar.linedefined
    )));
}

/// Extracts the graph reachable from the value on top of the stack (popped).
///
/// # Safety
/// Protected context on a VM whose state will be restored afterwards (this allocates and
/// changes collector state freely).
pub(crate) unsafe fn extract(L: *mut lua_State, g: &mut Graph) -> Item {
    // SAFETY: protected context; every push is balanced and stack space is checked.
    unsafe {
        ffi::lua_gc(L, ffi::LUA_GCSTOP);
        ffi::luaL_checkstack(L, 16, c"value digest".as_ptr());
        ffi::lua_createtable(L, 1024, 0);
        ffi::lua_rotate(L, -2, 1); // [.., pending, root]
        let pending = ffi::lua_gettop(L) - 1;
        let mut w = Walk {
            g,
            pending,
            tail: 0,
            weak: Vec::new(),
        };
        let root = w.classify(L);
        let mut head = 1i64;
        // The strong graph first; then weak entries whose weak parts it reaches, and what
        // they reach, until nothing more is included.
        loop {
            w.drain(L, &mut head);
            if !w.weak_pass(L) && head > w.tail {
                break;
            }
        }
        ffi::lua_settop(L, pending - 1);
        root
    }
}
