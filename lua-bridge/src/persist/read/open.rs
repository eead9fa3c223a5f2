//! Open upvalues: a closure's upvalue that is a slot of a suspended coroutine's stack. Saves
//! name one by its coroutine and level; the loader joins it into the coroutine this load
//! builds and checks it against the coroutine's restored frames (`luasnap_open_upval_check`,
//! rules 1-4 in csrc/upvalcheck.c), since the VM trusts an open upvalue to be a live local of
//! a frame that could have made the closure (closing it, returning, `luaF_close`).
//!
//! Invariant: an open upvalue always points at a slot inside its coroutine's stack (the join
//! extends the stack to it, within the size the file declares), and one joined while the
//! coroutine's stack is still arriving stays on its `unchecked` list until its frames are
//! restored and checked; until then the coroutine cannot be resumed (`luasnap_thread_building`,
//! then `luasnap_thread_hold` until the load ends), so no frame runs against an unchecked
//! upvalue.

use super::csrc::{
    luasnap_open_upval_check, luasnap_thread_frames, luasnap_upmemo_free, luasnap_upmemo_reads,
    luasnap_upmemo_size, luasnap_upmemo_walks, luasnap_upval_join_at,
};
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use super::state::{LoadedCo, UpMemo};
use crate::persist::options::Trust;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};

/// Why a load refuses an open upvalue into a coroutine load-time code reset, for the C
/// side's messages (see `thread.rs`'s `RESET`).
const RESET_C: &std::ffi::CStr =
    c"an open upvalue into a coroutine that load-time code reset (coroutine.close)";

impl UpMemo {
    /// The memo, zeroed the first time.
    fn ptr(&mut self) -> *mut c_void {
        if self.0.is_empty() {
            // SAFETY: a pure size query.
            let words = unsafe { luasnap_upmemo_size() }.div_ceil(8);
            self.0 = vec![0; words];
        }
        self.0.as_mut_ptr().cast()
    }

    /// Prototype-tree walks the check made in this load so far.
    fn walks(&self) -> usize {
        if self.0.is_empty() {
            return 0;
        }
        // SAFETY: a memo of luasnap_upmemo_size() bytes, zeroed then used only by the check.
        unsafe { luasnap_upmemo_walks(self.0.as_ptr().cast()) }
    }

    /// Instructions the frame checks read in this load so far.
    fn reads(&self) -> usize {
        if self.0.is_empty() {
            return 0;
        }
        // SAFETY: as in `walks`.
        unsafe { luasnap_upmemo_reads(self.0.as_ptr().cast()) }
    }
}

thread_local! {
    /// `UpMemo::walks` of the last load this thread ended (see
    /// [`last_load_open_upvalue_walks`]).
    static LAST_WALKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// `UpMemo::reads` of the last load this thread ended.
    static LAST_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Instructions the checks of suspended frames read in the last load this thread ended: the
/// work counter of a test (about the code size of each function with a suspended frame, once
/// per load, whatever the number of frames).
#[cfg(any(test, feature = "fuzzing"))]
pub fn last_load_frame_check_reads() -> usize {
    LAST_READS.with(|w| w.get())
}

/// Prototype-tree walks the open-upvalue check made in the last load this thread ended: the
/// work counter of a test (each distinct question walks at most once per load).
#[cfg(any(test, feature = "fuzzing"))]
pub fn last_load_open_upvalue_walks() -> usize {
    LAST_WALKS.with(|w| w.get())
}

impl Drop for UpMemo {
    fn drop(&mut self) {
        LAST_WALKS.with(|w| w.set(self.walks()));
        LAST_READS.with(|w| w.set(self.reads()));
        if !self.0.is_empty() {
            // SAFETY: as in `walks`; the memo is not used after this.
            unsafe { luasnap_upmemo_free(self.0.as_mut_ptr().cast()) }
        }
    }
}

/// Why the check refused, as the load's error: a refusal is a malformed file, the check's
/// own allocation failing is not.
fn check_error(msg: &str) -> String {
    if msg.starts_with("out of memory") {
        format!("cannot check the save-game's open upvalues: {msg}")
    } else {
        format!("malformed save-game: {msg}")
    }
}

impl LoadedCo {
    /// A coroutine whose stack of `len` slots is about to arrive.
    pub(super) fn new(len: c_int) -> Self {
        LoadedCo {
            len,
            frames: None,
            unchecked: Vec::new(),
            open: BTreeMap::new(),
        }
    }
}

impl Loader<'_> {
    /// Joins upvalue `i` of the closure at -2 (object `id`) to slot `level` of the loaded
    /// coroutine `co` (checked to be in its declared stack). Into a coroutine whose frames are
    /// restored, the upvalue is checked first (Lua code the load runs next may call the
    /// closure); into one still arriving, once its frames are.
    ///
    /// # Safety
    /// Protected context; the closure at -2; `co` one of `loaded_cos`; `s` this load's slots.
    pub(super) unsafe fn join_open(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
        id: u32,
        i: c_int,
        level: c_int,
    ) -> Result<(), Fail> {
        let strict = (self.opts.trust == Trust::Foreign) as c_int;
        let memo = self.upmemo.ptr();
        let Some(lc) = self.loaded_cos.get_mut(&co) else {
            return Err(self.malformed("bad open upvalue"));
        };
        // SAFETY: protected context; the closure is at -2; co is a coroutine this load made,
        // alive (objs holds it); `lc.frames` are its frames, which cannot change while the
        // load holds it (the check verifies it was not reset).
        let err = unsafe {
            match &lc.frames {
                Some(frames) => luasnap_open_upval_check(
                    L,
                    -2,
                    i,
                    co,
                    level,
                    frames.as_ptr(),
                    frames.len() as c_int,
                    strict,
                    memo,
                ),
                None if ffi::lua_status(co) != ffi::LUA_ERRERR => RESET_C.as_ptr(),
                None => std::ptr::null(),
            }
        };
        if !err.is_null() {
            // SAFETY: a static C string from the check.
            let msg = unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy();
            return Err(self.fail(check_error(&msg)));
        }
        let above = lc.open.range(level + 1..).next().map(|(_, &a)| a);
        // SAFETY: as above; objs[aid] is a closure joined to co's open upvalue closest above
        // level (the C side checks that it still is); balanced pushes.
        let uv = unsafe {
            match above {
                Some((aid, an)) => {
                    push_obj(L, s, aid);
                    let uv = luasnap_upval_join_at(L, -3, i, co, level, -1, an);
                    ffi::lua_settop(L, -2);
                    uv
                }
                None => luasnap_upval_join_at(L, -2, i, co, level, 0, 0),
            }
        };
        if uv.is_null() {
            return Err(self.malformed("bad open upvalue"));
        }
        lc.open.insert(level, (id, i));
        if lc.frames.is_none() {
            lc.unchecked.push((id, i, level));
        }
        Ok(())
    }

    /// The memo of `luasnap_open_upval_check`, zeroed the first time.
    pub(super) fn upmemo_ptr(&mut self) -> *mut c_void {
        self.upmemo.ptr()
    }

    /// Indexes the frames of the loaded coroutine `co`, just restored (and held), and checks
    /// the open upvalues joined into it while its stack was arriving.
    ///
    /// # Safety
    /// Protected context; `co` one of `loaded_cos`, its frames restored; `s` this load's slots.
    pub(super) unsafe fn check_open_upvalues(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
    ) -> Result<(), Fail> {
        let strict = (self.opts.trust == Trust::Foreign) as c_int;
        let memo = self.upmemo_ptr();
        // SAFETY: co's frames are restored; the walk reads its CallInfo list.
        let frames = unsafe {
            let n = luasnap_thread_frames(co, std::ptr::null_mut(), 0);
            let mut frames = vec![std::ptr::null(); n.max(0) as usize];
            luasnap_thread_frames(co, frames.as_mut_ptr(), n);
            frames
        };
        let Some(lc) = self.loaded_cos.get_mut(&co) else {
            return Err(self.malformed("internal: a coroutine the load did not make"));
        };
        let unchecked = std::mem::take(&mut lc.unchecked);
        let mut err = std::ptr::null();
        for (cid, i, level) in unchecked {
            // SAFETY: protected context; objs[cid] is the closure (ids are checked when
            // read); one push, popped.
            unsafe {
                push_obj(L, s, cid);
                err = luasnap_open_upval_check(
                    L,
                    -1,
                    i,
                    co,
                    level,
                    frames.as_ptr(),
                    frames.len() as c_int,
                    strict,
                    memo,
                );
                ffi::lua_settop(L, -2);
            }
            if !err.is_null() {
                break;
            }
        }
        lc.frames = Some(frames);
        if !err.is_null() {
            // SAFETY: a static C string from the check.
            let msg = unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy();
            return Err(self.fail(check_error(&format!("suspended coroutine: {msg}"))));
        }
        Ok(())
    }
}
