//! Lua closures: the prototype (`proto.rs`), then each upvalue: new (its value), shared with a
//! closure written before (that closure's id and upvalue number), or still open in a
//! suspended coroutine's stack (the coroutine and the stack level).
//!
//! A closure met in a table scan whose prototype is written already and whose upvalues are
//! closed and plain is written whole from the scan ([`Persister::write_closure`]); the rest go
//! the general way, with a frame of upvalues.

use super::super::format::{Ident, OpenUpvalue, ProtoRecord, Tag, UpvalueRef, Upvalues};
use super::super::slots::Slots;
use super::csrc::{
    kind, luasnap_checkstack, luasnap_closure_scan, luasnap_identity, luasnap_identity_at,
    luasnap_proto, luasnap_proto_nupvalues, luasnap_upval_open,
};
use super::frame::{Frame, Seg, UpvalueFrame};
use super::ids::IdSpace;
use super::persister::{push_seen, replace_with_upvalue, Fail, Persister};
use super::scratch::MAX_UPVALUES;
use super::thread::is_main_thread;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, c_void};

impl UpvalueFrame {
    pub(super) fn new(id: u32, n: c_int) -> Self {
        UpvalueFrame {
            id,
            upvalues: Upvalues::new(n as u32),
        }
    }

    /// The closure's id and the number of the upvalue to write next, moving on; None when
    /// every upvalue is written.
    pub(super) fn next_upvalue(&mut self) -> Option<(u32, c_int)> {
        Some((self.id, self.upvalues.next()? as c_int))
    }
}

/// The closure's prototype index and upvalue count, as [`Persister::closure_info`] found them
/// (the upvalues themselves in `Scratch::cl_uids` and `Scratch::cl_vals`).
#[derive(Clone, Copy)]
pub(super) struct ClosureInfo {
    proto_index: u32,
    n: usize,
}

impl Persister<'_> {
    /// The closure (object id) and upvalue number that wrote the upvalue `uid` first.
    #[inline(always)]
    fn upval_home(&self, uid: *const c_void) -> Option<(u32, c_int)> {
        let i = self.sc.refs.get(uid, IdSpace::Upval)?;
        Some(self.sc.upval_homes[i as usize])
    }

    /// Records that upvalue number `at` of the closure `owner` wrote the upvalue `uid`.
    fn set_upval_home(&mut self, uid: *const c_void, owner: u32, at: c_int) {
        let index = self.sc.upval_homes.len() as u32;
        self.sc.refs.insert(uid, IdSpace::Upval, index);
        self.sc.upval_homes.push((owner, at));
    }

    /// For a scanned value that is a Lua closure not written yet, that can be written whole
    /// without pushing it: not a permanent, its prototype written before, every upvalue closed
    /// and holding a plain value (see `plain`) or shared with a closure written before. Returns
    /// its prototype's index and upvalue count, with the upvalues in `cl_uids` and `cl_vals`,
    /// for `write_closure`.
    ///
    /// # Safety
    /// **Fresh**: `f` was described by a scan and no Lua code ran since.
    pub(super) unsafe fn closure_info(
        &mut self,
        vkind: u64,
        f: *const c_void,
    ) -> Option<ClosureInfo> {
        if vkind != kind::LCLOSURE || !self.unwritten(f) {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_closure_info(f) }
    }

    /// `closure_info` for a scanned value known to be neither written nor a permanent.
    ///
    /// # Safety
    /// As for `closure_info`.
    #[inline]
    pub(super) unsafe fn closure_info_scanned(
        &mut self,
        vkind: u64,
        f: *const c_void,
    ) -> Option<ClosureInfo> {
        if vkind != kind::LCLOSURE {
            return None;
        }
        // SAFETY: callers' contract.
        unsafe { self.new_closure_info(f) }
    }

    /// `closure_info` for a Lua closure known to be neither written nor a permanent.
    ///
    /// # Safety
    /// As for `closure_info`.
    unsafe fn new_closure_info(&mut self, f: *const c_void) -> Option<ClosureInfo> {
        let mut proto = std::ptr::null();
        // SAFETY: f is a live Lua closure (callers' contract); the buffers hold MAX_UPVALUES
        // (`Scratch::take`); reads only.
        let n = unsafe {
            luasnap_closure_scan(
                f,
                &mut proto,
                self.sc.cl_uids.as_mut_ptr(),
                self.sc.cl_vals.as_mut_ptr(),
                MAX_UPVALUES as c_int,
            )
        };
        let n = usize::try_from(n).ok()?;
        let proto_index = *self.sc.protos.get(&proto)?;
        let plain = (0..n).all(|i| {
            self.upval_home(self.sc.cl_uids[i]).is_some() || self.plain(&self.sc.cl_vals[i])
        });
        plain.then_some(ClosureInfo { proto_index, n })
    }

    /// Writes the closure `f` that `closure_info` just described, as the general path would.
    ///
    /// # Safety
    /// As for `closure_info`, which returned `info` for `f`.
    pub(super) unsafe fn write_closure(&mut self, f: *const c_void, info: ClosureInfo) {
        let id = self.record(f);
        // SAFETY: f is the live closure closure_info just described (callers' contract).
        Ident(unsafe { luasnap_identity(f) }).encode(&mut self.w);
        self.w.tag(Tag::LClosure);
        ProtoRecord::encode_index(&mut self.w, info.proto_index as u64);
        self.w.varint(info.n as u64);
        for i in 0..info.n {
            let (uid, v) = (self.sc.cl_uids[i], self.sc.cl_vals[i]);
            if let Some((owner, at)) = self.upval_home(uid) {
                let shared = UpvalueRef {
                    closure: owner as u64,
                    index: at as u64,
                };
                shared.encode(&mut self.w);
            } else {
                self.set_upval_home(uid, id, i as c_int + 1);
                self.w.tag(Tag::UpvalNew);
                // SAFETY: v was described by the closure scan; nothing ran since.
                unsafe { self.write_plain(&v) };
            }
        }
    }

    /// Writes the Lua closure on top (left there; anchored as `id`): its prototype and
    /// upvalue count, with a frame for the upvalues.
    ///
    /// # Safety
    /// Protected, with the closure on top.
    pub(super) unsafe fn lclosure(&mut self, L: *mut lua_State, id: u32) {
        // SAFETY: a Lua closure is on top; reads only.
        let (proto, n) = unsafe {
            let proto = luasnap_proto(L, -1);
            (proto, luasnap_proto_nupvalues(proto))
        };
        // SAFETY: the closure is on top; reads only.
        Ident(unsafe { luasnap_identity_at(L, -1) }).encode(&mut self.w);
        self.w.tag(Tag::LClosure);
        // SAFETY: Protected, with the closure of `proto` on top.
        unsafe { self.proto_ref(L, proto) };
        self.w.varint(n as u64);
        let frame = UpvalueFrame::new(id, n);
        self.sc.frames.push(Frame::LClosure(frame));
    }

    /// Writes the next upvalue of the Lua closure frame on top, or ends it.
    ///
    /// # Safety
    /// Protected; the frame's closure is anchored at `seen[id]`.
    pub(super) unsafe fn advance_lclosure(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let Some(Frame::LClosure(f)) = self.sc.frames.last_mut() else {
            unreachable!("the dispatcher calls this for a Lua closure frame");
        };
        let Some((id, i)) = f.next_upvalue() else {
            self.sc.frames.pop();
            return Ok(());
        };
        self.sc.segs.push(Seg::Upvalue(i));
        // SAFETY: Room; the closure is anchored at seen[id].
        unsafe { push_seen(L, s, id) };
        // SAFETY: the closure is on top.
        if let Some((co, level)) = unsafe { open_in_coroutine(L, i) } {
            // SAFETY: the closure is on top.
            unsafe { ffi::lua_pop(L, 1) };
            // SAFETY: Protected; co is a live coroutine (its stack holds the upvalue).
            return unsafe { self.open_upvalue(L, s, co, level) };
        }
        // SAFETY: the closure is on top and has upvalue i.
        let uid = unsafe { ffi::lua_upvalueid(L, -1, i) } as *const c_void;
        if let Some((owner, at)) = self.upval_home(uid) {
            // SAFETY: the closure is on top.
            unsafe { ffi::lua_pop(L, 1) };
            let shared = UpvalueRef {
                closure: owner as u64,
                index: at as u64,
            };
            shared.encode(&mut self.w);
            return Ok(());
        }
        self.set_upval_home(uid, id, i);
        self.w.tag(Tag::UpvalNew);
        // SAFETY: the closure is on top and has upvalue i.
        unsafe { replace_with_upvalue(L, i) };
        // SAFETY: Protected, with the upvalue's value on top.
        unsafe { self.value(L, s) }
    }

    /// Writes an upvalue open in the stack of the coroutine `co` at `level`: the level, then
    /// the coroutine.
    ///
    /// # Safety
    /// Protected; `co` is a live coroutine other than `L`.
    unsafe fn open_upvalue(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
        level: c_int,
    ) -> Result<(), Fail> {
        // SAFETY: Protected (may raise a memory error): room for the coroutine.
        unsafe { luasnap_checkstack(L, 2, c"persist".as_ptr()) };
        OpenUpvalue {
            level: level as u64,
        }
        .encode(&mut self.w);
        // SAFETY: co is suspended (not running), so its stack has room for one more value
        // (EXTRA_STACK), moved at once to L, which has room (above).
        unsafe {
            ffi::lua_pushthread(co);
            ffi::lua_xmove(co, L, 1);
        }
        // SAFETY: Protected, with the coroutine on top.
        unsafe { self.value(L, s) }
    }
}

/// If upvalue `i` of the Lua closure on top is still open in the stack of a coroutine other
/// than `L` and the main thread: that coroutine and the stack level. (Open in the main
/// thread's stack, the upvalue is written as closed, with its value now.)
///
/// # Safety
/// A Lua closure with upvalue `i` is on top.
unsafe fn open_in_coroutine(L: *mut lua_State, i: c_int) -> Option<(*mut lua_State, c_int)> {
    let (mut owner, mut level) = (std::ptr::null_mut(), 0);
    // SAFETY: callers' contract; reads only.
    let open = unsafe { luasnap_upval_open(L, -1, i, &mut owner, &mut level) } != 0;
    // SAFETY: owner is the live thread whose stack holds the upvalue.
    (open && owner != L && !unsafe { is_main_thread(owner) }).then_some((owner, level))
}
