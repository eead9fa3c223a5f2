//! A Lua-like allocation trace, shared by the allocator benchmark and `luasnap bench`.
//!
//! Mostly small objects of 16-128 bytes (tables, closures, upvalues, short strings), strings of
//! assorted lengths, arrays that grow by doubling through realloc, and frees in GC-sweep-like
//! batches, at a steady live size after a ramp-up.

/// One allocator call. `slot` names a block across calls.
#[derive(Debug, Clone, Copy)]
pub enum TraceOp {
    Alloc { slot: u32, size: u32 },
    Realloc { slot: u32, old: u32, new: u32 },
    Free { slot: u32, size: u32 },
}

/// Builds a deterministic trace of about `ops` calls that keeps about `live` blocks alive.
pub fn lua_like_trace(ops: usize, live: usize, seed: u64) -> Vec<TraceOp> {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Object sizes Lua 5.5 allocates most (x86_64): Table 56, LClosure 32+8n, UpVal 40,
    // TString 24+len+1, Udata, CallInfo 64, proto pieces.
    const SMALL: [u32; 12] = [16, 24, 32, 40, 40, 48, 56, 56, 64, 72, 96, 120];
    let mut sizes: Vec<u32> = Vec::new(); // slot -> current size (0 = free)
    let mut live_slots: Vec<u32> = Vec::new();
    let mut growing: Vec<u32> = Vec::new();
    let mut out = Vec::with_capacity(ops);
    while out.len() < ops {
        let r = next();
        let over = live_slots.len() > live;
        match r % 100 {
            // GC sweep: free a batch of random live blocks.
            0..=3 if !live_slots.is_empty() => {
                let batch = if over { 64 } else { 8 };
                for _ in 0..batch.min(live_slots.len()) {
                    let i = (next() as usize) % live_slots.len();
                    let slot = live_slots.swap_remove(i);
                    out.push(TraceOp::Free {
                        slot,
                        size: sizes[slot as usize],
                    });
                    sizes[slot as usize] = 0;
                    growing.retain(|&g| g != slot);
                }
            }
            // Array or buffer growth by doubling.
            4..=13 if !growing.is_empty() => {
                let i = (r >> 8) as usize % growing.len();
                let slot = growing[i];
                let old = sizes[slot as usize];
                let new = old * 2;
                // Most tables stop growing early; a few become big arrays (each doubling
                // continues with probability 3/4, up to 256 KiB).
                if new > 256 * 1024 || (r >> 16) % 4 == 0 {
                    growing.swap_remove(i);
                } else {
                    out.push(TraceOp::Realloc { slot, old, new });
                    sizes[slot as usize] = new;
                }
            }
            _ => {
                let size = match r % 100 {
                    14..=79 => SMALL[(r >> 8) as usize % SMALL.len()],
                    80..=94 => 25 + ((r >> 8) % 200) as u32, // strings
                    95..=97 => 16 * (1 + ((r >> 8) % 4) as u32), // new array part
                    _ => 256 + ((r >> 8) % 4000) as u32,     // buffers, prototypes
                };
                let slot = sizes.len() as u32;
                sizes.push(size);
                live_slots.push(slot);
                if (95..=97).contains(&(r % 100)) {
                    growing.push(slot);
                }
                out.push(TraceOp::Alloc { slot, size });
            }
        }
    }
    out
}

/// Number of slots a trace uses.
pub fn slots(trace: &[TraceOp]) -> usize {
    trace
        .iter()
        .map(|op| match *op {
            TraceOp::Alloc { slot, .. }
            | TraceOp::Realloc { slot, .. }
            | TraceOp::Free { slot, .. } => slot as usize + 1,
        })
        .max()
        .unwrap_or(0)
}
