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

/// A game whose step depends on something outside its state: a native returning a counter
/// kept in Rust, which a rollback does not rewind.
fn leaky_game() -> GameConfig {
    let mut cfg = GameConfig::default_game(2, 1);
    cfg.base_address = None;
    cfg.capacity = 256 << 20;
    cfg.script = "local G, s = {}, nil
        function G.init() s = { v = 0 } end
        function G.step(i) s.v = (s.v * 31 + host.outside()) % 1000003 end
        return G"
        .into();
    cfg.chunk_name = "=test".into();
    cfg.setup = luasnap::bridge::runtime::VmSetup::new(|b| {
        let counter = std::cell::Cell::new(0i64);
        b.native("host.outside", move |call| {
            counter.set(counter.get() + 1);
            call.ret(counter.get());
            Ok(())
        })
    });
    cfg
}

#[test]
fn sync_test_catches_a_game_that_does_not_roll_back() {
    // It fails the sync test with the frame of the mismatch, whatever the backend.
    for backend in [Backend::ArenaIncremental, Backend::Serialize] {
        let err = match sync_test(&leaky_game(), backend, 40, 3) {
            Err(e) => e,
            Ok(_) => panic!("{backend:?}: the leaky game must fail the sync test"),
        };
        assert!(err.contains("desync at frame"), "{err}");
    }
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

use luasnap::bridge::ggrs_adapter::{
    p2p_pair_with, sync_test_with, Checksum, GgrsGame, LuaGgrs, MaxPrediction, SessionOptions,
};
use luasnap::bridge::runtime::{scripted_input, Game, GameInput, PodInput, VmSetup};
use luasnap::bridge::PlainData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

const TINY: &str = include_str!("lua/tiny_game.lua");

fn tiny() -> GameConfig {
    let mut cfg = GameConfig::default_game(2, 3);
    cfg.script = TINY.into();
    cfg.chunk_name = "=tiny".into();
    cfg.base_address = None;
    cfg.capacity = 256 << 20;
    cfg
}

/// A fresh folder named by `name`, removed with all it holds when the guard drops.
fn scratch_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("luasnap-ggrs-{name}-"))
        .tempdir()
        .unwrap()
}

#[test]
fn the_serializer_backend_passes_sync_test_with_the_default_checksum() {
    let driver = sync_test(&tiny(), Backend::Serialize, 40, 3).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(driver.checksum_kind(), Checksum::Game);
    assert!(driver.loads >= 30, "{}", driver.loads);
    // The combination that cannot work is refused with what to use instead.
    let game = Game::new(&tiny(), Backend::Serialize).unwrap();
    let err = GgrsGame::<LuaGgrs>::new(game, Checksum::Arena, &MaxPrediction(8))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("Checksum::Auto or Checksum::Game"), "{err}");
}

/// A structured input: reaches Lua as a table.
#[derive(Clone, Copy, PartialEq, Default, Debug, serde::Serialize, serde::Deserialize)]
struct Pad {
    dx: i8,
    dy: i8,
    fire: bool,
}

impl GameInput for Pad {}

fn pad(seed: u64, frame: u64, player: usize) -> Pad {
    let b = scripted_input(seed, frame, player);
    Pad {
        dx: (b & 3) as i8 - 1,
        dy: ((b >> 2) & 3) as i8 - 1,
        fire: b & 16 != 0,
    }
}

const PAD_GAME: &str = "
local G, s = {}, nil
function G.init(players) s = { x = {}, shots = 0 } for p = 1, players do s.x[p] = 0 end end
function G.step(inputs)
  for p, i in ipairs(inputs) do
    s.x[p] = host.clamp(s.x[p] + i.dx * 3 + i.dy, -50, 50)
    if i.fire then s.shots = s.shots + 1 end
  end
end
function G.digest() return s.shots * 1000003 + s.x[1] * 101 + s.x[2] end
return G";

fn pad_game() -> GameConfig {
    let mut cfg = tiny();
    cfg.script = PAD_GAME.into();
    cfg.chunk_name = "=pad_game".into();
    cfg.setup = VmSetup::new(|b| {
        b.native("host.clamp", |call| {
            let (x, lo, hi): (i64, i64, i64) = (call.get(0)?, call.get(1)?, call.get(2)?);
            call.ret(x.clamp(lo, hi));
            Ok(())
        })
    });
    cfg
}

#[test]
fn structured_inputs_and_natives_in_sync_test_and_p2p() {
    let cfg = pad_game();
    for backend in [Backend::ArenaIncremental, Backend::Serialize] {
        let driver = sync_test_with(&cfg, backend, 120, 5, &SessionOptions::default(), |f, p| {
            pad(cfg.seed, f, p)
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        assert_eq!(driver.game().frame(), 120);
        let expected = match backend {
            Backend::Serialize => Checksum::Game,
            _ => Checksum::Arena,
        };
        assert_eq!(driver.checksum_kind(), expected);
    }
    // Reference: the same inputs without GGRS.
    let mut reference = Game::new(&cfg, Backend::ArenaFull).unwrap();
    for f in 0..120 {
        reference
            .step(&[pad(cfg.seed, f, 0), pad(cfg.seed, f, 1)])
            .unwrap();
    }
    let driver = sync_test_with(
        &cfg,
        Backend::ArenaFull,
        120,
        5,
        &SessionOptions::default(),
        |f, p| pad(cfg.seed, f, p),
    )
    .unwrap();
    assert_eq!(
        driver.game().game_digest().unwrap(),
        reference.game_digest().unwrap()
    );
    let [a, b] = p2p_pair_with(
        &cfg,
        90,
        Duration::from_secs(120),
        &SessionOptions::default(),
        pad,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(a.desyncs.is_empty() && b.desyncs.is_empty(), "{a:?} {b:?}");
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Stick {
    x: f32,
    y: f32,
}

impl PlainData for Stick {
    const NAME: &'static str = "Stick";
}

#[test]
fn plain_data_inputs_reach_lua_as_userdata() {
    let mut cfg = tiny();
    cfg.script = "local G, s = {}, nil
        function G.init() s = { x = 0.0 } end
        function G.step(i) s.x = s.x + i[1]:dot(i[2]) end
        function G.digest() return math.floor(s.x * 1000) end
        return G"
        .into();
    cfg.setup = VmSetup::new(|b| {
        b.userdata::<Stick>(|m| {
            m.method("dot", |a, call| {
                let b = *call.userdata::<Stick>(1)?;
                call.ret(a.x * b.x + a.y * b.y);
                Ok(())
            });
        })
    });
    let input = |f: u64, p: usize| {
        PodInput(Stick {
            x: (f % 7) as f32,
            y: p as f32 + 0.5,
        })
    };
    let driver = sync_test_with(
        &cfg,
        Backend::ArenaIncremental,
        50,
        4,
        &SessionOptions::default(),
        input,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let expected: f32 = (0..50u64)
        .map(|f| {
            let (a, b) = (input(f, 0).0, input(f, 1).0);
            a.x * b.x + a.y * b.y
        })
        .sum();
    assert_eq!(
        driver.game().game_digest().unwrap(),
        Some((expected * 1000.0).floor() as i64)
    );
}

#[test]
fn a_sync_test_desync_writes_both_simulations_as_save_games() {
    let cfg = leaky_game();
    let tmp = scratch_dir("synctest");
    let dir = tmp.path().to_path_buf();
    let options = SessionOptions {
        desync_dir: Some(dir.clone()),
        ..Default::default()
    };
    let seed = cfg.seed;
    let err = match sync_test_with(&cfg, Backend::Serialize, 40, 3, &options, |f, p| {
        scripted_input(seed, f, p)
    }) {
        Err(e) => e,
        Ok(_) => panic!("the leaky game must fail"),
    };
    assert!(err.contains("wrote"), "{err}");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let first = files
        .iter()
        .find(|p| p.to_string_lossy().ends_with("-first.luasave"))
        .expect("the first simulation");
    let latest = PathBuf::from(first.to_string_lossy().replace("-first", ""));
    // Both load into the game, and they hold different states.
    let digest = |p: &PathBuf| {
        let mut game: Game = Game::from_save(&cfg, Backend::ArenaFull, &std::fs::read(p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        game.value_digest().unwrap()
    };
    assert_ne!(digest(first), digest(&latest));
}

/// GGRS's sparse saving through the adapter: the peers save only confirmed frames (fewer
/// saves than frames), load the last of them on a rollback, and still agree.
#[test]
fn p2p_peers_with_sparse_saving_agree() {
    let options = SessionOptions {
        sparse_saving: true,
        ..Default::default()
    };
    let [a, b] = p2p_pair_with(
        &tiny(),
        150,
        Duration::from_secs(120),
        &options,
        scripted_input,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for r in [&a, &b] {
        assert!(r.frames >= 150, "{r:?}");
        assert!(r.desyncs.is_empty(), "{r:?}");
        assert!(
            r.saves < r.frames,
            "sparse saving saves fewer frames than it plays: {r:?}"
        );
    }
}

#[test]
fn a_p2p_desync_writes_each_peers_state() {
    // Each VM gets its own id from the setup hook: the peers diverge from the first frame.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut cfg = pad_game();
    cfg.script = "local G, s = {}, nil
        function G.init() s = { v = 0 } end
        function G.step(i) s.v = s.v + host.id() end
        function G.digest() return s.v end
        return G"
        .into();
    cfg.setup = VmSetup::new(|b| {
        let id = NEXT.fetch_add(1, Ordering::Relaxed) as i64;
        b.native("host.id", move |call| {
            call.ret(id);
            Ok(())
        })
    });
    let tmp = scratch_dir("p2p");
    let dir = tmp.path().to_path_buf();
    let options = SessionOptions {
        desync_dir: Some(dir.clone()),
        ..Default::default()
    };
    let [a, b] = p2p_pair_with(&cfg, 60, Duration::from_secs(120), &options, pad)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!a.desyncs.is_empty() || !b.desyncs.is_empty());
    let files: Vec<&PathBuf> = a.desync_files.iter().chain(&b.desync_files).collect();
    assert!(!files.is_empty(), "{a:?} {b:?}");
    for f in files {
        assert!(std::fs::metadata(f).unwrap().len() > 0, "{}", f.display());
    }
}

/// A renderer reads the state after every frame through paths and handles; GGRS saves the
/// next frame right after those reads, later re-simulates it without them, and compares arena
/// digests: the reads must leave the arena's bytes as they were.
#[test]
fn host_reads_between_frames_do_not_break_sync_test() {
    let cfg = pad_game();
    let game = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
    let mut session = luasnap::ggrs::SessionBuilder::<LuaGgrs<Pad>>::new()
        .with_num_players(2)
        .unwrap()
        .with_check_distance(4)
        .start_synctest_session()
        .unwrap();
    let mut driver = GgrsGame::<LuaGgrs<Pad>>::new(game, Checksum::Arena, &session).unwrap();
    let mut shots = 0;
    for f in 0..80u64 {
        for p in 0..2 {
            session.add_local_input(p, pad(cfg.seed, f, p)).unwrap();
        }
        let requests = session
            .advance_frame()
            .unwrap_or_else(|e| panic!("frame {f}: {e}"));
        driver.handle(requests).unwrap();
        let vm = driver.game().vm();
        assert_eq!(vm.get::<u64>("luasnap_frame").unwrap(), f + 1);
        let g = vm.table("luasnap_game").unwrap();
        assert_eq!(g.function("step").unwrap().as_ref().type_name(), "function");
        let players: Vec<Pad> = (0..2).map(|p| pad(cfg.seed, f, p)).collect();
        shots += players.iter().filter(|p| p.fire).count();
        let digest: i64 = vm.call("luasnap_game.digest", ()).unwrap();
        assert_eq!(g.call_function::<i64>("digest", ()).unwrap(), digest);
        let _ = vm
            .globals()
            .get::<_, Option<i64>>("luasnap_players")
            .unwrap();
    }
    assert!(shots > 0);
}

/// The child side of `two_processes_play_p2p_through_the_public_api`: one peer, through the
/// public API with default options. Prints its port, reads the other peer's address from
/// stdin, plays, prints its report.
fn p2p_child_peer(me: usize) {
    use luasnap::bridge::ggrs_adapter::{p2p_peer_with, PeerSocket};
    use std::io::BufRead;
    let mut cfg = GameConfig::default_game(2, 3);
    cfg.script = TINY.into();
    cfg.chunk_name = "=tiny".into();
    cfg.capacity = 256 << 20;
    let socket = PeerSocket::loopback().unwrap();
    println!("PEER_PORT {}", socket.local_addr().unwrap().port());
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let other = line.trim().parse().unwrap();
    let seed = cfg.seed;
    let report = p2p_peer_with(
        &cfg,
        me,
        socket,
        other,
        150,
        Duration::from_secs(120),
        &SessionOptions::default(),
        |f, p| scripted_input(seed, f, p),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "PEER_REPORT frames={} desyncs={} rollbacks={} checksum={:?}",
        report.frames,
        report.desyncs.len(),
        report.rollbacks,
        report.checksum
    );
}

/// Two processes (this test's binary, started twice) play P2P over 127.0.0.1 with
/// `p2p_peer_with` and `SessionOptions::default()`: the checksum GGRS compares is the game
/// digest, which agrees across processes, where arena digests never would.
#[test]
fn two_processes_play_p2p_through_the_public_api() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    const ROLE: &str = "LUASNAP_TEST_P2P_PEER";
    const NAME: &str = "two_processes_play_p2p_through_the_public_api";
    if let Ok(me) = std::env::var(ROLE) {
        return p2p_child_peer(me.parse().unwrap());
    }
    let mut children: Vec<_> = (0..2)
        .map(|me| {
            Command::new(std::env::current_exe().unwrap())
                .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE, me.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    let ports: Vec<u16> = outs
        .iter_mut()
        .map(|out| {
            let mut line = String::new();
            loop {
                line.clear();
                assert!(out.read_line(&mut line).unwrap() > 0, "a peer ended early");
                // The harness may print `test NAME ... ` on the same line first.
                if let Some((_, port)) = line.trim().split_once("PEER_PORT ") {
                    return port.parse().unwrap();
                }
            }
        })
        .collect();
    for (me, child) in children.iter_mut().enumerate() {
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "127.0.0.1:{}", ports[1 - me]).unwrap();
    }
    for (child, mut out) in children.iter_mut().zip(outs) {
        // All of it, so that the child never writes into a closed pipe.
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let status = child.wait().unwrap();
        let report = rest
            .lines()
            .find_map(|l| l.split_once("PEER_REPORT").map(|(_, r)| r.to_string()))
            .unwrap_or_else(|| panic!("a peer failed ({status}): {rest}"));
        assert!(status.success(), "{rest}");
        assert!(report.contains("frames=150"), "{report}");
        assert!(report.contains("desyncs=0"), "{report}");
        assert!(report.contains("checksum=Game"), "{report}");
    }
}

#[test]
fn a_p2p_session_resolves_auto_to_the_game_digest_and_refuses_arena_digests() {
    let session = || {
        luasnap::ggrs::SessionBuilder::<LuaGgrs>::new()
            .with_num_players(2)
            .unwrap()
            .add_player(luasnap::ggrs::PlayerType::Local, 0)
            .unwrap()
            .add_player(
                luasnap::ggrs::PlayerType::Remote("127.0.0.1:9".parse().unwrap()),
                1,
            )
            .unwrap()
            .start_p2p_session(luasnap::bridge::ggrs_adapter::PeerSocket::loopback().unwrap())
            .unwrap()
    };
    let game = Game::new(&tiny(), Backend::ArenaIncremental).unwrap();
    let driver = GgrsGame::<LuaGgrs>::new(game, Checksum::Auto, &session()).unwrap();
    assert_eq!(driver.checksum_kind(), Checksum::Game);
    let game = Game::new(&tiny(), Backend::ArenaIncremental).unwrap();
    let err = GgrsGame::<LuaGgrs>::new(game, Checksum::Arena, &session())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("another peer's"), "{err}");
    assert!(err.contains("Checksum::Auto or Checksum::Game"), "{err}");
}

/// A renderer that calls a Lua function building a list between frames allocates in the heap,
/// which the frames GGRS re-simulates never see: under arena checksums the SyncTest reported a
/// desync naming nothing of the cause (an outside tester's finding). `handle` refuses the
/// changed heap instead, naming the cause and the way out; under `Checksum::Game` it is fine.
#[test]
fn a_renderer_that_allocates_between_frames_is_named_not_reported_as_a_desync() {
    let cfg = pad_game();
    for checksum in [Checksum::Auto, Checksum::Game] {
        let game = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
        game.vm()
            .exec(
                "function render_list() local out = {} for i = 1, 20 do out[i] = { i, tostring(i) } end return #out end",
                "renderer",
            )
            .unwrap();
        let mut session = luasnap::ggrs::SessionBuilder::<LuaGgrs<Pad>>::new()
            .with_num_players(2)
            .unwrap()
            .with_check_distance(4)
            .start_synctest_session()
            .unwrap();
        let mut driver = GgrsGame::<LuaGgrs<Pad>>::new(game, checksum, &session).unwrap();
        let mut refused = None;
        for f in 0..40u64 {
            for p in 0..2 {
                session.add_local_input(p, pad(cfg.seed, f, p)).unwrap();
            }
            let requests = session
                .advance_frame()
                .unwrap_or_else(|e| panic!("{checksum:?}, frame {f}: {e}"));
            if let Err(e) = driver.handle(requests) {
                refused = Some(e);
                break;
            }
            let n: i64 = driver.game().vm().call("render_list", ()).unwrap();
            assert_eq!(n, 20);
        }
        match checksum {
            Checksum::Auto => {
                let e = refused.expect("the changed heap is refused under arena checksums");
                assert!(
                    matches!(
                        e,
                        luasnap::bridge::runtime::GameError::HeapChangedBetweenFrames {
                            frame: 1,
                            ..
                        }
                    ),
                    "{e}"
                );
                let text = e.to_string();
                assert!(
                    text.contains("Checksum::Game") && text.contains("Reading between frames"),
                    "{text}"
                );
            }
            _ => assert!(refused.is_none(), "{checksum:?}: {}", refused.unwrap()),
        }
    }
}
