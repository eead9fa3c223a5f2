//! A coroutine suspended in a function whose code changed in this version
//! ([`FunctionBinding::Current`](crate::persist::options::FunctionBinding)): its frame holds a
//! pc and a stack laid out for the *saved* code.
//!
//! - **Own** loads make the closures of such a function of its saved code (compiled from the
//!   save's text) and keep that code for a closure a suspended frame runs or that shares a
//!   suspended frame's local (*pinned*): it goes on where it stopped, as saved.
//! - **Foreign** loads make them of this version's function (the *target*) at once, and take
//!   no code from the file to run. The frame resumes in the target only if the target is the
//!   saved code, lines aside (an update that added lines above the function, or changed
//!   another function around it): the same instructions, constants, upvalues (by descriptor
//!   and name) and number of nested functions, so the saved pc and stack layout mean the same
//!   there (`luasnap_proto_same_code`). Anything else is refused, naming the function.
//!
//! What the target is compared with is what the file carries, not its fingerprint (a number
//! the file gives, which an update that only moved a function shares with one whose registers
//! shifted, and which a crafted file can set to anything): the chunk's saved text, compiled
//! here once per chunk when a frame first needs it, its tree checked against the file's
//! fingerprints. That compile is for comparison only: its main function is never called, its
//! chunk is not registered (`luasnap_chunk_find` never finds it), its prototypes are hidden
//! from fingerprint searches (`luasnap_proto_tree_retire`), so no saved closure is ever made
//! of it; each byte of its text is charged to the load's instruction budget, the compiler's
//! memory to its heap-growth cap.
//!
//! A closure of a rebound function that shares a suspended frame's local (an open upvalue)
//! is held to the same rule: the upvalue joins the target's slot of the saved number, which
//! is the same variable only if the target is the saved code.

use super::csrc::{
    luasnap_proto, luasnap_proto_hash, luasnap_proto_same_code, luasnap_proto_tree_retire,
    luasnap_thread_slot_lclosure, reserve,
};
use super::loader::{Fail, Loader};
use super::state::SavedChunk;
use crate::persist::error::Accept;
use crate::persist::options::Trust;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_void;

impl Loader<'_> {
    /// The frame records (`cis`) of a suspended coroutine `co`, its stack in place: a frame
    /// running a closure made for a rebound function is at a pc of the saved code. Own loads
    /// keep that closure's saved code; foreign loads resume it in the target if the target is
    /// the saved code (see the module doc), and refuse it otherwise.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots; `co` a coroutine this load
    /// made, its stack in place.
    pub(super) unsafe fn frames_in_rebound(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        co: *mut lua_State,
    ) -> Result<(), Fail> {
        if self.rb.pending_ptrs.is_empty() {
            return Ok(());
        }
        // By index, holding nothing with a destructor: a compile below may raise.
        for k in 0..self.cis.len() {
            // SAFETY: co is a coroutine this load made, its stack in place; reads a slot.
            let cl = unsafe { luasnap_thread_slot_lclosure(co, self.cis[k].func) };
            let Some(&id) = self.rb.pending_ptrs.get(&cl) else {
                continue;
            };
            let r = self.rb.pending_by_id[&id];
            if self.rb.rebounds[r].saved_code {
                self.rb.pinned.insert(id);
                continue;
            }
            // SAFETY: callers' contract.
            if !unsafe { self.resumes_in_target(L, s, r)? } {
                let f = self.rebound_named(r, "whose code changed in this version");
                return Err(self.no_saved_code(r, format!(
                    "a coroutine in the save is suspended in the function {f}: it can resume only in its saved code"
                )));
            }
        }
        Ok(())
    }

    /// A closure this load made for a rebound function (`id`) gets an open upvalue (a local
    /// of a suspended coroutine): made of the saved code, it keeps it; made of the target, it
    /// is accepted if the target is the saved code, else the load is refused.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots.
    pub(super) unsafe fn open_in_rebound(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
    ) -> Result<(), Fail> {
        let Some(&r) = self.rb.pending_by_id.get(&id) else {
            return Ok(());
        };
        if self.rb.rebounds[r].saved_code {
            self.rb.pinned.insert(id);
            return Ok(());
        }
        // SAFETY: callers' contract.
        if unsafe { self.resumes_in_target(L, s, r)? } {
            return Ok(());
        }
        let f = self.rebound_named(r, "whose code changed in this version");
        Err(self.no_saved_code(
            r,
            format!("the function {f}, and it shares a local variable of a coroutine suspended in its saved code"),
        ))
    }

    /// Refuses what needs saved code the load does not have (rebound function `r`): a
    /// foreign load takes none from the file (an own load would), a save written without code
    /// has none. A function that only moved, by its fingerprint, is refused for want of the
    /// text to check that by.
    fn no_saved_code(&mut self, r: usize, what: String) -> Fail {
        if self.opts.trust == Trust::Own {
            return self.fail(format!(
                "{what}, and the save-game carries no code (it was written without PersistOptions::code)"
            ));
        }
        let rb = &self.rb.rebounds[r];
        if rb.moved && matches!(self.chunks[rb.chunk].saved, SavedChunk::Absent) {
            let f = rb.function.clone();
            return self.refuse(
                format!("a suspended coroutine in the save runs the function {f} (or shares its local), which only moved to other lines in this version by its fingerprint; the save-game carries no text of its chunk to check that its code is the same (it was written without PersistOptions::code), and a foreign load does not take its code from the file"),
                Accept::TrustOwn,
            );
        }
        self.refuse(
            format!("{what}, which a foreign load does not take from the file"),
            Accept::TrustOwn,
        )
    }

    /// Whether closures of rebound function `r`'s target may run a frame suspended in the
    /// saved function: the target is the saved code, lines aside (see the module doc). Asked
    /// once per function.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots.
    unsafe fn resumes_in_target(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        r: usize,
    ) -> Result<bool, Fail> {
        if let Some(same) = self.rb.rebounds[r].same_code {
            return Ok(same);
        }
        let c = self.rb.rebounds[r].chunk;
        // SAFETY: callers' contract.
        let same = match unsafe { self.saved_tree(L, s, c)? } {
            None => false,
            Some(main) => {
                let rb = &self.rb.rebounds[r];
                let (path, line, hash, target) =
                    (rb.path.clone(), rb.function.line, rb.hash, rb.target);
                let saved = self.by_path(main, &path, c, line, hash)?;
                // SAFETY: both are alive: the saved tree anchored by saved_tree, the target
                // with its chunk; reads only.
                unsafe { luasnap_proto_same_code(saved, target) != 0 }
            }
        };
        self.rb.rebounds[r].same_code = Some(same);
        Ok(same)
    }

    /// The main prototype of chunk `c`'s saved version, compiled from the file's text for
    /// comparison only (see the module doc), or None: the file has no text for it.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots.
    unsafe fn saved_tree(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        c: usize,
    ) -> Result<Option<*const c_void>, Fail> {
        let (at, len, main_hash) = match self.chunks[c].saved {
            SavedChunk::Absent => return Ok(None),
            SavedChunk::Compiled(p) => return Ok(Some(p)),
            SavedChunk::Text { at, len, main_hash } => (at, len, main_hash),
        };
        self.chunks[c].saved = SavedChunk::Absent;
        if !self.limits.charge(len as u64) {
            let shown = self.chunks[c].shown();
            return Err(self.fail(format!(
                "save-game load exceeded its instruction budget compiling the saved version of chunk {shown} to compare it with this version's (each byte of text costs one instruction; LoadOptions::instruction_budget)"
            )));
        }
        let text = &self.r.data[at..at + len];
        let name = &self.chunks[c].name;
        // SAFETY: protected context; room for the name and the result. The name as a C string
        // (one with a NUL byte compiles under a shorter name, so its fingerprint differs and
        // it is refused below); lua_load catches the compiler's errors, its memory ones too,
        // and leaves the main closure or the message on top, above the name.
        let st = unsafe {
            reserve(L, 3);
            ffi::lua_pushlstring(L, name.as_ptr().cast(), name.len());
            let cname = ffi::lua_tolstring(L, -1, std::ptr::null_mut());
            ffi::luaL_loadbufferx(L, text.as_ptr().cast(), text.len(), cname, c"t".as_ptr())
        };
        if st != ffi::LUA_OK {
            // SAFETY: [name, message]: the message read, both popped.
            let msg = unsafe { super::proto::compile_error(L, 1) };
            let shown = self.chunks[c].shown();
            return Err(self.fail(format!(
                "chunk {shown} in the save-game does not compile: {msg}"
            )));
        }
        // SAFETY: [name, closure]: its tree hidden from fingerprint searches, the closure
        // anchored in protos under its prototype's address (popped), the name popped.
        let p = unsafe {
            let p = luasnap_proto(L, -1);
            luasnap_proto_tree_retire(p);
            ffi::lua_rawsetp(L, s.protos, p);
            ffi::lua_settop(L, -2);
            p
        };
        // SAFETY: p is alive (anchored above).
        if unsafe { luasnap_proto_hash(p) } != main_hash {
            let shown = self.chunks[c].shown();
            return Err(self.fail(format!(
                "chunk {shown} compiles to a different prototype tree than the save-game's fingerprint says; the save was written by another Lua build or altered"
            )));
        }
        self.chunks[c].saved = SavedChunk::Compiled(p);
        Ok(Some(p))
    }
}
