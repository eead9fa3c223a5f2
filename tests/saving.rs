//! Which frames a `FrameSession` saves (`Saving`): whatever it skips, a run whose remote
//! inputs arrive late, in order or in bursts, ends where the straight run of the true inputs
//! does, on every backend; the fewer saves are counted, and a rollback it cannot serve is an
//! error that says why.

use luasnap::bridge::runtime::{scripted_input, Backend, FrameSession, Game, GameConfig, Saving};
use proptest::prelude::*;

const TINY: &str = include_str!("lua/tiny_game.lua");
const PLAYERS: usize = 2;
const SEED: u64 = 11;

fn tiny() -> GameConfig {
    GameConfig {
        script: TINY.into(),
        chunk_name: "=tiny".into(),
        base_address: None,
        window: 12,
        capacity: 64 << 20,
        ..GameConfig::default_game(PLAYERS, SEED)
    }
}

fn truth(f: u64) -> Vec<u8> {
    (0..PLAYERS).map(|p| scripted_input(SEED, f, p)).collect()
}

/// Player 0 is local (its input known at once); player 1's inputs are known up to
/// `known[f]` when frame `f` is simulated, and predicted to repeat the last one known.
fn predicted(f: u64, known: Option<u64>) -> Vec<u8> {
    let remote = match known {
        Some(k) if f <= k => scripted_input(SEED, f, 1),
        Some(k) => scripted_input(SEED, k, 1),
        None => 0,
    };
    vec![scripted_input(SEED, f, 0), remote]
}

struct Run {
    value_digest: u64,
    game_digest: Option<i64>,
    saves: usize,
    rollbacks: u64,
    resimulated: u64,
}

/// The GGPO loop over `known` (the remote inputs known at each frame, never decreasing), as
/// `luasnap simulate` drives it: confirm, roll back to the first wrong frame, advance.
fn play(backend: Backend, saving: Saving, known: &[Option<u64>]) -> Run {
    let game: Game = Game::new(&tiny(), backend).unwrap();
    let mut s = FrameSession::with_saving(game, 11, saving);
    let mut used: Vec<Vec<u8>> = Vec::new();
    let mut checked: Option<u64> = None;
    let frames = known.len() as u64;
    // At the end the network catches up: every input becomes known.
    let last = std::iter::once(Some(frames - 1));
    for (f, k) in known.iter().copied().chain(last).enumerate() {
        let f = f as u64;
        if let Some(k) = k {
            let upto = k.min(f.saturating_sub(1));
            let from = checked.map_or(0, |c| c + 1);
            if f > 0 && from <= upto {
                s.confirm(upto);
                if let Some(g) = (from..=upto).find(|&g| used[g as usize] != truth(g)) {
                    s.rollback_and_resimulate(g, |h| {
                        let i = predicted(h, Some(k));
                        used[h as usize] = i.clone();
                        i
                    })
                    .unwrap();
                }
                checked = Some(upto);
            }
        }
        if f < frames {
            let i = predicted(f, k);
            s.advance(&i).unwrap();
            used.push(i);
        }
    }
    let (rollbacks, resimulated, saves) = (s.rollbacks, s.resimulated, s.saves_taken());
    let mut game = s.into_game();
    Run {
        value_digest: game.value_digest().unwrap(),
        game_digest: game.game_digest().unwrap(),
        saves,
        rollbacks,
        resimulated,
    }
}

fn straight(frames: u64) -> (u64, Option<i64>) {
    let mut game: Game = Game::new(&tiny(), Backend::ArenaFull).unwrap();
    for f in 0..frames {
        game.step(&truth(f)).unwrap();
    }
    (game.value_digest().unwrap(), game.game_digest().unwrap())
}

/// Remote inputs known `delay` frames late.
fn in_order(frames: u64, delay: u64) -> Vec<Option<u64>> {
    (0..frames).map(|f| f.checked_sub(delay)).collect()
}

#[test]
fn inputs_in_order_one_save_per_rollback_and_the_same_end() {
    let frames = 120;
    let known = in_order(frames, 4);
    let want = straight(frames);
    for backend in [
        Backend::ArenaFull,
        Backend::ArenaIncremental,
        Backend::Serialize,
    ] {
        let every = play(backend, Saving::EveryFrame, &known);
        let new = play(backend, Saving::NewFrames, &known);
        let sparse = play(backend, Saving::Sparse, &known);
        for (name, r) in [("every", &every), ("new", &new), ("sparse", &sparse)] {
            assert_eq!(
                (r.value_digest, r.game_digest),
                want,
                "{backend:?} saving {name}"
            );
        }
        assert!(
            every.rollbacks > 5,
            "predictions must fail: {}",
            every.rollbacks
        );
        // In order, the state a rollback saves is the one the next rollback loads: the same
        // rollbacks and frames re-simulated, a save per rollback instead of one per
        // re-simulated frame.
        assert_eq!(new.rollbacks, every.rollbacks, "{backend:?}");
        assert_eq!(new.resimulated, every.resimulated, "{backend:?}");
        let (frames, rollbacks) = (frames as usize, every.rollbacks as usize);
        assert_eq!(
            every.saves,
            frames + (every.resimulated as usize - rollbacks),
            "{backend:?}"
        );
        // One save a rollback, but the last one's (the catch-up at the end, whose confirmed
        // frame is the current one).
        assert_eq!(new.saves, frames + rollbacks - 1, "{backend:?}");
        assert!(sparse.saves < new.saves, "{backend:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Confirmations that jump several frames at once, pauses, catching up: rollbacks into
    /// frames whose state was not saved replay the frames between from the newest save.
    #[test]
    fn bursts_of_confirmations_end_where_the_straight_run_does(
        steps in prop::collection::vec(0u64..4, 40..90),
        saving in prop_oneof![Just(Saving::EveryFrame), Just(Saving::NewFrames), Just(Saving::Sparse)],
        incremental in any::<bool>(),
    ) {
        // The remote side's progress: a step of 0 is a pause, 2 or 3 a burst; never more than
        // 8 frames behind (the window), never ahead of the frame simulated.
        let mut known = Vec::new();
        let mut k: Option<u64> = None;
        for (f, step) in steps.iter().enumerate() {
            let f = f as u64;
            let next = k.map_or(0, |k| k + step);
            k = if f < 2 { None } else { Some(next.max(f.saturating_sub(8)).min(f - 1)) };
            known.push(k);
        }
        let frames = known.len() as u64;
        let backend = if incremental { Backend::ArenaIncremental } else { Backend::ArenaFull };
        let r = play(backend, saving, &known);
        prop_assert_eq!((r.value_digest, r.game_digest), straight(frames));
    }
}

#[test]
fn a_rollback_before_every_save_says_so() {
    let game: Game = Game::new(&tiny(), Backend::ArenaFull).unwrap();
    let mut s = FrameSession::with_saving(game, 3, Saving::NewFrames);
    for f in 0..10 {
        s.advance(&truth(f)).unwrap();
    }
    let held: Vec<u64> = s.saved_frames().collect();
    assert_eq!(held, [7, 8, 9]);
    let e = s.rollback_and_resimulate(2, truth).unwrap_err().to_string();
    assert!(
        e.contains(
            "frame 2 is before every state this session holds (frames 7..=9; its window keeps 3)"
        ),
        "{e}"
    );
    // A frame it never saved is named with what it holds.
    let e = s.load_frame(4).unwrap_err().to_string();
    assert!(
        e.contains("frame 4 is not among the states this session holds (frames 7..=9"),
        "{e}"
    );
    // The session still works.
    s.rollback_and_resimulate(8, truth).unwrap();
    assert_eq!(s.game().frame(), 10);
}

/// A session's window is bounded by the game's snapshot window (its saves are snapshots
/// there), and `Game::load` names a handle of another frame.
#[test]
fn windows_and_frames_a_session_cannot_serve_are_refused_by_name() {
    let mut cfg = tiny();
    cfg.window = 3;
    let game: Game = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
    let mut s = FrameSession::new(game, 10);
    for f in 0..10 {
        s.advance(&truth(f)).unwrap();
    }
    let held: Vec<u64> = s.saved_frames().collect();
    assert_eq!(
        held,
        [7, 8, 9],
        "the game's window of 3 bounds the session's 10"
    );
    let e = s.load_frame(2).unwrap_err().to_string();
    assert!(e.contains("GameConfig::window"), "{e}");
    let mut game = s.into_game();
    let handle = game.save().unwrap();
    game.step(&truth(10)).unwrap();
    let e = game.load(&handle, 99).unwrap_err().to_string();
    assert!(
        e.contains("told frame 99, but the handle holds the state of frame 10"),
        "{e}"
    );
    assert_eq!(game.frame(), 10);
    game.load(&handle, 10).unwrap();
    assert_eq!(game.frame(), 10);
}

/// A game whose `G.step` changes its state, then fails on one input (a bug that a predicted
/// input reaches).
fn fails_on_13() -> GameConfig {
    GameConfig {
        script: "local G = {}
                 local w = { n = 0 }
                 function G.init() end
                 function G.step(inputs)
                   w.n = w.n + 1
                   if inputs[2] == 13 then error('rare bug on a predicted input') end
                 end
                 function G.digest() return w.n end
                 return G"
            .into(),
        chunk_name: "=fails_on_13".into(),
        ..tiny()
    }
}

/// A failed `G.step` leaves its frame half-way: a session that logs the error and goes on
/// must not save that state over the frame's clean save (an outside tester's finding: every
/// later rollback to the frame restored the half-way state, and the client drifted from its
/// peers for good). The session loads its save of the frame back on every backend.
#[test]
fn a_failed_step_never_stands_for_its_frame_in_a_session() {
    for backend in [
        Backend::ArenaIncremental,
        Backend::ArenaFull,
        Backend::Serialize,
    ] {
        let game: Game = Game::new(&fails_on_13(), backend).unwrap();
        let mut s = FrameSession::new(game, 8);
        s.advance(&[1, 0]).unwrap();
        s.advance(&[2, 0]).unwrap();
        let e = s.advance(&[3, 13]).unwrap_err();
        assert!(e.to_string().contains("rare bug"), "{backend:?}: {e}");
        assert_eq!(s.game().frame(), 2, "{backend:?}");
        assert_eq!(
            s.game().game_digest().unwrap(),
            Some(2),
            "{backend:?}: restored"
        );
        s.advance(&[3, 0]).unwrap();
        s.advance(&[4, 0]).unwrap();
        s.load_frame(2).unwrap();
        assert_eq!(
            s.game().game_digest().unwrap(),
            Some(2),
            "{backend:?}: the save of frame 2 is the clean one"
        );
    }
}

/// Without a session, the half-way state is refused to `step` and to every save until a
/// saved state is loaded; without a save of the frame (sparse saving), a session refuses too.
#[test]
fn a_half_stepped_state_is_refused_until_a_load() {
    let mut game: Game = Game::new(&fails_on_13(), Backend::ArenaIncremental).unwrap();
    game.step(&[1, 0]).unwrap();
    let saved = game.save().unwrap();
    game.step(&[2, 13]).unwrap_err();
    assert_eq!(game.half_stepped(), Some(1));
    for e in [
        game.step(&[2, 0]).unwrap_err(),
        game.save().map(|_| ()).unwrap_err(),
        game.save_game().map(|_| ()).unwrap_err(),
    ] {
        assert!(
            matches!(
                e,
                luasnap::bridge::runtime::GameError::HalfStepped { frame: 1, .. }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("load a state saved at frame 1"),
            "{e}"
        );
    }
    game.load(&saved, 1).unwrap();
    assert_eq!(game.half_stepped(), None);
    game.step(&[2, 0]).unwrap();
    assert_eq!(game.game_digest().unwrap(), Some(2));

    let game: Game = Game::new(&fails_on_13(), Backend::ArenaIncremental).unwrap();
    let mut s = FrameSession::with_saving(game, 8, Saving::Sparse);
    s.advance(&[1, 0]).unwrap();
    s.advance(&[2, 0]).unwrap();
    s.advance(&[3, 13]).unwrap_err();
    let e = s.advance(&[3, 0]).unwrap_err();
    assert!(
        matches!(
            e,
            luasnap::bridge::runtime::GameError::HalfStepped { frame: 2, .. }
        ),
        "{e}"
    );
    s.load_frame(0).unwrap();
    s.advance(&[1, 0]).unwrap();
    assert_eq!(s.game().game_digest().unwrap(), Some(1));
}
