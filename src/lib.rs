//! # luasnap
//!
//! Instant snapshot and rollback for a Lua 5.5 VM, for game clients that run ahead of the
//! server and roll back when it disagrees, plus an object-graph serializer for save-games.
//!
//! This crate re-exports the workspace's layers, lowest first:
//! - [`alloc`]: the arena that holds a VM's whole heap, its allocator, and written-page
//!   tracking (no Lua);
//! - [`snap`]: full and incremental snapshots of an arena with a retention window (no Lua);
//! - [`bridge`]: the Lua VM on an arena.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use luasnap_alloc as alloc;
pub use luasnap_bridge as bridge;
pub use luasnap_snap as snap;

pub use luasnap_alloc::{Arena, ArenaError, ArenaStats, TrackerKind, TrackerPreference};
