//! After the root (format 10 on): the parts, in the order of their tags ([`After`]), and the
//! keys of removed entries that tables' layouts placed without them ([`RemovedKeys`], see
//! `write/removed.rs`).

use super::csrc::{luasnap_table_removed_key, reserve};
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
            // SAFETY: [table, key] on top; the C side checks the node and the key, and
            // neither allocates nor raises; both popped.
            let rc = unsafe {
                let rc = luasnap_table_removed_key(L, -2, e.node, -1, e.dead as i32);
                ffi::lua_settop(L, -3);
                rc
            };
            if rc < 0 {
                return Err(self.malformed("a removed key of a kind no removed entry has"));
            }
        }
        Ok(())
    }
}
