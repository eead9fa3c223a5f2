#![cfg(feature = "ggrs")]
//! GGRS sessions served from arena snapshots: SyncTestSession on the embedded game, and two
//! P2P peers on 127.0.0.1 with desync detection.

use luasnap::bridge::ggrs_adapter::{p2p_pair, sync_test};
use luasnap::bridge::runtime::{Backend, GameConfig};
use std::time::Duration;

fn embedded() -> GameConfig {
    let mut cfg = GameConfig::default_game(2, 7);
    cfg.base_address = None; // tests run in parallel: let each VM go where the OS puts it
    cfg
}

#[test]
fn sync_test_session_600_frames_on_the_embedded_game() {
    // SyncTestSession rolls back 7 frames on every frame and compares the checksums (arena
    // digests) of the re-simulated frames with the first simulation: any byte of difference
    // fails it.
    let driver =
        sync_test(&embedded(), Backend::ArenaIncremental, 600, 7).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(driver.game().frame(), 600);
    assert!(
        driver.loads >= 590,
        "a rollback nearly every frame, got {}",
        driver.loads
    );
    assert!(driver.advances > 600 * 7);
}

#[test]
fn sync_test_catches_a_game_that_does_not_roll_back() {
    // A game whose step depends on something outside its state fails the sync test with the
    // frame of the mismatch. Full snapshots restore everything, but `tostring({})` of a table
    // made after a rollback lands elsewhere when the serializer rebuilds the heap.
    let mut cfg = GameConfig::default_game(2, 1);
    cfg.base_address = None;
    cfg.script = "local G, s = {}, nil
        function G.init() s = { v = 0 } end
        function G.step(i) s.v = (s.v + tonumber(tostring({}):match('0x(%x+)'), 16)) % 1000003 end
        return G"
        .into();
    let err = match sync_test(&cfg, Backend::Serialize, 40, 3) {
        Err(e) => e,
        Ok(_) => panic!("the address-dependent game must fail the sync test"),
    };
    assert!(err.contains("desync at frame"), "{err}");
}

#[test]
fn two_p2p_peers_on_loopback_report_no_desync() {
    let [a, b] =
        p2p_pair(&embedded(), 120, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    assert!(a.frames >= 120 && b.frames >= 120);
    assert!(
        a.desyncs.is_empty() && b.desyncs.is_empty(),
        "{:?} {:?}",
        a.desyncs,
        b.desyncs
    );
}
