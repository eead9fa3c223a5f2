//! The loader's walk: depth first, one value at a time, with a frame on a Rust stack for each
//! object still receiving its children, so the Lua stack stays O(1) (O(depth) for the first
//! [`STACK_FRAMES`](super::limits::STACK_FRAMES) tables) whatever the nesting.
//!
//! [`Loader::value`] reads one value: a scalar or a reference is complete at once; an object
//! with children pushes its frame. [`Loader::advance`] moves the top frame on (reads its next
//! child, or ends it); [`Loader::accept`] hands a completed child to the frame it belongs to.
//! Each kind's steps live in its own file; this file only dispatches on the tag or the frame.

use super::csrc::{luasnap_gc_nofinal, luasnap_gc_stopem, luasnap_hash_seed, reserve};
use super::frame::Frame;
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use crate::persist::format::{Scalar, Tag, ThreadPart, PENDING_FORMAT, REMOVED_KEYS_FORMAT};
use crate::persist::options::Trust;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

impl Loader<'_> {
    /// Reads the root value and leaves it on the stack.
    ///
    /// # Safety
    /// Protected context; `s` are valid absolute indices of this call's helper tables.
    pub unsafe fn run(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: callers' contract.
        let walked = unsafe { self.walk_all(L, s) };
        // Refused permanents, all named at once, before anything runs.
        if let Some(refused) = self.refused_permanents(walked.is_err()) {
            return Err(refused);
        }
        // Functions this version lacks, all named at once: before what the walk stopped on
        // (a coroutine suspended in one is refused as in a stand-in), unless memory ran out.
        if walked.is_ok() || !self.out_of_memory {
            if let Some(refused) = self.refused_functions() {
                return Err(refused);
            }
        }
        walked?;
        if self.r.remaining() != 0 {
            return Err(self.malformed("trailing bytes after the root value"));
        }
        // Closures of changed functions bound to this version's (`rebind.rs`), before any
        // initializer runs them.
        // SAFETY: callers' contract.
        unsafe { self.finish_rebinding(L, s)? };
        // Every suspended coroutine is complete (its frame ended), its open upvalues
        // checked: they may run from now on (the initializers below may resume them).
        self.release_threads()?;
        // SAFETY: callers' contract, for each step.
        unsafe {
            self.recheck_finalizers(L, s)?;
            self.run_inits(L, s)?;
            self.mark_finalizers(L, s)?;
            self.unhook_threads();
        }
        Ok(())
    }

    /// The walk from the root, and the parts after it.
    ///
    /// # Safety
    /// As [`Loader::run`].
    unsafe fn walk_all(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: callers' contract, for each step.
        unsafe {
            self.begin(L);
            self.walk(L, s)?;
            if self.format >= REMOVED_KEYS_FORMAT {
                self.after_root(L, s)?;
            } else if self.format >= PENDING_FORMAT && self.r.remaining() != 0 {
                self.pending_finalizers(L, s)?;
            }
            self.seal_unlaid(L, s);
        }
        Ok(())
    }

    /// Sets the load's collector flags and reads the VM's hash seed and globals table.
    ///
    /// # Safety
    /// Protected context.
    unsafe fn begin(&mut self, L: *mut lua_State) {
        // No emergency collection while prototypes are looked up by raw pointer (the caller
        // allows them again when the load ends, whatever its outcome).
        // SAFETY: sets a flag of the global state (callers' contract).
        unsafe { luasnap_gc_stopem(L, 1) };
        // SAFETY: reads the global state's seed.
        self.seed = unsafe { luasnap_hash_seed(L) };
        // SAFETY: pushes the globals table, reads its address, pops it.
        self.globals = unsafe {
            ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
            let g = ffi::lua_topointer(L, -1);
            ffi::lua_settop(L, -2);
            g
        };
        if !self.opts.finalizers || self.opts.trust == Trust::Foreign {
            // No finalizer from anything the load runs (see luasnap_gc_nofinal); the caller
            // unmarks it after the load (`nofinal_marked`). A foreign load that allows
            // finalizers marks its objects when it ends, once their __gc are checked (see
            // `mark_finalizers`).
            // SAFETY: sets one bit of the global state.
            self.nofinal_marked = unsafe { luasnap_gc_nofinal(L, 1) } == 0;
        }
    }

    /// Reads the root value, with everything in it: each completed child goes to its parent
    /// frame until no frame is left.
    ///
    /// # Safety
    /// As [`Loader::run`].
    pub(super) unsafe fn walk(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: callers' contract, for each step.
        unsafe {
            let mut ready = self.value(L, s)?;
            loop {
                if ready {
                    // A completed child is on top: hand it to its parent.
                    match self.frames.len() {
                        0 => break,
                        _ => self.accept(L, s)?,
                    }
                }
                ready = match self.frames.len() {
                    0 => break,
                    _ => self.advance(L, s)?,
                };
            }
        }
        Ok(())
    }

    /// Reads one value. Returns true if it is complete on top of the stack, false if a frame
    /// was pushed that will leave it there when done.
    ///
    /// # Safety
    /// As [`Loader::run`].
    pub(super) unsafe fn value(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        // Every kind's step below pushes at most this many values.
        // SAFETY: callers' contract.
        unsafe { reserve(L, 8) };
        let Some(tag) = self.r.u8() else {
            return Err(self.malformed("truncated"));
        };
        let Some(tag) = Tag::from_u8(tag) else {
            return Err(self.malformed(&format!("unknown tag {tag}")));
        };
        // SAFETY: protected context, `s` this load's slots (callers' contract) and 8 free
        // slots (reserved above): what each kind's step requires.
        unsafe {
            match tag {
                Tag::Nil
                | Tag::False
                | Tag::True
                | Tag::Int
                | Tag::Float
                | Tag::Light
                | Tag::Str
                | Tag::StrRef
                | Tag::Ref => self.scalar(L, s, tag)?,
                Tag::Perm => self.permanent(L, s)?,
                Tag::UdPlain => self.plain_userdata(L, s)?,
                Tag::MainThread => self.main_thread(L, s)?,
                Tag::Table => return self.table(L, s),
                Tag::LClosure => return self.lclosure(L, s),
                Tag::CClosure => return self.cclosure(L, s),
                Tag::UdBytes => return self.userdata(L, s),
                Tag::Thunk | Tag::TwoPhase => return Ok(self.special(tag == Tag::TwoPhase)),
                Tag::Thread => return self.thread(L, s),
                Tag::Layout => {
                    return Err(self.malformed("a table layout where a value belongs"));
                }
                Tag::Ident => {
                    // The new object whose tag follows (checked) takes it.
                    self.identity()?;
                    return self.value(L, s);
                }
                Tag::Final => {
                    // The new table or userdata whose tag follows (checked) takes it.
                    self.final_mark()?;
                    return self.value(L, s);
                }
                Tag::UpvalNew | Tag::UpvalRef | Tag::UpvalOpen => {
                    return Err(self.malformed("upvalue outside a closure"));
                }
            }
        }
        Ok(true)
    }

    /// A value without children (`Scalar`), whose tag `tag` was just read: pushed (a string
    /// given its id, a reference checked against what was defined).
    ///
    /// # Safety
    /// Protected context and two free slots; `s` this load's slots.
    pub(super) unsafe fn scalar(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        tag: Tag,
    ) -> Result<(), Fail> {
        let v = Scalar::decode(tag, &mut self.r);
        let v = self.record(v)?;
        // SAFETY: a free slot (callers' contract); each arm pushes one value, which does not
        // allocate but for a string (protected context).
        unsafe {
            match v {
                Scalar::Nil => ffi::lua_pushnil(L),
                Scalar::False => ffi::lua_pushboolean(L, 0),
                Scalar::True => ffi::lua_pushboolean(L, 1),
                Scalar::Int(v) => ffi::lua_pushinteger(L, v),
                Scalar::Float(bits) => ffi::lua_pushnumber(L, f64::from_bits(bits)),
                Scalar::Light(p) => ffi::lua_pushlightuserdata(L, p as usize as *mut c_void),
                Scalar::Str(b) => self.string(L, s, b),
                Scalar::StrRef(sid) => self.string_ref(L, s, sid)?,
                Scalar::Ref(id) => self.reference(L, s, id)?,
            }
        }
        Ok(())
    }

    /// Moves the top frame on: reads its next child. Returns whether a value is complete on top
    /// (a child value, or this frame's own object when it finished).
    ///
    /// # Safety
    /// As [`Loader::run`]; a frame on the frame stack.
    unsafe fn advance(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        let frame = *self.frames.last().expect("non-empty");
        // SAFETY: callers' contract: what each kind's step requires.
        unsafe {
            match frame {
                Frame::Table { id, stage, at } => self.advance_table(L, s, id, stage, at),
                Frame::Closure {
                    id, upvalues, kind, ..
                } => self.advance_closure(L, s, id, upvalues, kind),
                Frame::Userdata { id, parts } if parts.peek().is_none() => {
                    Ok(self.finish(L, s, id))
                }
                Frame::Special { id, parts, .. } if parts.peek().is_none() => {
                    Ok(self.finish(L, s, id))
                }
                Frame::Userdata { .. } | Frame::Special { .. } => self.value(L, s),
                Frame::Thread { id, parts, errfunc } => {
                    self.advance_thread(L, s, id, parts, errfunc)
                }
            }
        }
    }

    /// The value on top is the next child of the top frame: put it in place (popped). The
    /// frame moves on first; each kind's step gets what the child is for.
    ///
    /// # Safety
    /// As [`Loader::run`]; the child on top, a frame on the frame stack.
    unsafe fn accept(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let depth = self.frames.len();
        let frame = self.move_on();
        // SAFETY: callers' contract: what each kind's step requires.
        unsafe {
            match frame {
                Frame::Table { id, stage, at } => self.accept_table(L, s, id, stage, at, depth),
                Frame::Closure {
                    id,
                    upvalues,
                    open,
                    kind,
                } => {
                    let i = upvalues
                        .peek()
                        .expect("a closure frame takes no child past its last");
                    self.accept_upvalue(L, s, id, i as c_int, open, kind)
                }
                Frame::Userdata { id, parts } => {
                    let part = parts
                        .peek()
                        .expect("a userdata frame takes no child past its end");
                    self.accept_user_value(L, s, id, part)
                }
                Frame::Special { id, parts, ident } => {
                    let part = parts
                        .peek()
                        .expect("a special frame takes no child past its end");
                    self.accept_special(L, s, id, part, ident)
                }
                Frame::Thread { id, parts, .. } => match parts.peek() {
                    ThreadPart::Slot(i) => self.accept_slot(L, s, id, i as c_int),
                    ThreadPart::CallFrames => {
                        unreachable!("a coroutine takes no child past its stack")
                    }
                },
            }
        }
    }

    /// Moves the top frame past the child that just arrived; returns the frame as it was
    /// (what the child is for).
    fn move_on(&mut self) -> Frame {
        let top = self.frames.last_mut().expect("non-empty");
        let was = *top;
        match top {
            Frame::Table { stage, .. } => *stage = stage.after(),
            Frame::Closure { upvalues, open, .. } => {
                upvalues.next();
                *open = None;
            }
            Frame::Userdata { parts, .. } => {
                parts.next();
            }
            Frame::Special { parts, .. } => {
                parts.next();
            }
            Frame::Thread { parts, .. } => {
                parts.next_part();
            }
        }
        was
    }

    /// Pops the finished frame and pushes its object.
    ///
    /// # Safety
    /// Protected context and a free slot; object `id` is defined (every frame's object is
    /// registered when its frame is pushed, or, rebuilt, before its frame ends).
    pub(super) unsafe fn finish(&mut self, L: *mut lua_State, s: Slots, id: u32) -> bool {
        self.frames.pop();
        // SAFETY: callers' contract: clears the frame's key slot (keys[depth]), pushes objs[id].
        unsafe {
            ffi::lua_pushnil(L);
            ffi::lua_rawseti(L, s.keys, self.frames.len() as ffi::lua_Integer + 1);
            push_obj(L, s, id);
        }
        true
    }
}
