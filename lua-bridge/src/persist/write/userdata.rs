//! Full userdata: registered plain data by type name and bytes; else through `__persist`
//! (see `special.rs`): `true` writes its bytes, metatable and user values (a frame), a
//! function writes what it returns, anything else is refused.

use super::super::format::{Ident, PlainUserdata, UserdataBytes, UserdataPart, UserdataParts};
use super::super::slots::Slots;
use super::csrc::{luasnap_final_state_at, luasnap_identity_at};
use super::frame::{Frame, Seg, UserdataFrame};
use super::persister::{push_seen, Fail, Persister};
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

impl UserdataFrame {
    fn new(id: u32, nuv: c_int) -> Self {
        UserdataFrame {
            id,
            parts: UserdataParts::new(nuv as u32),
        }
    }
}

impl Persister<'_> {
    /// Writes the userdata on top (left there; anchored as `id`).
    ///
    /// # Safety
    /// Protected, with a full userdata on top.
    pub(super) unsafe fn userdata(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
    ) -> Result<(), Fail> {
        // SAFETY: a full userdata is on top, with room for its metatable.
        if unsafe { self.plain_data(L) } {
            return Ok(());
        }
        // SAFETY: callers' contract (may call its __persist function).
        if unsafe { self.special(L, s, id)? } {
            return Ok(());
        }
        // SAFETY: Protected (pushes the key: may raise a memory error).
        let field = unsafe { ffi::luaL_getmetafield(L, -1, self.spkey.as_ptr()) };
        if field == ffi::LUA_TNIL {
            let what = format!(
                "cannot persist a userdata without {key}: give its metatable {key} = true (bytes), \
                 a function, or register it as PlainData",
                key = self.opts.spkey
            );
            return Err(self.fail(L, what));
        }
        // `special` left it to us: __persist = true. Its bytes, metatable and user values.
        // SAFETY: the field is on top, the userdata below it.
        unsafe { ffi::lua_pop(L, 1) };
        // SAFETY: a full userdata is on top.
        let (bytes, nuv) = unsafe { (userdata_bytes(L), count_user_values(L)) };
        // SAFETY: the userdata is on top; reads its mark and its metatable's __gc.
        unsafe {
            let mut o = std::ptr::null();
            let state = luasnap_final_state_at(L, -1, &mut o);
            self.final_record(L, o, state);
        }
        // SAFETY: the userdata is on top; reads only.
        Ident(unsafe { luasnap_identity_at(L, -1) }).encode(&mut self.w);
        UserdataBytes {
            bytes,
            nuv: nuv as u64,
        }
        .encode(&mut self.w);
        let frame = UserdataFrame::new(id, nuv);
        self.sc.frames.push(Frame::Userdata(frame));
        Ok(())
    }

    /// Writes the userdata on top as plain data if it is an instance of a registered
    /// [`PlainData`](crate::bridge::PlainData) type (its metatable and size match): its type
    /// name and bytes.
    ///
    /// # Safety
    /// A full userdata is on top, and room for one more value.
    unsafe fn plain_data(&mut self, L: *mut lua_State) -> bool {
        // SAFETY: callers' contract; the metatable pushed is popped at once.
        let mt = unsafe {
            if ffi::lua_getmetatable(L, -1) == 0 {
                return false;
            }
            let mt = ffi::lua_topointer(L, -1);
            ffi::lua_pop(L, 1);
            mt
        };
        // SAFETY: a full userdata is on top.
        let bytes = unsafe { userdata_bytes(L) };
        let types = self.types;
        let Some(ty) = types
            .iter()
            .find(|t| t.metatable == mt && t.size == bytes.len())
        else {
            return false;
        };
        // SAFETY: the userdata is on top (callers' contract); reads only.
        Ident(unsafe { luasnap_identity_at(L, -1) }).encode(&mut self.w);
        PlainUserdata {
            name: ty.name.as_bytes(),
            bytes,
        }
        .encode(&mut self.w);
        true
    }

    /// Writes the next part of the userdata frame on top, or ends it.
    ///
    /// # Safety
    /// Protected; the frame's userdata is anchored at `seen[id]`.
    pub(super) unsafe fn advance_userdata(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let Some(Frame::Userdata(f)) = self.sc.frames.last_mut() else {
            unreachable!("the dispatcher calls this for a userdata frame");
        };
        let id = f.id;
        let Some(part) = f.parts.next() else {
            self.sc.frames.pop();
            return Ok(());
        };
        // SAFETY: Room; the userdata is anchored at seen[id].
        unsafe { push_seen(L, s, id) };
        match part {
            UserdataPart::Metatable => {
                self.sc.segs.push(Seg::Meta);
                // SAFETY: the userdata is on top; pushes its metatable or nil.
                unsafe {
                    if ffi::lua_getmetatable(L, -1) == 0 {
                        ffi::lua_pushnil(L);
                    }
                }
            }
            UserdataPart::UserValue(i) => {
                let i = i as c_int;
                self.sc.segs.push(Seg::UserValue(i));
                // SAFETY: the userdata is on top; pushes its user value i.
                unsafe { ffi::lua_getiuservalue(L, -1, i) };
            }
        }
        // SAFETY: [userdata, part] on top: the part replaces the userdata.
        unsafe {
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_pop(L, 1);
        }
        // SAFETY: Protected, with the part on top.
        unsafe { self.value(L, s) }
    }
}

/// The bytes of the full userdata on top.
///
/// # Safety
/// A full userdata is on top; the bytes are used while it is alive and unchanged (no Lua
/// code runs meanwhile).
unsafe fn userdata_bytes<'a>(L: *mut lua_State) -> &'a [u8] {
    // SAFETY: callers' contract: a full userdata's memory, of its raw length.
    unsafe {
        let len = ffi::lua_rawlen(L, -1) as usize;
        let p = ffi::lua_touserdata(L, -1).cast::<u8>();
        std::slice::from_raw_parts(p, len)
    }
}

/// The number of user values of the full userdata on top.
///
/// # Safety
/// A full userdata is on top, and room for one more value.
unsafe fn count_user_values(L: *mut lua_State) -> c_int {
    let mut n = 0;
    // SAFETY: callers' contract; each value pushed (nil past the last) is popped at once.
    unsafe {
        while ffi::lua_getiuservalue(L, -1, n + 1) != ffi::LUA_TNONE {
            ffi::lua_pop(L, 1);
            n += 1;
        }
        ffi::lua_pop(L, 1);
    }
    n
}
