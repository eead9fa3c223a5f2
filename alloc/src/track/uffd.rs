//! userfaultfd asynchronous write-protect + `PAGEMAP_SCAN` (Linux 6.7+).
//!
//! The `libc` crate has neither `PAGEMAP_SCAN` nor the newer uffd feature bits, so the few
//! definitions needed are here, from `include/uapi/linux/{fs,userfaultfd}.h`.

use super::{push_run, TrackerKind};
use crate::error::{errno, ErrnoText, TrackError};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

const fn iowr(ty: u32, nr: u32, size: usize) -> libc::c_ulong {
    ((3u32 << 30) | ((size as u32) << 16) | (ty << 8) | nr) as libc::c_ulong
}

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const UFFDIO_API: libc::c_ulong = iowr(0xAA, 0x3F, 24);
const UFFDIO_REGISTER: libc::c_ulong = iowr(0xAA, 0x00, 32);
const UFFDIO_WRITEPROTECT: libc::c_ulong = iowr(0xAA, 0x06, 24);
/// `_IOR(0xAA, 0x01, struct uffdio_range)`.
const UFFDIO_UNREGISTER: libc::c_ulong =
    ((2u32 << 30) | (16u32 << 16) | (0xAAu32 << 8) | 0x01) as libc::c_ulong;
/// `_IO(0xAA, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;

const PAGEMAP_SCAN: libc::c_ulong = iowr(b'f' as u32, 16, std::mem::size_of::<PmScanArg>());
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// The kernel copies its output in chunks of this many regions; asking for more gains nothing.
const SCAN_VEC_LEN: usize = 512;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

pub(super) struct UffdTracker {
    uffd: OwnedFd,
    pagemap: OwnedFd,
    regions: Vec<PageRegion>,
    /// The registered range: unregistered on drop (see `Drop`).
    start: u64,
    len: u64,
}

/// Unregisters the range before the descriptor closes. Closing alone releases the registration
/// only when the last reference to the descriptor goes, and a child forked by another thread
/// holds one until it execs: a tracker enabled again on the same arena meanwhile failed
/// UFFDIO_REGISTER with EBUSY. Unregistering acts on this process's mappings at once (and clears
/// the write-protection as the release would).
impl Drop for UffdTracker {
    fn drop(&mut self) {
        let mut range = UffdioRange {
            start: self.start,
            len: self.len,
        };
        // SAFETY: unregisters the range this tracker registered, on its own descriptor;
        // UFFDIO_UNREGISTER reads a struct we own. A failure leaves the release to the close.
        unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_UNREGISTER, &mut range) };
    }
}

fn unavailable(reason: String) -> TrackError {
    TrackError::Unavailable {
        kind: TrackerKind::Uffd,
        reason,
    }
}

fn failed(call: &'static str) -> TrackError {
    TrackError::Syscall {
        kind: TrackerKind::Uffd,
        call,
        errno: errno(),
    }
}

fn open_uffd() -> Result<OwnedFd, TrackError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: the userfaultfd syscall takes only flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
    if fd >= 0 {
        // SAFETY: fd is a fresh descriptor we own.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    }
    let syscall_err = errno();
    // /dev/userfaultfd hands out descriptors to whoever may open the device, even where the
    // syscall is limited by vm.unprivileged_userfaultfd.
    // SAFETY: a plain open of a NUL-terminated path.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(unavailable(format!(
            "userfaultfd(2) failed ({}) and /dev/userfaultfd could not be opened ({})",
            ErrnoText(syscall_err),
            ErrnoText(errno())
        )));
    }
    // SAFETY: dev is a fresh descriptor we own.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument and returns a new fd.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW, flags) };
    if fd < 0 {
        return Err(unavailable(format!(
            "userfaultfd(2) failed ({}) and USERFAULTFD_IOC_NEW failed ({})",
            ErrnoText(syscall_err),
            ErrnoText(errno())
        )));
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl UffdTracker {
    pub(super) fn new(base: NonNull<u8>, len: usize) -> Result<Self, TrackError> {
        let uffd = open_uffd()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a UffdioApi we own.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            return Err(unavailable(format!(
                "the kernel lacks UFFD_FEATURE_WP_ASYNC (needs Linux 6.7+): {}",
                ErrnoText(errno())
            )));
        }
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: base.as_ptr() as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: registers our own mapping; UFFDIO_REGISTER reads/writes a struct we own.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) } != 0 {
            return Err(unavailable(format!(
                "UFFDIO_REGISTER in write-protect mode failed: {}",
                ErrnoText(errno())
            )));
        }
        // SAFETY: a plain open of a NUL-terminated path.
        let pm = unsafe {
            libc::open(
                c"/proc/self/pagemap".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if pm < 0 {
            return Err(unavailable(format!(
                "cannot open /proc/self/pagemap: {}",
                ErrnoText(errno())
            )));
        }
        // SAFETY: pm is a fresh descriptor we own.
        let pagemap = unsafe { OwnedFd::from_raw_fd(pm) };
        let mut t = UffdTracker {
            uffd,
            pagemap,
            regions: vec![PageRegion::default(); SCAN_VEC_LEN],
            start: base.as_ptr() as u64,
            len: len as u64,
        };
        // An empty scan of the first page tells whether PAGEMAP_SCAN exists (Linux 6.7+).
        let mut probe = Vec::new();
        t.collect(base, 0..crate::PAGE_SIZE, &mut probe)
            .map_err(|e| {
                unavailable(format!(
                    "PAGEMAP_SCAN does not work here (needs Linux 6.7+): {e}"
                ))
            })?;
        Ok(t)
    }

    pub(super) fn protect(
        &mut self,
        base: NonNull<u8>,
        range: Range<usize>,
        on: bool,
    ) -> Result<(), TrackError> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: base.as_ptr() as u64 + range.start as u64,
                len: range.len() as u64,
            },
            mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        };
        // SAFETY: changes write-protection of our own registered mapping.
        if unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut wp) } != 0 {
            return Err(failed("UFFDIO_WRITEPROTECT"));
        }
        Ok(())
    }

    pub(super) fn collect(
        &mut self,
        base: NonNull<u8>,
        range: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        self.scan(base, range, out, true)
    }

    /// Like `collect` without re-arming: the pages stay writable (and reported) until armed.
    pub(super) fn peek(
        &mut self,
        base: NonNull<u8>,
        range: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        self.scan(base, range, out, false)
    }

    fn scan(
        &mut self,
        base: NonNull<u8>,
        range: Range<usize>,
        out: &mut Vec<Range<usize>>,
        rearm: bool,
    ) -> Result<(), TrackError> {
        let b = base.as_ptr() as u64;
        let end = b + range.end as u64;
        let mut start = b + range.start as u64;
        while start < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: if rearm {
                    PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC
                } else {
                    PM_SCAN_CHECK_WPASYNC
                },
                start,
                end,
                walk_end: 0,
                vec: self.regions.as_mut_ptr() as u64,
                vec_len: self.regions.len() as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: PAGE_IS_WRITTEN,
                category_anyof_mask: 0,
                return_mask: PAGE_IS_WRITTEN,
            };
            // SAFETY: the kernel writes at most vec_len PageRegions into our buffer and reads
            // the rest of `arg`; the scanned range is our own registered mapping.
            let n = unsafe { libc::ioctl(self.pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
            if n < 0 {
                return Err(failed("PAGEMAP_SCAN"));
            }
            for r in &self.regions[..n as usize] {
                push_run(out, (r.start - b) as usize..(r.end - b) as usize);
            }
            if arg.walk_end <= start {
                return Err(failed("PAGEMAP_SCAN (no progress)"));
            }
            start = arg.walk_end;
        }
        Ok(())
    }
}
