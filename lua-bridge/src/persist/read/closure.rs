//! Closures and their upvalues. A Lua closure is made from its prototype (see `proto.rs`)
//! with fresh upvalues, then each upvalue arrives with its tag: `UpvalNew` and a value (a
//! closed upvalue of its own), `UpvalRef` and an `UpvalueRef` (shared with an upvalue of a
//! closure read before), or `UpvalOpen`, an `OpenUpvalue` and a coroutine (open: a slot of a
//! suspended coroutine this load builds).
//!
//! A C closure's upvalues are plain values (see `special.rs` for which C closures load).
//!
//! Invariants guarded here: the upvalue count is the prototype's (Lua indexes upvalues by the
//! prototype's descriptors); a shared upvalue exists in the closure it is shared from and is
//! closed (an open one is shared through its coroutine's slot, where it is checked); an open
//! upvalue points into a coroutine this load builds, inside the stack the file declares, and
//! is checked against its frames (`open.rs`).

use super::csrc::{
    luasnap_proto, luasnap_proto_nupvalues, luasnap_proto_upvalue_name, luasnap_push_closure,
    luasnap_upval_join_slot, luasnap_upval_shareable,
};
use super::frame::{ClosureKind, Frame};
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use crate::persist::format::{OpenUpvalue, Tag, UpvalueRef, Upvalues};
use crate::persist::options::Trust;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

/// Why a foreign load refused a shared upvalue.
const FOREIGN_JOIN: &str = "a closure shares an upvalue with a closure the save did not build (a permanent), or under another variable's name; game code writing that upvalue would write state the file chose (the globals, a live module's variable); foreign saves share upvalues only between their own closures' same variables: if you trust the file, load it as your own (Trust::Own)";

/// The name of upvalue `i` (1-based) of prototype `p` (its debug information; None for a
/// stripped function or no such upvalue).
///
/// # Safety
/// `p` is a live prototype; the slice lives as long as it does.
pub(super) unsafe fn upvalue_name<'p>(p: *const c_void, i: c_int) -> Option<&'p [u8]> {
    let mut len = 0usize;
    // SAFETY: callers' contract; the name is a Lua string the prototype holds.
    unsafe {
        let name = luasnap_proto_upvalue_name(p, i, &mut len);
        (!name.is_null()).then(|| std::slice::from_raw_parts(name.cast::<u8>(), len))
    }
}

impl Loader<'_> {
    /// A Lua closure (after `Tag::LClosure`): its prototype, its upvalue count (checked
    /// against the prototype's), registered, and its frame pushed. Returns false (a frame).
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn lclosure(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // SAFETY: callers' contract.
        let (index, p) = unsafe { self.proto(L, s)? };
        let Some(n) = self.r.varint() else {
            return Err(self.malformed("bad closure"));
        };
        let binding = self.rb.bindings.get(&index).copied().unwrap_or_default();
        let id = self.id();
        if let Some(r) = binding.rebound {
            // SAFETY: callers' contract.
            unsafe { self.push_rebound_closure(L, id, r, p, n)? };
        } else {
            // SAFETY: p is a prototype of this VM, anchored for the load.
            if n != unsafe { luasnap_proto_nupvalues(p) } as u64 {
                return Err(self.malformed("closure upvalue count differs from its prototype"));
            }
            // SAFETY: callers' contract; a closure of the anchored prototype, with fresh
            // upvalues.
            unsafe { luasnap_push_closure(L, p) };
            self.note_closure(id, p, binding.current);
        }
        // SAFETY: callers' contract; the closure on top (then popped: kept in objs).
        unsafe {
            self.register(L, s, id)?;
            ffi::lua_settop(L, -2);
        }
        self.frames.push(Frame::Closure {
            id,
            upvalues: Upvalues::new(n as u32),
            open: None,
            kind: ClosureKind::Lua,
        });
        Ok(false)
    }

    /// Moves a closure frame on (`id`, at `upvalues`): its next upvalue, or its end.
    ///
    /// # Safety
    /// Protected context, 8 free slots; `s` this load's slots; the closure's frame on top of
    /// the frame stack.
    pub(super) unsafe fn advance_closure(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        upvalues: Upvalues,
        kind: ClosureKind,
    ) -> Result<bool, Fail> {
        let Some(i) = upvalues.peek() else {
            // SAFETY: callers' contract; objs[id] is this closure.
            return Ok(unsafe { self.finish(L, s, id) });
        };
        let Some(tag) = self.r.u8() else {
            return Err(self.malformed("truncated"));
        };
        match Tag::from_u8(tag) {
            Some(Tag::UpvalRef) => {
                // SAFETY: callers' contract.
                unsafe { self.shared_upvalue(L, s, id, i as c_int)? };
                if let Some(Frame::Closure { upvalues, .. }) = self.frames.last_mut() {
                    upvalues.next();
                }
                return Ok(false);
            }
            Some(Tag::UpvalNew) => {}
            Some(Tag::UpvalOpen) => {
                let open_upvalue = OpenUpvalue::decode(&mut self.r);
                let OpenUpvalue { level } = self.record(open_upvalue)?;
                if let Some(Frame::Closure { open, .. }) = self.frames.last_mut() {
                    *open = Some(level as c_int);
                }
            }
            _ => {
                // C closures have no upvalue tags: it was a value tag.
                if kind == ClosureKind::Lua {
                    return Err(self.malformed("expected an upvalue"));
                }
                self.r.pos -= 1;
            }
        }
        // SAFETY: callers' contract.
        unsafe { self.value(L, s) }
    }

    /// Upvalue `i` of closure `id` is shared (after `Tag::UpvalRef`): joined to the upvalue
    /// the file names, of a closure read before, if that one exists and is closed. Upvalues
    /// are named by their saved numbers: a closure made of a rebound function's target keeps
    /// them in its saved slots (`rebind.rs`).
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    unsafe fn shared_upvalue(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        i: c_int,
    ) -> Result<(), Fail> {
        let shared = UpvalueRef::decode(&mut self.r);
        let UpvalueRef {
            closure: other,
            index,
        } = self.record(shared)?;
        if other >= self.next_id as u64 {
            return Err(self.malformed("upvalue of an undefined closure"));
        }
        // SAFETY: callers' contract; both ids defined (checked above): [this, other].
        let (this_p, other_p) = unsafe {
            push_obj(L, s, id);
            push_obj(L, s, other as u32);
            (luasnap_proto(L, -2), luasnap_proto(L, -1))
        };
        let other_slot = match self.shared_slot(other as u32, index) {
            Some(Ok(slot)) => Some(slot),
            Some(Err(())) => None,
            // SAFETY: other_p is the prototype of a live closure (checked non-null first).
            None if !other_p.is_null()
                && index >= 1
                && index <= unsafe { luasnap_proto_nupvalues(other_p) } as u64 =>
            {
                Some(index as c_int - 1)
            }
            None => None,
        };
        // Both Lua closures, and the upvalue one the other has: Lua does not check indices.
        let Some(other_slot) = other_slot.filter(|_| !this_p.is_null()) else {
            // SAFETY: pops both closures.
            unsafe { ffi::lua_settop(L, -3) };
            return Err(self.malformed("bad shared upvalue"));
        };
        // Open upvalues are shared through their coroutine's slot, each closure checked
        // (`join_open`), never by reference.
        // SAFETY: a Lua closure at -1 with that slot (checked above).
        if unsafe { luasnap_upval_shareable(L, -1, other_slot + 1) } == 0 {
            // SAFETY: pops both closures.
            unsafe { ffi::lua_settop(L, -3) };
            return Err(self.malformed(
                "a closure shares an open upvalue by reference (saves name open upvalues by their coroutine's stack slot)",
            ));
        }
        let (this_slot, to) = self.saved_slot(id, i).unwrap_or((i - 1, None));
        // A foreign load's closures share an upvalue only with another it built (a
        // permanent's is live state outside the load), and only the same variable: Lua's
        // compiler shares upvalues between closures of the same variable, named alike. (So
        // a closure's `_ENV` holding the globals is shared only as `_ENV`: see
        // `globals_here`.) A rebound closure's saved slots go by their saved names.
        // SAFETY: both prototypes of live closures (checked non-null above), each slot one
        // of its upvalues.
        if self.opts.trust == Trust::Foreign
            && (self.perm_ids.binary_search(&(other as u32)).is_ok()
                || unsafe {
                    self.slot_name(id, this_p, this_slot)
                        != self.slot_name(other as u32, other_p, other_slot)
                })
        {
            // SAFETY: pops both closures.
            unsafe { ffi::lua_settop(L, -3) };
            return Err(self.fail(FOREIGN_JOIN));
        }
        // SAFETY: two Lua closures, each with the slot named (this one's: at most its count,
        // its frame's `n`, in its saved slots or the prototype's); pops both.
        unsafe {
            luasnap_upval_join_slot(L, -2, this_slot, -1, other_slot);
            if let Some(j) = to {
                luasnap_upval_join_slot(L, -2, j, -2, this_slot);
            }
            ffi::lua_settop(L, -3);
        }
        Ok(())
    }

    /// The child on top is upvalue `i` of closure `id` (for an open upvalue, at `open`, its
    /// coroutine): set (popped). `coroutine.wrap`'s helper takes only a coroutine.
    ///
    /// # Safety
    /// Protected context, two free slots; the child on top; `s` this load's slots.
    pub(super) unsafe fn accept_upvalue(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        i: c_int,
        open: Option<c_int>,
        kind: ClosureKind,
    ) -> Result<(), Fail> {
        // SAFETY: a query of the top.
        if kind == ClosureKind::Wrap && unsafe { ffi::lua_type(L, -1) } != ffi::LUA_TTHREAD {
            // SAFETY: pops the child.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.malformed("a coroutine.wrap function without a coroutine"));
        }
        // SAFETY: callers' contract: [v] -> [f, v].
        unsafe {
            push_obj(L, s, id);
            ffi::lua_rotate(L, -2, 1);
        }
        let Some(level) = open else {
            // SAFETY: [f, v]: a closure made of a rebound function's target takes the value in
            // its saved slot, any other upvalue i (at most its count, the frame's `n`); pops
            // the closure.
            unsafe {
                if !self.set_rebound_upvalue(L, id, i) {
                    ffi::lua_setupvalue(L, -2, i);
                }
                ffi::lua_settop(L, -2);
            }
            return Ok(());
        };
        // SAFETY: callers' contract; [f, v] on top.
        unsafe { self.open_in_rebound(L, s, id)? };
        // The child is the thread whose stack slot `level` the upvalue is: only a suspended
        // coroutine this load builds (never the loading thread, the main thread or one that
        // exists already: their stacks change under the load), inside the stack the file
        // declares.
        // SAFETY: a query of the top.
        let co = unsafe { ffi::lua_tothread(L, -1) };
        let inside = !co.is_null() && self.loaded_cos.get(&co).is_some_and(|c| level <= c.len);
        if !inside {
            // SAFETY: pops the closure and the child.
            unsafe { ffi::lua_settop(L, -3) };
            return Err(self.malformed("bad open upvalue"));
        }
        // SAFETY: callers' contract; the closure at -2, co one of `loaded_cos`.
        let joined = unsafe { self.join_open(L, s, co, id, i, level) };
        // SAFETY: pops the closure and the coroutine.
        unsafe { ffi::lua_settop(L, -3) };
        joined
    }
}
