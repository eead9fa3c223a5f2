//! Identities of keys (format 7: [`Ident`]): the identity the saving VM had given an object
//! that was a table key, given back to the object the load builds for it, before anything can
//! use it as a key, so tables keyed by it keep their layout (see `layout.rs`) and `pairs()`
//! order, and so do tables the game keys by it after the load (luasnap's Lua, patch 4).
//!
//! Checked as every field of a file is: an identity is in `1..IDENT_LIMIT` (the range the
//! saving VM's counter gives; name identities, bit 31 set, belong to permanents, which a file
//! names instead of writing), and given only to a new object whose tag follows it
//! (`Ident::decode`). A whole-game save's key counter (how many identities the saving VM gave)
//! is at least every identity in it, and then each is given to one object only, unless the
//! counter went past `IDENT_LIMIT - 1` and started again at 1 ([`check_counter`]). A load of a
//! value takes shared identities as they come (they only share a collision chain): the file of
//! a value a game saved after its counter started again may hold them. The identity of an object the load did not build (a permanent)
//! never changes: the file names none, and a `__persist` rebuild that returns an object that
//! has an identity already keeps it.
//!
//! Invariant: `Idents::next` is `Some` only between an `Ident` and the object it precedes: set
//! by [`Loader::identity`], taken when that object is registered ([`Loader::register`]) or,
//! for an object a `__persist` function rebuilds, kept in its frame until the rebuild returns.

use super::csrc::luasnap_set_identity;
use super::loader::{Fail, Loader};
use super::state::Idents;
use crate::persist::format::{Ident, Tag, IDENT_LIMIT};
use mlua_sys::lua_State;

impl Idents {
    /// The highest identity the file gave (0 if none): a whole-game save's key counter must be
    /// at least this.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Whether the file gave some identity to two objects.
    pub fn shared(&self) -> bool {
        self.shared
    }
}

impl Loader<'_> {
    /// An identity (after `Tag::Ident`), for the new object whose tag comes next: checked and
    /// kept until that object is registered.
    pub(super) fn identity(&mut self) -> Result<(), Fail> {
        if self.format < 7 {
            return Err(self.malformed("an identity in a file of format 6 or older"));
        }
        if self.idents.next.is_some() {
            return Err(self.malformed("an identity before an identity"));
        }
        let decoded = Ident::decode(&mut self.r);
        let Ident(ident) = self.record(decoded)?;
        if self.final_waiting()
            && !matches!(
                self.r.peek().and_then(Tag::from_u8),
                Some(Tag::Table | Tag::UdBytes)
            )
        {
            return Err(self.malformed(
                "a finalization mark before a value that is not a new table or userdata",
            ));
        }
        if !self.idents.given.insert(ident) {
            self.idents.shared = true;
        }
        self.idents.max = self.idents.max.max(ident);
        self.idents.next = Some(ident);
        Ok(())
    }

    /// Gives the object on top the identity the file gave it, if any (see the module docs).
    ///
    /// # Safety
    /// A value on top.
    pub(super) unsafe fn take_identity(&mut self, L: *mut lua_State) {
        if let Some(ident) = self.idents.next.take() {
            // SAFETY: a value on top (callers' contract); sets a field of an object that has
            // no identity yet only (csrc/ident.c).
            unsafe { luasnap_set_identity(L, -1, ident) };
        }
    }

    /// The identity waiting for the next object (see the invariant), taken: for an object
    /// whose frame gives it later (a `__persist` rebuild's result). 0 for none.
    pub(super) fn defer_identity(&mut self) -> u32 {
        self.idents.next.take().unwrap_or(0)
    }

    /// Sets the identity the next registered object takes (0: none), from a frame that
    /// deferred it.
    pub(super) fn resume_identity(&mut self, ident: u32) {
        self.idents.next = (ident != 0).then_some(ident);
    }
}

/// Whether `counter`, a whole-game save's key counter (how many identities the saving VM
/// gave), fits the identities of its file (the highest of them `max`; `shared` if one was
/// given twice). Until the counter passes `IDENT_LIMIT - 1` its identities are 1..=counter,
/// each given once; after, they start again at 1 and may repeat (luaH_keyid in ltable.c).
pub(crate) fn check_counter(counter: i64, max: u32, shared: bool) -> Result<u64, &'static str> {
    if counter < 0 {
        return Err("malformed save-game: the key counter of a whole-game save is out of range");
    }
    let wrapped = counter as u64 >= IDENT_LIMIT;
    if !wrapped && (counter as u64) < max as u64 {
        return Err(
            "malformed save-game: the key counter of a whole-game save is below an identity \
             the file gives",
        );
    }
    if !wrapped && shared {
        return Err(
            "malformed save-game: two objects with one identity, in a game whose key counter \
             never started again",
        );
    }
    Ok(counter as u64)
}
