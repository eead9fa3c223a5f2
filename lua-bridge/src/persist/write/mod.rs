//! Persisting: Lua values to the save-game format.
//!
//! Depth first, without recursion on the native stack and with O(1) Lua stack: each object
//! being written is a [`Frame`] on a Rust stack; tables are iterated by entry position (array
//! part, then hash nodes: `luasnap_table_scan` and `luasnap_table_next` in
//! `csrc/tscan.c`), so resuming a table after a child object costs no key lookup, and a
//! million-deep linked list needs a million small frames and nothing more.
//!
//! Two paths. The scan describes a table's entries without pushing them; primitives,
//! strings, objects already written, new tables and closures whose upvalues are plain are
//! written straight from it ([`plain`], [`table`], [`closure`]), tables and closures tracked
//! by identity and anchored only before Lua code runs (see [`Persister::anchor`]). Everything
//! else goes the general way: the value pushed, inspected through the C API
//! ([`Persister::value`]), its header written by its kind's file and its contents a frame
//! that [`Persister::advance`] hands to that file, one child at a time. Both paths write
//! through the format's records and scalars (`format/`), inlined, and a frame writes its
//! object's parts in the order of the cursor it holds (`format/parts.rs`).
//!
//! | file | writes |
//! |---|---|
//! | `persister.rs` | the writer's state (`Persister`), which every other file extends |
//! | `frame.rs` | the frames of objects being written, and their path segments |
//! | `table.rs`, `layout.rs` | tables: header, metatable, entries, hash layout |
//! | `closure.rs`, `proto.rs` | Lua closures and their upvalues; prototypes and chunk homes |
//! | `cclosure.rs` | C closures (a permanent function and its upvalues) |
//! | `thread.rs` | coroutines: state, stack, call frames |
//! | `userdata.rs` | userdata: plain data, or bytes, metatable and user values |
//! | `special.rs` | `__persist` results and permanents |
//! | `plain.rs` | primitives, strings and references, from the stack or a scan |
//! | `ids.rs`, `scratch.rs` | the id table, working memory |
//! | `path.rs` | where the writer is, for error messages |
//! | `csrc.rs` | every C helper the writer calls |
//!
//! The imports run one way: this file (the dispatcher: a value by its type, a frame by its
//! kind) over the kinds' files, over `persister.rs`, over `scratch.rs`, over `frame.rs`,
//! `ids.rs` and `csrc.rs`.
//!
//! # Invariants
//!
//! Every `unsafe` block of the writer relies on one or more of these, by name.
//!
//! - **Protected.** The writer runs only inside `persist_protected`'s protected call, on the
//!   thread `L` running it, with the helper tables at the stack slots [`Slots`] names. Lua
//!   errors (out of memory, or raised by a `__persist` function) longjmp out of the writer's
//!   frames, so none of them holds a value with a destructor across a call that can raise:
//!   all Rust state lives in [`Persister`], owned outside the protected call, and error
//!   messages are built after the last call that can raise.
//! - **Room.** Every step pops what it pushes and holds at most 8 values above the helper
//!   tables and the root, within the `LUA_MINSTACK` (20) slots Lua gives the job's C
//!   function; a step that pushes a coroutine's values checks for room first.
//! - **Alive.** The collector and emergency collections are stopped for the whole persist,
//!   so an object the writer met stays alive at its address until Lua code runs. Only a
//!   `__persist` function runs Lua code, and [`Persister::anchor`] runs first: it anchors
//!   every object recorded by identity alone and forgets what Lua code could invalidate.
//! - **Fresh.** A description from a C scan (table entries, a closure's upvalues, a string's
//!   bytes) describes the object as it is while no Lua code ran since: its identities are
//!   live objects, its string pointers point at their bytes. Table frames keep a batch only
//!   while `scan_gen`, which [`Persister::anchor`] changes, says so.

mod cclosure;
mod closure;
mod csrc;
mod finals;
mod frame;
mod ids;
mod layout;
mod path;
mod persister;
mod plain;
mod proto;
mod removed;
mod scratch;
mod special;
mod table;
mod thread;
mod userdata;

pub(crate) use layout::layout_blob;
pub(crate) use persister::Persister;
pub(crate) use removed::game_removed_nodes;
pub(crate) use scratch::GameRemovedNode;

use super::slots::Slots;
use csrc::{luasnap_anchor, luasnap_gc_stopem};
use frame::Frame;
use ids::IdSpace;
use mlua_sys::{self as ffi, lua_State};
use persister::Fail;
use std::ffi::{c_int, c_void};

impl Persister<'_> {
    /// Writes the value on top of the stack (popped). `s` locates the helper tables.
    ///
    /// # Safety
    /// Runs as the module docs' **Protected** says (inside `persist_protected`'s protected
    /// call, `s` the absolute indices of its helper tables, the value on top), with the
    /// collector stopped (**Alive**).
    pub unsafe fn run(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // No emergency collection while objects are known by address (ids, kept scan
        // batches): one clearing a weak table could free what they point to. The caller
        // puts the flag back.
        // SAFETY: sets a flag of the global state.
        unsafe { luasnap_gc_stopem(L, 1) };
        // SAFETY: Protected: the permanents table is at s.perms.
        unsafe { self.note_permanents(L, s) };
        // SAFETY: Protected: pushes the key (may raise a memory error) and stores it in the
        // strings table at s.strs, which anchors it (**Alive** for its identity).
        unsafe {
            ffi::lua_pushlstring(L, self.spkey.as_ptr(), self.spkey.as_bytes().len());
            self.spkey_str = ffi::lua_topointer(L, -1);
            ffi::lua_rawseti(L, s.strs, 0);
        }
        // SAFETY: a query of the heap's size.
        let used = unsafe { ffi::lua_gc(L, ffi::LUA_GCCOUNT) } as usize * 1024;
        self.w.buf.reserve(used / 4);
        self.sc.refs.reserve(used);
        // SAFETY: Protected, with the root value on top (callers' contract).
        unsafe { self.value(L, s)? };
        while !self.sc.frames.is_empty() {
            // SAFETY: Protected (callers' contract).
            unsafe { self.advance(L, s)? };
        }
        if self.game {
            // SAFETY: Protected, the root written, the collector stopped (callers' contract).
            unsafe { self.pending_finalizers(L, s)? };
        }
        // SAFETY: Protected, everything written, the collector stopped (callers' contract).
        unsafe { self.removed_keys(L, s)? };
        if self.game {
            // SAFETY: as above.
            unsafe { self.game_removed_keys(L, s)? };
        }
        Ok(())
    }

    /// Gives the identity of every permanent that is an object an entry in the id table
    /// (`IdSpace::Perm`): a few hundred entries, looked up once, so that the fast paths see a
    /// permanent in the id slot they read anyway.
    ///
    /// # Safety
    /// Protected; the permanents table (value -> name) is at `s.perms`.
    unsafe fn note_permanents(&mut self, L: *mut lua_State, s: Slots) {
        // SAFETY: Protected; lua_next walks a table nothing changes meanwhile, each turn pops
        // the name and keeps the key (the value) for the next turn.
        unsafe {
            ffi::lua_pushnil(L);
            while ffi::lua_next(L, s.perms) != 0 {
                ffi::lua_pop(L, 1);
                if !matches!(
                    ffi::lua_type(L, -1),
                    ffi::LUA_TNIL | ffi::LUA_TBOOLEAN | ffi::LUA_TNUMBER | ffi::LUA_TSTRING
                ) {
                    let p = ffi::lua_topointer(L, -1);
                    self.sc.refs.insert(p, IdSpace::Perm, 0);
                }
            }
        }
    }

    /// Moves the top frame on by one child, or ends it (popping it). A table frame goes on
    /// into the tables it opens and back, without a return here for each (see `table.rs`).
    ///
    /// # Safety
    /// Protected; the frames describe objects anchored or reachable (**Alive**).
    unsafe fn advance(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let depth = self.sc.frames.len();
        // Path bookkeeping: the frame's current child gets the segment at depth - 1.
        self.sc.segs.truncate(depth - 1);
        // SAFETY: callers' contract, which each kind's `advance_*` takes over.
        unsafe {
            match self.sc.frames[depth - 1] {
                Frame::Table(_) => self.advance_table(L, s),
                Frame::LClosure(_) => self.advance_lclosure(L, s),
                Frame::CClosure(_) => self.advance_cclosure(L, s),
                Frame::Userdata(_) => self.advance_userdata(L, s),
                Frame::Special(_) => self.advance_special(L, s),
                Frame::Thread(_) => self.advance_thread(L, s),
            }
        }
    }

    /// Writes the value on top (popped): primitives and references at once, new objects as a
    /// header plus a frame for their contents.
    ///
    /// # Safety
    /// Protected, with the value on top.
    unsafe fn value(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: Protected; the value is on top.
        let t = unsafe { ffi::lua_type(L, -1) };
        match t {
            ffi::LUA_TNIL => plain::Plain::Nil.encode(&mut self.w),
            // SAFETY: a boolean is on top.
            ffi::LUA_TBOOLEAN => unsafe { self.boolean_on_top(L) },
            // SAFETY: a number is on top.
            ffi::LUA_TNUMBER => unsafe { self.number_on_top(L) },
            // SAFETY: a string is on top.
            ffi::LUA_TSTRING => unsafe { self.string_on_top(L) },
            ffi::LUA_TLIGHTUSERDATA => {
                // SAFETY: Protected; a light userdata is on top.
                if unsafe { self.permanent(L, s) } {
                    return Ok(());
                }
                // SAFETY: a light userdata is on top.
                unsafe { self.light_on_top(L) }
            }
            // SAFETY: Protected; an object is on top.
            _ => return unsafe { self.object(L, s, t) },
        }
        // SAFETY: the value is on top.
        unsafe { ffi::lua_pop(L, 1) };
        Ok(())
    }

    /// Writes the object on top (popped), of Lua type `t`: a reference if written already,
    /// a permanent's name, or a header and a frame for its contents.
    ///
    /// # Safety
    /// Protected, with the object on top.
    unsafe fn object(&mut self, L: *mut lua_State, s: Slots, t: c_int) -> Result<(), Fail> {
        // SAFETY: the object is on top.
        let ptr = unsafe { ffi::lua_topointer(L, -1) };
        if let Some(id) = self.sc.refs.get(ptr, IdSpace::Obj) {
            plain::Plain::Ref(id as u64).encode(&mut self.w);
            // SAFETY: the object is on top.
            unsafe { ffi::lua_pop(L, 1) };
            return Ok(());
        }
        // SAFETY: Protected; the object is on top.
        if unsafe { self.permanent(L, s) } {
            return Ok(());
        }
        // Anchor it (keeps it alive and findable by id), then write its header.
        let id = self.new_id(ptr);
        // SAFETY: Protected: seen[id] = the object (may raise a memory error).
        unsafe {
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawseti(L, s.seen, id as ffi::lua_Integer);
        }
        // SAFETY: Protected; an object of type t is on top, anchored as `id` (each kind's
        // header takes this over and leaves the object on top).
        unsafe {
            match t {
                ffi::LUA_TTABLE => self.table(L, s, id, ptr)?,
                ffi::LUA_TFUNCTION if ffi::lua_iscfunction(L, -1) == 0 => self.lclosure(L, id),
                ffi::LUA_TFUNCTION => self.cclosure(L, s, id)?,
                ffi::LUA_TUSERDATA => self.userdata(L, s, id)?,
                ffi::LUA_TTHREAD => self.thread(L)?,
                _ => {
                    let name = crate::bridge::ffi::type_name(L, -1);
                    let what = format!("cannot persist a value of type {name}");
                    return Err(self.fail(L, what));
                }
            }
        }
        // SAFETY: the object is on top.
        unsafe { ffi::lua_pop(L, 1) };
        Ok(())
    }

    /// Gives the object `p` the next object id.
    #[inline(always)]
    fn new_id(&mut self, p: *const c_void) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.sc.refs.insert(p, IdSpace::Obj, id);
        id
    }

    /// Gives the object `p`, written by identity, its id, and lists it for `anchor`.
    #[inline(always)]
    fn record(&mut self, p: *const c_void) -> u32 {
        let id = self.new_id(p);
        self.sc.unanchored_objs.push(p);
        self.sc.unanchored_ids.push(id as ffi::lua_Integer);
        id
    }

    /// Whether `p` is the identity of a permanent not written yet (then the general path
    /// writes it, by name).
    #[inline]
    fn is_permanent(&self, p: *const c_void) -> bool {
        self.sc.refs.get(p, IdSpace::Perm).is_some()
    }

    /// Whether the object `p` is neither written yet nor a permanent (which the general path
    /// writes by name).
    fn unwritten(&self, p: *const c_void) -> bool {
        !self.sc.refs.contains(p) && !self.is_permanent(p)
    }

    /// Anchors the strings, tables and closures recorded by identity since the last call
    /// (strings in the strings table, the others in `seen` under their ids), and forgets what
    /// is known by identity alone. Identities are only valid while the objects live: until
    /// Lua code runs, every one recorded is reachable from the unchanged graph (**Alive**),
    /// but a `__persist` function may change the graph and run a full collection, and a freed
    /// object's address could come back as another object. So this runs before every call
    /// into Lua code.
    ///
    /// # Safety
    /// Protected; no Lua code ran since the objects were recorded.
    unsafe fn anchor(&mut self, L: *mut lua_State, s: Slots) {
        let strs = &self.sc.unanchored;
        // SAFETY: Protected (allocates); every pointer is a live string (callers' contract),
        // stored at strs[anchored + 1 ..], the string ids + 1.
        unsafe {
            let first = self.anchored as ffi::lua_Integer + 1;
            let n = strs.len() as c_int;
            luasnap_anchor(L, s.strs, strs.as_ptr(), std::ptr::null(), n, first);
        }
        let (objs, ids) = (&self.sc.unanchored_objs, &self.sc.unanchored_ids);
        // SAFETY: as above; every pointer is a live table or closure, stored at seen[id].
        unsafe {
            luasnap_anchor(
                L,
                s.seen,
                objs.as_ptr(),
                ids.as_ptr(),
                objs.len() as c_int,
                0,
            )
        };
        // Lua code runs next: scanned batches waiting in parent frames are stale, and so are
        // the layouts cached by string identity, the metatable answer and the fingerprints.
        self.scan_gen = self.scan_gen.wrapping_add(1);
        self.sc.layout.forget_layouts();
        self.last_meta = (std::ptr::null(), false);
        self.proto_hashes.clear();
        self.anchored += self.sc.unanchored.len() as u32;
        self.sc.unanchored.clear();
        self.sc.unanchored_objs.clear();
        self.sc.unanchored_ids.clear();
    }
}
