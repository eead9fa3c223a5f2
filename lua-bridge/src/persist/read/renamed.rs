//! Saved functions the game declares renamed or removed (`persist::renames`): bound to the
//! declared place of this version as `rebind.rs` binds a function at its own place, or
//! refused as the declaration says. Nothing here comes from the file but the saved place
//! the declarations are matched against.

use super::csrc::luasnap_proto_line;
use super::loader::{Fail, Loader};
use super::rebind::{shown_chunk, SavedProto};
use crate::bridge::helpers::{luasnap_proto, luasnap_proto_child};
use crate::persist::error::Accept;
use crate::persist::options::Trust;
use crate::persist::place::display;
use crate::persist::renames::{applied, missing_target, places_like, RenameTo};
use crate::persist::report::{RenamedFunction, SavedFunction};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_void;

impl Loader<'_> {
    /// Binds the saved function `f` (of the chunk whose current version is `current`) to the
    /// place the game declares for it, if a declaration applies: Ok(None) if none does (the
    /// caller binds it at its own place). A declaration whose place this version lacks, and a
    /// removal with no replacement, fail the load whatever its trust: the first is the game's
    /// mistake, the second the game's word that the saved code must not run. A removal with
    /// nothing replacing it (`true`) binds the saved function to a stand-in ([`stand_in`]).
    ///
    /// # Safety
    /// Protected context, 4 free slots; `s` this load's slots.
    pub(super) unsafe fn bind_declared(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        current: usize,
        f: &SavedProto<'_>,
        saved: Option<*const c_void>,
    ) -> Result<Option<*const c_void>, Fail> {
        let Some(a) = applied(&self.opts.renames, f.chunk, f.place) else {
            return Ok(None);
        };
        let (declaration, replacement) = (
            a.rename.declaration(),
            matches!(a.rename.to, RenameTo::Replacement(_)),
        );
        let saved_fn = SavedFunction {
            chunk: shown_chunk(f.chunk),
            place: display(f.place),
            line: f.line,
            now: None,
        };
        if matches!(a.rename.to, RenameTo::Gone) {
            // SAFETY: callers' contract.
            let p = unsafe { self.stand_in(L, s, &saved_fn, &declaration)? };
            return Ok(Some(self.bind_stand_in(current, f, saved, p, saved_fn)));
        }
        let Some(target) = a.target else {
            return Err(self.fail(format!(
                "the save holds the function {saved_fn}, which the game declares removed with no replacement ({declaration}): a save holding it does not load; to load such saves, name the function of this version that replaces it (G.removed[{:?}] = \"its replacement\")",
                a.rename.from
            )));
        };
        let Some(&p) = self.rb.currents[current].places.get(&target) else {
            if a.nested {
                return self.nested_missing(saved_fn, &declaration, &target, saved);
            }
            let like = places_like(self.rb.currents[current].places.keys(), &target);
            let missing = missing_target(a.rename, &target, &saved_fn.chunk, &like);
            return Err(self.fail(format!(
                "{missing}; the save holds the function {saved_fn}: correct the declaration"
            )));
        };
        let proto = SavedProto {
            hash: f.hash,
            line: f.line,
            chunk: f.chunk,
            place: &target,
            ups: f.ups.clone(),
            file_chunk: f.file_chunk,
            path: f.path,
        };
        let before = self.rb.rebounds.len();
        let bound = self.bind_place(current, proto, saved)?;
        if self.rb.rebounds.len() > before {
            if let Some(rb) = self.rb.rebounds.last_mut() {
                rb.declared = Some((saved_fn.clone(), replacement));
            }
        }
        // SAFETY: p is alive (its chunk's main closure is anchored for the load); reads only.
        let now = unsafe { luasnap_proto_line(p) }.max(0) as u64;
        self.rb.report.renamed.push(RenamedFunction {
            saved: SavedFunction {
                now: Some(now),
                ..saved_fn
            },
            to: display(&target),
            replacement,
        });
        Ok(bound)
    }

    /// Compiles (never from the file: this binary's text, with the saved function's name and
    /// the declaration as a string constant) the stand-in for the removed function `saved_fn`:
    /// a function of no upvalues that raises `attempt to call a nil value (field '<saved_fn>
    /// was removed ...')` when called. Its main closure is anchored in `protos` for the load;
    /// returns the stand-in's prototype.
    ///
    /// # Safety
    /// Protected context, 4 free slots; `s` this load's slots.
    unsafe fn stand_in(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        saved_fn: &SavedFunction,
        declaration: &str,
    ) -> Result<*const c_void, Fail> {
        let what = format!(
            "{saved_fn} was removed from this version of the game ({declaration}): the loaded game called it"
        );
        let mut eq = String::new();
        while what.contains(&format!("]{eq}]")) {
            eq.push('=');
        }
        let text =
            format!("return function() local removed = {{}} removed[ [{eq}[{what}]{eq}] ]() end");
        const NAME: &[u8] = b"=luasnap: removed function\0";
        // SAFETY: protected context (callers' contract); the text and name outlive the call;
        // the compiled main closure (or the error) is on top.
        let rc = unsafe {
            ffi::luaL_loadbufferx(
                L,
                text.as_ptr().cast(),
                text.len(),
                NAME.as_ptr().cast(),
                c"t".as_ptr(),
            )
        };
        if rc != ffi::LUA_OK {
            // SAFETY: pops the error.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.fail(format!(
                "the stand-in for the removed function {saved_fn} could not be compiled (out of memory?)"
            )));
        }
        // SAFETY: the main closure is on top; its prototype's first child is the stand-in;
        // anchored under the main prototype's address (popped), alive for the load.
        unsafe {
            let main = luasnap_proto(L, -1);
            let p = luasnap_proto_child(main, 0);
            ffi::lua_rawsetp(L, s.protos, main);
            Ok(p)
        }
    }

    /// A saved function nested in one the game declares renamed, which this version's
    /// function at the declared place does not have at `target`: missing, as a function at
    /// its own place would be (its saved code kept by an own load, a foreign load refused),
    /// and a declaration of its own binds it.
    fn nested_missing(
        &mut self,
        saved_fn: SavedFunction,
        declaration: &str,
        target: &[Vec<u8>],
        saved: Option<*const c_void>,
    ) -> Result<Option<*const c_void>, Fail> {
        let what = format!(
            "the save holds the function {saved_fn}, nested in a function the game declares renamed ({declaration}), and this version has no function at {}",
            display(target)
        );
        match saved {
            Some(p) => {
                self.rb.report.missing.push(saved_fn);
                Ok(Some(p))
            }
            None if self.opts.trust == Trust::Foreign => Err(self.refuse(
                format!("{what}; its saved code could be kept, but a foreign load takes no code from the file"),
                Accept::Rename(saved_fn.place),
            )),
            None => Err(self.fail(format!(
                "{what}, and the save-game carries no code to keep it with"
            ))),
        }
    }

    /// Records a saved function this version no longer has, which a foreign load refuses
    /// (no declaration applies, no function has its code), and binds it to a stand-in that
    /// raises when called, so that the walk goes on and the refusal names every such function
    /// at once (`refused_functions`): the load fails when the walk ends, or before the first
    /// load-time call, so no Lua code runs while a stand-in is in what it built.
    ///
    /// # Safety
    /// Protected context, 4 free slots; `s` this load's slots.
    pub(super) unsafe fn missing_later(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        current: usize,
        f: &SavedProto<'_>,
    ) -> Result<*const c_void, Fail> {
        // Named as a refusal names a chunk (`@src/entity.lua`), as before it named them all.
        let chunk = match f.chunk.first() {
            Some(b'@' | b'=') => crate::persist::place::printable(f.chunk),
            _ => super::rebind::string_chunk(f.chunk),
        };
        let saved_fn = SavedFunction {
            chunk,
            place: display(f.place),
            line: f.line,
            now: None,
        };
        if self.refused_functions.len() < crate::persist::error::REFUSED_NAMES {
            self.refused_functions.push(saved_fn.clone());
        } else {
            self.refused_functions_more += 1;
        }
        let p = match self.refused_stand_in {
            Some(p) => p,
            // SAFETY: callers' contract. Never called: the load is refused.
            None => unsafe { self.stand_in(L, s, &saved_fn, "not declared")? },
        };
        self.refused_stand_in = Some(p);
        Ok(self.bind_stand_in(current, f, None, p, saved_fn))
    }

    /// When the walk ends (or before a load-time call), the refusal of the functions this
    /// version no longer has that the load met (`missing_later`), if any: one error naming
    /// them all (the first `REFUSED_NAMES`, and how many more); what accepts the first is a
    /// declaration for it, each of the others needing its own.
    pub(super) fn refused_functions(&mut self) -> Option<Fail> {
        let first = self.refused_functions.first()?.clone();
        let (n, more) = (self.refused_functions.len(), self.refused_functions_more);
        let what = if n == 1 && more == 0 {
            format!("the save holds the function {first}, which this version of the game no longer has (removed or renamed); its saved code could be kept, but a foreign load takes no code from the file")
        } else {
            let list: Vec<String> = self
                .refused_functions
                .iter()
                .map(|f| f.to_string())
                .collect();
            let more = if more > 0 {
                format!(", and {more} more")
            } else {
                String::new()
            };
            format!("the save holds {} functions this version of the game no longer has (removed or renamed): {}{more}; their saved code could be kept, but a foreign load takes no code from the file; declare what became of each (the first: {})", n + self.refused_functions_more, list.join(", "), first.place)
        };
        self.refused_functions.clear();
        Some(self.refuse(what, Accept::Rename(first.place)))
    }
}
