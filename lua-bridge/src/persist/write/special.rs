//! Special persistence and permanents.
//!
//! A table or userdata whose metatable has the special-persistence key (`__persist` unless
//! configured otherwise) is written as its value says: `true` as usual, `false` refused, a
//! function called with the object: it returns a rebuild function (`Tag::Thunk`), or a create
//! thunk and an initializer (`Tag::TwoPhase`, for cycles through constructors), written by a
//! [`SpecialFrame`]. That call is the only Lua code the writer runs (see **Alive** in the
//! module docs of `write`).
//!
//! A permanent (a value of the permanents table, value -> name) is written by its name.

use super::super::format::{Ident, SpecialPart, SpecialParts, Tag};
use super::super::slots::Slots;
use super::csrc::{luasnap_gc_stopem, luasnap_identity_at};
use super::frame::{Frame, Seg, SpecialFrame};
use super::persister::{Fail, Persister};
use mlua_sys::{self as ffi, lua_State};

/// Where a function a `__persist` function returned sits in the table at `seen[-id - 1]`
/// (its results, in order).
fn slot(part: SpecialPart) -> ffi::lua_Integer {
    match part {
        SpecialPart::Rebuild | SpecialPart::Create => 1,
        SpecialPart::Init => 2,
    }
}

/// The path segment of such a function.
fn seg(part: SpecialPart) -> Seg {
    match part {
        SpecialPart::Rebuild | SpecialPart::Create => Seg::Persist,
        SpecialPart::Init => Seg::PersistInit,
    }
}

impl SpecialFrame {
    fn new(id: u32, two_phase: bool) -> Self {
        SpecialFrame {
            id,
            parts: SpecialParts::new(two_phase),
        }
    }
}

impl Persister<'_> {
    /// Handles the special-persistence key on the table or userdata on top (left there, its
    /// id `id`). Returns true if it wrote the object (as a thunk or two-phase), false to
    /// persist it as usual.
    ///
    /// # Safety
    /// Protected, with the object on top; may run Lua code.
    pub(super) unsafe fn special(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
    ) -> Result<bool, Fail> {
        // SAFETY: Protected (pushes the key: may raise a memory error); the object is on top.
        let t = unsafe { ffi::luaL_getmetafield(L, -1, self.spkey.as_ptr()) };
        if t == ffi::LUA_TNIL {
            return Ok(false);
        }
        if t == ffi::LUA_TFUNCTION {
            // SAFETY: Protected, the function on top, the object below it.
            unsafe { self.call_persist(L, s, id)? };
            return Ok(true);
        }
        // SAFETY: the field is on top.
        let yes = t == ffi::LUA_TBOOLEAN && unsafe { ffi::lua_toboolean(L, -1) } != 0;
        // SAFETY: the field is on top.
        unsafe { ffi::lua_pop(L, 1) };
        if yes {
            return Ok(false);
        }
        let what = if t == ffi::LUA_TBOOLEAN {
            // SAFETY: names the type of the object on top.
            let name = unsafe { crate::bridge::ffi::type_name(L, -1) };
            format!(
                "{name} refuses to be persisted ({} is false)",
                self.opts.spkey
            )
        } else {
            format!("{} must be true, false or a function", self.opts.spkey)
        };
        Err(self.fail(L, what))
    }

    /// Calls the `__persist` function on top with the object below it, keeps what it
    /// returned at `seen[-id - 1]` and writes the object's tag, with a frame for the
    /// functions. Pops the function.
    ///
    /// # Safety
    /// Protected, with the function on top and the object below it.
    unsafe fn call_persist(&mut self, L: *mut lua_State, s: Slots, id: u32) -> Result<(), Fail> {
        // Lua code may free what is known by identity alone: anchor it first.
        // SAFETY: Protected; nothing ran since the objects were recorded.
        unsafe { self.anchor(L, s) };
        // SAFETY: Protected (runs Lua code: anything may be raised); [obj, f] -> [obj, r1, r2].
        // Lua code may collect (everything written is anchored above): the collector must
        // find emergency collections allowed (lgc.c's singlestep asserts it).
        unsafe {
            ffi::lua_pushvalue(L, -2);
            luasnap_gc_stopem(L, 0);
            ffi::lua_callk(L, 1, 2, 0, None);
            luasnap_gc_stopem(L, 1);
        }
        // SAFETY: the two results are on top.
        let (first, second) = unsafe { (ffi::lua_type(L, -2), ffi::lua_type(L, -1)) };
        let two_phase = second != ffi::LUA_TNIL;
        if first != ffi::LUA_TFUNCTION || (two_phase && second != ffi::LUA_TFUNCTION) {
            // SAFETY: the two results are on top.
            unsafe { ffi::lua_pop(L, 2) };
            let what = format!("{} must return a function (or two)", self.opts.spkey);
            return Err(self.fail(L, what));
        }
        // Keep the functions reachable by id while their frame runs: seen[-id - 1] = {r1, r2}.
        // SAFETY: Protected (allocates); [obj, r1, r2] -> [obj, {r1, r2}] -> [obj].
        unsafe {
            ffi::lua_createtable(L, 2, 0);
            ffi::lua_rotate(L, -3, 1);
            ffi::lua_rawseti(L, -3, 2);
            ffi::lua_rawseti(L, -2, 1);
            ffi::lua_rawseti(L, s.seen, -(id as ffi::lua_Integer) - 1);
        }
        // The object the functions rebuild takes its identity (see `Ident`).
        // SAFETY: the object is on top; reads only.
        Ident(unsafe { luasnap_identity_at(L, -1) }).encode(&mut self.w);
        self.w
            .tag(if two_phase { Tag::TwoPhase } else { Tag::Thunk });
        let frame = SpecialFrame::new(id, two_phase);
        self.sc.frames.push(Frame::Special(frame));
        Ok(())
    }

    /// Writes the next function of the special frame on top, or ends it.
    ///
    /// # Safety
    /// Protected; the frame's functions are at `seen[-id - 1]`.
    pub(super) unsafe fn advance_special(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let Some(Frame::Special(f)) = self.sc.frames.last_mut() else {
            unreachable!("the dispatcher calls this for a special frame");
        };
        let id = f.id;
        let Some(part) = f.parts.next() else {
            self.sc.frames.pop();
            return Ok(());
        };
        self.sc.segs.push(seg(part));
        // SAFETY: Room; seen[-id - 1] is the table `call_persist` stored: [t] -> [fn].
        unsafe {
            ffi::lua_rawgeti(L, s.seen, -(id as ffi::lua_Integer) - 1);
            ffi::lua_rawgeti(L, -1, slot(part));
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_pop(L, 1);
        }
        // SAFETY: Protected, with the function on top.
        unsafe { self.value(L, s) }
    }

    /// If the value on top is a permanent, writes it (popped) by name and returns true.
    ///
    /// # Safety
    /// Protected, with the value on top, a light userdata or an object.
    pub(super) unsafe fn permanent(&mut self, L: *mut lua_State, s: Slots) -> bool {
        // SAFETY: the value is on top.
        let (t, p) = unsafe { (ffi::lua_type(L, -1), ffi::lua_topointer(L, -1)) };
        // Objects that are permanents have an id-table entry (see `note_permanents`).
        if t != ffi::LUA_TLIGHTUSERDATA && !self.is_permanent(p) {
            return false;
        }
        // SAFETY: Room; rawget on the permanents table (value -> name) raises nothing.
        let found = unsafe {
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawget(L, s.perms) != ffi::LUA_TNIL
        };
        if !found {
            // SAFETY: the nil rawget pushed is on top.
            unsafe { ffi::lua_pop(L, 1) };
            return false;
        }
        self.w.tag(Tag::Perm);
        // SAFETY: the name is on top.
        let kt = unsafe { ffi::lua_type(L, -1) };
        // A permanent's name is a primitive: written as a value (anything else as nil).
        if matches!(kt, ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN) {
            // SAFETY: Protected, with a primitive on top (no frame, nothing raised).
            let _ = unsafe { self.value(L, s) };
        } else {
            // SAFETY: the name is on top.
            unsafe { ffi::lua_pop(L, 1) };
            self.w.tag(Tag::Nil);
        }
        if t != ffi::LUA_TLIGHTUSERDATA {
            self.new_id(p);
        }
        // SAFETY: the permanent is on top again.
        unsafe { ffi::lua_pop(L, 1) };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{seg, slot, SpecialParts};
    use crate::persist::write::frame::Seg;

    #[test]
    fn a_two_phase_special_writes_create_then_init_from_their_slots() {
        let slots: Vec<_> = SpecialParts::new(true).map(|p| (slot(p), seg(p))).collect();
        assert_eq!(slots, [(1, Seg::Persist), (2, Seg::PersistInit)]);
        let one: Vec<_> = SpecialParts::new(false)
            .map(|p| (slot(p), seg(p)))
            .collect();
        assert_eq!(one, [(1, Seg::Persist)]);
    }
}
