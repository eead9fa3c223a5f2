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
//!   Lua holds them as C closures whose only upvalue is an integer index. They cannot call back
//!   into Lua or reach the VM.
//! - **Userdata** are [`PlainData`] (`bytemuck::Pod`) values stored inline in the Lua heap: no
//!   Rust memory is reachable from Lua, and they roll back with everything else.
//! - **No Rust handle outlives a rollback**: values cross the boundary by copy ([`Value`]), and
//!   [`Function`] handles borrow the VM while [`Vm::rollback`] needs `&mut`.
//! - **Snapshots only while Lua is idle**, enforced by the borrow checker and checked at run
//!   time.
//!
//! ```
//! use luasnap_bridge::{Value, Vm};
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
//! vm.call("step", &[Value::Integer(41)])?;
//! assert_eq!(vm.get("score")?, Value::Integer(42));
//! vm.rollback(before)?;
//! assert_eq!(vm.get("score")?, Value::Integer(0));
//! # Ok::<(), luasnap_bridge::VmError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![allow(non_snake_case)] // `L` for a lua_State, as in Lua's own sources

mod chunks;
pub mod digest;
mod error;
mod ffi;
#[cfg(feature = "ggrs")]
pub mod ggrs_adapter;
pub mod persist;
pub mod runtime;
pub mod simulate;
mod standalone;
mod userdata;
mod value;
mod vm;
pub mod workloads;

pub use error::{LuaErrorKind, NativeError, VmError};
pub use ffi::Call;
pub use luasnap_snap::{CopyStrategy, SnapshotId, SnapshotMode};
pub use standalone::{ReplOutcome, Step};
pub use userdata::{Method, PlainData, UserDataMethods};
pub use value::{Table, UserDataValue, Value};
pub use vm::{Function, GcMode, Profile, Vm, VmBuilder, DEFAULT_CAPACITY, NATIVES_KEY};
