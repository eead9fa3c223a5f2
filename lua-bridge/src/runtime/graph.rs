//! The graph of values the value digest hashes and `luasnap diff` compares (see
//! [`crate::runtime::digest`] for what it covers), extracted from a VM, in a compact form with
//! a memory bound.
//!
//! Layout: a node is 24 bytes (its kind's hash, its kind as an index into the distinct kinds,
//! where its parts start); its ordered parts (metatable, upvalues, user values, stack slots)
//! are 16 bytes each in one list, in node order (nodes are visited in id order); its table
//! entries 8 bytes each, in one list indexed by node once extraction ends. An item (a key, a
//! value, a part) is 4 bytes: a node id, or an index into the primitives, where `nil`,
//! booleans, light userdata and small integers are stored once, strings once per Lua string
//! (their bytes in one buffer). Before, a node cost about 600-700 bytes with its vectors and
//! per-occurrence primitives: two 7 MB saves of tables nested a million deep took `luasnap
//! diff` to 1.2 GB.
//!
//! Invariant: every [`Item`] of a graph refers to a node or primitive of that graph; parts of
//! node `i` are `parts[nodes[i].parts .. nodes[i + 1].parts]` (the last up to the end).

use crate::bridge::error::VmError;
use crate::bridge::ffi::{self as raw};
use crate::bridge::helpers::luasnap_gmatch_positions;
use mlua_sys::{self as ffi, lua_State};
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use xxhash_rust::xxh3::Xxh3;

/// A primitive value, kept for reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Prim {
    /// `nil` (also: no metatable).
    Nil,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string: its bytes are `Graph::str_bytes[off .. off + len]` ([`Graph::bytes_of`]).
    Str { off: u32, len: u32 },
    /// A light userdata (its address is not compared).
    Light,
}

/// A value in the graph: a node id, or (high bit set) an index into the primitives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Item(u32);

const PRIM_BIT: u32 = 1 << 31;

impl Item {
    /// The node `id`.
    pub(crate) fn node(id: u32) -> Item {
        Item(id)
    }

    fn prim(at: u32) -> Item {
        Item(at | PRIM_BIT)
    }

    /// The node id, if it is a node.
    pub(crate) fn as_node(self) -> Option<u32> {
        (self.0 & PRIM_BIT == 0).then_some(self.0)
    }

    /// The primitive's index, if it is one.
    fn as_prim(self) -> Option<u32> {
        (self.0 & PRIM_BIT != 0).then_some(self.0 & !PRIM_BIT)
    }
}

/// What an ordered part of a node is, for paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The metatable (nil if none).
    Metatable,
    /// An upvalue: its index and its name (an index into [`Graph::names`]; empty if Lua
    /// knows none).
    Upvalue(u32, u32),
    /// A userdata's user value.
    UserValue(u32),
    /// A coroutine's stack slot.
    Stack(u32),
}

/// The kind of a node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Not visited (yet).
    Unvisited,
    /// A table.
    Table,
    /// A Lua function (`source:linedefined`).
    LuaFunction(String),
    /// A C function, by its least name among the VM's permanents (`string.format`), empty
    /// if it has none or the graph does not name them ([`Graph::naming_cfunctions`]). Only the
    /// diff reads it: the digest hashes every C function alike ([`Node::kind_hash`]).
    CFunction(String),
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
            Kind::Unvisited => write!(f, "object"),
            Kind::Table => write!(f, "table"),
            Kind::LuaFunction(at) => write!(f, "function {at}"),
            Kind::CFunction(name) if name.is_empty() => write!(f, "C function"),
            Kind::CFunction(name) => write!(f, "C function {name}"),
            Kind::UserData(n) => write!(f, "userdata ({n} bytes)"),
            Kind::Thread(s) => write!(f, "coroutine (status {s})"),
            Kind::Other(t) => write!(f, "{t}"),
        }
    }
}

/// One object of the graph.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Node {
    /// Hash of the kind and own bytes (userdata contents, function identity).
    pub(crate) kind_hash: u64,
    /// Index into [`Graph::kinds`] (0: unvisited).
    kind: u32,
    /// Where its parts start in [`Graph::parts`].
    parts: u32,
    /// Its key identity (see docs/determinism.md, "Key order"): nonzero once the object was
    /// a key of some table; a format 7 save carries it, so both sides of a diff agree on it.
    pub(crate) ident: u32,
}

/// Bytes a graph holds per node, entry, part and primitive (what [`Graph::bytes`] counts):
/// the lists' elements, plus an entry of the extraction's address map per node and string.
const NODE_BYTES: usize = std::mem::size_of::<Node>() + 24;
const ENTRY_BYTES: usize = 2 * std::mem::size_of::<Item>();
const PART_BYTES: usize = std::mem::size_of::<(Part, Item)>();
const PRIM_BYTES: usize = std::mem::size_of::<Prim>() + 8;

/// Integers stored once each: -SMALL_INTS..SMALL_INTS.
const SMALL_INTS: i64 = 1024;

/// The most bytes any graph holds, whatever its limit: items are 31-bit indices and string
/// offsets 32-bit, which this keeps every count and offset within.
const MAX_GRAPH_BYTES: usize = 1 << 31;

/// The graph extracted from the heap.
pub(crate) struct Graph {
    /// Node ids by object address (extraction only).
    ids: HashMap<*const c_void, u32>,
    /// Strings already in `prims`, by the address of their bytes (extraction only).
    strs: HashMap<*const u8, Item>,
    /// The nodes; node 0 is the root if the root is an object.
    pub(crate) nodes: Vec<Node>,
    /// The distinct kinds (0: unvisited), and their indices.
    kinds: Vec<Kind>,
    kind_ids: HashMap<Kind, u32>,
    /// Ordered parts of every node, in node order.
    parts: Vec<(Part, Item)>,
    /// Table entries: while extracting, those of node `i` are contiguous from
    /// `entry_start[i]` (strong tables, visited in id order) or in `weak_entries`; once
    /// extraction ends, all of node `i`'s are `entries[entry_start[i] .. entry_start[i + 1]]`.
    entries: Vec<(Item, Item)>,
    entry_start: Vec<u32>,
    weak_entries: Vec<(u32, Item, Item)>,
    /// Primitives and their hashes.
    prims: Vec<Prim>,
    prim_hashes: Vec<u64>,
    str_bytes: Vec<u8>,
    /// Upvalue names (0: none).
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    /// `small_ints[i + SMALL_INTS]`: the primitive of integer i, if made.
    small_ints: Vec<u32>,
    /// The most bytes the graph may hold ([`Graph::bytes`]), at most [`MAX_GRAPH_BYTES`].
    limit: usize,
    /// Whether a string did not fit (then the graph counts as over its limit).
    over: bool,
    /// C functions' names by address, read from the VM's permanents at the first C function
    /// met, if the graph names them ([`Graph::naming_cfunctions`]).
    cf_names: Option<HashMap<*const c_void, String>>,
    naming: bool,
    /// string.gmatch's helper (read from the permanents at the first C function met; 0: none)
    /// and the positions of the match states of the iterators met, by the state's address:
    /// such a state is hashed by its positions, not by its bytes, which are pointers.
    gmatch_aux: Option<usize>,
    gmatch_states: HashMap<*const c_void, [i64; 2]>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("nodes", &self.nodes.len())
            .field("prims", &self.prims.len())
            .finish()
    }
}

pub(crate) fn tag(t: &[u8], bytes: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(t);
    h.update(bytes);
    h.digest()
}

pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The fixed primitives' indices.
const NIL: u32 = 0;
const FALSE: u32 = 1;
const TRUE: u32 = 2;
const LIGHT: u32 = 3;

impl Graph {
    /// An empty graph that may hold at most `limit` bytes ([`Graph::bytes`]).
    pub(crate) fn with_limit(limit: usize) -> Graph {
        let mut g = Graph {
            ids: HashMap::new(),
            strs: HashMap::new(),
            nodes: Vec::new(),
            kinds: vec![Kind::Unvisited],
            kind_ids: HashMap::new(),
            parts: Vec::new(),
            entries: Vec::new(),
            entry_start: Vec::new(),
            weak_entries: Vec::new(),
            prims: Vec::new(),
            prim_hashes: Vec::new(),
            str_bytes: Vec::new(),
            names: vec![String::new()],
            name_ids: HashMap::new(),
            small_ints: vec![u32::MAX; 2 * SMALL_INTS as usize],
            limit: limit.min(MAX_GRAPH_BYTES),
            over: false,
            cf_names: None,
            naming: false,
            gmatch_aux: None,
            gmatch_states: HashMap::new(),
        };
        g.push_prim(Prim::Nil, tag(b"nil", &[]));
        g.push_prim(Prim::Bool(false), tag(b"bool", &[0]));
        g.push_prim(Prim::Bool(true), tag(b"bool", &[1]));
        g.push_prim(Prim::Light, tag(b"light", &[]));
        g
    }

    /// The graph, naming C functions in their kinds ([`Kind::CFunction`]), for the diff to
    /// pair C-function keys by name. The name comes from the extracting VM's own permanents,
    /// never from the process-wide map of csrc/cfids.c (whose names depend on which VMs the
    /// process built first), and never enters the digest.
    pub(crate) fn naming_cfunctions(mut self) -> Graph {
        self.naming = true;
        self
    }

    /// The bytes the graph holds, as counted against its limit.
    pub(crate) fn bytes(&self) -> usize {
        if self.over {
            return usize::MAX;
        }
        self.nodes.len() * NODE_BYTES
            + (self.entries.len() + self.weak_entries.len()) * ENTRY_BYTES
            + self.parts.len() * PART_BYTES
            + self.prims.len() * PRIM_BYTES
            + self.str_bytes.len()
            + self.strs.len() * 24
    }

    fn push_prim(&mut self, p: Prim, hash: u64) -> Item {
        let at = self.prims.len() as u32;
        self.prims.push(p);
        self.prim_hashes.push(hash);
        Item::prim(at)
    }

    /// The primitive an item refers to, if it is one.
    pub(crate) fn prim(&self, it: Item) -> Option<Prim> {
        it.as_prim().map(|at| self.prims[at as usize])
    }

    /// A string primitive's bytes (empty for anything else).
    pub(crate) fn bytes_of(&self, p: Prim) -> &[u8] {
        match p {
            Prim::Str { off, len } => &self.str_bytes[off as usize..(off + len) as usize],
            _ => &[],
        }
    }

    /// The hash of a primitive item (nodes: None).
    pub(crate) fn prim_hash(&self, it: Item) -> Option<u64> {
        it.as_prim().map(|at| self.prim_hashes[at as usize])
    }

    /// A node's kind.
    pub(crate) fn kind(&self, id: u32) -> &Kind {
        &self.kinds[self.nodes[id as usize].kind as usize]
    }

    /// A node's ordered parts.
    pub(crate) fn parts(&self, id: u32) -> &[(Part, Item)] {
        let start = self.nodes[id as usize].parts as usize;
        let end = self
            .nodes
            .get(id as usize + 1)
            .map_or(self.parts.len(), |n| n.parts as usize);
        &self.parts[start..end]
    }

    /// A node's table entries (once extraction ended).
    pub(crate) fn entries(&self, id: u32) -> &[(Item, Item)] {
        let (a, b) = (
            self.entry_start[id as usize] as usize,
            self.entry_start[id as usize + 1] as usize,
        );
        &self.entries[a..b]
    }

    /// An upvalue's name.
    pub(crate) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    fn kind_id(&mut self, k: Kind) -> u32 {
        if k == Kind::Table {
            // Most nodes: no lookup.
            if let Some(&id) = self.kind_ids.get(&Kind::Table) {
                return id;
            }
        }
        let next = self.kinds.len() as u32;
        *self.kind_ids.entry(k.clone()).or_insert_with(|| {
            self.kinds.push(k);
            next
        })
    }

    fn name_id(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.name_ids.insert(name.to_string(), id);
        id
    }

    fn int(&mut self, i: i64) -> Item {
        let small = (-SMALL_INTS..SMALL_INTS).contains(&i);
        // Used only when small (i + SMALL_INTS overflowed for integers near i64::MAX: a
        // panic where overflow is checked, found by the structured fuzzer).
        let slot = i.wrapping_add(SMALL_INTS) as usize;
        if small && self.small_ints[slot] != u32::MAX {
            return Item::prim(self.small_ints[slot]);
        }
        let it = self.push_prim(Prim::Int(i), tag(b"int", &i.to_le_bytes()));
        if small {
            self.small_ints[slot] = it.as_prim().expect("a primitive");
        }
        it
    }

    fn string(&mut self, p: *const u8, b: &[u8]) -> Item {
        if let Some(&item) = self.strs.get(&p) {
            return item;
        }
        if self.str_bytes.len() + b.len() > MAX_GRAPH_BYTES {
            // Past every limit: the extraction stops as over it (offsets are 32-bit).
            self.over = true;
            return Item::prim(0);
        }
        let off = self.str_bytes.len() as u32;
        self.str_bytes.extend_from_slice(b);
        let item = self.push_prim(
            Prim::Str {
                off,
                len: b.len() as u32,
            },
            tag(b"str", b),
        );
        self.strs.insert(p, item);
        item
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

    /// Ends extraction: every node's entries in one list by node, the address maps dropped.
    fn finish(&mut self) {
        let n = self.nodes.len();
        self.entry_start.resize(n + 1, self.entries.len() as u32);
        self.ids = HashMap::new();
        self.strs = HashMap::new();
        if self.weak_entries.is_empty() {
            return;
        }
        let mut weak = std::mem::take(&mut self.weak_entries);
        weak.sort_by_key(|w| w.0);
        let mut all = Vec::with_capacity(self.entries.len() + weak.len());
        let mut starts = Vec::with_capacity(n + 1);
        let mut w = 0;
        for id in 0..n {
            starts.push(all.len() as u32);
            let (a, b) = (
                self.entry_start[id] as usize,
                self.entry_start[id + 1] as usize,
            );
            all.extend_from_slice(&self.entries[a..b]);
            while w < weak.len() && weak[w].0 as usize == id {
                all.push((weak[w].1, weak[w].2));
                w += 1;
            }
        }
        starts.push(all.len() as u32);
        self.entries = all;
        self.entry_start = starts;
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
        // SAFETY: valid state with the value on top (callers' contract); reads it.
        let item = unsafe {
            match ffi::lua_type(L, -1) {
                ffi::LUA_TNIL => Item::prim(NIL),
                ffi::LUA_TBOOLEAN => Item::prim(if ffi::lua_toboolean(L, -1) != 0 {
                    TRUE
                } else {
                    FALSE
                }),
                ffi::LUA_TNUMBER if ffi::lua_isinteger(L, -1) != 0 => {
                    self.g.int(ffi::lua_tointegerx(L, -1, std::ptr::null_mut()))
                }
                ffi::LUA_TNUMBER => {
                    let f = ffi::lua_tonumberx(L, -1, std::ptr::null_mut());
                    self.g
                        .push_prim(Prim::Float(f), tag(b"flt", &f.to_bits().to_le_bytes()))
                }
                ffi::LUA_TSTRING => {
                    let mut len = 0;
                    let p = ffi::lua_tolstring(L, -1, &mut len).cast::<u8>();
                    // A Lua string's bytes do not move while it lives, and nothing is
                    // collected during the walk (the collector is stopped).
                    self.g.string(p, std::slice::from_raw_parts(p, len))
                }
                ffi::LUA_TLIGHTUSERDATA => Item::prim(LIGHT),
                _ => self.node(L),
            }
        };
        // SAFETY: pops the value (callers' contract: it is on top).
        unsafe { ffi::lua_settop(L, -2) };
        item
    }

    /// The node of the object on top (left there), enqueued in the work list if new.
    ///
    /// # Safety
    /// Protected context, an object on top and a free slot.
    unsafe fn node(&mut self, L: *mut lua_State) -> Item {
        // SAFETY: callers' contract; the copy pushed is stored in the work list (popped).
        unsafe {
            let (id, new) = self.g.id(ffi::lua_topointer(L, -1));
            if new {
                self.tail += 1;
                ffi::lua_pushvalue(L, -1);
                ffi::lua_rawseti(L, self.pending, self.tail);
            }
            Item::node(id)
        }
    }

    /// Visits the work list from `head` to its end (which grows while visiting), in id order.
    /// Stops once the graph holds more than its limit (the caller reports it).
    ///
    /// # Safety
    /// Protected context; every object in the work list is anchored by it.
    unsafe fn drain(&mut self, L: *mut lua_State, head: &mut i64) {
        while *head <= self.tail && self.g.bytes() <= self.g.limit {
            // SAFETY: callers' contract; the object is pushed, visited, popped.
            unsafe {
                ffi::lua_rawgeti(L, self.pending, *head);
                let id = (*head - 1) as u32; // the work list holds node i at i + 1
                debug_assert_eq!(self.g.ids[&ffi::lua_topointer(L, -1)], id);
                let position = *head;
                *head += 1;
                self.visit(L, id, position);
                ffi::lua_settop(L, self.pending);
            }
        }
    }

    /// Whether the value at absolute index `idx` may be kept as a weak part: not removable by
    /// the collector, or strongly reached already.
    ///
    /// # Safety
    /// A valid absolute index.
    unsafe fn weak_part_kept(&self, L: *mut lua_State, idx: c_int) -> bool {
        // SAFETY: callers' contract; reads only.
        unsafe {
            !crate::bridge::canonical::is_weak_removable(L, idx)
                || self.g.ids.contains_key(&ffi::lua_topointer(L, idx))
        }
    }

    /// One pass over the weak tables: includes the entries whose weak parts are kept now.
    /// Returns whether any entry was included.
    ///
    /// # Safety
    /// Protected context; each weak table is anchored in the work list.
    unsafe fn weak_pass(&mut self, L: *mut lua_State) -> bool {
        let mut any = false;
        for w in 0..self.weak.len() {
            let (id, position, wk, wv) = {
                let e = &self.weak[w];
                (e.0, e.1, e.2, e.3)
            };
            // SAFETY: callers' contract; the table pushed, traversed, popped.
            unsafe {
                ffi::lua_rawgeti(L, self.pending, position);
                let at = ffi::lua_gettop(L);
                let mut i = 0usize;
                ffi::lua_pushnil(L);
                while ffi::lua_next(L, at) != 0 {
                    if self.weak[w].4.len() <= i {
                        self.weak[w].4.push(false);
                    }
                    let (k, v) = (at + 1, at + 2);
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
                        self.g.weak_entries.push((id, ki, vi));
                    }
                    ffi::lua_settop(L, k);
                    i += 1;
                }
                ffi::lua_settop(L, at - 1);
            }
        }
        any
    }

    /// Reads node `id`, the object on top (left there), at `position` in the work list.
    ///
    /// # Safety
    /// Protected context.
    unsafe fn visit(&mut self, L: *mut lua_State, id: u32, position: i64) {
        self.g.nodes[id as usize].parts = self.g.parts.len() as u32;
        self.g.entry_start.push(self.g.entries.len() as u32);
        // SAFETY: callers' contract; each visits the object on top.
        let (kind_hash, kind) = unsafe {
            match ffi::lua_type(L, -1) {
                ffi::LUA_TTABLE => self.table(L, id, position),
                ffi::LUA_TFUNCTION => self.function(L),
                ffi::LUA_TUSERDATA => self.userdata(L),
                ffi::LUA_TTHREAD => self.thread(L),
                _ => {
                    let t = raw::type_name(L, -1);
                    (tag(b"other", t.as_bytes()), Kind::Other(t))
                }
            }
        };
        let kind = self.g.kind_id(kind);
        // SAFETY: the object is on top (callers' contract); reads its identity field.
        let ident = unsafe { crate::bridge::helpers::luasnap_identity_at(L, -1) };
        let node = &mut self.g.nodes[id as usize];
        node.ident = ident;
        node.kind_hash = kind_hash;
        node.kind = kind;
    }

    /// The metatable of the object at `at` as a part; returns its `__mode` (read raw).
    ///
    /// # Safety
    /// Protected context, two free slots.
    unsafe fn metatable(&mut self, L: *mut lua_State, at: c_int) -> Vec<u8> {
        // SAFETY: callers' contract; the metatable (if any) pushed, read raw, classified.
        unsafe {
            if ffi::lua_getmetatable(L, at) == 0 {
                self.g.parts.push((Part::Metatable, Item::prim(NIL)));
                return Vec::new();
            }
            ffi::lua_pushstring(L, c"__mode".as_ptr());
            ffi::lua_rawget(L, -2);
            let mode = if ffi::lua_type(L, -1) == ffi::LUA_TSTRING {
                CStr::from_ptr(ffi::lua_tolstring(L, -1, std::ptr::null_mut()))
                    .to_bytes()
                    .to_vec()
            } else {
                Vec::new()
            };
            ffi::lua_settop(L, -2);
            let mt = self.classify(L);
            self.g.parts.push((Part::Metatable, mt));
            mode
        }
    }

    /// A table (on top): its metatable, then its entries (a weak table's wait for the strong
    /// graph: see [`extract`]).
    ///
    /// # Safety
    /// Protected context, a table on top, four free slots.
    unsafe fn table(&mut self, L: *mut lua_State, id: u32, position: i64) -> (u64, Kind) {
        // SAFETY: callers' contract; the entries pushed and classified (popped) in turn.
        unsafe {
            let at = ffi::lua_gettop(L);
            let mode = self.metatable(L, at);
            let (wk, wv) = (mode.contains(&b'k'), mode.contains(&b'v'));
            if wk || wv {
                self.weak.push((id, position, wk, wv, Vec::new()));
            } else {
                ffi::lua_pushnil(L);
                while ffi::lua_next(L, at) != 0 {
                    ffi::lua_pushvalue(L, -2);
                    let k = self.classify(L);
                    let v = self.classify(L);
                    self.g.entries.push((k, v));
                }
            }
        }
        (tag(b"table", &[]), Kind::Table)
    }

    /// A function (on top): its identity, then its upvalues.
    ///
    /// # Safety
    /// Protected context, a function on top, three free slots.
    unsafe fn function(&mut self, L: *mut lua_State) -> (u64, Kind) {
        // SAFETY: callers' contract; `ar` filled by lua_getinfo for a copy of the function
        // (popped by it); each upvalue pushed and classified (popped).
        unsafe {
            let at = ffi::lua_gettop(L);
            let out = if ffi::lua_iscfunction(L, at) != 0 {
                let name = if self.g.naming {
                    self.cfunction_name(L, at)
                } else {
                    String::new()
                };
                self.note_gmatch_state(L, at);
                (tag(b"cfunction", &[]), Kind::CFunction(name))
            } else {
                let mut ar: ffi::lua_Debug = std::mem::zeroed();
                ffi::lua_pushvalue(L, at);
                ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar);
                let src = CStr::from_ptr(ar.source).to_bytes();
                let mut fid = src.to_vec();
                fid.extend_from_slice(&ar.linedefined.to_le_bytes());
                fid.extend_from_slice(&ar.lastlinedefined.to_le_bytes());
                let at_line = format!("{}:{}", String::from_utf8_lossy(src), ar.linedefined);
                (tag(b"lfunction", &fid), Kind::LuaFunction(at_line))
            };
            let mut i = 1;
            loop {
                let name = ffi::lua_getupvalue(L, at, i);
                if name.is_null() {
                    break;
                }
                let name = CStr::from_ptr(name).to_string_lossy();
                let name = self.g.name_id(&name);
                let v = self.classify(L);
                self.g.parts.push((Part::Upvalue(i as u32, name), v));
                i += 1;
            }
            out
        }
    }

    /// The name of the C function at `at` among the VM's permanents (the least, if several),
    /// or empty; the names are read once per extraction.
    ///
    /// # Safety
    /// Protected context, a function at `at`, three free slots.
    unsafe fn cfunction_name(&mut self, L: *mut lua_State, at: c_int) -> String {
        // SAFETY: callers' contract; reads the registry's permanents table (name -> value)
        // raw with lua_next, which neither allocates nor raises for keys taken from it.
        let names = self.g.cf_names.get_or_insert_with(|| unsafe {
            let mut names: HashMap<*const c_void, String> = HashMap::new();
            let perms = crate::persist::permanents::UNPERMS_KEY;
            if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, perms.as_ptr()) == ffi::LUA_TTABLE {
                let t = ffi::lua_gettop(L);
                ffi::lua_pushnil(L);
                while ffi::lua_next(L, t) != 0 {
                    let name = crate::persist::permanents::key_name(L, -2);
                    if let (Some(name), true) = (name, ffi::lua_iscfunction(L, -1) != 0) {
                        let p = ffi::lua_topointer(L, -1);
                        match names.get(&p) {
                            Some(old) if *old <= name => {}
                            _ => {
                                names.insert(p, name);
                            }
                        }
                    }
                    ffi::lua_settop(L, -2);
                }
            }
            ffi::lua_settop(L, -2);
            names
        });
        // SAFETY: `at` holds a function (callers' contract).
        let p = unsafe { ffi::lua_topointer(L, at) };
        names.get(&p).cloned().unwrap_or_default()
    }

    /// If the C function at `at` is a string.gmatch iterator, notes its match state's
    /// positions (`luasnap_gmatch_positions`) for [`Self::userdata`] to hash instead of the
    /// state's bytes.
    ///
    /// # Safety
    /// Protected context, a C function at `at`, three free slots.
    unsafe fn note_gmatch_state(&mut self, L: *mut lua_State, at: c_int) {
        // SAFETY: callers' contract; reads a registry field, balanced pushes.
        let aux = *self.g.gmatch_aux.get_or_insert_with(|| unsafe {
            let perms = crate::persist::permanents::UNPERMS_KEY;
            let mut f = 0;
            if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, perms.as_ptr()) == ffi::LUA_TTABLE {
                ffi::lua_getfield(L, -1, crate::persist::permanents::GMATCH_AUX.as_ptr());
                f = ffi::lua_tocfunction(L, -1).map_or(0, |f| f as usize);
                ffi::lua_settop(L, -2);
            }
            ffi::lua_settop(L, -2);
            f
        });
        // SAFETY: `at` holds a C function (callers' contract).
        let f = unsafe { ffi::lua_tocfunction(L, at) }.map_or(0, |f| f as usize);
        if aux == 0 || f != aux {
            return;
        }
        let mut positions = [0i64; 2];
        // SAFETY: a C closure at `at`, three free slots; it pushes nothing in the end, and
        // reads the state only once its upvalues are as gmatch makes them.
        if unsafe { luasnap_gmatch_positions(L, at, positions.as_mut_ptr()) } == 0 {
            return;
        }
        // SAFETY: pushes upvalue 3 (checked above: the state) and pops it.
        let state = unsafe {
            ffi::lua_getupvalue(L, at, 3);
            let p = ffi::lua_touserdata(L, -1).cast_const();
            ffi::lua_settop(L, -2);
            p
        };
        self.g.gmatch_states.insert(state, positions);
    }

    /// A full userdata (on top): its bytes, metatable and user values; a string.gmatch
    /// iterator's match state by its positions in the subject (the rest of its bytes are
    /// pointers, the subject and the pattern are the iterator's other upvalues).
    ///
    /// # Safety
    /// Protected context, a userdata on top, two free slots.
    unsafe fn userdata(&mut self, L: *mut lua_State) -> (u64, Kind) {
        // SAFETY: callers' contract; the bytes are the userdata's block, alive while it is
        // on the stack; each user value pushed and classified (popped).
        unsafe {
            let at = ffi::lua_gettop(L);
            let len = ffi::lua_rawlen(L, at) as usize;
            let p = ffi::lua_touserdata(L, at).cast::<u8>();
            let h = match self.g.gmatch_states.get(&p.cast_const().cast::<c_void>()) {
                Some(&[next, last]) => {
                    let mut bytes = [0u8; 16];
                    bytes[..8].copy_from_slice(&next.to_le_bytes());
                    bytes[8..].copy_from_slice(&last.to_le_bytes());
                    tag(b"gmatch state", &bytes)
                }
                None => tag(b"userdata", std::slice::from_raw_parts(p, len)),
            };
            self.metatable(L, at);
            let mut i = 1;
            while ffi::lua_getiuservalue(L, at, i) != ffi::LUA_TNONE {
                let v = self.classify(L);
                self.g.parts.push((Part::UserValue(i as u32), v));
                i += 1;
            }
            ffi::lua_settop(L, at);
            (h, Kind::UserData(len))
        }
    }

    /// A coroutine (on top): its status and live stack values (the main thread's stack, which
    /// holds this traversal itself, left out).
    ///
    /// # Safety
    /// Protected context, a thread on top, two free slots.
    unsafe fn thread(&mut self, L: *mut lua_State) -> (u64, Kind) {
        // SAFETY: callers' contract; each slot copied over to L and classified (popped).
        unsafe {
            let co = ffi::lua_tothread(L, -1);
            let status = ffi::lua_status(co);
            let top = if co == L { 0 } else { ffi::lua_gettop(co) };
            for i in 1..=top {
                ffi::luaL_checkstack(co, 1, c"value digest".as_ptr());
                ffi::lua_pushvalue(co, i);
                ffi::lua_xmove(co, L, 1);
                let v = self.classify(L);
                self.g.parts.push((Part::Stack(i as u32), v));
            }
            (tag(b"thread", &[status as u8]), Kind::Thread(status))
        }
    }
}

/// Extracts the graph reachable from the value on top of the stack (popped) into `g`, and
/// returns its root; fails once the graph would hold more than its limit.
///
/// # Safety
/// Protected context on a VM whose state will be restored or dropped afterwards (this
/// allocates and changes collector state freely).
pub(crate) unsafe fn extract(L: *mut lua_State, g: &mut Graph) -> Result<Item, VmError> {
    // SAFETY: protected context; every push is balanced and stack space is checked.
    let root = unsafe {
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
            if w.g.bytes() > w.g.limit {
                break;
            }
            if !w.weak_pass(L) && head > w.tail {
                break;
            }
        }
        ffi::lua_settop(L, pending - 1);
        root
    };
    if g.bytes() > g.limit {
        return Err(VmError::ValueGraphTooLarge {
            limit: g.limit,
            objects: g.nodes.len(),
        });
    }
    g.finish();
    Ok(root)
}
