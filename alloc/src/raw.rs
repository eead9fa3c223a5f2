//! An arena reached through its base address alone, for allocation callbacks.
//!
//! A C library that takes an allocator calls it with an opaque pointer it was given once (Lua's
//! `lua_Alloc` receives its `ud`), so the callback cannot hold a `&mut Arena`. It does not need
//! one: every byte of the allocator's state lives inside the arena, so its base address is all
//! a callback needs. [`RawArena`] is that address, and its methods are the allocator's
//! operations on it; what the borrow checker would have enforced becomes each method's
//! `# Safety` contract.

use crate::heap::{Heap, NGROUPS};
use std::ffi::c_void;
use std::ptr::NonNull;

/// The base address of a live [`Arena`](crate::Arena), with the allocator's operations.
///
/// Made by [`Arena::raw`](crate::Arena::raw), passed through C as [`as_ptr`](RawArena::as_ptr)
/// and turned back with [`from_ptr`](RawArena::from_ptr). It does not borrow the arena, so
/// every operation is `unsafe` with the same contract: **the arena is alive, and nothing else
/// uses it during the call** (no `&mut Arena` method, no other `RawArena` call on another
/// thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawArena(NonNull<u8>);

impl RawArena {
    pub(crate) fn new(base: NonNull<u8>) -> RawArena {
        RawArena(base)
    }

    /// The base address as an opaque pointer, to hand to C (`lua_newstate`'s `ud`).
    pub fn as_ptr(self) -> *mut c_void {
        self.0.as_ptr().cast()
    }

    /// The arena whose base address is `ptr`.
    ///
    /// # Safety
    /// `ptr` came from [`as_ptr`](RawArena::as_ptr) of a `RawArena` (so it is an arena's
    /// base); the methods' contract still applies to each call.
    #[inline(always)]
    pub unsafe fn from_ptr(ptr: *mut c_void) -> RawArena {
        // SAFETY: an arena's base is never null (the caller's contract).
        RawArena(unsafe { NonNull::new_unchecked(ptr.cast()) })
    }

    /// The allocator over the arena's own map.
    ///
    /// # Safety
    /// The arena is alive and nothing else uses it for as long as the `Heap` lives.
    #[inline(always)]
    unsafe fn heap(self) -> Heap {
        // SAFETY: the base of a live, initialized arena, used by no one else (caller's contract).
        unsafe { Heap::attach(self.0.as_ptr()) }
    }

    /// Allocates `size` bytes (16-byte aligned, not zero) in placement group `group` (below
    /// [`NGROUPS`]), as [`Arena::alloc_in`](crate::Arena::alloc_in). Null when the limit or
    /// capacity is reached. Inline: the common case takes the allocator's fast path without a
    /// call.
    ///
    /// # Safety
    /// The arena is alive and nothing else uses it during the call; `size` is not zero and
    /// `group` is below [`NGROUPS`].
    #[inline(always)]
    pub unsafe fn alloc_in(self, size: usize, group: usize) -> *mut u8 {
        debug_assert!(size != 0 && group < NGROUPS);
        // SAFETY: forwarded from the caller.
        unsafe { self.heap() }.alloc(size, group)
    }

    /// Frees a block, as [`Arena::free`](crate::Arena::free): false, changing nothing, if
    /// `ptr` is not the start of a live block.
    ///
    /// # Safety
    /// The arena is alive and nothing else uses it during the call; `ptr` is not used after
    /// the call; `size` is the size last requested for the block.
    #[inline(always)]
    pub unsafe fn free(self, ptr: *mut u8, size: usize) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.heap().free(ptr, size) }
    }

    /// Resizes a block, as [`Arena::realloc`](crate::Arena::realloc): shrinking never fails;
    /// growing may return null, and then the old block is untouched.
    ///
    /// # Safety
    /// The arena is alive and nothing else uses it during the call; `ptr` is a live block of
    /// it whose last requested size was `old_size`; `new_size` is not zero; on success only the
    /// returned pointer may be used.
    #[inline(always)]
    pub unsafe fn realloc(self, ptr: *mut u8, old_size: usize, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { self.heap().realloc(ptr, old_size, new_size) }
    }

    /// Refuses the next request that needs more memory and the retry of it that follows: a
    /// garbage-collected client that retries a refused request after a full collection then
    /// runs out of memory instead of going on. For a client that knows it can make no
    /// progress.
    ///
    /// # Safety
    /// The arena is alive and nothing else uses it during the call.
    pub unsafe fn refuse_next_growth(self) {
        // SAFETY: forwarded from the caller.
        unsafe { self.heap() }.refuse_next_growth();
    }
}
