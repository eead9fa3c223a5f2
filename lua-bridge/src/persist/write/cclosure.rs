//! C closures: the bare function's name among the permanents (a C function cannot be saved
//! any other way), then its upvalues. A load rebuilds only closures whose function it knows
//! the upvalues of (`coroutine.wrap`'s); the writer writes any it can name.

use super::super::format::{Ident, Tag};
use super::super::permanents::GMATCH_AUX;
use super::super::slots::Slots;
use super::csrc::luasnap_identity_at;
use super::frame::{Frame, Seg, UpvalueFrame};
use super::persister::{push_seen, replace_with_upvalue, Fail, Persister};
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, CStr};

impl Persister<'_> {
    /// Writes the C function on top (left there; anchored as `id`): its name among the
    /// permanents and its upvalue count, with a frame for the upvalues.
    ///
    /// # Safety
    /// Protected, with a C function on top.
    pub(super) unsafe fn cclosure(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
    ) -> Result<(), Fail> {
        // SAFETY: a C function is on top.
        let n = unsafe { count_upvalues(L) };
        // SAFETY: a C function is on top; reads only (0 for a light one: not an object).
        let ident = Ident(unsafe { luasnap_identity_at(L, -1) });
        // SAFETY: Room; a C function is on top; the permanents table is at s.perms.
        unsafe { push_permanent_name(L, s) };
        // SAFETY: the name (or nil) is on top.
        if let Err(what) = unsafe { check_name(L, n) } {
            // SAFETY: the name (or nil) is on top.
            unsafe { ffi::lua_pop(L, 1) };
            return Err(self.fail(L, what.to_string()));
        }
        ident.encode(&mut self.w);
        self.w.tag(Tag::CClosure);
        // SAFETY: Protected, with the name on top.
        unsafe { self.value(L, s)? };
        self.w.varint(n as u64);
        let frame = UpvalueFrame::new(id, n);
        self.sc.frames.push(Frame::CClosure(frame));
        Ok(())
    }

    /// Writes the next upvalue of the C closure frame on top, or ends it.
    ///
    /// # Safety
    /// Protected; the frame's closure is anchored at `seen[id]`.
    pub(super) unsafe fn advance_cclosure(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let Some(Frame::CClosure(f)) = self.sc.frames.last_mut() else {
            unreachable!("the dispatcher calls this for a C closure frame");
        };
        let Some((id, i)) = f.next_upvalue() else {
            self.sc.frames.pop();
            return Ok(());
        };
        self.sc.segs.push(Seg::Upvalue(i));
        // SAFETY: Room; the closure is anchored at seen[id], and has upvalue i.
        unsafe {
            push_seen(L, s, id);
            replace_with_upvalue(L, i);
        }
        // SAFETY: Protected, with the upvalue's value on top.
        unsafe { self.value(L, s) }
    }
}

/// The number of upvalues of the C function on top.
///
/// # Safety
/// A C function is on top, and room for one more value.
unsafe fn count_upvalues(L: *mut lua_State) -> c_int {
    let mut n = 0;
    // SAFETY: callers' contract; each upvalue pushed is popped at once.
    unsafe {
        while !ffi::lua_getupvalue(L, -1, n + 1).is_null() {
            ffi::lua_pop(L, 1);
            n += 1;
        }
    }
    n
}

/// Pushes the name of the C function on top among the permanents (a value -> name table),
/// looked up by its bare function (without upvalues), or nil.
///
/// # Safety
/// A C function is on top, room for one more value; the permanents table is at `s.perms`.
unsafe fn push_permanent_name(L: *mut lua_State, s: Slots) {
    // SAFETY: callers' contract; a light C function allocates nothing, rawget raises nothing.
    unsafe {
        match ffi::lua_tocfunction(L, -1) {
            Some(f) => ffi::lua_pushcclosure(L, f, 0),
            None => ffi::lua_pushnil(L),
        }
        ffi::lua_rawget(L, s.perms);
    }
}

/// Whether the permanent's name on top (or nil) lets a C function with `n` upvalues be
/// written; if not, why.
///
/// # Safety
/// The value `push_permanent_name` pushed is on top.
unsafe fn check_name(L: *mut lua_State, n: c_int) -> Result<(), &'static str> {
    // SAFETY: callers' contract.
    let t = unsafe { ffi::lua_type(L, -1) };
    if !matches!(t, ffi::LUA_TSTRING | ffi::LUA_TNUMBER) {
        return Err(if n == 0 {
            "attempt to persist a light C function that is not a permanent: register it \
             (Vm::register_native, or perms[fn] = \"name\" in eris.persist)"
        } else {
            "attempt to persist a C closure whose function is not a permanent: add the function \
             to the permanents table"
        });
    }
    // string.gmatch's iterator keeps a match state with raw pointers into its subject and
    // pattern (a userdata without __persist): say so, not that.
    // SAFETY: a string is on top when t says so; lua_tostring converts nothing then.
    if t == ffi::LUA_TSTRING && unsafe { CStr::from_ptr(ffi::lua_tostring(L, -1)) } == GMATCH_AUX {
        return Err(
            "a string.gmatch iterator cannot be saved: its match state points into Lua's \
             memory; iterate it to completion before the frame ends, or keep the string and \
             the position (string.find with an init argument) instead",
        );
    }
    Ok(())
}
