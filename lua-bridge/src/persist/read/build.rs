//! Runs of plain table entries built in batches: decoded by [`Batch`] into steps, which
//! `luasnap_table_build` executes on the table of the frame (and the tables nested in it),
//! without a trip through the general path for each value. The tables a batch leaves open
//! become frames of the general path, in its stack layout, which goes on from there.

use super::batch::{nopen_room, Batch, BatchEnd, Open, OPS_CAP, PLAIN_DEPTH};
use super::csrc::luasnap_table_build;
use super::csrc::reserve;
use super::csrc::{kind, RawVal};
use super::frame::Frame;
use super::ids::REBUILDING;
use super::limits::COLLISIONS;
use super::loader::{Fail, Loader};
use super::meta::NO_FINALIZERS;
use crate::persist::format::TablePart;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

impl Loader<'_> {
    /// Reads entries of the table at stack index `at` (its frame on top, between entries) in
    /// batches that `luasnap_table_build` builds without a step through the general path for
    /// each value: entries of plain values (see [`Batch`]) and the new tables among them,
    /// their metatables and entries, nested up to `PLAIN_DEPTH` deep. A batch stops before
    /// anything else (a coroutine, say, or the table's end marker); the tables still open
    /// there become frames of the general path, in its stack layout (table, then its key
    /// slot), which goes on from that point. Returns whether it read anything.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots; the frame on top is the table's, at `at`
    /// with its key slot on top of the stack.
    #[inline(always)]
    pub(super) unsafe fn plain_entries(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        at: c_int,
    ) -> Result<bool, Fail> {
        let room = nopen_room(self.frames.len());
        let mut progress = false;
        if self.ops.len() < OPS_CAP {
            self.ops.resize(OPS_CAP, RawVal::EMPTY);
        }
        let mut open = Open::new();
        loop {
            let (n, end) = self.decode_batch(room, &mut open);
            if n == 0 {
                return Ok(progress);
            }
            progress = true;
            // SAFETY: callers' contract; `n` steps decoded by this batch.
            unsafe { self.build(L, s, at, n)? };
            // SAFETY: callers' contract; the batch built, its open tables on the stack.
            unsafe { self.open_frames(L, at, &open, end) };
            if !end.full || open.n > 0 || end.stage != TablePart::Key {
                return Ok(true);
            }
        }
    }

    /// Decodes one batch into `ops` (see [`Batch`]) from the loader's reader and counters,
    /// which it moves on; grows the scratch for the largest layout it decoded. Returns the
    /// number of steps and how the batch ended, with the tables it left open in `open`.
    #[inline(always)]
    fn decode_batch(&mut self, room: usize, open: &mut Open) -> (usize, BatchEnd) {
        let Ok(ops) = <&mut [RawVal; OPS_CAP]>::try_from(&mut self.ops[..OPS_CAP]) else {
            unreachable!("a slice of OPS_CAP steps");
        };
        let mut b = Batch {
            r: self.r,
            ops,
            n: 0,
            lay: &mut self.blay,
            laynx: &mut self.blaynx,
            nlay: 0,
            strs: self.strs,
            next_id: self.next_id,
            prealloc_left: self.prealloc_left,
            own_cap: self.own_cap,
            frames: &self.frames,
            late_meta: &mut self.late_meta,
            unlaid: &mut self.unlaid,
            strref_len: self.strref_len,
            protos: &self.protos,
            bindings: &self.rb.bindings,
            format: self.format,
            seed: self.seed,
            max_size: 0,
            checked_ref: if self.globals_denied {
                self.globals_id
            } else {
                u32::MAX
            },
            checked_joins: self.opts.trust == crate::persist::Trust::Foreign,
        };
        let end = b.decode(room, open);
        let (n, max_size) = (b.n, b.max_size);
        (self.r.pos, self.strs, self.next_id) = (b.r.pos, b.strs, b.next_id);
        self.prealloc_left = b.prealloc_left;
        if n > 0 && max_size > 0 {
            self.scratch_for(max_size);
        }
        (n, end)
    }

    /// Builds the batch's `n` steps on the table at `at`: its key slot goes (the steps work
    /// on the table on top); a step the C side refuses fails the load with what it means.
    ///
    /// # Safety
    /// As [`Loader::plain_entries`].
    unsafe fn build(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        at: c_int,
        n: usize,
    ) -> Result<(), Fail> {
        // SAFETY: protected context; the frame's table is at `at` with its key slot on top,
        // which goes (the steps work on the table on top); s.strs and s.objs are absolute
        // indices of tables; every id was checked against what had been read (see `Batch`);
        // the strings point into the body, alive for the load; the layouts' scratch has the
        // size the largest asks for; stack room for the nesting (reserved).
        let failed = unsafe {
            ffi::lua_settop(L, at);
            reserve(L, 2 * PLAIN_DEPTH as c_int + 8);
            luasnap_table_build(
                L,
                s.strs,
                s.objs,
                self.ops.as_ptr(),
                n as c_int,
                self.build_finals(),
                self.blay.as_ptr(),
                self.blaynx.as_ptr(),
                self.scratch.as_mut_ptr().cast(),
                self.memo.as_mut_ptr().cast(),
            )
        };
        if failed == -1 {
            return Ok(());
        }
        Err(self.build_error(failed))
    }

    /// What the step the build helper refused (`failed`: its index, or `-2 - index` for a
    /// metatable with `__gc` the load refuses) means, as the load's error at its bytes.
    #[cold]
    fn build_error(&mut self, failed: c_int) -> Fail {
        if failed <= -2 {
            let op = self.ops[(-2 - failed) as usize];
            self.r.pos = op.len as usize; // where its bytes are
            return self.fail(NO_FINALIZERS);
        }
        if self.collisions_over() {
            return self.fail(COLLISIONS);
        }
        let op = self.ops[failed as usize];
        if matches!(op.kind, kind::META | kind::REF | kind::LAYOUT) {
            self.r.pos = op.len as usize; // where its bytes are
        }
        let k = if op.kind & 0xff == kind::SETKV {
            kind::SET
        } else {
            op.kind
        };
        match k {
            kind::META => self.malformed("a metatable must be a table"),
            kind::SET => self
                .malformed("a table entry with a NaN key, or more keys than its layout has nodes"),
            kind::LAYOUT => self.malformed(
                "a table's layout does not match its entries (a damaged or forged file; \
                 nothing was placed)",
            ),
            kind::REF => self.fail(REBUILDING),
            kind::JOINUPVAL => self.malformed("bad shared upvalue"),
            _ => self.malformed("internal: a table build step out of place"),
        }
    }

    /// After a batch: back to the general path's stack layout, [t0, k1, t1, k2, t2, ..., tn,
    /// key slot], with a frame for each table the batch left open; the tables around the
    /// innermost one each expect their value (that table).
    ///
    /// # Safety
    /// A free slot; the batch's open tables (`open`) on the stack above the frame's table at
    /// `at`.
    unsafe fn open_frames(&mut self, L: *mut lua_State, at: c_int, open: &Open, end: BatchEnd) {
        if end.stage != TablePart::Value {
            // SAFETY: a free slot (callers' contract): the innermost table's key slot.
            unsafe { ffi::lua_pushnil(L) };
        }
        let nopen = open.n;
        if let Some(Frame::Table { stage, .. }) = self.frames.last_mut() {
            *stage = if nopen > 0 {
                TablePart::Value
            } else {
                end.stage
            };
        }
        for (i, &(id, _)) in open.tables[..nopen].iter().enumerate() {
            let stage = if i + 1 == nopen {
                end.stage
            } else {
                TablePart::Value
            };
            self.frames.push(Frame::Table {
                id,
                stage,
                at: at + 2 * (i as c_int + 1),
            });
        }
    }
}
