//! What a frame writes, in pages: the things luasnap does so that a frame does not write pages
//! whose bytes it leaves unchanged or that a better placement would keep together. Page counts
//! come from the snapshot ring's written-page tracking (deterministic; no timing).

use luasnap::alloc::{probe_trackers, TrackerPreference, PAGE_SIZE};
use luasnap::bridge::{GcMode, SnapshotMode, Vm};

/// A deterministic VM with incremental snapshots, this collector and this rule for removed
/// keys set again (Lua patch 11; the profile's default is `true`).
fn vm(gc: GcMode, fresh_keys: bool) -> Option<Vm> {
    if probe_trackers().best().is_none() {
        eprintln!("note: no page tracker works here; not tested");
        return None;
    }
    let vm = Vm::builder()
        .capacity(256 << 20)
        .deterministic(1)
        .fresh_keys(fresh_keys)
        .gc(gc)
        .snapshot_mode(SnapshotMode::Incremental(TrackerPreference::Auto))
        .full_copy_above(1.0)
        .build()
        .unwrap();
    Some(vm)
}

/// Pages the latest snapshot copied as written since the one before.
fn written_pages(vm: &Vm) -> usize {
    let runs = vm
        .snapshots()
        .last_written()
        .expect("an incremental snapshot");
    runs.iter().map(|r| r.len() / PAGE_SIZE).sum()
}

#[test]
fn setting_a_key_whose_value_is_nil_does_not_rewrite_the_tables_header() {
    // Lua clears a table's metamethod-absence cache whenever an assignment goes past its fast
    // path, as it does when the key is in the table with a nil value: `cell.holder = who`
    // after `cell.holder = nil`, which the AI village game does for ~150 map cells a frame.
    // The patched Lua writes the byte only when a bit is set, so the table headers (their own
    // size class, about 35 pages for 3,000 tables) stay unwritten: the frame writes what an
    // update of an existing field writes, the hash parts (96-byte blocks, about 70 pages).
    // Four fields fill four nodes, and `holder` is not in its main position: under the
    // deterministic profile's rule for removed keys (Lua patch 11) setting it again inserts
    // it anew, and with no free node that rehashes every table, as stock Lua does once the
    // collector has marked the key dead. So: the stock rule with a full table, and the
    // profile's rule with a free node (a fifth field).
    for (fresh, fields) in [
        (false, "a = i, b = 0, c = 0, holder = 0"),
        (true, "a = i, b = 0, c = 0, d = 0, holder = 0"),
    ] {
        assign_after_clear(fresh, fields);
    }
}

/// The test above, for tables `{ fields }`.
fn assign_after_clear(fresh_keys: bool, fields: &str) {
    let Some(mut vm) = vm(GcMode::INCREMENTAL, fresh_keys) else {
        return;
    };
    vm.exec(
        format!("ts = {{}} for i = 1, 3000 do ts[i] = {{ {fields} }} end"),
        "=setup",
    )
    .unwrap();
    vm.gc_collect().unwrap();
    vm.gc_running(false);
    // (A collection now would turn the nil-valued keys dead, and the assignment would rehash.)
    vm.exec("for i = 1, 3000 do ts[i].holder = nil end", "=clear")
        .unwrap();
    vm.snapshot().unwrap();
    vm.exec("for i = 1, 3000 do ts[i].a = -i end", "=update")
        .unwrap();
    vm.snapshot().unwrap();
    let updating = written_pages(&vm);
    vm.exec("for i = 1, 3000 do ts[i].holder = i end", "=assign")
        .unwrap();
    vm.snapshot().unwrap();
    let assigning = written_pages(&vm);
    // Each chunk also writes a few pages of its own (its closure, stack, call records).
    assert!(
        updating >= 60 && assigning <= updating + 6,
        "fresh keys {fresh_keys}, {{ {fields} }}: setting a nil-valued key wrote {assigning} \
         pages, updating a field {updating}"
    );
}

#[test]
fn an_old_table_given_a_young_value_keeps_its_header_unwritten() {
    // In stock Lua's generational mode the write barrier paints such a table gray and links it
    // into a gray list through its header, and the next two young collections write the header
    // again: an ECS that gives its 3,000 old entities a new component each frame writes their
    // headers (about 35 pages of their own size class) on top of the hash parts it updates.
    // The patched Lua records the tables in a buffer of its own (Lua patch 12), so the frame
    // writes what an update with a number writes, plus that buffer (3,000 entries: 6 pages).
    let Some(mut vm) = vm(GcMode::GENERATIONAL, true) else {
        return;
    };
    vm.exec(
        "ts = {}
         for i = 1, 3000 do ts[i] = { a = i, b = 0, c = 0, p = 0 } end
         function touch(tag) local y = { tag = tag } for i = 1, 3000 do ts[i].p = y end end
         touch('first')  -- the buffer grows to its size once",
        "=setup",
    )
    .unwrap();
    vm.gc_collect().unwrap(); // everything old
    vm.gc_running(false);
    vm.snapshot().unwrap();
    vm.exec("for i = 1, 3000 do ts[i].a = -i end", "=update")
        .unwrap();
    vm.snapshot().unwrap();
    let updating = written_pages(&vm);
    vm.exec("touch('young')", "=touch").unwrap();
    vm.snapshot().unwrap();
    let touching = written_pages(&vm);
    assert!(
        updating >= 60 && touching <= updating + 12,
        "giving old tables a young value wrote {touching} pages, updating a field {updating}"
    );
    // The young table is reachable only through the old ones: young collections must keep it
    // (each traverses the recorded tables), and so must the one that makes it old.
    vm.gc_running(true);
    for _ in 0..4 {
        vm.gc_step().unwrap();
        vm.exec(
            "assert(ts[1].p.tag == 'young' and ts[3000].p == ts[1].p)",
            "=check",
        )
        .unwrap();
    }
}

#[test]
fn storing_the_value_a_slot_holds_writes_no_page() {
    // A frame often stores the value a field already holds (a system setting a component to
    // what it was, `#list` read again): stock Lua writes the slot, or the array's length hint,
    // anyway, and the incremental snapshot copies its page. The patched Lua stores a table
    // value, and the hint, only when the bytes change (Lua patch 13). 3,000 tables with a
    // hash part and 3,000 with an array part lie on about 70 pages each: storing what they
    // hold must write only what running any chunk writes, where other values write them all.
    let Some(mut vm) = vm(GcMode::INCREMENTAL, true) else {
        return;
    };
    vm.exec(
        "ts, arrs = {}, {}
         for i = 1, 3000 do
           ts[i] = { a = i, b = 0.5, c = false, d = 'x' }
           arrs[i] = { i, 0.5, true, 'x' }
           assert(#arrs[i] == 4)  -- the length hint set once
         end",
        "=setup",
    )
    .unwrap();
    vm.gc_collect().unwrap();
    vm.gc_running(false);
    vm.snapshot().unwrap();
    // What running any chunk writes (its compilation, closure, stack, call records).
    vm.exec("local x = 1", "=nothing").unwrap();
    vm.snapshot().unwrap();
    let nothing = written_pages(&vm);
    for (what, chunk) in [
        (
            "fields",
            "for i = 1, 3000 do local t = ts[i] t.a, t.b, t.c, t.d = i, 0.5, false, 'x' end",
        ),
        (
            "array slots and lengths",
            "for i = 1, 3000 do
               local t = arrs[i] t[1], t[2], t[3], t[4] = i, 0.5, true, 'x'
               assert(#t == 4)
             end",
        ),
    ] {
        vm.exec(chunk, "=same").unwrap();
        vm.snapshot().unwrap();
        let same = written_pages(&vm);
        // -0.5 differs from 0.5 in its sign bit only.
        vm.exec(chunk.replace("0.5", "-0.5"), "=other").unwrap();
        vm.snapshot().unwrap();
        let other = written_pages(&vm);
        vm.exec(chunk, "=back").unwrap(); // the first values again, for the next case
        vm.snapshot().unwrap();
        assert!(
            other >= nothing + 60 && same <= nothing + 4,
            "{what}: storing the values they hold wrote {same} pages, other values {other}, \
             an empty chunk {nothing}"
        );
    }
}
