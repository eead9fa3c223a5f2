//! # luasnap-bridge: a rollback-safe Lua 5.5 VM on an arena
//!
//! A [`Vm`] is a Lua 5.5 state whose every allocation, `global_State` included, comes from one
//! [`luasnap_alloc::Arena`]. Snapshot and rollback copy the arena's bytes, so they restore the
//! whole VM: globals, closures, coroutines mid-yield, the garbage collector mid-cycle.
//!
//! That is only safe if nothing outside the arena refers into it in a way that changes, which
//! mlua's high-level API breaks in several places (see `docs/bridge.md`). This crate uses
//! mlua's raw FFI only and keeps these rules by construction:
//!
//! - **Natives** are Rust functions registered before the first snapshot in a permanent table;
//!   Lua holds them as C closures whose only upvalue is an integer index. They cannot reach the
//!   VM (so never snapshot it); they can call Lua functions passed to them
//!   ([`Call::call_function`]).
//! - **Userdata** are [`PlainData`] (`bytemuck::Pod`) values stored inline in the Lua heap: no
//!   Rust memory is reachable from Lua, and they roll back with everything else.
//! - **No Rust handle outlives a rollback**: values cross the boundary by copy ([`Value`], or
//!   any [`FromLua`]/[`IntoLua`] type), and handles ([`LuaTable`], [`Function`], [`Thread`],
//!   [`LuaRef`]) borrow the VM while [`Vm::rollback`] needs `&mut`.
//! - **Snapshots only while Lua is idle**, enforced by the borrow checker and checked at run
//!   time.
//!
//! ```
//! use luasnap_bridge::Vm;
//!
//! let mut vm = Vm::builder()
//!     .capacity(256 << 20)
//!     .deterministic(42)
//!     .native("host.add", |call| {
//!         let sum = call.integer(0)? + call.integer(1)?;
//!         call.ret(sum);
//!         Ok(())
//!     })
//!     .build()?;
//! vm.exec("score = 0; function step(n) score = score + host.add(n, 1) end", "game")?;
//! let before = vm.snapshot()?;
//! vm.call::<()>("step", 41)?;
//! assert_eq!(vm.get::<i64>("score")?, 42);
//! vm.rollback(before)?;
//! assert_eq!(vm.get::<i64>("score")?, 0);
//! # Ok::<(), luasnap_bridge::VmError>(())
//! ```
//!
//! `docs/rust-api.md` maps mlua's API to this crate's and says what is deliberately absent.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![allow(non_snake_case)] // `L` for a lua_State, as in Lua's own sources

mod bridge;
mod error;
pub mod persist;
pub mod runtime;
pub mod workloads;

// The runtime's modules keep their paths at the crate root.
#[cfg(feature = "ggrs")]
pub use runtime::ggrs_adapter;
pub use runtime::{digest, simulate, value_diff};

pub use bridge::serde_value;

pub use bridge::convert::{
    type_error, Arg, FromLua, FromLuaMulti, IntoLua, IntoLuaMulti, UserData, Values,
};
pub use bridge::error::{LuaErrorKind, NativeError, VmError};
pub use bridge::handle::{Function, LuaRef, LuaTable, Thread, ThreadStatus};
pub use bridge::modules::{FolderFiles, FolderReader, Module};
pub use bridge::natives::Call;
pub use bridge::serde_value::{from_value, to_value, Serde};
#[cfg(feature = "interpreter")]
pub use bridge::standalone::{default_sigpipe, readline, ReplOutcome, Step};
pub use bridge::userdata::{Method, UserDataMethods};
pub use bridge::value::{PlainData, Table, UserDataValue, Value};
pub use bridge::vm::{GcMode, Profile, Vm, VmBuilder, CLOSE_BUDGET, DEFAULT_CAPACITY};
pub use error::Error;
/// The `ggrs` crate, at exactly the version the adapter is built with.
#[cfg(feature = "ggrs")]
pub use ggrs;
pub use luasnap_snap::{CopyStrategy, Snapshot, SnapshotId, SnapshotMode};
pub use persist::{
    Accept, FunctionBinding, LoadError, LoadOptions, LoadReport, PersistOptions, SaveError, Trust,
};
#[cfg(feature = "ggrs")]
pub use runtime::ggrs_adapter::{Checksum, GgrsGame, LuaGgrs, PeerSocket, SessionOptions};
pub use runtime::{
    Backend, FrameSession, Game, GameCall, GameConfig, GameError, GameInput, PodInput,
    PredictiveClient, SaveHandle, Saving, VmSetup,
};
