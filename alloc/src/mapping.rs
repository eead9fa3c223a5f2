//! Reserving address space that costs nothing until touched.
//!
//! memmap2 cannot place a mapping at a chosen address, which the deterministic profile needs
//! (pointer-keyed hashing in Lua depends on addresses), so this calls `mmap` directly.

use crate::error::{errno, ArenaError, ErrnoText};
use std::ptr::NonNull;

/// The page size the allocator's map is laid out for.
pub const PAGE_SIZE: usize = 4096;

/// An anonymous private mapping reserved with `MAP_NORESERVE`: untouched pages cost neither
/// memory nor commit charge. Unmapped on drop.
#[derive(Debug)]
#[allow(clippy::len_without_is_empty)]
pub struct Reservation {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the reservation is plain memory owned by this value; moving the owner between threads
// moves nothing that is tied to a thread.
unsafe impl Send for Reservation {}

/// The end of user address space on the largest 64-bit layouts (5-level paging: 56 bits); a
/// fixed range past it is refused before asking the kernel.
const ADDRESS_SPACE_END: usize = 1 << 56;

/// Linux's default `vm.mmap_min_addr`: no program maps below it.
const MIN_FIXED_ADDRESS: usize = 0x10000;

impl Reservation {
    /// Reserves `len` bytes (rounded up to whole pages), at `fixed` if given.
    ///
    /// A fixed address is never mapped over: if any part of the range is in use the call fails
    /// with [`ArenaError::AddressInUse`].
    /// A range outside user space fails with [`ArenaError::BaseOutOfRange`].
    pub fn new(len: usize, fixed: Option<usize>) -> Result<Self, ArenaError> {
        check_page_size()?;
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let hint = match fixed {
            Some(address) => {
                if address < MIN_FIXED_ADDRESS {
                    return Err(ArenaError::BaseTooLow {
                        address,
                        min: MIN_FIXED_ADDRESS,
                    });
                }
                if address % PAGE_SIZE != 0 {
                    return Err(ArenaError::MisalignedBase {
                        address,
                        page_size: PAGE_SIZE,
                    });
                }
                if address
                    .checked_add(len)
                    .is_none_or(|end| end > ADDRESS_SPACE_END)
                {
                    return Err(ArenaError::BaseOutOfRange {
                        address,
                        capacity: len,
                        end: ADDRESS_SPACE_END,
                    });
                }
                flags |= libc::MAP_FIXED_NOREPLACE;
                address as *mut libc::c_void
            }
            None => std::ptr::null_mut(),
        };
        // SAFETY: an anonymous mapping with MAP_FIXED_NOREPLACE (or no address) cannot replace
        // any existing mapping, so no memory owned by anyone else is affected.
        let ptr =
            unsafe { libc::mmap(hint, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if ptr == libc::MAP_FAILED {
            let e = errno();
            return Err(match (fixed, e) {
                (Some(address), libc::EEXIST) => ArenaError::AddressInUse {
                    address,
                    capacity: len,
                },
                // Past the end of this process's address space (47 bits without 5-level paging).
                (Some(address), libc::ENOMEM | libc::EINVAL) if address + len > 1 << 47 => {
                    ArenaError::BaseOutOfRange {
                        address,
                        capacity: len,
                        end: 1 << 47,
                    }
                }
                _ => ArenaError::ReserveFailed {
                    capacity: len,
                    errno: e,
                    message: ErrnoText(e).to_string(),
                },
            });
        }
        let got = Reservation {
            base: NonNull::new(ptr.cast()).expect("mmap returned a null mapping"),
            len,
        };
        if let Some(address) = fixed {
            // Kernels before 4.17 ignore MAP_FIXED_NOREPLACE and treat the address as a hint.
            if got.base.as_ptr() as usize != address {
                drop(got);
                return Err(ArenaError::AddressInUse {
                    address,
                    capacity: len,
                });
            }
        }
        // Huge pages would be split on the first write-protect fault and defeat page tracking;
        // failure here only costs performance, so it is ignored.
        // SAFETY: the range is our own mapping.
        unsafe {
            libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE);
        }
        Ok(got)
    }

    /// Reserves `len` bytes for copies of an arena (snapshot buffers), backed by transparent
    /// huge pages where the kernel has them.
    ///
    /// A buffer that is never write-tracked has no reason for 4 KiB pages: a copy of a few MiB
    /// into or out of it then walks one TLB entry per 2 MiB instead of one per page (on the
    /// library games, saves and loads of whole copies about a tenth cheaper, `docs/gc.md`,
    /// "Snapshot buffers on huge pages"). Memory is committed in 2 MiB steps where the kernel
    /// grants huge pages. Where it does not (`transparent_hugepage` set to `never`), this is
    /// [`Reservation::new`]. Never use it for an arena: huge pages would defeat page tracking.
    pub fn for_copies(len: usize) -> Result<Self, ArenaError> {
        let got = Reservation::new(len, None)?;
        // Failure only costs speed, so it is ignored. `new` asked for no huge pages; this
        // replaces that advice.
        // SAFETY: the range is exactly our own mapping, created above.
        unsafe {
            libc::madvise(got.base.as_ptr().cast(), got.len, libc::MADV_HUGEPAGE);
        }
        Ok(got)
    }

    /// First byte of the reservation.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The whole mapping as bytes. Untouched pages read as zero.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable for len bytes and owned by self.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// The whole mapping as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is writable for len bytes and `&mut self` makes access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }

    /// Touches every page in `range` (offsets) so later copies into it do not page-fault.
    pub fn prefault(&mut self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.len);
        let mut off = range.start - range.start % PAGE_SIZE;
        while off < end {
            // SAFETY: off < len, inside our mapping; a volatile read-modify-write of one byte
            // leaves the content unchanged and commits the page.
            unsafe {
                let p = self.base.as_ptr().add(off);
                p.write_volatile(p.read_volatile());
            }
            off += PAGE_SIZE;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: base/len describe exactly the mapping created in `new`, owned by self.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

fn check_page_size() -> Result<(), ArenaError> {
    // SAFETY: sysconf has no preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ps as usize != PAGE_SIZE {
        return Err(ArenaError::UnsupportedPageSize {
            page_size: ps as usize,
        });
    }
    Ok(())
}
