//! The arena as Lua's allocator: `lua_Alloc`'s contract over a [`RawArena`], and where Lua's
//! objects go in it.
//!
//! The arena knows nothing of Lua; what is Lua's lives here: the meaning of `lua_Alloc`'s
//! arguments (a null pointer allocates, and `osize` is then the new object's type tag; a size
//! of zero frees) and the placement group each type of object gets. Lua is given
//! [`scrubbing_alloc`](crate::bridge::canonical::scrubbing_alloc), which adds a layer for
//! freed stacks and calls these.

use luasnap_alloc::RawArena;
use std::ffi::c_void;

/// Lua's internal type tag of an upvalue (`LUA_TUPVAL` in `lobject.h`: one past the last
/// public type, `LUA_NUMTYPES`; the same in Lua 5.4 and 5.5).
const LUA_TUPVAL: usize = 9;

/// The arena's placement group for upvalues; everything else goes to group 0.
const UPVALUE_GROUP: usize = 1;
const _: () = assert!(UPVALUE_GROUP < luasnap_alloc::NGROUPS);

/// The placement group of a new Lua object, from the type tag Lua passes as `osize`.
///
/// Upvalues get a group of their own. An open upvalue (a local captured by a closure while its
/// function runs) is relinked every time another local of that thread is captured and closed:
/// a coroutine that captures a local on each resume rewrites the upvalues it holds open, and
/// those were allocated one at a time over many frames, between tables, closures and strings
/// of the same size class. Mixed in, the few hot upvalues spread over many pages; apart,
/// they share a few (the AI village game: 514 -> 449 pages written per frame, see
/// `docs/gc.md`). Every other object, and Lua's raw buffers (stacks, call records, arrays,
/// hash parts: tag 0), stay in group 0.
#[inline(always)]
fn group_of_lua_tag(tag: usize) -> usize {
    usize::from(tag == LUA_TUPVAL) * UPVALUE_GROUP
}

/// A `lua_Alloc` serving every request from the arena whose base is `ud`.
///
/// Semantics are Lua's: `nsize == 0` frees and returns null; a null `ptr` allocates (`osize`
/// then encodes the object type, which picks its placement group); growing may fail and
/// return null, leaving the block untouched; shrinking never fails.
///
/// # Safety
/// `ud` is [`RawArena::as_ptr`] of an arena that is alive and that no other code uses during
/// the call; `ptr`/`osize` follow the `lua_Alloc` contract.
#[inline]
pub(crate) unsafe extern "C" fn lua_alloc(
    ud: *mut c_void,
    ptr: *mut c_void,
    osize: usize,
    nsize: usize,
) -> *mut c_void {
    // SAFETY: ud came from RawArena::as_ptr (caller's contract).
    let arena = unsafe { RawArena::from_ptr(ud) };
    let ptr = ptr.cast::<u8>();
    if nsize == 0 {
        if !ptr.is_null() {
            // SAFETY: a live arena used by no one else; Lua frees each block once, with its size.
            let freed = unsafe { arena.free(ptr, osize) };
            debug_assert!(freed, "lua freed a pointer the arena does not own");
        }
        return std::ptr::null_mut();
    }
    if ptr.is_null() {
        // SAFETY: as above; nsize is not zero and the group is below NGROUPS.
        return unsafe { arena.alloc_in(nsize, group_of_lua_tag(osize)) }.cast();
    }
    // SAFETY: ptr is a live block of this arena with requested size osize (lua_Alloc contract);
    // nsize is not zero.
    unsafe { arena.realloc(ptr, osize, nsize) }.cast()
}

/// [`lua_alloc`]'s allocating case (a null `ptr`; `tag`, Lua's `osize` there, the object
/// type), inline for the wrapping `lua_Alloc`: most requests take the allocator's inline fast
/// path without a call.
///
/// # Safety
/// As [`lua_alloc`]; `nsize` is not zero.
#[inline(always)]
pub(crate) unsafe fn lua_alloc_new(ud: *mut c_void, tag: usize, nsize: usize) -> *mut c_void {
    // SAFETY: ud came from RawArena::as_ptr of a live arena used by no one else (caller's
    // contract); nsize is not zero and the group is below NGROUPS.
    unsafe { RawArena::from_ptr(ud).alloc_in(nsize, group_of_lua_tag(tag)) }.cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use luasnap_alloc::{Arena, PAGE_SIZE};

    const MIB: usize = 1 << 20;

    fn lua(ud: *mut c_void, ptr: *mut u8, osize: usize, nsize: usize) -> *mut u8 {
        // SAFETY: ud comes from RawArena::as_ptr of a live arena and ptr/osize follow the
        // contract.
        unsafe { lua_alloc(ud, ptr.cast(), osize, nsize) }.cast()
    }

    #[test]
    fn lua_alloc_follows_luas_contract() {
        let mut a = Arena::builder()
            .capacity(8 * MIB)
            .limit(MIB)
            .build()
            .unwrap();
        let ud = a.raw().as_ptr();
        // A null ptr allocates; osize then is a type tag and must be ignored.
        let p = lua(ud, std::ptr::null_mut(), 5, 40);
        assert!(!p.is_null() && p as usize % 16 == 0);
        // SAFETY: p is a live 40-byte block.
        unsafe { p.write_bytes(7, 40) };
        // Growing keeps contents.
        let q = lua(ud, p, 40, 5000);
        // SAFETY: q is live with at least 5000 bytes; the first 40 came from p.
        assert!(unsafe { std::slice::from_raw_parts(q, 40) }
            .iter()
            .all(|&b| b == 7));
        // Fill the arena, then show shrinking still succeeds and growing fails cleanly.
        let mut hog = Vec::new();
        loop {
            let h = lua(ud, std::ptr::null_mut(), 0, 64 * 1024);
            if h.is_null() {
                break;
            }
            hog.push(h);
        }
        let r = lua(ud, q, 5000, 24);
        assert!(!r.is_null(), "shrinking must never fail");
        // SAFETY: r is live with at least 24 bytes.
        assert!(unsafe { std::slice::from_raw_parts(r, 24) }
            .iter()
            .all(|&b| b == 7));
        let grown = lua(ud, hog[0], 64 * 1024, 4 * MIB);
        assert!(grown.is_null(), "growing past the limit must fail");
        // nsize == 0 frees and returns null; the failed grow left hog[0] live.
        assert!(lua(ud, r, 24, 0).is_null());
        for h in hog {
            assert!(lua(ud, h, 64 * 1024, 0).is_null());
        }
        let s = a.stats();
        assert_eq!(s.live_blocks, 0);
        assert_eq!(s.bytes_in_use, 0);
        assert_eq!(s.bytes_allocated, 0);
        a.verify().unwrap();
        // Everything freed is reusable: the same hog fits again.
        let again = lua(ud, std::ptr::null_mut(), 0, 14 * 64 * 1024);
        assert!(!again.is_null());
        a.verify().unwrap();
    }

    #[test]
    fn lua_alloc_puts_upvalues_on_pages_of_their_own() {
        // Lua allocates upvalues (type tag 9, 40 bytes) between tables (tag 5) and closures
        // (tag 6) of the same size class; an open upvalue is rewritten whenever its thread
        // captures or closes another local, so upvalues mixed in spread the pages a frame
        // writes.
        let mut a = Arena::new(64 * MIB).unwrap();
        let ud = a.raw().as_ptr();
        let mut upvals = Vec::new();
        let mut others = Vec::new();
        for _ in 0..300 {
            upvals.push(lua(ud, std::ptr::null_mut(), 9, 40));
            others.push(lua(ud, std::ptr::null_mut(), 5, 48));
            others.push(lua(ud, std::ptr::null_mut(), 6, 40));
        }
        let page = |p: *mut u8| p as usize / PAGE_SIZE;
        let up_pages: std::collections::BTreeSet<usize> = upvals.iter().map(|&p| page(p)).collect();
        assert!(others.iter().all(|&p| !up_pages.contains(&page(p))));
        // 300 blocks of 48 bytes fill four pages, not the 12 they would share with the others.
        assert!(up_pages.len() <= 4, "upvalues on {} pages", up_pages.len());
        a.verify().unwrap();
        // Growing or shrinking a block moves it within its group: a 40-byte upvalue-group
        // block reallocated to 100 bytes lands on no page of group 0.
        let moved = lua(ud, upvals[0], 40, 100);
        let g0 = lua(ud, std::ptr::null_mut(), 0, 100);
        assert_ne!(page(moved), page(g0));
        a.verify().unwrap();
    }
}
