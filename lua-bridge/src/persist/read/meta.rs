//! Metatables of loaded tables and userdata, and the finalizers they bring.
//!
//! A metatable with `__gc` makes its object finalizable, and the collector runs finalizers
//! whenever it likes, outside the load's instruction budget and constructor rules: loads that
//! refuse finalizers (foreign ones by default, see [`LoadOptions::finalizers`]) refuse such a
//! metatable, at once or, for one that got its `__gc` later in the load, when the load ends.
//! A userdata rebuilt from the file's bytes never gets a C library's metatable, whose
//! functions would trust those bytes as their own struct.
//!
//! [`LoadOptions::finalizers`]: crate::persist::LoadOptions::finalizers

use super::csrc::{
    luasnap_finalizers_foreign, luasnap_finalizers_mark, luasnap_gc_nofinal,
    luasnap_setmetatable_unmarked,
};
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use crate::persist::options::Trust;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

/// Why a foreign load refused a finalizer compiled from the save's text (`generated.rs`).
const SAVED_FINALIZER: &str = "the save-game gives an object a finalizer compiled from the text the save carries (a chunk the game made with load): a foreign save's finalizers may only be the game's own Lua functions; if you trust the file, load it as your own (Trust::Own)";

/// Why a load refused a metatable with `__gc` (see [`LoadOptions::finalizers`]).
///
/// [`LoadOptions::finalizers`]: crate::persist::LoadOptions::finalizers
pub(super) const NO_FINALIZERS: &str = "the save-game gives an object a finalizer (a metatable with __gc), which the collector would run after the load, outside its instruction budget and constructor rules; foreign loads refuse them: if you trust the file, load it as your own (Trust::Own) or set LoadOptions::finalizers";

/// Why a foreign load refused a C function as a finalizer.
pub(super) const C_FINALIZER: &str = "the save-game gives an object a C function as its finalizer (__gc = table.sort or table.concat, say): a foreign save's finalizers may only be the game's own Lua functions; if you trust the file, load it as your own (Trust::Own)";

/// Why a foreign load refused a finalizer that is not a function.
const NOT_A_FINALIZER: &str = "the save-game gives an object a finalizer that is not a function (__gc = a table with __call, say): a foreign save's finalizers may only be the game's own Lua functions; if you trust the file, load it as your own (Trust::Own)";

/// Why a userdata rebuilt from the file's bytes may not take a C library's metatable.
const LIBRARY_METATABLE: &str = "a userdata rebuilt from bytes with the metatable of a C library's type (luaL_newmetatable: io's FILE*, say); that library's functions and __gc would trust the forged bytes as its own struct (a file handle's close function pointer, for one)";

/// Whether the table on top has a raw `__gc` field (the metatable about to be set).
///
/// # Safety
/// Protected context, a table on top and a free slot.
unsafe fn has_gc(L: *mut lua_State) -> bool {
    // SAFETY: raw access on the table on top; pushes and pops one value ("__gc" is one of
    // Lua's fixed strings, so pushing it finds it without allocating).
    unsafe {
        ffi::lua_pushstring(L, c"__gc".as_ptr());
        let found = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
        ffi::lua_settop(L, -2);
        found
    }
}

/// Whether the table on top is a metatable a C library registered for its userdata
/// (`luaL_newmetatable`: `registry[mt.__name] == mt`). Such a library finds its userdata by
/// that metatable (`luaL_checkudata`) and trusts their payload, so a userdata whose bytes
/// come from a file must not get it.
///
/// # Safety
/// Protected context, a table on top and two free slots.
unsafe fn library_metatable(L: *mut lua_State) -> bool {
    // SAFETY: raw reads; pushes and pops two values ("__name" is a short string: pushing
    // it may allocate, which the protected context allows).
    unsafe {
        ffi::lua_pushstring(L, c"__name".as_ptr());
        if ffi::lua_rawget(L, -2) != ffi::LUA_TSTRING {
            ffi::lua_settop(L, -2);
            return false;
        }
        ffi::lua_rawget(L, ffi::LUA_REGISTRYINDEX);
        let same = ffi::lua_rawequal(L, -1, -2) != 0;
        ffi::lua_settop(L, -2);
        same
    }
}

impl Loader<'_> {
    /// Sets the checked metatable on top (popped) as the metatable of the table or userdata
    /// at `idx`: without marking it for finalization in a file of format 8, which records the
    /// marks (`finals.rs`), as `setmetatable` does in older ones.
    ///
    /// # Safety
    /// A table or full userdata at `idx`, a table or nil on top.
    unsafe fn set_metatable(&self, L: *mut lua_State, idx: c_int) {
        if self.format >= 8 {
            // SAFETY: callers' contract (the C side checks both values again and sets
            // nothing if they are not what they must be, which callers exclude).
            let set = unsafe { luasnap_setmetatable_unmarked(L, idx) };
            debug_assert_eq!(set, 1);
        } else {
            // SAFETY: callers' contract.
            unsafe { ffi::lua_setmetatable(L, idx) };
        }
    }

    /// Whether a metatable with `__gc` fails the load (see [`LoadOptions::finalizers`]; with
    /// `inert_finalizers` the whole load runs marked as one without new finalizers instead).
    ///
    /// [`LoadOptions::finalizers`]: crate::persist::LoadOptions::finalizers
    pub(super) fn refuses_finalizers(&self) -> bool {
        !self.opts.finalizers && !self.opts.inert_finalizers
    }

    /// Checks the value on top (left there) as the metatable of object `id`, a userdata
    /// rebuilt from bytes if `userdata`: nil, or a table without `__gc` if the load refuses
    /// finalizers and, for such a userdata, not a C library's. A table without `__gc` yet
    /// puts the object on `late_meta`, checked again when the load ends.
    ///
    /// # Safety
    /// Protected context, two free slots.
    unsafe fn check_metatable(
        &mut self,
        L: *mut lua_State,
        id: u32,
        userdata: bool,
    ) -> Result<(), Fail> {
        // SAFETY: a query of the top.
        let t = unsafe { ffi::lua_type(L, -1) };
        if t != ffi::LUA_TTABLE && t != ffi::LUA_TNIL {
            return Err(self.malformed("a metatable must be a table"));
        }
        if t == ffi::LUA_TNIL {
            return Ok(());
        }
        // SAFETY: callers' contract; a table on top.
        if self.refuses_finalizers() && unsafe { has_gc(L) } {
            return Err(self.fail(NO_FINALIZERS));
        }
        // SAFETY: as above.
        if userdata && unsafe { library_metatable(L) } {
            return Err(self.malformed(LIBRARY_METATABLE));
        }
        // SAFETY: as above.
        if self.refuses_finalizers() && !unsafe { has_gc(L) } {
            self.late_meta.push(id); // (see `late_meta`)
        }
        Ok(())
    }

    /// The metatable of the table `id` (at `at`, or in objs only if `at` is 0) is on top:
    /// checked, then set (popped).
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn table_metatable(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        at: c_int,
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract.
        if let Err(e) = unsafe { self.check_metatable(L, id, false) } {
            // SAFETY: pops the metatable.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(e);
        }
        if at > 0 {
            // SAFETY: the table is at `at` (see table.rs); pops the checked metatable.
            unsafe { self.set_metatable(L, at) };
        } else {
            // SAFETY: [mt] -> [t, mt], the metatable set, both popped (a free slot).
            unsafe {
                push_obj(L, s, id);
                ffi::lua_rotate(L, -2, 1);
                self.set_metatable(L, -2);
                ffi::lua_settop(L, -2);
            }
        }
        Ok(())
    }

    /// The metatable of the userdata `id` is at -1, the userdata at -2: checked, then set
    /// (the metatable popped).
    ///
    /// # Safety
    /// Protected context, two free slots.
    pub(super) unsafe fn userdata_metatable(
        &mut self,
        L: *mut lua_State,
        id: u32,
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract.
        if let Err(e) = unsafe { self.check_metatable(L, id, true) } {
            // SAFETY: pops the metatable and the userdata.
            unsafe { ffi::lua_settop(L, -3) };
            return Err(e);
        }
        // SAFETY: the userdata at -2 (callers' contract); pops the checked metatable.
        unsafe { self.set_metatable(L, -2) };
        Ok(())
    }

    /// For a load that refuses finalizers: objects whose metatable got its `__gc` after it was
    /// set (a metatable still being built then) are refused now, as a `__gc` seen at once is.
    /// (Loads that allow finalizers mark such objects with the others: `mark_finalizers`.)
    ///
    /// # Safety
    /// Protected context, three free slots; `s` this load's slots; the walk is over.
    pub(super) unsafe fn recheck_finalizers(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        if !self.refuses_finalizers() {
            return Ok(());
        }
        for i in 0..self.late_meta.len() {
            // SAFETY: callers' contract; late_meta holds ids of objects read; the object and
            // its metatable (if any) pushed, checked, popped.
            let gc = unsafe {
                push_obj(L, s, self.late_meta[i]);
                let gc = ffi::lua_getmetatable(L, -1) != 0 && {
                    let gc = has_gc(L);
                    ffi::lua_settop(L, -2);
                    gc
                };
                ffi::lua_settop(L, -2);
                gc
            };
            if gc {
                return Err(self.fail(NO_FINALIZERS));
            }
        }
        Ok(())
    }

    /// When a load that allows finalizers ends well: in a file of format 8, marks the objects
    /// the file marks (`finals.rs`); in older ones, marks for finalization every object it
    /// made (its own and those of the functions it called) whose metatable has `__gc` now, in
    /// one walk of the objects made since its first table (marking each alone searched the
    /// collector's list from its head: time quadratic in the objects). Lua marks an object
    /// only if its metatable has `__gc` when it is set, and a save writes an object's
    /// metatable before its entries, so a class that is its own metatable
    /// (`T = { __gc = f }; setmetatable(T, T)`) lost its finalizer before this pass.
    ///
    /// A foreign load first checks each such `__gc`: only the game's own Lua functions
    /// (closures of its prototypes, matched like any function of the file) may be finalizers,
    /// never one compiled from the save's text (`generated.rs`), never a C function (`table.sort` or `table.concat` over forged references ran outside
    /// every budget). Nothing was marked while it ran (the state's no-finalizer bit), so a
    /// refused load leaves no finalizer behind; finalizers then run under the instruction
    /// budget of the call that runs them (Lua patch 8).
    ///
    /// # Safety
    /// Protected context; `s` this load's slots; the walk and the initializers are over.
    pub(super) unsafe fn mark_finalizers(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        if !self.opts.finalizers || self.opts.inert_finalizers {
            return Ok(());
        }
        if self.opts.trust == Trust::Foreign {
            // SAFETY: reads the objects made since the load's first table, anchored at s.objs.
            match unsafe { luasnap_finalizers_foreign(L, s.objs) } {
                0 => {}
                1 => return Err(self.fail(C_FINALIZER)),
                3 => return Err(self.fail(SAVED_FINALIZER)),
                _ => return Err(self.fail(NOT_A_FINALIZER)),
            }
        }
        if self.format >= 8 {
            // SAFETY: callers' contract.
            return unsafe { self.restore_finalizers(L, s) };
        }
        // SAFETY: as above; clears the no-finalizer bit only if this load set it.
        unsafe { luasnap_finalizers_mark(L, s.objs, self.nofinal_marked as c_int) };
        Ok(())
    }

    /// Unmarks the state this load marked as one without new finalizers; returns whether it
    /// did (the collector must then be restarted, if it ran before: `lua_gc` ignored it).
    ///
    /// # Safety
    /// `L` is a thread of the VM the load ran in, the load over.
    pub(crate) unsafe fn end_nofinal(&mut self, L: *mut lua_State) -> bool {
        let marked = std::mem::take(&mut self.nofinal_marked);
        if marked {
            // SAFETY: clears one bit of the global state.
            unsafe { luasnap_gc_nofinal(L, 0) };
        }
        marked
    }
}
