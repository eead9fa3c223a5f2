//! Snapshots and the retention window: exact restore in every mode, incremental equal to full,
//! each tracker forced, tracker failure, syscall writes, misuse, and memory of the window.

use luasnap_alloc::{probe_trackers, Arena, TrackerKind, TrackerPreference, PAGE_SIZE};
use luasnap_snap::{
    digest, CopyStrategy, RingConfig, SnapError, Snapshot, SnapshotId, SnapshotMode, SnapshotRing,
};
use proptest::prelude::*;
use std::ptr::NonNull;

const MIB: usize = 1 << 20;

fn modes() -> Vec<SnapshotMode> {
    let mut v = vec![
        SnapshotMode::Full,
        SnapshotMode::Incremental(TrackerPreference::Only(TrackerKind::Mprotect)),
    ];
    match probe_trackers().uffd {
        Ok(()) => v.push(SnapshotMode::Incremental(TrackerPreference::Only(
            TrackerKind::Uffd,
        ))),
        Err(why) => eprintln!("note: userfaultfd unavailable here, not tested: {why}"),
    }
    if let Some(best) = probe_trackers().best() {
        v.push(SnapshotMode::Auto(TrackerPreference::Only(best)));
    }
    v
}

fn ring(arena: &mut Arena, mode: SnapshotMode, window: usize) -> SnapshotRing {
    let r = SnapshotRing::new(
        arena,
        RingConfig {
            window,
            mode,
            ..RingConfig::default()
        },
    )
    .unwrap();
    if let SnapshotMode::Incremental(TrackerPreference::Only(kind))
    | SnapshotMode::Auto(TrackerPreference::Only(kind)) = mode
    {
        assert_eq!(r.strategy(), CopyStrategy::Incremental(kind));
    }
    r
}

/// An arena with a model of its live blocks, driven by a deterministic generator.
struct World {
    arena: Arena,
    /// Live blocks as (offset from the arena base, size): valid in any world with the same history.
    live: Vec<(usize, usize)>,
    rng: u64,
}

/// What a world needs to go back to a snapshot besides the arena: its model.
type Model = (Vec<(usize, usize)>, u64);

impl World {
    fn new(capacity: usize, seed: u64) -> World {
        World {
            arena: Arena::new(capacity).unwrap(),
            live: Vec::new(),
            rng: seed | 1,
        }
    }

    fn ptr(&self, offset: usize) -> NonNull<u8> {
        // SAFETY: offsets in the model come from blocks of this arena.
        NonNull::new(unsafe { self.arena.base().as_ptr().add(offset) }).unwrap()
    }

    fn model(&self) -> Model {
        (self.live.clone(), self.rng)
    }

    fn restore_model(&mut self, m: &Model) {
        (self.live, self.rng) = m.clone();
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// One step of a Lua-like mutation: allocate, free, or scribble into a live block.
    fn step(&mut self) {
        let r = self.next();
        match r % 10 {
            0..=3 => {
                let size = match (r >> 8) % 20 {
                    0 => 5000 + (r >> 16) as usize % 100_000,
                    1..=4 => 129 + (r >> 16) as usize % 2000,
                    _ => 16 + (r >> 16) as usize % 112,
                };
                if let Some(p) = self.arena.alloc(size) {
                    // SAFETY: fresh block of `size` bytes.
                    unsafe { p.as_ptr().write_bytes(r as u8, size) };
                    self.live.push((
                        p.as_ptr() as usize - self.arena.base().as_ptr() as usize,
                        size,
                    ));
                }
            }
            4..=5 if !self.live.is_empty() => {
                let i = (r >> 8) as usize % self.live.len();
                let (off, size) = self.live.swap_remove(i);
                let p = self.ptr(off);
                // SAFETY: live block with its size; removed from the model.
                assert!(unsafe { self.arena.free(p, size) }, "model out of sync");
            }
            _ if !self.live.is_empty() => {
                let i = (r >> 8) as usize % self.live.len();
                let (off, size) = self.live[i];
                let p = self.ptr(off);
                let at = (r >> 24) as usize % size;
                // SAFETY: at < size, inside a live block.
                unsafe { p.as_ptr().add(at).write(r as u8) };
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The same random history (mutations, snapshots, rollbacks to random retained snapshots)
    /// in every mode: every rollback restores the exact digest of its snapshot, and all modes
    /// agree byte for byte at every step.
    #[test]
    fn every_mode_restores_exactly_and_matches_full(seed in any::<u64>(), script in proptest::collection::vec((0u8..10, any::<u16>()), 10..60)) {
        let modes = modes();
        let mut worlds: Vec<World> = modes.iter().map(|_| World::new(32 * MIB, seed)).collect();
        let mut rings: Vec<SnapshotRing> = worlds.iter_mut().zip(&modes).map(|(w, &m)| ring(&mut w.arena, m, 8)).collect();
        // Per retained snapshot: ids per mode, the digest, and the live-block model to go back to.
        let mut history: Vec<(Vec<SnapshotId>, u64, Model)> = Vec::new();
        for (action, arg) in script {
            match action {
                0..=5 => {
                    let steps = 1 + arg as usize % 40;
                    for w in &mut worlds { for _ in 0..steps { w.step(); } }
                }
                6..=7 => {
                    let ids: Vec<SnapshotId> = rings.iter_mut().zip(&mut worlds).map(|(r, w)| r.snapshot(&mut w.arena).unwrap()).collect();
                    history.push((ids, digest(&worlds[0].arena), worlds[0].model()));
                    if history.len() > 8 { history.remove(0); }
                }
                _ if !history.is_empty() => {
                    let k = arg as usize % history.len();
                    let (ids, want, model) = history[k].clone();
                    for ((r, w), id) in rings.iter_mut().zip(&mut worlds).zip(&ids) {
                        r.rollback(&mut w.arena, *id).unwrap();
                        prop_assert_eq!(digest(&w.arena), want, "{:?}", r.strategy());
                        w.arena.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
                        w.restore_model(&model);
                    }
                    history.truncate(k + 1);
                }
                _ => {}
            }
            let d0 = digest(&worlds[0].arena);
            for (w, m) in worlds.iter().zip(&modes) {
                prop_assert_eq!(digest(&w.arena), d0, "mode {:?} diverged from full", m);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Small windows (every snapshot soon leaves the window and its successor's record is
    /// folded into the base) and low full-copy thresholds (full records, paused tracking, and
    /// rollbacks across them), with rollbacks to any retained snapshot, the oldest included.
    #[test]
    fn folds_full_records_and_pauses_restore_exactly(seed in any::<u64>(), window in 1usize..5, above in 0u8..6, script in proptest::collection::vec((0u8..10, any::<u16>()), 10..60)) {
        let modes = modes();
        let mut worlds: Vec<World> = modes.iter().map(|_| World::new(32 * MIB, seed)).collect();
        let mut rings: Vec<SnapshotRing> = worlds
            .iter_mut()
            .zip(&modes)
            .map(|(w, &mode)| {
                SnapshotRing::new(
                    &mut w.arena,
                    RingConfig { window, mode, full_copy_above: Some(f64::from(above) * 0.02) },
                )
                .unwrap()
            })
            .collect();
        let mut history: Vec<(Vec<SnapshotId>, u64, Model)> = Vec::new();
        for (action, arg) in script {
            match action {
                0..=4 => {
                    let steps = 1 + arg as usize % 60;
                    for w in &mut worlds { for _ in 0..steps { w.step(); } }
                }
                5..=7 => {
                    let ids: Vec<SnapshotId> = rings.iter_mut().zip(&mut worlds).map(|(r, w)| r.snapshot(&mut w.arena).unwrap()).collect();
                    history.push((ids, digest(&worlds[0].arena), worlds[0].model()));
                    if history.len() > window { history.remove(0); }
                }
                _ if !history.is_empty() => {
                    let k = if arg % 3 == 0 { 0 } else { arg as usize % history.len() };
                    let (ids, want, model) = history[k].clone();
                    for ((r, w), id) in rings.iter_mut().zip(&mut worlds).zip(&ids) {
                        r.rollback(&mut w.arena, *id).unwrap();
                        prop_assert_eq!(digest(&w.arena), want, "{:?}", r.strategy());
                        w.arena.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
                        w.restore_model(&model);
                    }
                    history.truncate(k + 1);
                }
                _ => {}
            }
            let d0 = digest(&worlds[0].arena);
            for (w, m) in worlds.iter().zip(&modes) {
                prop_assert_eq!(digest(&w.arena), d0, "mode {:?} diverged from full", m);
            }
        }
    }
}

#[test]
fn rollback_to_each_retained_snapshot_in_random_order() {
    for mode in modes() {
        // A fixed shuffled order of targets; each trial rebuilds 8 snapshots, then goes back.
        for &target in &[5usize, 0, 7, 2, 6, 1, 4, 3] {
            let mut w = World::new(64 * MIB, 99);
            let mut r = ring(&mut w.arena, mode, 8);
            let mut ids = Vec::new();
            let mut digests = Vec::new();
            let mut models = Vec::new();
            for _ in 0..8 {
                for _ in 0..200 {
                    w.step();
                }
                ids.push(r.snapshot(&mut w.arena).unwrap());
                digests.push(digest(&w.arena));
                models.push(w.model());
            }
            for _ in 0..150 {
                w.step();
            }
            r.rollback(&mut w.arena, ids[target]).unwrap();
            assert_eq!(
                digest(&w.arena),
                digests[target],
                "{mode:?} target {target}"
            );
            w.arena.verify().unwrap();
            // Newer ones are gone; older ones still work, and so does the same one again.
            for newer in &ids[target + 1..] {
                assert!(matches!(
                    r.rollback(&mut w.arena, *newer),
                    Err(SnapError::Invalidated { .. })
                ));
            }
            w.restore_model(&models[target]);
            for _ in 0..100 {
                w.step();
            }
            r.rollback(&mut w.arena, ids[target]).unwrap();
            assert_eq!(digest(&w.arena), digests[target]);
            w.restore_model(&models[target]);
            if target > 0 {
                r.rollback(&mut w.arena, ids[target - 1]).unwrap();
                assert_eq!(digest(&w.arena), digests[target - 1]);
                w.restore_model(&models[target - 1]);
            }
            // And the ring keeps working after the rollbacks.
            for _ in 0..100 {
                w.step();
            }
            let id = r.snapshot(&mut w.arena).unwrap();
            let d = digest(&w.arena);
            for _ in 0..100 {
                w.step();
            }
            r.rollback(&mut w.arena, id).unwrap();
            assert_eq!(digest(&w.arena), d);
        }
    }
}

#[test]
fn the_fallback_chain_and_the_active_mechanism_are_visible() {
    let mut a = Arena::new(8 * MIB).unwrap();
    let full = SnapshotRing::new(
        &mut a,
        RingConfig {
            mode: SnapshotMode::Full,
            ..RingConfig::default()
        },
    )
    .unwrap();
    assert_eq!(full.strategy(), CopyStrategy::Full);
    assert_eq!(full.tracker_kind(), None);
    let auto = SnapshotRing::new(&mut a, RingConfig::default()).unwrap();
    assert_eq!(auto.tracker_kind(), probe_trackers().best());
    assert!(
        auto.strategy().to_string().starts_with("incremental"),
        "{}",
        auto.strategy()
    );
    assert!(matches!(
        SnapshotRing::new(
            &mut a,
            RingConfig {
                window: 0,
                ..RingConfig::default()
            }
        ),
        Err(SnapError::Config(_))
    ));
}

#[test]
fn a_tracker_failure_is_reported_changes_nothing_and_falls_back_to_full() {
    for mode in modes().into_iter().skip(1) {
        for fail_in_rollback in [false, true] {
            let mut w = World::new(32 * MIB, 7);
            let mut r = ring(&mut w.arena, mode, 8);
            for _ in 0..300 {
                w.step();
            }
            let id0 = r.snapshot(&mut w.arena).unwrap();
            let d0 = digest(&w.arena);
            let m0 = w.model();
            for _ in 0..300 {
                w.step();
            }
            let before = digest(&w.arena);
            let m_before = w.model();
            w.arena.inject_tracker_failure();
            let err = if fail_in_rollback {
                r.rollback(&mut w.arena, id0).unwrap_err()
            } else {
                r.snapshot(&mut w.arena).unwrap_err()
            };
            assert!(matches!(err, SnapError::TrackerLost { .. }), "{err}");
            // The tracker's failure is in the message, and only there.
            assert!(err.to_string().contains("injected failure"), "{err}");
            assert!(std::error::Error::source(&err).is_none(), "{err:?}");
            assert!(err.to_string().contains("retry"), "{err}");
            assert_eq!(
                digest(&w.arena),
                before,
                "a failed call must change nothing"
            );
            assert!(matches!(r.strategy(), CopyStrategy::FullTrackerLost(_)));
            assert_eq!(w.arena.tracker_kind(), None);
            // Retrying works, in full mode, and stays exact.
            if fail_in_rollback {
                w.restore_model(&m_before);
            }
            let id1 = r.snapshot(&mut w.arena).unwrap();
            for _ in 0..300 {
                w.step();
            }
            r.rollback(&mut w.arena, id1).unwrap();
            assert_eq!(digest(&w.arena), before);
            r.rollback(&mut w.arena, id0).unwrap();
            assert_eq!(digest(&w.arena), d0);
            w.restore_model(&m0);
            for _ in 0..300 {
                w.step();
            }
            w.arena.verify().unwrap();
        }
    }
}

#[test]
fn a_tracker_disabled_behind_the_rings_back_is_noticed() {
    let mut w = World::new(16 * MIB, 3);
    let mut r = ring(
        &mut w.arena,
        SnapshotMode::Incremental(TrackerPreference::Auto),
        8,
    );
    let id = r.snapshot(&mut w.arena).unwrap();
    let d = digest(&w.arena);
    w.arena.disable_tracking();
    for _ in 0..200 {
        w.step();
    } // unseen writes
    assert!(matches!(
        r.rollback(&mut w.arena, id),
        Err(SnapError::TrackerLost { .. })
    ));
    r.rollback(&mut w.arena, id).unwrap();
    assert_eq!(digest(&w.arena), d);
}

#[test]
fn writes_from_syscalls_are_captured_and_rolled_back() {
    for mode in modes() {
        let mut a = Arena::new(16 * MIB).unwrap();
        let buf = a.alloc(3 * PAGE_SIZE).unwrap();
        let off = buf.as_ptr() as usize - a.base().as_ptr() as usize;
        let mut r = ring(&mut a, mode, 8);
        let id0 = r.snapshot(&mut a).unwrap();
        let d0 = digest(&a);
        let msg = vec![0xEEu8; 2 * PAGE_SIZE];
        let mut fds = [0; 2];
        // SAFETY: a plain pipe with our own buffer; closed below.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            assert_eq!(
                libc::write(fds[1], msg.as_ptr().cast(), msg.len()),
                msg.len() as isize
            );
        }
        a.prepare_external_write(off + 100..off + 100 + msg.len())
            .unwrap();
        // SAFETY: the destination lies inside the live 3-page block.
        let n = unsafe { libc::read(fds[0], buf.as_ptr().add(100).cast(), msg.len()) };
        assert_eq!(n, msg.len() as isize, "{mode:?}");
        let id1 = r.snapshot(&mut a).unwrap();
        let d1 = digest(&a);
        assert_ne!(d0, d1);
        r.rollback(&mut a, id0).unwrap();
        assert_eq!(
            digest(&a),
            d0,
            "{mode:?}: the syscall's write was not undone"
        );
        assert!(matches!(
            r.rollback(&mut a, id1),
            Err(SnapError::Invalidated { .. })
        ));
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}

#[test]
fn two_arenas_with_their_own_rings() {
    for mode in modes() {
        let mut a = World::new(16 * MIB, 1);
        let mut b = World::new(16 * MIB, 2);
        let mut ra = ring(&mut a.arena, mode, 4);
        let mut rb = ring(&mut b.arena, mode, 4);
        let ia = ra.snapshot(&mut a.arena).unwrap();
        let ib = rb.snapshot(&mut b.arena).unwrap();
        let (da, db) = (digest(&a.arena), digest(&b.arena));
        for _ in 0..500 {
            a.step();
            b.step();
        }
        ra.rollback(&mut a.arena, ia).unwrap();
        assert_eq!(digest(&a.arena), da);
        assert_ne!(digest(&b.arena), db, "b must be untouched by a's rollback");
        rb.rollback(&mut b.arena, ib).unwrap();
        assert_eq!(digest(&b.arena), db);
        // Misuse across arenas and rings is refused.
        assert!(matches!(
            ra.rollback(&mut b.arena, ia),
            Err(SnapError::WrongArena { .. })
        ));
        assert!(matches!(
            ra.snapshot(&mut b.arena),
            Err(SnapError::WrongArena { .. })
        ));
        assert!(matches!(
            rb.rollback(&mut b.arena, ia),
            Err(SnapError::ForeignSnapshot { .. })
        ));
        let snap = Snapshot::capture(&a.arena);
        assert!(matches!(
            snap.restore(&mut b.arena),
            Err(SnapError::WrongArena { .. })
        ));
        assert_eq!(digest(&b.arena), db, "refused restores change nothing");
    }
}

#[test]
fn evicted_and_unknown_snapshots_are_refused() {
    let mut w = World::new(16 * MIB, 5);
    let mut r = ring(
        &mut w.arena,
        SnapshotMode::Incremental(TrackerPreference::Auto),
        8,
    );
    let mut empty = World::new(16 * MIB, 6);
    let mut r2 = ring(&mut empty.arena, SnapshotMode::Full, 8);
    let ids: Vec<_> = (0..12)
        .map(|_| {
            w.step();
            r.snapshot(&mut w.arena).unwrap()
        })
        .collect();
    assert!(matches!(
        r2.rollback(&mut empty.arena, ids[0]),
        Err(SnapError::NoSnapshot)
    ));
    assert_eq!(r.retained().count(), 8);
    assert_eq!(r.retained().next(), Some(ids[4]));
    assert_eq!(r.latest(), Some(ids[11]));
    let err = r.rollback(&mut w.arena, ids[3]).unwrap_err();
    assert!(
        matches!(err, SnapError::Evicted { seq: 3, window: 8 }),
        "{err}"
    );
    r.rollback(&mut w.arena, ids[4]).unwrap();
}

#[test]
fn heavy_writes_switch_to_full_copies_and_back() {
    let Some(kind) = probe_trackers().best() else {
        panic!("no tracker on Linux?")
    };
    let mut a = Arena::new(64 * MIB).unwrap();
    let blocks: Vec<_> = (0..64).map(|_| a.alloc(64 * 1024).unwrap()).collect();
    let mut r = ring(
        &mut a,
        SnapshotMode::Incremental(TrackerPreference::Only(kind)),
        16,
    );
    let touch = |a: &mut Arena, fraction: usize, v: u8| {
        for p in blocks.iter().take(blocks.len() * fraction / 100) {
            // SAFETY: each block is live with 64 KiB.
            unsafe { p.as_ptr().write_bytes(v, 64 * 1024) };
        }
        let _ = a;
    };
    let mut snaps = vec![(r.snapshot(&mut a).unwrap(), digest(&a))];
    touch(&mut a, 2, 1);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(r.strategy(), CopyStrategy::Incremental(kind));
    assert_eq!(r.stats().incremental_snapshots, 1);
    touch(&mut a, 90, 2);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(
        r.strategy(),
        CopyStrategy::Incremental(kind),
        "one heavy snapshot is a full copy; tracking goes on"
    );
    assert_eq!(r.stats().incremental_snapshots, 1);
    touch(&mut a, 1, 3);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(r.stats().incremental_snapshots, 2, "a light one after it");
    touch(&mut a, 90, 4);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(r.strategy(), CopyStrategy::Incremental(kind));
    touch(&mut a, 90, 5);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(
        r.strategy(),
        CopyStrategy::PausedIncremental(kind),
        "two heavy snapshots in a row pause tracking"
    );
    for i in 0..4 {
        touch(&mut a, 1, 10 + i);
        snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    }
    assert_eq!(
        r.strategy(),
        CopyStrategy::Incremental(kind),
        "tracking resumes after the pause"
    );
    touch(&mut a, 1, 20);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(r.stats().incremental_snapshots, 3);
    // Every one of them, mixing full and page records, restores exactly: newest to oldest.
    for (id, d) in snaps.iter().rev() {
        r.rollback(&mut a, *id).unwrap();
        assert_eq!(digest(&a), *d);
    }
    a.verify().unwrap();
}

#[test]
fn growth_is_not_a_heavy_write_and_a_long_heavy_phase_pauses_tracking_briefly() {
    let Some(kind) = probe_trackers().best() else {
        panic!("no tracker on Linux?")
    };
    let mut a = Arena::new(64 * MIB).unwrap();
    let first: Vec<_> = (0..8).map(|_| a.alloc(64 * 1024).unwrap()).collect();
    let mut r = ring(
        &mut a,
        SnapshotMode::Incremental(TrackerPreference::Only(kind)),
        16,
    );
    let write = |blocks: &[NonNull<u8>], v: u8| {
        for p in blocks {
            // SAFETY: each block is live with 64 KiB.
            unsafe { p.as_ptr().write_bytes(v, 64 * 1024) };
        }
    };
    let mut snaps = vec![(r.snapshot(&mut a).unwrap(), digest(&a))];
    // The heap grows eightfold (a level load) while one old block is written: the new pages
    // are copied as one run either way and took no fault, so this is a light frame.
    let grown: Vec<_> = (0..64).map(|_| a.alloc(64 * 1024).unwrap()).collect();
    write(&grown, 1);
    write(&first[..1], 1);
    snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    assert_eq!(
        r.stats().incremental_snapshots,
        1,
        "growth alone made the snapshot a whole copy"
    );
    assert_eq!(r.strategy(), CopyStrategy::Incremental(kind));
    // A long phase of heavy frames (every block written) pauses tracking for longer and
    // longer, but never for more than 16 snapshots: one unlucky sample (a collection frame)
    // as the game settles must not decide how 64 frames are copied.
    for v in 0..40 {
        write(&grown, v);
        snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    }
    assert_eq!(r.strategy(), CopyStrategy::PausedIncremental(kind));
    let mut light = 0;
    while r.strategy() != CopyStrategy::Incremental(kind) {
        light += 1;
        assert!(light <= 17, "still paused after {light} light snapshots");
        write(&first[..1], light as u8);
        snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    }
    for (id, d) in snaps.iter().rev().take(16) {
        r.rollback(&mut a, *id).unwrap();
        assert_eq!(digest(&a), *d);
    }
    a.verify().unwrap();
}

#[test]
fn the_automatic_mode_copies_whole_while_that_costs_less_and_tracks_otherwise() {
    let Some(kind) = probe_trackers().best() else {
        panic!("no tracker on Linux?")
    };
    let mut a = Arena::new(64 * MIB).unwrap();
    let blocks: Vec<_> = (0..64).map(|_| a.alloc(64 * 1024).unwrap()).collect();
    let mut r = ring(&mut a, SnapshotMode::Auto(TrackerPreference::Only(kind)), 8);
    let touch = |count: usize, v: u8| {
        for p in blocks.iter().take(count) {
            // SAFETY: each block is live with 64 KiB.
            unsafe { p.as_ptr().write_bytes(v, 64 * 1024) };
        }
    };
    let mut snaps = vec![(r.snapshot(&mut a).unwrap(), digest(&a))];
    // Every page written each time: tracking costs a fault per page on top of the copies, so
    // whole copies win whatever this machine's costs are; tracking pauses.
    let mut written = Vec::new();
    for v in 1..4 {
        touch(blocks.len(), v);
        snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
        written.push(r.stats().last_written_pages);
    }
    // Seen by the tracker twice (the second heavy snapshot in a row pauses it), then not.
    assert!(
        matches!(written[..], [Some(1024..), Some(1024..), None]),
        "{written:?}"
    );
    assert_eq!(r.strategy(), CopyStrategy::PausedIncremental(kind));
    let costs = r.copy_costs().expect("measured in automatic mode");
    assert!(costs.whole_ns > 0.0 && costs.fault_ns > 0.0, "{costs:?}");
    assert!((0.0..1.0).contains(&costs.break_even(1000)), "{costs:?}");
    // Few pages written: tracking resumes after the pause and stays on. How few depends on
    // this machine's costs (a write fault in a virtual machine can cost ten copies of a page),
    // so the pages are chosen where the model puts tracking at 0.4 of a whole copy, half the
    // probe's bar: what the rule decides is tested, not what this machine's faults cost.
    let extent = 64 * 16;
    let pages = (1..=16)
        .take_while(|&n| costs.tracked_ns(extent, n) <= 0.4 * costs.whole_copy_ns(extent))
        .last()
        .unwrap_or_else(|| panic!("even one written page costs 0.4 of a whole copy: {costs:?}"));
    for v in 0..8 {
        // SAFETY: the first block is live with 64 KiB; `pages` of its 16 pages are written.
        unsafe { blocks[0].as_ptr().write_bytes(10 + v, pages * PAGE_SIZE) };
        snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
    }
    let costs = r.copy_costs().expect("measured in automatic mode");
    assert_eq!(
        r.strategy(),
        CopyStrategy::Incremental(kind),
        "{pages} pages written of {extent}: {costs:?}"
    );
    assert_eq!(r.stats().last_written_pages, Some(pages));
    assert_eq!(r.stats().last_dirty_pages, pages);
    for (id, d) in snaps.iter().rev().take(8) {
        r.rollback(&mut a, *id).unwrap();
        assert_eq!(digest(&a), *d);
    }
    a.verify().unwrap();
}

#[test]
fn a_window_costs_one_base_copy_plus_the_changed_pages() {
    let Some(kind) = probe_trackers().best() else {
        panic!("no tracker on Linux?")
    };
    let mut a = Arena::new(256 * MIB).unwrap();
    let blocks: Vec<_> = (0..1000).map(|_| a.alloc(40 * 1024).unwrap()).collect(); // ~40 MiB
    let mut r = ring(
        &mut a,
        SnapshotMode::Incremental(TrackerPreference::Only(kind)),
        8,
    );
    r.snapshot(&mut a).unwrap();
    let base = r.stats().base_bytes;
    assert!(base >= 1000 * 40 * 1024);
    for frame in 0..20usize {
        for i in 0..10 {
            let p = blocks[(frame * 37 + i * 101) % blocks.len()];
            // SAFETY: live 40 KiB block; one byte written.
            unsafe { p.as_ptr().add(frame * 8).write(frame as u8) };
        }
        r.snapshot(&mut a).unwrap();
    }
    let s = r.stats();
    assert_eq!(s.retained, 8);
    // 7 undo records of at most 10 data pages + the header page each.
    assert!(
        s.undo_bytes <= 7 * 11 * PAGE_SIZE,
        "undo {} bytes",
        s.undo_bytes
    );
    assert!(s.memory_bytes() <= base + 7 * 11 * PAGE_SIZE);
    assert_eq!(s.incremental_snapshots, 20);
}

/// The rollback-netcode property at the arena level: snapshot, run frames that will be thrown
/// away (growing and shrinking the heap), roll back, run the confirmed frames. The arena must be
/// byte-identical to one that ran only the confirmed frames, in every mode.
#[test]
fn replay_after_rollback_equals_a_straight_run() {
    for mode in modes() {
        for seed in 1u64..=12 {
            let mut straight = World::new(32 * MIB, seed);
            let mut predicted = World::new(32 * MIB, seed);
            let mut r = ring(&mut predicted.arena, mode, 8);
            for _ in 0..500 {
                straight.step();
                predicted.step();
            }
            let id = r.snapshot(&mut predicted.arena).unwrap();
            let confirmed = predicted.model();
            // Mispredicted frames: a different random stream, with big blocks that move `top`.
            predicted.rng ^= 0xDEAD_BEEF;
            for _ in 0..400 {
                predicted.step();
            }
            r.snapshot(&mut predicted.arena).unwrap();
            for _ in 0..100 {
                predicted.step();
            }
            r.rollback(&mut predicted.arena, id).unwrap();
            predicted.restore_model(&confirmed);
            for _ in 0..600 {
                straight.step();
                predicted.step();
            }
            assert_eq!(
                digest(&predicted.arena),
                digest(&straight.arena),
                "{mode:?} seed {seed}"
            );
        }
    }
}

#[test]
fn a_rollback_over_several_frames_restores_pages_written_in_many_of_them() {
    // The same pages rewritten in several frames (a rollback restores each from the oldest
    // record that holds it), others written once, and the extent growing every frame (pages
    // beyond the target's extent are not restored): rolling back straight to an older
    // snapshot gives its bytes, and tracking stays right afterwards.
    let Some(kind) = probe_trackers().best() else {
        panic!("no tracker on Linux?")
    };
    let mut a = Arena::new(64 * MIB).unwrap();
    let blocks: Vec<_> = (0..64).map(|_| a.alloc(16 * 1024).unwrap()).collect();
    let mut r = ring(
        &mut a,
        SnapshotMode::Incremental(TrackerPreference::Only(kind)),
        8,
    );
    let frame = |a: &mut Arena, f: usize| {
        // Blocks 0..4 every frame, a seventh of the others in turn: about 10% of the pages.
        for (i, p) in blocks.iter().enumerate() {
            if i < 4 || i % 7 == f % 7 {
                // SAFETY: each block is live with 16 KiB; one byte per page.
                unsafe {
                    for page in 0..if i < 4 { 4 } else { 1 } {
                        p.as_ptr().add(page * PAGE_SIZE + f).write(f as u8 + 1);
                    }
                }
            }
        }
        let grown = a.alloc(8 * 1024).unwrap();
        // SAFETY: just allocated with 8 KiB.
        unsafe { grown.as_ptr().write_bytes(f as u8 + 100, 8 * 1024) };
    };
    let mut snaps = Vec::new();
    for f in 0..6 {
        snaps.push((r.snapshot(&mut a).unwrap(), digest(&a)));
        frame(&mut a, f);
    }
    assert_eq!(
        r.stats().incremental_snapshots,
        5,
        "page records, no full copy"
    );
    r.rollback(&mut a, snaps[1].0).unwrap();
    assert_eq!(digest(&a), snaps[1].1, "straight back over 4 frames");
    a.verify().unwrap();
    // Other writes from there, then straight back to the oldest.
    for f in 10..13 {
        frame(&mut a, f);
        r.snapshot(&mut a).unwrap();
    }
    frame(&mut a, 13);
    r.rollback(&mut a, snaps[0].0).unwrap();
    assert_eq!(digest(&a), snaps[0].1, "straight back to the oldest");
    a.verify().unwrap();
    // The restored pages were re-armed: a write after the rollback is seen.
    frame(&mut a, 20);
    let id = r.snapshot(&mut a).unwrap();
    let d = digest(&a);
    frame(&mut a, 21);
    r.rollback(&mut a, id).unwrap();
    assert_eq!(digest(&a), d);
    r.rollback(&mut a, snaps[0].0).unwrap();
    assert_eq!(digest(&a), snaps[0].1);
}

/// A whole copy leaves free page runs out (the allocator keeps them zero): pages freed before
/// a snapshot and written after it come back as zeros, pages free now but live at the snapshot
/// come back with their bytes, in every mode.
#[test]
fn whole_copies_skip_free_runs_and_restore_them_as_zeros() {
    for mode in modes() {
        let mut arena = Arena::new(32 * MIB).unwrap();
        let mut ring = ring(&mut arena, mode, 8);
        let block = 16 * PAGE_SIZE;
        let a = arena.alloc(block).unwrap();
        let b = arena.alloc(block).unwrap();
        let _c = arena.alloc(block).unwrap(); // keeps a's and b's runs below the top
                                              // SAFETY: live blocks of `block` bytes.
        unsafe {
            a.as_ptr().write_bytes(0xa1, block);
            b.as_ptr().write_bytes(0xb2, block);
        }
        // SAFETY: a is live with that size.
        assert!(unsafe { arena.free(a, block) });
        let s = arena.state_ranges();
        let extent = (s.meta.end.next_multiple_of(PAGE_SIZE) + s.data.len()) / PAGE_SIZE;
        let at_free = ring.snapshot(&mut arena).unwrap();
        assert_eq!(
            ring.stats().last_dirty_pages,
            extent - block / PAGE_SIZE,
            "{mode:?}: the first copy leaves a's free run out"
        );
        let want = digest(&arena);
        // a's pages are taken and written again; b is freed (zeroed by the allocator).
        let again = arena.alloc(block).unwrap();
        assert_eq!(again, a, "the free run is reused");
        // SAFETY: live block of `block` bytes; b is live with that size.
        unsafe { again.as_ptr().write_bytes(0xcc, block) };
        assert!(unsafe { arena.free(b, block) });
        ring.snapshot(&mut arena).unwrap();
        ring.rollback(&mut arena, at_free).unwrap();
        assert_eq!(digest(&arena), want, "{mode:?}");
        arena.verify().unwrap();
        let bytes = |p: NonNull<u8>| {
            let off = p.as_ptr() as usize - arena.base().as_ptr() as usize;
            arena.bytes(off..off + block).to_vec()
        };
        assert!(
            bytes(a).iter().all(|&x| x == 0),
            "{mode:?}: a's run is zero again"
        );
        assert!(
            bytes(b).iter().all(|&x| x == 0xb2),
            "{mode:?}: b's bytes are back"
        );
    }
}
