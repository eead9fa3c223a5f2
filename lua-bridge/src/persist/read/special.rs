//! Values the file names rather than describes: permanents (by their key in the VM's
//! permanents table), C closures (a bare C function that is a permanent, with the upvalues
//! the loader knows how to check), and objects a `__persist` function rebuilds at load time
//! (`Tag::Thunk`: one rebuild function; `Tag::TwoPhase`: a create function, and an init
//! function run when the whole graph is loaded).
//!
//! Invariants guarded here: a C function trusts its upvalues, so a C closure is rebuilt only
//! without upvalues or as `coroutine.wrap`'s helper with its one coroutine, and library
//! helpers that keep raw state in upvalues (`string.gmatch`'s) never load bare; a foreign
//! load calls only the constructors the host registered, and every call runs under the
//! load's instruction budget with its hook intact (`Loader::after_call`).

use super::csrc::{luasnap_gc_stopem, luasnap_proto};
use super::frame::{ClosureKind, Frame};
use super::ids::{push_obj, GLOBALS_ELSEWHERE};
use super::limits::MAX_KEY_NESTING;
use super::loader::{Fail, Loader};
use crate::persist::error::{Accept, REFUSED_NAMES};
use crate::persist::format::{SpecialPart, SpecialParts, Upvalues};
use crate::persist::options::Trust;
use crate::persist::permanents::{CTORS_KEY, GMATCH_AUX, UNPERMS_KEY, WRAP_AUX};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

/// Why a library helper without its upvalues is refused.
const BARE_HELPER: &str =
    "a library helper (coroutine.wrap's or string.gmatch's) without its state";

/// A printable form of a permanent's key (on top).
///
/// # Safety
/// A value on top.
unsafe fn perm_name(L: *mut lua_State) -> String {
    // SAFETY: reads a primitive without conversion.
    unsafe {
        match ffi::lua_type(L, -1) {
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                format!(
                    "{:?}",
                    String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len))
                )
            }
            ffi::LUA_TNUMBER => format!("{}", ffi::lua_tonumberx(L, -1, std::ptr::null_mut())),
            _ => "(unnamed)".into(),
        }
    }
}

/// The permanent named by the key on top, if it is a C function without upvalues of its own
/// (the key stays on top either way).
///
/// # Safety
/// Protected context, two free slots; `s` this load's slots.
unsafe fn bare_c_function(L: *mut lua_State, s: Slots) -> Option<ffi::lua_CFunction> {
    // SAFETY: callers' contract; looks the key up in the permanents (pushed, then popped).
    unsafe {
        ffi::lua_pushvalue(L, -1);
        ffi::lua_rawget(L, s.perms);
        // Only a function without upvalues of its own: the closure is rebuilt from the bare
        // function, and one that keeps state in upvalues (math.random's generator, a
        // native's index) would read the missing ones as pointers.
        let bare = ffi::lua_iscfunction(L, -1) != 0 && {
            let has_upvalue = !ffi::lua_getupvalue(L, -1, 1).is_null();
            if has_upvalue {
                ffi::lua_settop(L, -2);
            }
            !has_upvalue
        };
        let f = if bare {
            ffi::lua_tocfunction(L, -1)
        } else {
            None
        };
        ffi::lua_settop(L, -2);
        f
    }
}

impl Loader<'_> {
    /// Reads the key of a permanent or C closure, a value that should be a primitive: true if
    /// it is complete on top (see [`Loader::value`]). Nested deeper than `MAX_KEY_NESTING`
    /// in other such keys, it is refused as `refused` says, before it is read.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots.
    unsafe fn key(&mut self, L: *mut lua_State, s: Slots, refused: &str) -> Result<bool, Fail> {
        if self.key_depth >= MAX_KEY_NESTING {
            return Err(self.malformed(refused));
        }
        self.key_depth += 1;
        // SAFETY: callers' contract.
        let complete = unsafe { self.value(L, s)? };
        self.key_depth -= 1;
        Ok(complete)
    }

    /// A permanent (after `Tag::Perm`): its key, a primitive value, looked up in the
    /// permanents the load allows; registered unless a light userdata.
    ///
    /// # Safety
    /// Protected context, 8 free slots; `s` this load's slots.
    pub(super) unsafe fn permanent(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // The key: a primitive value.
        // SAFETY: callers' contract.
        let complete = unsafe { self.key(L, s, "a permanent's key must be a primitive")? };
        // SAFETY: a query of the top (the key, complete).
        if !complete
            || !matches!(
                unsafe { ffi::lua_type(L, -1) },
                ffi::LUA_TSTRING | ffi::LUA_TNUMBER | ffi::LUA_TBOOLEAN | ffi::LUA_TNIL
            )
        {
            return Err(self.malformed("a permanent's key must be a primitive"));
        }
        // SAFETY: callers' contract; the key on top.
        unsafe { self.check_perm_name(L, s)? };
        // SAFETY: callers' contract: [key] -> [key, value].
        let found = unsafe {
            ffi::lua_pushvalue(L, -1);
            ffi::lua_rawget(L, s.perms) != ffi::LUA_TNIL
        };
        if !found {
            // SAFETY: pops the nil; reads the key, then pops it.
            let name = unsafe {
                ffi::lua_settop(L, -2);
                let name = perm_name(L);
                ffi::lua_settop(L, -2);
                name
            };
            if self.opts.stand_ins {
                let name = format!("native {}", name.trim_matches('"'));
                // SAFETY: callers' contract (8 free slots): [] -> [stand-in].
                unsafe {
                    ffi::lua_createtable(L, 0, 0);
                    crate::persist::permanents::push_stand_in_metatable(L, name.as_bytes());
                    ffi::lua_setmetatable(L, -2);
                }
                let id = self.id();
                // SAFETY: callers' contract; the stand-in on top.
                return unsafe { self.register(L, s, id) };
            }
            return Err(self.fail(format!(
                "missing permanent {name}: the save refers to it by that name; register it under the same name before loading (Vm::register_native / register_permanent, or perms[\"name\"] = value in eris.unpersist)"
            )));
        }
        // SAFETY: [key, value] -> [value].
        unsafe {
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_settop(L, -2);
        }
        // SAFETY: callers' contract; the permanent on top.
        unsafe { self.refuse_bare_helper(L)? };
        // SAFETY: a query of the top.
        if unsafe { ffi::lua_type(L, -1) } != ffi::LUA_TLIGHTUSERDATA {
            let id = self.id();
            // SAFETY: callers' contract; the permanent on top.
            unsafe { self.register(L, s, id)? };
            self.perm_ids.push(id);
            // SAFETY: a query of the top.
            if unsafe { ffi::lua_topointer(L, -1) } == self.globals {
                self.globals_id = id;
            }
        }
        Ok(())
    }

    /// Whether the value being read is a place where a load that denies the permanent `_G`
    /// still takes it: a Lua closure's new upvalue named `_ENV` (what every function that
    /// reads a global holds). Anywhere else (a table's key, value or metatable, another
    /// upvalue, a coroutine's stack, a load-time function) game code writing there would
    /// write the globals (`player.inventory = _G`).
    ///
    /// # Safety
    /// Protected context, a free slot; `s` this load's slots.
    pub(super) unsafe fn globals_here(&self, L: *mut lua_State, s: Slots) -> bool {
        let Some(&Frame::Closure {
            id,
            upvalues,
            open: None,
            kind: ClosureKind::Lua,
        }) = self.frames.last()
        else {
            return false;
        };
        // The upvalue being read (its value follows its `UpvalNew` tag).
        let Some(next) = upvalues.peek() else {
            return false;
        };
        // SAFETY: callers' contract; objs[id] is the closure whose frame this is (popped).
        let p = unsafe {
            push_obj(L, s, id);
            let p = luasnap_proto(L, -1);
            ffi::lua_settop(L, -2);
            p
        };
        if p.is_null() {
            return false;
        }
        // A rebound closure reads its saved upvalues into slots past its target's, named as
        // the save names them (then bound by name: a saved `_ENV` goes to the target's `_ENV`
        // or nowhere, as when this version's function reads no global).
        let slot = self
            .saved_slot(id, next as c_int)
            .map_or(next as c_int - 1, |(s, _)| s);
        // SAFETY: p is the prototype of a live closure (anchored in objs), the closure read
        // as `id`.
        let name = unsafe { self.slot_name(id, p, slot) };
        name == Some(b"_ENV".as_slice())
    }

    /// A C closure (after `Tag::CClosure`): the key of a permanent naming a bare C function,
    /// then its upvalue count; rebuilt only where the loader knows and checks its upvalues.
    /// Returns false (a frame, which reads its upvalues).
    ///
    /// # Safety
    /// Protected context, 8 free slots; `s` this load's slots.
    pub(super) unsafe fn cclosure(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // Its identity waits while the key is read (a key is a primitive: no object of its own).
        let ident = self.defer_identity();
        // The function: the key of a permanent naming a bare C function.
        // SAFETY: callers' contract.
        let complete = unsafe { self.key(L, s, "bad C closure")? };
        // SAFETY: a query of the top (the key, complete).
        if !complete
            || !matches!(
                unsafe { ffi::lua_type(L, -1) },
                ffi::LUA_TSTRING | ffi::LUA_TNUMBER
            )
        {
            return Err(self.malformed("bad C closure"));
        }
        // SAFETY: callers' contract; the key on top.
        let Some(f) = (unsafe { bare_c_function(L, s) }) else {
            // SAFETY: reads the key, then pops it.
            let name = unsafe {
                let name = perm_name(L);
                ffi::lua_settop(L, -2);
                name
            };
            return Err(self.fail(format!("missing permanent {name} (a C function without upvalues of its own): register it under the same name before loading")));
        };
        let Some(n) = self.r.varint() else {
            return Err(self.malformed("bad C closure"));
        };
        // SAFETY: callers' contract; the key still on top.
        let is_wrap = unsafe { self.check_c_closure(L, s, f, n)? };
        let id = self.id();
        self.resume_identity(ident);
        // SAFETY: callers' contract; n is 0 or 1 (checked above): the closure with nil
        // upvalues, registered, then popped (kept in objs).
        unsafe {
            for _ in 0..n {
                ffi::lua_pushnil(L);
            }
            ffi::lua_pushcclosure(L, f, n as c_int);
            self.register(L, s, id)?;
            ffi::lua_settop(L, -2);
        }
        self.frames.push(Frame::Closure {
            id,
            upvalues: Upvalues::new(n as u32),
            open: None,
            kind: if is_wrap {
                ClosureKind::Wrap
            } else {
                ClosureKind::C
            },
        });
        Ok(false)
    }

    /// Checks a C closure of the bare function `f` (its key on top, popped) with `n`
    /// upvalues. C functions trust their upvalues: a closure is rebuilt only where the loader
    /// knows the layout and checks it. `coroutine.wrap`'s helper: one coroutine. Without
    /// upvalues it is the permanent itself, under the permanents' rules. Returns whether it
    /// is `coroutine.wrap`'s helper.
    ///
    /// # Safety
    /// Protected context, two free slots; the key on top; `s` this load's slots.
    unsafe fn check_c_closure(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        f: ffi::lua_CFunction,
        n: u64,
    ) -> Result<bool, Fail> {
        // SAFETY: callers' contract.
        let (wrap, _) = unsafe { self.aux(L) };
        let is_wrap = wrap != 0 && f as usize == wrap;
        if n == 0 {
            // SAFETY: callers' contract; the key on top.
            unsafe { self.check_perm_name(L, s)? };
        } else if !(is_wrap && n == 1) {
            // SAFETY: reads the key, then pops it.
            let name = unsafe {
                let name = perm_name(L);
                ffi::lua_settop(L, -2);
                name
            };
            return Err(self.malformed(&format!(
                "a C closure of {name} with {n} upvalues: the loader rebuilds C closures only where it knows and checks their upvalues (coroutine.wrap functions)"
            )));
        }
        // SAFETY: pops the key.
        unsafe { ffi::lua_settop(L, -2) };
        if n == 0 && is_wrap {
            return Err(self.malformed(BARE_HELPER));
        }
        if n == 0 {
            // SAFETY: callers' contract.
            let (_, gmatch) = unsafe { self.aux(L) };
            if gmatch != 0 && f as usize == gmatch {
                return Err(self.malformed(BARE_HELPER));
            }
        }
        Ok(is_wrap)
    }

    /// An object a `__persist` function rebuilds (after `Tag::Thunk`, or `Tag::TwoPhase` if
    /// `two_phase`): its id, and its frame, which reads the function(s). Returns false.
    pub(super) fn special(&mut self, two_phase: bool) -> bool {
        let id = self.id();
        // Its identity waits for the object the rebuild returns (objects its functions bring
        // come first).
        let ident = self.defer_identity();
        self.frames.push(Frame::Special {
            id,
            parts: SpecialParts::new(two_phase),
            ident,
        });
        false
    }

    /// The child on top is the rebuild (or create) function of object `id` (`part`), called
    /// now, or its init function, called when the load ends. Either must be a function the
    /// load may call.
    ///
    /// # Safety
    /// Protected context, three free slots; the child on top; `s` this load's slots.
    pub(super) unsafe fn accept_special(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        part: SpecialPart,
        ident: u32,
    ) -> Result<(), Fail> {
        // SAFETY: a query of the top.
        if unsafe { ffi::lua_type(L, -1) } != ffi::LUA_TFUNCTION {
            // SAFETY: pops the child.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.malformed("a __persist rebuild must be a function"));
        }
        // SAFETY: callers' contract; the function on top.
        if !unsafe { self.may_call(L) } {
            // SAFETY: pops the function.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.fail("a foreign save-game names a load-time function that is not a registered constructor (Vm::register_constructor, eris.constructor)"));
        }
        match part {
            // SAFETY: callers' contract.
            SpecialPart::Rebuild | SpecialPart::Create => unsafe { self.rebuild(L, s, id, ident) },
            SpecialPart::Init => {
                // Two-phase: remember (object, init) to call when everything is loaded.
                self.inits += 1;
                // SAFETY: callers' contract: [init] -> inits[n] = { object, init }.
                unsafe {
                    ffi::lua_createtable(L, 2, 0);
                    ffi::lua_rotate(L, -2, 1);
                    ffi::lua_rawseti(L, -2, 2);
                    push_obj(L, s, id);
                    ffi::lua_rawseti(L, -2, 1);
                    ffi::lua_rawseti(L, s.inits, self.inits as ffi::lua_Integer);
                }
                Ok(())
            }
        }
    }

    /// Calls the rebuild (or create) function on top (popped): its result is object `id`,
    /// with the identity `ident` if it has none yet (a rebuild that returns a cached instance
    /// keeps that one's).
    ///
    /// # Safety
    /// Protected context, a free slot; a function the load may call on top; `s` this load's
    /// slots.
    unsafe fn rebuild(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        ident: u32,
    ) -> Result<(), Fail> {
        // Invariant kept: no Lua code runs while the load holds a refused permanent (the
        // rebuild's upvalues may hold one) or a refused function's stand-in: the refusal comes
        // first, naming those met so far.
        if let Some(refused) = self
            .refused_permanents(false)
            .or_else(|| self.refused_functions())
        {
            // SAFETY: pops the function.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(refused);
        }
        // Lua code may collect: the collector must find the flag clear (lgc.c's singlestep
        // asserts it); after_call stops emergencies again.
        // SAFETY: clears a flag of the global state.
        unsafe { luasnap_gc_stopem(L, 0) };
        // SAFETY: callers' contract; the call runs under the load's budget hook, and a Lua
        // error in it ends the load's protected call with no Rust value to drop.
        unsafe { ffi::lua_callk(L, 0, 1, 0, None) };
        // SAFETY: the loading thread, after the call.
        unsafe { self.after_call(L)? };
        // SAFETY: a query of the top.
        if unsafe { ffi::lua_type(L, -1) } == ffi::LUA_TNIL {
            // SAFETY: pops the result.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.fail("a __persist rebuild function returned nil"));
        }
        self.resume_identity(ident);
        // SAFETY: callers' contract; the object on top, registered, then popped.
        unsafe {
            self.register(L, s, id)?;
            ffi::lua_settop(L, -2);
        }
        Ok(())
    }

    /// Two-phase initializers run last, in creation order, on the complete graph.
    ///
    /// # Safety
    /// Protected context, three free slots; `s` this load's slots; the walk is over.
    pub(super) unsafe fn run_inits(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        for i in 1..=self.inits {
            // SAFETY: callers' contract: [.., pair, init, object].
            unsafe {
                ffi::lua_rawgeti(L, s.inits, i as ffi::lua_Integer);
                ffi::lua_rawgeti(L, -1, 2);
                ffi::lua_rawgeti(L, -2, 1);
            }
            // Lua code may collect: the collector must find the flag clear (lgc.c's
            // singlestep asserts it); after_call stops emergencies again.
            // SAFETY: clears a flag of the global state.
            unsafe { luasnap_gc_stopem(L, 0) };
            // SAFETY: as in `rebuild`: init(object), under the load's budget hook.
            unsafe { ffi::lua_callk(L, 1, 0, 0, None) };
            // SAFETY: the loading thread, after the call.
            unsafe { self.after_call(L)? };
            // SAFETY: pops the pair.
            unsafe { ffi::lua_settop(L, -2) };
        }
        Ok(())
    }

    /// Whether the function on top may be called at load time: always for own saves; for
    /// foreign ones, only a constructor the host registered (see `Vm::register_constructor`).
    ///
    /// # Safety
    /// Protected context, two free slots; a function on top.
    unsafe fn may_call(&mut self, L: *mut lua_State) -> bool {
        if self.opts.trust == Trust::Own {
            return true;
        }
        // SAFETY: callers' contract; reads the constructors table, balanced pushes.
        unsafe {
            if ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, CTORS_KEY.as_ptr()) != ffi::LUA_TTABLE {
                ffi::lua_settop(L, -2);
                return false;
            }
            ffi::lua_pushvalue(L, -2);
            let mut ok = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
            ffi::lua_settop(L, -2);
            if !ok {
                let p = luasnap_proto(L, -2);
                if !p.is_null() {
                    ffi::lua_pushlightuserdata(L, p.cast_mut());
                    ok = ffi::lua_rawget(L, -2) != ffi::LUA_TNIL;
                    ffi::lua_settop(L, -2);
                }
            }
            ffi::lua_settop(L, -2);
            ok
        }
    }

    /// The C functions of `coroutine.wrap`'s and `string.gmatch`'s helpers (from the VM's
    /// own permanents), looked up once per load.
    ///
    /// # Safety
    /// Protected context, three free slots.
    unsafe fn aux(&mut self, L: *mut lua_State) -> (usize, usize) {
        if let Some(a) = self.aux {
            return a;
        }
        let mut a = (0usize, 0usize);
        // SAFETY: callers' contract; reads registry fields, balanced pushes.
        unsafe {
            ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
            if ffi::lua_type(L, -1) == ffi::LUA_TTABLE {
                ffi::lua_getfield(L, -1, WRAP_AUX.as_ptr());
                a.0 = ffi::lua_tocfunction(L, -1).map_or(0, |f| f as usize);
                ffi::lua_getfield(L, -2, GMATCH_AUX.as_ptr());
                a.1 = ffi::lua_tocfunction(L, -1).map_or(0, |f| f as usize);
                ffi::lua_settop(L, -3);
            }
            ffi::lua_settop(L, -2);
        }
        self.aux = Some(a);
        a
    }

    /// Refuses the value on top if it is a library helper without the upvalues it relies on
    /// (`coroutine.wrap`'s without its coroutine, `string.gmatch`'s without its match
    /// state): called, it would read a missing upvalue as a pointer.
    ///
    /// # Safety
    /// Protected context, three free slots; a value on top.
    unsafe fn refuse_bare_helper(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: a query of the top.
        if unsafe { ffi::lua_iscfunction(L, -1) } == 0 {
            return Ok(());
        }
        // SAFETY: a query of the top (a C function).
        let f = unsafe { ffi::lua_tocfunction(L, -1) }.map_or(0, |f| f as usize);
        // SAFETY: callers' contract.
        let (wrap, gmatch) = unsafe { self.aux(L) };
        if f != 0 && (f == wrap || f == gmatch) {
            // SAFETY: pushes its first upvalue, if any (then popped).
            if unsafe { ffi::lua_getupvalue(L, -1, 1) }.is_null() {
                return Err(self.malformed(BARE_HELPER));
            }
            // SAFETY: pops the upvalue.
            unsafe { ffi::lua_settop(L, -2) };
        }
        Ok(())
    }

    /// Refuses a permanent's name (the key on top) that the load's options do not allow.
    ///
    /// # Safety
    /// A value on top.
    unsafe fn check_perm_name(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: a query of the top.
        if unsafe { ffi::lua_type(L, -1) } != ffi::LUA_TSTRING {
            return Ok(());
        }
        let mut len = 0;
        // SAFETY: a string on top: its bytes, without conversion; they stay valid while it
        // is on the stack (until the pop below, after the last use).
        let name = unsafe {
            let p = ffi::lua_tolstring(L, -1, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        };
        if self.opts.allows_permanent(name) {
            return Ok(());
        }
        // SAFETY: callers' contract (the key on top stays).
        if name == b"_G" && unsafe { self.globals_here(L, s) } {
            return Ok(());
        }
        let name = name.to_vec();
        self.refuse_later(&name);
        Ok(())
    }

    /// Records a permanent the load's options do not allow (`_G` where it is no function's
    /// `_ENV`), and the load goes on with it, so that its error names every refused one at
    /// once (`refused_permanents`) when the walk ends, or before the first load-time call
    /// (`rebuild`): no Lua code runs while a refused permanent is in what the load built.
    pub(super) fn refuse_later(&mut self, name: &[u8]) {
        if !self.refused_seen.insert(name.to_vec()) {
            return;
        }
        if self.refused.is_empty() {
            self.refused_at = self.r.pos;
        }
        if self.refused.len() < REFUSED_NAMES {
            self.refused.push(crate::persist::place::printable(name));
        } else {
            self.refused_more += 1;
        }
    }

    /// When the walk ends (or stops: `stopped`), the refusal of the permanents the load's
    /// options do not allow, if it met any: one error naming them all (the first
    /// `REFUSED_NAMES`, and how many more), and what accepts them. A stop on a lack of memory
    /// stands as it is.
    pub(super) fn refused_permanents(&mut self, stopped: bool) -> Option<Fail> {
        if self.refused.is_empty() || (stopped && self.out_of_memory) {
            return None;
        }
        let names = std::mem::take(&mut self.refused);
        let more = self.refused_more;
        let trust = if self.opts.trust == Trust::Foreign {
            "a foreign"
        } else {
            "an own"
        };
        let globals = self.refused_seen.contains(&b"_G"[..]);
        let mut what = if names.len() == 1 && more == 0 && globals {
            format!(
                "{GLOBALS_ELSEWHERE} (at byte {} of the body)",
                self.refused_at
            )
        } else if names.len() == 1 {
            format!(
                "the save refers to the permanent {:?}, which this load does not allow ({trust} save; at byte {} of the body)",
                names[0], self.refused_at
            )
        } else {
            let list: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            format!(
                "the save refers to {} permanents this load does not allow ({trust} save; the first at byte {} of the body): {}{}",
                names.len() + more,
                self.refused_at,
                list.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ) + if globals {
                " (_G: the save puts the globals table somewhere else than a function's _ENV, \
                 where game code writing would overwrite the globals)"
            } else {
                ""
            }
        };
        if stopped {
            if let Some(e) = self.error.take() {
                what = format!("{what} (the load also stopped on: {e})");
            }
        }
        self.error = Some(what.replace('\0', "\\0"));
        self.accept = Some(if names.len() == 1 && more == 0 {
            Accept::Permanent(names.into_iter().next().unwrap_or_default())
        } else {
            Accept::Permanents { names, more }
        });
        Some(Fail)
    }
}
