//! Errors of the arena and of page tracking.

use std::fmt;

/// Why an [`Arena`](crate::Arena) could not be created or reconfigured.
///
/// Every variant carries the values involved and its message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArenaError {
    /// The requested capacity is below the minimum the allocator needs for its map and one page.
    #[error("arena capacity {requested} bytes is too small: use at least {minimum} bytes")]
    CapacityTooSmall {
        /// The capacity that was asked for.
        requested: usize,
        /// The smallest capacity accepted.
        minimum: usize,
    },
    /// The requested capacity is beyond what the allocator can address.
    #[error("arena capacity {requested} bytes is too large: the allocator addresses at most {maximum} bytes; use a smaller capacity")]
    CapacityTooLarge {
        /// The capacity that was asked for.
        requested: usize,
        /// The largest capacity accepted.
        maximum: usize,
    },
    /// The kernel refused to reserve the address range.
    #[error("could not reserve {capacity} bytes of address space (errno {errno}: {message}); use a smaller capacity or check `ulimit -v`")]
    ReserveFailed {
        /// The capacity that was asked for.
        capacity: usize,
        /// The OS error number.
        errno: i32,
        /// The OS error text.
        message: String,
    },
    /// A fixed base address was requested that is not page-aligned.
    #[error("base address {address:#x} is not aligned to the {page_size}-byte page size; pass a multiple of {page_size}")]
    MisalignedBase {
        /// The address that was asked for.
        address: usize,
        /// The system page size.
        page_size: usize,
    },
    /// A fixed base address below the lowest address Linux lets a program map.
    #[error("base address {address:#x} is too low: Linux keeps addresses below {min:#x} unmapped (vm.mmap_min_addr); choose a higher base address, for example 0x3e0000000000")]
    BaseTooLow {
        /// The address that was asked for.
        address: usize,
        /// The lowest address that can be asked for (Linux's default `vm.mmap_min_addr`).
        min: usize,
    },
    /// A fixed base address whose range does not fit in user address space.
    #[error("base address {address:#x} with {capacity} bytes of capacity is out of range: user address space ends at {end:#x}; choose a lower base address (for example 0x3e0000000000) or a smaller capacity")]
    BaseOutOfRange {
        /// The address that was asked for.
        address: usize,
        /// The capacity that was asked for.
        capacity: usize,
        /// Where user address space ends.
        end: usize,
    },
    /// Something is already mapped in the requested fixed range; the arena never maps over it.
    #[error("the range {address:#x}..{end:#x} is already in use in this process; choose another base address or let the OS choose", end = address + capacity)]
    AddressInUse {
        /// The address that was asked for.
        address: usize,
        /// The capacity that was asked for.
        capacity: usize,
    },
    /// The memory limit exceeds the capacity of the data region.
    #[error("memory limit {limit} bytes is above the arena's usable capacity of {usable} bytes; lower the limit or raise the capacity")]
    LimitAboveCapacity {
        /// The limit that was asked for.
        limit: usize,
        /// Bytes available for blocks in this arena.
        usable: usize,
    },
    /// The memory limit is below what the arena already uses.
    #[error("memory limit {limit} bytes is below the {in_use} bytes of live blocks the arena already holds; free memory first or choose a higher limit")]
    LimitBelowUsage {
        /// The limit that was asked for.
        limit: usize,
        /// Bytes of live blocks (after rounding to size classes and pages).
        in_use: usize,
    },
    /// The system page size is not the 4 KiB the allocator's map is laid out for.
    #[error(
        "the system page size is {page_size} bytes; luasnap's arena supports 4096-byte pages only"
    )]
    UnsupportedPageSize {
        /// The page size the OS reports.
        page_size: usize,
    },
}

/// The allocator's map inside an arena failed a consistency check.
///
/// Returned by [`Arena::verify`](crate::Arena::verify). It means the arena's bytes were
/// overwritten by something other than the allocator (a stray write, or a restore from a
/// snapshot of a different arena).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("arena map is corrupt at data page {page}: {what}")]
pub struct CorruptionError {
    /// The data page (index from the start of the data region) where the check failed.
    pub page: u32,
    /// What was found.
    pub what: String,
}

/// Why written-page tracking could not be started or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrackError {
    /// No mechanism of the requested kind works in this process.
    #[error("page tracking with {kind} is not available here: {reason}")]
    Unavailable {
        /// The mechanism that was asked for.
        kind: crate::TrackerKind,
        /// Why it failed (kernel too old, refused by a seccomp profile, ...).
        reason: String,
    },
    /// A system call failed while tracking was running.
    #[error(
        "page tracking with {kind} failed in {call} (errno {errno}); switch to full snapshots"
    )]
    Syscall {
        /// The active mechanism.
        kind: crate::TrackerKind,
        /// The failing call.
        call: &'static str,
        /// The OS error number.
        errno: i32,
    },
    /// Too many arenas are tracked with mprotect at once.
    #[error(
        "at most {max} arenas can be tracked with mprotect at once; drop a tracked arena first"
    )]
    TooManyTracked {
        /// The limit.
        max: usize,
    },
}

pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub(crate) struct ErrnoText(pub i32);

impl fmt::Display for ErrnoText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}
