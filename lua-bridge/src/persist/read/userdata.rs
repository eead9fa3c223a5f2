//! Userdata: plain data of a type the host registered (`Tag::UdPlain`: the type's name and
//! exactly its size in bytes, given the type's own metatable), or raw bytes with user values
//! (`Tag::UdBytes`: its metatable, then its user values).
//!
//! Invariants guarded here: a plain userdata's bytes are exactly its registered type's size
//! (its methods read them as that type); a userdata rebuilt from raw bytes never takes a C
//! library's metatable (see `meta.rs`); user value counts are bounded by the file.

use super::frame::Frame;
use super::loader::{Fail, Loader};
use crate::persist::format::{PlainUserdata, UserdataBytes, UserdataPart, UserdataParts};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

impl Loader<'_> {
    /// A userdata of a registered plain-data type (after `Tag::UdPlain`): its bytes copied
    /// into a new userdata with the type's metatable, registered.
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn plain_userdata(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let plain = PlainUserdata::decode(&mut self.r);
        let PlainUserdata { name, bytes } = self.record(plain)?;
        let Some(ty) = self.types.iter().find(|t| t.name.as_bytes() == name) else {
            if self.opts.stand_ins {
                let (name, bytes) = (name.to_vec(), bytes.to_vec());
                // SAFETY: callers' contract.
                return unsafe { self.stand_in_userdata(L, s, &name, &bytes) };
            }
            let n = crate::persist::place::printable(name);
            return Err(self.fail(format!("userdata type '{n}' is not registered in this VM; register it (VmBuilder::userdata) before loading")));
        };
        if ty.size != bytes.len() {
            return Err(self.malformed("plain userdata of the wrong size for its type"));
        }
        let id = self.id();
        // SAFETY: callers' contract; a new block of ty.size bytes, filled from the file's
        // bytes, of that length (checked above).
        unsafe {
            let p = ffi::lua_newuserdatauv(L, ty.size, 0);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), ty.size);
        }
        // SAFETY: callers' contract; the type's metatable (the registry's entry under its
        // light userdata key) set on the userdata on top.
        unsafe {
            ffi::lua_pushlightuserdata(L, ty.metatable.cast_mut());
            ffi::lua_rawget(L, ffi::LUA_REGISTRYINDEX);
            ffi::lua_setmetatable(L, -2);
        }
        // SAFETY: callers' contract; the userdata on top.
        unsafe { self.register(L, s, id) }
    }

    /// A plain userdata of a type this VM has not registered, as a stand-in
    /// ([`LoadOptions::stand_ins`](crate::persist::LoadOptions::stand_ins)): its bytes, under a
    /// metatable that only names the type (no methods read the bytes), registered.
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    unsafe fn stand_in_userdata(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        name: &[u8],
        bytes: &[u8],
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract; the metatable needs a third slot, checked first.
        if unsafe { ffi::lua_checkstack(L, 1) } == 0 {
            return Err(self.malformed("no stack for a stand-in userdata"));
        }
        let id = self.id();
        // SAFETY: callers' contract; a new block of bytes.len() bytes filled from them, then
        // its stand-in metatable set: [] -> [ud].
        unsafe {
            let p = ffi::lua_newuserdatauv(L, bytes.len(), 0);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), bytes.len());
            crate::persist::permanents::push_stand_in_metatable(L, name);
            ffi::lua_setmetatable(L, -2);
        }
        // SAFETY: callers' contract; the userdata on top.
        unsafe { self.register(L, s, id) }
    }

    /// A userdata rebuilt from raw bytes (after `Tag::UdBytes`): its bytes and user value
    /// count, registered, and its frame pushed. Returns false (a frame).
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn userdata(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        let header = UserdataBytes::decode(&mut self.r);
        let UserdataBytes { bytes, nuv } = self.record(header)?;
        let id = self.id();
        self.take_final(id);
        // SAFETY: callers' contract; a new block of bytes.len() bytes filled from them.
        unsafe {
            let p = ffi::lua_newuserdatauv(L, bytes.len(), nuv as c_int);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), bytes.len());
        }
        // SAFETY: callers' contract; the userdata on top, registered, then popped.
        unsafe {
            self.register(L, s, id)?;
            ffi::lua_settop(L, -2);
        }
        self.frames.push(Frame::Userdata {
            id,
            parts: UserdataParts::new(nuv as u32),
        });
        Ok(false)
    }

    /// The child on top is part `part` of the userdata `id`, its metatable or a user value:
    /// set (popped).
    ///
    /// # Safety
    /// Protected context, three free slots; the child on top; `s` this load's slots.
    pub(super) unsafe fn accept_user_value(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        part: UserdataPart,
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract: [v] -> [ud, v].
        unsafe {
            super::ids::push_obj(L, s, id);
            ffi::lua_rotate(L, -2, 1);
        }
        match part {
            // SAFETY: callers' contract; the userdata at -2.
            UserdataPart::Metatable => unsafe { self.userdata_metatable(L, id)? },
            UserdataPart::UserValue(i) => {
                // SAFETY: user value i of the userdata (1 <= i <= its count, the frame's).
                unsafe { ffi::lua_setiuservalue(L, -2, i as c_int) };
            }
        }
        // SAFETY: pops the userdata.
        unsafe { ffi::lua_settop(L, -2) };
        Ok(())
    }
}
