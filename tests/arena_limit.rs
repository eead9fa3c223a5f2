//! What the arena's limit bounds: pages held by blocks, not the extent; and how thrashing at
//! the limit ends.

use luasnap::alloc::Arena;
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
    assert!(s.held_bytes <= limit as u64);
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
