//! The VM bridge: the Lua state on the arena, the C API boundary, values and handles that cross
//! it, natives, plain-data userdata, the deterministic profile's canonical bytes and the chunk
//! registry. `persist/` (save-games) and `runtime/` (rollback sessions) build on it.

pub(crate) mod allocator;
pub(crate) mod anchors;
pub(crate) mod budget;
pub(crate) mod canonical;
pub(crate) mod chunks;
pub(crate) mod convert;
pub(crate) mod error;
pub(crate) mod ffi;
pub(crate) mod handle;
pub(crate) mod helpers;
pub(crate) mod modules;
pub(crate) mod natives;
pub(crate) mod path;
pub(crate) mod per_vm;
pub(crate) mod random_state;
pub mod serde_value;
#[cfg(feature = "interpreter")]
pub(crate) mod standalone;
pub(crate) mod userdata;
pub(crate) mod value;
pub(crate) mod vm;
pub(crate) mod warn;
