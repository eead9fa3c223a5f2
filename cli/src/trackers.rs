//! `luasnap trackers`.

/// Prints what each page-tracking mechanism does here.
pub fn trackers() {
    let s = luasnap::alloc::probe_trackers();
    let show = |r: &Result<(), String>| match r {
        Ok(()) => "works".to_string(),
        Err(why) => format!("unavailable: {why}"),
    };
    println!("userfaultfd + PAGEMAP_SCAN: {}", show(&s.uffd));
    println!("mprotect + SIGSEGV:         {}", show(&s.mprotect));
    match s.best() {
        Some(kind) => println!("incremental snapshots use: {kind}"),
        None => println!("incremental snapshots use: none (full copies)"),
    }
}
