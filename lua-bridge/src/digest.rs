//! The value digest: a canonical hash of the Lua values reachable from a root.
//!
//! Unlike the arena digest it depends neither on addresses nor on `pairs()` order, so it is
//! equal for equal game states across processes, machines and save/load round trips.
//!
//! # How
//! 1. Extract the reachable graph: tables (entries and metatable), functions (Lua functions by
//!    `source:linedefined`, plus upvalues in order; C functions by their upvalues), userdata
//!    (bytes, metatable, user values), coroutines (status and stack values). Primitives are
//!    hashed by value (integers and floats kept apart, strings by bytes).
//! 2. Refine hashes over the graph Weisfeiler-Lehman style: each round, a node's hash becomes a
//!    hash of its kind, its ordered parts and the *order-independent* combination (wrapping sum
//!    of mixed pairs) of its table entries, using the previous round's hashes for references.
//!    After [`ROUNDS`] rounds the root's hash reflects everything within that many hops, in
//!    full, and everything reachable, through the refinement.
//!
//! Traversing through the Lua API writes to the heap (stack slots, a work list, collector
//! state), so the VM is captured before and restored after: the arena is byte-identical
//! afterwards.

use crate::ffi::{self as raw};
use mlua::ffi::{self, lua_State};
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use xxhash_rust::xxh3::Xxh3;

/// Refinement rounds.
pub const ROUNDS: usize = 8;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Item {
    Prim(u64),
    Ref(u32),
}

#[derive(Default, Debug)]
pub(crate) struct Node {
    kind: u64,
    /// Table entries (order-independent).
    entries: Vec<(Item, Item)>,
    /// Ordered parts: metatable, upvalues, user values, stack slots.
    parts: Vec<Item>,
}

/// The graph extracted from the heap.
#[derive(Default)]
pub(crate) struct Graph {
    ids: HashMap<*const c_void, u32>,
    pub nodes: Vec<Node>,
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
    /// Final canonical hash of node 0 (the root) after refinement; `root_prim` if the root was
    /// a primitive.
    pub fn digest(&self, root: Item) -> u64 {
        let root = match root {
            Item::Prim(h) => return h,
            Item::Ref(id) => id as usize,
        };
        let mut h: Vec<u64> = self.nodes.iter().map(|n| n.kind).collect();
        let val = |h: &[u64], it: Item| match it {
            Item::Prim(p) => p,
            Item::Ref(id) => mix(h[id as usize], 0x0052_4546),
        };
        for _ in 0..ROUNDS {
            let next: Vec<u64> = self
                .nodes
                .iter()
                .map(|n| {
                    let mut sum = 0u64;
                    for &(k, v) in &n.entries {
                        sum = sum.wrapping_add(mix(val(&h, k), val(&h, v)));
                    }
                    let mut acc = mix(n.kind, sum);
                    for &p in &n.parts {
                        acc = mix(acc, val(&h, p));
                    }
                    mix(acc, n.entries.len() as u64)
                })
                .collect();
            h = next;
        }
        h[root]
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

/// Classifies the value on top of the stack: a primitive's hash, or a node id (enqueued in the
/// Lua work list at stack index `pending` if new). Pops the value.
///
/// # Safety
/// Protected context (may raise); `pending` is an absolute index of a table; `tail` counts it.
unsafe fn classify(L: *mut lua_State, g: &mut Graph, pending: c_int, tail: &mut i64) -> Item {
    // SAFETY: valid state with the value on top (callers' contract).
    unsafe {
        let t = ffi::lua_type(L, -1);
        let item = match t {
            ffi::LUA_TNIL => Item::Prim(tag(b"nil", &[])),
            ffi::LUA_TBOOLEAN => Item::Prim(tag(b"bool", &[ffi::lua_toboolean(L, -1) as u8])),
            ffi::LUA_TNUMBER => {
                if ffi::lua_isinteger(L, -1) != 0 {
                    Item::Prim(tag(
                        b"int",
                        &ffi::lua_tointegerx(L, -1, std::ptr::null_mut()).to_le_bytes(),
                    ))
                } else {
                    let f = ffi::lua_tonumberx(L, -1, std::ptr::null_mut());
                    Item::Prim(tag(b"flt", &f.to_bits().to_le_bytes()))
                }
            }
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                Item::Prim(tag(b"str", std::slice::from_raw_parts(p.cast(), len)))
            }
            ffi::LUA_TLIGHTUSERDATA => Item::Prim(tag(b"light", &[])),
            _ => {
                let (id, new) = g.id(ffi::lua_topointer(L, -1));
                if new {
                    *tail += 1;
                    ffi::lua_pushvalue(L, -1);
                    ffi::lua_rawseti(L, pending, *tail);
                }
                Item::Ref(id)
            }
        };
        ffi::lua_settop(L, -2);
        item
    }
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
        let mut tail = 0i64;
        let root = classify(L, g, pending, &mut tail);
        let mut head = 1i64;
        while head <= tail {
            ffi::lua_rawgeti(L, pending, head);
            let id = g.ids[&ffi::lua_topointer(L, -1)] as usize;
            head += 1;
            let node = visit(L, g, pending, &mut tail);
            g.nodes[id] = node;
            ffi::lua_settop(L, pending);
        }
        ffi::lua_settop(L, pending - 1);
        root
    }
}

/// Reads the node on top of the stack (left there).
unsafe fn visit(L: *mut lua_State, g: &mut Graph, pending: c_int, tail: &mut i64) -> Node {
    // SAFETY: protected context; the node is on top at index `at`.
    unsafe {
        let at = ffi::lua_gettop(L);
        let mut n = Node::default();
        let meta = |L, g: &mut Graph, tail: &mut i64, parts: &mut Vec<Item>| {
            if ffi::lua_getmetatable(L, at) != 0 {
                parts.push(classify(L, g, pending, tail));
            } else {
                parts.push(Item::Prim(0));
            }
        };
        match ffi::lua_type(L, at) {
            ffi::LUA_TTABLE => {
                n.kind = tag(b"table", &[]);
                meta(L, g, tail, &mut n.parts);
                ffi::lua_pushnil(L);
                while ffi::lua_next(L, at) != 0 {
                    ffi::lua_pushvalue(L, -2);
                    let k = classify(L, g, pending, tail);
                    let v = classify(L, g, pending, tail);
                    n.entries.push((k, v));
                }
            }
            ffi::LUA_TFUNCTION => {
                if ffi::lua_iscfunction(L, at) != 0 {
                    n.kind = tag(b"cfunction", &[]);
                } else {
                    let mut ar: ffi::lua_Debug = std::mem::zeroed();
                    ffi::lua_pushvalue(L, at);
                    ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar);
                    let src = CStr::from_ptr(ar.source).to_bytes();
                    let mut id = src.to_vec();
                    id.extend_from_slice(&ar.linedefined.to_le_bytes());
                    id.extend_from_slice(&ar.lastlinedefined.to_le_bytes());
                    n.kind = tag(b"lfunction", &id);
                }
                let mut i = 1;
                while !ffi::lua_getupvalue(L, at, i).is_null() {
                    n.parts.push(classify(L, g, pending, tail));
                    i += 1;
                }
            }
            ffi::LUA_TUSERDATA => {
                let len = ffi::lua_rawlen(L, at) as usize;
                let p = ffi::lua_touserdata(L, at).cast::<u8>();
                n.kind = tag(b"userdata", std::slice::from_raw_parts(p, len));
                meta(L, g, tail, &mut n.parts);
                let mut i = 1;
                while ffi::lua_getiuservalue(L, at, i) != ffi::LUA_TNONE {
                    n.parts.push(classify(L, g, pending, tail));
                    i += 1;
                }
                ffi::lua_settop(L, -2);
            }
            ffi::LUA_TTHREAD => {
                let co = ffi::lua_tothread(L, at);
                let status = ffi::lua_status(co);
                // The main thread's stack holds this traversal itself: leave it out.
                let top = if co == L { 0 } else { ffi::lua_gettop(co) };
                n.kind = tag(b"thread", &[status as u8]);
                for i in 1..=top {
                    ffi::luaL_checkstack(co, 1, c"value digest".as_ptr());
                    ffi::lua_pushvalue(co, i);
                    ffi::lua_xmove(co, L, 1);
                    n.parts.push(classify(L, g, pending, tail));
                }
            }
            _ => n.kind = tag(b"other", raw::type_name(L, at).as_bytes()),
        }
        n
    }
}
