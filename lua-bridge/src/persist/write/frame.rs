//! The frames of the writer's walk (see [`Persister::advance`](super::Persister)): an object
//! whose contents are being written, one child at a time, and what that child is to it (its
//! path segment, for messages). Each kind's file moves its frame on; this file only names the
//! frames, so that the writer's state that holds them (`scratch.rs`) and the files that move
//! them import it, never each other.

use super::super::format::{SpecialParts, TablePart, ThreadParts, Upvalues, UserdataParts};
use mlua_sys::lua_State;
use std::ffi::{c_int, c_void};

/// An object whose contents are being written, one child value at a time: what it is and
/// which child comes next. Each kind's file moves its frame on.
pub(super) enum Frame {
    Table(TableFrame),
    LClosure(UpvalueFrame),
    CClosure(UpvalueFrame),
    Userdata(UserdataFrame),
    Special(SpecialFrame),
    Thread(ThreadFrame),
}

/// A table being written (kept alive by the graph, or anchored: see `Persister::anchor`).
///
/// Its scanned entries live in `Scratch::scan` from `floor` on; those still to write are
/// `scan[lo..hi]`, the ones from `pos` on. Invariant: they describe the table as it is while
/// `gen` equals `Persister::scan_gen`, which changes before Lua code runs (only Lua code can
/// change a table being written or free what its entries point to; the collector is stopped);
/// a stale or empty batch is scanned again from `pos`. Child frames scan above `hi` and
/// truncate back to their own floor when done.
#[derive(Clone, Copy)]
pub(super) struct TableFrame {
    pub(super) t: *const c_void,
    pub(super) step: TableStep,
    /// The position after the current entry.
    pub(super) pos: u32,
    pub(super) floor: u32,
    pub(super) lo: u32,
    pub(super) hi: u32,
    pub(super) gen: u32,
}

/// Which part of a table comes next ([`TablePart`]): its metatable (written by the frame: it
/// was neither nil nor written before when the header was); at `Key`, its entries from `pos`
/// on; at `Value`, the value of the entry at `pos - 1`, whose key, the object `key`, has been
/// written (its contents came first).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct TableStep {
    pub(super) part: TablePart,
    /// At `Value`, the entry's key (else null).
    pub(super) key: *const c_void,
}

/// A closure (Lua or C) whose upvalues are being written, in the format's order
/// ([`Upvalues`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct UpvalueFrame {
    /// The closure's object id (anchored at `seen[id]`).
    pub(super) id: u32,
    pub(super) upvalues: Upvalues,
}

/// A userdata whose metatable and user values are being written, in the format's order
/// ([`UserdataParts`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct UserdataFrame {
    /// The userdata's object id (anchored at `seen[id]`).
    pub(super) id: u32,
    pub(super) parts: UserdataParts,
}

/// The functions a `__persist` function returned for the object with id `id`, being written
/// in the format's order ([`SpecialParts`]), kept alive at `seen[-id - 1]` (a table of one or
/// two functions).
#[derive(Clone, Copy, Debug)]
pub(super) struct SpecialFrame {
    pub(super) id: u32,
    pub(super) parts: SpecialParts,
}

/// A coroutine whose stack is being written, in the format's order ([`ThreadParts`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct ThreadFrame {
    /// The coroutine (anchored at `seen[id]` by `Persister::object`).
    pub(super) co: *mut lua_State,
    pub(super) parts: ThreadParts,
    /// Its call frames to write after the stack (0: none, not suspended).
    pub(super) nci: c_int,
}

/// What a frame's current child is to its object.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Seg {
    /// A table entry's key or value (the key is read back for the path).
    Key,
    Meta,
    Upvalue(c_int),
    UserValue(c_int),
    /// The first function a `__persist` function returned (the rebuild function or the
    /// create thunk).
    Persist,
    /// The second (two-phase initializer).
    PersistInit,
    /// A coroutine's stack slot.
    Stack(c_int),
}
