//! Snapshot buffers ask for transparent huge pages; arenas never do.

use luasnap_alloc::Reservation;

/// The `THPeligible` field of the mapping that holds `addr`, from `/proc/self/smaps`.
fn thp_eligible(addr: usize) -> Option<bool> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("THPeligible:") {
                return Some(v.trim() == "1");
            }
        }
    }
    None
}

#[test]
fn copy_buffers_ask_for_huge_pages_and_arenas_do_not() {
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let len = 64 << 20;
    let mut copies = Reservation::for_copies(len).expect("reserve a copy buffer");
    let arena = Reservation::new(len, None).expect("reserve an arena's range");
    // The buffer is ordinary memory either way.
    copies.as_mut_slice()[len - 1] = 7;
    assert_eq!(copies.as_slice()[len - 1], 7);
    assert_eq!(copies.as_slice()[0], 0);

    if mode.contains("[never]") || thp_eligible(copies.base().as_ptr() as usize).is_none() {
        eprintln!("transparent huge pages off or not reported here: eligibility not checked");
        return;
    }
    assert_eq!(
        thp_eligible(copies.base().as_ptr() as usize),
        Some(true),
        "a copy buffer must be eligible for huge pages (transparent_hugepage: {})",
        mode.trim()
    );
    assert_eq!(
        thp_eligible(arena.base().as_ptr() as usize),
        Some(false),
        "an arena's range must never get huge pages: they would defeat page tracking"
    );
}
