//! The batch decoder: runs of plain table entries decoded into steps for
//! `luasnap_table_build` (see `build.rs`), without a trip through the general path for each
//! value.
//!
//! Invariant: every step a batch emits was checked as the general path checks the same bytes
//! (ids below what was defined, string ids below what was read, prototypes already read with
//! the upvalue count they have, size hints charged to the budget, layouts well formed), so the
//! C side only executes steps and checks what needs the built objects (NaN keys, a layout
//! against the entries, metatables). Anything the decoder does not take, malformed bytes
//! included, ends the batch before it with the reader and counters as they were: the general
//! path then reads it and reports what is wrong, so a batch never changes what a file means.

use super::csrc::luasnap_proto_nupvalues;
use super::csrc::{kind, RawVal};
use super::frame::Frame;
use super::limits::{table_sizes, MAX_UPVALUES, STACK_FRAMES};
use super::state::Binding;
use crate::persist::format::{
    layout_nodes, LayoutHeader, Reader, TableHeader, TablePart, Tag, UpvalueRef,
};
use std::collections::HashMap;
use std::ffi::c_void;

/// Steps per `luasnap_table_build` call (an entry needing more goes the general way).
pub(super) const BUILD_OPS: usize = 1024;
/// How deep tables nest within one batch built by `luasnap_table_build`.
pub(super) const PLAIN_DEPTH: usize = 16;
// The build helper tracks every table a batch opens, the one it starts on and its key's
// slot included (csrc/luasnap.h).
const _: () = assert!(PLAIN_DEPTH + 2 <= super::csrc::BUILD_DEPTH);
/// Layout words (node codes and links, plus three per table) one batch may carry; a table
/// with a larger layout ends the batch and the general path places it.
const BATCH_LAYOUT: usize = 1 << 14;

/// Steps a batch's buffer holds: a batch takes no entry once it has `BUILD_OPS` steps, and one
/// entry adds at most its key's step, a closure's steps (its `NEWCLOSURE`, then a value and a
/// `SETUPVAL` for each of at most `MAX_UPVALUES` upvalues) and its `SET` (an end marker adds
/// a `LAYOUT` and a `SET`; a new table its `NEWTABLE` and `META`).
pub(super) const OPS_CAP: usize = BUILD_OPS + 2 * MAX_UPVALUES + 2;

/// How many tables a batch may open with `depth` frames already on the stack: tables opened
/// there become stack frames, which stay below `STACK_FRAMES`.
pub(super) fn nopen_room(depth: usize) -> usize {
    PLAIN_DEPTH.min(STACK_FRAMES.saturating_sub(depth + 1))
}

/// The tag bytes the batch decoder matches on.
const T_NIL: u8 = Tag::Nil as u8;
const T_FALSE: u8 = Tag::False as u8;
const T_TRUE: u8 = Tag::True as u8;
const T_INT: u8 = Tag::Int as u8;
const T_FLOAT: u8 = Tag::Float as u8;
const T_STR: u8 = Tag::Str as u8;
const T_STRREF: u8 = Tag::StrRef as u8;
const T_REF: u8 = Tag::Ref as u8;
const T_LAYOUT: u8 = Tag::Layout as u8;

/// The tables a batch opened and has not ended, outermost first (`tables[..n]`): id, and
/// the index of its `NEWTABLE` step if its size hints were not capped (else its entries may
/// not fit its nodes: it is never placed) and no metatable step named it.
pub(super) struct Open {
    pub tables: [(u32, Option<usize>); PLAIN_DEPTH],
    pub n: usize,
}

impl Open {
    /// No table open.
    pub(super) fn new() -> Self {
        Open {
            tables: [(0, None); PLAIN_DEPTH],
            n: 0,
        }
    }
}

/// How a batch ended (see [`Batch::decode`]).
#[derive(Clone, Copy)]
pub(super) struct BatchEnd {
    /// Where the innermost table (the frame's own if none is open) is; the tables around it
    /// each expect their value (the table they opened).
    pub stage: TablePart,
    /// Whether it stopped because its buffers were full.
    pub full: bool,
}

/// One batch of steps for `luasnap_table_build` being decoded (see `Loader::plain_entries`):
/// a copy of the loader's reader and counters, written back when the batch ends, so the
/// decoding loop keeps them in registers, and a buffer of fixed size for the steps. Decodes
/// booleans, numbers, strings, string references, references to objects already read, nil,
/// new tables and Lua closures of prototypes already read, each checked as the general path
/// checks it; anything else, malformed bytes included, ends the batch before it, with the
/// reader and counters as they were before it (the general path reads it and reports what
/// is wrong).
pub(super) struct Batch<'a, 'b> {
    pub r: Reader<'a>,
    pub ops: &'b mut [RawVal; OPS_CAP],
    /// Steps decoded (`ops[..n]`).
    pub n: usize,
    /// The batch's layouts, `lay[..nlay]` (see `Loader::blay`), their links in `laynx`.
    pub lay: &'b mut Vec<u32>,
    pub laynx: &'b mut Vec<i32>,
    pub nlay: usize,
    pub strs: u32,
    pub next_id: u32,
    pub prealloc_left: u64,
    /// `Loader::own_cap`.
    pub own_cap: Option<u64>,
    /// The general path's frames (tables still open outside the batch).
    pub frames: &'b [Frame],
    /// `Loader::late_meta`.
    pub late_meta: &'b mut Vec<u32>,
    /// `Loader::unlaid`.
    pub unlaid: &'b mut HashMap<u32, bool>,
    pub strref_len: usize,
    pub protos: &'b [*const c_void],
    /// `Rebinding::bindings`: closures of the functions named there (a game's changed chunk)
    /// and shared upvalues while there are any go the general path (`rebind.rs`).
    pub bindings: &'b HashMap<usize, Binding>,
    pub format: u16,
    /// The VM's hash seed (see `place_hint`).
    pub seed: u32,
    /// The node count of the largest layout decoded (0: none), for the scratch.
    pub max_size: u32,
    /// An object id the batch leaves to the general path (`u32::MAX`: none): the globals
    /// table in a load that denies it, which checks where it goes (`Loader::globals_here`).
    pub checked_ref: u32,
    /// Whether shared upvalues go to the general path, which checks them (foreign loads).
    pub checked_joins: bool,
}

impl Batch<'_, '_> {
    /// Appends a step. `n` stays below `OPS_CAP` (see there): the index check never fails.
    #[inline(always)]
    fn push(&mut self, kind: u64, len: u64, bits: u64, s: *const std::ffi::c_char) {
        self.ops[self.n] = RawVal { kind, len, bits, s };
        self.n += 1;
    }

    /// Appends a step.
    #[inline(always)]
    fn push_val(&mut self, v: RawVal) {
        self.push(v.kind, v.len, v.bits, v.s);
    }

    /// Decodes steps until the batch is full or the next item is not one it takes. An entry
    /// is decoded in one trip around the loop (its key, then its value, and for a new table its
    /// metatable), so the innermost table expects a key whenever the loop starts over. The
    /// tables it leaves open are in `open` (none on entry).
    pub(super) fn decode(&mut self, room: usize, open: &mut Open) -> BatchEnd {
        open.n = 0;
        // Whether the layouts fill half their buffer (checked as each is added).
        let mut lay_full = false;
        let (stage, full) = loop {
            if self.n >= BUILD_OPS || lay_full {
                break (TablePart::Key, true);
            }
            let Some(tag) = self.r.peek() else {
                break (TablePart::Key, false);
            };
            if tag == T_NIL || tag == T_LAYOUT {
                if !self.end_table(tag, open, &mut lay_full) {
                    break (TablePart::Key, false);
                }
                continue;
            }
            if let Err(stage) = self.entry(tag, open, room) {
                break (stage, false);
            }
        };
        BatchEnd { stage, full }
    }

    /// An end marker (tag `tag`, next), with the hash part's layout or without: the frame's
    /// own is for the general path (false); the innermost table the batch opened ends, and a
    /// layout is placed by the batch (which then sets the table in its parent) when it can
    /// be, else by the general path (false).
    #[inline(always)]
    fn end_table(&mut self, tag: u8, open: &mut Open, lay_full: &mut bool) -> bool {
        if open.n == 0 {
            return false;
        }
        if tag == T_NIL {
            self.r.pos += 1;
        } else {
            if self.format < 5 {
                return false;
            }
            let Some((size, seed)) = self.layout() else {
                return false;
            };
            *lay_full = self.nlay >= BATCH_LAYOUT / 2;
            let (id, at) = open.tables[open.n - 1];
            // A table not placed is one whose layout may not apply (its size hints capped,
            // another seed or node count): its removed keys go in by insertion.
            if !at.is_some_and(|at| self.place_hint(at, size, seed)) {
                self.unlaid.entry(id).or_insert(false);
            }
        }
        open.n -= 1;
        // The parent got its entry and expects a key.
        self.push(kind::SET, self.r.pos as u64, 0, std::ptr::null());
        true
    }

    /// One entry (its key's tag `tag`, next) of the innermost table: Err with the stage the
    /// batch stops at if it does not take all of it.
    #[inline(always)]
    fn entry(&mut self, tag: u8, open: &mut Open, room: usize) -> Result<(), TablePart> {
        // The key (its step pushed once the value shows whether one step takes both).
        let at = self.r.pos;
        let Some(key) = self.plain(tag) else {
            self.r.pos = at;
            return Err(TablePart::Key);
        };
        // Its value.
        let Some(tag) = self.r.peek() else {
            self.push_val(key);
            return Err(TablePart::Value);
        };
        let at = self.r.pos;
        self.r.pos += 1;
        match self.simple(tag) {
            Some(Some(v)) => {
                self.push_entry(key, v);
                return Ok(());
            }
            Some(None) => {
                self.r.pos = at;
                self.push_val(key);
                return Err(TablePart::Value);
            }
            None => self.r.pos = at,
        }
        self.push_val(key);
        let mark = (at, self.n);
        if tag == Tag::Table as u8 && open.n < room {
            return self.open_table(open, mark);
        }
        let read = if tag == Tag::LClosure as u8 {
            self.closure()
        } else {
            self.plain(tag).map(|v| self.push_val(v))
        };
        if read.is_none() {
            self.unread(mark);
            return Err(TablePart::Value);
        }
        self.push(kind::SET, self.r.pos as u64, 0, std::ptr::null());
        Ok(())
    }

    /// An entry of a plain value: one step with its key when they fit one (the key a string
    /// already read or an integer in 0..2^32).
    #[inline(always)]
    fn push_entry(&mut self, key: RawVal, v: RawVal) {
        let (kk, kb) = (key.kind, key.bits);
        if matches!(kk, kind::STRREF | kind::INT) && kb <= u32::MAX as u64 {
            let k = kind::SETKV | v.kind << 8 | kk << 16 | kb << 32;
            self.push(k, v.len, v.bits, v.s);
        } else {
            self.push_val(key);
            self.push_val(v);
            self.push(kind::SET, self.r.pos as u64, 0, std::ptr::null());
        }
    }

    /// A new table as a value (its tag next; its key's step pushed, `mark` before its
    /// value): opened, with its metatable. Err with the stage the batch stops at.
    #[inline(always)]
    fn open_table(&mut self, open: &mut Open, mark: (usize, usize)) -> Result<(), TablePart> {
        let Some((id, placeable)) = self.new_table() else {
            self.unread(mark);
            return Err(TablePart::Value);
        };
        open.tables[open.n] = (id, placeable);
        open.n += 1;
        // Its metatable.
        let Some(tag) = self.r.peek() else {
            return Err(TablePart::Metatable);
        };
        let at = self.r.pos;
        let Some(mt) = self.plain(tag) else {
            self.r.pos = at;
            return Err(TablePart::Metatable);
        };
        if mt.kind == kind::NIL {
            // No metatable: the new table has none, so its two steps (push nil, set it)
            // would do nothing (most tables: 5,600 of 7,000 in a 1 MB bench load, 15% of
            // the steps).
            return Ok(());
        }
        self.push_val(mt);
        if mt.kind == kind::REF {
            self.metatable_ref(open, mt.bits);
        }
        self.push(kind::META, self.r.pos as u64, 0, std::ptr::null());
        Ok(())
    }

    /// The innermost open table's metatable is the object `mt`. A table still open in this
    /// batch given as a metatable is not placed: until its layout step, its entries sit in
    /// nodes unhashed, and setting a metatable looks `__gc` up in it (the finalizer check and
    /// mark), as the collector looks up `__mode` and caches what it did not find. Found by an
    /// independent attacker: a class whose instance is among its own entries lost its
    /// finalizer. (Placement is decided when the table ends: dropping its step index here
    /// keeps it a plain NEWTABLE.)
    #[inline(always)]
    fn metatable_ref(&mut self, open: &mut Open, mt: u64) {
        let mut open_mt = false;
        for o in open.tables[..open.n]
            .iter_mut()
            .filter(|o| o.0 as u64 == mt)
        {
            o.1 = None;
            open_mt = true;
        }
        // A metatable still being built may get its __gc after this step: the table's
        // finalizer is checked again when the load ends.
        if open_mt
            || self
                .frames
                .iter()
                .any(|f| matches!(f, Frame::Table { id, .. } if *id as u64 == mt))
        {
            self.late_meta.push(open.tables[open.n - 1].0);
        }
    }

    /// The step of a boolean, number, string or string reference whose tag `tag` was just
    /// read: `Some(None)` if its payload is malformed, `None` for another tag. Counts the
    /// string id a new string takes.
    #[inline(always)]
    fn simple(&mut self, tag: u8) -> Option<Option<RawVal>> {
        let null = std::ptr::null();
        let (kind, bits, len, s) = match tag {
            T_FALSE => (kind::FALSE, 0, 0, null),
            T_TRUE => (kind::TRUE, 0, 0, null),
            T_INT => match self.r.i64() {
                Some(i) => (kind::INT, i as u64, 0, null),
                None => return Some(None),
            },
            T_FLOAT => match self.r.u64() {
                Some(b) => (kind::FLOAT, b, 0, null),
                None => return Some(None),
            },
            T_STR => {
                let Some(b) = self.r.bytes() else {
                    return Some(None);
                };
                let sid = if b.len() >= self.strref_len {
                    self.strs += 1;
                    self.strs as u64
                } else {
                    0
                };
                (kind::STR, sid, b.len() as u64, b.as_ptr().cast())
            }
            T_STRREF => match self.r.varint() {
                Some(sid) if sid < self.strs as u64 => (kind::STRREF, sid + 1, 0, null),
                _ => return Some(None),
            },
            _ => return None,
        };
        Some(Some(RawVal { kind, len, bits, s }))
    }

    /// Decodes one item at the reader, whose tag is `tag`, into its step (not pushed): a
    /// boolean, number, string, string reference, nil or a reference to an object already
    /// read. None, having counted no string, for anything else.
    #[inline(always)]
    fn plain(&mut self, tag: u8) -> Option<RawVal> {
        let at = self.r.pos;
        self.r.pos += 1;
        let v = match self.simple(tag) {
            Some(v) => v?,
            None if tag == T_NIL => RawVal {
                kind: kind::NIL,
                ..RawVal::EMPTY
            },
            None if tag == T_REF => {
                let id = self.r.varint()?;
                if id >= self.next_id as u64 || id == self.checked_ref as u64 {
                    return None;
                }
                RawVal {
                    kind: kind::REF,
                    len: at as u64,
                    bits: id,
                    s: std::ptr::null(),
                }
            }
            None => return None,
        };
        Some(v)
    }

    /// Decodes a new table's header (its tag next) into a `NEWTABLE` step, charging its size
    /// hints. Returns its id and whether it may be placed (its hints were not cut: see
    /// [`Open`]), as the index of its step.
    #[inline(always)]
    fn new_table(&mut self) -> Option<(u32, Option<usize>)> {
        self.r.pos += 1;
        let TableHeader { narr, nhash } = TableHeader::decode(&mut self.r).ok()?;
        let (narr, nhash, capped) = table_sizes(
            self.r.remaining(),
            self.own_cap,
            &mut self.prealloc_left,
            narr,
            nhash,
        );
        let id = self.next_id;
        self.next_id += 1;
        self.push(
            kind::NEWTABLE,
            (narr as u64) << 32 | nhash as u64,
            id as u64,
            std::ptr::null(),
        );
        Some((id, (!capped).then_some(self.n - 1)))
    }

    /// Decodes a Lua closure (its tag next) of a prototype already read, whose upvalues are
    /// plain items or shared, into its steps.
    fn closure(&mut self) -> Option<()> {
        self.r.pos += 1;
        let index = usize::try_from(self.r.varint()?).ok()?;
        if !self.bindings.is_empty() && self.bindings.contains_key(&index) {
            return None;
        }
        let p = *self.protos.get(index)?;
        let n = self.r.varint()?;
        // SAFETY: p is a prototype of this VM, kept alive for the load (anchored in protos).
        if n > MAX_UPVALUES as u64 || n != unsafe { luasnap_proto_nupvalues(p) } as u64 {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.push(
            kind::NEWCLOSURE,
            id as u64,
            p as usize as u64,
            std::ptr::null(),
        );
        for i in 1..=n {
            let tag = self.r.u8()?;
            if tag == Tag::UpvalNew as u8 {
                let v = self.plain(self.r.peek()?)?;
                self.push_val(v);
                self.push(kind::SETUPVAL, 0, i, std::ptr::null());
            } else if tag == Tag::UpvalRef as u8 && !self.checked_joins && self.bindings.is_empty()
            {
                let UpvalueRef {
                    closure: other,
                    index,
                } = UpvalueRef::decode(&mut self.r).ok()?;
                if other >= self.next_id as u64 || index > u32::MAX as u64 {
                    return None;
                }
                self.push(kind::JOINUPVAL, i << 32 | index, other, std::ptr::null());
            } else {
                return None;
            }
        }
        Some(())
    }

    /// Decodes the layout at the reader (its `Tag::Layout` next) into `lay`/`laynx` for a
    /// `kind::LAYOUT` step, which it pushes; returns the layout's node count and hash seed.
    /// None, with the reader and the batch's layouts where they were, for what the general
    /// path must place or report: a layout with removed keys, one too large for the batch, or
    /// malformed bytes.
    fn layout(&mut self) -> Option<(u32, u32)> {
        let mark = self.r.pos;
        let done = self.layout_inner(mark);
        if done.is_none() {
            self.r.pos = mark;
        }
        done
    }

    fn layout_inner(&mut self, mark: usize) -> Option<(u32, u32)> {
        self.r.pos += 1; // the tag
        let blob = self.r.bytes()?;
        let mut r = Reader::new(blob);
        let LayoutHeader {
            seed,
            size,
            lastfree,
        } = LayoutHeader::decode(&mut r, blob.len())?;
        let off = self.nlay;
        let end = off + 3 + size as usize;
        if end > BATCH_LAYOUT {
            return None;
        }
        if self.lay.len() < end {
            // Grown as batches need it (up to BATCH_LAYOUT words), never shrunk.
            let len = end.next_power_of_two().min(BATCH_LAYOUT);
            self.lay.resize(len, 0);
            self.laynx.resize(len, 0);
        }
        let (codes, links) = (&mut self.lay[off..end], &mut self.laynx[off..end]);
        codes[..3].copy_from_slice(&[size, lastfree, seed]);
        links[..3].copy_from_slice(&[0; 3]);
        if layout_nodes(r, size, &mut codes[3..], &mut links[3..]) != Some(blob.len()) {
            return None;
        }
        self.nlay = end;
        self.max_size = self.max_size.max(size);
        self.push(kind::LAYOUT, mark as u64, off as u64, std::ptr::null());
        Some((size, seed))
    }

    /// After `layout` pushed the `LAYOUT` step (node count `size`, hash seed `seed`) of the
    /// table whose `NEWTABLE` step is `ops[at]`: marks the table as placed
    /// (`kind::NEWTABLE_PLACED`: its entries go into its nodes unhashed, and the layout step
    /// moves them) when the layout will apply, i.e. it was saved under this VM's hash seed for
    /// a hash part of the table's node count (a layout that does not apply leaves the table as
    /// its insertions built it, which a placed table cannot be). The C side checks the layout
    /// against the entries as for any table.
    /// Returns whether it did.
    fn place_hint(&mut self, at: usize, size: u32, seed: u32) -> bool {
        let op = &mut self.ops[at];
        let nhash = op.len & 0xffff_ffff;
        let placed = op.kind == kind::NEWTABLE
            && seed == self.seed
            && nhash > 0
            && nhash.next_power_of_two() == size as u64;
        if placed {
            op.kind = kind::NEWTABLE_PLACED;
        }
        placed
    }

    /// Back to `mark` (reader position, step count): drops the steps from there on, and the
    /// string and object ids and preallocation they took. (Counting them here keeps the
    /// decoding loop from saving the counters before every item.)
    #[inline(always)]
    fn unread(&mut self, mark: (usize, usize)) {
        let (pos, len) = (mark.0, mark.1.min(self.n));
        // By value: the batch stays in registers.
        let (strs, ids, prealloc) = taken(&self.ops[len..self.n]);
        self.strs -= strs;
        self.next_id -= ids;
        self.prealloc_left += prealloc;
        self.n = len;
        self.r.pos = pos;
    }
}

/// The string ids, object ids and preallocation units the steps `ops` took (see
/// `Batch::unread`).
#[cold]
#[inline(never)]
fn taken(ops: &[RawVal]) -> (u32, u32, u64) {
    let (mut strs, mut ids, mut prealloc) = (0, 0, 0);
    for op in ops {
        let value_kind = if op.kind & 0xff == kind::SETKV {
            op.kind >> 8 & 0xff
        } else {
            op.kind
        };
        match value_kind {
            kind::STR if op.bits != 0 => strs += 1,
            kind::NEWTABLE | kind::NEWTABLE_PLACED => {
                ids += 1;
                // Its hints are charged again when the general path reads it.
                prealloc += (op.len >> 32) + 2 * (op.len & 0xffff_ffff);
            }
            kind::NEWCLOSURE => ids += 1,
            _ => {}
        }
    }
    (strs, ids, prealloc)
}

#[cfg(test)]
mod tests {
    use super::{kind, Batch, RawVal, Reader, MAX_UPVALUES, OPS_CAP};
    use crate::bridge::vm::Vm;
    use crate::persist::format::{Scalar, Tag, Writer};
    use crate::persist::options::Trust;
    use crate::Value;

    /// The step the batch decodes for a value, as `Scalar::decode` reads it (the shared
    /// decoder the batch's own is kept to): the same value, or both refuse it. Two strings and
    /// two objects are defined.
    #[test]
    fn batched_values_decode_as_the_format_says() {
        let samples: [Scalar<&[u8]>; 11] = [
            Scalar::Nil,
            Scalar::False,
            Scalar::True,
            Scalar::Int(-1),
            Scalar::Int(i64::MIN),
            Scalar::Float(2.5f64.to_bits()),
            Scalar::Str(b"key"),
            Scalar::Str(b""),
            Scalar::StrRef(1),
            Scalar::StrRef(2),
            Scalar::Ref(1),
        ];
        let mut ops = Box::new([RawVal::EMPTY; OPS_CAP]);
        let (mut lay, mut laynx, mut late) = (Vec::new(), Vec::new(), Vec::new());
        let bindings = std::collections::HashMap::new();
        for v in samples {
            let mut w = Writer::default();
            v.encode(&mut w);
            for cut in [0, 1].into_iter().filter(|&c| c < w.buf.len()) {
                let bytes = &w.buf[..w.buf.len() - cut];
                let mut b = Batch {
                    r: Reader::new(bytes),
                    ops: &mut ops,
                    n: 0,
                    lay: &mut lay,
                    laynx: &mut laynx,
                    nlay: 0,
                    strs: 2,
                    next_id: 2,
                    prealloc_left: 0,
                    own_cap: None,
                    frames: &[],
                    late_meta: &mut late,
                    unlaid: &mut std::collections::HashMap::new(),
                    strref_len: 1,
                    protos: &[],
                    bindings: &bindings,
                    format: 5,
                    seed: 0,
                    max_size: 0,
                    checked_ref: u32::MAX,
                    checked_joins: false,
                };
                let got = b
                    .plain(bytes[0])
                    .map(|op| (op.kind, op.bits, op.len, b.r.pos));
                let mut r = Reader::new(bytes);
                r.pos = 1;
                let tag = Tag::from_u8(bytes[0]).unwrap();
                let want = Scalar::decode(tag, &mut r).ok().and_then(|d| {
                    let (k, bits, len) = match d {
                        Scalar::Nil => (kind::NIL, 0, 0),
                        Scalar::False => (kind::FALSE, 0, 0),
                        Scalar::True => (kind::TRUE, 0, 0),
                        Scalar::Int(i) => (kind::INT, i as u64, 0),
                        Scalar::Float(f) => (kind::FLOAT, f, 0),
                        // A new string of at least `strref_len` bytes takes string id 3.
                        Scalar::Str(b) => (kind::STR, if b.is_empty() { 0 } else { 3 }, b.len()),
                        Scalar::StrRef(sid) if sid < 2 => (kind::STRREF, sid + 1, 0),
                        Scalar::Ref(id) if id < 2 => (kind::REF, id, 0),
                        _ => return None,
                    };
                    Some((k, bits, len as u64, r.pos))
                });
                assert_eq!(got, want, "{v:?} cut by {cut}");
            }
        }
    }

    /// `make(seed)`: a closure with Lua's most upvalues (255: 150 locals of one function, 105
    /// of an inner one). `R[2]`: a table of integers and such closures, with runs of 600 and
    /// 1023 integers between them, so that batches come to start a run (after a closure that
    /// filled one) and a closure starts at step 1023 of a batch and fills its buffer to the
    /// end. (`R[1]` brings the prototype first: a closure whose prototype is new goes the
    /// general way.)
    fn wide_closures() -> String {
        let (outer, inner) = (150, MAX_UPVALUES - 150);
        let names = |p: &str, n: usize| (1..=n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        let vals = |n: usize| (1..=n).map(|i| format!("seed * {i}")).collect::<Vec<_>>();
        let (a, b) = (names("a", outer), names("b", inner));
        let sum = a.iter().chain(&b).cloned().collect::<Vec<_>>().join(" + ");
        format!(
            "local function make(seed)\n local {} = {}\n return (function()\n local {} = {}\n \
             return function() return {sum} end\n end)()\nend\n\
             R = {{ make(0) }}\n local t, n = {{}}, 0\n\
             local function add(v) n = n + 1 t[n] = v end\n\
             add(make(1))\n\
             for k = 1, 6 do\n\
               for _ = 1, 600 do add(n) end add(make(k))\n\
               for _ = 1, 1023 do add(n) end add(make(k + 100))\n\
             end\n\
             R[2] = t\n\
             function total(r) local s = r[1]() for _, v in ipairs(r[2]) do \
             s = s + (type(v) == 'function' and v() or v) end return s end",
            a.join(", "),
            vals(outer).join(", "),
            b.join(", "),
            vals(inner).join(", ")
        )
    }

    #[test]
    fn closures_with_the_most_upvalues_fill_a_batch_to_its_end() {
        let mut vm = Vm::builder().capacity(256 << 20).build().unwrap();
        vm.exec(wide_closures(), "=wide").unwrap();
        let want = vm.exec("return total(R)", "=total").unwrap();
        let bytes = vm.persist("R").unwrap();
        vm.unpersist(&bytes, "R2", Trust::Own).unwrap();
        assert_eq!(vm.exec("return total(R2)", "=total").unwrap(), want);
        // Each closure kept its own upvalues: seed * (1 + .. + 150 + 1 + .. + 105).
        let (o, i) = (150, MAX_UPVALUES as i64 - 150);
        assert_eq!(
            vm.exec(
                "local c = R2[2][1 + 601] R2 = nil return c(), R[2][602]()",
                "=own"
            )
            .unwrap(),
            vec![Value::Integer(o * (o + 1) / 2 + i * (i + 1) / 2); 2]
        );
    }
}
