//! The `luasnap` command-line tool.
#![forbid(unsafe_code)]

fn main() {
    let support = luasnap::alloc::probe_trackers();
    println!("luasnap {}", env!("CARGO_PKG_VERSION"));
    match support.best() {
        Some(kind) => println!("page tracker: {kind}"),
        None => println!("page tracker: none (snapshots use full copies)"),
    }
}
