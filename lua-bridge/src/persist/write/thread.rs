//! Coroutines: their state (not started, dead, suspended), then for a live one its stack
//! slots (a frame), then for a suspended one its call frames, each C frame's continuation by
//! its name among the permanents, and its pending to-be-closed variables.
//!
//! As Eris: the running coroutine cannot be written (its stack is this call), nor the main
//! thread (a load has its own; a suspended coroutine is what persists).

use super::super::format::{
    CallFrame, Ident, PendingCloses, ThreadHeader, ThreadPart, ThreadParts,
};
use super::super::slots::Slots;
use super::csrc::{
    luasnap_checkstack, luasnap_identity, luasnap_thread_cis, luasnap_thread_info,
    luasnap_thread_push_slot, luasnap_thread_tbc, CiRecord,
};
use super::frame::{Frame, Seg, ThreadFrame};
use super::persister::{Fail, Persister};
use super::plain::Plain;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

/// What a coroutine is to the writer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CoState {
    /// Created, not resumed yet: its function and arguments on the stack.
    NotStarted,
    /// Returned, failed, or created without a function: nothing to write but the state.
    Dead,
    /// Yielded: its stack, call frames and pending to-be-closed variables.
    Suspended,
    /// Running or normal (it resumed another): refused.
    Running,
}

impl CoState {
    /// From the coroutine's `lua_status`, whether it has a call frame (`lua_getstack` at
    /// level 0) and its stack size (slots in use, its function's included).
    fn of(status: c_int, started: bool, stack: c_int) -> CoState {
        match status {
            ffi::LUA_OK if !started && stack > 1 => CoState::NotStarted,
            ffi::LUA_OK if !started => CoState::Dead,
            ffi::LUA_OK => CoState::Running,
            ffi::LUA_YIELD => CoState::Suspended,
            _ => CoState::Dead,
        }
    }
}

impl ThreadFrame {
    fn new(co: *mut lua_State, slots: c_int, nci: c_int) -> Self {
        ThreadFrame {
            co,
            parts: ThreadParts::new(slots as u32),
            nci,
        }
    }
}

/// A call frame before `luasnap_thread_cis` fills it.
const NO_CALL: CiRecord = CiRecord {
    func: 0,
    top: 0,
    callstatus: 0,
    u2: 0,
    pc: 0,
    nextraargs: 0,
    old_errfunc: 0,
    ctx: 0,
    k: std::ptr::null(),
};

/// Whether `co` is its VM's main thread.
///
/// # Safety
/// `co` is a live thread whose stack has room for one more value (every thread's has, while
/// it is not running: Lua keeps slots above its top).
pub(super) unsafe fn is_main_thread(co: *mut lua_State) -> bool {
    // SAFETY: callers' contract; the thread pushed on co's stack is popped at once.
    unsafe {
        let main = ffi::lua_pushthread(co) == 1;
        ffi::lua_pop(co, 1);
        main
    }
}

impl Persister<'_> {
    /// Writes the coroutine on top (left there; anchored by `object`): its state, and for one
    /// not started or suspended a frame for its stack.
    ///
    /// # Safety
    /// Protected, with a thread on top.
    pub(super) unsafe fn thread(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: a thread is on top.
        let co = unsafe { ffi::lua_tothread(L, -1) };
        if co == L {
            return Err(self.fail(L, "cannot persist the running coroutine".to_string()));
        }
        // SAFETY: co is a live thread, not running.
        if unsafe { is_main_thread(co) } {
            return Err(self.fail(L, "cannot persist the main thread".to_string()));
        }
        // SAFETY: lua_Debug is plain data; all-zero is a valid value.
        let mut ar: ffi::lua_Debug = unsafe { std::mem::zeroed() };
        let (mut size, mut nci, mut tbc, mut errfunc) = (0, 0, 0, 0i64);
        // SAFETY: co is a live thread; queries only.
        let (status, started) = unsafe {
            luasnap_thread_info(co, &mut size, &mut nci, &mut tbc, &mut errfunc);
            (ffi::lua_status(co), ffi::lua_getstack(co, 0, &mut ar) != 0)
        };
        // Pending to-be-closed variables (`tbc`) follow the call frames.
        let slots = size - 1;
        let stack = slots as u64;
        let state = CoState::of(status, started, size);
        if state != CoState::Running {
            // SAFETY: co is a live thread; reads only.
            Ident(unsafe { luasnap_identity(co as *const c_void) }).encode(&mut self.w);
        }
        match state {
            CoState::NotStarted => {
                ThreadHeader::NotStarted { stack }.encode(&mut self.w);
                let frame = ThreadFrame::new(co, slots, 0);
                self.sc.frames.push(Frame::Thread(frame));
            }
            CoState::Dead => ThreadHeader::Dead.encode(&mut self.w),
            CoState::Suspended => {
                ThreadHeader::Suspended { stack, errfunc }.encode(&mut self.w);
                let frame = ThreadFrame::new(co, slots, nci);
                self.sc.frames.push(Frame::Thread(frame));
            }
            CoState::Running => {
                return Err(self.fail(L, "cannot persist a running coroutine".to_string()));
            }
        }
        Ok(())
    }

    /// Writes the next stack slot of the coroutine frame on top, or its call frames and
    /// ends it.
    ///
    /// # Safety
    /// Protected; the frame's coroutine is anchored.
    pub(super) unsafe fn advance_thread(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let Some(Frame::Thread(f)) = self.sc.frames.last_mut() else {
            unreachable!("the dispatcher calls this for a coroutine frame");
        };
        let (co, nci) = (f.co, f.nci);
        match f.parts.next_part() {
            ThreadPart::Slot(i) => {
                let i = i as c_int;
                self.sc.segs.push(Seg::Stack(i));
                // SAFETY: Protected (may raise a memory error); co is alive and has slot i.
                unsafe {
                    luasnap_checkstack(L, 2, c"persist".as_ptr());
                    luasnap_thread_push_slot(L, co, i);
                }
                // SAFETY: Protected, with the slot's value on top.
                unsafe { self.value(L, s) }
            }
            ThreadPart::CallFrames => {
                if nci > 0 {
                    // SAFETY: Protected; co is a live suspended coroutine with nci frames.
                    unsafe { self.call_frames(L, s, co, nci)? };
                }
                self.sc.frames.pop();
                Ok(())
            }
        }
    }

    /// Writes the `nci` call frames of the suspended coroutine `co`, then its pending
    /// to-be-closed variables as stack offsets, oldest first.
    ///
    /// # Safety
    /// Protected; `co` is a live suspended coroutine with `nci` call frames.
    unsafe fn call_frames(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
        nci: c_int,
    ) -> Result<(), Fail> {
        CallFrame::encode_count(&mut self.w, nci as u64);
        let mut cis = vec![NO_CALL; nci as usize];
        // SAFETY: callers' contract; the buffer holds nci records.
        unsafe { luasnap_thread_cis(co, cis.as_mut_ptr(), nci) };
        for r in &cis {
            CallFrame::of(r).encode(&mut self.w);
            // SAFETY: Room; raises nothing (see `continuation`), so `cis` cannot be skipped.
            unsafe { self.continuation(L, s, r.k)? };
        }
        // SAFETY: co is alive; the first call counts, the second fills a buffer of that size.
        let tbc = unsafe {
            let n = luasnap_thread_tbc(co, std::ptr::null_mut(), 0);
            let mut slots = vec![0i32; n.max(0) as usize];
            luasnap_thread_tbc(co, slots.as_mut_ptr(), n);
            slots
        };
        PendingCloses::encode(&mut self.w, tbc.iter().map(|&slot| slot as u64));
        Ok(())
    }

    /// Writes the continuation `k` of a C call frame (null: none) by its name among the
    /// permanents; only known continuations have one. Raises nothing.
    ///
    /// # Safety
    /// Room for 2 values; the permanents table is at `s.perms`.
    unsafe fn continuation(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        k: *const std::ffi::c_void,
    ) -> Result<(), Fail> {
        if k.is_null() {
            Plain::Nil.encode(&mut self.w);
            return Ok(());
        }
        // SAFETY: callers' contract; a light userdata allocates nothing, rawget raises nothing.
        let named = unsafe {
            ffi::lua_pushlightuserdata(L, k.cast_mut());
            ffi::lua_rawget(L, s.perms) == ffi::LUA_TSTRING
        };
        if !named {
            // SAFETY: rawget's result is on top.
            unsafe { ffi::lua_pop(L, 1) };
            let what = "cannot persist a coroutine suspended inside a C function whose \
                        continuation is not a permanent (only pcall/xpcall and coroutine.yield \
                        are known)"
                .to_string();
            return Err(self.fail(L, what));
        }
        // SAFETY: the name, a string, is on top (written as `value` would, raising nothing).
        unsafe {
            self.string_on_top(L);
            ffi::lua_pop(L, 1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::CoState;
    use mlua_sys as ffi;

    #[test]
    fn a_coroutine_state_is_read_from_its_status_frames_and_stack() {
        // Created with its function (and arguments) on the stack, not resumed yet.
        assert_eq!(CoState::of(ffi::LUA_OK, false, 3), CoState::NotStarted);
        // Returned: an empty stack but its base slot.
        assert_eq!(CoState::of(ffi::LUA_OK, false, 1), CoState::Dead);
        // Failed: any error status.
        assert_eq!(CoState::of(ffi::LUA_ERRRUN, true, 4), CoState::Dead);
        assert_eq!(CoState::of(ffi::LUA_ERRMEM, false, 1), CoState::Dead);
        assert_eq!(CoState::of(ffi::LUA_YIELD, true, 5), CoState::Suspended);
        // Status OK with a call frame: running, or normal (it resumed another).
        assert_eq!(CoState::of(ffi::LUA_OK, true, 5), CoState::Running);
    }
}
