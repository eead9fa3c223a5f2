//! GGRS: rollback-netcode sessions whose save and load requests are served from snapshots.
//!
//! [`GgrsGame`] answers a session's [`ggrs::GgrsRequest`]s with a [`Game`]: `SaveGameState`
//! takes a snapshot (arena snapshots, or a save-game for the serializer backend) and reports a
//! checksum, `LoadGameState` rolls back to it, `AdvanceFrame` steps the game. Checksums are the
//! arena digest by default ([`Checksum::Arena`]: byte-exact, comparable within one process, as
//! `SyncTestSession` compares); peers in different processes compare [`Checksum::Game`]
//! (`G.digest()` if the game has one, else the value digest), since their arenas hold
//! different absolute addresses: [`Checksum::Auto`] picks it for a [`ggrs::P2PSession`].
//!
//! Two machines (or two processes) play with [`PeerSocket`] and [`p2p_peer_with`]: each binds
//! a socket to an address the other can reach and runs one peer; the game's natives and
//! userdata come from [`GameConfig::setup`], the local player's input from a closure.
//!
//! ```no_run
//! use luasnap_bridge::ggrs_adapter::{p2p_peer_with, PeerSocket, SessionOptions};
//! use luasnap_bridge::runtime::GameConfig;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = GameConfig::default_game(2, 7);
//! // Player 0 here; player 1 runs the same with `1` and this machine's address.
//! let socket = PeerSocket::bind("0.0.0.0:7000")?;
//! let other = "192.168.1.20:7000".parse()?;
//! let report = p2p_peer_with(&cfg, 0, socket, other, 600, Duration::from_secs(60),
//!     &SessionOptions::default(), |_frame, _player| 0u8 /* read the pad */)?;
//! assert!(report.desyncs.is_empty());
//! # Ok(()) }
//! ```

use crate::runtime::{scripted_input, Backend, Game, GameConfig, GameError, GameInput, SaveHandle};
use ggrs::{
    GameStateCell, GgrsError, GgrsEvent, GgrsRequest, Message, NonBlockingSocket, PlayerType,
    SessionBuilder, SessionState,
};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The GGRS configuration for luasnap games, generic over the per-player input: any
/// [`GameInput`] that GGRS can send (`Copy + PartialEq + Default + Serialize + Deserialize`).
/// The default, `LuaGgrs` alone, is one byte per player.
///
/// ```
/// use luasnap_bridge::ggrs_adapter::LuaGgrs;
/// use luasnap_bridge::runtime::GameInput;
///
/// #[derive(Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
/// struct Pad { dx: i8, dy: i8, fire: bool }
/// impl GameInput for Pad {}
///
/// let builder = ggrs::SessionBuilder::<LuaGgrs<Pad>>::new().with_num_players(2);
/// # let _ = builder;
/// ```
pub struct LuaGgrs<I = u8>(PhantomData<fn() -> I>);

impl<I> ggrs::Config for LuaGgrs<I>
where
    I: GameInput + Copy + PartialEq + Default + DeserializeOwned + Send + Sync + 'static,
{
    type Input = I;
    type InputPredictor = ggrs::PredictRepeatLast;
    type State = SaveHandle;
    type Address = SocketAddr;
}

/// What checksum a save reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksum {
    /// Chosen from the session and the backend: [`Checksum::Game`] for a session whose
    /// checksums are compared with other peers' ([`ggrs::P2PSession`]: their arenas hold
    /// other addresses, in other processes) and for the serializer (whose loads rebuild the
    /// heap at other addresses); [`Checksum::Arena`] otherwise (a `SyncTestSession` on arena
    /// snapshots, where it catches any byte of difference).
    #[default]
    Auto,
    /// The arena digest: byte-exact; comparable only between VMs of one process whose heaps
    /// are restored byte for byte (arena backends). Refused with [`Backend::Serialize`] and
    /// for a [`ggrs::P2PSession`] (the other peer's arena digests differ whatever the state).
    Arena,
    /// `G.digest()` if the game defines it, else the value digest: comparable across processes
    /// and backends.
    Game,
}

/// How far back a GGRS session may ask to load a frame, and so how many snapshots an
/// arena-backed [`GgrsGame`] must retain ([`GameConfig::window`]) to serve it:
/// [`GgrsGame::new`] checks it up front.
///
/// Read from ggrs 0.13's sessions:
/// - [`ggrs::P2PSession`]: `max_prediction() + 1`. It loads frames down to
///   `current - max_prediction`, and at the prediction threshold it has already saved the
///   current frame when that load comes.
/// - [`ggrs::SyncTestSession`]: `check_distance()`. Each frame it loads the frame
///   `check_distance` back before saving the current one.
/// - [`ggrs::SpectatorSession`]: 0 (it never loads).
/// - [`MaxPrediction`]: a driver of your own that loads like a P2P session.
pub trait RollbackDepth {
    /// Snapshots that must be retained at once.
    fn snapshots_needed(&self) -> usize;
    /// The session, for messages (`a P2P session with max prediction 8`).
    fn describe(&self) -> String;
    /// Whether the session compares this VM's checksums with another peer's (in another
    /// process, or at other addresses): then only [`Checksum::Game`] can agree, and
    /// [`Checksum::Auto`] resolves to it. False unless a session says so.
    fn compares_with_peers(&self) -> bool {
        false
    }
}

impl<C: ggrs::Config> RollbackDepth for ggrs::P2PSession<C> {
    fn snapshots_needed(&self) -> usize {
        MaxPrediction(self.max_prediction()).snapshots_needed()
    }
    fn describe(&self) -> String {
        MaxPrediction(self.max_prediction()).describe()
    }
    fn compares_with_peers(&self) -> bool {
        true
    }
}

impl<C: ggrs::Config> RollbackDepth for ggrs::SyncTestSession<C> {
    fn snapshots_needed(&self) -> usize {
        self.check_distance()
    }
    fn describe(&self) -> String {
        format!(
            "a SyncTest session with check distance {}",
            self.check_distance()
        )
    }
}

impl<C: ggrs::Config> RollbackDepth for ggrs::SpectatorSession<C> {
    fn snapshots_needed(&self) -> usize {
        0
    }
    fn describe(&self) -> String {
        "a spectator session".into()
    }
}

/// A session that loads as a P2P session with this max prediction does (for drivers that
/// serve [`GgrsGame::handle`] from a session type of their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPrediction(pub usize);

impl RollbackDepth for MaxPrediction {
    fn snapshots_needed(&self) -> usize {
        // Lockstep (0) never loads.
        if self.0 == 0 {
            0
        } else {
            self.0 + 1
        }
    }
    fn describe(&self) -> String {
        format!("a P2P session with max prediction {}", self.0)
    }
}

/// Save-games kept for desync reports (see [`GgrsGame::keep_desync_saves`]).
struct DesyncSaves {
    every: u64,
    /// The first save of each kept frame, and the latest (after re-simulations).
    first: BTreeMap<i32, Vec<u8>>,
    latest: BTreeMap<i32, Vec<u8>>,
}

/// Frames kept for desync reports.
const DESYNC_FRAMES_KEPT: usize = 16;

/// A game driven by a GGRS session.
pub struct GgrsGame<C: ggrs::Config<State = SaveHandle> = LuaGgrs> {
    game: Game<C::Input>,
    checksum: Checksum,
    /// Saves served.
    pub saves: u64,
    /// Loads (rollbacks) served.
    pub loads: u64,
    /// Frames advanced (re-simulated ones included).
    pub advances: u64,
    /// Saves answered with the previous save of the same, unchanged frame.
    pub repeated_saves: u64,
    /// The latest save while the game has neither advanced nor loaded since: GGRS asks to save
    /// the current frame on every `advance_frame`, also while it waits at the prediction
    /// threshold, and a new snapshot each time would push the frames it may still load out of
    /// the VM's window.
    /// The cell holds the handle, so a repeat copies it only then (a save-game is megabytes).
    last_save: Option<(u64, GameStateCell<SaveHandle>, u128)>,
    desync: Option<DesyncSaves>,
    /// The inputs each frame was last simulated with (by frame, from the game's first).
    inputs: Vec<Vec<C::Input>>,
    /// Lua's heap bytes and live blocks when the last `handle` ended (`check_heap_unchanged`).
    heap_mark: Option<(u64, u64)>,
    _config: PhantomData<fn() -> C>,
}

impl<C> GgrsGame<C>
where
    C: ggrs::Config<State = SaveHandle>,
    C::Input: GameInput,
{
    /// Wraps a game driven by `session` (a [`ggrs::P2PSession`], [`ggrs::SyncTestSession`],
    /// [`ggrs::SpectatorSession`] or a [`MaxPrediction`]).
    ///
    /// Refused up front, rather than failing mid-session:
    /// - an arena backend whose snapshot window ([`GameConfig::window`]) is smaller than the
    ///   frames the session may load back ([`RollbackDepth`]):
    ///   [`GameError::WindowTooSmall`] says which window to use (the serializer keeps its
    ///   save-games in GGRS's cells and has no window);
    /// - [`Checksum::Arena`] with [`Backend::Serialize`]: a save-game load rebuilds the heap at
    ///   other addresses, so every re-simulated frame would mismatch;
    /// - [`Checksum::Arena`] for a session that compares checksums with other peers
    ///   ([`RollbackDepth::compares_with_peers`], a [`ggrs::P2PSession`]): their arenas differ
    ///   byte for byte whatever the state, so every check would report a desync.
    pub fn new(
        game: Game<C::Input>,
        checksum: Checksum,
        session: &impl RollbackDepth,
    ) -> Result<GgrsGame<C>, GameError> {
        let needed = session.snapshots_needed();
        let window = game.vm().snapshots().window();
        if game.backend() != Backend::Serialize && window < needed {
            return Err(GameError::WindowTooSmall {
                window,
                needed,
                session: session.describe(),
            });
        }
        let peers = session.compares_with_peers();
        let checksum = match (checksum, game.backend()) {
            (Checksum::Arena, Backend::Serialize) => return Err(GameError::Config(
                "Checksum::Arena compares heap bytes, and a save-game load (Backend::Serialize) \
                     rebuilds the heap at other addresses; use Checksum::Auto or Checksum::Game"
                    .into(),
            )),
            (Checksum::Arena, _) if peers => {
                return Err(GameError::Config(format!(
                    "Checksum::Arena compares heap bytes, and {} compares them with another \
                     peer's, whose arena holds other addresses: every check would report a \
                     desync; use Checksum::Auto or Checksum::Game",
                    session.describe()
                )))
            }
            (Checksum::Auto, Backend::Serialize) => Checksum::Game,
            (Checksum::Auto, _) if peers => Checksum::Game,
            (Checksum::Auto, _) => Checksum::Arena,
            (c, _) => c,
        };
        Ok(GgrsGame {
            game,
            checksum,
            saves: 0,
            loads: 0,
            advances: 0,
            repeated_saves: 0,
            last_save: None,
            desync: None,
            inputs: Vec::new(),
            heap_mark: None,
            _config: PhantomData,
        })
    }

    /// The inputs each frame was last simulated with, from the first frame this driver
    /// stepped: for the frames GGRS has confirmed, the confirmed inputs, which every peer
    /// shares. A lockstep run with them ([`replay`]) reaches the state every peer should
    /// hold, for explaining a desync.
    pub fn inputs(&self) -> &[Vec<C::Input>] {
        &self.inputs
    }

    /// The checksum in use ([`Checksum::Auto`] resolved).
    pub fn checksum_kind(&self) -> Checksum {
        self.checksum
    }

    /// The game.
    pub fn game(&self) -> &Game<C::Input> {
        &self.game
    }

    /// The game, mutably.
    pub fn game_mut(&mut self) -> &mut Game<C::Input> {
        &mut self.game
    }

    /// Keeps a save-game of every frame that is a multiple of `every` (the last
    /// 16 such frames), both as first simulated and as last re-simulated, so that a desync
    /// can be written out with [`write_desync_saves`](GgrsGame::write_desync_saves). Use the
    /// session's desync-detection interval (P2P), or 1 (SyncTest). Costs a save-game per kept
    /// frame: a debugging aid.
    pub fn keep_desync_saves(&mut self, every: u64) {
        self.desync = Some(DesyncSaves {
            every: every.max(1),
            first: BTreeMap::new(),
            latest: BTreeMap::new(),
        });
    }

    /// Writes the kept save-games of `frame` into `dir` as `<tag>-frame<N>.luasave` (its
    /// latest simulation, the one GGRS checksummed last) and, when the first simulation
    /// differs, `<tag>-frame<N>-first.luasave`. Two peers' files (or the two files of a
    /// SyncTest mismatch) can then be loaded with `Vm::load_game` and compared.
    pub fn write_desync_saves(
        &self,
        frame: i32,
        dir: &Path,
        tag: &str,
    ) -> Result<Vec<PathBuf>, GameError> {
        let Some(keep) = &self.desync else {
            return Err(GameError::Config(
                "no save-games kept: call keep_desync_saves before the session starts".into(),
            ));
        };
        let Some(latest) = keep.latest.get(&frame) else {
            return Err(GameError::Config(format!(
                "no save-game kept for frame {frame}: keep_desync_saves({}) keeps multiples of {} \
                 (the last {DESYNC_FRAMES_KEPT}); make it divide the desync-detection interval",
                keep.every, keep.every
            )));
        };
        let io = |e: std::io::Error, p: &Path| {
            GameError::Config(format!("cannot write {}: {e}", p.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
        let mut written = Vec::new();
        let path = dir.join(format!("{tag}-frame{frame}.luasave"));
        std::fs::write(&path, latest).map_err(|e| io(e, &path))?;
        written.push(path);
        if let Some(first) = keep.first.get(&frame).filter(|f| *f != latest) {
            let path = dir.join(format!("{tag}-frame{frame}-first.luasave"));
            std::fs::write(&path, first).map_err(|e| io(e, &path))?;
            written.push(path);
        }
        Ok(written)
    }

    fn checksum(&mut self) -> Result<u128, GameError> {
        Ok(match self.checksum {
            Checksum::Arena | Checksum::Auto => self.game.arena_digest() as u128,
            Checksum::Game => match self.game.game_digest()? {
                Some(d) => d as u64 as u128,
                None => self.game.value_digest()? as u128,
            },
        })
    }

    fn keep_for_desync(&mut self, frame: i32) -> Result<(), GameError> {
        let Some(every) = self.desync.as_ref().map(|d| d.every) else {
            return Ok(());
        };
        if frame < 0 || frame as u64 % every != 0 {
            return Ok(());
        }
        let bytes = self.game.save_game()?;
        let keep = self.desync.as_mut().expect("checked");
        keep.first.entry(frame).or_insert_with(|| bytes.clone());
        keep.latest.insert(frame, bytes);
        for map in [&mut keep.first, &mut keep.latest] {
            while map.len() > DESYNC_FRAMES_KEPT {
                map.pop_first();
            }
        }
        Ok(())
    }

    /// Lua's heap bytes and live blocks: what a host call that allocated between two
    /// [`handle`](GgrsGame::handle) calls changes.
    fn heap_mark(&self) -> (u64, u64) {
        let stats = self.game.vm().arena_stats();
        (stats.bytes_in_use, stats.live_blocks)
    }

    /// Under [`Checksum::Arena`], refuses a heap that changed since the last
    /// [`handle`](GgrsGame::handle) ended: the frames GGRS re-simulates would not see that
    /// change, so their checksums would differ from the first simulation's and the session
    /// would report a desync that names nothing of the cause.
    fn check_heap_unchanged(&self) -> Result<(), GameError> {
        let Some((bytes_before, blocks_before)) = self.heap_mark else {
            return Ok(());
        };
        let (bytes_after, blocks_after) = self.heap_mark();
        if self.checksum != Checksum::Arena
            || (bytes_after, blocks_after) == (bytes_before, blocks_before)
        {
            return Ok(());
        }
        Err(GameError::HeapChangedBetweenFrames {
            frame: self.game.frame(),
            bytes_before,
            blocks_before,
            bytes_after,
            blocks_after,
        })
    }

    /// Serves a batch of requests, in order.
    ///
    /// Under [`Checksum::Arena`] (a SyncTest's default), the heap must be as the last call
    /// left it: reads between frames through paths, handles and keys the game uses leave it
    /// so, but a Lua function that allocates, called from Rust between frames, does not, and
    /// is refused here ([`GameError::HeapChangedBetweenFrames`]) before GGRS would report it
    /// as a desync.
    pub fn handle(&mut self, requests: Vec<GgrsRequest<C>>) -> Result<(), GameError> {
        self.check_heap_unchanged()?;
        let served = self.serve(requests);
        self.heap_mark = Some(self.heap_mark());
        served
    }

    fn serve(&mut self, requests: Vec<GgrsRequest<C>>) -> Result<(), GameError> {
        for request in requests {
            match request {
                GgrsRequest::SaveGameState { cell, frame } => {
                    if frame as u64 != self.game.frame() {
                        return Err(GameError::Config(format!(
                            "GGRS asked to save frame {frame} while the game is at {}",
                            self.game.frame()
                        )));
                    }
                    let frame_now = self.game.frame();
                    match &self.last_save {
                        Some((f, saved, sum)) if *f == frame_now => {
                            cell.save(frame, saved.load(), Some(*sum));
                            self.repeated_saves += 1;
                        }
                        _ => {
                            self.keep_for_desync(frame)?;
                            let handle = self.game.save()?;
                            let sum = self.checksum()?;
                            cell.save(frame, Some(handle), Some(sum));
                            self.last_save = Some((frame_now, cell, sum));
                        }
                    }
                    self.saves += 1;
                }
                GgrsRequest::LoadGameState { cell, frame } => {
                    let Some(handle) = cell.load() else {
                        return Err(GameError::Config(format!(
                            "GGRS asked to load frame {frame}, which was never saved"
                        )));
                    };
                    self.last_save = None;
                    self.game.load(&handle, frame as u64)?;
                    self.loads += 1;
                }
                GgrsRequest::AdvanceFrame { inputs } => {
                    let inputs: Vec<C::Input> = inputs.into_iter().map(|(i, _)| i).collect();
                    self.last_save = None;
                    let at = self.game.frame() as usize;
                    self.game.step(&inputs)?;
                    self.inputs.truncate(at);
                    if self.inputs.len() == at {
                        self.inputs.push(inputs);
                    }
                    self.advances += 1;
                }
            }
        }
        Ok(())
    }
}

/// A non-blocking UDP socket for GGRS peers, bound to any address: `0.0.0.0:7000` for a peer
/// that others reach over the network, [`PeerSocket::loopback`] for peers on one machine.
/// Messages travel as bincode, one per datagram (GGRS keeps them under a kilobyte).
pub struct PeerSocket {
    socket: UdpSocket,
    buffer: Vec<u8>,
}

/// The largest datagram [`PeerSocket`] reads; larger ones are cut and dropped as malformed.
const DATAGRAM_BYTES: usize = 4096;

impl PeerSocket {
    /// Binds to `addr` (anything [`UdpSocket::bind`] takes: `"0.0.0.0:7000"`, a
    /// [`SocketAddr`], `("::", 0)`), non-blocking.
    pub fn bind(addr: impl ToSocketAddrs) -> std::io::Result<PeerSocket> {
        let socket = UdpSocket::bind(addr)?;
        socket.set_nonblocking(true)?;
        Ok(PeerSocket {
            socket,
            buffer: vec![0; DATAGRAM_BYTES],
        })
    }

    /// Binds to 127.0.0.1 on a free port, for peers on this machine.
    pub fn loopback() -> std::io::Result<PeerSocket> {
        PeerSocket::bind((Ipv4Addr::LOCALHOST, 0))
    }

    /// The bound address (with the port the system chose for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }
}

impl NonBlockingSocket<SocketAddr> for PeerSocket {
    fn send_to(&mut self, msg: &Message, addr: &SocketAddr) {
        if let Ok(bytes) = bincode::serialize(msg) {
            // Loss is normal for UDP; GGRS resends.
            let _ = self.socket.send_to(&bytes, addr);
        }
    }

    fn receive_all_messages(&mut self) -> Vec<(SocketAddr, Message)> {
        let mut out = Vec::new();
        while let Ok((n, from)) = self.socket.recv_from(&mut self.buffer) {
            if let Ok(msg) = bincode::deserialize(&self.buffer[..n]) {
                out.push((from, msg));
            }
        }
        out
    }
}

/// Options of [`sync_test_with`], [`p2p_pair_with`] and [`p2p_peer_with`]. The defaults
/// ([`SessionOptions::default`]) are the named constants below.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The checksum saves report (default [`Checksum::Auto`]: the game digest for P2P, see
    /// [`GgrsGame::new`]).
    pub checksum: Checksum,
    /// On a desync (SyncTest `MismatchedChecksum`, P2P `DesyncDetected`), write the local
    /// state of the mismatched frames here as save-games (see
    /// [`GgrsGame::write_desync_saves`]).
    pub desync_dir: Option<PathBuf>,
    /// P2P: frames a peer may run ahead of the other's confirmed input
    /// (default [`MAX_PREDICTION`]).
    pub max_prediction: usize,
    /// P2P: frames between a local input and the frame it applies to
    /// (default [`INPUT_DELAY`]).
    pub input_delay: usize,
    /// P2P: frames between checksum comparisons (default [`DESYNC_INTERVAL`]).
    pub desync_interval: u32,
    /// P2P: GGRS's sparse saving (`SessionBuilder::with_sparse_saving_mode`, default off):
    /// GGRS asks to save only the last frame all inputs are confirmed for, so a rollback costs
    /// one load and one save instead of a save per re-simulated frame, and goes back to that
    /// frame (further than the first wrong one when predictions were right since). For games
    /// whose saves cost much more than a step: see [`Saving`](crate::runtime::Saving) for
    /// the same choice in [`FrameSession`](crate::runtime::FrameSession).
    pub sparse_saving: bool,
}

/// P2P: frames a peer may predict ahead by default ([`SessionOptions::max_prediction`]).
pub const MAX_PREDICTION: usize = 8;
/// P2P: input delay by default ([`SessionOptions::input_delay`]).
pub const INPUT_DELAY: usize = 1;
/// How long a peer that reached its last frame keeps exchanging messages, so that the last
/// checksums reach the other peer.
pub const LINGER: Duration = Duration::from_millis(300);

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            checksum: Checksum::Auto,
            desync_dir: None,
            max_prediction: MAX_PREDICTION,
            input_delay: INPUT_DELAY,
            desync_interval: DESYNC_INTERVAL,
            sparse_saving: false,
        }
    }
}

/// Runs `SyncTestSession` (which rolls back `check_distance` frames every frame and compares the
/// checksums of re-simulated frames) on a game for `frames` frames, with [`scripted_input`]
/// bytes. Returns the game driver.
pub fn sync_test(
    cfg: &GameConfig,
    backend: Backend,
    frames: u32,
    check_distance: usize,
) -> Result<GgrsGame, String> {
    let seed = cfg.seed;
    sync_test_with(
        cfg,
        backend,
        frames,
        check_distance,
        &SessionOptions::default(),
        |f, p| scripted_input(seed, f, p),
    )
}

/// [`sync_test`] with options and inputs of any type: `input(frame, player)`.
pub fn sync_test_with<I>(
    cfg: &GameConfig,
    backend: Backend,
    frames: u32,
    check_distance: usize,
    options: &SessionOptions,
    mut input: impl FnMut(u64, usize) -> I,
) -> Result<GgrsGame<LuaGgrs<I>>, String>
where
    I: GameInput + Copy + PartialEq + Default + DeserializeOwned + Send + Sync + 'static,
{
    let players = cfg.players;
    let (mut driver, mut session) = driven(cfg, backend, options, 1, "", |b| {
        b.with_check_distance(check_distance)
            .start_synctest_session()
    })?;
    for f in 0..frames as u64 {
        for p in 0..players {
            session
                .add_local_input(p, input(f, p))
                .map_err(|e| e.to_string())?;
        }
        let requests = match session.advance_frame() {
            Ok(r) => r,
            Err(GgrsError::MismatchedChecksum {
                current_frame,
                mismatched_frames,
            }) => {
                let mut msg = format!(
                    "desync at frame {current_frame}: re-simulated frames {mismatched_frames:?} do not match their first simulation"
                );
                if let Some(dir) = &options.desync_dir {
                    for &m in &mismatched_frames {
                        match driver.write_desync_saves(m, dir, "synctest") {
                            Ok(paths) => {
                                for p in paths {
                                    msg += &format!("; wrote {}", p.display());
                                }
                            }
                            Err(e) => msg += &format!("; {e}"),
                        }
                    }
                }
                return Err(msg);
            }
            Err(e) => return Err(e.to_string()),
        };
        driver.handle(requests).map_err(|e| e.to_string())?;
    }
    Ok(driver)
}

/// The game of `cfg` on `backend` and a session of its players that `session` finishes
/// building, with the game's driver: the checksum `options` ask for, and the saves of the
/// last `keep` frames kept when `options` ask for desync saves. `who` starts the message of
/// a driver refused for the session (`peer 0: `).
fn driven<I, S>(
    cfg: &GameConfig,
    backend: Backend,
    options: &SessionOptions,
    keep: u64,
    who: &str,
    session: impl FnOnce(SessionBuilder<LuaGgrs<I>>) -> Result<S, GgrsError>,
) -> Result<(GgrsGame<LuaGgrs<I>>, S), String>
where
    I: GameInput + Copy + PartialEq + Default + DeserializeOwned + Send + Sync + 'static,
    S: RollbackDepth,
{
    let game = Game::new(cfg, backend).map_err(|e| e.to_string())?;
    let builder = SessionBuilder::<LuaGgrs<I>>::new()
        .with_num_players(game.players())
        .map_err(|e| e.to_string())?;
    let session = session(builder).map_err(|e| e.to_string())?;
    let mut driver =
        GgrsGame::new(game, options.checksum, &session).map_err(|e| format!("{who}{e}"))?;
    if options.desync_dir.is_some() {
        driver.keep_desync_saves(keep);
    }
    Ok((driver, session))
}

/// What one peer of [`p2p_pair`] saw.
#[derive(Debug, Clone, Default)]
pub struct PeerReport {
    /// Frames reached.
    pub frames: u64,
    /// Rollbacks served.
    pub rollbacks: u64,
    /// Frames advanced in total (re-simulations included).
    pub advances: u64,
    /// Saves served (repeated saves of a stalled frame included).
    pub saves: u64,
    /// Desyncs GGRS detected: (frame, local checksum, remote checksum).
    pub desyncs: Vec<(i32, u128, u128)>,
    /// Save-games written for desyncs ([`SessionOptions::desync_dir`]).
    pub desync_files: Vec<PathBuf>,
    /// Wall time.
    pub elapsed: Duration,
    /// The inputs each frame was last simulated with (see [`GgrsGame::inputs`]), each player's
    /// as GGRS sends it (bincode): one byte per player for byte inputs, what [`replay`] takes.
    pub inputs: Vec<Vec<u8>>,
    /// The checksum the peers compared ([`Checksum::Auto`] resolved: the game digest).
    pub checksum: Checksum,
}

/// Frames between P2P checksum comparisons.
pub const DESYNC_INTERVAL: u32 = 10;

/// Two P2P peers on 127.0.0.1, each with its own VM running the game, with desync detection on.
/// Each runs until it reaches `frames` (then keeps talking briefly so the last checksums are
/// compared) or `timeout` passes. Inputs are [`scripted_input`] for the peer's own player.
pub fn p2p_pair(
    cfg: &GameConfig,
    frames: u64,
    timeout: Duration,
) -> Result<[PeerReport; 2], String> {
    p2p_pair_with(
        cfg,
        frames,
        timeout,
        &SessionOptions::default(),
        scripted_input,
    )
}

/// [`p2p_pair`] with options and inputs of any type: `input(seed, frame, player)`.
pub fn p2p_pair_with<I>(
    cfg: &GameConfig,
    frames: u64,
    timeout: Duration,
    options: &SessionOptions,
    input: fn(u64, u64, usize) -> I,
) -> Result<[PeerReport; 2], String>
where
    I: GameInput + Copy + PartialEq + Default + DeserializeOwned + Send + Sync + 'static,
{
    if cfg.players != 2 {
        return Err("p2p runs exactly 2 players".into());
    }
    let sockets = [
        PeerSocket::loopback().map_err(|e| e.to_string())?,
        PeerSocket::loopback().map_err(|e| e.to_string())?,
    ];
    let addrs = [
        sockets[0].local_addr().map_err(|e| e.to_string())?,
        sockets[1].local_addr().map_err(|e| e.to_string())?,
    ];
    let handles: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(me, socket)| {
            let cfg = cfg.clone();
            let options = options.clone();
            let other = addrs[1 - me];
            std::thread::spawn(move || {
                p2p_peer_with(
                    &cfg,
                    me,
                    socket,
                    other,
                    frames,
                    timeout,
                    &options,
                    |f, p| input(cfg.seed, f, p),
                )
            })
        })
        .collect();
    let mut out = [PeerReport::default(), PeerReport::default()];
    for (i, h) in handles.into_iter().enumerate() {
        out[i] = h
            .join()
            .map_err(|_| "a peer thread panicked".to_string())??;
    }
    Ok(out)
}

/// [`p2p_peer_with`] with the default options and [`scripted_input`] (for peers in separate
/// processes: `luasnap p2p`).
pub fn p2p_peer(
    cfg: &GameConfig,
    me: usize,
    socket: impl NonBlockingSocket<SocketAddr> + 'static,
    other: SocketAddr,
    frames: u64,
    timeout: Duration,
) -> Result<PeerReport, String> {
    let seed = cfg.seed;
    p2p_peer_with(
        cfg,
        me,
        socket,
        other,
        frames,
        timeout,
        &SessionOptions::default(),
        |f, p| scripted_input(seed, f, p),
    )
}

/// What [`replay`] recorded.
#[derive(Debug, Default)]
pub struct Replay {
    /// The value digest after each frame asked for: (frame, digest).
    pub digests: Vec<(u64, u64)>,
    /// A save-game of the state after the frame asked for.
    pub save: Option<Vec<u8>>,
    /// The value graph of the state after the frame asked for.
    pub graph: Option<crate::runtime::value_diff::ValueGraph>,
}

/// Runs the game in lockstep from `G.init` with `inputs` (one entry per frame, from frame 0),
/// recording the value digest after each frame in `digests_after` and, after frame
/// `state_after`, a save-game (`graph` false) or the value graph (`graph` true) of the state.
/// Two processes that run this with the confirmed inputs of a P2P session and disagree show
/// where the game depends on the process; if they agree, a desync came from the peers'
/// re-simulations instead.
pub fn replay(
    cfg: &GameConfig,
    inputs: &[Vec<u8>],
    digests_after: &[u64],
    state_after: Option<u64>,
    graph: bool,
) -> Result<Replay, GameError> {
    let mut game = Game::new(cfg, Backend::ArenaFull)?;
    let last = digests_after
        .iter()
        .copied()
        .chain(state_after)
        .max()
        .unwrap_or(0);
    let mut out = Replay::default();
    for (f, frame_inputs) in inputs.iter().enumerate().take(last as usize + 1) {
        let f = f as u64;
        game.step(frame_inputs)?;
        if digests_after.contains(&f) {
            out.digests.push((f, game.value_digest()?));
        }
        if state_after == Some(f) {
            if graph {
                out.graph = Some(game.value_graph()?);
            } else {
                out.save = Some(game.save_game()?);
            }
        }
    }
    Ok(out)
}

/// One P2P peer of a two-player game: player `me` (0 or 1) on `socket`, the other peer at
/// `other`, each in its own process or machine (or thread: [`p2p_pair_with`] runs two).
/// Builds the game from `cfg` (natives and userdata from its [`GameConfig::setup`]), runs a
/// [`ggrs::P2PSession`] with desync detection, and feeds it `input(frame, me)` for each frame
/// of the local player. Runs until the game reaches `frames` (then keeps talking for
/// [`LINGER`] so the last checksums are compared) or `timeout` passes, and reports what it
/// saw: desyncs are in the report, not errors. With the default options the checksum is the
/// game digest, which agrees between processes whenever the states do.
#[allow(clippy::too_many_arguments)]
pub fn p2p_peer_with<I, S>(
    cfg: &GameConfig,
    me: usize,
    socket: S,
    other: SocketAddr,
    frames: u64,
    timeout: Duration,
    options: &SessionOptions,
    mut input: impl FnMut(u64, usize) -> I,
) -> Result<PeerReport, String>
where
    I: GameInput + Copy + PartialEq + Default + DeserializeOwned + Send + Sync + 'static,
    S: NonBlockingSocket<SocketAddr> + 'static,
{
    if cfg.players != 2 || me > 1 {
        return Err(format!(
            "p2p runs exactly 2 players, numbered 0 and 1 (GameConfig::players is {}, the \
             local player {me})",
            cfg.players
        ));
    }
    let start = Instant::now();
    let interval = options.desync_interval.max(1);
    let who = format!("peer {me}: ");
    let (mut driver, mut session) = driven(
        cfg,
        Backend::ArenaAuto,
        options,
        interval as u64,
        &who,
        |b| {
            b.with_desync_detection_mode(ggrs::DesyncDetection::On { interval })
                .with_max_prediction_window(options.max_prediction)
                .with_sparse_saving_mode(options.sparse_saving)
                .with_input_delay(options.input_delay)
                .add_player(PlayerType::Local, me)?
                .add_player(PlayerType::Remote(other), 1 - me)?
                .start_p2p_session(socket)
        },
    )?;
    let mut report = PeerReport::default();
    let mut done_at: Option<Instant> = None;
    let mut skip = 0u32;
    while start.elapsed() < timeout {
        session.poll_remote_clients();
        for event in session.events() {
            match event {
                GgrsEvent::DesyncDetected {
                    frame,
                    local_checksum,
                    remote_checksum,
                    ..
                } => {
                    report
                        .desyncs
                        .push((frame, local_checksum, remote_checksum));
                    if let Some(dir) = &options.desync_dir {
                        let files = driver
                            .write_desync_saves(frame, dir, &format!("peer{me}"))
                            .map_err(|e| format!("peer {me}: {e}"))?;
                        report.desync_files.extend(files);
                    }
                }
                GgrsEvent::WaitRecommendation { skip_frames } => skip = skip_frames,
                GgrsEvent::Disconnected { .. } => {
                    return Err(format!("peer {me}: the other peer disconnected"))
                }
                _ => {}
            }
        }
        if let Some(t) = done_at {
            // Keep exchanging a little after the last frame so the final checksums arrive.
            if t.elapsed() > LINGER {
                break;
            }
        } else if session.current_state() == SessionState::Running {
            if skip > 0 {
                skip -= 1;
            } else {
                let frame = session.current_frame().max(0) as u64;
                session
                    .add_local_input(me, input(frame, me))
                    .map_err(|e| e.to_string())?;
                match session.advance_frame() {
                    Ok(requests) => driver.handle(requests).map_err(|e| e.to_string())?,
                    Err(GgrsError::PredictionThreshold) => {}
                    Err(e) => return Err(format!("peer {me}: {e}")),
                }
                if driver.game().frame() >= frames {
                    done_at = Some(Instant::now());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    report.frames = driver.game().frame();
    report.inputs = driver
        .inputs()
        .iter()
        .map(|frame| {
            frame
                .iter()
                .flat_map(|i| bincode::serialize(i).unwrap_or_default())
                .collect()
        })
        .collect();
    report.checksum = driver.checksum_kind();
    report.rollbacks = driver.loads;
    report.advances = driver.advances;
    report.saves = driver.saves;
    report.elapsed = start.elapsed();
    if report.frames < frames {
        return Err(format!(
            "peer {me} reached frame {} of {frames} before the {:?} timeout",
            report.frames, timeout
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(cell: &GameStateCell<SaveHandle>, frame: i32) -> GgrsRequest<LuaGgrs> {
        GgrsRequest::SaveGameState {
            cell: cell.clone(),
            frame,
        }
    }

    fn advance() -> GgrsRequest<LuaGgrs> {
        GgrsRequest::AdvanceFrame {
            inputs: vec![
                (1, ggrs::InputStatus::Confirmed),
                (2, ggrs::InputStatus::Predicted),
            ],
        }
    }

    /// At the prediction threshold GGRS saves the same frame on every `advance_frame` call;
    /// however long it waits there, the frames it may load stay in the window.
    #[test]
    fn saves_repeated_at_the_prediction_threshold_keep_older_frames_loadable() {
        let mut cfg = GameConfig::default_game(2, 1);
        cfg.base_address = None;
        cfg.script = "local G, s = {}, nil
            function G.init() s = { v = 0 } end
            function G.step(i) s.v = s.v * 31 + i[1] + 7 * i[2] end
            function G.digest() return s.v end
            return G"
            .into();
        cfg.chunk_name = "=test".into();
        let window = cfg.window;
        let game = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
        // Loads frame 0 from frame 8, as a P2P session with max prediction 8 may.
        let mut driver =
            GgrsGame::<LuaGgrs>::new(game, Checksum::Arena, &MaxPrediction(8)).unwrap();
        let cells: Vec<GameStateCell<SaveHandle>> = (0..9).map(|_| Default::default()).collect();
        for (f, cell) in cells.iter().enumerate().take(8) {
            driver
                .handle(vec![save(cell, f as i32), advance()])
                .unwrap();
        }
        // Stalled at frame 8 for many times the window.
        for _ in 0..window * 5 {
            driver.handle(vec![save(&cells[8], 8)]).unwrap();
        }
        let at_8 = driver.game.arena_digest();
        // Frame 0 is still there, and the replay from it reaches the same state.
        driver
            .handle(vec![GgrsRequest::LoadGameState {
                cell: cells[0].clone(),
                frame: 0,
            }])
            .unwrap();
        for (f, cell) in cells.iter().enumerate().skip(1) {
            driver
                .handle(vec![advance(), save(cell, f as i32)])
                .unwrap();
        }
        assert_eq!(driver.game.frame(), 8);
        assert_eq!(driver.game.arena_digest(), at_8);
        // Only the stalled saves were repeats: a save after a load or an advance is new.
        assert_eq!(driver.repeated_saves, window as u64 * 5 - 1);
    }

    /// A window too small for the session is refused when the driver is made, with the window
    /// to use, instead of "snapshot #1 is older than the 5 retained snapshots" mid-session.
    #[test]
    fn a_window_smaller_than_the_sessions_rollback_is_refused_up_front() {
        let game_with_window = |window, backend| {
            let mut cfg = GameConfig::default_game(2, 1);
            cfg.base_address = None;
            cfg.window = window;
            cfg.script = "local G = {} function G.init() end function G.step() end return G".into();
            cfg.chunk_name = "=test".into();
            Game::new(&cfg, backend).unwrap()
        };
        let synctest = |d| {
            SessionBuilder::<LuaGgrs>::new()
                .with_num_players(2)
                .unwrap()
                .with_check_distance(d)
                .start_synctest_session()
                .unwrap()
        };
        let refused = |r: Result<GgrsGame, GameError>| match r {
            Err(e @ GameError::WindowTooSmall { .. }) => e.to_string(),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        };
        let e = refused(GgrsGame::new(
            game_with_window(5, Backend::ArenaIncremental),
            Checksum::Auto,
            &synctest(6),
        ));
        assert!(e.contains("window of at least 6"), "{e}");
        assert!(e.contains("check distance 6"), "{e}");
        let e = refused(GgrsGame::new(
            game_with_window(8, Backend::ArenaFull),
            Checksum::Auto,
            &MaxPrediction(8),
        ));
        assert!(e.contains("window of at least 9"), "{e}");
        assert!(e.contains("GameConfig::window"), "{e}");
        // What the check asks for is enough: the session runs to the end.
        let mut cfg = GameConfig::default_game(2, 1);
        cfg.base_address = None;
        cfg.window = 6;
        cfg.script = "local G, s = {}, 0 function G.init() end
            function G.step(i) s = s * 31 + i[1] + 7 * i[2] end return G"
            .into();
        cfg.chunk_name = "=test".into();
        sync_test(&cfg, Backend::ArenaIncremental, 40, 6).unwrap();
        // The serializer has no window; spectators and lockstep never load.
        GgrsGame::<LuaGgrs>::new(
            game_with_window(2, Backend::Serialize),
            Checksum::Auto,
            &synctest(6),
        )
        .unwrap();
        GgrsGame::<LuaGgrs>::new(
            game_with_window(2, Backend::ArenaFull),
            Checksum::Auto,
            &MaxPrediction(0),
        )
        .unwrap();
    }
}
