//! The portable fallback: read-only pages and a `SIGSEGV` handler.
//!
//! One process-wide handler serves every tracked region through a fixed table of slots. The
//! handler is async-signal-safe: it reads atomics, sets a bit with `fetch_or`, calls `mprotect`,
//! and for faults outside every tracked region, and for a `SIGSEGV` another process (or
//! thread) sent, hands over to what was there before it (Rust's stack-overflow handler, a
//! crash reporter, the default action), as if it were not there.
//!
//! Invariant: a slot's `bits` pointer stays valid while its `base` is non-zero, and a region is
//! made writable again (so no more faults can come from it) before its slot is released.

use super::{push_run, TrackerKind};
use crate::error::{errno, TrackError};
use crate::PAGE_SIZE;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// Regions that can be tracked with mprotect at once.
const MAX_TRACKED: usize = 64;

struct Slot {
    base: AtomicUsize,
    len: AtomicUsize,
    bits: AtomicPtr<AtomicU64>,
    /// Set by the handler when it could not unprotect a single page (e.g. the process ran out
    /// of VMAs): the whole region was made writable and every page counts as written.
    overflow: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    bits: AtomicPtr::new(std::ptr::null_mut()),
    overflow: AtomicBool::new(false),
};

static SLOTS: [Slot; MAX_TRACKED] = [EMPTY_SLOT; MAX_TRACKED];
static INSTALL: Once = Once::new();
static INSTALL_OK: AtomicBool = AtomicBool::new(false);

/// The `sigaction` that was in place before ours, written once under `INSTALL` before our
/// handler can run, then only read.
struct PrevAction(std::cell::UnsafeCell<std::mem::MaybeUninit<libc::sigaction>>);
// SAFETY: written once inside `INSTALL.call_once` before the handler is installed, read-only after.
unsafe impl Sync for PrevAction {}
static PREV: PrevAction = PrevAction(std::cell::UnsafeCell::new(std::mem::MaybeUninit::uninit()));

/// Where a `SIGSEGV` the handler receives comes from, as its `siginfo` says.
enum SegvOrigin {
    /// A memory access that faulted at this address (`si_code > 0`): the instruction runs
    /// again when the handler returns.
    Fault(usize),
    /// Sent by a process (`kill`, `sigqueue`, `raise`: `si_code <= 0`, `SI_USER`, `SI_TKILL`,
    /// ...): no access faulted, the address field holds the sender's pid and uid, and
    /// returning from the handler ends the signal.
    Sent,
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; si_addr is the
    // union member a fault fills (si_code > 0), read only then.
    let origin = unsafe {
        if (*info).si_code > 0 {
            SegvOrigin::Fault((*info).si_addr() as usize)
        } else {
            SegvOrigin::Sent
        }
    };
    if let SegvOrigin::Fault(addr) = origin {
        if record_write(addr) {
            return;
        }
    }
    hand_over(sig, info, ctx, origin);
}

/// Records a write fault at `addr` if a tracked region holds it and makes its page writable
/// (the whole region if a page cannot be split off); false if no region holds it, or it
/// could not be made writable. Async-signal-safe.
fn record_write(addr: usize) -> bool {
    for slot in &SLOTS {
        let base = slot.base.load(Ordering::Acquire);
        if base == 0
            || base == usize::MAX
            || addr < base
            || addr - base >= slot.len.load(Ordering::Relaxed)
        {
            continue;
        }
        let page = (addr - base) / PAGE_SIZE;
        let bits = slot.bits.load(Ordering::Acquire);
        // SAFETY: slot invariant: bits covers len / PAGE_SIZE pages while base is non-zero.
        unsafe { (*bits.add(page / 64)).fetch_or(1 << (page % 64), Ordering::Relaxed) };
        let page_addr = (base + page * PAGE_SIZE) as *mut libc::c_void;
        // SAFETY: mprotect is async-signal-safe and the page belongs to a tracked region.
        if unsafe { libc::mprotect(page_addr, PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE) } == 0
        {
            return true;
        }
        // Splitting the mapping failed (most likely vm.max_map_count): open the whole region,
        // which merges it back into one mapping, and report everything as written.
        slot.overflow.store(true, Ordering::Release);
        let len = slot.len.load(Ordering::Relaxed);
        // SAFETY: as above, for the whole tracked region.
        return unsafe {
            libc::mprotect(
                base as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        } == 0;
    }
    false
}

/// Gives a `SIGSEGV` that is not a tracked write what it would have got without this
/// handler: the handler installed before it, or the default action (the process dies of
/// `SIGSEGV`, dumping core). A fault gets it when the access runs again; a sent signal has no
/// access to repeat, so when the default action is due it is sent again, to this thread: it
/// is blocked while the handler runs and arrives as the handler returns. Async-signal-safe.
fn hand_over(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    origin: SegvOrigin,
) {
    // SAFETY: PREV was written before this handler was installed.
    let prev = unsafe { (*PREV.0.get()).assume_init_ref() };
    let handler = prev.sa_sigaction;
    let sent = matches!(origin, SegvOrigin::Sent);
    if handler == libc::SIG_IGN && sent {
        // Ignored before us: a sent signal is ignored still (a fault cannot be: the kernel
        // kills the process when it repeats, as below).
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        set_default(sig);
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain (non-SA_SIGINFO) handler takes only the signal number.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
    // A handler that returns after putting the default action back (Rust's stack-overflow
    // handler does, for an address outside a guard page) counts on the fault to repeat.
    if sent && default_is_set(sig) {
        // SAFETY: raise is async-signal-safe; the signal stays pending until the handler
        // returns and the kernel unblocks it.
        unsafe { libc::raise(sig) };
    }
}

/// Puts back the default action of `sig`. Async-signal-safe.
fn set_default(sig: libc::c_int) {
    // SAFETY: sigaction is async-signal-safe; a zeroed sigaction with SIG_DFL is valid.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

/// Whether `sig`'s action is the default one now. Async-signal-safe.
fn default_is_set(sig: libc::c_int) -> bool {
    // SAFETY: sigaction only reads the action here; `now` is written by it.
    unsafe {
        let mut now: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut now) == 0 && now.sa_sigaction == libc::SIG_DFL
    }
}

fn install_handler() -> Result<(), TrackError> {
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct plus our handler; PREV is written before the
        // new handler is installed, so the handler never reads it uninitialized.
        unsafe {
            let prev = &mut *PREV.0.get();
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) != 0 {
                return;
            }
            prev.write(old);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_segv as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()) == 0 {
                INSTALL_OK.store(true, Ordering::Release);
            }
        }
    });
    if INSTALL_OK.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(TrackError::Unavailable {
            kind: TrackerKind::Mprotect,
            reason: "could not install a SIGSEGV handler".into(),
        })
    }
}

pub(super) struct MprotectTracker {
    slot: &'static Slot,
    base: usize,
    len: usize,
    bits: Box<[AtomicU64]>,
    scratch: Vec<Range<usize>>,
}

fn failed(call: &'static str) -> TrackError {
    TrackError::Syscall {
        kind: TrackerKind::Mprotect,
        call,
        errno: errno(),
    }
}

impl MprotectTracker {
    pub(super) fn new(base: NonNull<u8>, len: usize) -> Result<Self, TrackError> {
        install_handler()?;
        let pages = len / PAGE_SIZE;
        let bits: Box<[AtomicU64]> = (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        let slot = SLOTS
            .iter()
            .find(|s| {
                s.base
                    .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or(TrackError::TooManyTracked { max: MAX_TRACKED })?;
        // `usize::MAX` reserved the slot without matching any address; publish the real
        // region only once bits and len are in place.
        slot.len.store(len, Ordering::Relaxed);
        slot.bits.store(bits.as_ptr().cast_mut(), Ordering::Release);
        slot.overflow.store(false, Ordering::Relaxed);
        slot.base.store(base.as_ptr() as usize, Ordering::Release);
        Ok(MprotectTracker {
            slot,
            base: base.as_ptr() as usize,
            len,
            bits,
            scratch: Vec::new(),
        })
    }

    fn mprotect(&self, range: Range<usize>, prot: libc::c_int) -> Result<(), TrackError> {
        // SAFETY: the range is page-aligned inside the tracked region, which we own.
        let r = unsafe {
            libc::mprotect(
                (self.base + range.start) as *mut libc::c_void,
                range.len(),
                prot,
            )
        };
        if r != 0 {
            return Err(failed("mprotect"));
        }
        Ok(())
    }

    fn clear_bits(&self, range: Range<usize>) {
        for page in range.start / PAGE_SIZE..range.end / PAGE_SIZE {
            self.bits[page / 64].fetch_and(!(1 << (page % 64)), Ordering::Relaxed);
        }
    }

    pub(super) fn arm(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        self.mprotect(range.clone(), libc::PROT_READ)?;
        self.clear_bits(range);
        Ok(())
    }

    pub(super) fn disarm(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        self.mprotect(range.clone(), libc::PROT_READ | libc::PROT_WRITE)?;
        self.clear_bits(range);
        Ok(())
    }

    pub(super) fn expose(&mut self, range: Range<usize>) -> Result<(), TrackError> {
        for page in range.start / PAGE_SIZE..range.end / PAGE_SIZE {
            self.bits[page / 64].fetch_or(1 << (page % 64), Ordering::Relaxed);
        }
        self.mprotect(range, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Reports written runs without re-arming them (they stay writable and marked).
    pub(super) fn peek(&mut self, range: Range<usize>, out: &mut Vec<Range<usize>>) {
        if self.slot.overflow.load(Ordering::Acquire) {
            push_run(out, range);
            return;
        }
        let (p0, p1) = (range.start / PAGE_SIZE, range.end / PAGE_SIZE);
        for page in p0..p1 {
            if self.bits[page / 64].load(Ordering::Relaxed) >> (page % 64) & 1 == 1 {
                push_run(out, page * PAGE_SIZE..(page + 1) * PAGE_SIZE);
            }
        }
    }

    pub(super) fn collect(
        &mut self,
        range: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        if self.slot.overflow.swap(false, Ordering::AcqRel) {
            // The handler gave up on single pages: everything is writable and counts as written.
            push_run(out, range.clone());
            return self.arm(range);
        }
        let mut runs = std::mem::take(&mut self.scratch);
        runs.clear();
        let (p0, p1) = (range.start / PAGE_SIZE, range.end / PAGE_SIZE);
        let mut page = p0;
        while page < p1 {
            let word = page / 64;
            let lo = page % 64;
            let hi = (p1 - word * 64).min(64);
            let mask = if hi - lo == 64 {
                !0u64
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            let taken = self.bits[word].fetch_and(!mask, Ordering::Relaxed) & mask;
            let mut w = taken;
            while w != 0 {
                let bit = w.trailing_zeros() as usize;
                let p = word * 64 + bit;
                push_run(&mut runs, p * PAGE_SIZE..(p + 1) * PAGE_SIZE);
                w &= w - 1;
            }
            page = word * 64 + hi;
        }
        let mut result = Ok(());
        for run in &runs {
            if result.is_ok() {
                result = self.mprotect(run.clone(), libc::PROT_READ);
            }
            push_run(out, run.clone());
        }
        self.scratch = runs;
        result
    }
}

impl Drop for MprotectTracker {
    fn drop(&mut self) {
        // Make the region writable before releasing the slot (slot invariant).
        let _ = self.mprotect(0..self.len, libc::PROT_READ | libc::PROT_WRITE);
        self.slot.base.store(0, Ordering::Release);
        self.slot
            .bits
            .store(std::ptr::null_mut(), Ordering::Release);
    }
}
