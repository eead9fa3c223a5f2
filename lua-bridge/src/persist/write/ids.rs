//! The writer's id table: object identities (addresses) to the ids the file gives them.

use rustc_hash::FxHashMap as HashMap;
use std::ffi::c_void;

/// Object identities (addresses) to ids, in four id spaces (see [`IdSpace`]).
///
/// Every Lua object lives in the VM's arena, 16-byte aligned, and is visited in about the
/// order it was allocated, so ids sit in a table indexed by arena offset / 16 (one 4-byte slot
/// per 16 bytes of arena, in leaves of `LEAF` slots allocated when first used): a lookup is an
/// index, and objects allocated together have their slots together, where a hash map scattered
/// them (its lookups were most of the writer's cache misses).
///
/// Invariants:
/// - A slot is 0 (free) or holds its space in the top two bits and the id + 1 below.
/// - The spaces share the table because no two objects alive share an address, and nothing is
///   freed while a persist runs (see `Persister::anchor`). A permanent's slot takes the object
///   id it gets when written; a slot another space holds is never overwritten.
/// - Whatever the table cannot hold (an identity outside the arena's first `DENSE_SPAN` bytes
///   or not 16-byte aligned, such as a C function or a userdata's memory; an id past
///   `ID_MASK - 2`; a slot taken by another space) goes to `far`. `far_dense` says whether
///   `far` holds an identity the table could have held: while it is false, a free slot means
///   "not there" without a look at `far`.
/// - Leaves outside `dirty` hold only zeros.
///
/// The table outlives a persist (see `Scratch`): [`IdMap::reset`] empties it for the next,
/// zeroing the leaves written since the last reset (a small save after a large one zeroes
/// the large one's leaves once, not at every save).
#[derive(Default)]
pub(super) struct IdMap {
    base: usize,
    leaves: Vec<Option<Box<[u32; LEAF]>>>,
    far: HashMap<(usize, IdSpace), u32>,
    /// Whether `far` holds an identity the table could have held (then misses look there too).
    far_dense: bool,
    /// Leaves `dirty.0..dirty.1` may hold slots written since the last reset.
    dirty: (usize, usize),
}

/// Slots per leaf of `IdMap` (a leaf covers 16 KiB of arena).
const LEAF: usize = 1024;
/// Arena offsets `IdMap` indexes directly (past this, identities go to its hash map).
const DENSE_SPAN: usize = 1 << 34;
/// Where a slot's id space starts.
const SPACE_SHIFT: u32 = 30;
/// A slot's id + 1 (the rest is its id space).
const ID_MASK: u32 = (1 << SPACE_SHIFT) - 1;

/// Which id space of `IdMap`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum IdSpace {
    /// An object written (its object id).
    Obj = 0,
    /// A string written (its string id).
    Str = 1,
    /// An upvalue written (its index in `Persister::upval_homes`).
    Upval = 2,
    /// A permanent (id 0): written by name, by the general path, until it has an object id.
    Perm = 3,
}

/// What an object is to the writer (see [`IdMap::obj_state`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ObjState {
    /// Written, with this object id.
    Written(u32),
    /// Neither written nor a permanent.
    New,
    /// A permanent not written yet (the general path writes it, by name).
    Permanent,
}

impl IdMap {
    /// Empties the map for a persist of the arena at `base`, keeping its memory.
    pub(super) fn reset(&mut self, base: usize) {
        self.base = base;
        let (lo, hi) = self.dirty;
        for leaf in self.leaves.iter_mut().take(hi).skip(lo).flatten() {
            leaf.fill(0);
        }
        self.dirty = (usize::MAX, 0);
        self.far.clear();
        self.far_dense = false;
    }

    /// Notes that leaf `i` gets a slot written.
    #[inline]
    fn touch(&mut self, i: usize) {
        self.dirty = (self.dirty.0.min(i), self.dirty.1.max(i + 1));
    }

    /// Bytes it holds.
    pub(super) fn footprint(&self) -> usize {
        self.leaves.capacity() * std::mem::size_of::<Option<Box<[u32; LEAF]>>>()
            + self.leaves.iter().flatten().count() * LEAF * 4
            + self.far.capacity() * 24
    }

    /// The table index of `p`, if the table can hold it.
    #[inline]
    fn key(&self, p: *const c_void) -> Option<usize> {
        let off = (p as usize).wrapping_sub(self.base);
        (off & 15 == 0 && off < DENSE_SPAN).then_some(off >> 4)
    }

    /// The id of `p` in `space`, if it has one. (Always inline: it is on every hot path, and
    /// out of line it cost 2% of a save's instructions.)
    #[inline(always)]
    pub(super) fn get(&self, p: *const c_void, space: IdSpace) -> Option<u32> {
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get(k / LEAF) {
                let e = leaf[k % LEAF];
                if e != 0 && e >> SPACE_SHIFT == space as u32 {
                    return Some((e & ID_MASK) - 1);
                }
            }
            if !self.far_dense {
                return None;
            }
        }
        self.far.get(&(p as usize, space)).copied()
    }

    #[inline]
    pub(super) fn contains(&self, p: *const c_void) -> bool {
        self.get(p, IdSpace::Obj).is_some()
    }

    /// Gives `p` the id `id` in `space`. A permanent's slot takes the object id it gets.
    #[inline]
    pub(super) fn insert(&mut self, p: *const c_void, space: IdSpace, id: u32) {
        // The common case in one look at the slot: its leaf exists and the slot is free.
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get_mut(k / LEAF) {
                let e = &mut leaf[k % LEAF];
                if *e == 0 && id < ID_MASK - 1 {
                    *e = (space as u32) << SPACE_SHIFT | (id + 1);
                    self.touch(k / LEAF);
                    return;
                }
            }
        }
        self.insert_slow(p, space, id);
    }

    /// `insert`, every case.
    #[inline(never)]
    fn insert_slow(&mut self, p: *const c_void, space: IdSpace, id: u32) {
        if let Some(k) = self.key(p) {
            if id < ID_MASK - 1 {
                let i = k / LEAF;
                if i >= self.leaves.len() {
                    self.leaves.resize_with(i + 1, || None);
                }
                let leaf = self.leaves[i].get_or_insert_with(|| Box::new([0; LEAF]));
                let e = &mut leaf[k % LEAF];
                let old = *e >> SPACE_SHIFT;
                if *e == 0
                    || old == space as u32
                    || (old == IdSpace::Perm as u32 && space == IdSpace::Obj)
                {
                    *e = (space as u32) << SPACE_SHIFT | (id + 1);
                    self.touch(i);
                    return;
                }
            }
            self.far_dense = true;
        }
        self.far.insert((p as usize, space), id);
    }

    /// What the object `p` is to the writer: as `get(p, IdSpace::Obj)` then
    /// `get(p, IdSpace::Perm)`, in one look at the slot when it can.
    #[inline]
    pub(super) fn obj_state(&self, p: *const c_void) -> ObjState {
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get(k / LEAF) {
                let e = leaf[k % LEAF];
                if e >> SPACE_SHIFT == IdSpace::Obj as u32 && e != 0 {
                    return ObjState::Written((e & ID_MASK) - 1);
                }
                if !self.far_dense {
                    // Nothing of the table's span is in `far`: the slot says all.
                    return if e != 0 && e >> SPACE_SHIFT == IdSpace::Perm as u32 {
                        ObjState::Permanent
                    } else {
                        ObjState::New
                    };
                }
            }
        }
        match self.get(p, IdSpace::Obj) {
            Some(id) => ObjState::Written(id),
            None if self.get(p, IdSpace::Perm).is_some() => ObjState::Permanent,
            None => ObjState::New,
        }
    }

    /// The id of `p`, or None after giving it `id`.
    #[inline]
    pub(super) fn get_or_insert(
        &mut self,
        p: *const c_void,
        space: IdSpace,
        id: u32,
    ) -> Option<u32> {
        // The common cases in one look at the slot: found, or free (and, with nothing of the
        // table's span in the hash map, not there either).
        if let Some(k) = self.key(p) {
            if let Some(Some(leaf)) = self.leaves.get_mut(k / LEAF) {
                let e = &mut leaf[k % LEAF];
                if *e != 0 && *e >> SPACE_SHIFT == space as u32 {
                    return Some((*e & ID_MASK) - 1);
                }
                if *e == 0 && !self.far_dense && id < ID_MASK - 1 {
                    *e = (space as u32) << SPACE_SHIFT | (id + 1);
                    self.touch(k / LEAF);
                    return None;
                }
            }
        }
        let old = self.get(p, space);
        if old.is_none() {
            self.insert(p, space, id);
        }
        old
    }

    /// Room in the top level for an arena of `bytes`.
    pub(super) fn reserve(&mut self, bytes: usize) {
        self.leaves
            .reserve((bytes / 16 / LEAF).min(DENSE_SPAN / 16 / LEAF));
    }
}

#[cfg(test)]
mod tests {
    use super::{IdMap, IdSpace, ObjState, DENSE_SPAN, ID_MASK, LEAF};
    use std::ffi::c_void;

    const BASE: usize = 0x7000_0000_0000;

    fn at(off: usize) -> *const c_void {
        BASE.wrapping_add(off) as *const c_void
    }

    fn map() -> IdMap {
        let mut m = IdMap::default();
        m.reset(BASE);
        m
    }

    #[test]
    fn ids_in_the_table_keep_their_space() {
        let mut m = map();
        m.insert(at(0), IdSpace::Obj, 0);
        m.insert(at(16), IdSpace::Str, 0);
        m.insert(at(32), IdSpace::Upval, 3);
        m.insert(at(16 * LEAF * 3 + 32), IdSpace::Obj, 7);
        assert_eq!(m.get(at(0), IdSpace::Obj), Some(0));
        assert_eq!(m.get(at(0), IdSpace::Str), None);
        assert_eq!(m.get(at(16), IdSpace::Str), Some(0));
        assert_eq!(m.get(at(16), IdSpace::Obj), None);
        assert!(!m.contains(at(16)));
        assert_eq!(m.get(at(32), IdSpace::Upval), Some(3));
        assert_eq!(m.get(at(32), IdSpace::Obj), None);
        assert_eq!(m.get(at(16 * LEAF * 3 + 32), IdSpace::Obj), Some(7));
        assert_eq!(m.get(at(16 * LEAF * 3 + 48), IdSpace::Obj), None);
        assert_eq!(m.get(at(16 * LEAF * 9), IdSpace::Obj), None);
        assert_eq!(m.get_or_insert(at(64), IdSpace::Str, 5), None);
        assert_eq!(m.get_or_insert(at(64), IdSpace::Str, 6), Some(5));
        assert!(!m.far_dense && m.far.is_empty());
    }

    #[test]
    fn a_permanent_takes_its_object_id() {
        let mut m = map();
        m.insert(at(80), IdSpace::Perm, 0);
        assert_eq!(m.get(at(80), IdSpace::Perm), Some(0));
        assert!(!m.contains(at(80)));
        m.insert(at(80), IdSpace::Obj, 12);
        assert_eq!(m.get(at(80), IdSpace::Obj), Some(12));
        assert_eq!(m.get(at(80), IdSpace::Perm), None);
        // Outside the table (a light C function): both stay, apart.
        let f = 0x1234_5678 as *const c_void;
        m.insert(f, IdSpace::Perm, 0);
        m.insert(f, IdSpace::Obj, 13);
        assert_eq!(m.get(f, IdSpace::Obj), Some(13));
        assert!(!m.far_dense);
    }

    #[test]
    fn reset_forgets_every_identity() {
        let mut m = map();
        m.insert(at(0), IdSpace::Obj, 1);
        m.insert(at(16 * LEAF * 5), IdSpace::Str, 2);
        m.insert(at(8), IdSpace::Obj, 3);
        m.insert(at(32), IdSpace::Obj, ID_MASK - 1);
        assert!(m.far_dense);
        let leaves = m.leaves.iter().flatten().count();
        m.reset(BASE + 16 * LEAF);
        assert_eq!(m.leaves.iter().flatten().count(), leaves, "leaves are kept");
        for p in [at(0), at(16 * LEAF * 5), at(8), at(32), at(16 * LEAF * 6)] {
            assert_eq!(m.get(p, IdSpace::Obj), None);
            assert_eq!(m.get(p, IdSpace::Str), None);
        }
        assert!(!m.far_dense && m.far.is_empty());
        // The new base counts offsets from there.
        m.insert(at(16 * LEAF), IdSpace::Obj, 4);
        assert_eq!(m.get(at(16 * LEAF), IdSpace::Obj), Some(4));
        assert!(m.leaves[0].as_ref().is_some_and(|l| l[0] != 0));
        assert_eq!(m.dirty, (0, 1));
        // Leaf 5 is kept from before: the one-look path writes it and notes it too.
        assert!(m.leaves[5].is_some());
        assert_eq!(m.get_or_insert(at(16 * LEAF * 6), IdSpace::Str, 5), None);
        assert_eq!(m.dirty, (0, 6));
        // The next reset zeroes only the leaves written since this one.
        m.reset(BASE);
        assert_eq!(m.dirty, (usize::MAX, 0));
        assert!(m.leaves.iter().flatten().all(|l| l.iter().all(|&e| e == 0)));
    }

    /// `obj_state` (one look at the slot when it can) says what `get` for an object id, then
    /// for a permanent, says: in the table, in the hash map, before and after the hash map
    /// holds an identity of the table's span.
    #[test]
    fn obj_state_agrees_with_get() {
        let expect = |m: &IdMap, p| match m.get(p, IdSpace::Obj) {
            Some(id) => ObjState::Written(id),
            None if m.get(p, IdSpace::Perm).is_some() => ObjState::Permanent,
            None => ObjState::New,
        };
        let probes = [
            at(0),
            at(16),
            at(32),
            at(48),
            at(64),
            at(8),
            at(16 * LEAF * 7),
            at(DENSE_SPAN),
            0x1234_5678 as *const c_void,
        ];
        let mut m = map();
        m.insert(at(0), IdSpace::Obj, 3);
        m.insert(at(16), IdSpace::Perm, 0);
        m.insert(at(32), IdSpace::Str, 1);
        m.insert(at(8), IdSpace::Perm, 0);
        m.insert(at(DENSE_SPAN), IdSpace::Obj, 4);
        m.insert(0x1234_5678 as *const c_void, IdSpace::Perm, 0);
        assert!(!m.far_dense);
        for p in probes {
            assert_eq!(m.obj_state(p), expect(&m, p), "{p:?}");
        }
        assert_eq!(m.obj_state(at(0)), ObjState::Written(3));
        assert_eq!(m.obj_state(at(16)), ObjState::Permanent);
        assert_eq!(m.obj_state(at(32)), ObjState::New);
        assert_eq!(m.obj_state(at(64)), ObjState::New);
        // The hash map now holds identities of the span: a permanent whose slot a string
        // holds, an object whose id does not fit a slot.
        m.insert(at(32), IdSpace::Perm, 0);
        m.insert(at(48), IdSpace::Obj, ID_MASK - 1);
        assert!(m.far_dense);
        for p in probes {
            assert_eq!(m.obj_state(p), expect(&m, p), "{p:?}");
        }
        assert_eq!(m.obj_state(at(32)), ObjState::Permanent);
        assert_eq!(m.obj_state(at(48)), ObjState::Written(ID_MASK - 1));
        // A permanent that gets its object id.
        m.insert(at(16), IdSpace::Obj, 9);
        assert_eq!(m.obj_state(at(16)), ObjState::Written(9));
    }

    #[test]
    fn identities_the_table_cannot_hold_go_to_the_map() {
        let mut m = map();
        // Not 16-byte aligned (a userdata's memory), below the arena, past the span.
        for (p, id) in [(at(8), 1), (at(usize::MAX - 15), 2), (at(DENSE_SPAN), 3)] {
            m.insert(p, IdSpace::Obj, id);
            assert_eq!(m.get(p, IdSpace::Obj), Some(id));
            assert_eq!(m.get(p, IdSpace::Str), None);
        }
        assert!(!m.far_dense);
        // An id too large for a slot, and a slot another space holds.
        m.insert(at(32), IdSpace::Obj, ID_MASK - 1);
        assert!(m.far_dense);
        assert_eq!(m.get(at(32), IdSpace::Obj), Some(ID_MASK - 1));
        m.insert(at(48), IdSpace::Obj, 4);
        m.insert(at(48), IdSpace::Str, 9);
        assert_eq!(m.get(at(48), IdSpace::Obj), Some(4));
        assert_eq!(m.get(at(48), IdSpace::Str), Some(9));
        m.insert(at(96), IdSpace::Obj, 5);
        m.insert(at(96), IdSpace::Perm, 0);
        assert_eq!(m.get(at(96), IdSpace::Obj), Some(5));
        assert_eq!(m.get(at(64), IdSpace::Obj), None);
    }
}
