//! What the standalone `lua` interpreter does around a VM, for `luasnap run`: the steps of its
//! command line (`-e`, `-l`, `-W`, the script, `LUA_INIT`), each run under a message handler
//! that appends a traceback (and honours `__tostring` on error objects), and the read-eval-print
//! loop's evaluation of one input.

use crate::bridge::error::VmError;
use crate::bridge::helpers::{
    luasnap_default_sigpipe, luasnap_interruptible, luasnap_loadfilex, luasnap_loadstring,
    luasnap_readline, luasnap_readline_done, luasnap_readline_init,
};
use crate::bridge::vm::Vm;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::{c_int, CString};

/// One step of the standalone interpreter's command line.
#[derive(Debug, Clone, Copy)]
pub enum Step<'a> {
    /// Run `code` as a chunk named `name` (`-e`: `"=(command line)"`; `LUA_INIT`: `"=LUA_INIT"`).
    Code {
        /// Source text.
        code: &'a [u8],
        /// Chunk name, with its `=` or `@` prefix.
        name: &'a str,
    },
    /// Run a file (`None`: standard input), as `dofile`.
    File(Option<&'a str>),
    /// `global = require(module)` (`-l`).
    Library {
        /// The global that receives the module.
        global: &'a str,
        /// The module name given to `require`.
        module: &'a str,
    },
    /// The main script (`None`: standard input) with the positive entries of `arg` as its
    /// arguments.
    Script(Option<&'a str>),
    /// Warnings on (`-W`) or off (the interpreter's default).
    Warnings(bool),
    /// `-E`: tell the libraries to ignore environment variables (`registry.LUA_NOENV`).
    IgnoreEnv,
}

/// What one read-eval-print input did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplOutcome {
    /// The input is an incomplete statement: read another line and try again with both (at
    /// the end of input, the message is the error to report).
    Incomplete(String),
    /// It ran (its results, if any, were printed).
    Done,
    /// It failed to compile or to run: the message (with a traceback for run-time errors).
    Failed(String),
}

/// lua.c's message handler: a string message gets a traceback; a non-string error object
/// is shown through its `__tostring`, or by its type.
unsafe extern "C-unwind" fn msghandler(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua as a message handler with the error object at 1.
    unsafe {
        let mut msg = ffi::lua_tolstring(L, 1, std::ptr::null_mut());
        if msg.is_null() {
            if ffi::luaL_callmeta(L, 1, c"__tostring".as_ptr()) != 0
                && ffi::lua_type(L, -1) == ffi::LUA_TSTRING
            {
                return 1;
            }
            let tn = ffi::lua_typename(L, ffi::lua_type(L, 1));
            ffi::lua_pushstring(L, c"(error object is a ".as_ptr());
            ffi::lua_pushstring(L, tn);
            ffi::lua_pushstring(L, c" value)".as_ptr());
            ffi::lua_concat(L, 3);
            msg = ffi::lua_tolstring(L, -1, std::ptr::null_mut());
        }
        ffi::luaL_traceback(L, L, msg, 1);
        1
    }
}

/// Calls the function under `narg` arguments on top with the message handler; on failure
/// returns the message (a string, or the error object's type).
///
/// # Safety
/// Protected context (memory errors of the setup may raise); a function and `narg` arguments
/// on top.
unsafe fn docall(L: *mut lua_State, narg: c_int, nres: c_int) -> Result<(), String> {
    // SAFETY: as the caller guarantees.
    unsafe {
        let base = ffi::lua_gettop(L) - narg;
        ffi::lua_pushcclosure(L, msghandler, 0);
        ffi::lua_rotate(L, base, 1);
        // Ctrl-C stops the code with "interrupted!", as in lua.
        luasnap_interruptible(L, 1);
        let st = ffi::lua_pcall(L, narg, nres, base);
        luasnap_interruptible(L, 0);
        ffi::lua_rotate(L, base, -1);
        ffi::lua_settop(L, -2);
        if st == ffi::LUA_OK {
            Ok(())
        } else {
            Err(pop_message(L))
        }
    }
}

/// Pops the error value on top as a message.
///
/// # Safety
/// A value on top.
unsafe fn pop_message(L: *mut lua_State) -> String {
    // SAFETY: reads and pops the top value; lua_tolstring only converts numbers in place.
    unsafe {
        let mut len = 0usize;
        let p = ffi::lua_tolstring(L, -1, &mut len);
        let m = if p.is_null() {
            format!(
                "(error object is a {} value)",
                std::ffi::CStr::from_ptr(ffi::lua_typename(L, ffi::lua_type(L, -1)))
                    .to_string_lossy()
            )
        } else {
            String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned()
        };
        ffi::lua_settop(L, -2);
        m
    }
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("'{}' contains a NUL byte", s.escape_debug()))
}

impl Vm {
    /// Runs one step of the standalone interpreter's command line. `Ok(Err(message))` is a
    /// Lua error the interpreter reports (the message has its traceback); `Err` is a failure of
    /// the VM itself.
    pub fn standalone(&self, step: Step<'_>) -> Result<Result<(), String>, VmError> {
        let mut out: Result<(), String> = Ok(());
        self.run(
            &mut |L| {
                // SAFETY: protected body; every failure the step reports is caught by docall
                // or returned by a load; only memory errors of the setup raise.
                out = unsafe { step_in(L, step) };
                0
            },
            |_, _| (),
        )?;
        Ok(out.map_err(|m| self.explain(m)))
    }

    /// A deterministic VM's message about a global it leaves out (`os`, `io`, ...) says so.
    fn explain(&self, message: String) -> String {
        match self.profile() {
            crate::bridge::vm::Profile::Deterministic { .. } => {
                crate::bridge::error::explain_left_out(message)
            }
            _ => message,
        }
    }

    /// Evaluates one read-eval-print input as `lua`'s REPL does: a first line first as
    /// `return <input>;`, then as a statement (continued lines only as a statement); prints
    /// the results with the global `print`.
    pub fn repl_eval(&self, input: &str, first_line: bool) -> Result<ReplOutcome, VmError> {
        let mut out = ReplOutcome::Done;
        self.run(
            &mut |L| {
                // SAFETY: protected body, as in `standalone`.
                out = unsafe { repl_in(L, input, first_line) };
                0
            },
            |_, _| (),
        )?;
        Ok(match out {
            ReplOutcome::Failed(m) => ReplOutcome::Failed(self.explain(m)),
            o => o,
        })
    }
}

/// # Safety
/// Protected context.
unsafe fn load_text(
    L: *mut lua_State,
    code: &[u8],
    name: &std::ffi::CStr,
    mode: Option<&std::ffi::CStr>,
) -> c_int {
    // SAFETY: protected context; leaves the chunk or the message on top.
    unsafe {
        ffi::lua_pushlstring(L, code.as_ptr().cast(), code.len());
        let mode = mode.map_or(std::ptr::null(), |m| m.as_ptr());
        let st = luasnap_loadstring(L, -1, name.as_ptr(), mode);
        ffi::lua_rotate(L, -2, 1);
        ffi::lua_settop(L, -2);
        st
    }
}

/// # Safety
/// Protected context.
unsafe fn step_in(L: *mut lua_State, step: Step<'_>) -> Result<(), String> {
    // SAFETY: protected context; each branch leaves the stack as it found it.
    unsafe {
        match step {
            Step::Code { code, name } => {
                let name = cstring(name)?;
                if load_text(L, code, &name, None) != ffi::LUA_OK {
                    return Err(pop_message(L));
                }
                docall(L, 0, 0)
            }
            Step::File(path) => {
                let path = path.map(cstring).transpose()?;
                let p = path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
                if luasnap_loadfilex(L, p, std::ptr::null()) != ffi::LUA_OK {
                    return Err(pop_message(L));
                }
                docall(L, 0, 0)
            }
            Step::Library { global, module } => {
                let global = cstring(global)?;
                let module = cstring(module)?;
                ffi::lua_getglobal(L, c"require".as_ptr());
                ffi::lua_pushstring(L, module.as_ptr());
                docall(L, 1, 1)?;
                ffi::lua_setglobal(L, global.as_ptr());
                Ok(())
            }
            Step::Script(path) => {
                let path = path.map(cstring).transpose()?;
                let p = path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
                if luasnap_loadfilex(L, p, c"bt".as_ptr()) != ffi::LUA_OK {
                    return Err(pop_message(L));
                }
                if ffi::lua_getglobal(L, c"arg".as_ptr()) != ffi::LUA_TTABLE {
                    ffi::lua_settop(L, -3);
                    return Err("'arg' is not a table".into());
                }
                let n = ffi::lua_rawlen(L, -1) as c_int;
                if ffi::lua_checkstack(L, n + 3) == 0 {
                    ffi::lua_settop(L, -3);
                    return Err("too many arguments to script".into());
                }
                for i in 1..=n {
                    ffi::lua_rawgeti(L, -i, i as ffi::lua_Integer);
                }
                ffi::lua_rotate(L, -(n + 1), -1);
                ffi::lua_settop(L, -2);
                docall(L, n, ffi::LUA_MULTRET)
            }
            Step::Warnings(on) => {
                ffi::lua_warning(L, if on { c"@on" } else { c"@off" }.as_ptr(), 0);
                Ok(())
            }
            Step::IgnoreEnv => {
                ffi::lua_pushboolean(L, 1);
                ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, c"LUA_NOENV".as_ptr());
                Ok(())
            }
        }
    }
}

/// # Safety
/// Protected context.
unsafe fn repl_in(L: *mut lua_State, input: &str, first_line: bool) -> ReplOutcome {
    // SAFETY: protected context; leaves the stack as it found it.
    unsafe {
        let base = ffi::lua_gettop(L);
        let mut st = ffi::LUA_ERRSYNTAX;
        if first_line {
            let ret = format!("return {input};");
            st = load_text(L, ret.as_bytes(), c"=stdin", Some(c"t"));
        }
        if st != ffi::LUA_OK {
            ffi::lua_settop(L, base);
            st = load_text(L, input.as_bytes(), c"=stdin", Some(c"t"));
            if st == ffi::LUA_ERRSYNTAX {
                let msg = pop_message(L);
                if msg.ends_with("<eof>") {
                    return ReplOutcome::Incomplete(msg);
                }
                return ReplOutcome::Failed(msg);
            }
            if st != ffi::LUA_OK {
                return ReplOutcome::Failed(pop_message(L));
            }
        }
        if let Err(m) = docall(L, 0, ffi::LUA_MULTRET) {
            ffi::lua_settop(L, base);
            return ReplOutcome::Failed(m);
        }
        let n = ffi::lua_gettop(L) - base;
        if n > 0 {
            if ffi::lua_checkstack(L, 1) == 0 {
                ffi::lua_settop(L, base);
                return ReplOutcome::Failed("too many results to print".into());
            }
            ffi::lua_getglobal(L, c"print".as_ptr());
            ffi::lua_rotate(L, base + 1, 1);
            if ffi::lua_pcall(L, n, 0, 0) != ffi::LUA_OK {
                let m = pop_message(L);
                ffi::lua_settop(L, base);
                return ReplOutcome::Failed(format!("error calling 'print' ({m})"));
            }
        }
        ffi::lua_settop(L, base);
        ReplOutcome::Done
    }
}

/// Gives SIGPIPE its default action, so a command-line program ends quietly when the reader
/// of its output goes away (`luasnap diff a b | head`), as C programs and stock `lua` do.
/// Rust's runtime ignores the signal, which turns such a write into an error (a panic in
/// `println!`). Call it first thing in `main`.
pub fn default_sigpipe() {
    // SAFETY: sets a process-wide signal disposition to SIG_DFL; no handler runs Rust code.
    unsafe { luasnap_default_sigpipe() }
}

impl Vm {
    /// Loads the readline library `lib` for the interactive loop, as stock `lua` does; when it
    /// cannot, emits lua's warning ("unable to load readline library ...", shown under `-W`)
    /// and returns `false` (lines are then read plainly).
    pub fn readline_init(&self, lib: &str) -> Result<bool, VmError> {
        let lib = CString::new(lib).map_err(|_| VmError::BadName { name: lib.into() })?;
        let mut ok = false;
        self.run(
            &mut |L| {
                // SAFETY: protected body; the helper only calls dlopen/dlsym and lua_warning.
                ok = unsafe { luasnap_readline_init(L, lib.as_ptr()) } != 0;
                0
            },
            |_, _| (),
        )?;
        Ok(ok)
    }
}

/// Reads one line with the readline library loaded by [`Vm::readline_init`]: `None` if none
/// is loaded, `Some(None)` at the end of input, `Some(Some(line))` otherwise (added to the
/// history when not empty).
pub fn readline(prompt: &str) -> Option<Option<String>> {
    let prompt = CString::new(prompt.replace('\0', "")).unwrap_or_default();
    let mut line: *mut std::ffi::c_char = std::ptr::null_mut();
    // SAFETY: the helper fills `line` with a malloc'd C string or null.
    if unsafe { luasnap_readline(prompt.as_ptr(), &mut line) } == 0 {
        return None;
    }
    if line.is_null() {
        return Some(None);
    }
    // SAFETY: `line` is a NUL-terminated string from readline, freed right after the copy.
    let text = unsafe { std::ffi::CStr::from_ptr(line) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `line` came from readline and is not used after.
    unsafe { luasnap_readline_done(line) };
    Some(Some(text))
}

impl Vm {
    /// The interactive prompt: `tostring(_PROMPT)` (`_PROMPT2` for a continued line), or the
    /// default (`"> "`, `">> "`) when the global is nil. A failing `__tostring` gives the
    /// default.
    pub fn prompt(&self, continued: bool) -> Result<String, VmError> {
        let (name, default) = if continued {
            (c"_PROMPT2", ">> ")
        } else {
            (c"_PROMPT", "> ")
        };
        let mut out = default.to_string();
        let got = self.run(
            &mut |L| {
                // SAFETY: protected body; luaL_tolstring may call __tostring, which may raise
                // (then the default stays).
                unsafe {
                    if ffi::lua_getglobal(L, name.as_ptr()) != ffi::LUA_TNIL {
                        let mut len = 0usize;
                        let p = ffi::luaL_tolstring(L, -1, &mut len);
                        out = String::from_utf8_lossy(std::slice::from_raw_parts(p.cast(), len))
                            .into_owned();
                    }
                }
                0
            },
            |_, _| (),
        );
        match got {
            Ok(()) | Err(VmError::Lua { .. }) => Ok(out),
            Err(e) => Err(e),
        }
    }
}
