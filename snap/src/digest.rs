//! Fast hashes of an arena's state, for desync detection and tests.

use luasnap_alloc::Arena;
use xxhash_rust::xxh3::Xxh3;

/// A 64-bit XXH3 hash of every byte of the arena's state ([`Arena::state_ranges`]), with the
/// ranges' offsets and lengths mixed in.
///
/// Two arenas with equal digests hold the same allocator map and the same bytes at the same
/// offsets. Snapshot, rollback and a deterministic replay preserve it exactly. It runs at memory
/// bandwidth (about a memcpy of the same bytes).
pub fn digest(arena: &Arena) -> u64 {
    let mut h = Xxh3::new();
    for r in arena.state_ranges().iter() {
        h.update(&(r.start as u64).to_le_bytes());
        h.update(&(r.len() as u64).to_le_bytes());
        h.update(arena.bytes(r));
    }
    h.digest()
}
