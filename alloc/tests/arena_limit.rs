//! What the arena's limit bounds: the bytes of live blocks, not free slots in spans nor holes
//! in the extent (the pages held stay within twice the limit); and how thrashing at the limit
//! ends.

use luasnap_alloc::Arena;
use std::ptr::NonNull;

const MIB: usize = 1 << 20;

/// Lua 5.5 grows a table's array by allocating the new one, copying and freeing the old one;
/// the holes each move leaves must not count against the limit.
#[test]
fn a_growing_array_reaches_what_malloc_would() {
    let limit = 64 * MIB;
    let mut a = Arena::builder()
        .capacity(1024 * MIB)
        .limit(limit)
        .build()
        .unwrap();
    let mut size = 64 * 1024;
    let mut cur = a.alloc(size).unwrap();
    let mut largest = size;
    // A few small blocks in between, as a Lua heap has.
    let mut small: Vec<NonNull<u8>> = Vec::new();
    while let Some(next) = a.alloc(size * 2) {
        // SAFETY: both blocks are live and at least `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(cur.as_ptr(), next.as_ptr(), size) };
        // SAFETY: `cur` is live and freed once.
        assert!(unsafe { a.free(cur, size) });
        cur = next;
        size *= 2;
        largest = size;
        small.extend(a.alloc(100));
    }
    // malloc holds old + new at the move: 16 + 32 MiB fits 64 MiB, 32 + 64 does not.
    assert!(largest >= 32 * MIB, "largest array {largest}");
    let s = a.stats();
    assert!(s.bytes_allocated <= limit as u64);
    a.verify().unwrap();
}

/// Doubles a block by allocate-copy-free (as Lua 5.5 grows a table's array) until the arena
/// refuses; returns the largest size reached.
fn grow_array(a: &mut Arena, start: usize) -> usize {
    let mut size = start;
    let mut cur = a.alloc(size).unwrap();
    while let Some(next) = a.alloc(size * 2) {
        // SAFETY: both blocks are live and at least `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(cur.as_ptr(), next.as_ptr(), size) };
        // SAFETY: `cur` is live and freed once.
        assert!(unsafe { a.free(cur, size) });
        cur = next;
        size *= 2;
    }
    size
}

/// After a deep recursion Lua frees its spare CallInfo records every other one
/// (`luaE_shrinkCI`), which leaves their spans half empty. Those free slots count no more than
/// free chunks in a malloc'd heap do: a growing array still reaches what it reaches without
/// them (it reached half before).
#[test]
fn half_empty_spans_do_not_count_against_the_limit() {
    let limit = 64 * MIB;
    let build = || {
        Arena::builder()
            .capacity(1024 * MIB)
            .limit(limit)
            .build()
            .unwrap()
    };
    let mut plain = build();
    let reached_plain = grow_array(&mut plain, 64 * 1024);

    let mut a = build();
    // 20 MiB of 72-byte records (CallInfo's size class), every other one freed: 10 MiB live
    // in spans that hold 20 MiB.
    let n = 20 * MIB / 80;
    let records: Vec<NonNull<u8>> = (0..n).map(|_| a.alloc(72).unwrap()).collect();
    for p in records.iter().step_by(2) {
        // SAFETY: each block is live and freed once.
        assert!(unsafe { a.free(*p, 72) });
    }
    let s = a.stats();
    assert!(s.held_bytes >= 2 * s.bytes_allocated - MIB as u64, "{s:?}");
    let reached = grow_array(&mut a, 64 * 1024);
    // 10 MiB live + 16 MiB array + its 32 MiB copy fit 64 MiB; with the half-empty spans
    // counted (20 + 16 + 32) they did not.
    assert_eq!(reached, reached_plain, "{:?}", a.stats());
    assert!(reached >= 32 * MIB);
    let s = a.stats();
    assert!(s.bytes_allocated <= limit as u64);
    assert!(s.held_bytes <= 2 * limit as u64);
    a.verify().unwrap();
}

/// Free slots in spans do not count against the limit, but the pages held stay within twice
/// it (plus one span per size class): a program that fragments every class on purpose cannot
/// hold pages without bound.
#[test]
fn pages_held_by_fragmented_spans_stay_within_twice_the_limit() {
    let limit = 4 * MIB;
    let mut a = Arena::builder()
        .capacity(256 * MIB)
        .limit(limit)
        .build()
        .unwrap();
    let mut kept = Vec::new();
    let mut refused = false;
    // Fill one size class after another, keeping one block in 32 of each.
    'classes: for size in (16..=2048).step_by(16) {
        let mut blocks = Vec::new();
        loop {
            match a.alloc(size) {
                Some(p) => blocks.push(p),
                None => {
                    refused = true;
                    break 'classes;
                }
            }
            if blocks.len() * size >= limit / 2 {
                break;
            }
        }
        for (i, p) in blocks.into_iter().enumerate() {
            if i % 32 == 0 {
                kept.push(p);
            } else {
                // SAFETY: each block is live and freed once.
                assert!(unsafe { a.free(p, size) });
            }
        }
    }
    assert!(
        refused,
        "the held pages grew without bound: {:?}",
        a.stats()
    );
    let s = a.stats();
    assert!(
        s.held_bytes <= 2 * limit as u64 + luasnap_alloc::HELD_SLACK_BYTES,
        "{s:?}"
    );
    // Refused by the bound on held pages, with the live bytes well under the limit.
    assert!(s.bytes_allocated <= limit as u64 * 3 / 4, "{s:?}");
    a.verify().unwrap();
}

/// A program that needs an emergency collection for every small slice of its heap gets a
/// refusal on the retry too (Lua's "not enough memory") instead of spinning; then the arena
/// serves requests again.
#[test]
fn thrashing_at_the_limit_ends_with_a_refused_retry() {
    let mut a = Arena::builder()
        .capacity(64 * MIB)
        .limit(MIB)
        .build()
        .unwrap();
    let mut live = Vec::new();
    for _ in 0..900 {
        live.push(a.alloc(1000).unwrap());
    }
    let mut refused_retry = None;
    for cycle in 0..100 {
        let mut garbage = Vec::new();
        while let Some(p) = a.alloc(1000) {
            garbage.push(p);
        }
        // The "emergency collection": everything allocated since is garbage.
        for p in garbage {
            // SAFETY: each block is live and freed once.
            unsafe { a.free(p, 1000) };
        }
        // Lua's retry of the refused request.
        match a.alloc(1000) {
            // SAFETY: live, freed once.
            Some(p) => unsafe {
                a.free(p, 1000);
            },
            None => {
                refused_retry = Some(cycle);
                break;
            }
        }
    }
    let cycle = refused_retry.expect("thrashing never ended");
    assert!(cycle >= 30, "refused after only {cycle} cycles");
    assert!(a.alloc(1000).is_some(), "the arena serves requests again");
    a.verify().unwrap();
}
