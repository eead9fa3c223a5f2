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
//! - full userdata: bytes (a `string.gmatch` iterator's match state: its positions in the
//!   subject, not its pointers), metatable, user values; coroutines: status and live stack values
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
use crate::runtime::graph::{extract, mix, Graph, Item};
use luasnap_snap::Snapshot;
use mlua_sys as ffi;
use std::ffi::CString;

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
        let mut graph = Graph::with_limit(usize::MAX);
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
        let root = root.expect("extract ran")?;
        Ok(graph.digest(root))
    }
}

/// Refinement rounds at least.
pub(crate) const ROUNDS: usize = 8;
/// Refinement rounds at most (a long linked list would otherwise need one per element).
pub(crate) const MAX_ROUNDS: usize = 64;

impl Graph {
    /// Each node's hash after `rounds` refinement rounds.
    pub(crate) fn refine(&self, rounds: usize) -> Vec<u64> {
        let mut h: Vec<u64> = self.nodes.iter().map(|n| n.kind_hash).collect();
        for _ in 0..rounds {
            h = self.round(&h);
        }
        h
    }

    fn round(&self, h: &[u64]) -> Vec<u64> {
        let val = |it: Item| match it.as_node() {
            None => self.prim_hash(it).expect("a primitive"),
            Some(id) => mix(h[id as usize], 0x0052_4546),
        };
        (0..self.nodes.len() as u32)
            .map(|id| {
                let entries = self.entries(id);
                let mut sum = 0u64;
                for &(k, v) in entries {
                    sum = sum.wrapping_add(mix(val(k), val(v)));
                }
                let mut acc = mix(self.nodes[id as usize].kind_hash, sum);
                for (_, p) in self.parts(id) {
                    acc = mix(acc, val(*p));
                }
                mix(acc, entries.len() as u64)
            })
            .collect()
    }

    /// Rounds after which the partition of nodes into equal hashes stops growing (within
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
        match root.as_node() {
            None => self.prim_hash(root).expect("a primitive"),
            Some(id) => Self::combine(&self.refine(rounds), id as usize),
        }
    }

    /// The digest of the graph rooted at `root` (see the module documentation).
    pub(crate) fn digest(&self, root: Item) -> u64 {
        self.digest_with(root, ROUNDS)
    }
}
