//! Persisting: Lua values to the save-game format.
//!
//! Depth first, without recursion on the native stack and with O(1) Lua stack: each object
//! being written is a frame on a Rust stack; tables are iterated by entry position (array
//! part, then hash nodes: `luasnap_table_scan` and `luasnap_table_next` in
//! `csrc/internals.c`), so resuming a table after a child object costs no key lookup, and a
//! million-deep linked list needs a million small frames and nothing more.
//!
//! Two paths. The scan describes a table's entries without pushing them; primitives,
//! strings, objects already written, new tables and closures whose upvalues are plain are
//! written straight from it, tables and closures tracked by identity and anchored only before
//! Lua code runs (see [`Persister::anchor`]). Everything else goes the general way: the value
//! pushed, inspected through the C API, its contents a frame.
//!
//! All Rust state lives in [`Persister`], owned outside the protected call: a Lua error (from a
//! `__persist` function, or out of memory) unwinds only frames that hold nothing to drop.

mod csrc;
mod ids;
mod layout;
mod out;
mod scratch;

use super::format::{
    Tag, Writer, MIN_STRREF_LEN, THREAD_DEAD, THREAD_NOT_STARTED, THREAD_SUSPENDED,
};
use super::{PersistOptions, Slots};
use crate::bridge::ffi::Shared;
use csrc::*;
use ids::{IdSpace, ObjState};
use mlua_sys::{self as ffi, lua_State};
use out::{put_tagged, put_tagged_u64, zigzag};
use rustc_hash::FxHashMap as HashMap;
use scratch::Scratch;
use std::ffi::{c_int, c_void, CStr, CString};

/// Upvalues a Lua closure can have (Lua's MAXUPVAL).
const MAX_UPVALUES: usize = 255;

/// Table entries described per `luasnap_table_scan` call.
const SCAN_BATCH: usize = 64;
/// Scanned entries kept for tables waiting on a child (see `Frame::Table`); past this many,
/// a table opening a child drops the rest of its batch and scans it again later, so deep
/// nesting costs no more memory than a frame each.
const SCAN_KEEP: usize = 1 << 15;

/// A failure whose message is staged in `Persister::error`.
pub(crate) struct Fail;

enum Frame {
    /// The table `t` (kept alive by the graph, or anchored: see `anchor`).
    /// state 0: metatable next; 1: next entry; 2: the key at `pos - 1` (the object `key`) has
    /// been written, its value next. `pos`: the position after the current entry.
    ///
    /// Its scanned entries live in `Persister::scan` from `floor` on; those still to write are
    /// `scan[lo..hi]`, the ones from `pos` on. Invariant: they describe the table as it is
    /// while `gen` equals `Persister::scan_gen`, which changes before Lua code runs (only Lua
    /// code can change a table being written or free what its entries point to; the collector
    /// is stopped); a stale or empty batch is scanned again from `pos`. Child frames scan
    /// above `hi` and truncate back to their own floor when done.
    Table {
        t: *const c_void,
        state: u8,
        pos: u32,
        key: *const c_void,
        floor: u32,
        lo: u32,
        hi: u32,
        gen: u32,
    },
    LClosure {
        id: u32,
        next: c_int,
        n: c_int,
    },
    CClosure {
        id: u32,
        next: c_int,
        n: c_int,
    },
    /// state 0: metatable; then user values 1..=nuv.
    UdBytes {
        id: u32,
        state: c_int,
        nuv: c_int,
    },
    /// A `__persist` result: state 0: first function; 1: second (two-phase init); 2: done.
    Special {
        id: u32,
        state: u8,
        two: bool,
    },
    /// Stack slots 1..n, then (if suspended) `nci` frame records.
    Thread {
        id: u32,
        next: c_int,
        n: c_int,
        nci: c_int,
    },
}

/// Where the writer is, for error messages.
#[derive(Clone, Copy)]
enum Seg {
    Key,
    Meta,
    Upvalue(c_int),
    UserValue(c_int),
    Special(u8),
    Stack(c_int),
}

/// Whether a scanned value's kind is a primitive or a string (no id lookup to write it).
#[inline(always)]
fn is_prim(k: u64) -> bool {
    matches!(k, kind::FALSE..=kind::STR | kind::NIL)
}

/// A scanned value (`kind`, `bits` of a [`ScanEntry`]) as a [`RawVal`], a string's bytes
/// included.
///
/// # Safety
/// The value was just described by `luasnap_table_scan`; no Lua code ran since.
unsafe fn full_val(kind: u64, bits: u64) -> RawVal {
    let mut v = RawVal {
        kind,
        bits,
        ..RawVal::EMPTY
    };
    if kind == kind::STR {
        let mut len = 0usize;
        // SAFETY: bits is a live TString (callers' contract); reads only.
        v.s = unsafe { luasnap_string_bytes(bits as usize as *const c_void, &mut len) };
        v.len = len as u64;
    }
    v
}

pub(crate) struct Persister<'a> {
    /// Working memory kept between persists on a thread: the id table (objects written by
    /// identity, to their id; strings written, to their string id), the objects and strings
    /// not anchored yet, table-scan batches, closure scans, prototypes and chunks written,
    /// upvalue homes, the frame stack and layout buffers (see [`Scratch`]).
    sc: Scratch,
    pub w: Writer,
    /// String ids given so far.
    nstrs: u32,
    /// String ids from this one on are not anchored yet (see `anchor`).
    anchored: u32,
    /// The spkey string (anchored in `strs[0]`).
    spkey_str: *const c_void,
    /// The last metatable `meta_has_spkey` looked in, and its answer.
    last_meta: (*const c_void, bool),
    /// Changes whenever Lua code may run (see `anchor`): older batches are stale.
    scan_gen: u32,
    next_id: u32,
    /// Fingerprints of the prototypes of the chunks written, by identity (forgotten before
    /// Lua code runs, which could free a prototype and give its address to another).
    proto_hashes: HashMap<*const c_void, u64>,
    pub error: Option<String>,
    pub has_bytecode: bool,
    /// Whether the file carries source text.
    pub has_source: bool,
    opts: &'a PersistOptions,
    spkey: CString,
    shared: &'a Shared,
    dump: Vec<u8>,
}

unsafe extern "C-unwind" fn dump_writer(
    _L: *mut lua_State,
    p: *const c_void,
    sz: usize,
    ud: *mut c_void,
) -> c_int {
    if sz == 0 || p.is_null() {
        return 0;
    }
    // SAFETY: ud is the Persister's dump buffer; p has sz readable bytes.
    unsafe {
        (*(ud as *mut Vec<u8>)).extend_from_slice(std::slice::from_raw_parts(p.cast::<u8>(), sz))
    };
    0
}

impl Drop for Persister<'_> {
    fn drop(&mut self) {
        std::mem::take(&mut self.sc).keep();
    }
}

impl<'a> Persister<'a> {
    pub fn new(opts: &'a PersistOptions, shared: &'a Shared) -> Self {
        Persister {
            sc: Scratch::take(shared.arena_base),
            w: Writer::file(),
            nstrs: 0,
            anchored: 0,
            spkey_str: std::ptr::null(),
            last_meta: (std::ptr::null(), false),
            scan_gen: 0,
            next_id: 0,
            proto_hashes: HashMap::default(),
            error: None,
            has_bytecode: false,
            has_source: false,
            spkey: CString::new(opts.spkey.as_str())
                .unwrap_or_else(|_| CString::new("__persist").unwrap()),
            opts,
            shared,
            dump: Vec::new(),
        }
    }

    /// The closure (object id) and upvalue number that wrote the upvalue `uid` first.
    #[inline]
    fn upval_home(&self, uid: *const c_void) -> Option<(u32, c_int)> {
        let i = self.sc.refs.get(uid, IdSpace::Upval)?;
        Some(self.sc.upval_homes[i as usize])
    }

    /// Records that upvalue number `at` of the closure `owner` wrote the upvalue `uid`.
    fn set_upval_home(&mut self, uid: *const c_void, owner: u32, at: c_int) {
        self.sc
            .refs
            .insert(uid, IdSpace::Upval, self.sc.upval_homes.len() as u32);
        self.sc.upval_homes.push((owner, at));
    }

    /// Whether `p` is the identity of a permanent not written yet (then the general path
    /// writes it, by name).
    #[inline]
    fn is_permanent(&self, p: *const c_void) -> bool {
        self.sc.refs.get(p, IdSpace::Perm).is_some()
    }

    /// Writes the value on top of the stack (popped). `slots` locates the helper tables.
    ///
    /// # Safety
    /// Protected context; `slots` are valid absolute indices of this call's helper tables.
    pub unsafe fn run(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: protected context (callers' contract).
        unsafe {
            // No emergency collection while objects are known by address (ids, kept scan
            // batches): one clearing a weak table could free what they point to. The caller
            // puts the flag back.
            luasnap_gc_stopem(L, 1);
            // Collect the permanents' identities once (a few hundred entries).
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, s.perms) != 0 {
                ffi::lua_settop(L, -2);
                if !matches!(
                    ffi::lua_type(L, -1),
                    ffi::LUA_TNIL | ffi::LUA_TBOOLEAN | ffi::LUA_TNUMBER | ffi::LUA_TSTRING
                ) {
                    self.sc
                        .refs
                        .insert(ffi::lua_topointer(L, -1), IdSpace::Perm, 0);
                }
            }
            ffi::lua_pushlstring(L, self.spkey.as_ptr(), self.spkey.as_bytes().len());
            self.spkey_str = ffi::lua_topointer(L, -1);
            ffi::lua_rawseti(L, s.strs, 0);
            let used = ffi::lua_gc(L, ffi::LUA_GCCOUNT) as usize * 1024;
            self.w.buf.reserve(used / 4);
            self.sc.refs.reserve(used);
            self.value(L, s)?;
            while !self.sc.frames.is_empty() {
                if !self.advance(L, s)? {
                    self.sc.frames.pop();
                }
            }
        }
        Ok(())
    }

    fn fail(&mut self, L: *mut lua_State, what: String) -> Fail {
        self.error = Some(if self.opts.path {
            // SAFETY: reads the keys table; formatting only inspects primitives.
            format!("{what} at {}", unsafe { self.path(L) })
        } else {
            format!(
                "{what} (for where it is in the value, turn on paths: PersistOptions::path, \
                 or eris.settings(\"path\", true))"
            )
        });
        Fail
    }

    unsafe fn path(&self, L: *mut lua_State) -> String {
        let mut out = String::from("root");
        for (depth, seg) in self.sc.segs.iter().enumerate() {
            match *seg {
                Seg::Key => {
                    let Some(&Frame::Table { t, pos, .. }) = self.sc.frames.get(depth) else {
                        continue;
                    };
                    // SAFETY: the frame's table is alive; the current entry is at pos - 1; the
                    // push is popped (the stack has room: fail runs with few values).
                    unsafe {
                        luasnap_checkstack(L, 2, c"persist".as_ptr());
                        if pos > 0 && luasnap_table_entry(L, t, pos - 1, 0) != 0 {
                            out.push_str(&key_text(L));
                            ffi::lua_settop(L, -2);
                        }
                    }
                }
                Seg::Meta => out.push_str("@metatable"),
                Seg::Upvalue(i) => out.push_str(&format!("@upvalue[{i}]")),
                Seg::UserValue(i) => out.push_str(&format!("@uservalue[{i}]")),
                Seg::Special(0) => out.push_str("@persist"),
                Seg::Special(_) => out.push_str("@persist_init"),
                Seg::Stack(i) => out.push_str(&format!("@stack[{i}]")),
            }
        }
        out
    }

    #[inline(always)]
    fn new_id(&mut self, p: *const c_void) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.sc.refs.insert(p, IdSpace::Obj, id);
        id
    }

    /// Writes the value on top (popped): primitives and references at once, new objects as a
    /// header plus a frame for their contents.
    unsafe fn value(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: protected context; the value is on top.
        unsafe {
            let t = ffi::lua_type(L, -1);
            match t {
                ffi::LUA_TNIL => self.w.tag(Tag::Nil),
                ffi::LUA_TBOOLEAN => self.w.tag(if ffi::lua_toboolean(L, -1) != 0 {
                    Tag::True
                } else {
                    Tag::False
                }),
                ffi::LUA_TNUMBER => {
                    if ffi::lua_isinteger(L, -1) != 0 {
                        self.w.tag(Tag::Int);
                        self.w.i64(ffi::lua_tointegerx(L, -1, std::ptr::null_mut()));
                    } else {
                        self.w.tag(Tag::Float);
                        self.w
                            .u64(ffi::lua_tonumberx(L, -1, std::ptr::null_mut()).to_bits());
                    }
                }
                ffi::LUA_TSTRING => {
                    let mut len = 0;
                    let p = ffi::lua_tolstring(L, -1, &mut len);
                    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
                    self.string(ffi::lua_topointer(L, -1), bytes);
                }
                ffi::LUA_TLIGHTUSERDATA => {
                    if self.permanent(L, s) {
                        return Ok(());
                    }
                    self.w.tag(Tag::Light);
                    self.w.u64(ffi::lua_touserdata(L, -1) as u64);
                }
                _ => return self.object(L, s, t),
            }
            ffi::lua_settop(L, -2);
        }
        Ok(())
    }

    /// Writes a string. Strings of MIN_STRREF_LEN bytes or more are written once and referred
    /// to afterwards (by identity `obj`: short strings are interned, so that is one object per
    /// content); shorter ones cost less to repeat than to look up.
    #[inline(always)]
    fn string(&mut self, obj: *const c_void, bytes: &[u8]) {
        if bytes.len() >= MIN_STRREF_LEN {
            // Most strings are written already: their reference, inline.
            if let Some(old) = self.sc.refs.get(obj, IdSpace::Str) {
                put_tagged(&mut self.w.buf, Tag::StrRef, old as u64);
                return;
            }
        }
        self.new_string(obj, bytes);
    }

    /// `string`, for a string to write whole (new, or too short to refer to).
    #[inline(never)]
    fn new_string(&mut self, obj: *const c_void, bytes: &[u8]) {
        if bytes.len() < MIN_STRREF_LEN {
            self.w.tag(Tag::Str);
            self.w.bytes(bytes);
        } else {
            match self.sc.refs.get_or_insert(obj, IdSpace::Str, self.nstrs) {
                Some(old) => put_tagged(&mut self.w.buf, Tag::StrRef, old as u64),
                None => {
                    self.nstrs += 1;
                    put_tagged(&mut self.w.buf, Tag::Str, bytes.len() as u64);
                    self.w.buf.extend_from_slice(bytes);
                    self.sc.unanchored.push(obj);
                }
            }
        }
    }

    /// Anchors the strings, tables and closures recorded by identity since the last call
    /// (strings in the strings table, the others in `seen` under their ids). Identities are only valid while
    /// the objects live: until Lua code runs, every one recorded is reachable from the
    /// unchanged graph, but a `__persist` function may change the graph and run a full
    /// collection, and a freed object's address could come back as another object. So this
    /// runs before every call into Lua code.
    ///
    /// # Safety
    /// Protected context; no Lua code ran since the objects were recorded.
    unsafe fn anchor(&mut self, L: *mut lua_State, s: Slots) {
        // SAFETY: every pointer is a live object (see above); the tables are at s.strs, s.seen.
        unsafe {
            luasnap_anchor(
                L,
                s.strs,
                self.sc.unanchored.as_ptr(),
                std::ptr::null(),
                self.sc.unanchored.len() as c_int,
                self.anchored as ffi::lua_Integer + 1,
            );
            luasnap_anchor(
                L,
                s.seen,
                self.sc.unanchored_objs.as_ptr(),
                self.sc.unanchored_ids.as_ptr(),
                self.sc.unanchored_objs.len() as c_int,
                0,
            );
        }
        // Lua code runs next: scanned batches waiting in parent frames are stale, and so are
        // the layouts cached by string identity.
        self.scan_gen = self.scan_gen.wrapping_add(1);
        self.sc.layout.forget_layouts();
        self.last_meta = (std::ptr::null(), false);
        self.proto_hashes.clear();
        self.anchored += self.sc.unanchored.len() as u32;
        self.sc.unanchored.clear();
        self.sc.unanchored_objs.clear();
        self.sc.unanchored_ids.clear();
    }

    /// For a scanned table `t` not written yet (its id looked up), that can be written by
    /// identity, without pushing it (not a permanent, no special persistence): records it
    /// (a new id, anchored later) and returns its sizes and metatable for `table_header`.
    ///
    /// # Safety
    /// `t` was just described by `luasnap_table_scan`; no Lua code ran since.
    unsafe fn unseen_table_info(&mut self, t: *const c_void) -> Option<(u32, u32, *const c_void)> {
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
    unsafe fn new_table_info(&mut self, t: *const c_void) -> Option<(u32, u32, *const c_void)> {
        let (mut narr, mut nhash, mut mt) = (0u32, 0u32, std::ptr::null());
        // SAFETY: t is a live table (callers' contract); no key, no lookup.
        unsafe { luasnap_table_info(t, std::ptr::null(), &mut narr, &mut nhash, &mut mt) };
        // SAFETY: t's metatable is live; nothing ran since t was described.
        if !mt.is_null() && unsafe { self.meta_has_spkey(mt) } {
            return None;
        }
        self.record(t);
        Some((narr, nhash, mt))
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
            // SAFETY: mt is a live table (callers' contract), spkey_str a live string.
            let has = unsafe { luasnap_meta_has(mt, self.spkey_str) } != 0;
            self.last_meta = (mt, has);
        }
        self.last_meta.1
    }

    /// Whether the object `p` is neither written yet nor a permanent (which the general path
    /// writes by name).
    fn unwritten(&self, p: *const c_void) -> bool {
        !self.sc.refs.contains(p) && !self.is_permanent(p)
    }

    /// Gives the object `p`, written by identity, its id, and lists it for `anchor`.
    #[inline(always)]
    fn record(&mut self, p: *const c_void) -> u32 {
        let id = self.new_id(p);
        self.sc.unanchored_objs.push(p);
        self.sc.unanchored_ids.push(id as ffi::lua_Integer);
        id
    }

    /// For a scanned value that is a Lua closure not written yet, that can be written whole
    /// without pushing it: not a permanent, its prototype written before, every upvalue closed
    /// and holding a plain value (see `plain`) or shared with a closure written before. Returns
    /// its prototype's index and upvalue count, with the upvalues in `cl_uids` and `cl_vals`,
    /// for `write_closure`.
    ///
    /// # Safety
    /// `v` was just described by `luasnap_table_scan`; no Lua code ran since.
    unsafe fn closure_info(&mut self, vkind: u64, f: *const c_void) -> Option<(u32, usize)> {
        if vkind != kind::LCLOSURE || !self.unwritten(f) {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_closure_info(f) }
    }

    /// `closure_info` for a scanned value known to be neither written nor a permanent.
    ///
    /// # Safety
    /// As for `closure_info`.
    #[inline]
    unsafe fn closure_info_scanned(
        &mut self,
        vkind: u64,
        f: *const c_void,
    ) -> Option<(u32, usize)> {
        if vkind != kind::LCLOSURE {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_closure_info(f) }
    }

    /// `closure_info` for a Lua closure known to be neither written nor a permanent.
    ///
    /// # Safety
    /// As for `closure_info`.
    unsafe fn new_closure_info(&mut self, f: *const c_void) -> Option<(u32, usize)> {
        let mut proto = std::ptr::null();
        // SAFETY: f is a live Lua closure (callers' contract); the buffers hold MAX_UPVALUES.
        let n = unsafe {
            luasnap_closure_scan(
                f,
                &mut proto,
                self.sc.cl_uids.as_mut_ptr(),
                self.sc.cl_vals.as_mut_ptr(),
                MAX_UPVALUES as c_int,
            )
        };
        let n = usize::try_from(n).ok()?;
        let index = *self.sc.protos.get(&proto)?;
        let plain = (0..n).all(|i| {
            self.upval_home(self.sc.cl_uids[i]).is_some() || self.plain(&self.sc.cl_vals[i])
        });
        plain.then_some((index, n))
    }

    /// Writes the closure `f` that `closure_info` just described, as the general path would.
    ///
    /// # Safety
    /// As for `closure_info`, which returned `(index, n)` for `f`.
    unsafe fn write_closure(&mut self, f: *const c_void, (index, n): (u32, usize)) {
        let id = self.record(f);
        self.w.tag(Tag::LClosure);
        self.w.varint(index as u64);
        self.w.varint(n as u64);
        for i in 0..n {
            let (uid, v) = (self.sc.cl_uids[i], self.sc.cl_vals[i]);
            if let Some((owner, at)) = self.upval_home(uid) {
                self.w.tag(Tag::UpvalRef);
                self.w.varint(owner as u64);
                self.w.varint(at as u64);
            } else {
                self.set_upval_home(uid, id, i as c_int + 1);
                self.w.tag(Tag::UpvalNew);
                // SAFETY: v was described by the closure scan; nothing ran since.
                unsafe { self.write_plain(&v) };
            }
        }
    }

    /// Writes a table's header and (if nil or written already) its metatable, and pushes the
    /// frame for the rest.
    #[inline(always)]
    fn table_header(&mut self, t: *const c_void, (narr, nhash, mt): (u32, u32, *const c_void)) {
        put_tagged(&mut self.w.buf, Tag::Table, narr as u64);
        self.w.varint(nhash as u64);
        // The metatable comes first: written here when it is nil or already written (the
        // common case: shared metatables), else by the frame.
        let mut state = 0;
        if mt.is_null() {
            self.w.tag(Tag::Nil);
            state = 1;
        } else if let Some(mid) = self.sc.refs.get(mt, IdSpace::Obj) {
            put_tagged(&mut self.w.buf, Tag::Ref, mid as u64);
            state = 1;
        }
        let floor = self.sc.scan.len() as u32;
        self.sc.frames.push(Frame::Table {
            t,
            state,
            pos: 0,
            key: std::ptr::null(),
            floor,
            lo: floor,
            hi: floor,
            gen: self.scan_gen,
        });
    }

    /// What a scanned value is to the table loop: `Ok(None)` a primitive or a string,
    /// `Ok(Some(id))` an object written already, `Err(true)` an object not written yet,
    /// `Err(false)` anything else (for the general path). One id lookup per object.
    #[inline]
    fn classify(&self, v: &RawVal) -> Result<Option<u32>, bool> {
        match v.kind {
            kind::FALSE..=kind::STR | kind::NIL => Ok(None),
            kind::OBJ | kind::TABLE | kind::LCLOSURE => {
                match self
                    .sc
                    .refs
                    .get(v.bits as usize as *const c_void, IdSpace::Obj)
                {
                    Some(id) => Ok(Some(id)),
                    None => Err(true),
                }
            }
            _ => Err(false),
        }
    }

    /// Writes a value `classify` found plain: by its id if it has one.
    ///
    /// # Safety
    /// As for `write_plain`.
    #[inline]
    unsafe fn write_classified(&mut self, v: &RawVal, id: Option<u32>) {
        match id {
            Some(id) => put_tagged(&mut self.w.buf, Tag::Ref, id as u64),
            // SAFETY: callers' contract.
            None => unsafe { self.write_plain(v) },
        }
    }

    /// Whether a scanned value can be written without the general path: a primitive, a
    /// string, or an object already written (a reference).
    fn plain(&self, v: &RawVal) -> bool {
        match v.kind {
            kind::FALSE..=kind::STR => true,
            kind::OBJ | kind::TABLE | kind::LCLOSURE => {
                self.sc.refs.contains(v.bits as usize as *const c_void)
            }
            kind::NIL => true,
            _ => false,
        }
    }

    /// Writes a scanned primitive or string (`is_prim(kind)` holds; `bits` as the scan gave
    /// them: a string by identity).
    ///
    /// # Safety
    /// The value was just described by `luasnap_table_scan`; no Lua code ran since.
    #[inline(always)]
    unsafe fn write_scanned(&mut self, kind: u64, bits: u64) {
        match kind {
            kind::STR => {
                let obj = bits as usize as *const c_void;
                // Most strings are written already: their reference, inline (a string without
                // an id is new, or too short to refer to).
                match self.sc.refs.get(obj, IdSpace::Str) {
                    Some(id) => put_tagged(&mut self.w.buf, Tag::StrRef, id as u64),
                    // SAFETY: a live string (callers' contract).
                    None => unsafe { self.new_scanned_string(obj) },
                }
            }
            kind::INT => {
                let i = bits as i64;
                put_tagged(&mut self.w.buf, Tag::Int, zigzag(i));
            }
            kind::FALSE => self.w.tag(Tag::False),
            kind::TRUE => self.w.tag(Tag::True),
            kind::FLOAT => put_tagged_u64(&mut self.w.buf, Tag::Float, bits),
            _ => self.w.tag(Tag::Nil),
        }
    }

    /// Writes the scanned string `obj` that has no string id yet.
    ///
    /// # Safety
    /// `obj` is a live string's identity from `luasnap_table_scan`; no Lua code ran since.
    #[inline(never)]
    unsafe fn new_scanned_string(&mut self, obj: *const c_void) {
        let mut len = 0usize;
        // SAFETY: obj is a live TString (callers' contract); reads only.
        let p = unsafe { luasnap_string_bytes(obj, &mut len) };
        // SAFETY: the string's bytes, alive while it is (nothing runs meanwhile).
        let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
        self.new_string(obj, bytes);
    }

    /// Writes a scanned value for which `plain` holds.
    ///
    /// # Safety
    /// `v` was just described by `luasnap_table_scan` (a string's bytes are live).
    unsafe fn write_plain(&mut self, v: &RawVal) {
        match v.kind {
            kind::NIL => self.w.tag(Tag::Nil),
            kind::FALSE => self.w.tag(Tag::False),
            kind::TRUE => self.w.tag(Tag::True),
            kind::INT => {
                let i = v.bits as i64;
                put_tagged(&mut self.w.buf, Tag::Int, zigzag(i));
            }
            kind::FLOAT => put_tagged_u64(&mut self.w.buf, Tag::Float, v.bits),
            kind::STR => {
                // SAFETY: the scan pointed at the live string's bytes (callers' contract).
                let bytes = unsafe { std::slice::from_raw_parts(v.s.cast::<u8>(), v.len as usize) };
                self.string(v.bits as usize as *const c_void, bytes);
            }
            _ => {
                let id = self
                    .sc
                    .refs
                    .get(v.bits as usize as *const c_void, IdSpace::Obj)
                    .expect("`plain` checked that the object is written");
                put_tagged(&mut self.w.buf, Tag::Ref, id as u64);
            }
        }
    }

    /// If the value on top is a permanent, writes it (popped) and returns true.
    unsafe fn permanent(&mut self, L: *mut lua_State, s: Slots) -> bool {
        // SAFETY: rawget on the permanents table (value -> key) does not raise.
        unsafe {
            if ffi::lua_type(L, -1) != ffi::LUA_TLIGHTUSERDATA
                && !self.is_permanent(ffi::lua_topointer(L, -1))
            {
                return false;
            }
            ffi::lua_pushvalue(L, -1);
            if ffi::lua_rawget(L, s.perms) == ffi::LUA_TNIL {
                ffi::lua_settop(L, -2);
                return false;
            }
            self.w.tag(Tag::Perm);
            let kt = ffi::lua_type(L, -1);
            // A permanent's key is a primitive: write it as a value.
            if !matches!(kt, ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN) {
                ffi::lua_settop(L, -2);
                self.w.tag(Tag::Nil);
            } else {
                let _ = self.value(L, s);
            }
            if ffi::lua_type(L, -1) != ffi::LUA_TLIGHTUSERDATA {
                let p = ffi::lua_topointer(L, -1);
                self.new_id(p);
            }
            ffi::lua_settop(L, -2);
            true
        }
    }

    unsafe fn object(&mut self, L: *mut lua_State, s: Slots, t: c_int) -> Result<(), Fail> {
        // SAFETY: protected context; the object is on top.
        unsafe {
            let ptr = ffi::lua_topointer(L, -1);
            if let Some(id) = self.sc.refs.get(ptr, IdSpace::Obj) {
                self.w.tag(Tag::Ref);
                self.w.varint(id as u64);
                ffi::lua_settop(L, -2);
                return Ok(());
            }
            if self.permanent(L, s) {
                return Ok(());
            }
            // Anchor it (keeps it alive and findable by id), then write its header.
            let id = self.new_id(ptr);
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawseti(L, s.seen, id as ffi::lua_Integer);
            match t {
                ffi::LUA_TTABLE => {
                    if !self.special(L, s, id)? {
                        // Anchored in seen[id] above.
                        let (mut narr, mut nhash, mut mt) = (0u32, 0u32, std::ptr::null());
                        luasnap_table_info(ptr, std::ptr::null(), &mut narr, &mut nhash, &mut mt);
                        self.table_header(ptr, (narr, nhash, mt));
                    }
                }
                ffi::LUA_TFUNCTION => {
                    if ffi::lua_iscfunction(L, -1) == 0 {
                        self.lclosure(L, s, id)?;
                    } else {
                        self.cclosure(L, s, id)?;
                    }
                }
                ffi::LUA_TUSERDATA => self.userdata(L, s, id)?,
                ffi::LUA_TTHREAD => self.thread(L, id)?,
                _ => {
                    return Err(self.fail(
                        L,
                        format!(
                            "cannot persist a value of type {}",
                            crate::bridge::ffi::type_name(L, -1)
                        ),
                    ))
                }
            }
            ffi::lua_settop(L, -2);
        }
        Ok(())
    }

    /// Handles `__persist` (the configured key) on a table or userdata on top (left there).
    /// Returns true if it wrote the object (as a thunk or two-phase), false to persist it
    /// normally.
    unsafe fn special(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<bool, Fail> {
        // SAFETY: protected context; may call the metamethod (Lua code).
        unsafe {
            if ffi::luaL_getmetafield(L, -1, self.spkey.as_ptr()) == ffi::LUA_TNIL {
                return Ok(false);
            }
            match ffi::lua_type(L, -1) {
                ffi::LUA_TBOOLEAN if ffi::lua_toboolean(L, -1) != 0 => {
                    ffi::lua_settop(L, -2);
                    Ok(false)
                }
                ffi::LUA_TBOOLEAN => {
                    ffi::lua_settop(L, -2);
                    let what = format!(
                        "{} refuses to be persisted ({} is false)",
                        crate::bridge::ffi::type_name(L, -1),
                        self.opts.spkey
                    );
                    Err(self.fail(L, what))
                }
                ffi::LUA_TFUNCTION => {
                    // __persist(obj) returns a rebuild function, or a create thunk and an
                    // initializer (two-phase).
                    self.anchor(L, s);
                    ffi::lua_pushvalue(L, -2);
                    // Lua code may collect (everything written is anchored above): the
                    // collector must find the flag clear (lgc.c's singlestep asserts it).
                    luasnap_gc_stopem(L, 0);
                    ffi::lua_callk(L, 1, 2, 0, None);
                    luasnap_gc_stopem(L, 1);
                    let two = ffi::lua_type(L, -1) != ffi::LUA_TNIL;
                    if ffi::lua_type(L, -2) != ffi::LUA_TFUNCTION
                        || (two && ffi::lua_type(L, -1) != ffi::LUA_TFUNCTION)
                    {
                        ffi::lua_settop(L, -3);
                        let what = format!("{} must return a function (or two)", self.opts.spkey);
                        return Err(self.fail(L, what));
                    }
                    // Keep the functions reachable by id while their frames run: seen[-id-1].
                    ffi::lua_createtable(L, 2, 0);
                    ffi::lua_rotate(L, -3, 1);
                    ffi::lua_rawseti(L, -3, 2);
                    ffi::lua_rawseti(L, -2, 1);
                    ffi::lua_rawseti(L, s.seen, -(id as ffi::lua_Integer) - 1);
                    self.w.tag(if two { Tag::TwoPhase } else { Tag::Thunk });
                    self.sc.frames.push(Frame::Special { id, state: 0, two });
                    Ok(true)
                }
                _ => {
                    ffi::lua_settop(L, -2);
                    let what = format!("{} must be true, false or a function", self.opts.spkey);
                    Err(self.fail(L, what))
                }
            }
        }
    }

    unsafe fn lclosure(&mut self, L: *mut lua_State, _s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a Lua closure is on top.
        unsafe {
            let proto = luasnap_proto(L, -1);
            let n = luasnap_proto_nupvalues(proto);
            self.w.tag(Tag::LClosure);
            match self.sc.protos.get(&proto) {
                Some(&index) => self.w.varint(index as u64),
                None => {
                    let index = self.sc.protos.len() as u32;
                    self.sc.protos.insert(proto, index);
                    self.w.varint(index as u64);
                    let hash = match self.proto_hashes.get(&proto) {
                        Some(&h) => h,
                        None => luasnap_proto_hash(proto),
                    };
                    self.w.u64(hash);
                    let mut ar: ffi::lua_Debug = std::mem::zeroed();
                    ffi::lua_pushvalue(L, -1);
                    ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar);
                    self.w.varint(ar.linedefined.max(0) as u64);
                    if !self.chunk_home(proto, hash) {
                        // Detached: compiled outside the chunk registry, no source text.
                        self.w.varint(0);
                        let src = std::ffi::CStr::from_ptr(ar.short_src.as_ptr()).to_bytes();
                        self.w.bytes(src);
                        if self.opts.bytecode {
                            self.dump.clear();
                            luasnap_dump(
                                L,
                                dump_writer,
                                (&mut self.dump as *mut Vec<u8>).cast(),
                                (!self.opts.debug) as c_int,
                            );
                            self.w.bytes(&self.dump);
                            self.has_bytecode = true;
                        } else {
                            self.w.bytes(&[]);
                        }
                    }
                }
            }
            self.w.varint(n as u64);
            self.sc.frames.push(Frame::LClosure { id, next: 1, n });
        }
        Ok(())
    }

    /// Writes where prototype `proto` (fingerprint `hash`) lives: its chunk (the chunk's name,
    /// main fingerprint and code the first time) and its path in the chunk's tree. Returns
    /// false, writing nothing, for a prototype outside every chunk record.
    unsafe fn chunk_home(&mut self, proto: *const c_void, hash: u64) -> bool {
        let mut d = ChunkDesc::EMPTY;
        // SAFETY: proto is alive (its closure is on the stack); the collector is stopped, so
        // the record, its text and its tree stay put while the pointers are used.
        if unsafe { luasnap_chunk_describe(proto, &mut d) } == 0 {
            return false;
        }
        if !self.sc.chunks.contains_key(&d.rec) {
            let mut paths = HashMap::default();
            let mut path = Vec::new();
            // SAFETY: d.main is the record's live main prototype; the buffer holds `max`.
            let hashes = unsafe {
                let mut hs = vec![0u64; 64];
                let mut n = luasnap_proto_tree_hashes(d.main, hs.as_mut_ptr(), hs.len() as c_int);
                if n > hs.len() as c_int {
                    hs.resize(n as usize, 0);
                    n = luasnap_proto_tree_hashes(d.main, hs.as_mut_ptr(), n);
                }
                hs.truncate(n.max(0) as usize);
                (n >= 0).then_some(hs)
            };
            let mut at = 0;
            // SAFETY: as above.
            unsafe {
                tree_paths(
                    d.main,
                    &mut path,
                    &mut paths,
                    hashes.as_deref(),
                    &mut at,
                    &mut self.proto_hashes,
                )
            };
            if !paths.contains_key(&hash) {
                return false;
            }
            let index = self.sc.chunks.len() as u32;
            self.w.varint(index as u64 + 1);
            // SAFETY: the record's text and name, alive with it (see above).
            let (src, name) = unsafe {
                (
                    std::slice::from_raw_parts(d.src.cast::<u8>(), d.srclen),
                    if d.name.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(d.name.cast::<u8>(), d.namelen)
                    },
                )
            };
            let binary = src.first() == Some(&0x1b);
            self.w.u8(binary as u8);
            self.w.bytes(name);
            match self.proto_hashes.get(&d.main) {
                Some(&h) => self.w.u64(h),
                // SAFETY: as above.
                None => self.w.u64(unsafe { luasnap_proto_hash(d.main) }),
            }
            if (binary && self.opts.bytecode) || (!binary && self.opts.code) {
                self.w.bytes(src);
                if binary {
                    self.has_bytecode = true;
                } else {
                    self.has_source = true;
                }
            } else {
                self.w.bytes(&[]);
            }
            self.sc.chunks.insert(d.rec, (index, paths));
        } else {
            let (index, paths) = &self.sc.chunks[&d.rec];
            if !paths.contains_key(&hash) {
                return false;
            }
            self.w.varint(*index as u64 + 1);
        }
        let path = &self.sc.chunks[&d.rec].1[&hash];
        self.w.varint(path.len() as u64);
        for &i in path {
            self.w.varint(i as u64);
        }
        true
    }

    unsafe fn cclosure(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a C function is on top.
        unsafe {
            let f = ffi::lua_tocfunction(L, -1);
            let mut n = 0;
            while !ffi::lua_getupvalue(L, -1 - n, n + 1).is_null() {
                n += 1;
            }
            ffi::lua_settop(L, -1 - n);
            // Look the bare function up among the permanents.
            match f {
                Some(f) => ffi::lua_pushcclosure(L, f, 0),
                None => ffi::lua_pushnil(L),
            }
            ffi::lua_rawget(L, s.perms);
            if !matches!(ffi::lua_type(L, -1), ffi::LUA_TSTRING | ffi::LUA_TNUMBER) {
                ffi::lua_settop(L, -2);
                let what = if n == 0 {
                    "attempt to persist a light C function that is not a permanent: register it (Vm::register_native, or perms[fn] = \"name\" in eris.persist)".to_string()
                } else {
                    "attempt to persist a C closure whose function is not a permanent: add the function to the permanents table".to_string()
                };
                return Err(self.fail(L, what));
            }
            // string.gmatch's iterator keeps a match state with raw pointers into its
            // subject and pattern (a userdata without __persist): say so, not that.
            if ffi::lua_type(L, -1) == ffi::LUA_TSTRING
                && CStr::from_ptr(ffi::lua_tostring(L, -1)) == super::GMATCH_AUX
            {
                ffi::lua_settop(L, -2);
                let what = "a string.gmatch iterator cannot be saved: its match state points into \
                     Lua's memory; iterate it to completion before the frame ends, or keep the \
                     string and the position (string.find with an init argument) instead"
                    .to_string();
                return Err(self.fail(L, what));
            }
            self.w.tag(Tag::CClosure);
            self.value(L, s)?;
            self.w.varint(n as u64);
            self.sc.frames.push(Frame::CClosure { id, next: 1, n });
        }
        Ok(())
    }

    unsafe fn userdata(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a full userdata is on top.
        unsafe {
            // Registered plain-data types persist by type name and bytes.
            if ffi::lua_getmetatable(L, -1) != 0 {
                let mt = ffi::lua_topointer(L, -1);
                ffi::lua_settop(L, -2);
                let size = ffi::lua_rawlen(L, -1) as usize;
                if let Some(ty) = self
                    .shared
                    .userdata_types()
                    .iter()
                    .find(|t| t.metatable == mt && t.size == size)
                {
                    let p = ffi::lua_touserdata(L, -1).cast::<u8>();
                    self.w.tag(Tag::UdPlain);
                    self.w.bytes(ty.name.as_bytes());
                    self.w.bytes(std::slice::from_raw_parts(p, size));
                    return Ok(());
                }
            }
            if self.special(L, s, id)? {
                return Ok(());
            }
            if ffi::luaL_getmetafield(L, -1, self.spkey.as_ptr()) == ffi::LUA_TNIL {
                let what = format!(
                    "cannot persist a userdata without {key}: give its metatable {key} = true (bytes), a function, or register it as PlainData",
                    key = self.opts.spkey
                );
                return Err(self.fail(L, what));
            }
            ffi::lua_settop(L, -2);
            // __persist = true: its bytes, metatable and user values.
            let len = ffi::lua_rawlen(L, -1) as usize;
            let p = ffi::lua_touserdata(L, -1).cast::<u8>();
            let mut nuv = 0;
            while ffi::lua_getiuservalue(L, -1 - nuv, nuv + 1) != ffi::LUA_TNONE {
                nuv += 1;
            }
            ffi::lua_settop(L, -2 - nuv);
            self.w.tag(Tag::UdBytes);
            self.w.bytes(std::slice::from_raw_parts(p, len));
            self.w.varint(nuv as u64);
            self.sc.frames.push(Frame::UdBytes { id, state: 0, nuv });
        }
        Ok(())
    }

    unsafe fn thread(&mut self, L: *mut lua_State, id: u32) -> Result<(), Fail> {
        // SAFETY: protected context; a thread is on top.
        unsafe {
            let co = ffi::lua_tothread(L, -1);
            let is_main = if co == L {
                let m = ffi::lua_pushthread(L) == 1;
                ffi::lua_settop(L, -2);
                m
            } else {
                let m = ffi::lua_pushthread(co) == 1;
                ffi::lua_settop(co, -2);
                m
            };
            // As Eris: the running coroutine cannot be written (its stack is this call), nor
            // the main thread (a load has its own; a suspended coroutine is what persists).
            if co == L {
                return Err(self.fail(L, "cannot persist the running coroutine".to_string()));
            }
            if is_main {
                return Err(self.fail(L, "cannot persist the main thread".to_string()));
            }
            let mut ar: ffi::lua_Debug = std::mem::zeroed();
            let status = ffi::lua_status(co);
            let started = ffi::lua_getstack(co, 0, &mut ar) != 0;
            let (mut size, mut nci, mut tbc, mut errfunc) = (0, 0, 0, 0i64);
            luasnap_thread_info(co, &mut size, &mut nci, &mut tbc, &mut errfunc);
            if status == ffi::LUA_OK && !started && size > 1 {
                self.w.tag(Tag::Thread);
                self.w.u8(THREAD_NOT_STARTED);
                self.w.varint((size - 1) as u64);
                self.sc.frames.push(Frame::Thread {
                    id,
                    next: 1,
                    n: size - 1,
                    nci: 0,
                });
            } else if (status == ffi::LUA_OK && !started)
                || (status != ffi::LUA_OK && status != ffi::LUA_YIELD)
            {
                self.w.tag(Tag::Thread);
                self.w.u8(THREAD_DEAD);
            } else if status == ffi::LUA_YIELD {
                let _ = tbc; // pending to-be-closed variables follow the frames
                self.w.tag(Tag::Thread);
                self.w.u8(THREAD_SUSPENDED);
                self.w.varint((size - 1) as u64);
                self.w.i64(errfunc);
                self.sc.frames.push(Frame::Thread {
                    id,
                    next: 1,
                    n: size - 1,
                    nci,
                });
            } else {
                return Err(self.fail(L, "cannot persist a running coroutine".to_string()));
            }
        }
        Ok(())
    }

    /// Moves the top frame on by one child (a table frame: through its entries, and on into
    /// the tables it opens and back, popping those it completes). Returns false when the top
    /// frame is complete (the caller pops it).
    unsafe fn advance(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // A table frame that opens a child table or completes goes on with the new top frame
        // here, without a return to `run` for each table.
        'frames: loop {
            let depth = self.sc.frames.len();
            // Path bookkeeping: the segment for this frame's current child.
            self.sc.segs.truncate(depth - 1);
            // SAFETY: protected context; each arm pushes one child value and writes it.
            unsafe {
                return match self.sc.frames.last_mut().expect("non-empty") {
                    Frame::Table {
                        t,
                        state,
                        pos,
                        key,
                        floor,
                        lo,
                        hi,
                        gen,
                    } => {
                        let (t, st) = (*t, *state);
                        match st {
                            0 => {
                                *state = 1;
                                self.sc.segs.push(Seg::Meta);
                                luasnap_push_metatable(L, t);
                                self.value(L, s)?;
                                Ok(true)
                            }
                            2 => {
                                // The key (an object) has been written; now its value.
                                *state = 1;
                                let (at, written) = (*pos - 1, *key);
                                self.sc.segs.push(Seg::Key);
                                // The entry must still be the key just written: a __persist
                                // function may have changed this table meanwhile.
                                let same = luasnap_table_entry(L, t, at, 0) != 0 && {
                                    let p = ffi::lua_topointer(L, -1);
                                    ffi::lua_settop(L, -2);
                                    p == written
                                };
                                if !same || luasnap_table_entry(L, t, at, 1) == 0 {
                                    let what = "a table changed while it was being persisted (by a __persist function?)".to_string();
                                    return Err(self.fail(L, what));
                                }
                                self.value(L, s)?;
                                Ok(true)
                            }
                            _ => {
                                // Entries from `pos` on. Those of primitives, strings, objects
                                // already written and new tables go from a scan of the table
                                // straight to the buffer (a new table's entries by its own
                                // frame, the rest of the batch kept for when it is done); the
                                // rest one at a time, pushed: [v, k].
                                self.sc.segs.push(Seg::Key);
                                let mut at = *pos;
                                let floor = *floor as usize;
                                let (mut i, mut end) = (*lo as usize, *hi as usize);
                                if *gen != self.scan_gen || end > self.sc.scan.len() {
                                    i = end; // stale: scan again from `pos`
                                }
                                // Whether the last scan reached the table's end (it stops early
                                // only when the batch is full): then no scan after it.
                                let mut exhausted = false;
                                loop {
                                    if i >= end {
                                        if exhausted {
                                            break;
                                        }
                                        self.sc.scan.truncate(floor);
                                        self.sc.scan.reserve(SCAN_BATCH);
                                        // SAFETY: room for SCAN_BATCH entries past `floor`; the C
                                        // side fills every field of the `n` entries it returns
                                        // (plain data), which set_len then covers.
                                        let n = luasnap_table_scan(
                                            L,
                                            t,
                                            at,
                                            self.sc.scan.as_mut_ptr().add(floor),
                                            SCAN_BATCH as c_int,
                                        ) as usize;
                                        if n == 0 {
                                            break;
                                        }
                                        self.sc.scan.set_len(floor + n);
                                        (i, end) = (floor, floor + n);
                                        exhausted = n < SCAN_BATCH;
                                    }
                                    let e = self.sc.scan[i];
                                    i += 1;
                                    let mut opened = None;
                                    let (kk, vk) = (e.kkind as u64, e.vkind as u64);
                                    if is_prim(kk) {
                                        // The usual key (a primitive or a string): the value
                                        // decides, with one look at its id slot if an object.
                                        if is_prim(vk) {
                                            self.write_scanned(kk, e.kbits);
                                            self.write_scanned(vk, e.vbits);
                                            at = e.pos;
                                            continue;
                                        }
                                        if matches!(vk, kind::OBJ | kind::TABLE | kind::LCLOSURE) {
                                            let v = e.vbits as usize as *const c_void;
                                            match self.sc.refs.obj_state(v) {
                                                ObjState::Written(id) => {
                                                    self.write_scanned(kk, e.kbits);
                                                    put_tagged(
                                                        &mut self.w.buf,
                                                        Tag::Ref,
                                                        id as u64,
                                                    );
                                                    at = e.pos;
                                                    continue;
                                                }
                                                ObjState::New if vk == kind::TABLE => {
                                                    if let Some(info) = self.new_table_info(v) {
                                                        self.write_scanned(kk, e.kbits);
                                                        opened =
                                                            Some((v, info, 1, std::ptr::null()));
                                                    }
                                                }
                                                ObjState::New => {
                                                    if let Some(info) =
                                                        self.closure_info_scanned(vk, v)
                                                    {
                                                        self.write_scanned(kk, e.kbits);
                                                        self.write_closure(v, info);
                                                        at = e.pos;
                                                        continue;
                                                    }
                                                }
                                                ObjState::Permanent => {}
                                            }
                                        }
                                    } else {
                                        // A key that is an object (or else): described in full.
                                        let (ek, ev) =
                                            (full_val(kk, e.kbits), full_val(vk, e.vbits));
                                        match self.classify(&ek) {
                                            Ok(kid) => match self.classify(&ev) {
                                                Ok(vid) => {
                                                    self.write_classified(&ek, kid);
                                                    self.write_classified(&ev, vid);
                                                    at = e.pos;
                                                    continue;
                                                }
                                                Err(true) if vk == kind::TABLE => {
                                                    let v = e.vbits as usize as *const c_void;
                                                    if let Some(info) = self.unseen_table_info(v) {
                                                        self.write_classified(&ek, kid);
                                                        opened =
                                                            Some((v, info, 1, std::ptr::null()));
                                                    }
                                                }
                                                Err(true) => {
                                                    let v = e.vbits as usize as *const c_void;
                                                    if let Some(info) = self.closure_info(vk, v) {
                                                        self.write_classified(&ek, kid);
                                                        self.write_closure(v, info);
                                                        at = e.pos;
                                                        continue;
                                                    }
                                                }
                                                Err(false) => {}
                                            },
                                            Err(true) if kk == kind::TABLE => {
                                                let k = e.kbits as usize as *const c_void;
                                                if let Some(info) = self.unseen_table_info(k) {
                                                    opened = Some((k, info, 2, k));
                                                }
                                            }
                                            Err(_) => {}
                                        }
                                    }
                                    if i == end || self.sc.scan.len() > SCAN_KEEP {
                                        // Nothing left to keep, or too much kept already.
                                        self.sc.scan.truncate(floor);
                                        (i, end) = (floor, floor);
                                        exhausted = false;
                                    }
                                    let gen_now = self.scan_gen;
                                    if let Some(Frame::Table {
                                        pos, lo, hi, gen, ..
                                    }) = self.sc.frames.get_mut(depth - 1)
                                    {
                                        (*pos, *lo, *hi, *gen) =
                                            (e.pos, i as u32, end as u32, gen_now);
                                    }
                                    if let Some((child, info, st, k)) = opened {
                                        // A new table's frame goes on top: this one goes on after it.
                                        if let Some(Frame::Table { state, key, .. }) =
                                            self.sc.frames.get_mut(depth - 1)
                                        {
                                            (*state, *key) = (st, k);
                                        }
                                        self.table_header(child, info);
                                        // Its entries next, here (as `run` would).
                                        continue 'frames;
                                    }
                                    // The general path, for this entry: pushed, then written.
                                    let base = ffi::lua_gettop(L);
                                    if luasnap_table_next(L, t, &mut at) == 0 {
                                        break; // cannot happen: the entry was just scanned
                                    }
                                    let key_ptr = ffi::lua_topointer(L, -1);
                                    self.value(L, s)?;
                                    if self.sc.frames.len() > depth {
                                        // The key is a new object whose contents come first.
                                        ffi::lua_settop(L, base);
                                        if let Some(Frame::Table { state, key, .. }) =
                                            self.sc.frames.get_mut(depth - 1)
                                        {
                                            *state = 2;
                                            *key = key_ptr;
                                        }
                                        return Ok(true);
                                    }
                                    self.value(L, s)?;
                                    if self.sc.frames.len() > depth {
                                        ffi::lua_settop(L, base);
                                        return Ok(true);
                                    }
                                    if self.scan_gen != gen_now {
                                        i = end; // Lua code ran: scan again from `at`
                                        exhausted = false;
                                    }
                                }
                                self.sc.scan.truncate(floor);
                                self.end_table(L, t);
                                // Done: back to the frame below, here (as `run` would).
                                self.sc.frames.pop();
                                if self.sc.frames.is_empty() {
                                    return Ok(true);
                                }
                                continue 'frames;
                            }
                        }
                    }
                    Frame::LClosure { id, next, n } | Frame::CClosure { id, next, n } => {
                        let (id, i, n) = (*id, *next, *n);
                        if i > n {
                            return Ok(false);
                        }
                        *next += 1;
                        self.sc.segs.push(Seg::Upvalue(i));
                        ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                        let is_lua = ffi::lua_iscfunction(L, -1) == 0;
                        if is_lua {
                            // An upvalue still open in a suspended coroutine's stack: keep the link.
                            let (mut owner, mut level) = (std::ptr::null_mut(), 0);
                            if luasnap_upval_open(L, -1, i, &mut owner, &mut level) != 0
                                && owner != L
                            {
                                ffi::lua_settop(L, -2);
                                luasnap_checkstack(L, 2, c"persist".as_ptr());
                                let main = ffi::lua_pushthread(owner) == 1;
                                ffi::lua_settop(owner, -2);
                                if !main {
                                    self.w.tag(Tag::UpvalOpen);
                                    self.w.varint(level as u64);
                                    ffi::lua_pushthread(owner);
                                    ffi::lua_xmove(owner, L, 1);
                                    self.value(L, s)?;
                                    return Ok(true);
                                }
                                ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                            }
                            let uid = ffi::lua_upvalueid(L, -1, i) as *const c_void;
                            if let Some((owner, index)) = self.upval_home(uid) {
                                ffi::lua_settop(L, -2);
                                self.w.tag(Tag::UpvalRef);
                                self.w.varint(owner as u64);
                                self.w.varint(index as u64);
                                return Ok(true);
                            }
                            self.set_upval_home(uid, id, i);
                            self.w.tag(Tag::UpvalNew);
                        }
                        ffi::lua_getupvalue(L, -1, i);
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_settop(L, -2);
                        self.value(L, s)?;
                        Ok(true)
                    }
                    Frame::UdBytes { id, state, nuv } => {
                        let (id, st, nuv) = (*id, *state, *nuv);
                        if st > nuv {
                            return Ok(false);
                        }
                        *state += 1;
                        ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                        if st == 0 {
                            self.sc.segs.push(Seg::Meta);
                            if ffi::lua_getmetatable(L, -1) == 0 {
                                ffi::lua_pushnil(L);
                            }
                        } else {
                            self.sc.segs.push(Seg::UserValue(st));
                            ffi::lua_getiuservalue(L, -1, st);
                        }
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_settop(L, -2);
                        self.value(L, s)?;
                        Ok(true)
                    }
                    Frame::Special { id, state, two } => {
                        let (id, st, two) = (*id, *state, *two);
                        if st >= if two { 2 } else { 1 } {
                            return Ok(false);
                        }
                        *state += 1;
                        self.sc.segs.push(Seg::Special(st));
                        ffi::lua_rawgeti(L, s.seen, -(id as ffi::lua_Integer) - 1);
                        ffi::lua_rawgeti(L, -1, st as ffi::lua_Integer + 1);
                        ffi::lua_rotate(L, -2, 1);
                        ffi::lua_settop(L, -2);
                        self.value(L, s)?;
                        Ok(true)
                    }
                    Frame::Thread { id, next, n, nci } => {
                        let (id, i, n, nci) = (*id, *next, *n, *nci);
                        ffi::lua_rawgeti(L, s.seen, id as ffi::lua_Integer);
                        let co = ffi::lua_tothread(L, -1);
                        ffi::lua_settop(L, -2);
                        if i > n {
                            // Suspended: the frames, after the stack values they refer to.
                            if nci > 0 {
                                self.w.varint(nci as u64);
                                let mut cis = vec![std::mem::zeroed::<CiRecord>(); nci as usize];
                                luasnap_thread_cis(co, cis.as_mut_ptr(), nci);
                                for r in cis {
                                    self.w.varint(r.func as u64);
                                    self.w.varint(r.top as u64);
                                    self.w.varint(r.callstatus as u64);
                                    self.w.i64(r.u2 as i64);
                                    self.w.varint(r.pc as u64);
                                    self.w.varint(r.nextraargs.max(0) as u64);
                                    self.w.i64(r.old_errfunc);
                                    self.w.i64(r.ctx);
                                    if r.k.is_null() {
                                        self.w.tag(Tag::Nil);
                                    } else {
                                        ffi::lua_pushlightuserdata(L, r.k.cast_mut());
                                        if ffi::lua_rawget(L, s.perms) != ffi::LUA_TSTRING {
                                            ffi::lua_settop(L, -2);
                                            let what = "cannot persist a coroutine suspended inside a C function whose continuation is not a permanent (only pcall/xpcall and coroutine.yield are known)".to_string();
                                            return Err(self.fail(L, what));
                                        }
                                        self.value(L, s)?;
                                    }
                                }
                                // Pending to-be-closed variables, as stack offsets, oldest first.
                                let n = luasnap_thread_tbc(co, std::ptr::null_mut(), 0);
                                let mut slots = vec![0i32; n.max(0) as usize];
                                luasnap_thread_tbc(co, slots.as_mut_ptr(), n);
                                self.w.varint(slots.len() as u64);
                                for slot in slots {
                                    self.w.varint(slot as u64);
                                }
                            }
                            return Ok(false);
                        }
                        if let Some(Frame::Thread { next, .. }) = self.sc.frames.last_mut() {
                            *next += 1;
                        }
                        self.sc.segs.push(Seg::Stack(i));
                        luasnap_checkstack(L, 2, c"persist".as_ptr());
                        luasnap_thread_push_slot(L, co, i);
                        self.value(L, s)?;
                        Ok(true)
                    }
                };
            }
        }
    }
}

/// Records the path (child indices from the main prototype) of `p` and of every prototype
/// below it, by fingerprint; the first of equal fingerprints wins (equal fingerprints are
/// equal functions). `hashes`: the fingerprints of `p`'s tree in pre-order (from
/// `luasnap_proto_tree_hashes`, read from `*at` on), or None to hash each prototype alone.
/// Every fingerprint also goes to `memo`, by prototype.
///
/// # Safety
/// `p` is a live prototype.
unsafe fn tree_paths(
    p: *const c_void,
    path: &mut Vec<u32>,
    out: &mut HashMap<u64, Vec<u32>>,
    hashes: Option<&[u64]>,
    at: &mut usize,
    memo: &mut HashMap<*const c_void, u64>,
) {
    // SAFETY: callers' contract; children of a live prototype are alive.
    unsafe {
        let hash = match hashes.and_then(|hs| hs.get(*at)) {
            Some(&h) => h,
            None => luasnap_proto_hash(p),
        };
        *at += 1;
        memo.insert(p, hash);
        out.entry(hash).or_insert_with(|| path.clone());
        for i in 0..luasnap_proto_nchildren(p) {
            path.push(i as u32);
            tree_paths(luasnap_proto_child(p, i), path, out, hashes, at, memo);
            path.pop();
        }
    }
}

/// A short text for the key on top of the stack, as a path segment (`.name` or `[repr]`).
unsafe fn key_text(L: *mut lua_State) -> String {
    // SAFETY: reads a primitive without conversion.
    unsafe {
        match ffi::lua_type(L, -1) {
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                let b = std::slice::from_raw_parts(p.cast::<u8>(), len);
                match std::str::from_utf8(b) {
                    Ok(s) if crate::bridge::ffi::valid_path(s) && !s.contains('.') => {
                        format!(".{s}")
                    }
                    Ok(s) => format!("[{s:?}]"),
                    Err(_) => "[<bytes>]".into(),
                }
            }
            ffi::LUA_TNUMBER if ffi::lua_isinteger(L, -1) != 0 => {
                format!("[{}]", ffi::lua_tointegerx(L, -1, std::ptr::null_mut()))
            }
            ffi::LUA_TNUMBER => format!("[{}]", ffi::lua_tonumberx(L, -1, std::ptr::null_mut())),
            ffi::LUA_TBOOLEAN => format!("[{}]", ffi::lua_toboolean(L, -1) != 0),
            ffi::LUA_TNIL => String::new(),
            _ => format!("[<{}>]", crate::bridge::ffi::type_name(L, -1)),
        }
    }
}
