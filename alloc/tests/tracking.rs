//! Written-page tracking: each mechanism forced in turn, writes from syscalls, two arenas at
//! once, and the SIGSEGV handler handing foreign faults on to the previous handler.

use luasnap_alloc::{
    probe_trackers, Arena, TrackError, TrackerKey, TrackerKind, TrackerPreference, PAGE_SIZE,
};
use std::ops::Range;

const MIB: usize = 1 << 20;

/// The mechanisms that work on this machine. uffd needs Linux 6.7+ and is refused by some
/// container seccomp profiles; mprotect works on any Linux.
fn kinds() -> Vec<TrackerKind> {
    let support = probe_trackers();
    assert!(
        support.mprotect.is_ok(),
        "mprotect tracking must work on Linux: {:?}",
        support.mprotect
    );
    let mut v = vec![TrackerKind::Mprotect];
    match support.uffd {
        Ok(()) => v.push(TrackerKind::Uffd),
        Err(why) => eprintln!("note: userfaultfd tracking unavailable here, not tested: {why}"),
    }
    v
}

fn data_range(a: &Arena, pages: usize) -> Range<usize> {
    let start = a.state_ranges().data.start;
    start..start + pages * PAGE_SIZE
}

fn write_page(a: &mut Arena, offset: usize) {
    // SAFETY: offset lies inside the arena; the test owns every byte it writes.
    unsafe { a.base().as_ptr().add(offset).write_volatile(0x5A) };
}

fn collect(a: &mut Arena, key: &TrackerKey, range: Range<usize>) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    a.tracker_mut(key)
        .unwrap()
        .collect(range, &mut out)
        .unwrap();
    out
}

#[test]
fn each_mechanism_reports_exactly_the_written_pages() {
    for kind in kinds() {
        let mut a = Arena::new(64 * MIB).unwrap();
        let key = a.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        assert_eq!(key.kind(), kind);
        assert_eq!(a.tracker_kind(), Some(kind));
        let r = data_range(&a, 64);
        let base = r.start;
        a.tracker_mut(&key).unwrap().arm(r.clone()).unwrap();
        assert_eq!(
            collect(&mut a, &key, r.clone()),
            vec![],
            "{kind}: nothing written yet"
        );
        for p in [3, 4, 10, 63] {
            write_page(&mut a, base + p * PAGE_SIZE + 17);
        }
        write_page(&mut a, base + 3 * PAGE_SIZE + 99); // second write to a page: still one page
        let pages = |v: Vec<Range<usize>>| -> Vec<Range<usize>> {
            v.into_iter()
                .map(|x| (x.start - base) / PAGE_SIZE..(x.end - base) / PAGE_SIZE)
                .collect()
        };
        assert_eq!(
            pages(collect(&mut a, &key, r.clone())),
            vec![3..5, 10..11, 63..64],
            "{kind}"
        );
        assert_eq!(
            collect(&mut a, &key, r.clone()),
            vec![],
            "{kind}: collect re-arms"
        );
        write_page(&mut a, base + 10 * PAGE_SIZE);
        assert_eq!(
            pages(collect(&mut a, &key, r.clone())),
            vec![10..11],
            "{kind}"
        );
        // A page outside the armed range is not reported by a scan of the armed range.
        write_page(&mut a, base + 100 * PAGE_SIZE);
        assert_eq!(collect(&mut a, &key, r.clone()), vec![], "{kind}");
        // Disarmed pages are writable at full speed and not recorded.
        a.tracker_mut(&key).unwrap().disarm(r.clone()).unwrap();
        write_page(&mut a, base + 5 * PAGE_SIZE);
        a.tracker_mut(&key).unwrap().arm(r.clone()).unwrap();
        assert_eq!(
            collect(&mut a, &key, r.clone()),
            vec![],
            "{kind}: arming forgets earlier writes"
        );
    }
}

/// Collecting consumes records, so only the holder of the key from `enable_tracking` reaches
/// the tracker, and only while tracking still runs as it was enabled.
#[test]
fn a_tracker_key_opens_only_its_own_tracker() {
    for kind in kinds() {
        let mut a = Arena::new(16 * MIB).unwrap();
        let mut b = Arena::new(16 * MIB).unwrap();
        let first = a.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        let of_b = b.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        assert!(a.tracker_mut(&first).is_some(), "{kind}");
        assert!(
            a.tracker_mut(&of_b).is_none(),
            "{kind}: another arena's key"
        );
        let second = a.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        assert!(a.tracker_mut(&first).is_none(), "{kind}: replaced tracker");
        assert!(a.tracker_mut(&second).is_some(), "{kind}");
        a.disable_tracking();
        assert!(a.tracker_mut(&second).is_none(), "{kind}: tracking off");
        assert!(b.tracker_mut(&of_b).is_some(), "{kind}");
    }
}

#[test]
fn writes_made_by_syscalls_are_not_missed() {
    for kind in kinds() {
        let mut a = Arena::new(16 * MIB).unwrap();
        let key = a.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        let r = data_range(&a, 16);
        a.tracker_mut(&key).unwrap().arm(r.clone()).unwrap();
        let target = r.start + 5 * PAGE_SIZE + 100;
        let msg = b"written by read(2)";
        let mut fds = [0; 2];
        // SAFETY: a plain pipe; both ends are closed below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: writes our own buffer into the pipe.
        assert_eq!(
            unsafe { libc::write(fds[1], msg.as_ptr().cast(), msg.len()) },
            msg.len() as isize
        );
        if kind == TrackerKind::Mprotect {
            // Without preparation the kernel cannot fault the page in: read(2) fails cleanly
            // with EFAULT and writes nothing, so no write is lost silently.
            // SAFETY: the destination is inside the arena; the kernel refuses the write.
            let n = unsafe { libc::read(fds[0], a.base().as_ptr().add(target).cast(), msg.len()) };
            assert_eq!(n, -1);
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EFAULT)
            );
        }
        a.prepare_external_write(target..target + msg.len())
            .unwrap();
        // SAFETY: the destination is inside the arena and has room for the message.
        let n = unsafe { libc::read(fds[0], a.base().as_ptr().add(target).cast(), msg.len()) };
        assert_eq!(n, msg.len() as isize, "{kind}: read into the arena failed");
        assert_eq!(a.bytes(target..target + msg.len()), msg);
        let got = collect(&mut a, &key, r.clone());
        assert_eq!(
            got,
            vec![r.start + 5 * PAGE_SIZE..r.start + 6 * PAGE_SIZE],
            "{kind}"
        );
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}

#[test]
fn two_arenas_are_tracked_independently() {
    for kind in kinds() {
        let mut a = Arena::new(16 * MIB).unwrap();
        let mut b = Arena::new(16 * MIB).unwrap();
        let ka = a.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        let kb = b.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        let (ra, rb) = (data_range(&a, 8), data_range(&b, 8));
        a.tracker_mut(&ka).unwrap().arm(ra.clone()).unwrap();
        b.tracker_mut(&kb).unwrap().arm(rb.clone()).unwrap();
        write_page(&mut a, ra.start + PAGE_SIZE);
        write_page(&mut b, rb.start + 6 * PAGE_SIZE);
        assert_eq!(
            collect(&mut a, &ka, ra.clone()),
            vec![ra.start + PAGE_SIZE..ra.start + 2 * PAGE_SIZE]
        );
        assert_eq!(
            collect(&mut b, &kb, rb.clone()),
            vec![rb.start + 6 * PAGE_SIZE..rb.start + 7 * PAGE_SIZE]
        );
        // Dropping one tracked arena leaves the other tracked.
        drop(a);
        write_page(&mut b, rb.start);
        assert_eq!(
            collect(&mut b, &kb, rb.clone()),
            vec![rb.start..rb.start + PAGE_SIZE]
        );
    }
}

#[test]
fn the_allocator_works_on_armed_pages() {
    // Allocation writes the map and blocks; under tracking every such write must go through.
    for kind in kinds() {
        let mut a = Arena::new(64 * MIB).unwrap();
        let key = a.enable_tracking(TrackerPreference::Only(kind)).unwrap();
        let mut blocks: Vec<_> = (0..500).map(|i| a.alloc(32 + i * 7).unwrap()).collect();
        let s = a.state_ranges();
        let t = a.tracker_mut(&key).unwrap();
        t.arm(s.meta.start..s.meta.end.next_multiple_of(PAGE_SIZE))
            .unwrap();
        t.arm(s.data.clone()).unwrap();
        for (i, p) in blocks.iter_mut().enumerate().step_by(3) {
            // SAFETY: each block is live with at least 32 bytes.
            unsafe { p.as_ptr().write_bytes(i as u8, 32) };
        }
        let q = a.alloc(100_000).unwrap();
        // SAFETY: q is a live 100000-byte block.
        unsafe { q.as_ptr().write_bytes(1, 100_000) };
        let mut runs = Vec::new();
        a.tracker_mut(&key)
            .unwrap()
            .collect(s.data.clone(), &mut runs)
            .unwrap();
        assert!(!runs.is_empty());
        a.verify().unwrap();
    }
}

#[test]
fn unknown_mechanism_request_is_a_typed_error_when_unavailable() {
    // Whatever is unavailable here must be reported as such, not panic or half-work.
    let support = probe_trackers();
    let mut a = Arena::new(4 * MIB).unwrap();
    match (
        support.uffd.is_ok(),
        a.enable_tracking(TrackerPreference::Only(TrackerKind::Uffd))
            .map(|key| key.kind()),
    ) {
        (true, Ok(TrackerKind::Uffd)) => {}
        (
            false,
            Err(TrackError::Unavailable {
                kind: TrackerKind::Uffd,
                ..
            }),
        ) => {}
        (ok, other) => panic!("probe said uffd ok={ok}, enable gave {other:?}"),
    }
    a.disable_tracking();
    assert_eq!(a.tracker_kind(), None);
    assert_eq!(
        a.enable_tracking(TrackerPreference::Auto).unwrap().kind(),
        support.best().unwrap()
    );
}

/// The environment variable that names the test a child process runs (its child branch).
const SEGV_CHILD: &str = "LUASNAP_SEGV_CHILD";

/// Whether this process is the child test `name` started ([`ended_in_child`]).
fn is_child(name: &str) -> bool {
    std::env::var(SEGV_CHILD).as_deref() == Ok(name)
}

/// Runs test `name` again in a child process (this test binary, filtered to it), where
/// [`is_child`] is true, and returns how the child ended.
fn ended_in_child(name: &str) -> std::process::ExitStatus {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(SEGV_CHILD, name)
        .output()
        .unwrap();
    eprintln!("child {name}: {}", String::from_utf8_lossy(&out.stderr));
    out.status
}

/// The signal that ended `status`, if one did.
fn signal_of(status: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// An arena whose pages mprotect tracking watches, and its tracker's key: the tracker's
/// SIGSEGV handler is installed.
fn mprotect_tracked_arena() -> (Arena, TrackerKey) {
    let mut a = Arena::new(4 * MIB).unwrap();
    let key = a
        .enable_tracking(TrackerPreference::Only(TrackerKind::Mprotect))
        .unwrap();
    (a, key)
}

/// Runs in a child process: enables mprotect tracking, then writes to a PROT_NONE page that no
/// tracker owns. The handler must hand the fault on, so the process dies of SIGSEGV.
#[test]
fn foreign_faults_still_crash_the_process() {
    const NAME: &str = "foreign_faults_still_crash_the_process";
    if is_child(NAME) {
        let _tracked = mprotect_tracked_arena();
        // SAFETY: maps a fresh inaccessible page; writing to it faults by design.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            (p as *mut u8).write_volatile(1);
        }
        unreachable!("the write above must not succeed");
    }
    let status = ended_in_child(NAME);
    assert_eq!(
        signal_of(status),
        Some(libc::SIGSEGV),
        "child ended with {status:?}"
    );
}

/// A SIGSEGV sent with `kill` (as `kill -SEGV` from a shell does: `si_code` SI_USER, no fault)
/// while mprotect tracking is on ends the process as it would without the tracker. The
/// handler before it is Rust's stack-overflow handler, which puts the default action back and
/// returns, counting on a fault to repeat; a sent signal has none, so it was lost and the
/// process went on. The child's `kill` reaches the process (any of its threads), so the test
/// ends whichever thread takes it: a lost signal lets the child's test pass and exit 0.
#[test]
fn a_segv_sent_by_kill_still_ends_the_process() {
    const NAME: &str = "a_segv_sent_by_kill_still_ends_the_process";
    if is_child(NAME) {
        let _tracked = mprotect_tracked_arena();
        // SAFETY: sends SIGSEGV to this process, which is what the test is about.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGSEGV) }, 0);
        return;
    }
    let status = ended_in_child(NAME);
    assert_eq!(
        signal_of(status),
        Some(libc::SIGSEGV),
        "child ended with {status:?}"
    );
}

/// A SIGSEGV a thread sends itself (`raise`: `si_code` SI_TKILL) while the action before the
/// tracker's handler was the default one ends the process: it arrives before `raise` returns,
/// and a lost one lets the child's test pass and exit 0.
#[test]
fn a_segv_raised_with_the_default_action_before_ends_the_process() {
    const NAME: &str = "a_segv_raised_with_the_default_action_before_ends_the_process";
    if is_child(NAME) {
        // SAFETY: puts back the default action before the tracker installs its handler (the
        // first tracker of this process does).
        unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        let _tracked = mprotect_tracked_arena();
        // SAFETY: sends SIGSEGV to this thread, which is what the test is about.
        unsafe { libc::raise(libc::SIGSEGV) };
        return;
    }
    let status = ended_in_child(NAME);
    assert_eq!(
        signal_of(status),
        Some(libc::SIGSEGV),
        "child ended with {status:?}"
    );
}

/// A sent SIGSEGV that was ignored before the tracker's handler came is ignored still, and the
/// tracker goes on recording writes: the handler hands it over as if it were not there.
#[test]
fn a_sent_segv_ignored_before_stays_ignored() {
    const NAME: &str = "a_sent_segv_ignored_before_stays_ignored";
    if is_child(NAME) {
        // SAFETY: ignores SIGSEGV before the tracker installs its handler.
        unsafe { libc::signal(libc::SIGSEGV, libc::SIG_IGN) };
        let (mut a, key) = mprotect_tracked_arena();
        let range = data_range(&a, 4);
        a.tracker_mut(&key).unwrap().arm(range.clone()).unwrap();
        // SAFETY: sends SIGSEGV to this thread, which is what the test is about.
        unsafe { libc::raise(libc::SIGSEGV) };
        write_page(&mut a, range.start + PAGE_SIZE);
        let page = range.start + PAGE_SIZE..range.start + 2 * PAGE_SIZE;
        assert_eq!(collect(&mut a, &key, range), vec![page]);
        return;
    }
    let status = ended_in_child(NAME);
    assert!(status.success(), "child ended with {status:?}");
}
