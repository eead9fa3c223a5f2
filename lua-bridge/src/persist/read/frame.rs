//! The frames of the loader's walk (see `dispatch.rs`): an object still receiving its
//! children, in the order its kind's parts come (`format/parts.rs`). The kind files move
//! their frames on; this file only names them, so that the [`Loader`](super::loader::Loader)
//! that holds them and the files that move them import it, never each other.

use crate::persist::format::{SpecialParts, TablePart, ThreadParts, Upvalues, UserdataParts};
use std::ffi::c_int;

/// An object still receiving its children, and what the next child is for: the format's
/// order of each kind's parts (`format/parts.rs`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Frame {
    /// A table: its metatable, then keys and values in turn (`stage`: the next). `at` is the
    /// stack index of the table, with its current key at `at + 1`; 0 for a frame deeper than
    /// `STACK_FRAMES`, whose table is kept only in `objs` and its key in `keys[depth]`.
    Table {
        id: u32,
        stage: TablePart,
        at: c_int,
    },
    /// A closure: its upvalues in turn. `open` is the level of the open upvalue whose
    /// coroutine is the child being read (see `Tag::UpvalOpen`).
    Closure {
        id: u32,
        upvalues: Upvalues,
        open: Option<c_int>,
        kind: ClosureKind,
    },
    /// A userdata rebuilt from bytes: its metatable, then its user values.
    Userdata { id: u32, parts: UserdataParts },
    /// An object a `__persist` function rebuilds: its function(s), and the identity the file
    /// gave it (0: none), which the rebuilt object takes (see `ident.rs`).
    Special {
        id: u32,
        parts: SpecialParts,
        ident: u32,
    },
    /// A coroutine: its stack slots, then its end. `errfunc` is Some for a suspended
    /// coroutine, whose frame records follow its stack.
    Thread {
        id: u32,
        parts: ThreadParts,
        errfunc: Option<i64>,
    },
}

/// What a closure's upvalues are checked as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClosureKind {
    /// A Lua closure: each upvalue comes with an upvalue tag.
    Lua,
    /// A C closure (no upvalue tags: plain values).
    C,
    /// `coroutine.wrap`'s helper: a C closure whose one upvalue must be a coroutine.
    Wrap,
}
