//! The stack slots of the helper tables a save or a load keeps on the Lua stack.

use std::ffi::c_int;

/// Stack slots of the helper tables inside a persist or load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slots {
    pub perms: c_int,
    pub seen: c_int,
    pub objs: c_int,
    pub keys: c_int,
    /// Strings by string id (anchored while the save is written or read).
    pub strs: c_int,
    pub protos: c_int,
    pub inits: c_int,
}
