//! GGRS: rollback-netcode sessions whose save and load requests are served from snapshots.
//!
//! [`GgrsGame`] answers a session's [`ggrs::GgrsRequest`]s with a [`Game`]: `SaveGameState`
//! takes a snapshot (arena snapshots, or a save-game for the serializer backend) and reports a
//! checksum, `LoadGameState` rolls back to it, `AdvanceFrame` steps the game. Checksums are the
//! arena digest by default ([`Checksum::Arena`]: byte-exact, comparable within one process, as
//! `SyncTestSession` compares); peers in different processes compare [`Checksum::Game`]
//! (`G.digest()` if the game has one, else the value digest), since their arenas hold
//! different absolute addresses.

use crate::runtime::{scripted_input, Backend, Game, GameConfig, GameError, SaveHandle};
use ggrs::{
    GameStateCell, GgrsError, GgrsEvent, GgrsRequest, Message, NonBlockingSocket, PlayerType,
    SessionBuilder, SessionState,
};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// The GGRS configuration for luasnap games: one byte of input per player per frame.
pub struct LuaGgrs;

impl ggrs::Config for LuaGgrs {
    type Input = u8;
    type InputPredictor = ggrs::PredictRepeatLast;
    type State = SaveHandle;
    type Address = SocketAddr;
}

/// What checksum a save reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// The arena digest: byte-exact; comparable only between VMs of one process.
    Arena,
    /// `G.digest()` if the game defines it, else the value digest: comparable across processes.
    Game,
}

/// A game driven by a GGRS session.
pub struct GgrsGame {
    game: Game,
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
}

impl GgrsGame {
    /// Wraps a game.
    pub fn new(game: Game, checksum: Checksum) -> GgrsGame {
        GgrsGame {
            game,
            checksum,
            saves: 0,
            loads: 0,
            advances: 0,
            repeated_saves: 0,
            last_save: None,
        }
    }

    /// The game.
    pub fn game(&self) -> &Game {
        &self.game
    }

    /// The game, mutably.
    pub fn game_mut(&mut self) -> &mut Game {
        &mut self.game
    }

    fn checksum(&mut self) -> Result<u128, GameError> {
        Ok(match self.checksum {
            Checksum::Arena => self.game.arena_digest() as u128,
            Checksum::Game => match self.game.game_digest()? {
                Some(d) => d as u64 as u128,
                None => self.game.value_digest()? as u128,
            },
        })
    }

    /// Serves a batch of requests, in order.
    pub fn handle(&mut self, requests: Vec<GgrsRequest<LuaGgrs>>) -> Result<(), GameError> {
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
                    let inputs: Vec<u8> = inputs.iter().map(|(i, _)| *i).collect();
                    self.last_save = None;
                    self.game.step(&inputs)?;
                    self.advances += 1;
                }
            }
        }
        Ok(())
    }
}

/// A non-blocking UDP socket on 127.0.0.1 only, for local peers.
pub struct LoopbackSocket {
    socket: UdpSocket,
    buffer: Vec<u8>,
}

impl LoopbackSocket {
    /// Binds to 127.0.0.1 on a free port.
    pub fn bind() -> std::io::Result<LoopbackSocket> {
        let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        socket.set_nonblocking(true)?;
        Ok(LoopbackSocket {
            socket,
            buffer: vec![0; 4096],
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }
}

impl NonBlockingSocket<SocketAddr> for LoopbackSocket {
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

/// Runs `SyncTestSession` (which rolls back `check_distance` frames every frame and compares the
/// checksums of re-simulated frames) on a game for `frames` frames. Returns the game driver.
pub fn sync_test(
    cfg: &GameConfig,
    backend: Backend,
    frames: u32,
    check_distance: usize,
) -> Result<GgrsGame, String> {
    let game = Game::new(cfg, backend).map_err(|e| e.to_string())?;
    let players = game.players();
    let mut session = SessionBuilder::<LuaGgrs>::new()
        .with_num_players(players)
        .map_err(|e| e.to_string())?
        .with_check_distance(check_distance)
        .start_synctest_session()
        .map_err(|e| e.to_string())?;
    let mut driver = GgrsGame::new(game, Checksum::Arena);
    for f in 0..frames as u64 {
        for p in 0..players {
            session
                .add_local_input(p, scripted_input(cfg.seed, f, p))
                .map_err(|e| e.to_string())?;
        }
        let requests = session.advance_frame().map_err(|e| match e {
            GgrsError::MismatchedChecksum { current_frame, mismatched_frames } => format!(
                "desync at frame {current_frame}: re-simulated frames {mismatched_frames:?} do not match their first simulation"
            ),
            e => e.to_string(),
        })?;
        driver.handle(requests).map_err(|e| e.to_string())?;
    }
    Ok(driver)
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
    /// Desyncs GGRS detected: (frame, local checksum, remote checksum).
    pub desyncs: Vec<(i32, u128, u128)>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Two P2P peers on 127.0.0.1, each with its own VM running the game, with desync detection on.
/// Each runs until it reaches `frames` (then keeps talking briefly so the last checksums are
/// compared) or `timeout` passes. Inputs are [`scripted_input`] for the peer's own player.
pub fn p2p_pair(
    cfg: &GameConfig,
    frames: u64,
    timeout: Duration,
) -> Result<[PeerReport; 2], String> {
    if cfg.players != 2 {
        return Err("p2p runs exactly 2 players".into());
    }
    let sockets = [
        LoopbackSocket::bind().map_err(|e| e.to_string())?,
        LoopbackSocket::bind().map_err(|e| e.to_string())?,
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
            let other = addrs[1 - me];
            std::thread::spawn(move || peer(me, socket, other, cfg, frames, timeout))
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

fn peer(
    me: usize,
    socket: LoopbackSocket,
    other: SocketAddr,
    cfg: GameConfig,
    frames: u64,
    timeout: Duration,
) -> Result<PeerReport, String> {
    let start = Instant::now();
    let game = Game::new(&cfg, Backend::ArenaIncremental).map_err(|e| e.to_string())?;
    let mut session = SessionBuilder::<LuaGgrs>::new()
        .with_num_players(2)
        .map_err(|e| e.to_string())?
        .with_desync_detection_mode(ggrs::DesyncDetection::On { interval: 10 })
        .with_max_prediction_window(8)
        .with_input_delay(1)
        .add_player(PlayerType::Local, me)
        .map_err(|e| e.to_string())?
        .add_player(PlayerType::Remote(other), 1 - me)
        .map_err(|e| e.to_string())?
        .start_p2p_session(socket)
        .map_err(|e| e.to_string())?;
    let mut driver = GgrsGame::new(game, Checksum::Game);
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
            if t.elapsed() > Duration::from_millis(300) {
                break;
            }
        } else if session.current_state() == SessionState::Running {
            if skip > 0 {
                skip -= 1;
            } else {
                let frame = session.current_frame().max(0) as u64;
                session
                    .add_local_input(me, scripted_input(cfg.seed, frame, me))
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
    report.rollbacks = driver.loads;
    report.advances = driver.advances;
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
        let window = cfg.window;
        let game = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
        let mut driver = GgrsGame::new(game, Checksum::Arena);
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
}
