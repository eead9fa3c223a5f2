//! After the root (format 10 on): the parts, in the order of their tags ([`After`]), and the
//! keys of removed entries that tables' layouts placed without them ([`RemovedKeys`], see
//! `write/removed.rs`); from format 11 on also those of the loading VM's own `_G` and
//! `package.loaded` ([`GameRemovedKeyEntry`]), which the whole-game restore gives them
//! (`persist::game`, [`give_game_removed_keys`]).

use super::csrc::{
    luasnap_removed_key_kind, luasnap_table_add_removed, luasnap_table_removed_key,
    luasnap_table_seal_removed, reserve,
};
use super::ids::push_obj;
use super::loader::{Fail, Loader};
use crate::persist::format::{
    After, GameRemovedKeyEntry, GameTable, RemovedKeyEntry, RemovedKeys, Tag,
    GAME_REMOVED_KEYS_FORMAT,
};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

/// Values per entry of the table [`Loader::game_removed_keys`] fills: the table
/// ([`GameTable`] as an integer), the node, whether the key was dead, the key.
const GAME_ENTRY: ffi::lua_Integer = 4;

impl Loader<'_> {
    /// Reads the parts after the root: each once, in the order of their tags.
    ///
    /// # Safety
    /// As [`Loader::run`], with the root on top (left there).
    pub(super) unsafe fn after_root(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let mut last = None;
        while let Some(b) = self.r.u8() {
            let part = After::from_u8(b).filter(|&p| {
                Some(p) > last
                    && (p != After::GameRemovedKeys || self.format >= GAME_REMOVED_KEYS_FORMAT)
            });
            let Some(part) = part else {
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
                    After::GameRemovedKeys => self.game_removed_keys(L, s)?,
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
            // SAFETY: as above, the table on top.
            let read = unsafe { self.referenced_key(L, s) };
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

    /// Reads a removed entry's key, a reference or a permanent (nothing new is built), and
    /// pushes it; pushes nothing when it fails.
    ///
    /// # Safety
    /// As [`Loader::run`], with room for what reading the key pushes.
    unsafe fn referenced_key(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let tag = self.r.u8().and_then(Tag::from_u8);
        // SAFETY: callers' contract; each arm pushes the key or fails.
        unsafe {
            match tag {
                Some(t @ (Tag::Ref | Tag::StrRef)) => self.scalar(L, s, t),
                Some(Tag::Perm) => self.permanent(L, s),
                _ => Err(self.malformed("a removed key that is not a reference nor a permanent")),
            }
        }
    }

    /// Reads the removed keys of the loading VM's own `_G` and `package.loaded`
    /// ([`After::GameRemovedKeys`]) into a table of [`GAME_ENTRY`] values per entry, kept in
    /// the registry ([`Loader::game_removed`]) for the whole-game restore, which gives them
    /// once it has set the globals and applied their layouts (`give_game_removed_keys`). Each
    /// key is checked here as `removed_keys` checks its own: a reference to an object or
    /// string the file defined or a permanent the load allows (nothing new is built), of a
    /// kind a code-1 node's key can be; the count is bounded by the bytes left. What the
    /// restore checks against the tables (the node, no live key shadowed, no key twice, a
    /// free node) it checks there.
    ///
    /// # Safety
    /// As [`Loader::run`], with the root on top (left there).
    unsafe fn game_removed_keys(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let decoded = RemovedKeys::decode(&mut self.r);
        let RemovedKeys(n) = self.record(decoded)?;
        // SAFETY: protected context (callers' contract); room for the list, the key and what
        // reading it pushes. Not presized by the count the file claims: the list grows with
        // the entries read, each at least five bytes of the file.
        unsafe {
            reserve(L, 12);
            ffi::lua_createtable(L, 0, 0);
        }
        for i in 0..n as ffi::lua_Integer {
            let decoded = GameRemovedKeyEntry::decode(&mut self.r);
            let e = match self.record(decoded) {
                Ok(e) => e,
                Err(f) => {
                    // SAFETY: pops the list.
                    unsafe { ffi::lua_settop(L, -2) };
                    return Err(f);
                }
            };
            // SAFETY: as above, the list on top.
            let read = unsafe { self.referenced_key(L, s) };
            // SAFETY: [list, key] on top after a read, [list] after a failed one; the kind
            // check reads only.
            let kind_ok =
                read.is_ok() && unsafe { luasnap_removed_key_kind(L, -1, e.dead as c_int) } != 0;
            if !kind_ok {
                // SAFETY: pops the key (if read) and the list.
                unsafe {
                    ffi::lua_settop(L, if read.is_ok() { -3 } else { -2 });
                }
                read?;
                return Err(self.malformed("a removed key of a kind no removed entry has"));
            }
            // SAFETY: [list, key] -> [list]: each value stored at its index (may allocate:
            // protected context).
            unsafe {
                let at = i * GAME_ENTRY;
                ffi::lua_rawseti(L, -2, at + 4);
                ffi::lua_pushinteger(L, e.table as ffi::lua_Integer);
                ffi::lua_rawseti(L, -2, at + 1);
                ffi::lua_pushinteger(L, e.node as ffi::lua_Integer);
                ffi::lua_rawseti(L, -2, at + 2);
                ffi::lua_pushboolean(L, e.dead as c_int);
                ffi::lua_rawseti(L, -2, at + 3);
            }
        }
        // SAFETY: the list on top, popped into the registry (may allocate: protected).
        self.game_removed = Some(unsafe { ffi::luaL_ref(L, ffi::LUA_REGISTRYINDEX) });
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

/// Gives the table at `live`, the loading VM's own `_G` or `package.loaded` (`which`), the
/// removed keys the file names for it, from the list at `list` ([`GAME_ENTRY`] values per
/// entry, read and checked by [`Loader::game_removed_keys`]). Where its layout applied
/// (`laid`), each key goes into its node, as `luasnap_table_removed_key` checks it: the node
/// must be what the layout made of a code-1 entry, the key no live key of the table and found
/// at that node alone; else by insertion, as an entry being removed, as
/// `luasnap_table_add_removed` checks it: the table holds no node of the key (no live key is
/// shadowed, a key named twice goes in once), and a free node takes it without a rehash. A
/// key that fails a check is skipped. The caller seals the table afterwards
/// (`luasnap_table_seal_removed`).
///
/// # Safety
/// A protected context of a VM built by this crate; `live` and `list` absolute indices of
/// tables, `list` one that `Loader::game_removed_keys` filled.
pub(crate) unsafe fn give_game_removed_keys(
    L: *mut lua_State,
    live: c_int,
    list: c_int,
    which: GameTable,
    laid: bool,
) {
    // SAFETY: protected context (callers' contract): room for an entry's four values and the
    // insertion's two slots; each entry's values pushed and popped; the C side neither
    // allocates nor raises.
    unsafe {
        reserve(L, 6);
        let n = ffi::lua_rawlen(L, list) as ffi::lua_Integer / GAME_ENTRY;
        for i in 0..n {
            let at = i * GAME_ENTRY;
            ffi::lua_rawgeti(L, list, at + 1);
            let table = ffi::lua_tointegerx(L, -1, std::ptr::null_mut());
            ffi::lua_rawgeti(L, list, at + 2);
            let node = ffi::lua_tointegerx(L, -1, std::ptr::null_mut());
            ffi::lua_rawgeti(L, list, at + 3);
            let dead = ffi::lua_toboolean(L, -1);
            ffi::lua_rawgeti(L, list, at + 4);
            if table == which as ffi::lua_Integer {
                if laid {
                    luasnap_table_removed_key(L, live, node as u32, -1, dead);
                } else {
                    luasnap_table_add_removed(L, live, -1, dead);
                }
            }
            ffi::lua_settop(L, -5);
        }
    }
}

/// Empties the entries `luasnap_table_add_removed` gave the table at `live` (their
/// placeholder values), once every removed key went in.
///
/// # Safety
/// `live` the index of a table; neither allocates nor raises.
pub(crate) unsafe fn seal_game_table(L: *mut lua_State, live: c_int) {
    // SAFETY: callers' contract.
    unsafe { luasnap_table_seal_removed(L, live) };
}
