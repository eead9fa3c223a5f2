//! Where the writer is, for error messages: `root.player.inv[3]@metatable`.
//!
//! `Scratch::segs` holds one segment per frame, for the child the frame is writing (the
//! dispatcher truncates it to the frame's depth before the frame moves on); a table's key is
//! read back from the table only when an error needs it.

use super::csrc::luasnap_table_entry;
use super::frame::{Frame, Seg};
use super::persister::{Fail, Persister};
use mlua_sys::{self as ffi, lua_State};

impl Persister<'_> {
    /// Stages the error message `what`, with where the writer is if paths are on.
    pub(super) fn fail(&mut self, L: *mut lua_State, what: String) -> Fail {
        self.error = Some(if self.opts.path {
            // SAFETY: Protected (the writer's callers'); `path` raises nothing, so `what`
            // cannot be skipped by a longjmp.
            format!("{what} at {}", unsafe { self.path(L) })
        } else {
            format!(
                "{what} (for where it is in the value, turn on paths: PersistOptions::path, \
                 or eris.settings(\"path\", true))"
            )
        });
        Fail
    }

    /// The path to the value being written.
    ///
    /// # Safety
    /// Protected; the frames' tables are alive (**Alive**). Raises nothing.
    unsafe fn path(&self, L: *mut lua_State) -> String {
        let mut out = String::from("root");
        for (depth, seg) in self.sc.segs.iter().enumerate() {
            match *seg {
                Seg::Key => {
                    let Some(Frame::Table(f)) = self.sc.frames.get(depth) else {
                        continue;
                    };
                    if let Some((t, at)) = f.entry_being_written() {
                        // SAFETY: callers' contract; the frame's table is alive.
                        out.push_str(&unsafe { key_at(L, t, at) });
                    }
                }
                Seg::Meta => out.push_str("@metatable"),
                Seg::Upvalue(i) => out.push_str(&format!("@upvalue[{i}]")),
                Seg::UserValue(i) => out.push_str(&format!("@uservalue[{i}]")),
                Seg::Persist => out.push_str("@persist"),
                Seg::PersistInit => out.push_str("@persist_init"),
                Seg::Stack(i) => out.push_str(&format!("@stack[{i}]")),
            }
        }
        out
    }
}

/// The key of the entry at position `at` of the table `t` as a path segment, or nothing if
/// that entry is gone or the stack has no room for it.
///
/// # Safety
/// `t` is a live table. Raises nothing.
unsafe fn key_at(L: *mut lua_State, t: *const std::ffi::c_void, at: u32) -> String {
    // SAFETY: lua_checkstack grows the stack without raising (0 if it cannot); the entry's
    // key is pushed only with room for it, read without conversion and popped.
    unsafe {
        if ffi::lua_checkstack(L, 2) == 0 || luasnap_table_entry(L, t, at, 0) == 0 {
            return String::new();
        }
        let text = key_text(L);
        ffi::lua_pop(L, 1);
        text
    }
}

/// A short text for the key on top of the stack, as a path segment (`.name` or `[repr]`).
///
/// # Safety
/// A value is on top. Raises nothing (reads primitives without conversion).
unsafe fn key_text(L: *mut lua_State) -> String {
    // SAFETY: callers' contract; lua_tolstring on a string converts nothing.
    unsafe {
        match ffi::lua_type(L, -1) {
            ffi::LUA_TSTRING => {
                let mut len = 0;
                let p = ffi::lua_tolstring(L, -1, &mut len);
                let b = std::slice::from_raw_parts(p.cast::<u8>(), len);
                match std::str::from_utf8(b) {
                    Ok(s) if crate::bridge::path::valid_path(s) && !s.contains('.') => {
                        format!(".{s}")
                    }
                    Ok(s) => format!("[{s:?}]"),
                    Err(_) => "[<bytes>]".into(),
                }
            }
            ffi::LUA_TNUMBER if ffi::lua_isinteger(L, -1) != 0 => {
                format!("[{}]", ffi::lua_tointegerx(L, -1, std::ptr::null_mut()))
            }
            ffi::LUA_TNUMBER => format!("[{}]", ffi::lua_tonumberx(L, -1, std::ptr::null_mut())),
            ffi::LUA_TBOOLEAN => format!("[{}]", ffi::lua_toboolean(L, -1) != 0),
            ffi::LUA_TNIL => String::new(),
            _ => format!("[<{}>]", crate::bridge::ffi::type_name(L, -1)),
        }
    }
}
