//! Prototypes and their homes. A closure names its prototype by index; the first occurrence
//! of a prototype gives its fingerprint, its line and its home (see `format.rs`):
//!
//! ```text
//! home 0:      detached (compiled outside the chunk registry): short source, bytecode or empty
//! home c + 1:  chunk c; the first time: kind u8 (0 source text, 1 binary), chunk name,
//!              main fingerprint u64, code (the text or binary chunk, or empty); then
//!              the path: depth, then depth child indices from the chunk's main prototype
//! ```
//!
//! Fingerprints are computed once per chunk tree and kept by prototype identity
//! (`Persister::proto_hashes`) until Lua code runs (`Persister::anchor` forgets them: a
//! prototype freed meanwhile could give its address to another).

use super::csrc::{
    luasnap_chunk_describe, luasnap_dump, luasnap_proto_child, luasnap_proto_hash,
    luasnap_proto_nchildren, luasnap_proto_tree_hashes, ChunkDesc,
};
use super::Persister;
use mlua_sys::{self as ffi, lua_State};
use rustc_hash::FxHashMap as HashMap;
use std::ffi::{c_int, c_void, CStr};

/// The path to each prototype of a chunk's tree (child indices from its main prototype), by
/// fingerprint.
type TreePaths = HashMap<u64, Vec<u32>>;

impl Persister<'_> {
    /// Writes the prototype `proto` of the Lua closure on top: its index, and the first time
    /// its fingerprint, line and home.
    ///
    /// # Safety
    /// Protected, with a Lua closure of `proto` on top (left there).
    pub(super) unsafe fn proto_ref(&mut self, L: *mut lua_State, proto: *const c_void) {
        if let Some(&index) = self.sc.protos.get(&proto) {
            self.w.varint(index as u64);
            return;
        }
        let index = self.sc.protos.len() as u32;
        self.sc.protos.insert(proto, index);
        self.w.varint(index as u64);
        let hash = match self.proto_hashes.get(&proto) {
            Some(&h) => h,
            // SAFETY: proto is alive (its closure is on top); reads only.
            None => unsafe { luasnap_proto_hash(proto) },
        };
        self.w.u64(hash);
        // SAFETY: a Lua closure is on top.
        let ar = unsafe { source_info(L) };
        self.w.varint(ar.linedefined.max(0) as u64);
        // SAFETY: proto is alive (**Alive**: the collector is stopped).
        if !unsafe { self.chunk_home(proto, hash) } {
            // SAFETY: Protected, with the closure on top.
            unsafe { self.detached_home(L, &ar) };
        }
    }

    /// Writes home 0: a prototype compiled outside the chunk registry, with no source text:
    /// its short source and its bytecode (if the options carry bytecode) or nothing.
    ///
    /// # Safety
    /// Protected, with the Lua closure `ar` describes on top (left there).
    unsafe fn detached_home(&mut self, L: *mut lua_State, ar: &ffi::lua_Debug) {
        self.w.varint(0);
        // SAFETY: lua_getinfo wrote a NUL-terminated short source.
        let src = unsafe { CStr::from_ptr(ar.short_src.as_ptr()) };
        self.w.bytes(src.to_bytes());
        if !self.opts.bytecode {
            self.w.bytes(&[]);
            return;
        }
        self.dump.clear();
        let strip = (!self.opts.debug) as c_int;
        let dump = (&mut self.dump as *mut Vec<u8>).cast();
        // SAFETY: Protected (lua_dump allocates); the closure is on top; dump_writer appends
        // to `self.dump`, which outlives the call.
        unsafe { luasnap_dump(L, dump_writer, dump, strip) };
        self.w.bytes(&self.dump);
        self.has_bytecode = true;
    }

    /// Writes where prototype `proto` (fingerprint `hash`) lives: its chunk (the chunk's name,
    /// main fingerprint and code the first time) and its path in the chunk's tree. Returns
    /// false, writing nothing, for a prototype outside every chunk record.
    ///
    /// # Safety
    /// `proto` is alive; the collector is stopped (**Alive**), so its chunk record, the
    /// record's text and its tree stay put while the pointers are used.
    unsafe fn chunk_home(&mut self, proto: *const c_void, hash: u64) -> bool {
        let mut d = ChunkDesc::EMPTY;
        // SAFETY: callers' contract; reads only.
        if unsafe { luasnap_chunk_describe(proto, &mut d) } == 0 {
            return false;
        }
        match self.sc.chunks.get(&d.rec) {
            Some((index, paths)) => {
                if !paths.contains_key(&hash) {
                    return false;
                }
                let index = *index;
                self.w.varint(index as u64 + 1);
            }
            None => {
                // SAFETY: d.main is the record's live main prototype (callers' contract).
                let paths = unsafe { self.tree_paths(d.main) };
                if !paths.contains_key(&hash) {
                    return false;
                }
                let index = self.sc.chunks.len() as u32;
                self.w.varint(index as u64 + 1);
                // SAFETY: d describes a live record (callers' contract).
                unsafe { self.chunk_record(&d) };
                self.sc.chunks.insert(d.rec, (index, paths));
            }
        }
        self.write_path(&d, hash);
        true
    }

    /// Writes the path of the prototype with fingerprint `hash` in the tree of the chunk `d`
    /// (written already, with that fingerprint in its tree).
    fn write_path(&mut self, d: &ChunkDesc, hash: u64) {
        let path = &self.sc.chunks[&d.rec].1[&hash];
        self.w.varint(path.len() as u64);
        for &i in path {
            self.w.varint(i as u64);
        }
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
        self.w.u8(binary as u8);
        self.w.bytes(name);
        let main_hash = match self.proto_hashes.get(&d.main) {
            Some(&h) => h,
            // SAFETY: d.main is the record's live main prototype; reads only.
            None => unsafe { luasnap_proto_hash(d.main) },
        };
        self.w.u64(main_hash);
        if (binary && self.opts.bytecode) || (!binary && self.opts.code) {
            self.w.bytes(src);
            if binary {
                self.has_bytecode = true;
            } else {
                self.has_source = true;
            }
        } else {
            self.w.bytes(&[]);
        }
    }

    /// The path to every prototype of the tree under `main`, by fingerprint (each fingerprint
    /// also kept in `proto_hashes`).
    ///
    /// # Safety
    /// `main` is a live prototype.
    unsafe fn tree_paths(&mut self, main: *const c_void) -> TreePaths {
        // SAFETY: callers' contract.
        let hashes = unsafe { tree_hashes(main) };
        let (mut paths, mut path, mut at) = (TreePaths::default(), Vec::new(), 0);
        // SAFETY: callers' contract.
        unsafe {
            walk_tree(
                main,
                &mut path,
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

/// Records the path (child indices from the main prototype) of `p` and of every prototype
/// below it, by fingerprint; the first of equal fingerprints wins (equal fingerprints are
/// equal functions). `hashes`: the fingerprints of `p`'s tree in pre-order (from
/// `luasnap_proto_tree_hashes`, read from `*at` on), or None to hash each prototype alone.
/// Every fingerprint also goes to `memo`, by prototype.
///
/// # Safety
/// `p` is a live prototype.
unsafe fn walk_tree(
    p: *const c_void,
    path: &mut Vec<u32>,
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
    out.entry(hash).or_insert_with(|| path.clone());
    // SAFETY: callers' contract; reads only.
    let children = unsafe { luasnap_proto_nchildren(p) };
    for i in 0..children {
        path.push(i as u32);
        // SAFETY: children of a live prototype are alive.
        unsafe { walk_tree(luasnap_proto_child(p, i), path, out, hashes, at, memo) };
        path.pop();
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
