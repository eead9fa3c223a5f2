//! Prototypes and the chunks they come from (format 4 on; see `format`'s module doc).
//!
//! A Lua closure names its prototype by index; the first occurrence gives its fingerprint
//! and where it lives: a chunk (by a path of child indices from the chunk's main prototype)
//! or nowhere (detached). A prototype is found, never trusted: in a chunk the VM already has
//! (the identical text), compiled from the text the file brings (own loads, and foreign loads
//! of a game that declares `load` for chunks it made with `load`: `generated.rs`), by its
//! fingerprint among the VM's live prototypes, or, for own loads that allow it, from the
//! file's bytecode; each is checked against the fingerprint the file gives.
//!
//! Invariant: every prototype in `protos` is anchored (its closure in the `protos` table) for
//! the whole load, so the raw pointers stay valid while Lua code run by the load collects.

use super::csrc::reserve;
use super::csrc::{
    luasnap_chunk_current, luasnap_chunk_find, luasnap_chunks_each_proto, luasnap_each_proto,
    luasnap_loadstring, luasnap_loadstring_from_save, luasnap_proto, luasnap_proto_child,
    luasnap_proto_hash, luasnap_proto_tree, luasnap_push_closure, ProtoFn,
};
use super::loader::{Fail, Loader};
use super::state::{LoadedChunk, SavedChunk};
use crate::persist::format::{
    ChunkDef, Detached, LegacyProto, ProtoHome, ProtoNames, ProtoPath, ProtoRecord, MAX_PATH,
    MAX_UPVALUE_NAMES,
};
use crate::persist::options::{FunctionBinding, Trust};
use crate::persist::slots::Slots;
use mlua_sys::{self as ffi, lua_State};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

impl LoadedChunk {
    /// Its name as the file gives it (`@town/agent.lua`).
    pub(super) fn name(&self) -> &[u8] {
        &self.name
    }

    /// The chunk's name in messages: as given (`@main.lua`), or Lua's `[string "..."]` for
    /// a chunk named by its source.
    pub(super) fn shown(&self) -> String {
        match self.name.first() {
            Some(b'@' | b'=') => crate::persist::place::printable(&self.name),
            _ => super::rebind::string_chunk(&self.name),
        }
    }
}

/// Calls `f(q, ud)` for `p` and every prototype nested in it.
///
/// # Safety
/// `p` is a live prototype.
pub(crate) unsafe fn proto_tree(p: *const c_void, f: ProtoFn, ud: *mut c_void) {
    // SAFETY: callers' contract.
    unsafe { luasnap_proto_tree(p, f, ud) };
}

/// Adds a prototype to the fingerprint index `ud` (the first one wins).
///
/// # Safety
/// `p` a live prototype; `ud` a `HashMap<u64, *const c_void>` borrowed for the walk.
unsafe extern "C" fn collect_proto(p: *const c_void, ud: *mut c_void) {
    // SAFETY: ud is the index being built; p is a live prototype (collector stopped).
    unsafe {
        let index = &mut *(ud as *mut HashMap<u64, *const c_void>);
        index.entry(luasnap_proto_hash(p)).or_insert(p);
    }
}

/// A bytecode chunk for `lua_load`, handed over in one piece.
struct ChunkReader<'b> {
    data: &'b [u8],
    done: bool,
}

/// `lua_Reader` over a [`ChunkReader`]: its bytes once, then the end.
///
/// # Safety
/// `ud` a `ChunkReader` alive for the `lua_load` call; `size` writable.
unsafe extern "C-unwind" fn chunk_reader(
    _L: *mut lua_State,
    ud: *mut c_void,
    size: *mut usize,
) -> *const std::ffi::c_char {
    // SAFETY: ud is a ChunkReader alive for the lua_load call; size is Lua's out-parameter.
    unsafe {
        let r = &mut *(ud as *mut ChunkReader<'_>);
        if r.done {
            *size = 0;
            return std::ptr::null();
        }
        r.done = true;
        *size = r.data.len();
        r.data.as_ptr().cast()
    }
}

impl Loader<'_> {
    /// The prototype a closure names (its index next; its record follows at its first
    /// occurrence), found or compiled and checked against its fingerprint; with its index.
    ///
    /// # Safety
    /// Protected context; `s` this load's slots.
    pub(super) unsafe fn proto(
        &mut self,
        L: *mut lua_State,
        s: Slots,
    ) -> Result<(usize, *const c_void), Fail> {
        let index = ProtoRecord::index(&mut self.r);
        let index = self.record(index)?;
        if (index as usize) < self.protos.len() {
            return Ok((index as usize, self.protos[index as usize]));
        }
        let index = index as usize;
        // SAFETY: callers' contract.
        unsafe { self.new_proto(L, s, index) }.map(|p| (index, p))
    }

    /// A prototype's first occurrence (its index just read: `index`).
    ///
    /// # Safety
    /// As [`Loader::proto`].
    unsafe fn new_proto(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        index: usize,
    ) -> Result<*const c_void, Fail> {
        if index != self.protos.len() {
            return Err(self.malformed("prototypes out of order"));
        }
        if self.format < 4 {
            let legacy = LegacyProto::decode(&mut self.r);
            let LegacyProto {
                hash,
                src,
                line,
                code,
            } = self.record(legacy)?;
            // SAFETY: callers' contract.
            return unsafe { self.detached(L, s, hash, src, line, code) };
        }
        let proto = ProtoRecord::decode(&mut self.r);
        let ProtoRecord { hash, line, home } = self.record(proto)?;
        match home {
            ProtoHome::Detached => {
                let detached = Detached::decode(&mut self.r);
                let Detached { src, code } = self.record(detached)?;
                // SAFETY: callers' contract.
                unsafe { self.detached(L, s, hash, src, line, code) }
            }
            // SAFETY: callers' contract.
            ProtoHome::Chunk(c) => unsafe { self.in_chunk(L, s, hash, line, c as usize) },
        }
    }

    /// A prototype of chunk `c` (its definition next if it is the next chunk, then the path,
    /// and from format 6 its place and upvalue names), with fingerprint `hash` and defined
    /// at `line`.
    ///
    /// # Safety
    /// As [`Loader::proto`].
    unsafe fn in_chunk(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        hash: u64,
        line: u64,
        c: usize,
    ) -> Result<*const c_void, Fail> {
        if c > self.chunks.len() {
            return Err(self.malformed("chunks out of order"));
        }
        if c == self.chunks.len() {
            // SAFETY: callers' contract.
            let chunk = unsafe { self.chunk(L, s)? };
            self.chunks.push(chunk);
        }
        let path = self.path()?;
        let (place, ups) = if self.format >= 6 {
            let place = self.names(MAX_PATH)?;
            if place.len() != path.len() {
                return Err(self.malformed("a prototype's place does not match its path"));
            }
            (place, self.names(MAX_UPVALUE_NAMES)?)
        } else {
            (Vec::new(), Vec::new())
        };
        // The saved code: the VM's identical chunk, or the file's compiled (own loads).
        let saved = match self.chunks[c].main {
            Some(main) => Some(self.by_path(main, &path, c, line, hash)?),
            None => None,
        };
        if let Some(current) = self.chunks[c].current {
            let name = self.chunks[c].name.clone();
            let f = super::rebind::SavedProto {
                hash,
                line,
                chunk: &name,
                place: &place,
                ups: ups.clone(),
                file_chunk: c,
                path: &path,
            };
            // SAFETY: callers' contract.
            if let Some(p) = unsafe { self.bind_declared(L, s, current, &f, saved)? } {
                self.protos.push(p);
                return Ok(p);
            }
            if let Some(p) = self.bind_place(current, f, saved)? {
                self.protos.push(p);
                return Ok(p);
            }
            // This version has no function there: kept with its saved code, if the load has it.
            if let Some(p) = saved {
                self.rb
                    .report
                    .missing
                    .push(crate::persist::report::SavedFunction {
                        chunk: super::rebind::shown_chunk(&self.chunks[c].name),
                        place: crate::persist::place::display(&place),
                        line,
                        now: None,
                    });
                self.protos.push(p);
                return Ok(p);
            }
        } else if let Some(p) = saved {
            if self.chunks[c].compiled {
                let f = crate::persist::report::SavedFunction {
                    chunk: super::rebind::shown_chunk(&self.chunks[c].name),
                    place: crate::persist::place::display(&place),
                    line,
                    now: None,
                };
                if self.chunks[c].generated {
                    self.rb.report.compiled.push(f);
                } else {
                    self.rb.report.kept.push(f);
                }
            } else {
                self.rb.report.unchanged += 1;
            }
            self.protos.push(p);
            return Ok(p);
        }
        // No code to use: the function's fingerprint names it.
        // SAFETY: callers' contract.
        if let Some(p) = unsafe { self.by_fingerprint(L, s, hash)? } {
            self.rb.report.unchanged += 1;
            return Ok(p);
        }
        let (name, brought) = (self.chunks[c].shown(), self.chunks[c].brought_code);
        if let Some(current) = self.chunks[c].current {
            if self.opts.trust == Trust::Foreign {
                let chunk = self.chunks[c].name.clone();
                let f = super::rebind::SavedProto {
                    hash,
                    line,
                    chunk: &chunk,
                    place: &place,
                    ups,
                    file_chunk: c,
                    path: &path,
                };
                // SAFETY: callers' contract.
                let p = unsafe { self.missing_later(L, s, current, &f)? };
                self.protos.push(p);
                return Ok(p);
            }
            let place = crate::persist::place::display(&place);
            let what = format!("the save holds the function {place} ({name}:{line}), which this version of the game no longer has (removed or renamed)");
            return Err({
                self.fail(format!(
                    "{what}, and the save-game carries no code to keep it with"
                ))
            });
        }
        let chunk = &self.chunks[c];
        if self.opts.trust == Trust::Foreign
            && chunk.made_by_load
            && brought
            && chunk.main.is_none()
        {
            return Err(self.refuse_generated(c, line));
        }
        if self.opts.trust == Trust::Foreign
            && brought
            && chunk.source_text
            && chunk.name.first() == Some(&b'=')
        {
            return Err(self.refuse_named_at_run_time(c, line));
        }
        // A game file this version does not have (an update removed or renamed it): no
        // declaration can help, since a new place or replacement is in the function's file.
        // Only a load that binds to this version's code looked for the file; one that binds
        // to the saved code wanted that code, which the file may have changed.
        let current = self.opts.functions == FunctionBinding::Current;
        let gone = match chunk.name.strip_prefix(b"@") {
            Some(file) if !current && file.ends_with(b".lua") => {
                " (or its code changed: this load binds each function to the code it was saved with; a game's own loads bind them to this version's code by place, docs/updates.md)".to_string()
            }
            Some(file) if file.ends_with(b".lua") => missing_file(&self.opts.moved, &chunk.name, file),
            _ => String::new(),
        };
        Err(if brought {
            self.refuse(
                format!("the function defined at {name}:{line} is not among the chunks this VM has loaded{gone}; the save-game brings that chunk's code, which only an own-trust load compiles"),
                crate::persist::error::Accept::TrustOwn,
            )
        } else {
            self.fail(format!(
                "the function defined at {name}:{line} is not among the chunks this VM has loaded (or its code changed), and the save-game has no code for it; load the same game code before loading the save"
            ))
        })
    }

    /// A prototype's path in its chunk's tree: depth, then that many child indices.
    fn path(&mut self) -> Result<Vec<u64>, Fail> {
        let depth = ProtoPath::depth(&mut self.r);
        let depth = self.record(depth)?;
        let mut path = Vec::with_capacity(depth as usize);
        for _ in 0..depth {
            let step = ProtoPath::step(&mut self.r);
            path.push(self.record(step)?);
        }
        Ok(path)
    }

    /// A list of names (a place, upvalue names): count (at most `max`), then each one's bytes.
    fn names(&mut self, max: u64) -> Result<Vec<Vec<u8>>, Fail> {
        let names = ProtoNames::decode(&mut self.r, max);
        self.record(names)
    }

    /// The prototype at `path` (child indices) from chunk `c`'s main prototype `p`, checked
    /// against its fingerprint `hash`.
    pub(super) fn by_path(
        &mut self,
        mut p: *const c_void,
        path: &[u64],
        c: usize,
        line: u64,
        hash: u64,
    ) -> Result<*const c_void, Fail> {
        for &i in path {
            // SAFETY: p is a live prototype (its chunk is anchored for the load); the C side
            // checks the index against its children.
            let child = unsafe { luasnap_proto_child(p, i.min(c_int::MAX as u64) as c_int) };
            if child.is_null() {
                let name = self.chunks[c].shown();
                return Err(self.fail(format!(
                    "chunk {name} has no function at the position the save-game gives (the function defined at line {line}); the save does not match its code"
                )));
            }
            p = child;
        }
        // SAFETY: p is a live prototype (its chunk is anchored for the load).
        if unsafe { luasnap_proto_hash(p) } != hash {
            let name = self.chunks[c].shown();
            return Err(self.fail(format!(
                "chunk {name} compiles to a different prototype tree than the save-game says (the function defined at line {line} differs); the save was written by another Lua build or altered"
            )));
        }
        Ok(p)
    }

    /// Reads a chunk's first occurrence (after its home) and finds or compiles it.
    ///
    /// # Safety
    /// As [`Loader::proto`].
    unsafe fn chunk(&mut self, L: *mut lua_State, s: Slots) -> Result<LoadedChunk, Fail> {
        let def = ChunkDef::decode(&mut self.r);
        let ChunkDef {
            kind,
            name,
            main_hash,
            code,
        } = self.record(def)?;
        let mut chunk = LoadedChunk {
            name: name.to_vec(),
            main: None,
            brought_code: !code.is_empty(),
            source_text: kind == 0,
            made_by_load: super::state::made_by_load(kind, name, code),
            compiled: false,
            generated: false,
            current: None,
            saved: SavedChunk::Absent,
        };
        // luasnap's own chunks (the runtime's glue) are no part of the game: their functions
        // are found by their code only, never bound by place (a save renaming a chunk so
        // would reach the runtime's functions).
        let update = self.opts.functions == FunctionBinding::Current
            && self.format >= 6
            && kind == 0
            && !name.starts_with(crate::persist::options::LUASNAP_CHUNK_PREFIX.as_bytes());
        // A file the game declares moved is looked for where it is now (`persist::moved`).
        let now = match update {
            true => self.moved_to(name),
            false => name.to_vec(),
        };
        if kind == 0 {
            // SAFETY: callers' contract.
            unsafe { self.compile_from_host(L, &now) };
        }
        if update {
            // SAFETY: callers' contract.
            if let Some(c) = unsafe { self.current_chunk(L, s, &now) } {
                let main = self.rb.currents_main(c);
                // SAFETY: main is alive (anchored by current_chunk).
                if unsafe { luasnap_proto_hash(main) } == main_hash {
                    // The game's current code is the saved code: found by path.
                    chunk.main = Some(main);
                    self.rb.unchanged_chunks.insert(now);
                    return Ok(chunk);
                }
                chunk.current = Some(c);
                if !code.is_empty() {
                    // `code` is a slice of the body.
                    let at = code.as_ptr() as usize - self.r.data.as_ptr() as usize;
                    chunk.saved = SavedChunk::Text {
                        at,
                        len: code.len(),
                        main_hash,
                    };
                }
            }
        }
        if code.is_empty() || self.opts.trust == Trust::Foreign {
            if self.compiles_generated(&chunk) {
                // SAFETY: callers' contract.
                unsafe { self.compile_generated(L, s, &mut chunk, main_hash, code)? };
            }
            return Ok(chunk);
        }
        if kind == 1 && !(self.opts.trust == Trust::Own && self.opts.bytecode) {
            return Err(self.fail(format!(
                "chunk {} was loaded as binary (string.dump output): its bytecode is loaded only by own-trust loads that allow it (LoadOptions::bytecode)",
                chunk.shown()
            )));
        }
        let key = -(self.chunks.len() as ffi::lua_Integer) - 1;
        // SAFETY: callers' contract.
        match unsafe { find_or_compile(L, s, key, kind, name, main_hash, code, false) } {
            Ok((p, reused)) => {
                chunk.main = Some(p);
                chunk.compiled = !reused;
                Ok(chunk)
            }
            Err(Compiled::Error) => {
                // SAFETY: the compiler's message is on top, above the name and code.
                let msg = unsafe { pop_compile_error(L) };
                Err(self.fail(format!(
                    "chunk {} in the save-game does not compile: {msg}",
                    chunk.shown()
                )))
            }
            Err(Compiled::Differs) => Err(self.fail(format!(
                "chunk {} compiles to a different prototype tree than the save-game's fingerprint says; the save was written by another Lua build or altered",
                chunk.shown()
            ))),
        }
    }

    /// The chunk this version has for the saved chunk `name`: the one the game's `G.moved`
    /// says it moved to (noted in the report, once per file), else `name`.
    fn moved_to(&mut self, name: &[u8]) -> Vec<u8> {
        let Some((now, _)) = crate::persist::moved::moved_chunk(&self.opts.moved, name) else {
            return name.to_vec();
        };
        self.rb
            .report
            .moved_files
            .push(crate::persist::report::MovedChunk {
                from: super::rebind::shown_chunk(name),
                to: super::rebind::shown_chunk(&now),
            });
        now
    }

    /// Compiles the file chunk `name` (`@path`) from [`LoadOptions::chunk_sources`] if the
    /// VM has no chunk of that name yet, so that the lookups below (by name, by fingerprint)
    /// find it: the host's own code, compiled, never run, and kept as
    /// [`Vm::compile`](crate::bridge::Vm::compile) keeps it. A chunk the host has no source
    /// for, or whose source does not compile, stays missing.
    ///
    /// [`LoadOptions::chunk_sources`]: crate::persist::LoadOptions::chunk_sources
    ///
    /// # Safety
    /// As [`Loader::proto`].
    unsafe fn compile_from_host(&mut self, L: *mut lua_State, name: &[u8]) {
        let Some(sources) = &self.opts.chunk_sources else {
            return;
        };
        let Some(Ok(path)) = name.strip_prefix(b"@").map(std::str::from_utf8) else {
            return;
        };
        let Ok(cname) = std::ffi::CString::new(name) else {
            return;
        };
        // SAFETY: protected context (callers' contract).
        unsafe { reserve(L, 4) };
        // SAFETY: protected context, free slots reserved; a found chunk's closure is pushed.
        if !unsafe { luasnap_chunk_current(L, name.as_ptr().cast(), name.len()) }.is_null() {
            // SAFETY: the closure pushed above.
            unsafe { ffi::lua_settop(L, -2) };
            return;
        }
        let Some(source) = sources.find(path) else {
            return;
        };
        // SAFETY: protected context, free slots reserved; the chunk or the compiler's
        // message is left on top.
        let st = unsafe { crate::bridge::chunks::load_host_chunk(L, &source, &cname) };
        if let (ffi::LUA_OK, Some(index)) = (st, self.index.as_mut()) {
            // The fingerprint index, if built already, learns the new chunk's prototypes.
            let ud = (index as *mut HashMap<u64, *const c_void>).cast();
            // SAFETY: the chunk's main closure is on top, its prototypes alive; the walk
            // only reads them.
            unsafe { luasnap_proto_tree(luasnap_proto(L, -1), collect_proto, ud) };
        }
        // SAFETY: pops the chunk (kept by the VM) or the message.
        unsafe { ffi::lua_settop(L, -2) };
    }

    /// A prototype outside every chunk (or from a format 1-3 file): the file's bytecode if
    /// the load trusts it, else the live prototype with that fingerprint.
    ///
    /// # Safety
    /// As [`Loader::proto`].
    unsafe fn detached(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        hash: u64,
        src: &[u8],
        line: u64,
        code: &[u8],
    ) -> Result<*const c_void, Fail> {
        if self.trusted_bytecode && !code.is_empty() {
            // SAFETY: callers' contract.
            return unsafe { self.trusted(L, s, hash, code) };
        }
        // SAFETY: callers' contract.
        match unsafe { self.by_fingerprint(L, s, hash)? } {
            Some(p) => Ok(p),
            None => {
                let src = match src.first() {
                    Some(b'@' | b'=') => crate::persist::place::printable(src),
                    _ => super::rebind::string_chunk(src),
                };
                let hint = if code.is_empty() || self.opts.trust == Trust::Foreign {
                    "load the same game code before loading the save"
                } else {
                    "the save-game brings its bytecode, which only own-trust loads that allow it (LoadOptions::bytecode) use"
                };
                Err(self.fail(format!(
                    "the function defined at {src}:{line} is not among the chunks this VM has loaded (or its code changed); {hint}"
                )))
            }
        }
    }

    /// Loads the file's bytecode `code` for a detached prototype with fingerprint `hash`:
    /// only for files the caller vouches for (Lua has no bytecode verifier).
    ///
    /// # Safety
    /// As [`Loader::proto`]; the load trusts the file's bytecode (`trusted_bytecode`).
    unsafe fn trusted(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        hash: u64,
        code: &[u8],
    ) -> Result<*const c_void, Fail> {
        let mut cr = ChunkReader {
            data: code,
            done: false,
        };
        // SAFETY: protected context; lua_load in binary mode on bytes from a trusted file
        // (callers' contract), read through `cr`, alive for the call.
        let st = unsafe {
            ffi::lua_load(
                L,
                chunk_reader,
                (&mut cr as *mut ChunkReader<'_>).cast(),
                c"=(save-game)".as_ptr(),
                c"b".as_ptr(),
            )
        };
        if st != ffi::LUA_OK {
            // SAFETY: pops the message.
            unsafe { ffi::lua_settop(L, -2) };
            return Err(self.fail("the save-game's bytecode does not load in this Lua"));
        }
        // SAFETY: the loaded closure on top: its prototype, anchored in protos (popped).
        let p = unsafe {
            let p = luasnap_proto(L, -1);
            ffi::lua_rawseti(L, s.protos, self.protos.len() as ffi::lua_Integer + 1);
            p
        };
        // SAFETY: p is alive, anchored above.
        if unsafe { luasnap_proto_hash(p) } != hash {
            return Err(self.malformed("bytecode does not match its fingerprint"));
        }
        self.protos.push(p);
        Ok(p)
    }

    /// The live prototype with fingerprint `hash`, anchored for the load and listed, or None.
    ///
    /// # Safety
    /// As [`Loader::proto`].
    unsafe fn by_fingerprint(
        &mut self,
        L: *mut lua_State,
        s: Slots,
        hash: u64,
    ) -> Result<Option<*const c_void>, Fail> {
        if self.index.is_none() {
            // The prototypes of every chunk the VM compiled (anchored in the registry).
            let mut index = HashMap::new();
            let ud = (&mut index as *mut HashMap<u64, *const c_void>).cast();
            // SAFETY: reads the anchored chunks; the collector is stopped for the load.
            unsafe { luasnap_chunks_each_proto(L, collect_proto, ud) };
            self.index = Some(index);
        }
        let mut found = self.index.as_ref().and_then(|i| i.get(&hash).copied());
        if found.is_none() && !self.full_index {
            // Not in an anchored chunk (compiled by other means): every prototype alive.
            self.full_index = true;
            let index = self.index.get_or_insert_with(HashMap::new);
            let ud = (index as *mut HashMap<u64, *const c_void>).cast();
            // SAFETY: the collector is stopped for the whole load.
            unsafe { luasnap_each_proto(L, collect_proto, ud) };
            found = self.index.as_ref().and_then(|i| i.get(&hash).copied());
        }
        if let Some(p) = found {
            // Anchor it for the whole load: found by raw pointer, it may belong to no chunk
            // the registry keeps, and Lua code run by the load (or a collection it finishes)
            // could otherwise free it under a closure.
            // SAFETY: protected context; emergency collections are stopped and no Lua code ran
            // since the index was built, so p is alive.
            unsafe {
                luasnap_push_closure(L, p);
                ffi::lua_rawseti(L, s.protos, self.protos.len() as ffi::lua_Integer + 1);
            }
            self.protos.push(p);
        }
        Ok(found)
    }
}

/// Why a chunk's code was not used.
pub(super) enum Compiled {
    /// It does not compile: the message is on top, above the chunk name and code.
    Error,
    /// It compiles to another prototype tree than the fingerprint says.
    Differs,
}

/// The main prototype of the chunk (text or binary `kind`, named `name`, fingerprint
/// `main_hash`, code `code`): the identical chunk live in this VM (shared prototypes, no
/// compile; `true` with it), or `code` compiled (in text mode with its record marked as from
/// a save if `from_save`: `generated.rs`). Anchored at `protos[key]` either way.
///
/// No Rust value with a destructor is alive across the calls (they may raise a memory
/// error): the name and code are slices of the file, the outcome plain data.
///
/// # Safety
/// Protected context; `s` this load's slots; `kind` 0 or 1 (bytecode only for own loads that
/// allow it).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn find_or_compile(
    L: *mut lua_State,
    s: Slots,
    key: ffi::lua_Integer,
    kind: u8,
    name: &[u8],
    main_hash: u64,
    code: &[u8],
    from_save: bool,
) -> Result<(*const c_void, bool), Compiled> {
    // SAFETY: protected context (callers' contract); the name and code are slices of the
    // body, read by the C side for the call.
    let found = unsafe {
        luasnap_chunk_find(
            L,
            main_hash,
            code.as_ptr().cast(),
            code.len(),
            name.as_ptr().cast(),
            name.len(),
        )
    };
    if !found.is_null() {
        // SAFETY: a live main prototype: its closure anchored at protos[key].
        unsafe {
            luasnap_push_closure(L, found);
            ffi::lua_rawseti(L, s.protos, key);
        }
        return Ok((found, true));
    }
    // [name, code]: the chunk name as a C string (a name with a NUL byte compiles under a
    // shorter name, so its fingerprint differs and it is refused).
    // SAFETY: protected context; room made for the name, the code and the result; the
    // compiler leaves the main closure or its message on top.
    let st = unsafe {
        reserve(L, 4);
        ffi::lua_pushlstring(L, name.as_ptr().cast(), name.len());
        ffi::lua_pushlstring(L, code.as_ptr().cast(), code.len());
        let cname = ffi::lua_tolstring(L, -2, std::ptr::null_mut());
        if from_save {
            luasnap_loadstring_from_save(L, -1, cname)
        } else {
            let mode = if kind == 1 { c"b" } else { c"t" };
            luasnap_loadstring(L, -1, cname, mode.as_ptr())
        }
    };
    if st != ffi::LUA_OK {
        // [name, code, message]: the message is read by the caller, then popped.
        return Err(Compiled::Error);
    }
    // SAFETY: the compiled main closure on top: its prototype, the closure anchored at
    // protos[key], the name and code popped.
    let p = unsafe {
        let p = luasnap_proto(L, -1);
        ffi::lua_rawseti(L, s.protos, key);
        ffi::lua_settop(L, -3);
        p
    };
    // SAFETY: p is alive (anchored above).
    if p.is_null() || unsafe { luasnap_proto_hash(p) } != main_hash {
        return Err(Compiled::Differs);
    }
    Ok((p, false))
}

/// The compiler's message on top (above the chunk's name and code), popped with them.
///
/// # Safety
/// The message on top, above the name and code.
pub(super) unsafe fn pop_compile_error(L: *mut lua_State) -> String {
    // SAFETY: callers' contract.
    unsafe { compile_error(L, 2) }
}

/// The compiler's message on top, popped with the `below` values under it.
///
/// # Safety
/// The message on top, at least `below` values under it.
pub(super) unsafe fn compile_error(L: *mut lua_State, below: c_int) -> String {
    // SAFETY: reads the message without conversion (a string, or nothing), then pops it and
    // the values under it.
    unsafe {
        let mut len = 0;
        let m = ffi::lua_tolstring(L, -1, &mut len);
        let msg = if m.is_null() {
            String::new()
        } else {
            crate::persist::place::printable(std::slice::from_raw_parts(m.cast::<u8>(), len))
        };
        ffi::lua_settop(L, -2 - below);
        msg
    }
}

/// Why a load found no file for the saved chunk `name` (`@file`), for its refusal: the
/// declaration that sends it to a file this version lacks, or what the game can declare.
fn missing_file(moved: &[crate::persist::moved::MovedFile], name: &[u8], file: &[u8]) -> String {
    let file = crate::persist::place::printable(file);
    match crate::persist::moved::moved_chunk(moved, name) {
        Some((now, by)) => format!(
            " (the game declares {file} moved ({}), to {}, which is not among the game's files: correct G.moved in the table the game's script returns)",
            by.declaration(),
            super::rebind::shown_chunk(&now)
        ),
        None => format!(
            " (no file {file} was found among the game's files: if an update moved it, declare where it is now in the table the game's script returns (G.moved = {{ [{file:?}] = \"its path now\" }}); if it removed it, keep that file, since a declaration's new place or replacement must be in the function's own file; or load with --trust own)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{luasnap_each_proto, luasnap_proto_hash};
    use crate::bridge::vm::Vm;
    use std::ffi::c_void;

    unsafe extern "C" fn count(p: *const c_void, ud: *mut c_void) {
        // SAFETY: ud is the Vec below; p a prototype the walk found (hashing reads all of it).
        unsafe { (*(ud as *mut Vec<u64>)).push(luasnap_proto_hash(p)) };
    }

    /// The fingerprints of the prototypes a foreign load's full search would index.
    fn searched(vm: &Vm) -> Vec<u64> {
        let mut found = Vec::new();
        vm.run(
            &mut |L| {
                // SAFETY: protected body; the collector is stopped by the test's script.
                unsafe { luasnap_each_proto(L, count, (&mut found as *mut Vec<u64>).cast()) };
                0
            },
            |_, _| (),
        )
        .unwrap();
        found
    }

    #[test]
    fn a_failed_compile_leaves_nothing_a_load_can_match() {
        // A compile that fails leaves its half-built prototypes alive until the collector
        // frees them: the main function's, with code that does not end in a return (here
        // without children, so hashing it does not crash: matched by fingerprint, it would
        // run past its code), and its complete children. Only these may be searched.
        let vm = Vm::builder().capacity(64 << 20).build().unwrap();
        vm.exec(
            "collectgarbage('stop') function compile(s) return load(s) end",
            "=setup",
        )
        .unwrap();
        let before = searched(&vm).len();
        vm.call::<()>("compile", "local x = 1 +").unwrap();
        assert_eq!(searched(&vm).len(), before, "a half-built main prototype");
        vm.call::<()>("compile", "local function a() end local t = {")
            .unwrap();
        assert_eq!(searched(&vm).len(), before + 1, "only the finished child");
    }
}
