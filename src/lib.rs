//! # luasnap
//!
//! Instant snapshot and rollback for a Lua 5.5 VM, for game clients that run ahead of the
//! server and roll back when it disagrees, plus an object-graph serializer for save-games.
//!
//! This crate re-exports the workspace's layers, lowest first:
//! - [`alloc`]: the arena that holds a VM's whole heap, its allocator, and written-page
//!   tracking (no Lua);
//! - [`snap`]: full and incremental snapshots of an arena with a retention window (no Lua);
//! - [`bridge`]: the Lua VM on an arena;
//! - [`ggrs`] (feature `ggrs`, on by default): the GGRS crate at exactly the version
//!   [`bridge::ggrs_adapter`] is built with, so a game's session types always match.
//!
//! The types a game uses most are also at the root:
//! - the VM: [`Vm`], [`VmBuilder`], [`Value`], the conversion traits, the handles, snapshots
//!   ([`SnapshotId`], [`Snapshot`]);
//! - a game: [`Game`], [`GameConfig`], [`Backend`], the input types ([`GameInput`],
//!   [`PodInput`]), the host's [`VmSetup`], the client models [`FrameSession`] (which frames it saves: [`Saving`]) and
//!   [`PredictiveClient`];
//! - GGRS (feature `ggrs`): [`GgrsGame`], [`LuaGgrs`], [`Checksum`], [`PeerSocket`],
//!   [`SessionOptions`];
//! - save-games: [`LoadOptions`], [`Trust`], [`LoadReport`], [`PersistOptions`];
//! - one [`Error`] that every error of the crate converts into with `?` ([`VmError`],
//!   [`GameError`], [`SaveError`], [`LoadError`]).
//!
//! ```
//! use luasnap::{Error, Vm};
//!
//! fn main() -> Result<(), Error> {
//!     let mut vm = Vm::builder().capacity(64 << 20).deterministic(1).build()?;
//!     vm.exec("world = { players = { { hp = 10 } } }", "setup")?;
//!     let before = vm.snapshot()?;
//!     vm.set("world.players[1].hp", 3)?;
//!     vm.rollback(before)?;
//!     assert_eq!(vm.get::<u32>("world.players[1].hp")?, 10);
//!     let _save: Vec<u8> = vm.save_game()?; // SaveError converts too
//!     Ok(())
//! }
//! ```
//!
//! `docs/rust-api.md` is a cheat-sheet from mlua to luasnap.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use luasnap_alloc as alloc;
pub use luasnap_bridge as bridge;
pub use luasnap_snap as snap;

/// The `ggrs` crate, at exactly the version the GGRS adapter is built with.
#[cfg(feature = "ggrs")]
pub use luasnap_bridge::ggrs;

pub use luasnap_alloc::{Arena, ArenaError, ArenaStats, TrackerKind, TrackerPreference};
pub use luasnap_bridge::{
    from_value, to_value, Accept, Backend, Call, Error, FrameSession, FromLua, FromLuaMulti,
    Function, FunctionBinding, Game, GameConfig, GameError, GameInput, IntoLua, IntoLuaMulti,
    LoadError, LoadOptions, LoadReport, LuaRef, LuaTable, NativeError, PersistOptions, PlainData,
    PodInput, PredictiveClient, Profile, SaveError, SaveHandle, Saving, Serde, Snapshot,
    SnapshotId, Table, Thread, ThreadStatus, Trust, UserData, Value, Values, Vm, VmBuilder,
    VmError, VmSetup,
};
#[cfg(feature = "ggrs")]
pub use luasnap_bridge::{Checksum, GgrsGame, LuaGgrs, PeerSocket, SessionOptions};

/// The README's Rust examples, compiled and run as doctests so that they keep working.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// `Result` with luasnap's umbrella [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
