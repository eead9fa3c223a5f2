//! The arena and its allocator: placement, bad input, exhaustion, Lua's `lua_Alloc` semantics,
//! and random operation sequences checked against a model.

use luasnap_alloc::{Arena, ArenaError, MAX_CAPACITY, MAX_SMALL, MIN_CAPACITY, NGROUPS, PAGE_SIZE};
use proptest::prelude::*;
use std::collections::HashMap;
use std::ptr::NonNull;

const MIB: usize = 1 << 20;

#[test]
fn bad_configurations_get_typed_errors() {
    assert!(matches!(
        Arena::builder().capacity(0).build(),
        Err(ArenaError::CapacityTooSmall { requested: 0, .. })
    ));
    assert!(matches!(
        Arena::builder().capacity(MIN_CAPACITY - 1).build(),
        Err(ArenaError::CapacityTooSmall { .. })
    ));
    assert!(matches!(
        Arena::builder().capacity(MAX_CAPACITY * 2).build(),
        Err(ArenaError::CapacityTooLarge { .. })
    ));
    let err = Arena::builder()
        .capacity(MIB)
        .limit(2 * MIB)
        .build()
        .unwrap_err();
    assert!(matches!(err, ArenaError::LimitAboveCapacity { limit, .. } if limit == 2 * MIB));
    assert!(err.to_string().contains("lower the limit"), "{err}");
    assert!(matches!(
        Arena::builder()
            .capacity(MIB)
            .base_address(0x4000_0000_0123)
            .build(),
        Err(ArenaError::MisalignedBase { .. })
    ));
    for low in [0, 0x1000] {
        let err = Arena::builder()
            .capacity(MIB)
            .base_address(low)
            .build()
            .unwrap_err();
        assert!(matches!(err, ArenaError::BaseTooLow { .. }), "{err}");
        assert!(err.to_string().contains("too low"), "{err}");
    }
    let mut a = Arena::new(4 * MIB).unwrap();
    let _p = a.alloc(3 * PAGE_SIZE * 16).unwrap();
    assert!(matches!(
        a.set_limit(PAGE_SIZE),
        Err(ArenaError::LimitBelowUsage { .. })
    ));
    assert!(matches!(
        a.set_limit(64 * MIB),
        Err(ArenaError::LimitAboveCapacity { .. })
    ));
}

#[test]
fn fixed_base_address_and_occupied_address() {
    let base = 0x3a00_0000_0000usize;
    let mut a = Arena::builder()
        .capacity(8 * MIB)
        .base_address(base)
        .build()
        .unwrap();
    assert_eq!(a.base().as_ptr() as usize, base);
    let p = a.alloc(64).unwrap();
    assert!(a.contains(p.as_ptr()));

    // The same range, and a range overlapping its end, are refused; nothing is mapped over.
    for addr in [base, base + 4 * MIB] {
        match Arena::builder()
            .capacity(8 * MIB)
            .base_address(addr)
            .build()
        {
            Err(ArenaError::AddressInUse { address, .. }) => assert_eq!(address, addr),
            other => panic!("expected AddressInUse, got {other:?}"),
        }
    }
    // The first arena is untouched by the failed attempts.
    // SAFETY: p is a live 64-byte block of `a`.
    unsafe { p.as_ptr().write_bytes(0xAB, 64) };
    a.verify().unwrap();
}

#[test]
fn two_arenas_side_by_side() {
    let mut a = Arena::new(16 * MIB).unwrap();
    let mut b = Arena::new(16 * MIB).unwrap();
    assert_ne!(a.id(), b.id());
    let mut blocks = Vec::new();
    for i in 0..2000usize {
        let size = 16 + (i * 37) % 3000;
        let (arena, tag) = if i % 2 == 0 {
            (&mut a, 0xA0u8)
        } else {
            (&mut b, 0xB0u8)
        };
        let p = arena.alloc(size).unwrap();
        // SAFETY: p is a fresh block of `size` bytes.
        unsafe { p.as_ptr().write_bytes(tag, size) };
        blocks.push((i % 2, p, size, tag));
    }
    for (which, p, size, tag) in &blocks {
        let arena = if *which == 0 { &a } else { &b };
        assert!(arena.contains(p.as_ptr()));
        assert_eq!(arena.bytes(0..0).len(), 0);
        // SAFETY: still live.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), *size) };
        assert!(bytes.iter().all(|b| b == tag));
    }
    a.verify().unwrap();
    b.verify().unwrap();
    assert_eq!(a.stats().live_blocks, 1000);
    assert_eq!(b.stats().live_blocks, 1000);
}

#[test]
fn exhaustion_returns_none_and_the_arena_stays_usable() {
    let mut a = Arena::builder()
        .capacity(8 * MIB)
        .limit(MIB)
        .build()
        .unwrap();
    let mut live = Vec::new();
    while let Some(p) = a.alloc(1000) {
        live.push(p);
        assert!(live.len() < 10_000, "limit not enforced");
    }
    let s = a.stats();
    assert!(s.extent_bytes <= MIB as u64);
    assert_eq!(s.failed_allocations, 1);
    assert!(a.alloc(200_000).is_none());
    a.verify().unwrap();
    // Freeing makes room again.
    // SAFETY: each block is live and freed once.
    unsafe {
        for p in live.drain(..10) {
            assert!(a.free(p, 1000));
        }
    }
    assert!(a.alloc(1000).is_some());
    // Raising the limit makes room too, and it is enforced again at the new value.
    a.set_limit(2 * MIB).unwrap();
    assert!(a.alloc(500_000).is_some());
    a.verify().unwrap();
}

#[test]
fn freeing_a_foreign_or_interior_pointer_is_refused() {
    let mut a = Arena::new(4 * MIB).unwrap();
    let p = a.alloc(100).unwrap();
    let big = a.alloc(100_000).unwrap();
    let mut outside = [0u8; 32];
    // SAFETY: none of these pointers is a live block start, so free must refuse them.
    unsafe {
        assert!(!a.free(NonNull::new(outside.as_mut_ptr()).unwrap(), 32));
        assert!(!a.free(NonNull::new(p.as_ptr().add(16)).unwrap(), 16));
        assert!(!a.free(NonNull::new(big.as_ptr().add(PAGE_SIZE)).unwrap(), 16));
        assert!(a.free(p, 100));
        assert!(!a.free(p, 100), "double free must be refused");
    }
    a.verify().unwrap();
}

/// A large block that cannot grow in place moves down into the free run on its left, keeping
/// its bytes, instead of leaving a hole there and growing the extent.
#[test]
fn a_growing_array_reuses_the_hole_on_its_left() {
    const K: usize = 1024;
    let mut arena = Arena::new(64 << 20).unwrap();
    let a = arena.alloc(64 * K).unwrap();
    let b = arena.alloc(64 * K).unwrap();
    let wall = arena.alloc(64 * K).unwrap(); // keeps b from growing to the right
                                             // SAFETY: b is a live block of 64 KiB.
    unsafe { std::ptr::write_bytes(b.as_ptr(), 0xAB, 64 * K) };
    // SAFETY: a is live, of that size.
    assert!(unsafe { arena.free(a, 64 * K) });
    let extent = arena.stats().extent_bytes;
    // SAFETY: b is live, of that size.
    let grown = unsafe { arena.realloc(b, 64 * K, 128 * K) }.unwrap();
    assert_eq!(grown, a, "moved down into the freed run");
    assert_eq!(
        arena.stats().extent_bytes,
        extent,
        "no growth of the extent"
    );
    // SAFETY: grown is a live block of 128 KiB.
    let bytes = unsafe { std::slice::from_raw_parts(grown.as_ptr(), 64 * K) };
    assert!(bytes.iter().all(|&x| x == 0xAB));
    assert_eq!(arena.block_size(grown.as_ptr()), Some(128 * K));
    arena.verify().unwrap();
    // A bigger growth takes the left run and what it needs on the right, then frees cleanly.
    let c = arena.alloc(40 * K).unwrap();
    // SAFETY: each is live with the size given.
    unsafe {
        assert!(arena.free(grown, 128 * K));
        assert!(arena.free(wall, 64 * K));
    }
    // SAFETY: c is live, of that size.
    let c2 = unsafe { arena.realloc(c, 40 * K, 300 * K) }.unwrap();
    arena.verify().unwrap();
    // SAFETY: c2 is live, of that size.
    assert!(unsafe { arena.free(c2, 300 * K) });
    arena.verify().unwrap();
    assert_eq!(arena.stats().bytes_in_use, 0);
}

#[test]
fn alloc_in_refuses_an_unknown_group() {
    let mut a = Arena::new(8 * MIB).unwrap();
    assert!(a.alloc_in(64, NGROUPS).is_none());
    let p = a.alloc_in(64, NGROUPS - 1).unwrap();
    let q = a.alloc(64).unwrap();
    assert_ne!(
        p.as_ptr() as usize / PAGE_SIZE,
        q.as_ptr() as usize / PAGE_SIZE
    );
    a.verify().unwrap();
}

#[test]
fn span_blocks_says_which_blocks_of_a_span_are_live() {
    let mut a = Arena::new(8 * MIB).unwrap();
    let blocks: Vec<NonNull<u8>> = (0..5).map(|_| a.alloc(48).unwrap()).collect();
    // SAFETY: a live block of this arena, not used afterwards.
    assert!(unsafe { a.free(blocks[1], 48) });
    let offset = blocks[0].as_ptr() as usize - a.base().as_ptr() as usize;
    let span = a.span_blocks(offset).expect("a span");
    assert_eq!(span.block_size, 48);
    assert_eq!(&span.live[..6], [true, false, true, true, true, false]);
    assert!(span.live[6..].iter().all(|l| !l));
    let big = a.alloc(MAX_SMALL + 1).unwrap();
    assert_eq!(
        a.span_blocks(big.as_ptr() as usize - a.base().as_ptr() as usize),
        None
    );
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize, usize),
    Free(usize),
    Realloc(usize, usize),
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 1usize..=128,
        3 => 129usize..=2048,
        1 => 2049usize..=40_000,
        1 => 40_001usize..=300_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0..NGROUPS).prop_map(|(s, g)| Op::Alloc(s, g)),
        3 => any::<usize>().prop_map(Op::Free),
        3 => (any::<usize>(), size()).prop_map(|(i, s)| Op::Realloc(i, s)),
    ]
}

struct Live {
    ptr: NonNull<u8>,
    size: usize,
    tag: u8,
    group: usize,
}

fn fill(b: &Live) {
    // SAFETY: the block is live with at least `size` bytes.
    unsafe { b.ptr.as_ptr().write_bytes(b.tag, b.size) };
}

fn check(b: &Live) {
    // SAFETY: as in `fill`.
    let bytes = unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.size) };
    assert!(bytes.iter().all(|&x| x == b.tag), "block contents changed");
}

fn check_disjoint(a: &Arena, live: &[Live]) {
    let mut spans: Vec<(usize, usize)> = live
        .iter()
        .map(|b| {
            let cap = a
                .block_size(b.ptr.as_ptr())
                .expect("live block unknown to the arena");
            assert!(cap >= b.size);
            (b.ptr.as_ptr() as usize, cap)
        })
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "blocks overlap: {w:?}");
    }
    // Small blocks of different placement groups never share a page.
    let mut owner: HashMap<usize, usize> = HashMap::new();
    for b in live {
        let cap = a.block_size(b.ptr.as_ptr()).unwrap();
        if cap > MAX_SMALL {
            continue;
        }
        let start = b.ptr.as_ptr() as usize;
        for page in start / PAGE_SIZE..=(start + cap - 1) / PAGE_SIZE {
            let g = *owner.entry(page).or_insert(b.group);
            assert_eq!(
                g, b.group,
                "page {page:#x} holds blocks of groups {g} and {}",
                b.group
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_match_the_model(ops in proptest::collection::vec(op(), 1..400), limit_mib in 1usize..6) {
        let limit = limit_mib * MIB;
        let mut a = Arena::builder().capacity(16 * MIB).limit(limit).build().unwrap();
        let mut live: Vec<Live> = Vec::new();
        let mut model_bytes = 0usize;
        let mut tag = 0u8;
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size, group) => {
                    if let Some(ptr) = a.alloc_in(size, group) {
                        prop_assert_eq!(ptr.as_ptr() as usize % 16, 0);
                        tag = tag.wrapping_add(1);
                        let b = Live { ptr, size, tag, group };
                        fill(&b);
                        live.push(b);
                        model_bytes += size;
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let b = live.swap_remove(i % live.len());
                    check(&b);
                    // SAFETY: b is live and removed from the model, so never used again.
                    let freed = unsafe { a.free(b.ptr, b.size) };
                    prop_assert!(freed);
                    model_bytes -= b.size;
                }
                Op::Realloc(i, size) if !live.is_empty() => {
                    let i = i % live.len();
                    let old = &live[i];
                    check(old);
                    let old_cap = a.block_size(old.ptr.as_ptr()).unwrap();
                    // SAFETY: old is live with its last requested size.
                    match unsafe { a.realloc(old.ptr, old.size, size) } {
                        Some(ptr) => {
                            prop_assert_eq!(ptr.as_ptr() as usize % 16, 0);
                            let kept = old.size.min(size);
                            // SAFETY: the new block has at least `size` >= kept bytes.
                            let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), kept) };
                            prop_assert!(bytes.iter().all(|&x| x == old.tag), "realloc lost contents");
                            model_bytes = model_bytes - old.size + size;
                            tag = tag.wrapping_add(1);
                            // A small block keeps its group; a large one (whole pages) has
                            // none, and one shrunk into a size class lands in group 0.
                            let group = if old_cap > MAX_SMALL { 0 } else { old.group };
                            live[i] = Live { ptr, size, tag, group };
                            fill(&live[i]);
                        }
                        None => {
                            prop_assert!(size > old.size, "a shrink failed");
                            check(old);
                        }
                    }
                }
                _ => {}
            }
            let s = a.stats();
            // The limit bounds the bytes of live blocks; free slots in spans and holes left by
            // moved blocks do not count, and the pages held stay within twice the limit.
            prop_assert!(s.bytes_allocated <= limit as u64, "live {} over limit {}", s.bytes_allocated, limit);
            prop_assert!(s.held_bytes <= 2 * limit as u64, "held {} over twice the limit {}", s.held_bytes, limit);
            prop_assert!(s.bytes_allocated <= s.held_bytes && s.held_bytes <= s.extent_bytes);
            prop_assert_eq!(s.bytes_in_use, model_bytes as u64);
            prop_assert_eq!(s.live_blocks, live.len() as u64);
            if step % 64 == 0 {
                a.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
                check_disjoint(&a, &live);
            }
        }
        a.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_disjoint(&a, &live);
        for b in &live {
            check(b);
        }
    }

    #[test]
    fn churn_at_a_steady_live_size_reuses_space(seed in any::<u64>(), live_blocks in 100usize..1500) {
        // A Lua-like mix; after filling to a live set, keep replacing random blocks. Without
        // reuse the extent would grow by ~every allocation; with it, it stays near the fill's.
        let mut rng = seed | 1;
        let mut next = move || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
        let sized = |r: u64| -> usize {
            match r % 100 {
                0..=79 => 16 + (r >> 8) as usize % 113,
                80..=97 => 129 + (r >> 8) as usize % 2000,
                _ => 2049 + (r >> 8) as usize % 60_000,
            }
        };
        let mut a = Arena::new(256 * MIB).unwrap();
        let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
        for _ in 0..live_blocks {
            let s = sized(next());
            live.push((a.alloc(s).unwrap(), s));
        }
        let filled = a.stats().extent_bytes;
        for _ in 0..40 * live_blocks {
            let i = next() as usize % live.len();
            let (p, s) = live[i];
            // SAFETY: p is live with size s and replaced in the model.
            unsafe { a.free(p, s) };
            let s = sized(next());
            live[i] = (a.alloc(s).unwrap(), s);
        }
        let peak = a.stats().peak_extent_bytes;
        prop_assert!(peak <= 3 * filled + MIB as u64, "extent grew from {filled} to {peak} under churn");
        a.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}
