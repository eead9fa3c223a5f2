//! # luasnap-alloc: a tracked arena for a VM's whole heap
//!
//! An [`Arena`] is one reserved region of address space that never moves, with a block
//! allocator inside it whose *every* byte of state (size-class lists, free runs, high-water
//! mark, counters, the limit) also lives inside it. Copy the arena's
//! [`state_ranges`](Arena::state_ranges) somewhere and copy them back later, at the same
//! addresses, and the allocator and every block it handed out are exactly as they were. That
//! is what makes byte-level snapshot and rollback of a Lua VM possible; this crate knows nothing
//! of Lua (`luasnap-bridge` makes an arena Lua's allocator, through [`RawArena`]).
//!
//! - **Reservation**: `MAP_NORESERVE`, so untouched capacity costs neither memory nor commit
//!   charge; optionally at a fixed base address (never mapped over anything). An arena's
//!   range never gets huge pages (page tracking needs 4 KiB pages); buffers that hold copies
//!   of an arena ask for them ([`Reservation::for_copies`]).
//! - **Allocator**: 44 size classes (16..=256 bytes in steps of 16, then four per doubling up to
//!   32 KiB) carved from page spans, and best-fit page runs above that, with coalescing. Blocks
//!   have no header: the caller passes the old size on free and realloc (as Lua does), and
//!   the page map knows the rest. 16-byte alignment. Empty spans go back to the page heap,
//!   free runs at the top shrink the extent, so long churn at a steady live size does not
//!   grow the arena. Small blocks of different placement groups ([`Arena::alloc_in`]) never share a page: a client puts
//!   the few blocks it rewrites often in a group of their own (Lua's upvalues, for the bridge),
//!   so they lie together.
//! - **Limit**: allocations that would take the bytes of live blocks past it return null,
//!   which Lua turns into a memory error. Free slots in spans and holes between blocks do not
//!   count (as free chunks do not count against a cap on what a malloc'd heap holds); the
//!   pages held by blocks stay within twice the limit.
//! - **Page tracking** ([`track`]): which pages were written since a point in time, with
//!   userfaultfd + `PAGEMAP_SCAN` or an mprotect fallback, for incremental snapshots.
//!
//! ```
//! use luasnap_alloc::Arena;
//!
//! let mut arena = Arena::builder().capacity(64 << 20).limit(32 << 20).build()?;
//! let block = arena.alloc(48).unwrap();
//! let ranges = arena.state_ranges();
//! assert!(ranges.data.len() >= 4096);
//! let saved: Vec<Vec<u8>> = ranges.iter().map(|r| arena.bytes(r).to_vec()).collect();
//!
//! let other = arena.alloc(1000).unwrap();
//! for (r, bytes) in ranges.iter().zip(&saved) {
//!     // SAFETY: the bytes were captured from this arena at these offsets.
//!     unsafe { arena.bytes_mut(r).copy_from_slice(bytes) };
//! }
//! // The allocator is back where it was: the same request gets the same block.
//! assert_eq!(arena.alloc(1000), Some(other));
//! # let _ = block;
//! # Ok::<(), luasnap_alloc::ArenaError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

mod arena;
mod copy;
mod error;
mod heap;
mod mapping;
mod raw;
pub mod track;

pub use arena::{
    Arena, ArenaBuilder, ArenaId, ArenaStats, StateRanges, TrackerKey, MAX_CAPACITY, MIN_CAPACITY,
};
pub use copy::copy_streaming;
pub use error::{ArenaError, CorruptionError, TrackError};
pub use heap::{
    HeapUsage, PageOwner, SpanBlocks, CLASS_SIZES, GRAIN, HELD_SLACK_BYTES, MAX_SMALL, NGROUPS,
};
pub use mapping::{Reservation, PAGE_SIZE};
pub use raw::RawArena;
pub use track::{
    page_copy_ns, probe as probe_trackers, thread_cpu_ns, tracker_call_ns, write_fault_ns,
    PageTracker, TrackerKind, TrackerPreference, TrackerSupport,
};
