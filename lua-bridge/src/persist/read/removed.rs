//! After the root (format 10 on): the parts, in the order of their tags ([`After`]), and the
//! keys of removed entries that tables' layouts placed without them ([`RemovedKeys`], see
//! `write/removed.rs`).

use super::csrc::{
    luasnap_table_add_removed, luasnap_table_removed_key, luasnap_table_seal_removed, reserve,
};
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use crate::persist::format::{After, RemovedKeyEntry, RemovedKeys, Tag};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};

impl Loader<'_> {
    /// Reads the parts after the root: each once, in the order of their tags.
    ///
    /// # Safety
    /// As [`Loader::run`], with the root on top (left there).
    pub(super) unsafe fn after_root(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let mut last = None;
        while let Some(b) = self.r.u8() {
            let Some(part) = After::from_u8(b).filter(|&p| Some(p) > last) else {
                return Err(self.malformed(&format!(
                    "a part after the root with tag {b}, unknown or out of order"
                )));
            };
            last = Some(part);
            // SAFETY: callers' contract.
            unsafe {
                match part {
                    After::Pending => self.pending_finalizers(L, s)?,
                    After::RemovedKeys => self.removed_keys(L, s)?,
                }
            }
        }
        Ok(())
    }

    /// Gives code-1 nodes of loaded tables their keys ([`RemovedKeys`]): each entry names a
    /// table the file defined, a node and a key that is a reference or a permanent (nothing
    /// new is built here). A node that is no such entry of that table (its layout did not
    /// apply, under another hash seed or size) is left as it is; a key of a kind such a node
    /// cannot have is refused.
    ///
    /// # Safety
    /// As [`Loader::run`], with the root on top (left there).
    unsafe fn removed_keys(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let decoded = RemovedKeys::decode(&mut self.r);
        let RemovedKeys(n) = self.record(decoded)?;
        for _ in 0..n {
            let decoded = RemovedKeyEntry::decode(&mut self.r);
            let e = self.record(decoded)?;
            if e.table >= self.next_id {
                return Err(self.malformed("a removed key of an object the file does not define"));
            }
            // SAFETY: protected context (callers' contract); room for the table, the key and
            // what reading the key pushes; the table id was defined (checked above).
            unsafe {
                reserve(L, 10);
                if push_obj(L, s, e.table) != ffi::LUA_TTABLE {
                    ffi::lua_settop(L, -2);
                    return Err(self.malformed("a removed key of something that is not a table"));
                }
            }
            let tag = self.r.u8().and_then(Tag::from_u8);
            // SAFETY: as above, the table on top; each arm pushes the key or fails.
            let read = unsafe {
                match tag {
                    Some(t @ (Tag::Ref | Tag::StrRef)) => self.scalar(L, s, t),
                    Some(Tag::Perm) => self.permanent(L, s),
                    _ => {
                        Err(self.malformed("a removed key that is not a reference nor a permanent"))
                    }
                }
            };
            if let Err(e) = read {
                // SAFETY: pops the table.
                unsafe { ffi::lua_settop(L, -2) };
                return Err(e);
            }
            // SAFETY: [table, key] on top, with room for the two slots the insertion takes;
            // the C side checks the node and the key, and neither allocates nor raises; both
            // popped.
            let rc = unsafe {
                let mut rc = luasnap_table_removed_key(L, -2, e.node, -1, e.dead as i32);
                if rc == 1 && self.unlaid.contains_key(&e.table) {
                    self.add_unlaid_key(L, e.table, e.dead);
                    rc = 0;
                }
                ffi::lua_settop(L, -3);
                rc
            };
            if rc < 0 {
                return Err(self.malformed("a removed key of a kind no removed entry has"));
            }
        }
        Ok(())
    }

    /// Where the layout of the table objs[id] did not apply (another hash seed or node count:
    /// its entries sit where inserting them put them), its removed entries' keys in the keys
    /// table on top (keys[1..=n], none if n is 0) go in by insertion, as entries being
    /// removed: `next(t, k)` then finds k and goes on with the nodes after it, in the order
    /// this VM's insertions gave (docs/save-games.md, "Iteration order"). Pops the keys.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots; objs[id] a table; the keys table on top if
    /// n > 0.
    pub(super) unsafe fn unlaid_keys(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        id: u32,
        n: ffi::lua_Integer,
    ) {
        self.unlaid.entry(id).or_insert(false);
        if n == 0 {
            return;
        }
        // SAFETY: callers' contract; room for the table, a key and the insertion's two slots;
        // the table and the keys table popped.
        unsafe {
            reserve(L, 4);
            push_obj(L, s, id);
            for i in 1..=n {
                ffi::lua_rawgeti(L, -2, i);
                self.add_unlaid_key(L, id, false);
                ffi::lua_settop(L, -2);
            }
            ffi::lua_settop(L, -3);
        }
    }

    /// [table objs[id], key] on top (left there), the table's layout not applied: the key
    /// goes in as an entry being removed (`luasnap_table_add_removed`: skipped where the
    /// table holds it already or has no room without growing), sealed when the walk ends.
    ///
    /// # Safety
    /// Two free stack slots above the key.
    unsafe fn add_unlaid_key(&mut self, L: *mut lua_State, id: u32, dead: bool) {
        // SAFETY: callers' contract; the C side neither allocates nor raises.
        if unsafe { luasnap_table_add_removed(L, -2, -1, dead as i32) } == 0 {
            self.unlaid.insert(id, true);
        }
    }

    /// Empties the entries `add_unlaid_key` gave (their placeholder values), once the walk
    /// and the parts after the root are read: before anything of the game runs.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots.
    pub(super) unsafe fn seal_unlaid(&mut self, L: *mut lua_State, s: Slots) {
        for (&id, given) in self.unlaid.iter_mut() {
            if !std::mem::take(given) {
                continue;
            }
            // SAFETY: callers' contract; objs[id] is the table given keys; pushed and popped;
            // the C side neither allocates nor raises.
            unsafe {
                reserve(L, 1);
                push_obj(L, s, id);
                luasnap_table_seal_removed(L, -1);
                ffi::lua_settop(L, -2);
            }
        }
    }
}
