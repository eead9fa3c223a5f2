//! The public arena: a reservation, the allocator inside it, and optional page tracking.

use crate::error::{ArenaError, CorruptionError, TrackError};
use crate::heap::{Heap, HeapUsage, Layout, PageOwner, SpanBlocks, NGROUPS};
use crate::mapping::{Reservation, PAGE_SIZE};
use crate::raw::RawArena;
use crate::track::{PageTracker, TrackerKind, TrackerPreference};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Smallest capacity accepted: the header page, one page of the allocator map and a few data
/// pages.
pub const MIN_CAPACITY: usize = 64 * 1024;
/// Largest capacity accepted (1 TiB): page indices in the map are 32-bit.
pub const MAX_CAPACITY: usize = 1 << 40;

static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// Identity of an arena within this process, used to refuse restoring one arena's snapshot
/// into another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArenaId(u64);

impl std::fmt::Display for ArenaId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "arena#{}", self.0)
    }
}

/// The right to one page tracker's records, issued by [`Arena::enable_tracking`].
///
/// Collecting written-page records consumes them: pages one user collects are missing from
/// what the next collects, and a snapshot ring that misses a page restores an inconsistent
/// arena. So the tracker is reached only with this key ([`Arena::tracker_mut`]), which its
/// one holder (the snapshot ring that enabled tracking) keeps to itself.
///
/// Invariant: a key opens its arena's tracker only while that tracker is the one it was
/// issued with. It is neither `Clone` nor `Copy`; disabling tracking, or enabling it again,
/// closes every key issued before.
#[derive(Debug, PartialEq, Eq)]
pub struct TrackerKey {
    arena: ArenaId,
    generation: u64,
    kind: TrackerKind,
}

impl TrackerKey {
    /// The mechanism of the tracker this key opens.
    pub fn kind(&self) -> TrackerKind {
        self.kind
    }
}

/// How to build an [`Arena`]; see [`Arena::builder`].
#[derive(Debug, Clone)]
pub struct ArenaBuilder {
    capacity: usize,
    base: Option<usize>,
    limit: Option<usize>,
}

impl ArenaBuilder {
    /// Bytes of address space to reserve (rounded up to whole pages). Untouched capacity costs
    /// no memory. Default: 1 GiB.
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    /// Place the arena at this address (page-aligned) instead of where the OS chooses. Two
    /// processes that place their arenas at the same address and run the same code lay out
    /// Lua's objects identically. Fails with [`ArenaError::AddressInUse`] rather than map over
    /// anything.
    pub fn base_address(mut self, address: usize) -> Self {
        self.base = Some(address);
        self
    }

    /// Cap the bytes of live blocks at this many (rounded down to whole pages); allocations
    /// past it fail. Free slots in partly used spans and holes between blocks do not count, as
    /// free chunks in a malloc'd heap do not count against a cap on live allocations; the
    /// pages held by blocks stay within twice the limit. Default: the whole capacity.
    pub fn limit(mut self, bytes: usize) -> Self {
        self.limit = Some(bytes);
        self
    }

    /// Reserves the arena and writes an empty allocator map into it.
    pub fn build(self) -> Result<Arena, ArenaError> {
        if self.capacity < MIN_CAPACITY {
            return Err(ArenaError::CapacityTooSmall {
                requested: self.capacity,
                minimum: MIN_CAPACITY,
            });
        }
        if self.capacity > MAX_CAPACITY {
            return Err(ArenaError::CapacityTooLarge {
                requested: self.capacity,
                maximum: MAX_CAPACITY,
            });
        }
        let capacity = self.capacity.next_multiple_of(PAGE_SIZE);
        let layout = Layout::for_capacity(capacity).ok_or(ArenaError::CapacityTooSmall {
            requested: self.capacity,
            minimum: MIN_CAPACITY,
        })?;
        let usable = layout.max_pages as usize * PAGE_SIZE;
        let limit_pages = match self.limit {
            Some(limit) if limit > usable => {
                return Err(ArenaError::LimitAboveCapacity { limit, usable })
            }
            Some(limit) => (limit / PAGE_SIZE) as u32,
            None => layout.max_pages,
        };
        let map = Reservation::new(capacity, self.base)?;
        // SAFETY: `map` is a fresh writable mapping of `capacity` bytes laid out by `layout`,
        // owned by the arena we return and touched by nobody else.
        unsafe { Heap::init(map.base().as_ptr(), capacity, layout, limit_pages) };
        Ok(Arena {
            map,
            id: ArenaId(NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed)),
            tracker: None,
            tracker_generation: 0,
        })
    }
}

/// Allocator statistics, read from the arena's own map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Bytes in use as the callers asked for them (Lua's own count of its heap).
    pub bytes_in_use: u64,
    /// Highest `bytes_in_use` has been.
    pub peak_bytes_in_use: u64,
    /// Bytes in the blocks handed out, after rounding up to size classes and pages: what the
    /// limit bounds.
    pub bytes_allocated: u64,
    /// Blocks currently live.
    pub live_blocks: u64,
    /// Bytes of the data region spanned now (pages below the high-water mark).
    pub extent_bytes: u64,
    /// Highest the extent has been.
    pub peak_extent_bytes: u64,
    /// Bytes of the pages held by blocks (large blocks and spans, free slots in spans
    /// included; free runs inside the extent are not). New pages are taken only while this
    /// stays within twice the limit.
    pub held_bytes: u64,
    /// Current limit on [`bytes_allocated`](Self::bytes_allocated), the bytes of live blocks.
    pub limit_bytes: u64,
    /// Requests refused (limit or capacity reached).
    pub failed_allocations: u64,
}

impl ArenaStats {
    /// Bytes lost to rounding requests up to their size class.
    pub fn rounding_loss(&self) -> u64 {
        self.bytes_allocated - self.bytes_in_use.min(self.bytes_allocated)
    }

    /// Bytes of the extent not in any live block (free runs, free blocks in spans, span tails).
    pub fn fragmentation(&self) -> u64 {
        self.extent_bytes.saturating_sub(self.bytes_allocated)
    }

    /// Peak extent over peak bytes in use: the memory the arena needed per byte asked for at
    /// most (1.0 would be perfect; rounding and fragmentation make it larger).
    pub fn peak_overhead(&self) -> f64 {
        self.peak_extent_bytes as f64 / self.peak_bytes_in_use.max(1) as f64
    }
}

/// The byte ranges of an arena that hold state, as offsets from its base. Everything outside
/// them is free capacity whose contents do not matter: copying these ranges back restores the
/// allocator and every block exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRanges {
    /// The header and the used part of the allocator's page map.
    pub meta: Range<usize>,
    /// The data pages below the high-water mark, free ones included (they are interleaved
    /// with live ones, and zero: [`Arena::free_runs`]).
    pub data: Range<usize>,
}

impl StateRanges {
    /// Both ranges, in address order.
    pub fn iter(&self) -> impl Iterator<Item = Range<usize>> {
        [self.meta.clone(), self.data.clone()].into_iter()
    }

    /// Total bytes in both ranges.
    pub fn total(&self) -> usize {
        self.meta.len() + self.data.len()
    }
}

/// A reserved region that never moves, with a block allocator whose every byte of state lives
/// inside it.
///
/// Copy the bytes of [`Arena::state_ranges`] out and back in and the allocator and every block
/// are exactly as they were. The `luasnap-snap` crate does that fast.
///
/// ```
/// use luasnap_alloc::Arena;
/// let mut arena = Arena::builder().capacity(16 << 20).build()?;
/// let p = arena.alloc(100).expect("room");
/// assert_eq!(p.as_ptr() as usize % 16, 0);
/// // SAFETY: p came from this arena with size 100 and is not used afterwards.
/// unsafe { arena.free(p, 100) };
/// # Ok::<(), luasnap_alloc::ArenaError>(())
/// ```
pub struct Arena {
    // Field order matters: the tracker must stop before the mapping is unmapped.
    tracker: Option<PageTracker>,
    map: Reservation,
    id: ArenaId,
    tracker_generation: u64,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("id", &self.id)
            .field("base", &self.map.base())
            .field("capacity", &self.map.len())
            .field("tracker", &self.tracker_kind())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Arena {
    /// Starts building an arena.
    pub fn builder() -> ArenaBuilder {
        ArenaBuilder {
            capacity: 1 << 30,
            base: None,
            limit: None,
        }
    }

    /// An arena of `capacity` bytes wherever the OS puts it.
    pub fn new(capacity: usize) -> Result<Arena, ArenaError> {
        Self::builder().capacity(capacity).build()
    }

    fn heap(&mut self) -> Heap {
        // SAFETY: the arena was initialized in `build`, stays mapped while self lives, and
        // `&mut self` gives exclusive access for the Heap's use.
        unsafe { Heap::attach(self.map.base().as_ptr()) }
    }

    fn heap_ref(&self) -> Heap {
        // SAFETY: as in `heap`; callers only use read-only Heap methods through `&self`.
        unsafe { Heap::attach(self.map.base().as_ptr()) }
    }

    /// This arena's identity in this process.
    pub fn id(&self) -> ArenaId {
        self.id
    }

    /// First byte of the reservation.
    pub fn base(&self) -> NonNull<u8> {
        self.map.base()
    }

    /// Bytes reserved.
    pub fn capacity(&self) -> usize {
        self.map.len()
    }

    /// Whether `ptr` points into this arena's reservation.
    pub fn contains(&self, ptr: *const u8) -> bool {
        let b = self.map.base().as_ptr() as usize;
        (b..b + self.map.len()).contains(&(ptr as usize))
    }

    /// Allocates `size` bytes, 16-byte aligned. `None` when the limit or capacity is reached.
    pub fn alloc(&mut self, size: usize) -> Option<NonNull<u8>> {
        NonNull::new(self.heap().alloc(size, 0))
    }

    /// What holds the page at byte `offset` from the base: a span (with its block size and
    /// placement group), a large block, a free run, or nothing of the data region. For
    /// finding out whose pages a workload writes (with `SnapshotRing::last_written`).
    pub fn page_owner(&self, offset: usize) -> PageOwner {
        let heap = self.heap_ref();
        let start = heap.counters().data_offset;
        match offset.checked_sub(start) {
            Some(off) if off / PAGE_SIZE < u32::MAX as usize => {
                heap.page_owner((off / PAGE_SIZE) as u32)
            }
            _ => PageOwner::Outside,
        }
    }

    /// The span holding the page at byte `offset` from the base, with each block's liveness
    /// (see [`SpanBlocks`]); `None` for pages outside spans. For diagnostics.
    pub fn span_blocks(&self, offset: usize) -> Option<SpanBlocks> {
        let heap = self.heap_ref();
        let off = offset.checked_sub(heap.counters().data_offset)?;
        u32::try_from(off / PAGE_SIZE)
            .ok()
            .and_then(|p| heap.span_blocks(p))
    }

    /// Allocates `size` bytes in placement group `group`: a small block shares its page only
    /// with blocks of the same group (see [`NGROUPS`]; [`alloc`](Self::alloc) is group 0). A
    /// small block keeps its group when [`realloc`](Self::realloc) moves it (a large block has
    /// whole pages and no group; shrunk into a size class, it goes to group 0). `None` when the limit
    /// or capacity is reached, or `group` is not below [`NGROUPS`].
    pub fn alloc_in(&mut self, size: usize, group: usize) -> Option<NonNull<u8>> {
        if group >= NGROUPS {
            return None;
        }
        NonNull::new(self.heap().alloc(size, group))
    }

    /// Frees a block. Returns false, changing nothing, if `ptr` is not the start of a live block
    /// of this arena.
    ///
    /// # Safety
    /// `ptr` must not be used after this call. `size` should be the size last requested for the
    /// block (it only feeds [`ArenaStats::bytes_in_use`]).
    pub unsafe fn free(&mut self, ptr: NonNull<u8>, size: usize) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.heap().free(ptr.as_ptr(), size) }
    }

    /// Resizes a block with Lua's semantics: shrinking never fails, growing may; on failure the
    /// old block is untouched and still owned by the caller. A `new_size` of 0 is treated as 1.
    ///
    /// # Safety
    /// `ptr` must be a live block of this arena whose last requested size was `old_size`; on
    /// success only the returned pointer may be used.
    pub unsafe fn realloc(
        &mut self,
        ptr: NonNull<u8>,
        old_size: usize,
        new_size: usize,
    ) -> Option<NonNull<u8>> {
        // SAFETY: forwarded from the caller.
        NonNull::new(unsafe { self.heap().realloc(ptr.as_ptr(), old_size, new_size.max(1)) })
    }

    /// Usable size of the live block at `ptr`, or `None` if it is not one.
    pub fn block_size(&self, ptr: *const u8) -> Option<usize> {
        self.heap_ref().block_capacity(ptr)
    }

    /// Allocator statistics.
    pub fn stats(&self) -> ArenaStats {
        let c = self.heap_ref().counters();
        ArenaStats {
            bytes_in_use: c.requested,
            peak_bytes_in_use: c.peak_requested,
            bytes_allocated: c.allocated,
            live_blocks: c.live_blocks,
            extent_bytes: c.top_pages as u64 * PAGE_SIZE as u64,
            peak_extent_bytes: c.peak_top_pages as u64 * PAGE_SIZE as u64,
            held_bytes: c.run_pages as u64 * PAGE_SIZE as u64,
            limit_bytes: c.limit_pages as u64 * PAGE_SIZE as u64,
            failed_allocations: c.failures,
        }
    }

    /// The byte ranges that hold state right now. A snapshot copies exactly these.
    pub fn state_ranges(&self) -> StateRanges {
        let heap = self.heap_ref();
        let c = heap.counters();
        StateRanges {
            meta: 0..heap.meta_len(),
            data: c.data_offset..c.data_offset + c.top_pages as usize * PAGE_SIZE,
        }
    }

    /// The free page runs inside [`Arena::state_ranges`]' data range, as byte ranges of the
    /// arena (offsets as for [`Arena::bytes`]), in address order, replacing `out`'s contents.
    /// Their bytes are zero, always: the allocator zeroes pages as it frees them, so a
    /// snapshot may skip them and a restore needs only to zero them where they are not free
    /// now.
    pub fn free_runs(&self, out: &mut Vec<Range<usize>>) {
        let heap = self.heap_ref();
        let data = heap.counters().data_offset;
        out.clear();
        heap.for_each_free_run(|r| {
            out.push(data + r.start as usize * PAGE_SIZE..data + r.end as usize * PAGE_SIZE)
        });
        out.sort_unstable_by_key(|r| r.start);
    }

    /// Bytes the data region can span at most (capacity minus the allocator's map).
    pub fn usable_capacity(&self) -> usize {
        self.heap_ref().counters().max_pages as usize * PAGE_SIZE
    }

    /// Changes the limit on the bytes of live blocks (see [`ArenaBuilder::limit`]). The limit
    /// is part of the arena's state: a rollback restores the limit that was in force when the
    /// snapshot was taken.
    pub fn set_limit(&mut self, bytes: usize) -> Result<(), ArenaError> {
        let c = self.heap_ref().counters();
        let usable = c.max_pages as usize * PAGE_SIZE;
        let in_use = c.allocated as usize;
        if bytes > usable {
            return Err(ArenaError::LimitAboveCapacity {
                limit: bytes,
                usable,
            });
        }
        if bytes < in_use {
            return Err(ArenaError::LimitBelowUsage {
                limit: bytes,
                in_use,
            });
        }
        self.heap().set_limit_pages((bytes / PAGE_SIZE) as u32);
        Ok(())
    }

    /// Where the extent's bytes go (live blocks, free slots in spans, free page runs), by
    /// walking the map: for diagnosing fragmentation, not for every frame.
    pub fn usage(&self) -> HeapUsage {
        self.heap_ref().usage()
    }

    /// Checks the allocator's map for consistency (walks every page run and list).
    pub fn verify(&self) -> Result<(), CorruptionError> {
        self.heap_ref().verify()
    }

    /// The whole reservation as bytes, for snapshot engines and digests. Offsets match
    /// [`Arena::state_ranges`].
    pub fn bytes(&self, range: Range<usize>) -> &[u8] {
        assert!(
            range.start <= range.end && range.end <= self.map.len(),
            "range {range:?} is not inside the arena"
        );
        // SAFETY: the range lies inside our mapping; `&self` excludes concurrent writes through
        // this arena's safe API for the life of the slice.
        unsafe {
            std::slice::from_raw_parts(self.map.base().as_ptr().add(range.start), range.len())
        }
    }

    /// Mutable access to raw arena bytes, for restoring snapshots.
    ///
    /// # Safety
    /// Whatever is written must leave the arena in a state it was in before (bytes captured from
    /// this same arena, at the same offsets, for a set of ranges that restores a consistent
    /// map); otherwise later allocator calls are undefined behaviour. Pointers into the arena
    /// held elsewhere (e.g. by a Lua state) must be consistent with the restored state.
    pub unsafe fn bytes_mut(&mut self, range: Range<usize>) -> &mut [u8] {
        assert!(
            range.start <= range.end && range.end <= self.map.len(),
            "range {range:?} is not inside the arena"
        );
        // SAFETY: in bounds of our mapping; `&mut self` gives exclusive access.
        unsafe {
            std::slice::from_raw_parts_mut(self.map.base().as_ptr().add(range.start), range.len())
        }
    }

    // ----- written-page tracking -----

    /// Starts recording which pages of this arena get written, with the best available
    /// mechanism allowed by `preference`. Replaces any tracker already running (whose key then
    /// opens nothing). The returned key is the only way to the tracker's records
    /// ([`tracker_mut`](Arena::tracker_mut)): keep it where the records are consumed.
    pub fn enable_tracking(
        &mut self,
        preference: TrackerPreference,
    ) -> Result<TrackerKey, TrackError> {
        self.disable_tracking();
        let tracker = PageTracker::new(self.map.base(), self.map.len(), preference)?;
        let key = TrackerKey {
            arena: self.id,
            generation: self.tracker_generation,
            kind: tracker.kind(),
        };
        self.tracker = Some(tracker);
        Ok(key)
    }

    /// Stops tracking; every page becomes writable at full speed again. Every key issued so
    /// far opens nothing from now on.
    pub fn disable_tracking(&mut self) {
        self.tracker = None;
        self.tracker_generation += 1;
    }

    /// The tracking mechanism in use, if any.
    pub fn tracker_kind(&self) -> Option<TrackerKind> {
        self.tracker.as_ref().map(|t| t.kind())
    }

    /// The page tracker that `key` was issued with, if it still runs: `None` once tracking
    /// was disabled or enabled again (by anyone), or for a key of another arena.
    pub fn tracker_mut(&mut self, key: &TrackerKey) -> Option<&mut PageTracker> {
        if key.arena != self.id || key.generation != self.tracker_generation {
            return None;
        }
        self.tracker.as_mut()
    }

    /// Fault injection for tests: the tracker's next `arm`, `collect` or `disarm` fails as if
    /// the kernel had refused it, without touching any page (and without consuming records,
    /// so no key is needed). Does nothing while tracking is off.
    #[doc(hidden)]
    pub fn inject_tracker_failure(&mut self) {
        if let Some(t) = &mut self.tracker {
            t.inject_failure();
        }
    }

    /// Makes `range` (offsets) safe for the kernel to write into, e.g. before `read(2)` into an
    /// arena buffer: with the mprotect tracker a protected page would make the syscall fail
    /// with `EFAULT` instead of faulting, so the pages are marked written and unprotected
    /// first. With userfaultfd, kernel writes are tracked by the kernel and this does nothing.
    pub fn prepare_external_write(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        match &mut self.tracker {
            Some(t) => t.prepare_external_write(range),
            None => Ok(()),
        }
    }

    /// This arena as a base address, for an allocation callback that C code calls with an
    /// opaque pointer (Lua's `lua_Alloc`). See [`RawArena`] for what its user must keep to:
    /// the arena must outlive every use of it, and must not be used through `&mut self`
    /// methods while a callback may run.
    pub fn raw(&mut self) -> RawArena {
        RawArena::new(self.map.base())
    }
}
