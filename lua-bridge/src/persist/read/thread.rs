//! Coroutines: a fresh thread, its stack values, and for a suspended one its call frames
//! (`ThreadHeader`, `ThreadParts`, `CallFrame` and `PendingCloses` in `format/`).
//!
//! A coroutine being built cannot be resumed (`luasnap_thread_building`) until its stack and
//! frames are complete and checked; a suspended one is then held (`luasnap_thread_hold`)
//! until the load ends, so the frames its open upvalues were checked against stay as they
//! are. Load-time code that resets one meanwhile (`coroutine.close`) fails the load. Every
//! frame record is checked by the C side against the invariants `resume` relies on
//! (`luasnap_thread_restore`), with continuations only from the VM's own.

use super::csrc::CiRecord;
use super::csrc::{
    luasnap_thread_building, luasnap_thread_hold, luasnap_thread_put, luasnap_thread_restore,
    luasnap_thread_set_tbc,
};
use super::frame::Frame;
use super::ids::thread_of;
use super::loader::{Fail, Loader};
use super::state::LoadedCo;
use crate::persist::budget::budget_hook_intact;
use crate::persist::format::{
    CallFrame, PendingCloses, Tag, ThreadHeader, ThreadPart, ThreadParts,
};
use crate::persist::permanents::{CONTINUATIONS, PCALL_K, UNPERMS_KEY};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

/// Why a load refuses a coroutine that load-time code reset while the load built it.
pub(super) const RESET: &str =
    "a load-time function reset a coroutine the load was still building (coroutine.close)";

impl Loader<'_> {
    /// A coroutine (after `Tag::Thread`): made, registered, and for one with a stack its
    /// frame pushed (false); a dead one is complete (true).
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn thread(&mut self, L: *mut lua_State, s: Slots) -> Result<bool, Fail> {
        let state = ThreadHeader::state(&mut self.r);
        let state = self.record(state)?;
        let id = self.id();
        // SAFETY: callers' contract; a new thread on top.
        let co = unsafe { ffi::lua_newthread(L) };
        self.all_threads.push(co);
        if state == ThreadHeader::SUSPENDED {
            self.threads.push(co);
        }
        if state == ThreadHeader::SUSPENDED || state == ThreadHeader::NOT_STARTED {
            // Unresumable until complete and checked (see Frame::Thread).
            // SAFETY: sets a flag of the new thread.
            unsafe { luasnap_thread_building(co, 1) };
        }
        // SAFETY: callers' contract; the thread on top.
        unsafe { self.register(L, s, id)? };
        let header = ThreadHeader::decode(state, &mut self.r);
        let header = self.record(header)?;
        let stack = header.stack();
        let errfunc = match header {
            ThreadHeader::Dead => return Ok(true),
            ThreadHeader::NotStarted { .. } => None,
            ThreadHeader::Suspended { errfunc, .. } => {
                self.loaded_cos.insert(co, LoadedCo::new(stack as c_int));
                Some(errfunc)
            }
        };
        // SAFETY: pops the thread (kept in objs).
        unsafe { ffi::lua_settop(L, -2) };
        self.frames.push(Frame::Thread {
            id,
            parts: ThreadParts::new(stack as u32),
            errfunc,
        });
        Ok(false)
    }

    /// The main thread (after `Tag::MainThread`): pushed and registered.
    ///
    /// # Safety
    /// Protected context, two free slots; `s` this load's slots.
    pub(super) unsafe fn main_thread(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        // SAFETY: callers' contract; pushes the main thread.
        unsafe { ffi::lua_pushthread(L) };
        let id = self.id();
        // SAFETY: callers' contract; the thread on top.
        unsafe { self.register(L, s, id) }
    }

    /// Moves a coroutine frame on (`id`, at `parts`): its next stack value, or at its end its
    /// frames (suspended: `errfunc` Some) restored and checked.
    ///
    /// # Safety
    /// Protected context, 8 free slots; `s` this load's slots; the coroutine's frame on top
    /// of the frame stack.
    pub(super) unsafe fn advance_thread(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        parts: ThreadParts,
        errfunc: Option<i64>,
    ) -> Result<bool, Fail> {
        if let ThreadPart::Slot(_) = parts.peek() {
            // SAFETY: callers' contract.
            return unsafe { self.value(L, s) };
        }
        // SAFETY: callers' contract; objs[id] is this coroutine.
        let co = unsafe { thread_of(L, s, id) };
        // SAFETY: clears a flag of the thread; says whether it was still set (else load-time
        // code reset the coroutine meanwhile).
        if unsafe { luasnap_thread_building(co, 0) } != 0 {
            return Err(self.malformed(RESET));
        }
        if let Some(errfunc) = errfunc {
            // SAFETY: callers' contract.
            let restored = unsafe { self.restore_frames(L, s, co, errfunc) };
            // Held unresumable until the load ends, restored or not: its open upvalues are
            // checked against these frames (now and as later closures join them) before
            // anything can run it.
            // SAFETY: sets a flag of the thread.
            unsafe { luasnap_thread_hold(co, 1) };
            restored?;
            // SAFETY: callers' contract; co is one of `loaded_cos`, its frames restored.
            unsafe { self.check_open_upvalues(L, s, co)? };
        }
        // SAFETY: callers' contract; objs[id] is this coroutine.
        Ok(unsafe { self.finish(L, s, id) })
    }

    /// The child on top is stack slot `slot` of coroutine `id`: moved there.
    ///
    /// # Safety
    /// Protected context, a free slot; the child on top; `s` this load's slots.
    pub(super) unsafe fn accept_slot(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        slot: c_int,
    ) -> Result<(), Fail> {
        // SAFETY: callers' contract; objs[id] is this coroutine.
        let co = unsafe { thread_of(L, s, id) };
        // Nothing raises on co (it has no error handler: see luasnap_thread_put).
        // SAFETY: the child on top of the loading thread; co is a coroutine this load made.
        if unsafe { luasnap_thread_put(L, co, slot) } != 0 {
            return Err(
                self.malformed("a coroutine stack larger than Lua allows (LUAI_MAXSTACK slots)")
            );
        }
        Ok(())
    }

    /// Reads the frame records of the suspended coroutine `co` (its stack is in place) and
    /// rebuilds them, after checking every invariant the VM relies on to resume it.
    ///
    /// # Safety
    /// Protected context, 8 free slots; `s` this load's slots; `co` a coroutine this load
    /// made, its stack values in place.
    unsafe fn restore_frames(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
        errfunc: i64,
    ) -> Result<(), Fail> {
        let nci = CallFrame::count(&mut self.r);
        let nci = self.record(nci)?;
        // Kept in the loader, not this frame: reading a continuation may raise a memory error,
        // whose longjmp must skip no value with a destructor.
        self.cis.clear();
        self.cis.reserve(nci as usize);
        for _ in 0..nci {
            // SAFETY: callers' contract.
            let ci = unsafe { self.frame_record(L, s)? };
            self.cis.push(ci);
        }
        // Stack the frames need beyond the values read: charged to the preallocation
        // budget, so frame tops cannot make a small file allocate large stacks.
        // SAFETY: a query of co's stack.
        let stacksize = unsafe { ffi::lua_gettop(co) } as u64 + 1;
        let need = self
            .cis
            .iter()
            .map(|c| c.top.max(0) as u64)
            .max()
            .unwrap_or(0);
        if !self.charge_stack(need.saturating_sub(stacksize)) {
            return Err(self.malformed(
                "suspended coroutine: its frames need more stack than the file can justify (for an own save: than its heap-growth cap allows)",
            ));
        }
        // A frame running a function whose code changed in this version (`rebind.rs`).
        // SAFETY: callers' contract.
        unsafe { self.frames_in_rebound(L, s, co)? };
        // SAFETY: callers' contract.
        unsafe { self.rebuild_frames(L, co, errfunc)? };
        if self.format >= 4 {
            self.pending_tbc(co)?;
        }
        Ok(())
    }

    /// One frame record (the continuation a permanent's name, or nil).
    ///
    /// # Safety
    /// As [`Loader::restore_frames`].
    unsafe fn frame_record(&mut self, L: *mut lua_State, s: Slots) -> Result<CiRecord, Fail> {
        let frame = CallFrame::decode(&mut self.r);
        let frame = self.record(frame)?;
        // SAFETY: callers' contract.
        let k = unsafe { self.continuation(L, s)? };
        Ok(frame.to_ci(k))
    }

    /// A frame's continuation: nil, or the name of a permanent light C function (checked
    /// against the VM's own continuations when the frames are restored).
    ///
    /// # Safety
    /// As [`Loader::restore_frames`].
    unsafe fn continuation(&mut self, L: *mut lua_State, s: Slots) -> Result<*const c_void, Fail> {
        if self.r.peek() == Some(Tag::Nil as u8) {
            self.r.pos += 1;
            return Ok(std::ptr::null());
        }
        // SAFETY: callers' contract.
        let named = unsafe { self.value(L, s)? };
        // SAFETY: a query of the top.
        if !named || unsafe { ffi::lua_type(L, -1) } != ffi::LUA_TSTRING {
            return Err(self.malformed("bad continuation"));
        }
        // SAFETY: the name on top, replaced by its permanent, then popped.
        let p = unsafe {
            ffi::lua_rawget(L, s.perms);
            let p = if ffi::lua_type(L, -1) == ffi::LUA_TLIGHTUSERDATA {
                ffi::lua_touserdata(L, -1)
            } else {
                std::ptr::null_mut()
            };
            ffi::lua_settop(L, -2);
            p
        };
        if p.is_null() {
            return Err(
                self.fail("missing permanent continuation (save written by another build?)")
            );
        }
        Ok(p as *const c_void)
    }

    /// Restores the frames read (`cis`) on `co`; the C side checks them first.
    ///
    /// # Safety
    /// Protected context, two free slots; `co` a coroutine this load made, its stack in place.
    unsafe fn rebuild_frames(
        &mut self,
        L: *mut lua_State,
        co: *mut lua_State,
        errfunc: i64,
    ) -> Result<(), Fail> {
        // The continuations a frame may resume through: only those the VM registered
        // itself (C functions), whatever the permanents given map their names to.
        // SAFETY: callers' contract.
        unsafe { self.continuations(L) };
        let memo = self.upmemo_ptr();
        let Some((known, pcall_k)) = &self.known_k else {
            unreachable!("looked up above");
        };
        // SAFETY: co is fresh with its stack in place (callers' contract); the records, the
        // known continuations and the memo are the loader's, alive for the call; the C side
        // checks every record and returns why it refuses, never raising on co.
        let err = unsafe {
            luasnap_thread_restore(
                L,
                co,
                self.cis.as_ptr(),
                self.cis.len() as c_int,
                errfunc,
                known.as_ptr(),
                known.len() as c_int,
                *pcall_k,
                memo,
            )
        };
        if err.is_null() {
            return Ok(());
        }
        // SAFETY: a static C string from the restore.
        let msg = unsafe { std::ffi::CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned();
        if msg.starts_with("not enough memory") {
            // Its stack or frames could not grow: the VM is out of memory, the file may be
            // fine.
            self.out_of_memory = true;
            return Err(self.fail(format!("suspended coroutine: {msg}")));
        }
        Err(self.malformed(&format!("suspended coroutine: {msg}")))
    }

    /// The VM's own continuations ([`CONTINUATIONS`], from the registry's unperms) and
    /// pcall's among them, in `known_k`; looked up once per load.
    ///
    /// # Safety
    /// Protected context, two free slots.
    unsafe fn continuations(&mut self, L: *mut lua_State) {
        if self.known_k.is_some() {
            return;
        }
        let (mut known, mut pcall_k) = (Vec::new(), std::ptr::null());
        // SAFETY: callers' contract; reads registry fields (no allocation), balanced pushes.
        unsafe {
            ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, UNPERMS_KEY.as_ptr());
            for name in CONTINUATIONS {
                if ffi::lua_type(L, -1) == ffi::LUA_TTABLE
                    && ffi::lua_getfield(L, -1, name.as_ptr()) == ffi::LUA_TLIGHTUSERDATA
                {
                    let k = ffi::lua_touserdata(L, -1) as *const c_void;
                    known.push(k);
                    if name == PCALL_K {
                        pcall_k = k;
                    }
                }
                ffi::lua_settop(L, -2);
            }
            ffi::lua_settop(L, -2);
        }
        self.known_k = Some((known, pcall_k));
    }

    /// The pending to-be-closed variables of `co` (format 4 on), oldest first: slots the C
    /// side checks against its restored frames.
    fn pending_tbc(&mut self, co: *mut lua_State) -> Result<(), Fail> {
        let slots = PendingCloses::decode(&mut self.r);
        let slots = self.record(slots)?;
        let n = slots.len() as c_int;
        // SAFETY: co's frames are restored; the C side checks each slot and does not raise.
        let err = unsafe { luasnap_thread_set_tbc(co, slots.as_ptr(), n) };
        if !err.is_null() {
            // SAFETY: a static C string from the check.
            let msg = unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned();
            return Err(self.malformed(&format!("suspended coroutine: {msg}")));
        }
        Ok(())
    }

    /// When the walk is over: every suspended coroutine is complete and checked, and may run
    /// from now on; one that load-time code reset fails the load.
    pub(super) fn release_threads(&mut self) -> Result<(), Fail> {
        for i in 0..self.threads.len() {
            // SAFETY: a coroutine this load made, alive (objs holds it); clears a flag and
            // says whether it was still set.
            if unsafe { luasnap_thread_hold(self.threads[i], 0) } != 0 {
                return Err(self.malformed(RESET));
            }
        }
        Ok(())
    }

    /// When the load is over: coroutines it made run outside it from now on, without its
    /// budget hook (one that load-time code replaced is left as that code set it).
    ///
    /// # Safety
    /// The coroutines this load made are alive (objs holds them).
    pub(super) unsafe fn unhook_threads(&mut self) {
        for &co in &self.all_threads {
            // SAFETY: callers' contract; queries and clears co's hook.
            unsafe {
                if budget_hook_intact(co) {
                    ffi::lua_sethook(co, None, 0, 0);
                }
            }
        }
    }
}
