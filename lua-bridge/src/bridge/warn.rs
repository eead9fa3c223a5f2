//! Lua's warn function (`warn(...)` in Lua, `lua_warning` in C): it prints to stderr like the
//! stand-alone `lua` does, obeys `@on` and `@off`, and makes a VM that lost a finalizer to a
//! memory error run out of memory instead of waiting for that finalizer for ever.

use crate::bridge::per_vm::{PerVm, Registered};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};

/// How far Lua's `error in __gc (not enough memory)` warning, which it sends in pieces, has
/// arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GcMemoryWarning {
    /// Not in that warning.
    None,
    /// `error in ` arrived (at the start of a message).
    ErrorIn,
    /// ... then `__gc`.
    Gc,
    /// ... then ` (`; `not enough memory` completes it.
    Paren,
}

/// The warn function's state for one VM.
///
/// Invariant: changed only by [`warn_to_stderr`], which Lua calls on the VM's own thread, one
/// piece at a time; `continuing` is true exactly between a piece sent with `tocont` and the
/// piece that ends its message.
pub(crate) struct WarnState {
    /// Whether warnings are shown (`@on`; the stand-alone interpreter starts with them off).
    on: Cell<bool>,
    /// Whether the last piece said the message continues.
    continuing: Cell<bool>,
    gc_memory: Cell<GcMemoryWarning>,
}

static WARN: PerVm<WarnState> = PerVm::new();

/// Registers the warn function's state of the VM whose arena starts at `base` (warnings off).
pub(crate) fn register(base: usize) -> Option<Registered<WarnState>> {
    WARN.register(
        base,
        WarnState {
            on: Cell::new(false),
            continuing: Cell::new(false),
            gc_memory: Cell::new(GcMemoryWarning::None),
        },
    )
}

/// A warn function that prints to stderr like the stand-alone `lua` (`@on` / `@off`). Its `ud`
/// is the VM's arena base, as [`register`]ed.
///
/// # Safety
/// Installed with `lua_setwarnf` on a VM whose state is registered; `msg` is a NUL-terminated
/// string (Lua's contract).
pub(crate) unsafe extern "C-unwind" fn warn_to_stderr(
    ud: *mut c_void,
    msg: *const c_char,
    tocont: c_int,
) {
    // SAFETY: ud is the arena base of a live VM that registered its state (this function's
    // contract); Lua calls it on that VM's thread.
    let state = unsafe { WARN.by_base(ud as usize) };
    // SAFETY: Lua passes a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    let continuing = state.continuing.get();
    // A control message is a whole message (not a piece of a longer one), as in lauxlib.
    if !continuing && tocont == 0 && text.starts_with('@') {
        match &*text {
            "@on" => state.on.set(true),
            "@off" => state.on.set(false),
            _ => {}
        }
        return;
    }
    // A finalizer lost to a memory error makes the next allocation fail, so code waiting for
    // that finalizer ends with "not enough memory" instead of waiting for ever.
    use GcMemoryWarning as W;
    let next = match (state.gc_memory.get(), &*text) {
        (_, "error in ") if !continuing => W::ErrorIn,
        (W::ErrorIn, "__gc") => W::Gc,
        (W::Gc, " (") => W::Paren,
        (W::Paren, "not enough memory") => {
            // SAFETY: ud is the base of this VM's live arena (from `Arena::raw`), and Lua,
            // running this function, is its only user now.
            unsafe { luasnap_alloc::RawArena::from_ptr(ud).refuse_next_growth() };
            W::None
        }
        _ => W::None,
    };
    state.gc_memory.set(next);
    if state.on.get() {
        if !continuing {
            eprint!("Lua warning: ");
        }
        eprint!("{text}");
        if tocont == 0 {
            eprintln!();
        }
    }
    state.continuing.set(tocont != 0);
}
