//! Chunks the game compiled at run time with `load` from text it generated (tiny-ecs builds
//! its filters so: `loadstring(source)` with the source as the chunk's name), compiled again
//! by a foreign load from the text the save carries, when the loading game declares `load`.
//!
//! A foreign load otherwise takes no code from the file. A game that declares `load`
//! (`G.permanents`, `GameConfig::permanents`, `--allow-permanent load`) compiles code from
//! strings at run time, so a save of it holds functions no fresh process has until the game
//! builds them again; the declaration accepts the save's text for them. That is code from the
//! file: it runs inside the game's sandbox, under the step budget, with what the game's
//! environment offers, and nothing more. What bounds it here:
//!
//! - only text chunks (never the file's bytecode: compiled in text mode) named by their own
//!   text, as `load(s)` without a chunk name names them (a file's chunk, `@main.lua`, is the
//!   game's own code: its functions bind to the game's version or are refused, as updates
//!   say; a host's chunk has a name of its own), and not a chunk of the game's current code;
//! - only compiled, never run: the chunk's main function is not called; saved closures are
//!   matched to the compiled tree by path and fingerprint, as a game chunk's are;
//! - at most [`MAX_CHUNK_TEXT`] bytes a chunk and [`MAX_LOAD_TEXT`] a load, each byte charged
//!   to the load's instruction budget, and the compiler's memory to its heap-growth cap;
//! - never "the game's own" function: the chunk's record is marked as one from a save
//!   (`ls_proto_from_save` in csrc/chunks.c), so such a function is never a foreign save's finalizer.

use super::loader::{Fail, Loader};
use super::state::LoadedChunk;
use crate::persist::error::Accept;
use crate::persist::options::Trust;
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};

/// The most source text one chunk compiled from a save may have, in bytes (a tiny-ecs filter
/// has about 100).
pub(crate) const MAX_CHUNK_TEXT: usize = 64 << 10;
/// The most source text one load compiles from its file, in bytes.
pub(crate) const MAX_LOAD_TEXT: usize = 1 << 20;

impl Loader<'_> {
    /// Whether this load compiles the text of `chunk` (see the module doc): foreign, the game
    /// declares `load`, a chunk made by `load` that is not one of the game's current chunks.
    pub(super) fn compiles_generated(&self, chunk: &LoadedChunk) -> bool {
        self.opts.trust == Trust::Foreign
            && chunk.made_by_load
            && chunk.brought_code
            && chunk.current.is_none()
            && self.opts.allows_permanent(b"load")
    }

    /// Compiles `code`, the text of the chunk `chunk` whose main function has fingerprint
    /// `main_hash`, for a foreign load of a game that declares `load` (or finds the VM's
    /// identical chunk); sets `chunk.main`.
    ///
    /// # Safety
    /// As [`Loader::proto`].
    pub(super) unsafe fn compile_generated(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        chunk: &mut LoadedChunk,
        main_hash: u64,
        code: &[u8],
    ) -> Result<(), Fail> {
        let shown = chunk.shown();
        if code.len() > MAX_CHUNK_TEXT {
            return Err(self.fail(format!(
                "chunk {shown} in the save-game has {} bytes of source text; a foreign load compiles at most {MAX_CHUNK_TEXT} bytes for one chunk the game made with load",
                code.len()
            )));
        }
        self.generated_text += code.len();
        if self.generated_text > MAX_LOAD_TEXT {
            return Err(self.fail(format!(
                "the save-game brings more than {MAX_LOAD_TEXT} bytes of source text for chunks the game made with load (at chunk {shown}); a foreign load compiles no more"
            )));
        }
        if !self.limits.charge(code.len() as u64) {
            return Err(self.fail(format!(
                "save-game load exceeded its instruction budget compiling chunk {shown} (each byte of text a foreign load compiles costs one instruction; LoadOptions::instruction_budget)"
            )));
        }
        let key = -(self.chunks.len() as ffi::lua_Integer) - 1;
        // SAFETY: callers' contract; text mode, marked as from a save.
        match unsafe { super::proto::find_or_compile(L, s, key, 0, chunk.name(), main_hash, code, true) }
        {
            Ok((p, reused)) => {
                chunk.main = Some(p);
                chunk.compiled = !reused;
                chunk.generated = !reused;
                Ok(())
            }
            Err(super::proto::Compiled::Error) => {
                // SAFETY: the compiler's message is on top, above the name and code.
                let msg = unsafe { super::proto::pop_compile_error(L) };
                Err(self.fail(format!(
                    "chunk {shown} in the save-game does not compile: {msg}"
                )))
            }
            Err(super::proto::Compiled::Differs) => Err(self.fail(format!(
                "chunk {shown} in the save-game compiles to a different prototype tree than the save-game's fingerprint says; the save was written by another Lua build or altered"
            ))),
        }
    }

    /// The refusal of a function (defined at `line`) of chunk `c`, compiled under a name of
    /// its own (by the game's `load(text, "=rules")`, or by the host), that this VM has not
    /// compiled, in a foreign load: what the game's author can do about it.
    pub(super) fn refuse_named_at_run_time(&mut self, c: usize, line: u64) -> Fail {
        let given = crate::persist::place::printable(&self.chunks[c].name);
        let shown = super::rebind::shown_chunk(&self.chunks[c].name);
        self.refuse(
            format!("the function defined at {shown}:{line} is not among the chunks this VM has loaded: its chunk, named {given:?}, was compiled by the game's load(text, {given:?}) or by the host, and this process has not compiled it; the save-game carries its text, which an own-trust load compiles, but a foreign load compiles a save's text only for a chunk named by its text, in a game that declares load. To load such saves, the game can call load(text) without a chunk name and declare load (G.permanents = {{ \"load\" }}), or compile that chunk at its script's top level and keep the function (a module local), so every process has it before a save is loaded"),
            Accept::TrustOwn,
        )
    }

    /// The refusal of a function (defined at `line`) of chunk `c`, made by `load`, that this
    /// VM has not compiled, in a foreign load of a game that does not declare `load`.
    pub(super) fn refuse_generated(&mut self, c: usize, line: u64) -> Fail {
        let name = self.chunks[c].shown();
        self.refuse(
            format!("the function defined at {name}:{line} comes from a chunk the game compiled at run time with load, which this VM has not compiled; the save-game carries its text, which a foreign load compiles (and the game may then run, in its sandbox under the step budget) only for a game that declares load"),
            Accept::Permanent("load".into()),
        )
    }
}
