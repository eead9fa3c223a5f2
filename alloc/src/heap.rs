//! The block allocator. Every byte of its state lives inside the arena it manages.
//!
//! # Layout of an arena
//!
//! ```text
//! offset 0            PAGE_SIZE                      data_offset
//! | Header (1 page)   | Desc table: 32 bytes per data page | data pages ...               |
//!                     |<- written up to `top` ->|           |<- [0, top) in use ->|
//! ```
//!
//! The data region is managed in 4 KiB pages. Pages `[0, top)` are the arena's *extent*: each
//! belongs to exactly one *run* (free, one large block, or a small-block span). Pages at or above
//! `top` hold nothing; their descriptors and contents are stale and never read.
//!
//! Invariants (checked by [`Heap::verify`]):
//! - The descriptors of the first and last page of every run are accurate. Interior descriptors
//!   of free and large runs are stale; every page of a span carries `SmallInner` back to its head.
//! - Free runs are maximal: no two free runs are adjacent, and no free run ends at `top` (it is
//!   returned to the wilderness instead). So `top` only grows when nothing free fits.
//! - A span is in the partial list of its class and group iff it has a free block.
//! - Pages are zeroed as they enter the extent, so the extent's bytes depend only on the
//!   operations that produced it, never on leftovers above `top`.
//! - Every page of a free run is zero: pages are zeroed as they are freed (unless they go back
//!   to the wilderness above `top`). A free run's bytes are then known without reading them, so
//!   a snapshot need not copy them ([`Heap::for_each_free_run`]).
//!
//! Blocks carry no header: Lua passes the old size on free and realloc, and the descriptor of
//! the block's page says which class or run it belongs to, so the size passed is only used for
//! the caller-visible byte count. All links are page or block indices, never pointers, so the
//! map stays valid however the arena's bytes are copied back.

use crate::error::CorruptionError;
use crate::mapping::PAGE_SIZE;
use std::ops::Range;
use std::ptr;

/// Alignment and size granularity of every block.
pub const GRAIN: usize = 16;
/// The largest request served from a size class; larger ones get a run of whole pages.
pub const MAX_SMALL: usize = 32 * 1024;
const NIL: u32 = u32::MAX;
const MAGIC: u64 = u64::from_le_bytes(*b"LSNARENA");
const VERSION: u32 = 2;
const DESC_SIZE: usize = 32;
/// Number of small size classes.
pub const NCLASSES: usize = 16 + 7 * 4;
const NBINS: usize = 59;
/// Placement groups: a small block goes into a span of its size class *and* of the group it was
/// asked for in, so small blocks of different groups never share a page. A caller that knows
/// which blocks are written apart from their neighbours (for Lua, its upvalues: the bridge's
/// `lua_Alloc` puts them in group 1) keeps them on fewer pages, and an incremental snapshot copies fewer. Group 0 is
/// the default; large blocks have whole pages anyway and ignore the group.
pub const NGROUPS: usize = 2;

/// Block size of each class: 16..=256 in steps of 16, then four classes per doubling up to
/// 32 KiB (at most 25% lost to rounding). Eight per doubling lost less to rounding on mid-sized
/// strings but more to partly used spans: the Lua-like trace's loss rose from 13.5% to 16.0%.
pub const CLASS_SIZES: [u32; NCLASSES] = class_sizes();
/// Pages per span for each class, chosen to keep the unusable tail of a span small.
const SPAN_PAGES: [u32; NCLASSES] = span_pages();

const fn class_sizes() -> [u32; NCLASSES] {
    let mut out = [0u32; NCLASSES];
    let mut i = 0;
    while i < 16 {
        out[i] = ((i + 1) * 16) as u32;
        i += 1;
    }
    let mut k = 8;
    while k <= 14 {
        let mut sub = 0;
        while sub < 4 {
            out[16 + (k - 8) * 4 + sub] = ((1usize << k) + (sub + 1) * (1usize << (k - 2))) as u32;
            sub += 1;
        }
        k += 1;
    }
    out
}

const fn span_pages() -> [u32; NCLASSES] {
    let sizes = class_sizes();
    let mut out = [0u32; NCLASSES];
    let mut c = 0;
    while c < NCLASSES {
        let size = sizes[c] as usize;
        // The fewest pages whose unusable tail is at most 1/16 of the span; failing that (up to
        // 16 pages), the page count that wastes least. (On the Lua-like trace 1/16 loses 13.5%
        // of the extent, 1/32 15.0%, 1/8 16.2%: a tighter tail makes bigger spans, and a partly
        // used big span pins more pages than its tail wastes.) Small spans matter twice: a class holds
        // at most one partly empty span's worth of slack, and freed spans leave holes that
        // spans of other classes can fill (a hole smaller than every span would be lost).
        let first = if size > PAGE_SIZE {
            size.div_ceil(PAGE_SIZE)
        } else {
            1
        };
        let mut best = first;
        let mut best_waste_ppm = usize::MAX;
        let mut p = first;
        while p <= 16 {
            let bytes = p * PAGE_SIZE;
            let waste_ppm = (bytes % size) * 1_000_000 / bytes;
            if waste_ppm <= 1_000_000 / 16 {
                best = p;
                break;
            }
            if waste_ppm < best_waste_ppm {
                best_waste_ppm = waste_ppm;
                best = p;
            }
            p += 1;
        }
        out[c] = best as u32;
        c += 1;
    }
    out
}

/// The size class serving a request of `size` bytes (`1..=MAX_SMALL`).
pub fn class_of(size: usize) -> usize {
    debug_assert!((1..=MAX_SMALL).contains(&size));
    if size <= 256 {
        size.div_ceil(GRAIN) - 1
    } else {
        let v = size - 1;
        let k = (usize::BITS - 1 - v.leading_zeros()) as usize;
        let sub = (v >> (k - 2)) & 3;
        16 + (k - 8) * 4 + sub
    }
}

/// Blocks per span of each class, computed once: `alloc_small` asks on every allocation, and a
/// division there cost 7 of the allocator's ~80 instructions per block (callgrind, loads).
const BLOCKS_PER_SPAN: [u32; NCLASSES] = blocks_per_span_table();

const fn blocks_per_span_table() -> [u32; NCLASSES] {
    let mut out = [0u32; NCLASSES];
    let mut c = 0;
    while c < NCLASSES {
        out[c] = (SPAN_PAGES[c] as usize * PAGE_SIZE / CLASS_SIZES[c] as usize) as u32;
        c += 1;
    }
    out
}

#[inline]
fn blocks_per_span(class: usize) -> u32 {
    BLOCKS_PER_SPAN[class]
}

fn bin_of(pages: u32) -> usize {
    debug_assert!(pages >= 1);
    if pages <= 32 {
        pages as usize - 1
    } else {
        32 + (31 - pages.leading_zeros() as usize) - 5
    }
}

/// Where the header, the descriptor table and the data pages sit in an arena of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Data pages available.
    pub max_pages: u32,
    /// Byte offset of the first data page.
    pub data_offset: usize,
}

impl Layout {
    /// Lays out an arena of `capacity` bytes (a multiple of the page size). `None` if too small.
    pub fn for_capacity(capacity: usize) -> Option<Layout> {
        let usable = capacity.checked_sub(PAGE_SIZE)?;
        let mut max_pages = usable / (PAGE_SIZE + DESC_SIZE);
        max_pages = max_pages.min(NIL as usize - 1);
        loop {
            let data_offset = PAGE_SIZE + (max_pages * DESC_SIZE).next_multiple_of(PAGE_SIZE);
            if data_offset + max_pages * PAGE_SIZE <= capacity {
                if max_pages == 0 {
                    return None;
                }
                return Some(Layout {
                    max_pages: max_pages as u32,
                    data_offset,
                });
            }
            max_pages -= 1;
        }
    }
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Never part of a run (only seen on stale descriptors).
    Unused = 0,
    /// First page of a free run; `len` = pages.
    FreeHead = 1,
    /// Last page of a free run longer than one page; `len` = head page.
    FreeTail = 2,
    /// First page of a large block; `len` = pages.
    Large = 3,
    /// Last page of a large block longer than one page; `len` = head page.
    LargeTail = 4,
    /// First page of a small-block span; `len` = pages.
    SmallHead = 5,
    /// Any other page of a span; `len` = head page.
    SmallInner = 6,
}

/// One descriptor per data page. Fields other than `kind` and `len` are used by heads only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Desc {
    kind: u8,
    class: u8,
    /// Span: the placement group its blocks were asked for in (see [`NGROUPS`]).
    group: u8,
    _pad: u8,
    len: u32,
    prev: u32,
    next: u32,
    /// Span: blocks handed out.
    live: u32,
    /// Span: first free block index, or NIL. A free block stores the next index in its first 4 bytes.
    free: u32,
    /// Span: blocks `[0, bump)` have been handed out at least once since the span was (re)set.
    bump: u32,
    _reserved: u32,
}

const _: () = assert!(std::mem::size_of::<Desc>() == DESC_SIZE);

impl Desc {
    fn new(kind: Kind, len: u32) -> Desc {
        Desc {
            kind: kind as u8,
            class: 0,
            group: 0,
            _pad: 0,
            len,
            prev: NIL,
            next: NIL,
            live: 0,
            free: NIL,
            bump: 0,
            _reserved: 0,
        }
    }

    fn kind(&self) -> Kind {
        match self.kind {
            1 => Kind::FreeHead,
            2 => Kind::FreeTail,
            3 => Kind::Large,
            4 => Kind::LargeTail,
            5 => Kind::SmallHead,
            6 => Kind::SmallInner,
            _ => Kind::Unused,
        }
    }
}

/// The allocator's header at offset 0 of the arena.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    magic: u64,
    version: u32,
    /// Pages held by large blocks and spans (free runs inside the extent, holes left by moved
    /// blocks, do not count). New pages are taken only while this stays within `HELD_FACTOR`
    /// times the limit.
    run_pages: u32,
    capacity: u64,
    data_offset: u64,
    max_pages: u32,
    /// The limit, in pages: it bounds `allocated`, the bytes of live blocks (small ones at
    /// their class size, large ones in whole pages). Free slots in spans and free runs do not
    /// count, as free chunks in a malloc'd heap do not count against a cap on what Lua holds.
    limit_pages: u32,
    top: u32,
    peak_top: u32,
    requested: u64,
    peak_requested: u64,
    allocated: u64,
    live_blocks: u64,
    failures: u64,
    bin_map: u64,
    /// Spans with a free block, per group and class (`group * NCLASSES + class`).
    partial: [u32; NCLASSES * NGROUPS],
    bins: [u32; NBINS],
    /// Bytes allocated since the last refused request.
    since_failure: u64,
    /// Refused requests in a row, each after less than `THRASH_FRACTION` of the limit was
    /// allocated since the one before.
    thrash: u32,
    /// Set when `thrash` reached `THRASH_RUN`: the next growing request (a garbage-collected
    /// client's retry after the collection a refusal makes it run, as Lua's emergency
    /// collection) is refused too, so the client reports running out of memory.
    refuse_retry: u32,
}

/// A refused request counts as thrashing when less than 1/`THRASH_FRACTION` of the limit was
/// allocated since the previous one.
const THRASH_FRACTION: u64 = 4;
/// After this many thrashing refusals in a row, the client's retry is refused as well. A
/// program that needs a full (emergency) collection for every quarter of its heap makes no
/// progress worth the cost, and Lua's emergency collections never run finalizers: a loop
/// waiting for one while it allocates would spin forever.
const THRASH_RUN: u32 = 32;

const _: () = assert!(std::mem::size_of::<Header>() <= PAGE_SIZE);

/// The pages held by spans and large blocks may exceed the limit (which bounds the bytes of
/// live blocks) by free slots in partly used spans, up to this many times the limit. Lua
/// frees its spare CallInfo records every other one (`luaE_shrinkCI`), so a deep recursion
/// leaves spans half empty: a limit on held pages counted them (after a stack overflow, a
/// growing array reached half of what it reaches without one, and of stock Lua under the same
/// cap, which counts live malloc chunks). The factor keeps a program that fragments spans on
/// purpose from holding pages without bound.
const HELD_FACTOR: u64 = 2;
/// Pages held beyond `HELD_FACTOR` times the limit: one span of every size class, the slack a
/// span allocator keeps whatever the limit (428 KiB). Without it, a small limit was bound by
/// the spans its first blocks open rather than by their bytes: a Lua state with its standard
/// library holds 20 KB of blocks in some 40 partly used spans, so `luasnap run` needed a cap
/// of 80 KB to start.
const HELD_SLACK_PAGES: u64 = held_slack_pages();
/// `HELD_SLACK_PAGES` in bytes: the pages held by blocks stay within twice the limit plus
/// this.
pub const HELD_SLACK_BYTES: u64 = HELD_SLACK_PAGES * PAGE_SIZE as u64;

const fn held_slack_pages() -> u64 {
    let mut sum = 0;
    let mut c = 0;
    while c < NCLASSES {
        sum += SPAN_PAGES[c] as u64;
        c += 1;
    }
    sum
}

/// Counters read from the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeapCounters {
    pub requested: u64,
    pub peak_requested: u64,
    pub allocated: u64,
    pub live_blocks: u64,
    pub failures: u64,
    pub top_pages: u32,
    pub peak_top_pages: u32,
    pub limit_pages: u32,
    pub max_pages: u32,
    pub data_offset: usize,
    /// Pages held by large blocks and spans (grown only within `HELD_FACTOR` times the limit).
    pub run_pages: u32,
}

/// What holds a page of the data region; see [`Arena::page_owner`](crate::Arena::page_owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageOwner {
    /// A span of small blocks of this size, in this placement group.
    Span {
        /// Block size of the span's class.
        block_size: u32,
        /// Placement group (below [`NGROUPS`]).
        group: u8,
    },
    /// A large block, or an interior page of a free run.
    Large,
    /// The first or last page of a free run.
    Free,
    /// Not a data page of the extent (the allocator's map, or above the extent).
    Outside,
}

/// The blocks of one span; see [`Arena::span_blocks`](crate::Arena::span_blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanBlocks {
    /// The span's first data page (from the start of the data region).
    pub head_page: u32,
    /// Its block size.
    pub block_size: u32,
    /// Whether each block, in address order, is live.
    pub live: Vec<bool>,
}

/// Where the bytes of the extent go; see [`Arena::usage`](crate::Arena::usage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes in large blocks (whole pages).
    pub large_blocks: u64,
    /// Bytes in live small blocks (at their class size).
    pub small_blocks: u64,
    /// Bytes of free slots in spans (empty spans included).
    pub span_free: u64,
    /// Of `span_free`, bytes in spans with no live block.
    pub empty_spans: u64,
    /// Bytes at the end of spans too small for a block of the class.
    pub span_tails: u64,
    /// Bytes in free page runs.
    pub free_runs: u64,
}

/// A view of an initialized arena's allocator.
///
/// Invariant: `base` points to an arena initialized by [`Heap::init`] that stays mapped while
/// this value exists, and nothing else reads or writes the arena's map concurrently. Every
/// `unsafe` block below relies on this and on the layout invariants in the module docs; page
/// indices it dereferences are always `< top <= max_pages`.
pub struct Heap {
    base: *mut u8,
    /// Pages a large block being moved by `resize_block` gives back right after the copy: the
    /// new block is charged only its growth (limit and held pages alike).
    moving: u32,
}

impl Heap {
    /// Writes a fresh header into an arena and returns a view of it.
    ///
    /// # Safety
    /// `base` must point to a writable mapping of `capacity` bytes laid out by `layout`, not
    /// accessed by anyone else for as long as the returned `Heap` is used.
    pub unsafe fn init(base: *mut u8, capacity: usize, layout: Layout, limit_pages: u32) -> Heap {
        let header = Header {
            magic: MAGIC,
            version: VERSION,
            run_pages: 0,
            capacity: capacity as u64,
            data_offset: layout.data_offset as u64,
            max_pages: layout.max_pages,
            limit_pages,
            top: 0,
            peak_top: 0,
            requested: 0,
            peak_requested: 0,
            allocated: 0,
            live_blocks: 0,
            failures: 0,
            bin_map: 0,
            partial: [NIL; NCLASSES * NGROUPS],
            bins: [NIL; NBINS],
            since_failure: 0,
            thrash: 0,
            refuse_retry: 0,
        };
        // SAFETY: the caller guarantees base is writable for at least one page, and Header fits
        // in one page and needs 8-byte alignment, which a page-aligned mapping has.
        unsafe { ptr::write(base.cast::<Header>(), header) };
        Heap { base, moving: 0 }
    }

    /// A view of an arena initialized earlier.
    ///
    /// # Safety
    /// `base` must point to an arena initialized by [`Heap::init`], mapped and not accessed by
    /// anyone else for as long as the returned `Heap` is used.
    pub unsafe fn attach(base: *mut u8) -> Heap {
        Heap { base, moving: 0 }
    }

    fn hdr(&mut self) -> &mut Header {
        // SAFETY: struct invariant; `&mut self` makes this the only live reference into the header.
        unsafe { &mut *self.base.cast::<Header>() }
    }

    fn hdr_ref(&self) -> &Header {
        // SAFETY: struct invariant; shared access while `&self` is held.
        unsafe { &*self.base.cast::<Header>() }
    }

    fn desc_ptr(&self, page: u32) -> *mut Desc {
        debug_assert!(page < self.hdr_ref().max_pages);
        // SAFETY: page < max_pages, so the descriptor lies inside the table (struct invariant).
        unsafe {
            self.base
                .add(PAGE_SIZE + page as usize * DESC_SIZE)
                .cast::<Desc>()
        }
    }

    fn desc(&self, page: u32) -> Desc {
        // SAFETY: desc_ptr is in bounds and 16-byte aligned (table starts on a page, 32-byte entries).
        unsafe { ptr::read(self.desc_ptr(page)) }
    }

    fn desc_mut(&mut self, page: u32) -> &mut Desc {
        // SAFETY: in bounds and aligned as above; `&mut self` makes it the only live reference.
        unsafe { &mut *self.desc_ptr(page) }
    }

    fn set_desc(&mut self, page: u32, d: Desc) {
        // SAFETY: in bounds and aligned as above.
        unsafe { ptr::write(self.desc_ptr(page), d) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: data_offset < capacity (Layout).
        unsafe { self.base.add(self.hdr_ref().data_offset as usize) }
    }

    fn page_ptr(&self, page: u32) -> *mut u8 {
        // SAFETY: page <= max_pages, so the address is inside or one past the data region.
        unsafe { self.data().add(page as usize * PAGE_SIZE) }
    }

    /// Data page holding `ptr`, if `ptr` lies inside the arena's extent.
    fn page_of(&self, ptr: *const u8) -> Option<u32> {
        let off = (ptr as usize).checked_sub(self.data() as usize)?;
        let page = off / PAGE_SIZE;
        (page < self.hdr_ref().top as usize).then_some(page as u32)
    }

    /// Allocator counters.
    pub fn counters(&self) -> HeapCounters {
        let h = self.hdr_ref();
        HeapCounters {
            requested: h.requested,
            peak_requested: h.peak_requested,
            allocated: h.allocated,
            live_blocks: h.live_blocks,
            failures: h.failures,
            top_pages: h.top,
            peak_top_pages: h.peak_top,
            limit_pages: h.limit_pages,
            max_pages: h.max_pages,
            data_offset: h.data_offset as usize,
            run_pages: h.run_pages,
        }
    }

    /// Byte length of the map that currently holds state: header plus descriptors up to `top`.
    pub fn meta_len(&self) -> usize {
        PAGE_SIZE + self.hdr_ref().top as usize * DESC_SIZE
    }

    /// Whether the header carries this allocator's magic and version.
    pub fn is_valid(&self) -> bool {
        let h = self.hdr_ref();
        h.magic == MAGIC && h.version == VERSION
    }

    /// Sets the limit on the bytes of live blocks, in pages (see `Header::limit_pages`).
    pub fn set_limit_pages(&mut self, pages: u32) {
        self.hdr().limit_pages = pages;
    }

    // ----- public operations -----

    /// Allocates `size` bytes (16-byte aligned) in placement group `group` (below
    /// [`NGROUPS`]; see there). Null when the limit or capacity is reached.
    #[inline]
    pub fn alloc(&mut self, size: usize, group: usize) -> *mut u8 {
        debug_assert!(group < NGROUPS);
        match self.alloc_fast(size, group) {
            Some(p) => p,
            None => self.alloc_general(size, group),
        }
    }

    /// The common case of [`Heap::alloc`], inline: a block of at most 256 bytes from the first
    /// span of its class's partial list, with nothing refused. The same decisions and counts
    /// as the general path (`alloc_small`'s own steps, `take_block`, then the counters of
    /// `alloc_block` and `alloc`); `None` when any condition fails, having changed nothing.
    /// (A load allocates about 18,000 blocks per MB: the general path's call levels cost a
    /// fifth of its instructions.)
    #[inline(always)]
    fn alloc_fast(&mut self, size: usize, group: usize) -> Option<*mut u8> {
        if size == 0 || size > 256 {
            return None;
        }
        let h = self.hdr_ref();
        if h.refuse_retry != 0 {
            return None;
        }
        let class = size.div_ceil(GRAIN) - 1; // class_of, for sizes up to 256
        let bytes = CLASS_SIZES[class] as u64;
        if !self.fits_limit(bytes) {
            return None;
        }
        let list = group * NCLASSES + class;
        let head = h.partial[list];
        if head == NIL {
            return None;
        }
        let p = self.take_block(list, head, class);
        self.count_block(bytes);
        self.count_request(size);
        Some(p)
    }

    /// Counts a block of `bytes` handed out (both paths).
    #[inline(always)]
    fn count_block(&mut self, bytes: u64) {
        let h = self.hdr();
        h.allocated += bytes;
        h.live_blocks += 1;
    }

    /// Counts a request of `size` bytes that was served (both paths).
    #[inline(always)]
    fn count_request(&mut self, size: usize) {
        let h = self.hdr();
        h.since_failure += size as u64;
        h.requested += size as u64;
        h.peak_requested = h.peak_requested.max(h.requested);
    }

    /// [`Heap::alloc`] for every case.
    #[inline(never)]
    fn alloc_general(&mut self, size: usize, group: usize) -> *mut u8 {
        if self.refuse_thrashing_retry() {
            return ptr::null_mut();
        }
        let p = self.alloc_block(size.max(1), group);
        if p.is_null() {
            self.note_failure();
        } else {
            self.count_request(size);
        }
        p
    }

    /// Counts a refused request and detects thrashing (see `THRASH_RUN`).
    fn note_failure(&mut self) {
        let h = self.hdr();
        h.failures += 1;
        let limit = h.limit_pages.min(h.max_pages) as u64 * PAGE_SIZE as u64;
        if h.since_failure < limit / THRASH_FRACTION {
            h.thrash += 1;
            if h.thrash >= THRASH_RUN {
                h.refuse_retry = 1;
            }
        } else {
            h.thrash = 0;
        }
        h.since_failure = 0;
    }

    /// Refuses the next growing request and the client's retry of it, so the running code
    /// runs out of memory (the bridge uses it when a Lua finalizer was lost to a memory error:
    /// a program waiting for it would otherwise wait forever).
    pub fn refuse_next_growth(&mut self) {
        let h = self.hdr();
        h.thrash = THRASH_RUN + 1;
        h.refuse_retry = 1;
    }

    /// Whether this request is the retry to refuse after thrashing (then the run starts over).
    fn refuse_thrashing_retry(&mut self) -> bool {
        let h = self.hdr();
        if h.refuse_retry == 0 {
            return false;
        }
        h.failures += 1;
        if h.thrash > THRASH_RUN {
            // refuse_next_growth: this is the request; its retry is refused next.
            h.thrash = THRASH_RUN;
        } else {
            h.refuse_retry = 0;
            h.thrash = 0;
            h.since_failure = 0;
        }
        true
    }

    /// Frees a block. Returns false (and changes nothing) if `ptr` is not a live block start.
    ///
    /// # Safety
    /// `ptr` must not be used after this call; `osize` should be the size last requested for it
    /// (it only feeds the requested-bytes counter).
    #[inline]
    pub unsafe fn free(&mut self, ptr: *mut u8, osize: usize) -> bool {
        if self.free_block(ptr) {
            let h = self.hdr();
            h.requested = h.requested.saturating_sub(osize as u64);
            true
        } else {
            false
        }
    }

    /// Resizes a block with Lua's semantics: shrinking never fails; growing may return null, and
    /// then the old block is untouched. `ptr` must be non-null and `nsize` non-zero.
    ///
    /// # Safety
    /// `ptr` must be a live block of this arena whose requested size was `osize`.
    pub unsafe fn realloc(&mut self, ptr: *mut u8, osize: usize, nsize: usize) -> *mut u8 {
        let Some(cap) = self.block_capacity(ptr) else {
            self.hdr().failures += 1;
            return ptr::null_mut();
        };
        if nsize > cap && self.refuse_thrashing_retry() {
            return ptr::null_mut();
        }
        let out = self.resize_block(ptr, cap, osize, nsize);
        let h = self.hdr();
        if out.is_null() {
            self.note_failure();
        } else {
            h.since_failure += nsize.saturating_sub(osize) as u64;
            h.requested = (h.requested + nsize as u64).saturating_sub(osize as u64);
            h.peak_requested = h.peak_requested.max(h.requested);
        }
        out
    }

    /// Usable bytes of the live block starting at `ptr`, or `None` if `ptr` is not one.
    pub fn block_capacity(&self, ptr: *const u8) -> Option<usize> {
        let page = self.page_of(ptr)?;
        let d = self.desc(page);
        match d.kind() {
            Kind::Large if std::ptr::eq(ptr, self.page_ptr(page)) => {
                Some(d.len as usize * PAGE_SIZE)
            }
            Kind::SmallHead | Kind::SmallInner => {
                let head = if d.kind() == Kind::SmallHead {
                    page
                } else {
                    d.len
                };
                let hd = self.desc(head);
                let size = CLASS_SIZES[hd.class as usize] as usize;
                let off = ptr as usize - self.page_ptr(head) as usize;
                (off % size == 0 && ((off / size) as u32) < hd.bump).then_some(size)
            }
            _ => None,
        }
    }

    // ----- blocks -----

    fn alloc_block(&mut self, size: usize, group: usize) -> *mut u8 {
        let (p, bytes) = if size <= MAX_SMALL {
            let c = class_of(size);
            let bytes = CLASS_SIZES[c] as usize;
            if !self.fits_limit(bytes as u64) {
                return ptr::null_mut();
            }
            (self.alloc_small(c, group), bytes)
        } else {
            let pages = size.div_ceil(PAGE_SIZE);
            if pages >= NIL as usize || !self.fits_limit((pages * PAGE_SIZE) as u64) {
                return ptr::null_mut();
            }
            (self.alloc_large(pages as u32), pages * PAGE_SIZE)
        };
        if !p.is_null() {
            self.count_block(bytes as u64);
        }
        p
    }

    /// Whether live blocks of `bytes` more stay within the limit.
    #[inline]
    fn fits_limit(&self, bytes: u64) -> bool {
        let h = self.hdr_ref();
        h.allocated + bytes <= (h.limit_pages as u64 + self.moving as u64) * PAGE_SIZE as u64
    }

    /// Whether `pages` more held pages stay within `HELD_FACTOR` times the limit (plus
    /// `HELD_SLACK_PAGES`).
    fn fits_held(&self, pages: u32) -> bool {
        let h = self.hdr_ref();
        h.run_pages as u64 + pages as u64
            <= h.limit_pages as u64 * HELD_FACTOR + HELD_SLACK_PAGES + self.moving as u64
    }

    fn free_block(&mut self, ptr: *mut u8) -> bool {
        let Some(cap) = self.block_capacity(ptr) else {
            return false;
        };
        let page = self.page_of(ptr).expect("block_capacity checked the page");
        let d = self.desc(page);
        match d.kind() {
            Kind::Large => self.free_run(page, d.len),
            _ => {
                let head = if d.kind() == Kind::SmallHead {
                    page
                } else {
                    d.len
                };
                self.free_small(head, ptr);
            }
        }
        let h = self.hdr();
        h.allocated -= cap as u64;
        h.live_blocks -= 1;
        true
    }

    fn resize_block(&mut self, ptr: *mut u8, cap: usize, osize: usize, nsize: usize) -> *mut u8 {
        let page = self.page_of(ptr).expect("caller checked the block");
        let is_large = self.desc(page).kind() == Kind::Large;
        // A block moved to another class stays in its group.
        let group = self.group_of(page);
        if !is_large {
            if nsize <= MAX_SMALL && CLASS_SIZES[class_of(nsize)] as usize == cap {
                return ptr;
            }
        } else if nsize > MAX_SMALL {
            let old_pages = (cap / PAGE_SIZE) as u32;
            let want = nsize.div_ceil(PAGE_SIZE);
            if want >= NIL as usize {
                return ptr::null_mut();
            }
            let want = want as u32;
            if want <= old_pages {
                self.shrink_large(page, old_pages, want);
                return ptr;
            }
            if self.grow_large_in_place(page, old_pages, want) {
                return ptr;
            }
            if let Some(head) = self.grow_large_leftwards(page, old_pages, want, osize.min(cap)) {
                return self.page_ptr(head);
            }
        }
        // A large block moved by a reallocation is charged only its growth against the limit:
        // its old pages are given back right after the copy (glibc's realloc of a big chunk
        // moves it with mremap and never holds both either).
        let lift = if is_large {
            (cap / PAGE_SIZE) as u32
        } else {
            0
        };
        self.moving = lift;
        let fresh = self.alloc_block(nsize, group);
        self.moving = 0;
        if fresh.is_null() {
            if nsize < cap {
                // Shrinking never fails: keep the block (a large one gives back its tail pages).
                if is_large {
                    let keep = nsize.div_ceil(PAGE_SIZE).max(1) as u32;
                    self.shrink_large(page, (cap / PAGE_SIZE) as u32, keep);
                }
                return ptr;
            }
            return ptr::null_mut();
        }
        // SAFETY: both blocks are live, distinct and at least min(cap, nsize) bytes long.
        unsafe { ptr::copy_nonoverlapping(ptr, fresh, osize.min(nsize).min(cap)) };
        let freed = self.free_block(ptr);
        debug_assert!(freed);
        fresh
    }

    fn shrink_large(&mut self, head: u32, old_pages: u32, new_pages: u32) {
        if new_pages == old_pages {
            return;
        }
        self.set_large(head, new_pages);
        self.hdr().allocated -= ((old_pages - new_pages) as usize * PAGE_SIZE) as u64;
        self.free_run(head + new_pages, old_pages - new_pages);
    }

    fn grow_large_in_place(&mut self, head: u32, old_pages: u32, want: u32) -> bool {
        let extra = want - old_pages;
        let end = head + old_pages;
        let h = self.hdr_ref();
        let (top, max) = (h.top, h.max_pages);
        if !self.fits_limit((extra as usize * PAGE_SIZE) as u64) || !self.fits_held(extra) {
            return false;
        }
        if end == top {
            if (top as u64 + extra as u64) > max as u64 {
                return false;
            }
            self.grow_top(top + extra);
        } else {
            let next = self.desc(end);
            if next.kind() != Kind::FreeHead || next.len < extra {
                return false;
            }
            self.bin_remove(end);
            if next.len > extra {
                self.insert_free(end + extra, next.len - extra);
            }
        }
        self.set_large(head, want);
        let h = self.hdr();
        h.allocated += (extra as usize * PAGE_SIZE) as u64;
        h.run_pages += extra;
        true
    }

    /// Grows a large block into the free run on its left (and, if that is not enough, the
    /// free run or wilderness on its right), moving its first `keep` bytes down. Arrays grow by
    /// reallocation; without this, each move leaves a hole just below the new block that the
    /// next, bigger growth cannot use. Returns the new head page.
    fn grow_large_leftwards(
        &mut self,
        head: u32,
        old_pages: u32,
        want: u32,
        keep: usize,
    ) -> Option<u32> {
        if head == 0 {
            return None;
        }
        let left = self.desc(head - 1);
        let lhead = match left.kind() {
            Kind::FreeHead => head - 1,
            Kind::FreeTail => left.len,
            _ => return None,
        };
        let llen = self.desc(lhead).len;
        let end = head + old_pages;
        let h = self.hdr_ref();
        let (top, limit) = (h.top, h.max_pages);
        let extra = want - old_pages;
        if !self.fits_limit((extra as usize * PAGE_SIZE) as u64) || !self.fits_held(extra) {
            return None;
        }
        let have = llen + old_pages;
        let need_right = want.saturating_sub(have);
        if need_right > 0 {
            let room = if end == top {
                limit.saturating_sub(top)
            } else {
                let next = self.desc(end);
                if next.kind() == Kind::FreeHead {
                    next.len
                } else {
                    0
                }
            };
            if room < need_right {
                return None;
            }
        }
        self.bin_remove(lhead);
        if need_right > 0 {
            if end == top {
                self.grow_top(top + need_right);
            } else {
                let rlen = self.desc(end).len;
                self.bin_remove(end);
                if rlen > need_right {
                    self.insert_free(end + need_right, rlen - need_right);
                }
            }
        }
        // SAFETY: source and destination lie in pages [lhead, end + need_right), all owned by
        // this block or free; `copy` handles the overlap.
        unsafe { ptr::copy(self.page_ptr(head), self.page_ptr(lhead), keep) };
        self.set_large(lhead, want);
        // The block now holds `want` pages; free_run below takes back the pages it frees.
        self.hdr().run_pages += want - old_pages;
        if need_right == 0 && lhead + want < end {
            let tail = end - (lhead + want);
            self.hdr().run_pages += tail;
            self.free_run(lhead + want, tail);
        }
        self.hdr().allocated += ((want - old_pages) as usize * PAGE_SIZE) as u64;
        Some(lhead)
    }

    fn set_large(&mut self, head: u32, pages: u32) {
        self.set_desc(head, Desc::new(Kind::Large, pages));
        if pages > 1 {
            self.set_desc(head + pages - 1, Desc::new(Kind::LargeTail, head));
        }
    }

    fn alloc_large(&mut self, pages: u32) -> *mut u8 {
        let Some(head) = self.alloc_run(pages) else {
            return ptr::null_mut();
        };
        self.set_large(head, pages);
        self.page_ptr(head)
    }

    // ----- small blocks -----

    fn block_ptr(&self, head: u32, index: u32, size: usize) -> *mut u8 {
        // SAFETY: index < blocks_per_span, so the block lies inside the span.
        unsafe { self.page_ptr(head).add(index as usize * size) }
    }

    /// The group of the block on `page` (0 for large blocks, which have none).
    fn group_of(&self, page: u32) -> usize {
        let d = self.desc(page);
        match d.kind() {
            Kind::SmallHead => d.group as usize,
            Kind::SmallInner => self.desc(d.len).group as usize,
            _ => 0,
        }
    }

    fn alloc_small(&mut self, class: usize, group: usize) -> *mut u8 {
        let list = group * NCLASSES + class;
        let mut head = self.hdr_ref().partial[list];
        if head == NIL {
            let pages = SPAN_PAGES[class];
            let Some(h) = self.alloc_run(pages) else {
                return ptr::null_mut();
            };
            let mut d = Desc::new(Kind::SmallHead, pages);
            d.class = class as u8;
            d.group = group as u8;
            self.set_desc(h, d);
            for p in h + 1..h + pages {
                self.set_desc(p, Desc::new(Kind::SmallInner, h));
            }
            self.push_partial(list, h);
            head = h;
        }
        self.take_block(list, head, class)
    }

    /// Hands out a block of the span `head`, the first of the partial list `list` (of size
    /// class `class`): its first free block, else its next never-used one; unlinks the span
    /// once it is full.
    #[inline(always)]
    fn take_block(&mut self, list: usize, head: u32, class: usize) -> *mut u8 {
        let size = CLASS_SIZES[class] as usize;
        let d = self.desc(head);
        let index = if d.free != NIL {
            // SAFETY: a free block holds the next free index in its first 4 aligned bytes.
            let next = unsafe { ptr::read(self.block_ptr(head, d.free, size).cast::<u32>()) };
            self.desc_mut(head).free = next;
            d.free
        } else {
            self.desc_mut(head).bump += 1;
            d.bump
        };
        let dm = self.desc_mut(head);
        dm.live += 1;
        if dm.live == blocks_per_span(class) {
            self.unlink_partial(list, head);
        }
        self.block_ptr(head, index, size)
    }

    fn free_small(&mut self, head: u32, ptr: *mut u8) {
        let d = self.desc(head);
        let class = d.class as usize;
        let list = d.group as usize * NCLASSES + class;
        let size = CLASS_SIZES[class] as usize;
        let index = ((ptr as usize - self.page_ptr(head) as usize) / size) as u32;
        // SAFETY: ptr is a live block of this span (checked by block_capacity), at least 16 bytes.
        unsafe { ptr::write(ptr.cast::<u32>(), d.free) };
        let was_full = d.live == blocks_per_span(class);
        {
            let dm = self.desc_mut(head);
            dm.free = index;
            dm.live -= 1;
        }
        if was_full {
            self.push_partial(list, head);
        }
        if d.live - 1 == 0 {
            let only = self.hdr_ref().partial[list] == head && self.desc(head).next == NIL;
            if only && SPAN_PAGES[class] == 1 {
                // Keep one empty one-page span per class, so alloc/free churn at a span boundary
                // doesn't thrash the page heap; bigger spans (big classes, rarely churned) go back
                // at once rather than pin their pages. Reset it to fill front to back again.
                let dm = self.desc_mut(head);
                dm.free = NIL;
                dm.bump = 0;
            } else {
                self.unlink_partial(list, head);
                self.free_run(head, d.len);
            }
        }
    }

    /// `list` is `group * NCLASSES + class`.
    fn push_partial(&mut self, list: usize, head: u32) {
        let first = self.hdr_ref().partial[list];
        {
            let d = self.desc_mut(head);
            d.prev = NIL;
            d.next = first;
        }
        if first != NIL {
            self.desc_mut(first).prev = head;
        }
        self.hdr().partial[list] = head;
    }

    fn unlink_partial(&mut self, list: usize, head: u32) {
        let d = self.desc(head);
        if d.prev != NIL {
            self.desc_mut(d.prev).next = d.next;
        } else {
            self.hdr().partial[list] = d.next;
        }
        if d.next != NIL {
            self.desc_mut(d.next).prev = d.prev;
        }
        let dm = self.desc_mut(head);
        dm.prev = NIL;
        dm.next = NIL;
    }

    // ----- page runs -----

    /// Grows the extent. Pages entering it are zeroed: what lies above `top` is leftovers of
    /// whatever history wrote it (frames later rolled back, blocks freed to the wilderness),
    /// and bytes a block's owner never writes (struct padding) must not depend on that history,
    /// or two runs reaching the same state would differ byte for byte.
    fn grow_top(&mut self, top: u32) {
        let old = self.hdr_ref().top;
        debug_assert!(top > old);
        // SAFETY: pages [old, top) and their descriptors lie inside the arena (top <= max_pages,
        // checked by the callers against limit and max_pages) and belong to no block or run.
        // Descriptors too: a new run writes only its head and tail, and the interior ones are
        // part of the map's state bytes.
        unsafe {
            ptr::write_bytes(self.page_ptr(old), 0, (top - old) as usize * PAGE_SIZE);
            ptr::write_bytes(
                self.desc_ptr(old).cast::<u8>(),
                0,
                (top - old) as usize * DESC_SIZE,
            );
        }
        let h = self.hdr();
        h.top = top;
        h.peak_top = h.peak_top.max(top);
    }

    /// Address-ordered fit: of the free runs large enough, the one at the lowest address.
    /// Lower runs fill first, so high ones stay free, merge, and return to the wilderness;
    /// this keeps fragmentation lowest in practice (Johnstone & Wilson, ISMM '98). Runs are few
    /// (they are maximal and spans/large blocks are rare), so the scan is cheap.
    fn alloc_run(&mut self, pages: u32) -> Option<u32> {
        // The limit itself (on live bytes) was checked by the caller for the block it serves.
        if !self.fits_held(pages) {
            return None;
        }
        let first_bin = bin_of(pages);
        let mut map = self.hdr_ref().bin_map & (!0u64 << first_bin);
        let mut best: Option<(u32, u32)> = None;
        while map != 0 {
            let bin = map.trailing_zeros() as usize;
            let mut run = self.hdr_ref().bins[bin];
            while run != NIL {
                let d = self.desc(run);
                if d.len >= pages && best.is_none_or(|(b, bl)| (d.len, run) < (bl, b)) {
                    best = Some((run, d.len));
                }
                run = d.next;
            }
            map &= map - 1;
            if best.is_some() {
                break; // every run in a higher bin is larger than one found here
            }
        }
        if let Some((run, len)) = best {
            self.bin_remove(run);
            if len > pages {
                self.insert_free(run + pages, len - pages);
            }
            self.hdr().run_pages += pages;
            return Some(run);
        }
        // Nothing free fits: extend the extent (no free run ever ends at `top`).
        let h = self.hdr_ref();
        let top = h.top;
        if top as u64 + pages as u64 > h.max_pages as u64 {
            return None;
        }
        self.grow_top(top + pages);
        self.hdr().run_pages += pages;
        Some(top)
    }

    /// Returns pages held by a block or span to the free runs (they stop counting against the
    /// limit).
    fn free_run(&mut self, mut start: u32, mut pages: u32) {
        self.hdr().run_pages -= pages;
        let freed = start..start + pages;
        if start > 0 {
            let left = self.desc(start - 1);
            let left_head = match left.kind() {
                Kind::FreeHead => Some(start - 1),
                Kind::FreeTail => Some(left.len),
                _ => None,
            };
            if let Some(h) = left_head {
                let len = self.desc(h).len;
                self.bin_remove(h);
                start = h;
                pages += len;
            }
        }
        let end = start + pages;
        if end == self.hdr_ref().top {
            self.hdr().top = start;
            return;
        }
        // Free runs are zero (module docs); the runs merged with this one are already.
        // SAFETY: pages `freed` lie below `top` (inside the arena) and belong to no block any
        // more: the caller gave them back, and nothing else points into them.
        unsafe { ptr::write_bytes(self.page_ptr(freed.start), 0, freed.len() * PAGE_SIZE) };
        let right = self.desc(end);
        if right.kind() == Kind::FreeHead {
            self.bin_remove(end);
            pages += right.len;
        }
        self.insert_free(start, pages);
    }

    /// The free runs below `top`, as page ranges, in no particular order. Their bytes are zero
    /// (module docs). Walks the bins: free runs are few (maximal, between spans and large
    /// blocks).
    pub fn for_each_free_run(&self, mut f: impl FnMut(Range<u32>)) {
        let h = self.hdr_ref();
        let mut map = h.bin_map;
        while map != 0 {
            let bin = map.trailing_zeros() as usize;
            let mut run = h.bins[bin];
            while run != NIL {
                let d = self.desc(run);
                f(run..run + d.len);
                run = d.next;
            }
            map &= map - 1;
        }
    }

    fn insert_free(&mut self, start: u32, pages: u32) {
        let bin = bin_of(pages);
        let first = self.hdr_ref().bins[bin];
        let mut d = Desc::new(Kind::FreeHead, pages);
        d.next = first;
        self.set_desc(start, d);
        if first != NIL {
            self.desc_mut(first).prev = start;
        }
        if pages > 1 {
            self.set_desc(start + pages - 1, Desc::new(Kind::FreeTail, start));
        }
        let h = self.hdr();
        h.bins[bin] = start;
        h.bin_map |= 1 << bin;
    }

    fn bin_remove(&mut self, start: u32) {
        let d = self.desc(start);
        let bin = bin_of(d.len);
        if d.prev != NIL {
            self.desc_mut(d.prev).next = d.next;
        } else {
            self.hdr().bins[bin] = d.next;
        }
        if d.next != NIL {
            self.desc_mut(d.next).prev = d.prev;
        }
        // Retag so a stale FreeHead can never be mistaken for a neighbour to merge with.
        self.desc_mut(start).kind = Kind::Unused as u8;
        let h = self.hdr();
        if h.bins[bin] == NIL {
            h.bin_map &= !(1 << bin);
        }
    }

    /// What holds data page `page` (below `top`), from its descriptor.
    pub fn page_owner(&self, page: u32) -> PageOwner {
        if page >= self.hdr_ref().top {
            return PageOwner::Outside;
        }
        let d = self.desc(page);
        let head = match d.kind() {
            Kind::SmallHead => d,
            Kind::SmallInner => self.desc(d.len),
            // Interior pages of free runs and large blocks carry stale descriptors; a free
            // run's first and last pages say so, and no other page is read as one.
            Kind::FreeHead | Kind::FreeTail => return PageOwner::Free,
            _ => return PageOwner::Large,
        };
        PageOwner::Span {
            block_size: CLASS_SIZES[head.class as usize],
            group: head.group,
        }
    }

    /// The blocks of the span holding data page `page`: the span's first page, its block
    /// size, and for each block whether it is live (handed out and not freed). `None` for a
    /// page that is not part of a span. For diagnostics (which blocks a frame wrote).
    pub fn span_blocks(&self, page: u32) -> Option<SpanBlocks> {
        if page >= self.hdr_ref().top {
            return None;
        }
        let d = self.desc(page);
        let head = match d.kind() {
            Kind::SmallHead => page,
            Kind::SmallInner => d.len,
            _ => return None,
        };
        let hd = self.desc(head);
        let class = hd.class as usize;
        let size = CLASS_SIZES[class] as usize;
        let n = blocks_per_span(class);
        let mut live: Vec<bool> = (0..n).map(|i| i < hd.bump).collect();
        let mut idx = hd.free;
        let mut steps = 0;
        while idx != NIL && idx < n && steps <= n {
            live[idx as usize] = false;
            // SAFETY: idx < blocks_per_span, so the block lies inside the span; a free block
            // holds the next free index in its first 4 aligned bytes.
            idx = unsafe { ptr::read(self.block_ptr(head, idx, size).cast::<u32>()) };
            steps += 1;
        }
        Some(SpanBlocks {
            head_page: head,
            block_size: size as u32,
            live,
        })
    }

    /// Where the extent's bytes go, by walking the map.
    pub fn usage(&self) -> HeapUsage {
        let top = self.hdr_ref().top;
        let mut u = HeapUsage::default();
        let mut p = 0u32;
        while p < top {
            let d = self.desc(p);
            let bytes = d.len as u64 * PAGE_SIZE as u64;
            match d.kind() {
                Kind::FreeHead => u.free_runs += bytes,
                Kind::Large => u.large_blocks += bytes,
                Kind::SmallHead => {
                    let class = d.class as usize;
                    let size = CLASS_SIZES[class] as u64;
                    let used = d.live as u64 * size;
                    let slots = blocks_per_span(class) as u64 * size;
                    u.small_blocks += used;
                    u.span_free += slots - used;
                    u.span_tails += bytes - slots;
                    if d.live == 0 {
                        u.empty_spans += bytes;
                    }
                }
                _ => break,
            }
            p += d.len.max(1);
        }
        u
    }

    // ----- consistency check -----

    /// Walks the whole map and checks every invariant listed in the module docs.
    pub fn verify(&self) -> Result<(), CorruptionError> {
        if !self.is_valid() {
            return corrupt(0, "header magic or version does not match".into());
        }
        let h = self.hdr_ref();
        if h.top > h.max_pages || h.top > h.peak_top {
            let (top, max, peak) = (h.top, h.max_pages, h.peak_top);
            return corrupt(top, format!("top {top} beyond max {max} or peak {peak}"));
        }
        let walk = self.verify_runs()?;
        if walk.held != h.run_pages as u64 {
            let counted = h.run_pages;
            return corrupt(
                0,
                format!("header counts {counted} held pages, map has {}", walk.held),
            );
        }
        if walk.allocated != h.allocated || walk.live != h.live_blocks {
            let (bytes, blocks) = (h.allocated, h.live_blocks);
            return corrupt(
                0,
                format!(
                    "header counts {bytes} bytes in {blocks} blocks, map has {} in {}",
                    walk.allocated, walk.live
                ),
            );
        }
        self.verify_bins(walk.free_runs)?;
        self.verify_partial_lists(&walk.partial_spans)
    }

    /// Walks the runs from page 0 to the top: each fits, no two free runs touch, spans and
    /// runs are well formed (see [`Heap::verify_span`]); returns what the header must agree with.
    fn verify_runs(&self) -> Result<RunWalk, CorruptionError> {
        let top = self.hdr_ref().top;
        let mut walk = RunWalk {
            free_runs: 0,
            allocated: 0,
            live: 0,
            held: 0,
            partial_spans: [0; NCLASSES * NGROUPS],
        };
        let mut prev_free = false;
        let mut p = 0u32;
        while p < top {
            let d = self.desc(p);
            let len = d.len;
            if len == 0 || p as u64 + len as u64 > top as u64 {
                return corrupt(
                    p,
                    format!("run of {len} pages does not fit below top {top}"),
                );
            }
            let tail_kind = match d.kind() {
                Kind::FreeHead if prev_free => {
                    return corrupt(p, "two adjacent free runs".into());
                }
                Kind::FreeHead => {
                    walk.free_runs += 1;
                    // SAFETY: pages [p, p + len) lie below `top` (checked above), inside the
                    // arena; reading them races with nothing (the struct's invariant).
                    let bytes = unsafe {
                        std::slice::from_raw_parts(self.page_ptr(p), len as usize * PAGE_SIZE)
                    };
                    if bytes.iter().any(|&b| b != 0) {
                        return corrupt(p, format!("free run of {len} pages is not zero"));
                    }
                    Kind::FreeTail
                }
                Kind::Large => {
                    walk.allocated += len as u64 * PAGE_SIZE as u64;
                    walk.live += 1;
                    walk.held += len as u64;
                    Kind::LargeTail
                }
                Kind::SmallHead => {
                    self.verify_span(p, &d, &mut walk)?;
                    Kind::SmallInner
                }
                other => return corrupt(p, format!("run starts with a {other:?} descriptor")),
            };
            if len > 1 && tail_kind != Kind::SmallInner {
                let t = self.desc(p + len - 1);
                if t.kind() != tail_kind || t.len != p {
                    let (kind, to) = (t.kind(), t.len);
                    return corrupt(
                        p + len - 1,
                        format!("run tail is {kind:?} pointing to {to}"),
                    );
                }
            }
            prev_free = d.kind() == Kind::FreeHead;
            p += len;
        }
        if prev_free {
            return corrupt(top, "a free run ends at top".into());
        }
        Ok(walk)
    }

    /// Checks the span whose head descriptor `d` is at page `p`: its class, group and length,
    /// its inner pages pointing back to it, its counts, and its free list (inside the span,
    /// acyclic, and as long as the counts say). Adds its blocks to `walk`.
    fn verify_span(&self, p: u32, d: &Desc, walk: &mut RunWalk) -> Result<(), CorruptionError> {
        let (class, len, group) = (d.class as usize, d.len, d.group);
        if class >= NCLASSES || len != SPAN_PAGES[class] || group as usize >= NGROUPS {
            return corrupt(
                p,
                format!("span with class {class}, group {group} and {len} pages"),
            );
        }
        walk.held += len as u64;
        for q in p + 1..p + len {
            let inner = self.desc(q);
            if inner.kind() != Kind::SmallInner || inner.len != p {
                return corrupt(q, "span page does not point to its head".into());
            }
        }
        let blocks = blocks_per_span(class);
        let (live, bump) = (d.live, d.bump);
        if live > blocks || bump > blocks || live > bump {
            return corrupt(
                p,
                format!("span counts live {live} bump {bump} of {blocks}"),
            );
        }
        let size = CLASS_SIZES[class] as usize;
        let mut free_count = 0u32;
        let mut idx = d.free;
        while idx != NIL {
            if idx >= bump || free_count > bump {
                return corrupt(p, "span free list leaves the span or cycles".into());
            }
            free_count += 1;
            // SAFETY: idx < bump <= blocks, so the block is inside the span.
            idx = unsafe { ptr::read(self.block_ptr(p, idx, size).cast::<u32>()) };
        }
        if free_count + live != bump {
            return corrupt(
                p,
                format!("span has {live} live + {free_count} free of {bump} used"),
            );
        }
        if live < blocks {
            walk.partial_spans[group as usize * NCLASSES + class] += 1;
        }
        walk.allocated += live as u64 * size as u64;
        walk.live += live as u64;
        Ok(())
    }

    /// Checks the free bins: each listed run is a free head of the bin's size, the back links
    /// agree, the bin map's bits match, and together they list every free run of the map.
    fn verify_bins(&self, free_runs: u64) -> Result<(), CorruptionError> {
        let h = self.hdr_ref();
        let mut listed = 0u64;
        for bin in 0..NBINS {
            let mut run = h.bins[bin];
            let mut prev = NIL;
            if (run != NIL) != (h.bin_map >> bin & 1 == 1) {
                return corrupt(0, format!("bin map bit {bin} disagrees with the bin"));
            }
            while run != NIL {
                if run >= h.top || listed > free_runs {
                    return corrupt(run, format!("free bin {bin} leaves the extent or cycles"));
                }
                let d = self.desc(run);
                if d.kind() != Kind::FreeHead || bin_of(d.len) != bin || d.prev != prev {
                    return corrupt(run, format!("free bin {bin} holds a bad entry"));
                }
                listed += 1;
                prev = run;
                run = d.next;
            }
        }
        if listed != free_runs {
            return corrupt(0, format!("{free_runs} free runs but {listed} in bins"));
        }
        Ok(())
    }

    /// Checks each partial-span list: it holds exactly the spans of its class and group that
    /// have room (`expected`, counted by the run walk), and nothing else.
    fn verify_partial_lists(&self, expected: &[u32]) -> Result<(), CorruptionError> {
        let h = self.hdr_ref();
        for (list, &expected) in expected.iter().enumerate() {
            let (group, class) = (list / NCLASSES, list % NCLASSES);
            let mut count = 0;
            let mut span = h.partial[list];
            while span != NIL {
                let d = self.desc(span);
                if span >= h.top
                    || count > expected
                    || d.kind() != Kind::SmallHead
                    || d.class as usize != class
                    || d.group as usize != group
                {
                    return corrupt(
                        span,
                        format!("partial list of class {class}, group {group} holds a bad entry"),
                    );
                }
                count += 1;
                span = d.next;
            }
            if count != expected {
                return corrupt(
                    0,
                    format!(
                        "class {class}, group {group} has {expected} spans with room, {count} listed"
                    ),
                );
            }
        }
        Ok(())
    }
}

/// What [`Heap::verify_runs`] counted on its walk, for the header and lists to agree with.
struct RunWalk {
    free_runs: u64,
    /// Bytes of live blocks (small ones at their class size, large ones in whole pages).
    allocated: u64,
    live: u64,
    /// Pages held by spans and large runs.
    held: u64,
    /// Spans with room, by `group * NCLASSES + class`.
    partial_spans: [u32; NCLASSES * NGROUPS],
}

fn corrupt<T>(page: u32, what: String) -> Result<T, CorruptionError> {
    Err(CorruptionError { page, what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_small_size_tightly() {
        for size in 1..=MAX_SMALL {
            let c = class_of(size);
            let got = CLASS_SIZES[c] as usize;
            assert!(got >= size, "size {size} got class {got}");
            if c > 0 {
                assert!(
                    (CLASS_SIZES[c - 1] as usize) < size,
                    "size {size} not in smallest class"
                );
            }
            assert_eq!(got % GRAIN, 0);
        }
    }

    #[test]
    fn spans_waste_little() {
        for c in 0..NCLASSES {
            let bytes = SPAN_PAGES[c] as usize * PAGE_SIZE;
            let waste = bytes % CLASS_SIZES[c] as usize;
            assert!(
                waste * 16 <= bytes,
                "class {} wastes {waste} of {bytes}",
                CLASS_SIZES[c]
            );
            assert!(blocks_per_span(c) >= 1);
        }
    }

    /// `verify` finds each kind of damage it claims to check, and passes the undamaged heap:
    /// a checker that never fails would let every allocator test pass on a broken map.
    #[test]
    fn verify_finds_each_kind_of_damage() {
        use crate::mapping::Reservation;
        let cap = 8 << 20;
        let layout = Layout::for_capacity(cap).unwrap();
        type Damage = fn(&mut Heap, &Offsets);
        let damages: [(&str, Damage); 9] = [
            ("top beyond peak", |h, _| {
                h.hdr().top = h.hdr_ref().peak_top + 1
            }),
            ("held pages", |h, _| h.hdr().run_pages += 1),
            ("live bytes", |h, _| h.hdr().allocated += 16),
            ("span class", |h, o| {
                h.desc_mut(o.span).class = NCLASSES as u8
            }),
            ("span counts", |h, o| h.desc_mut(o.span).live += 1),
            ("inner page", |h, o| h.desc_mut(o.span + 1).len += 1),
            ("free bin link", |h, o| h.desc_mut(o.free).prev = 0),
            ("bin map", |h, _| h.hdr().bin_map = !h.hdr_ref().bin_map),
            ("partial list", |h, o| {
                let list = o.span_group * NCLASSES + o.span_class;
                h.hdr().partial[list] = NIL;
            }),
        ];
        for (name, damage) in damages {
            let map = Reservation::new(cap, None).unwrap();
            // SAFETY: a fresh writable mapping of `cap` bytes laid out by `layout`, used only here.
            let mut h = unsafe { Heap::init(map.base().as_ptr(), cap, layout, u32::MAX) };
            // The smallest class whose spans have more than one page.
            let class = (0..NCLASSES).find(|&c| SPAN_PAGES[c] > 1).unwrap();
            let size = CLASS_SIZES[class] as usize;
            let small: Vec<_> = (0..8).map(|_| h.alloc(size, 0)).collect();
            let big = [h.alloc(40_000, 0), h.alloc(40_000, 0), h.alloc(40_000, 0)];
            assert!(small.iter().chain(&big).all(|p| !p.is_null()));
            // SAFETY: live blocks of this heap, each freed once, at the size asked.
            unsafe {
                assert!(h.free(small[3], size));
                assert!(h.free(big[1], 40_000));
            }
            h.verify().unwrap();
            let data = h.data() as usize;
            let page = |p: *mut u8| ((p as usize - data) / PAGE_SIZE) as u32;
            let span = page(small[0]);
            let d = h.desc(span);
            let offsets = Offsets {
                span,
                span_class: d.class as usize,
                span_group: d.group as usize,
                free: page(big[1]),
            };
            assert_eq!(h.desc(offsets.free).kind(), Kind::FreeHead, "{name}: setup");
            damage(&mut h, &offsets);
            assert!(h.verify().is_err(), "verify missed damage: {name}");
        }
    }

    /// Pages of the blocks a damage test breaks.
    struct Offsets {
        span: u32,
        span_class: usize,
        span_group: usize,
        free: u32,
    }

    #[test]
    fn bins_are_monotonic() {
        let mut last = 0;
        for n in 1..100_000u32 {
            let b = bin_of(n);
            assert!(b >= last && b < NBINS);
            last = b;
        }
        assert!(bin_of(u32::MAX - 1) < NBINS);
    }

    /// The inline path (`alloc_fast`) against the general one: two heaps given the same
    /// random requests (sizes across the small classes and a few large, both groups, frees
    /// of random live blocks, a limit that refuses some), one allocating through `alloc` and
    /// the other through `alloc_general` alone, hand out the same offsets and end with the
    /// same header and descriptor bytes.
    #[test]
    fn the_inline_path_decides_as_the_general_one() {
        use crate::mapping::Reservation;
        let cap = 16 << 20;
        let layout = Layout::for_capacity(cap).unwrap();
        let limit_pages = 1024; // 4 MiB of live blocks: some requests are refused
        let maps = [
            Reservation::new(cap, None).unwrap(),
            Reservation::new(cap, None).unwrap(),
        ];
        // SAFETY: fresh writable mappings of `cap` bytes laid out by `layout`, used only here.
        let mut heaps = maps
            .each_ref()
            .map(|m| unsafe { Heap::init(m.base().as_ptr(), cap, layout, limit_pages) });
        let mut live: Vec<(usize, usize)> = Vec::new(); // (offset, size)
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut fast, mut refused) = (0, 0);
        for _ in 0..200_000 {
            let r = next();
            if r % 3 == 0 && !live.is_empty() {
                let (off, size) = live.swap_remove((r >> 8) as usize % live.len());
                for h in heaps.iter_mut() {
                    // SAFETY: a live block of this heap, freed once.
                    assert!(unsafe { h.free(h.base.add(off), size) });
                }
                continue;
            }
            let size = match r >> 60 {
                0 => 257 + (r >> 8) as usize % 40_000,
                1 => (r >> 8) as usize % 4, // 0 included: the general path's case
                _ => 1 + (r >> 8) as usize % 256,
            };
            let group = (r >> 40) as usize % NGROUPS;
            let took_fast = heaps[0].hdr_ref().refuse_retry == 0
                && (1..=256).contains(&size)
                && heaps[0].hdr_ref().partial[group * NCLASSES + class_of(size)] != NIL;
            let a = heaps[0].alloc(size, group);
            let b = heaps[1].alloc_general(size, group);
            let off_a = (!a.is_null()).then(|| a as usize - heaps[0].base as usize);
            let off_b = (!b.is_null()).then(|| b as usize - heaps[1].base as usize);
            assert_eq!(off_a, off_b, "request {size} in group {group}");
            match off_a {
                Some(off) => {
                    live.push((off, size));
                    fast += took_fast as u32;
                }
                None => refused += 1,
            }
        }
        assert!(
            fast > 10_000 && refused > 0,
            "fast {fast}, refused {refused}"
        );
        let state = |h: &Heap| {
            // SAFETY: the header page and the descriptor table lie inside the mapping.
            unsafe { std::slice::from_raw_parts(h.base, layout.data_offset) }.to_vec()
        };
        assert!(
            state(&heaps[0]) == state(&heaps[1]),
            "header or descriptors differ"
        );
    }

    #[test]
    fn layout_fits() {
        for cap in [3 * PAGE_SIZE, 64 << 10, 1 << 20, 100 << 20, 1 << 32] {
            let l = Layout::for_capacity(cap).unwrap();
            assert!(l.data_offset + l.max_pages as usize * PAGE_SIZE <= cap);
            assert!(PAGE_SIZE + l.max_pages as usize * DESC_SIZE <= l.data_offset);
        }
        assert!(Layout::for_capacity(PAGE_SIZE).is_none());
    }
}
