//! Prototypes and their homes. A closure names its prototype by index; the first occurrence
//! of a prototype gives its record: fingerprint, line and home, a chunk (with the chunk's
//! definition at its first occurrence, then the path to the prototype in its tree) or none
//! (detached: its short source and bytecode). See `ProtoRecord` in `format/records.rs`. From
//! format 6 a chunk prototype's path is followed by its place and its upvalues' names
//! (`ProtoNames`, `persist::place`), with which a newer version of the game finds it.
//!
//! Fingerprints are computed once per chunk tree and kept by prototype identity
//! (`Persister::proto_hashes`) until Lua code runs (`Persister::anchor` forgets them: a
//! prototype freed meanwhile could give its address to another).

use super::super::format::{ChunkDef, Detached, ProtoHome, ProtoNames, ProtoPath, ProtoRecord};
use super::csrc::{
    luasnap_chunk_describe, luasnap_dump, luasnap_proto_child, luasnap_proto_hash,
    luasnap_proto_tree_hashes, ChunkDesc,
};
use super::persister::Persister;
use super::scratch::TreeEntry;
use crate::persist::place::{child_names, upvalue_names};
use mlua_sys::{self as ffi, lua_State};
use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_int, c_void, CStr};

/// Where each prototype of a chunk's tree is, by fingerprint.
type TreePaths = HashMap<u64, TreeEntry>;

impl Persister<'_> {
    /// Writes the prototype `proto` of the Lua closure on top: its index, and the first time
    /// its record (fingerprint, line and home) and what its home needs.
    ///
    /// # Safety
    /// Protected, with a Lua closure of `proto` on top (left there).
    pub(super) unsafe fn proto_ref(&mut self, L: *mut lua_State, proto: *const c_void) {
        if let Some(&index) = self.sc.protos.get(&proto) {
            ProtoRecord::encode_index(&mut self.w, index as u64);
            return;
        }
        let index = self.sc.protos.len() as u32;
        self.sc.protos.insert(proto, index);
        ProtoRecord::encode_index(&mut self.w, index as u64);
        let hash = match self.proto_hashes.get(&proto) {
            Some(&h) => h,
            // SAFETY: proto is alive (its closure is on top); reads only.
            None => unsafe { luasnap_proto_hash(proto) },
        };
        // SAFETY: a Lua closure is on top.
        let ar = unsafe { source_info(L) };
        let line = ar.linedefined.max(0) as u64;
        // SAFETY: proto is alive (**Alive**: the collector is stopped).
        match unsafe { self.chunk_home(proto, hash) } {
            Some((d, chunk, new)) => {
                let home = ProtoHome::Chunk(chunk as u64);
                ProtoRecord { hash, line, home }.encode(&mut self.w);
                if new {
                    // SAFETY: d describes a live record (see chunk_home).
                    unsafe { self.chunk_record(&d) };
                }
                self.write_path(&d, hash);
                // SAFETY: proto is alive (callers' contract); reads only.
                let upvalues = unsafe { upvalue_names(proto) };
                ProtoNames::encode(&mut self.w, upvalues.iter().map(Vec::as_slice));
            }
            None => {
                let home = ProtoHome::Detached;
                ProtoRecord { hash, line, home }.encode(&mut self.w);
                // SAFETY: Protected, with the closure on top.
                unsafe { self.detached_home(L, &ar) };
            }
        }
    }

    /// Writes the rest of home 0: a prototype compiled outside the chunk registry, with no
    /// source text: its short source and its bytecode (if the options carry bytecode) or
    /// nothing.
    ///
    /// # Safety
    /// Protected, with the Lua closure `ar` describes on top (left there).
    unsafe fn detached_home(&mut self, L: *mut lua_State, ar: &ffi::lua_Debug) {
        // SAFETY: lua_getinfo wrote a NUL-terminated short source.
        let src = unsafe { CStr::from_ptr(ar.short_src.as_ptr()) }.to_bytes();
        self.dump.clear();
        if self.opts.bytecode {
            let strip = (!self.opts.debug) as c_int;
            let dump = (&mut self.dump as *mut Vec<u8>).cast();
            // SAFETY: Protected (lua_dump allocates); the closure is on top; dump_writer
            // appends to `self.dump`, which outlives the call.
            unsafe { luasnap_dump(L, dump_writer, dump, strip) };
            self.has_bytecode = true;
        }
        let code = &self.dump[..];
        Detached { src, code }.encode(&mut self.w);
    }

    /// Where prototype `proto` (fingerprint `hash`) lives: its chunk's description and index,
    /// and whether the chunk is new to this file (then registered, its record to write). None
    /// for a prototype outside every chunk record.
    ///
    /// # Safety
    /// `proto` is alive; the collector is stopped (**Alive**), so its chunk record, the
    /// record's text and its tree stay put while the pointers are used.
    unsafe fn chunk_home(
        &mut self,
        proto: *const c_void,
        hash: u64,
    ) -> Option<(ChunkDesc, u32, bool)> {
        let mut d = ChunkDesc::EMPTY;
        // SAFETY: callers' contract; reads only.
        if unsafe { luasnap_chunk_describe(proto, &mut d) } == 0 {
            return None;
        }
        if let Some((index, paths)) = self.sc.chunks.get(&d.rec) {
            return paths.contains_key(&hash).then_some((d, *index, false));
        }
        // SAFETY: d.main is the record's live main prototype (callers' contract).
        let paths = unsafe { self.tree_paths(d.main) };
        if !paths.contains_key(&hash) {
            return None;
        }
        let index = self.sc.chunks.len() as u32;
        self.sc.chunks.insert(d.rec, (index, paths));
        Some((d, index, true))
    }

    /// Writes the path and the place of the prototype with fingerprint `hash` in the tree of
    /// the chunk `d` (registered already, with that fingerprint in its tree).
    fn write_path(&mut self, d: &ChunkDesc, hash: u64) {
        let entry = &self.sc.chunks[&d.rec].1[&hash];
        ProtoPath::encode(&mut self.w, entry.path.iter().map(|&i| i as u64));
        ProtoNames::encode(&mut self.w, entry.place.iter().map(Vec::as_slice));
    }

    /// Writes a chunk the first time: its kind (source text or binary), name, main
    /// fingerprint and code (the text or the binary chunk, if the options carry that kind).
    ///
    /// # Safety
    /// `d` describes a live chunk record (see `chunk_home`).
    unsafe fn chunk_record(&mut self, d: &ChunkDesc) {
        // SAFETY: the record's text and name, alive with it (callers' contract).
        let (src, name) = unsafe {
            (
                std::slice::from_raw_parts(d.src.cast::<u8>(), d.srclen),
                if d.name.is_null() {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(d.name.cast::<u8>(), d.namelen)
                },
            )
        };
        let binary = src.first() == Some(&0x1b);
        let main_hash = match self.proto_hashes.get(&d.main) {
            Some(&h) => h,
            // SAFETY: d.main is the record's live main prototype; reads only.
            None => unsafe { luasnap_proto_hash(d.main) },
        };
        let with_code = (binary && self.opts.bytecode) || (!binary && self.opts.code);
        if with_code {
            if binary {
                self.has_bytecode = true;
            } else {
                self.has_source = true;
            }
        }
        let def = ChunkDef {
            kind: binary as u8,
            name,
            main_hash,
            code: if with_code { src } else { &[][..] },
        };
        def.encode(&mut self.w);
    }

    /// The path to every prototype of the tree under `main`, by fingerprint (each fingerprint
    /// also kept in `proto_hashes`).
    ///
    /// # Safety
    /// `main` is a live prototype.
    unsafe fn tree_paths(&mut self, main: *const c_void) -> TreePaths {
        // SAFETY: callers' contract.
        let hashes = unsafe { tree_hashes(main) };
        let (mut paths, mut at) = (TreePaths::default(), 0);
        let mut here = TreeEntry {
            path: Vec::new(),
            place: Vec::new(),
        };
        // SAFETY: callers' contract.
        unsafe {
            walk_tree(
                main,
                &mut here,
                &mut paths,
                hashes.as_deref(),
                &mut at,
                &mut self.proto_hashes,
            )
        };
        paths
    }
}

/// The fingerprints of the tree under `main` in pre-order, or None if it nests too deep for
/// `luasnap_proto_tree_hashes` (then each prototype is hashed alone).
///
/// # Safety
/// `main` is a live prototype.
unsafe fn tree_hashes(main: *const c_void) -> Option<Vec<u64>> {
    let mut hs = vec![0u64; 64];
    // SAFETY: callers' contract; the buffer holds `max` fingerprints.
    let mut n = unsafe { luasnap_proto_tree_hashes(main, hs.as_mut_ptr(), hs.len() as c_int) };
    if n > hs.len() as c_int {
        hs.resize(n as usize, 0);
        // SAFETY: as above, with room for all n.
        n = unsafe { luasnap_proto_tree_hashes(main, hs.as_mut_ptr(), n) };
    }
    hs.truncate(n.max(0) as usize);
    (n >= 0).then_some(hs)
}

/// Records where `p` (at `here`) and every prototype below it are, by fingerprint; the first
/// of equal fingerprints wins (equal fingerprints are equal functions). `hashes`: the fingerprints of `p`'s tree in pre-order (from
/// `luasnap_proto_tree_hashes`, read from `*at` on), or None to hash each prototype alone.
/// Every fingerprint also goes to `memo`, by prototype.
///
/// # Safety
/// `p` is a live prototype.
unsafe fn walk_tree(
    p: *const c_void,
    here: &mut TreeEntry,
    out: &mut TreePaths,
    hashes: Option<&[u64]>,
    at: &mut usize,
    memo: &mut HashMap<*const c_void, u64>,
) {
    let hash = match hashes.and_then(|hs| hs.get(*at)) {
        Some(&h) => h,
        // SAFETY: callers' contract; reads only.
        None => unsafe { luasnap_proto_hash(p) },
    };
    *at += 1;
    memo.insert(p, hash);
    out.entry(hash).or_insert_with(|| TreeEntry {
        path: here.path.clone(),
        place: here.place.clone(),
    });
    // SAFETY: callers' contract; reads only.
    let names = unsafe { child_names(p) };
    for (i, name) in names.into_iter().enumerate() {
        here.path.push(i as u32);
        here.place.push(name);
        // SAFETY: children of a live prototype are alive.
        unsafe {
            walk_tree(
                luasnap_proto_child(p, i as c_int),
                here,
                out,
                hashes,
                at,
                memo,
            )
        };
        here.path.pop();
        here.place.pop();
    }
}

/// The source description (`>S`) of the Lua closure on top, left there.
///
/// # Safety
/// A Lua function is on top, and room for one more value.
unsafe fn source_info(L: *mut lua_State) -> ffi::lua_Debug {
    // SAFETY: lua_Debug is plain data; all-zero is a valid value.
    let mut ar: ffi::lua_Debug = unsafe { std::mem::zeroed() };
    // SAFETY: callers' contract: `>` pops the copy pushed; `S` allocates nothing.
    unsafe {
        ffi::lua_pushvalue(L, -1);
        ffi::lua_getinfo(L, c">S".as_ptr(), &mut ar);
    }
    ar
}

/// The `lua_Writer` for `luasnap_dump`: appends to the `Vec<u8>` at `ud`.
///
/// # Safety
/// `ud` is the `Vec<u8>` `detached_home` passed to `luasnap_dump`, not otherwise borrowed
/// during the call; `p` points at `sz` readable bytes (or is null).
unsafe extern "C-unwind" fn dump_writer(
    _L: *mut lua_State,
    p: *const c_void,
    sz: usize,
    ud: *mut c_void,
) -> c_int {
    if sz == 0 || p.is_null() {
        return 0;
    }
    // SAFETY: ud is the Persister's dump buffer (see `detached_home`); p has sz readable
    // bytes.
    unsafe {
        (*(ud as *mut Vec<u8>)).extend_from_slice(std::slice::from_raw_parts(p.cast::<u8>(), sz))
    };
    0
}
