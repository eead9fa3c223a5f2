//! The load's id tables: objects by object id (`objs`) and strings by string id (`strs`),
//! numbered in the order the file defines them (see `format`), and the references to them.
//!
//! Invariant: `next_id` objects and `strs` strings have been defined. A reference is checked
//! against these counts before it is looked up, so a lookup never reads an id the file did
//! not define; an object id defined but empty in `objs` is one still being rebuilt (a
//! `__persist` function's), which is refused rather than read as nil.

use super::loader::{Fail, Loader};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

/// Why a reference to an object in the middle of its rebuild is refused.
pub(super) const REBUILDING: &str = "a reference to an object that is still being rebuilt: a __persist rebuild function captured its own object; use two-phase persistence (return a create function and an init function)";

/// Why a load that denies the permanent `_G` refused it where it was.
pub(super) const GLOBALS_ELSEWHERE: &str = "the save puts the globals table (_G) somewhere else than a function's _ENV (a table's entry or metatable, another upvalue, a coroutine's stack): game code writing there would overwrite the globals, so a foreign save names _G only as its functions' _ENV";

/// Pushes the object with id `id` (nil if none).
///
/// # Safety
/// Protected context and a free stack slot; `s` this load's slots.
#[inline(always)]
pub(super) unsafe fn push_obj(L: *mut lua_State, s: Slots, id: u32) -> c_int {
    // SAFETY: s.objs is the absolute index of the objects table; one push (callers' room).
    unsafe { ffi::lua_rawgeti(L, s.objs, id as ffi::lua_Integer) }
}

/// The coroutine with object id `id` (null if that object is none).
///
/// # Safety
/// As [`push_obj`]; the slot is free again on return.
pub(super) unsafe fn thread_of(L: *mut lua_State, s: Slots, id: u32) -> *mut lua_State {
    // SAFETY: callers' contract; the object pushed is popped again.
    unsafe {
        push_obj(L, s, id);
        let co = ffi::lua_tothread(L, -1);
        ffi::lua_settop(L, -2);
        co
    }
}

impl Loader<'_> {
    /// Array sizes for the object and string tables of the load: about what a game's save of
    /// this length needs (the bench heap's: 18 bytes per object, 118 per string; an object
    /// takes 6 bytes or more, a string 8 or more, so a denser file grows them, by doubling).
    /// Sizing them for the densest file (n/6 and n/8) cleared and spread over 460 KB of id
    /// slots per 177 KB body, 4x what the bench save uses: 1.6% of its instructions.
    pub fn helper_sizes(&self) -> (c_int, c_int) {
        let n = self.r.remaining().min(1 << 30);
        ((n / 16) as c_int, (n / 64) as c_int)
    }

    /// The next object id.
    pub(super) fn id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Stores the object on top (left there) as object `id`, with the identity the file gave
    /// it if any (see `ident.rs`), then checks the heap cap.
    ///
    /// # Safety
    /// Protected context (the store may allocate), the object on top and a free slot.
    pub(super) unsafe fn register(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
    ) -> Result<(), Fail> {
        if self.final_waiting() {
            // A finalization record before an identity before another kind of object.
            return Err(self.malformed(
                "a finalization mark before a value that is not a new table or userdata",
            ));
        }
        // SAFETY: callers' contract; the identity the file gave the object first (see
        // `ident.rs`), then a copy of the top stored in objs[id] (an integer key).
        unsafe {
            self.take_identity(L);
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawseti(L, s.objs, id as ffi::lua_Integer);
        }
        self.check_heap(L)
    }

    /// A string (after `Tag::Str`), its bytes `b`: pushed, and given the next string id if
    /// it is long enough to get one in this file's format.
    ///
    /// # Safety
    /// Protected context and two free slots.
    pub(super) unsafe fn string(&mut self, L: *mut lua_State, s: Slots, b: &[u8]) {
        // SAFETY: callers' contract; the bytes are a slice of the body (copied by Lua).
        unsafe { ffi::lua_pushlstring(L, b.as_ptr().cast(), b.len()) };
        if b.len() >= self.strref_len {
            self.strs += 1;
            // SAFETY: callers' contract; s.strs is the strings table; stores a copy of the top.
            unsafe {
                ffi::lua_pushvalue(L, -1);
                ffi::lua_rawseti(L, s.strs, self.strs as ffi::lua_Integer);
            }
        }
    }

    /// A string reference (after `Tag::StrRef`) to string `sid`, checked against the strings
    /// read so far.
    ///
    /// # Safety
    /// Protected context and a free slot.
    pub(super) unsafe fn string_ref(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        sid: u64,
    ) -> Result<(), Fail> {
        if sid >= self.strs as u64 {
            return Err(self.malformed("bad string reference"));
        }
        // SAFETY: callers' contract; strs[sid + 1] was defined (checked above).
        unsafe { ffi::lua_rawgeti(L, s.strs, sid as ffi::lua_Integer + 1) };
        Ok(())
    }

    /// A reference (after `Tag::Ref`) to object `id`, checked against the objects defined so
    /// far; one whose rebuild has not returned yet is refused ([`REBUILDING`]).
    ///
    /// # Safety
    /// Protected context and a free slot.
    pub(super) unsafe fn reference(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u64,
    ) -> Result<(), Fail> {
        if id >= self.next_id as u64 {
            return Err(self.malformed("reference to an object not yet defined"));
        }
        // SAFETY: callers' contract.
        if id == self.globals_id as u64
            && self.globals_denied
            && !unsafe { self.globals_here(L, s) }
        {
            // Refused when the walk ends, with every other refused permanent.
            self.refuse_later(b"_G");
        }
        // SAFETY: callers' contract; the id was defined (checked above).
        if unsafe { push_obj(L, s, id as u32) } == ffi::LUA_TNIL {
            // SAFETY: pops the nil just pushed.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.fail(REBUILDING));
        }
        Ok(())
    }
}
