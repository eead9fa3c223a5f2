//! What a load may cost, whatever its file says: preallocation from size hints, heap growth,
//! collision-chain walks, nesting on the Lua stack, and the instruction budget of Lua code run
//! while loading. Each limit is a denial-of-service guard: a small file must not make the load
//! allocate, walk or run far more than its length justifies (or, for an own save, than the
//! caller's heap-growth cap allows).

use super::csrc::{
    luasnap_gc_stopem, luasnap_heap_bytes, luasnap_relayout_memo_limit, luasnap_relayout_memo_over,
};
use super::loader::{Fail, Loader};
use crate::persist::budget::budget_hook_intact;
use crate::persist::options::{LoadOptions, Trust};
use mlua_sys::lua_State;
use std::ffi::c_int;

/// Preallocation (table array slots, hash nodes counted twice, coroutine stack slots beyond
/// the values read) a whole load may ask for from its file's hints: this many units per body
/// byte, plus [`PREALLOC_BASE`]. Past it, hints are ignored (tables grow as entries come)
/// and coroutine frames that need more stack are refused. Honest files ask for about one
/// unit per two bytes.
const PREALLOC_PER_BYTE: u64 = 4;
const PREALLOC_BASE: u64 = 1 << 16;

/// Why a foreign load stopped at keys chosen to collide.
pub(super) const COLLISIONS: &str = "the save-game has tables whose keys collide in the same hash-table nodes (integers a multiple of the node count minus one, say), so that inserting and finding them would take time quadratic in the file's size; foreign loads stop after walking 32 collision-chain nodes per body byte: if you trust the file, load it as your own (Trust::Own), where no such limit applies";

/// Collision-chain nodes a foreign load may walk, per body byte (plus [`CHAIN_BASE`]): an
/// honest save walks one or two per entry, and an entry takes 2 bytes or more.
const CHAIN_PER_BYTE: u64 = 32;
const CHAIN_BASE: u64 = 1 << 20;

/// Table frames up to this depth keep their table and key on the Lua stack (fast); deeper ones
/// use the id tables, so nesting depth never exhausts the Lua stack.
pub(super) const STACK_FRAMES: usize = 4000;

/// Lua's limit on a closure's upvalues (`MAXUPVAL`); a batch leaves a closure with more to the
/// general path.
pub(super) const MAX_UPVALUES: usize = 255;

/// How deep the keys of permanents and C closures may nest: each is read as a value, which
/// may be a permanent or C closure again (honest files never nest them), and each level is a
/// Rust call: without a bound, a file of nothing but such tags recursed past the thread's
/// stack.
pub(super) const MAX_KEY_NESTING: u32 = 8;

/// For an own save: the units of preallocation its heap-growth cap allows (see
/// `Loader::own_cap`); None for a foreign save.
pub(super) fn own_cap(opts: &LoadOptions) -> Option<u64> {
    (opts.trust == Trust::Own).then(|| opts.max_heap_growth.map_or(u64::MAX / 4, |g| g as u64 / 16))
}

/// The preallocation budget of a load of a body of `body_len` bytes (see
/// [`PREALLOC_PER_BYTE`]), or the own cap if larger.
pub(super) fn prealloc_budget(body_len: usize, own_cap: Option<u64>) -> u64 {
    (body_len as u64)
        .saturating_mul(PREALLOC_PER_BYTE)
        .saturating_add(PREALLOC_BASE)
        .max(own_cap.unwrap_or(0))
}

/// Array and hash sizes for a new table from a file's hints, capped by what the rest of the
/// file (`remaining` bytes) can hold (2+ bytes per entry), or by `own_cap` for an own save
/// (see `Loader::own_cap`). Hints are also charged to the load's total preallocation budget
/// `left` (hash nodes twice): nested tables cannot each ask for the whole rest of the file.
/// The third value says whether a hint was cut.
#[inline(always)]
pub(super) fn table_sizes(
    remaining: usize,
    own_cap: Option<u64>,
    left: &mut u64,
    narr: u64,
    nhash: u64,
) -> (c_int, c_int, bool) {
    let cap = own_cap
        .unwrap_or((remaining / 2) as u64)
        .min(c_int::MAX as u64);
    let (narr0, nhash0) = (narr, nhash);
    let narr = narr.min(cap).min(*left);
    *left -= narr;
    let nhash = nhash.min(cap).min(*left / 2);
    *left -= nhash * 2;
    (
        narr as c_int,
        nhash as c_int,
        narr != narr0 || nhash != nhash0,
    )
}

impl Loader<'_> {
    /// For a foreign load, bounds the collision-chain nodes its tables may walk by its body's
    /// length (see [`COLLISIONS`]); an own load's are not bounded.
    pub(super) fn limit_collisions(&mut self, body_len: usize) {
        if self.opts.trust != Trust::Foreign {
            return;
        }
        let limit = (body_len as u64)
            .saturating_mul(CHAIN_PER_BYTE)
            .saturating_add(CHAIN_BASE);
        // SAFETY: the memo is luasnap_relayout_memo_size() bytes, owned by this loader.
        unsafe { luasnap_relayout_memo_limit(self.memo.as_mut_ptr().cast(), limit) };
    }

    /// Whether the load walked more collision-chain nodes than its limit (see `COLLISIONS`).
    pub(super) fn collisions_over(&self) -> bool {
        // SAFETY: the memo is luasnap_relayout_memo_size() bytes, owned by this loader.
        unsafe { luasnap_relayout_memo_over(self.memo.as_ptr().cast()) != 0 }
    }

    /// Array and hash sizes for a new table from a file's hints (see [`table_sizes`]).
    pub(super) fn table_sizes(&mut self, narr: u64, nhash: u64) -> (c_int, c_int) {
        let (narr, nhash, _) = table_sizes(
            self.r.remaining(),
            self.own_cap,
            &mut self.prealloc_left,
            narr,
            nhash,
        );
        (narr, nhash)
    }

    /// Charges `slots` coroutine stack slots beyond the values read (what restored frames
    /// need) to the preallocation budget; false, charging nothing, if they do not fit: frame
    /// tops cannot make a small file allocate large stacks.
    pub(super) fn charge_stack(&mut self, slots: u64) -> bool {
        if slots > self.prealloc_left {
            return false;
        }
        self.prealloc_left -= slots;
        true
    }

    /// Fails once the heap grew past the load's cap (each object is bounded by the file's
    /// bytes and the preallocation budget, so this check per object bounds the overshoot).
    pub(super) fn check_heap(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: reads two counters of the global state.
        if unsafe { luasnap_heap_bytes(L) } > self.limits.heap_cap() {
            self.limits.note_over_cap();
            return Err(self.fail("the load exceeded its heap-growth cap (LoadOptions::max_heap_growth, eris.settings(\"maxgrowth\"))"));
        }
        Ok(())
    }

    /// After Lua code ran at load time: the budget hook must still be the load's (code that
    /// replaced it could run unbounded), and what a collection may have invalidated goes.
    ///
    /// # Safety
    /// `L` is the loading thread, in the load's protected call.
    pub(super) unsafe fn after_call(&mut self, L: *mut lua_State) -> Result<(), Fail> {
        // SAFETY: queries the hook of the loading thread (callers' contract).
        if !unsafe { budget_hook_intact(L) } {
            return Err(self.fail("a load-time function changed the load's instruction-budget hook (debug.sethook); the save-game is refused"));
        }
        // A collection (collectgarbage, or one that finished its cycle meanwhile) may have
        // freed prototypes the index points to: look them up again when next needed.
        // Those already used are anchored in `protos`.
        self.index = None;
        self.full_index = false;
        // SAFETY: sets a flag of the loading thread's global state (callers' contract).
        unsafe { luasnap_gc_stopem(L, 1) };
        Ok(())
    }
}
