//! After the root (format 10 on): the keys of removed entries that tables' layouts wrote as
//! code 1, without their keys ([`RemovedKeys`]).
//!
//! Lua keeps a removed entry's key in its node (dead once a collection clears it) so that
//! `next(t, k)` still finds the node after `t[k] = nil`: a `pairs()` loop may clear the entry
//! it is at. A coroutine suspended in such a loop holds k; a load that left the node without
//! its key stopped that loop with "invalid key to 'next'" (tests/suspended_pairs.rs). The
//! layouts are written when each table ends, when the key (an object, perhaps written later,
//! or a string a collection cleared) may have no id yet; so the keys come here, after every
//! object has its id. A key no object or string written has stays without one: nothing the
//! file holds can look it up.
//!
//! A whole-game save does the same for the loading VM's own `_G` and `package.loaded`, whose
//! layouts its root carries (`persist::game`): their code-1 nodes are described with those
//! layouts ([`game_removed_nodes`]) and their keys written after the other tables'
//! ([`After::GameRemovedKeys`], format 11).

use super::super::format::{
    After, GameRemovedKeyEntry, GameTable, RemovedKeyEntry, RemovedKeys, Scalar,
};
use super::csrc::{luasnap_push_node_key, luasnap_table_removed_keys};
use super::ids::{IdSpace, ObjState};
use super::persister::{Fail, Persister};
use super::scratch::GameRemovedNode;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_void;

/// The kinds of `luasnap_table_removed_keys` (csrc/luasnap.h `LS_RK_*`).
const RK_DEAD: u8 = 0;
const RK_CFUNC: u8 = 2;

/// Appends the code-1 nodes of the table `t` (the live `_G` or `package.loaded`, `table`) to
/// `out`.
///
/// # Safety
/// `t` is a live table; no Lua code runs meanwhile. Allocates host memory only.
pub(crate) unsafe fn game_removed_nodes(
    t: *const c_void,
    table: GameTable,
    out: &mut Vec<GameRemovedNode>,
) {
    let (mut nodes, mut ptrs, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        let cap = nodes.len();
        // SAFETY: the three buffers hold `cap` entries each; t is live (callers' contract);
        // reads only.
        let n = unsafe {
            luasnap_table_removed_keys(
                t,
                nodes.as_mut_ptr(),
                ptrs.as_mut_ptr(),
                kinds.as_mut_ptr(),
                cap as u32,
            )
        } as usize;
        if n <= cap {
            for i in 0..n {
                out.push(GameRemovedNode {
                    table,
                    node: nodes[i],
                    key: ptrs[i],
                    kind: kinds[i],
                });
            }
            return;
        }
        nodes.resize(n, 0);
        ptrs.resize(n, std::ptr::null());
        kinds.resize(n, 0);
    }
}

impl Persister<'_> {
    /// Writes the keys of the code-1 nodes of `_G` and `package.loaded` described with their
    /// layouts ([`GameRemovedNode`]), if any (`After::GameRemovedKeys`): each key looked up
    /// among the objects and strings written, or a library C function named, as
    /// [`Persister::removed_keys`] does; a key that is neither is left out.
    ///
    /// # Safety
    /// As for [`Persister::removed_keys`].
    pub(super) unsafe fn game_removed_keys(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(), Fail> {
        let nodes = std::mem::take(&mut self.game_removed);
        let start = self.w.buf.len();
        let mut n = 0u64;
        for g in &nodes {
            let at = self.w.buf.len();
            GameRemovedKeyEntry {
                table: g.table,
                node: g.node,
                dead: g.kind == RK_DEAD,
            }
            .encode(&mut self.w);
            let written = self.key_ref(g.key)
                || (g.kind == RK_CFUNC
                    && self.sc.refs.obj_state(g.key) == ObjState::Permanent
                    // SAFETY: Protected; g.key is the address of a light C function (the
                    // node's key bits, kind LS_RK_CFUNC), pushed only to be looked up among
                    // the permanents by address, never called.
                    && unsafe {
                        ffi::lua_checkstack(L, 4);
                        ffi::lua_pushcfunction(
                            L,
                            std::mem::transmute::<*const c_void, ffi::lua_CFunction>(g.key),
                        );
                        self.permanent_or_pop(L, s)
                    });
            if written {
                n += 1;
            } else {
                self.w.buf.truncate(at);
            }
        }
        self.game_removed = nodes;
        if n > 0 {
            let entries = self.w.buf.split_off(start);
            self.w.buf.push(After::GameRemovedKeys as u8);
            RemovedKeys(n).encode(&mut self.w);
            self.w.buf.extend_from_slice(&entries);
        }
        Ok(())
    }

    /// Writes the key whose identity is `p` as a reference, if it is an object or string
    /// written; returns whether it did.
    fn key_ref(&mut self, p: *const c_void) -> bool {
        if let Some(id) = self.sc.refs.get(p, IdSpace::Obj) {
            Scalar::<&[u8]>::Ref(id as u64).encode(&mut self.w);
            return true;
        }
        if let Some(sid) = self.sc.refs.get(p, IdSpace::Str) {
            Scalar::<&[u8]>::StrRef(sid as u64).encode(&mut self.w);
            return true;
        }
        false
    }

    /// Writes the permanent on top by its name and pops it; returns false, writing nothing,
    /// when it is none (popped too).
    ///
    /// # Safety
    /// Protected; a value on top and room for what `permanent` pushes.
    unsafe fn permanent_or_pop(&mut self, L: *mut lua_State, s: Slots) -> bool {
        // SAFETY: callers' contract; `permanent` pops the value when it writes it.
        unsafe {
            if self.permanent(L, s) {
                return true;
            }
            ffi::lua_pop(L, 1);
        }
        false
    }

    /// Writes the keys of the code-1 nodes of the tables `end_table` listed, if any
    /// (`After::RemovedKeys`). Each table is read as it is now, and each key looked up among
    /// the objects and strings written: a dead key's identity is an address only (its object
    /// may be gone, and another may have its address: then Lua's own dead key matches that
    /// one too), never read through.
    ///
    /// # Safety
    /// Protected, the root and the objects awaiting finalization written (no frame left), the
    /// collector stopped: the tables listed are written, so anchored or reachable (**Alive**).
    pub(super) unsafe fn removed_keys(&mut self, L: *mut lua_State, s: Slots) -> Result<(), Fail> {
        let tables = std::mem::take(&mut self.sc.removed_tables);
        let start = self.w.buf.len();
        let mut n = 0u64;
        for &t in &tables {
            let Some(table) = self.sc.refs.get(t, IdSpace::Obj) else {
                continue;
            };
            // SAFETY: t is a live table (callers' contract); reads only.
            unsafe { self.describe_removed(t) };
            for i in 0..self.sc.rk_nodes.len() {
                let (node, p, kind) =
                    (self.sc.rk_nodes[i], self.sc.rk_ptrs[i], self.sc.rk_kinds[i]);
                let at = self.w.buf.len();
                let dead = kind == RK_DEAD;
                RemovedKeyEntry { table, node, dead }.encode(&mut self.w);
                // SAFETY: callers' contract; t live, node one of its nodes described just now.
                if unsafe { self.removed_key(L, s, t, node, p, kind) } {
                    n += 1;
                } else {
                    self.w.buf.truncate(at);
                }
            }
        }
        self.sc.removed_tables = tables;
        if n > 0 {
            let entries = self.w.buf.split_off(start);
            self.w.buf.push(After::RemovedKeys as u8);
            RemovedKeys(n).encode(&mut self.w);
            self.w.buf.extend_from_slice(&entries);
        }
        Ok(())
    }

    /// Fills `rk_nodes`, `rk_ptrs` and `rk_kinds` with the code-1 nodes of the table `t`.
    ///
    /// # Safety
    /// `t` is a live table.
    unsafe fn describe_removed(&mut self, t: *const c_void) {
        let sc = &mut self.sc;
        loop {
            let cap = sc.rk_nodes.len();
            // SAFETY: the three buffers hold `cap` entries each; t is live (callers'
            // contract); reads only.
            let n = unsafe {
                luasnap_table_removed_keys(
                    t,
                    sc.rk_nodes.as_mut_ptr(),
                    sc.rk_ptrs.as_mut_ptr(),
                    sc.rk_kinds.as_mut_ptr(),
                    cap as u32,
                )
            } as usize;
            if n <= cap {
                sc.rk_nodes.truncate(n);
                sc.rk_ptrs.truncate(n);
                sc.rk_kinds.truncate(n);
                return;
            }
            sc.rk_nodes.resize(n, 0);
            sc.rk_ptrs.resize(n, std::ptr::null());
            sc.rk_kinds.resize(n, 0);
        }
    }

    /// Writes the key `p` of node `node` of the table `t` as a reference or a permanent's
    /// name; returns false, writing nothing, when it is neither. Only a light C function is
    /// pushed to be named (a function pointer: nothing is read through it); an object key is
    /// looked up by address alone, as a dead one is.
    ///
    /// # Safety
    /// Protected; `t` a live table and `node` one of its code-1 nodes whose key is `p`, of
    /// the kind `kind`.
    unsafe fn removed_key(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        t: *const c_void,
        node: u32,
        p: *const c_void,
        kind: u8,
    ) -> bool {
        if self.key_ref(p) {
            return true;
        }
        if kind != RK_CFUNC || self.sc.refs.obj_state(p) != ObjState::Permanent {
            return false;
        }
        // A library C function not written yet: by its name.
        // SAFETY: Protected; room for the key and what `permanent` pushes; the node's key is
        // a light C function (callers' contract).
        unsafe {
            ffi::lua_checkstack(L, 4);
            luasnap_push_node_key(L, t, node);
            self.permanent_or_pop(L, s)
        }
    }
}
