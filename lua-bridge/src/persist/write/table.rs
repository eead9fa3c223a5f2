//! Tables: the header (array and hash sizes), the metatable, the entries, then the layout of
//! the hash part (`layout.rs`).
//!
//! Entries go two ways. A scan (`luasnap_table_scan`) describes a batch of entries without
//! pushing them; an entry whose key and value are plain (primitives, strings, objects written
//! already), or whose value is a new table or a Lua closure with plain upvalues, is written
//! straight from the description: a new table by a frame of its own opened on top of this
//! one, the rest of the batch kept for when it is done. Any other entry goes the general way:
//! pushed (`luasnap_table_next`) and written by `Persister::value`.
//!
//! A table frame that opens a child table or ends goes on with the new top frame here, while
//! that is a table, without a return to the dispatcher for each table.

use super::super::format::{Ident, TableHeader, TablePart};
use super::super::slots::Slots;
use super::csrc::{
    kind, luasnap_final_state, luasnap_identity, luasnap_meta_has, luasnap_push_metatable,
    luasnap_table_entry, luasnap_table_info, luasnap_table_next, luasnap_table_scan, ScanEntry,
};
use super::frame::{Frame, Seg, TableFrame, TableStep};
use super::ids::{IdSpace, ObjState};
use super::persister::{Fail, Persister};
use super::plain::{full_val, identity, is_obj, is_prim, Class, Plain};
use super::scratch::SCAN_BATCH;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

/// Scanned entries kept for tables waiting on a child (see [`TableFrame`]); past this many,
/// a table opening a child drops the rest of its batch and scans it again later, so deep
/// nesting costs no more memory than a frame each.
const SCAN_KEEP: usize = 1 << 15;

/// A table's sizes and metatable, as its header gives them.
#[derive(Clone, Copy)]
pub(super) struct TableInfo {
    narr: u32,
    nhash: u32,
    /// Null if none.
    mt: *const c_void,
}

/// The sizes and metatable of the table `t`.
///
/// # Safety
/// `t` is a live table.
#[inline(always)]
unsafe fn table_info(t: *const c_void) -> TableInfo {
    let (mut narr, mut nhash, mut mt) = (0u32, 0u32, std::ptr::null());
    // SAFETY: callers' contract; no key, so no lookup; reads only.
    unsafe { luasnap_table_info(t, std::ptr::null(), &mut narr, &mut nhash, &mut mt) };
    TableInfo { narr, nhash, mt }
}

impl TableStep {
    const METATABLE: TableStep = TableStep {
        part: TablePart::Metatable,
        key: std::ptr::null(),
    };
    const ENTRIES: TableStep = TableStep {
        part: TablePart::Key,
        key: std::ptr::null(),
    };

    fn value(key: *const c_void) -> TableStep {
        TableStep {
            part: TablePart::Value,
            key,
        }
    }
}

impl TableFrame {
    /// The table and the position of the entry being written, if one is.
    pub(super) fn entry_being_written(&self) -> Option<(*const c_void, u32)> {
        self.pos.checked_sub(1).map(|at| (self.t, at))
    }
}

/// A new table met in an entry, to open on top of its parent.
struct Opening {
    t: *const c_void,
    info: TableInfo,
    /// The parent's step once the child is done: on with its entries, or (the key is the
    /// child) the entry's value.
    parent: TableStep,
}

/// What became of a scanned entry.
enum Scanned {
    /// Written whole.
    Written,
    /// Its key written (or the key is the table), a new table to open.
    Opens(Opening),
    /// For the general path.
    General,
}

/// What became of an entry that went the general way.
enum GeneralEntry {
    Written,
    /// Its key or value is an object whose contents have a frame on top.
    Pushed,
    /// No entry there (cannot happen: it was just scanned): the table ends.
    Gone,
}

/// How the entries loop left its table.
enum Left {
    /// A child table's frame is on top.
    Opened,
    /// The general path pushed a frame for an object's contents.
    Pushed,
    /// Every entry and the layout written, the frame popped.
    Done,
}

/// Where the entries loop stands in its table and its batch.
struct Cursor {
    /// The position after the last entry written (where a scan resumes).
    at: u32,
    /// The next scanned entry, and the end of the batch, in `Scratch::scan`.
    i: usize,
    end: usize,
    /// Whether the last scan reached the table's end (it stops early only when the batch is
    /// full): then no scan after it.
    exhausted: bool,
}

impl Persister<'_> {
    /// Writes the table `t` on top (anchored as `id`): through its `__persist` if its
    /// metatable has one, else its header, with a frame for the rest.
    ///
    /// # Safety
    /// Protected, with the table on top (left there), anchored.
    pub(super) unsafe fn table(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        t: *const c_void,
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract (may call the table's __persist function).
        if unsafe { self.special(L, s, id)? } {
            return Ok(());
        }
        // SAFETY: t is the live table on top.
        let info = unsafe { table_info(t) };
        // SAFETY: t is the live table on top; nothing runs meanwhile.
        unsafe { self.table_header(L, t, info) };
        Ok(())
    }

    /// Writes a table's finalization mark, header and (if nil or written already) its
    /// metatable, and pushes the frame for the rest.
    ///
    /// # Safety
    /// `t` is a live table (a table on top, or one a fresh scan described) of `L`'s VM.
    #[inline(always)]
    unsafe fn table_header(&mut self, L: *mut lua_State, t: *const c_void, info: TableInfo) {
        // SAFETY: callers' contract; reads the table's mark and its metatable's __gc.
        unsafe { self.final_record(L, t, luasnap_final_state(L, t)) };
        // SAFETY: callers' contract.
        Ident(unsafe { luasnap_identity(t) }).encode(&mut self.w);
        let header = TableHeader {
            narr: info.narr as u64,
            nhash: info.nhash as u64,
        };
        header.encode(&mut self.w);
        // The metatable comes first: written here when it is nil or already written (the
        // common case: shared metatables), else by the frame.
        let mut step = TableStep::METATABLE;
        if info.mt.is_null() {
            Plain::Nil.encode(&mut self.w);
            step = TableStep::ENTRIES;
        } else if let Some(mid) = self.sc.refs.get(info.mt, IdSpace::Obj) {
            Plain::Ref(mid as u64).encode(&mut self.w);
            step = TableStep::ENTRIES;
        }
        let floor = self.sc.scan.len() as u32;
        self.sc.frames.push(Frame::Table(TableFrame {
            t,
            step,
            pos: 0,
            floor,
            lo: floor,
            hi: floor,
            gen: self.scan_gen,
        }));
    }

    /// For a scanned table `t` not written yet (its id looked up), that can be written by
    /// identity, without pushing it (not a permanent, no special persistence): records it
    /// (a new id, anchored later) and returns its sizes and metatable for `table_header`.
    ///
    /// # Safety
    /// **Fresh**: `t` was described by a scan and no Lua code ran since.
    unsafe fn unseen_table_info(&mut self, t: *const c_void) -> Option<TableInfo> {
        if self.is_permanent(t) {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_table_info(t) }
    }

    /// `unseen_table_info` for a table known not to be a permanent.
    ///
    /// # Safety
    /// As for `unseen_table_info`.
    #[inline]
    unsafe fn new_table_info(&mut self, t: *const c_void) -> Option<TableInfo> {
        // SAFETY: t is a live table (callers' contract).
        let info = unsafe { table_info(t) };
        // SAFETY: t's metatable is live; nothing ran since t was described.
        if !info.mt.is_null() && unsafe { self.meta_has_spkey(info.mt) } {
            return None;
        }
        self.record(t);
        Some(info)
    }

    /// Whether the metatable `mt` (of a table being written) has the special-persistence key.
    /// The last answer is kept: tables of one class share their metatable, and no metatable
    /// changes until Lua code runs (`anchor` forgets it).
    ///
    /// # Safety
    /// `mt` is a live table; no Lua code ran since the table that has it was described.
    #[inline]
    unsafe fn meta_has_spkey(&mut self, mt: *const c_void) -> bool {
        if mt != self.last_meta.0 {
            // SAFETY: mt is a live table (callers' contract), spkey_str a live string
            // (anchored in the strings table).
            let has = unsafe { luasnap_meta_has(mt, self.spkey_str) } != 0;
            self.last_meta = (mt, has);
        }
        self.last_meta.1
    }

    /// Moves the table frame on top on by one child: its metatable, the value of an entry
    /// whose key was written, or its entries until one needs a frame; then on with the tables
    /// it opens and back to those it completes, while the top frame is a table.
    ///
    /// # Safety
    /// Protected; the frames' tables are alive (**Alive**).
    pub(super) unsafe fn advance_table(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        loop {
            let depth = self.sc.frames.len();
            let Some(Frame::Table(f)) = self.sc.frames.last_mut() else {
                return Ok(());
            };
            self.sc.segs.truncate(depth - 1);
            let t = f.t;
            match f.step.part {
                TablePart::Metatable => {
                    f.step = TableStep::ENTRIES;
                    self.sc.segs.push(Seg::Meta);
                    // SAFETY: Room; t is alive.
                    unsafe { luasnap_push_metatable(L, t) };
                    // SAFETY: Protected, with the metatable on top.
                    return unsafe { self.value(L, s) };
                }
                TablePart::Value => {
                    let key = f.step.key;
                    f.step = TableStep::ENTRIES;
                    let at = f.pos - 1;
                    self.sc.segs.push(Seg::Key);
                    // SAFETY: Protected; t is alive and its entry at `at` had the key `key`.
                    return unsafe { self.entry_value(L, s, t, at, key) };
                }
                TablePart::Key => {
                    // SAFETY: Protected; the table frame on top is at `depth`.
                    match unsafe { self.entries(L, s, depth)? } {
                        Left::Opened | Left::Done => {}
                        Left::Pushed => return Ok(()),
                    }
                }
            }
        }
    }

    /// Writes the value of the entry at position `at` of the table `t`, whose key, the
    /// object `key`, has been written.
    ///
    /// # Safety
    /// Protected; `t` is alive.
    unsafe fn entry_value(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        t: *const c_void,
        at: u32,
        key: *const c_void,
    ) -> Result<(), Fail> {
        // The entry must still be the key just written: a __persist function may have changed
        // this table meanwhile.
        // SAFETY: Room; t is alive; the key pushed is popped.
        let same = unsafe {
            luasnap_table_entry(L, t, at, 0) != 0 && {
                let p = ffi::lua_topointer(L, -1);
                ffi::lua_pop(L, 1);
                p == key
            }
        };
        // SAFETY: Room; t is alive; pushes the entry's value.
        if !same || unsafe { luasnap_table_entry(L, t, at, 1) } == 0 {
            let what = "a table changed while it was being persisted (by a __persist function?)"
                .to_string();
            return Err(self.fail(L, what));
        }
        // SAFETY: Protected, with the value on top.
        unsafe { self.value(L, s) }
    }

    /// Writes the entries of the table frame on top (at `depth`) from its position on, until
    /// one opens a child table or goes into an object's contents, or the table ends (then
    /// its layout too, and pops the frame).
    ///
    /// # Safety
    /// Protected; the frame's table is alive.
    #[inline(always)]
    unsafe fn entries(&mut self, L: *mut lua_State, s: Slots, depth: usize) -> Result<Left, Fail> {
        self.sc.segs.push(Seg::Key);
        let Some(&Frame::Table(f)) = self.sc.frames.last() else {
            unreachable!("the dispatcher calls this for a table frame");
        };
        let floor = f.floor as usize;
        let mut cur = Cursor {
            at: f.pos,
            i: f.lo as usize,
            end: f.hi as usize,
            exhausted: false,
        };
        if f.gen != self.scan_gen || cur.end > self.sc.scan.len() {
            cur.i = cur.end; // stale: scan again from `pos`
        }
        loop {
            // SAFETY: f.t is alive (callers' contract).
            if cur.i >= cur.end && !unsafe { self.scan_batch(L, f.t, floor, &mut cur) } {
                break;
            }
            let e = self.sc.scan[cur.i];
            cur.i += 1;
            // SAFETY: Fresh: the batch was scanned under the current scan_gen.
            let opening = match unsafe { self.scanned_entry(&e) } {
                Scanned::Written => {
                    cur.at = e.pos;
                    continue;
                }
                Scanned::Opens(o) => Some(o),
                Scanned::General => None,
            };
            self.keep_batch(floor, &mut cur, e.pos);
            if let Some(o) = opening {
                // A new table's frame goes on top: this one goes on after it.
                if let Some(Frame::Table(f)) = self.sc.frames.last_mut() {
                    f.step = o.parent;
                }
                // SAFETY: Fresh: o.t was described by the batch scanned under scan_gen.
                unsafe { self.table_header(L, o.t, o.info) };
                return Ok(Left::Opened);
            }
            // SAFETY: Protected; f.t is alive.
            match unsafe { self.general_entry(L, s, depth, f.t, &mut cur)? } {
                GeneralEntry::Written => {}
                GeneralEntry::Pushed => return Ok(Left::Pushed),
                GeneralEntry::Gone => break,
            }
        }
        self.sc.scan.truncate(floor);
        // SAFETY: f.t is alive; nothing runs meanwhile.
        unsafe { self.end_table(L, f.t) };
        self.sc.frames.pop();
        Ok(Left::Done)
    }

    /// Scans the next batch of the table `t`'s entries, from `cur.at` on, into
    /// `Scratch::scan` from `floor` on. False if there are none (or the last scan reached
    /// the table's end).
    ///
    /// # Safety
    /// `t` is alive.
    #[inline(always)]
    unsafe fn scan_batch(
        &mut self,
        L: *mut lua_State,
        t: *const c_void,
        floor: usize,
        cur: &mut Cursor,
    ) -> bool {
        if cur.exhausted {
            return false;
        }
        let scan = &mut self.sc.scan;
        scan.truncate(floor);
        scan.reserve(SCAN_BATCH);
        // SAFETY: room for SCAN_BATCH entries past `floor`; t is alive; reads only.
        let n = unsafe {
            let out = scan.as_mut_ptr().add(floor);
            luasnap_table_scan(L, t, cur.at, out, SCAN_BATCH as c_int)
        } as usize;
        if n == 0 {
            return false;
        }
        // SAFETY: the C side filled every field of the `n` entries it returned (plain data).
        unsafe { scan.set_len(floor + n) };
        (cur.i, cur.end) = (floor, floor + n);
        cur.exhausted = n < SCAN_BATCH;
        true
    }

    /// Writes a scanned entry straight from its description if it can (see the module docs).
    ///
    /// # Safety
    /// **Fresh**: `e` was scanned and no Lua code ran since.
    #[inline(always)]
    unsafe fn scanned_entry(&mut self, e: &ScanEntry) -> Scanned {
        let (kk, vk) = (e.kkind as u64, e.vkind as u64);
        if !is_prim(kk) {
            // SAFETY: callers' contract.
            return unsafe { self.object_key_entry(e) };
        }
        // The usual key (a primitive or a string): the value decides, with one look at its id
        // slot if an object.
        if is_prim(vk) {
            // SAFETY: callers' contract.
            unsafe {
                self.write_scanned(kk, e.kbits);
                self.write_scanned(vk, e.vbits);
            }
            return Scanned::Written;
        }
        if !is_obj(vk) {
            return Scanned::General;
        }
        let v = identity(e.vbits);
        match self.sc.refs.obj_state(v) {
            ObjState::Written(id) => {
                // SAFETY: Fresh (callers' contract).
                unsafe { self.write_scanned(kk, e.kbits) };
                Plain::Ref(id as u64).encode(&mut self.w);
                Scanned::Written
            }
            // SAFETY: Fresh (callers' contract); v is not a permanent.
            ObjState::New if vk == kind::TABLE => match unsafe { self.new_table_info(v) } {
                Some(info) => {
                    // SAFETY: Fresh (callers' contract).
                    unsafe { self.write_scanned(kk, e.kbits) };
                    Scanned::Opens(Opening {
                        t: v,
                        info,
                        parent: TableStep::ENTRIES,
                    })
                }
                None => Scanned::General,
            },
            // SAFETY: Fresh (callers' contract); v is neither written nor a permanent.
            ObjState::New => match unsafe { self.closure_info_scanned(vk, v) } {
                Some(info) => {
                    // SAFETY: Fresh; closure_info_scanned just described v.
                    unsafe {
                        self.write_scanned(kk, e.kbits);
                        self.write_closure(v, info);
                    }
                    Scanned::Written
                }
                None => Scanned::General,
            },
            ObjState::Permanent => Scanned::General,
        }
    }

    /// `scanned_entry` for an entry whose key is an object (or else): described in full.
    ///
    /// # Safety
    /// As for `scanned_entry`.
    #[inline]
    unsafe fn object_key_entry(&mut self, e: &ScanEntry) -> Scanned {
        let (kk, vk) = (e.kkind as u64, e.vkind as u64);
        // SAFETY: callers' contract.
        let (ek, ev) = unsafe { (full_val(kk, e.kbits), full_val(vk, e.vbits)) };
        let kclass = self.classify(&ek);
        match kclass {
            Class::Plain | Class::Written(_) => {}
            Class::Unwritten if kk == kind::TABLE => {
                let k = identity(e.kbits);
                // SAFETY: callers' contract.
                return match unsafe { self.unseen_table_info(k) } {
                    Some(info) => Scanned::Opens(Opening {
                        t: k,
                        info,
                        parent: TableStep::value(k),
                    }),
                    None => Scanned::General,
                };
            }
            Class::Unwritten | Class::Other => return Scanned::General,
        }
        let v = identity(e.vbits);
        match self.classify(&ev) {
            vclass @ (Class::Plain | Class::Written(_)) => {
                // SAFETY: Fresh (callers' contract).
                unsafe {
                    self.write_classified(&ek, kclass);
                    self.write_classified(&ev, vclass);
                }
                Scanned::Written
            }
            // SAFETY: Fresh (callers' contract).
            Class::Unwritten if vk == kind::TABLE => match unsafe { self.unseen_table_info(v) } {
                Some(info) => {
                    // SAFETY: Fresh (callers' contract).
                    unsafe { self.write_classified(&ek, kclass) };
                    Scanned::Opens(Opening {
                        t: v,
                        info,
                        parent: TableStep::ENTRIES,
                    })
                }
                None => Scanned::General,
            },
            // SAFETY: Fresh (callers' contract).
            Class::Unwritten => match unsafe { self.closure_info(vk, v) } {
                Some(info) => {
                    // SAFETY: Fresh; closure_info just described v.
                    unsafe {
                        self.write_classified(&ek, kclass);
                        self.write_closure(v, info);
                    }
                    Scanned::Written
                }
                None => Scanned::General,
            },
            Class::Other => Scanned::General,
        }
    }

    /// Before the table frame on top waits on a child or goes the general way: stores its
    /// position (`pos`, after the entry at hand) and what of its batch is left, or drops the
    /// batch if nothing is left or too much is kept already.
    #[inline(always)]
    fn keep_batch(&mut self, floor: usize, cur: &mut Cursor, pos: u32) {
        if cur.i == cur.end || self.sc.scan.len() > SCAN_KEEP {
            self.sc.scan.truncate(floor);
            (cur.i, cur.end) = (floor, floor);
            cur.exhausted = false;
        }
        let gen = self.scan_gen;
        if let Some(Frame::Table(f)) = self.sc.frames.last_mut() {
            (f.pos, f.lo, f.hi, f.gen) = (pos, cur.i as u32, cur.end as u32, gen);
        }
    }

    /// Writes the entry after `cur.at` of the table `t` (the frame at `depth`, on top) the
    /// general way: pushed, then key and value written by `value`. Either may open a frame for
    /// an object's contents (then the table waits on it), or run Lua code (a `__persist`
    /// function: then the batch is stale).
    ///
    /// # Safety
    /// Protected; `t` is alive.
    unsafe fn general_entry(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        depth: usize,
        t: *const c_void,
        cur: &mut Cursor,
    ) -> Result<GeneralEntry, Fail> {
        let gen = self.scan_gen;
        // SAFETY: Room for the two values; t is alive.
        let base = unsafe {
            let base = ffi::lua_gettop(L);
            if luasnap_table_next(L, t, &mut cur.at) == 0 {
                return Ok(GeneralEntry::Gone);
            }
            base
        };
        // [value, key]
        // SAFETY: the key is on top.
        let key = unsafe { ffi::lua_topointer(L, -1) };
        // SAFETY: Protected, with the key on top.
        unsafe { self.value(L, s)? };
        if self.sc.frames.len() > depth {
            // The key is a new object whose contents come first; the value after them.
            // SAFETY: drops the value, pushed above `base`.
            unsafe { ffi::lua_settop(L, base) };
            if let Some(Frame::Table(f)) = self.sc.frames.get_mut(depth - 1) {
                f.step = TableStep::value(key);
            }
            return Ok(GeneralEntry::Pushed);
        }
        // SAFETY: Protected, with the value on top.
        unsafe { self.value(L, s)? };
        if self.sc.frames.len() > depth {
            // SAFETY: the stack is back at `base` (value popped what it wrote).
            unsafe { ffi::lua_settop(L, base) };
            return Ok(GeneralEntry::Pushed);
        }
        if self.scan_gen != gen {
            // Lua code ran: scan again from `cur.at`.
            cur.i = cur.end;
            cur.exhausted = false;
        }
        Ok(GeneralEntry::Written)
    }
}
