//! Pages a rollback leaves open: the frames re-simulated after a rollback write the pages it
//! restored without a write fault, so no tracker sees those writes. Every such write must
//! still be saved by the next snapshot and undone by the next rollback. Random writes to a few
//! pages, snapshots and rollbacks (to any retained snapshot, several in a row, snapshots in
//! between) against a model that keeps a full copy of the block at every snapshot.

use luasnap_alloc::{probe_trackers, Arena, TrackerKind, TrackerPreference, PAGE_SIZE};
use luasnap_snap::{digest, RingConfig, SnapshotId, SnapshotMode, SnapshotRing};
use proptest::prelude::*;
use std::ptr::NonNull;

/// Pages of the block the writes go to: few, so that restored pages are written again.
const PAGES: usize = 24;
const WINDOW: usize = 6;

fn tracked_modes() -> Vec<SnapshotMode> {
    let mut v = vec![SnapshotMode::Incremental(TrackerPreference::Only(
        TrackerKind::Mprotect,
    ))];
    if probe_trackers().uffd.is_ok() {
        v.push(SnapshotMode::Incremental(TrackerPreference::Only(
            TrackerKind::Uffd,
        )));
    }
    v
}

struct Case {
    arena: Arena,
    block: NonNull<u8>,
    ring: SnapshotRing,
}

impl Case {
    fn new(mode: SnapshotMode) -> Case {
        let mut arena = Arena::new(16 << 20).unwrap();
        let block = arena.alloc(PAGES * PAGE_SIZE).unwrap();
        // SAFETY: a fresh block of PAGES pages.
        unsafe { block.as_ptr().write_bytes(0, PAGES * PAGE_SIZE) };
        let ring = SnapshotRing::new(
            &mut arena,
            RingConfig {
                window: WINDOW,
                mode,
                // Page records only: every rollback is the exact one, which leaves pages open.
                full_copy_above: Some(1.0),
            },
        )
        .unwrap();
        Case { arena, block, ring }
    }

    fn write(&mut self, page: usize, at: usize, value: u8) {
        // SAFETY: page < PAGES and at < PAGE_SIZE: inside the live block.
        unsafe { self.block.as_ptr().add(page * PAGE_SIZE + at).write(value) };
    }

    fn contents(&self) -> Vec<u8> {
        // SAFETY: the block is live with PAGES pages; nothing writes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.block.as_ptr(), PAGES * PAGE_SIZE) }.to_vec()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Write `value` into page `page` at byte `at`.
    Write {
        page: usize,
        at: usize,
    },
    Snapshot,
    /// Roll back to the retained snapshot at this index (modulo how many there are).
    Rollback(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Mostly the same few pages, as a game's frames write about the same pages: the
        // rollbacks over them leave them open.
        4 => (0..4usize, 0..PAGE_SIZE).prop_map(|(page, at)| Op::Write { page, at }),
        2 => (0..PAGES, 0..PAGE_SIZE).prop_map(|(page, at)| Op::Write { page, at }),
        3 => Just(Op::Snapshot),
        2 => (0usize..WINDOW).prop_map(Op::Rollback),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn writes_to_pages_left_open_are_saved_and_restored(ops in proptest::collection::vec(op(), 1..120)) {
        for mode in tracked_modes() {
            let mut case = Case::new(mode);
            // Per retained snapshot: its id and the block as it was.
            let mut model: Vec<(SnapshotId, Vec<u8>, u64)> = Vec::new();
            let mut value = 0u8;
            for op in &ops {
                match *op {
                    Op::Write { page, at } => {
                        value = value.wrapping_add(1).max(1);
                        case.write(page, at, value);
                    }
                    Op::Snapshot => {
                        let id = case.ring.snapshot(&mut case.arena).unwrap();
                        model.push((id, case.contents(), digest(&case.arena)));
                        if model.len() > WINDOW {
                            model.remove(0);
                        }
                    }
                    Op::Rollback(i) if !model.is_empty() => {
                        let k = i % model.len();
                        case.ring.rollback(&mut case.arena, model[k].0).unwrap();
                        prop_assert!(case.contents() == model[k].1, "{mode:?}: block differs from snapshot {k} after its rollback");
                        prop_assert_eq!(digest(&case.arena), model[k].2, "{:?}", mode);
                        model.truncate(k + 1);
                    }
                    Op::Rollback(_) => {}
                }
            }
        }
    }
}

/// The case the property is about, spelled out: a page restored by a rollback is written by
/// the re-simulated frame (no fault), saved, written again, and both states come back.
#[test]
fn a_restored_page_written_again_is_saved_and_rolled_back() {
    for mode in tracked_modes() {
        let mut case = Case::new(mode);
        let s0 = case.ring.snapshot(&mut case.arena).unwrap();
        let at0 = case.contents();
        for f in 1..=3u8 {
            case.write(0, 0, f);
            case.write(1, 100, f);
            case.ring.snapshot(&mut case.arena).unwrap();
        }
        case.ring.rollback(&mut case.arena, s0).unwrap();
        assert_eq!(case.contents(), at0, "{mode:?}");
        assert!(
            case.ring.stats().pages_left_open >= 2,
            "{mode:?}: pages 0 and 1, written by every dropped frame, are left open"
        );
        // Re-simulation: page 0 (restored, left open) gets other bytes, page 7 is new.
        case.write(0, 0, 9);
        case.write(7, 1, 9);
        let s1 = case.ring.snapshot(&mut case.arena).unwrap();
        let at1 = case.contents();
        case.write(0, 0, 10);
        case.write(1, 100, 10);
        let s2 = case.ring.snapshot(&mut case.arena).unwrap();
        let at2 = case.contents();
        case.write(0, 0, 11);
        case.ring.rollback(&mut case.arena, s2).unwrap();
        assert_eq!(case.contents(), at2, "{mode:?}: back to s2");
        case.ring.rollback(&mut case.arena, s1).unwrap();
        assert_eq!(case.contents(), at1, "{mode:?}: back to s1");
        case.ring.rollback(&mut case.arena, s0).unwrap();
        assert_eq!(case.contents(), at0, "{mode:?}: back to s0");
        // Frames after the re-simulated ones are tracked again: a write is saved.
        for f in 20..26u8 {
            case.write(3, 3, f);
            case.ring.snapshot(&mut case.arena).unwrap();
        }
        let last = case.ring.latest().unwrap();
        let at_last = case.contents();
        case.write(3, 3, 99);
        case.write(11, 3, 99);
        case.ring.rollback(&mut case.arena, last).unwrap();
        assert_eq!(case.contents(), at_last, "{mode:?}: tracked again");
    }
}
