//! The match client: one player slot, predicting with a [`PredictiveClient`] and rolling
//! back when the server's confirmations arrive.

use super::error::NetError;
use super::link::LinkConditions;
use super::order::MAX_DELAY_FRAMES;
use super::protocol::{
    game_id, ClientMessage, SaveAssembly, ServerMessage, Start, StateReason, WholeSave,
    CHANNEL_CONTROL, CHANNEL_FRAMES, CHANNEL_STATE, REFUSED_FULL,
};
use super::transport::{connection_config, ClientTransport, SEND_INTERVAL};
use crate::runtime::{
    quantile_us, scripted_input, Backend, Game, GameConfig, GameError, PredictiveClient, Timings,
};
use renet::RenetClient;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Confirmed frames a client keeps after applying them, to replay them on a resync's state.
const HISTORY_FRAMES: u64 = 1024;

/// Called on the client's game after each confirmed frame, in its synchronous form (a host's
/// observer; tests use it to damage a client's state on purpose).
pub type SyncHook = Arc<dyn Fn(&mut Game) -> Result<(), GameError> + Send + Sync>;

/// How to play.
#[derive(Clone)]
pub struct ClientOptions {
    /// The game: script, chunk name, setup, arena. Its `players` and `seed` are ignored: the
    /// server's are the match's.
    pub game: GameConfig,
    /// The server's address.
    pub server: SocketAddr,
    /// The emulated network in front of this client's socket.
    pub link: LinkConditions,
    /// Seeds the emulated network's draws.
    pub link_seed: u64,
    /// How the client saves and restores its synchronous form.
    pub backend: Backend,
    /// How long to try to reach the server.
    pub connect_timeout: Duration,
    /// How long after the last frame to wait for the server's end message.
    pub end_wait: Duration,
    /// Called after each confirmed frame on the synchronous form.
    pub at_sync: Option<SyncHook>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("server", &self.server)
            .field("link", &self.link)
            .field("backend", &self.backend)
            .finish()
    }
}

impl ClientOptions {
    /// Plays `game` on the server at `server` over a perfect link, with the runtime's default
    /// backend ([`Backend::ArenaAuto`]).
    pub fn new(game: GameConfig, server: SocketAddr) -> ClientOptions {
        ClientOptions {
            game,
            server,
            link: LinkConditions::NONE,
            link_seed: 1,
            backend: Backend::ArenaAuto,
            connect_timeout: Duration::from_secs(10),
            end_wait: Duration::from_secs(20),
            at_sync: None,
        }
    }
}

/// Something that happened to a client, for a host's log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The server gave the client a slot.
    Welcome {
        /// The slot (0-based).
        slot: usize,
        /// Players of the match.
        players: usize,
        /// Frames of the match.
        frames: u64,
        /// Whether the client starts from a save-game (the match is running).
        from_save: bool,
    },
    /// The client's state was replaced by the server's.
    Loaded {
        /// The frame of the state.
        frame: u64,
        /// Bytes of the save-game.
        bytes: usize,
        /// Whether it was a resync (else a join).
        resync: bool,
    },
    /// Frames were confirmed.
    Confirmed {
        /// Frames confirmed so far.
        frame: u64,
        /// Frames of the match.
        frames: u64,
        /// The frame delay in force.
        delay: u32,
    },
    /// The server found the client's digest wrong.
    Desync {
        /// The frame of the digests.
        frame: u64,
        /// The server's value digest.
        server: u64,
        /// The client's.
        client: u64,
    },
}

/// What a client's match gave.
#[derive(Debug, Clone)]
pub struct ClientReport {
    /// The slot played (0-based).
    pub slot: usize,
    /// Players of the match.
    pub players: usize,
    /// Frames of the match.
    pub frames: u64,
    /// The backend of the synchronous form.
    pub backend: Backend,
    /// The frame the client joined at from a save-game, if it joined a running match.
    pub joined_at: Option<u64>,
    /// Bytes of that save-game.
    pub join_save_bytes: usize,
    /// The value digest of the client's state after the last frame.
    pub value_digest: u64,
    /// The server's, from its end message (if it arrived).
    pub server_digest: Option<u64>,
    /// `G.digest()` after the last frame, if the game has one.
    pub game_digest: Option<i64>,
    /// Rollbacks to the synchronous form.
    pub rollbacks: u64,
    /// Predicted frames applied again after rollbacks.
    pub resimulated: u64,
    /// Rollback overhead (the load and the snapshots), median, microseconds.
    pub rollback_us_median: f64,
    /// Rollback overhead, 99th percentile, microseconds.
    pub rollback_us_p99: f64,
    /// Rollback overhead, all rollbacks, seconds.
    pub rollback_seconds_total: f64,
    /// Digests the server found wrong.
    pub desyncs: u32,
    /// Save-games loaded to get back in step.
    pub resyncs: u32,
    /// Datagram bytes sent.
    pub bytes_sent: u64,
    /// Datagram bytes received.
    pub bytes_received: u64,
    /// The frame delay at the end.
    pub delay: u32,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl ClientReport {
    /// Whether the client ended on the server's value digest.
    pub fn matches_server(&self) -> bool {
        self.server_digest == Some(self.value_digest)
    }
}

/// A connection to a server: renet over netcode over the emulated link.
pub(crate) struct Conn {
    transport: ClientTransport,
    renet: RenetClient,
    last_update: Instant,
    last_send: Instant,
    queued: bool,
    pub(crate) peer: String,
}

/// A connection dropped on any path, an error's included, says goodbye: the server frees
/// its slot at once instead of holding it until the connection times out.
impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

impl Conn {
    pub(crate) fn open(
        server: SocketAddr,
        link: LinkConditions,
        seed: u64,
    ) -> Result<Conn, NetError> {
        link.validate().map_err(NetError::Config)?;
        let client_id = client_id(seed);
        let transport =
            ClientTransport::connect(server, client_id, link, seed).map_err(NetError::Config)?;
        Ok(Conn {
            transport,
            renet: RenetClient::new(connection_config()),
            last_update: Instant::now(),
            last_send: Instant::now(),
            queued: false,
            peer: format!("the server at {server}"),
        })
    }

    /// Reads what arrived; returns each message's bytes with its channel.
    pub(crate) fn pump(&mut self) -> Result<Vec<(u8, Vec<u8>)>, NetError> {
        self.update()?;
        let mut out = Vec::new();
        for channel in [CHANNEL_CONTROL, CHANNEL_FRAMES, CHANNEL_STATE] {
            while let Some(bytes) = self.renet.receive_message(channel) {
                out.push((channel, bytes.to_vec()));
            }
        }
        Ok(out)
    }

    /// Advances the clocks and hands what arrived to renet, whose messages stay queued for
    /// the next [`Conn::pump`]: a server may send one (a refusal) as the handshake ends.
    fn update(&mut self) -> Result<(), NetError> {
        let now = Instant::now();
        let dt = now - self.last_update;
        self.last_update = now;
        self.renet.update(dt);
        self.transport
            .update(dt, &mut self.renet)
            .map_err(|error| NetError::Io {
                what: "cannot receive".into(),
                error,
            })
    }

    pub(crate) fn send(&mut self, channel: u8, bytes: Vec<u8>) {
        self.renet.send_message(channel, bytes);
        self.queued = true;
    }

    /// Sends renet's packets if a message is queued or [`SEND_INTERVAL`] has passed, and the
    /// emulated link's datagrams that are due.
    pub(crate) fn flush(&mut self) -> Result<(), NetError> {
        let io = NetError::cannot_send;
        if self.queued || self.last_send.elapsed() >= SEND_INTERVAL || !self.renet.is_connected() {
            self.queued = false;
            self.last_send = Instant::now();
            self.transport.send_packets(&mut self.renet).map_err(io)
        } else {
            self.transport.flush_link().map_err(io)
        }
    }

    /// Sends renet's packets now, its acknowledgements three times over: renet repeats an
    /// acknowledgement only in its next packets, and on a lossy link the next may be
    /// seconds away (a save-game being loaded); the copies cost a few small datagrams.
    pub(crate) fn acknowledge(&mut self) -> Result<(), NetError> {
        self.queued = false;
        self.last_send = Instant::now();
        for _ in 0..3 {
            self.transport
                .send_packets(&mut self.renet)
                .map_err(NetError::cannot_send)?;
        }
        Ok(())
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.renet.is_connected()
    }

    /// Why the connection ended, if it did.
    pub(crate) fn ended(&self) -> Option<String> {
        if !self.renet.is_disconnected() {
            return None;
        }
        Some(
            self.transport
                .disconnect_reason()
                .or_else(|| self.renet.disconnect_reason().map(|r| r.to_string()))
                .unwrap_or_else(|| "disconnected".into()),
        )
    }

    /// Leaves: renet's acknowledgements go first, so that the server knows what this client
    /// had whole (a save-game it read and then refused is not one it left unacknowledged).
    pub(crate) fn close(&mut self) {
        let _ = self.transport.send_packets(&mut self.renet);
        self.transport.disconnect();
    }

    /// Waits until netcode's handshake is done.
    pub(crate) fn wait_connected(
        &mut self,
        server: SocketAddr,
        timeout: Duration,
    ) -> Result<(), NetError> {
        let start = Instant::now();
        while !self.is_connected() {
            self.update()?;
            self.flush()?;
            if self.transport.denied() {
                return Err(NetError::Full { server });
            }
            if let Some(reason) = self.ended() {
                return Err(NetError::Connect {
                    server,
                    seconds: start.elapsed().as_secs(),
                    reason,
                });
            }
            if start.elapsed() >= timeout {
                return Err(NetError::Connect {
                    server,
                    seconds: timeout.as_secs(),
                    reason: "no handshake".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    pub(crate) fn traffic(&self) -> (u64, u64) {
        let t = self.transport.traffic();
        (t.sent, t.received)
    }
}

/// A netcode client id: unique enough among a match's clients (time, process, seed).
fn client_id(seed: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&nanos.to_le_bytes());
    bytes.extend_from_slice(&std::process::id().to_le_bytes());
    bytes.extend_from_slice(&seed.to_le_bytes());
    bytes.extend_from_slice(&(&bytes as *const Vec<u8> as usize).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// A client connecting to a match; [`MatchClient::run`] plays it.
pub struct MatchClient {
    opts: ClientOptions,
    conn: Conn,
}

/// The match's parameters, from the welcome.
#[derive(Debug, Clone, Copy)]
struct Welcome {
    slot: usize,
    players: usize,
    seed: u64,
    frames: u64,
    check_every: u64,
    delay: u32,
    /// Time between the server's frames.
    tick: Duration,
    start: Start,
}

impl MatchClient {
    /// Opens the client's socket and starts connecting (nothing blocks yet).
    pub fn connect(opts: ClientOptions) -> Result<MatchClient, NetError> {
        let conn = Conn::open(opts.server, opts.link, opts.link_seed)?;
        Ok(MatchClient { opts, conn })
    }

    /// Plays the match to its end and returns the report; `observe` hears of the welcome,
    /// loads, confirmations and desyncs.
    pub fn run(mut self, observe: impl FnMut(&ClientEvent)) -> Result<ClientReport, NetError> {
        let started = Instant::now();
        self.conn
            .wait_connected(self.opts.server, self.opts.connect_timeout)?;
        // Reads the game's folder into `opts.game`: the client runs the files it identified.
        let hello = ClientMessage::Hello {
            game_id: game_id(&mut self.opts.game)?,
        };
        self.conn.send(CHANNEL_CONTROL, hello.encode());
        let (welcome, early) = self.welcome()?;
        let mut cfg = self.opts.game.clone();
        cfg.players = welcome.players;
        cfg.seed = welcome.seed;
        cfg.base_address = None;
        let mut s = Session {
            opts: self.opts,
            conn: self.conn,
            w: welcome,
            cfg,
            delay: welcome.delay,
            client: None,
            confirmed: BTreeMap::new(),
            held: vec![0; welcome.players],
            epoch: 0,
            assembly: None,
            pending_state: None,
            last_sent: None,
            next_command: 0,
            final_digest: None,
            final_at: None,
            server_end: None,
            joined_at: None,
            join_bytes: 0,
            resyncs: 0,
            desyncs: 0,
            past: Timings::default(),
            past_rollbacks: (0, 0),
            observe: Box::new(observe),
            started,
            pace: Pace::default(),
        };
        (s.observe)(&ClientEvent::Welcome {
            slot: welcome.slot,
            players: welcome.players,
            frames: welcome.frames,
            from_save: welcome.start == Start::Save,
        });
        if welcome.start == Start::Init {
            let game = Game::new(&s.cfg, s.opts.backend)?;
            s.client = Some(PredictiveClient::new(game)?);
        }
        for msg in early {
            s.on_message(msg)?;
        }
        s.play()
    }

    /// Waits for the welcome; returns it and what arrived with it.
    fn welcome(&mut self) -> Result<(Welcome, Vec<ServerMessage>), NetError> {
        let start = Instant::now();
        // What arrives before the welcome is kept too: on a lossy link the welcome may be
        // resent after a save-game's head has arrived on its own channel (its pieces
        // arrived with no head before: an outside tester's F4c at 40% loss).
        let mut rest = Vec::new();
        loop {
            let mut got = None;
            for (_, bytes) in self.conn.pump()? {
                match decode(&self.conn.peer, &bytes)? {
                    ServerMessage::Welcome {
                        slot,
                        players,
                        seed,
                        frames,
                        tick_us,
                        check_every,
                        delay,
                        start,
                    } if got.is_none() => {
                        got = Some(Welcome {
                            slot: slot as usize,
                            players: players as usize,
                            seed,
                            frames,
                            check_every: check_every.max(1) as u64,
                            delay: delay.min(MAX_DELAY_FRAMES),
                            tick: Duration::from_micros(tick_us.into()),
                            start,
                        })
                    }
                    ServerMessage::Refused { reason } => {
                        return Err(refusal(self.opts.server, reason))
                    }
                    other => rest.push(other),
                }
            }
            if let Some(w) = got {
                return Ok((w, rest));
            }
            if let Some(reason) = self.conn.ended() {
                return Err(NetError::Disconnected {
                    peer: self.conn.peer.clone(),
                    frame: 0,
                    reason,
                });
            }
            if start.elapsed() >= self.opts.connect_timeout {
                return Err(NetError::Connect {
                    server: self.opts.server,
                    seconds: self.opts.connect_timeout.as_secs(),
                    reason: "connected, but no welcome".into(),
                });
            }
            self.conn.flush()?;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A refusal's or a lost connection's reason with `note` added; other errors as they are.
fn with_note(e: NetError, note: &str) -> NetError {
    match e {
        NetError::Disconnected {
            peer,
            frame,
            reason,
        } => NetError::Disconnected {
            peer,
            frame,
            reason: format!("{reason}; {note}"),
        },
        NetError::Refused { server, reason } => NetError::Refused {
            server,
            reason: format!("{reason}; {note}"),
        },
        e => e,
    }
}

/// What a joiner that never had its save-game whole is told, from its link's figures.
fn joining_note(link: &LinkConditions) -> String {
    let what = "before this client had the server's join save-game whole (the server sends a joiner at most 3 times the save's size plus 64 KiB and drops it when the save stops arriving, then sends that address no save-game for 10 s or more)";
    if link.loss > 0.0 || !link.latency.is_zero() {
        format!(
            "{what}; this client's emulated link loses {}% of the datagrams each way with {} ms one way (--loss, --latency): the save-game likely could not get through it in time; join over a better link (a 1.5 MB save got through 60% loss when measured, close to the 3 saves), or start with the match (--start-with), which needs no save-game",
            link.loss * 100.0,
            link.latency.as_millis()
        )
    } else {
        format!("{what}; the network to the server may be too lossy or slow for the save: join over a better one, or start with the match (--start-with), which needs no save-game")
    }
}

/// The error a server's refusal is: every slot taken is [`NetError::Full`], as netcode's own
/// denial is.
fn refusal(server: SocketAddr, reason: String) -> NetError {
    if reason == REFUSED_FULL {
        NetError::Full { server }
    } else {
        NetError::Refused { server, reason }
    }
}

fn decode(peer: &str, bytes: &[u8]) -> Result<ServerMessage, NetError> {
    ServerMessage::decode(bytes).map_err(|e| NetError::Protocol {
        peer: peer.to_string(),
        what: e.to_string(),
    })
}

/// A match being played.
struct Session<'o> {
    opts: ClientOptions,
    conn: Conn,
    w: Welcome,
    cfg: GameConfig,
    delay: u32,
    client: Option<PredictiveClient<u8>>,
    /// Confirmed inputs by frame: those not applied yet, and a history of applied ones.
    confirmed: BTreeMap<u64, Vec<u8>>,
    /// The inputs of the last confirmed frame (the others' predicted inputs).
    held: Vec<u8>,
    /// Save-games loaded.
    epoch: u32,
    /// The save-game whose pieces are arriving.
    assembly: Option<SaveAssembly>,
    /// A save-game arrived whole, to load.
    pending_state: Option<WholeSave>,
    last_sent: Option<u8>,
    next_command: u64,
    final_digest: Option<u64>,
    final_at: Option<Instant>,
    server_end: Option<u64>,
    joined_at: Option<u64>,
    join_bytes: usize,
    resyncs: u32,
    desyncs: u32,
    /// Timings and counts of the predictive clients replaced by loads.
    past: Timings,
    past_rollbacks: (u64, u64),
    observe: Box<dyn FnMut(&ClientEvent) + 'o>,
    started: Instant,
    pace: Pace,
}

/// The time a client spent working (applying confirmations, rolling back, re-simulating,
/// predicting) per frame the server confirmed, over its last [`Pace::FRAMES`] frames or
/// more: above the server's tick, it cannot keep up.
#[derive(Default)]
struct Pace {
    /// (frames confirmed, time worked) of each update, newest last.
    updates: std::collections::VecDeque<(u64, Duration)>,
    frames: u64,
    work: Duration,
}

impl Pace {
    const FRAMES: u64 = 128;

    fn record(&mut self, frames: u64, work: Duration) {
        self.updates.push_back((frames, work));
        self.frames += frames;
        self.work += work;
        while let Some(&(f, w)) = self.updates.front() {
            if self.frames - f < Self::FRAMES {
                break;
            }
            self.updates.pop_front();
            self.frames -= f;
            self.work -= w;
        }
    }

    /// The time worked per confirmed frame, once some frames were confirmed.
    fn per_frame(&self) -> Option<Duration> {
        (self.frames > 0).then(|| self.work / self.frames as u32)
    }
}

impl Session<'_> {
    fn play(&mut self) -> Result<ClientReport, NetError> {
        loop {
            for (_, bytes) in self.conn.pump()? {
                let msg = decode(&self.conn.peer, &bytes)?;
                self.on_message(msg)
                    .map_err(|e| self.if_behind(self.while_joining(e)))?;
            }
            if let Some(state) = self.pending_state.take() {
                // Acknowledged first: the load and the catching up after it can take
                // seconds on a busy machine, and the server counts the wait for the save's
                // last piece (a joiner at 40% loss that had its save whole was dropped so).
                self.conn.acknowledge()?;
                self.load_state(state)?;
            }
            if self.client.is_some() {
                let (began, from) = (Instant::now(), self.sync_frame());
                self.apply_confirmed()
                    .and_then(|()| self.predict_ahead())
                    .map_err(|e| self.if_behind(e))?;
                let frames = self.sync_frame().saturating_sub(from);
                self.pace.record(frames, began.elapsed());
            }
            self.conn.flush()?;
            if self.finished() {
                break;
            }
            if let Some(reason) = self.conn.ended() {
                if self.final_digest.is_some() {
                    break; // the server closed after the end
                }
                let e = NetError::Disconnected {
                    peer: self.conn.peer.clone(),
                    frame: self.sync_frame(),
                    reason,
                };
                return Err(self.if_behind(self.while_joining(e)));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // A moment for the last digest to be acknowledged, then leave.
        let linger = Instant::now();
        while linger.elapsed() < Duration::from_millis(200) && self.conn.ended().is_none() {
            let _ = self.conn.pump();
            let _ = self.conn.flush();
            std::thread::sleep(Duration::from_millis(2));
        }
        self.conn.close();
        self.report()
    }

    /// A refusal or a lost connection while the join's save-game is still on its way (the
    /// client shows frame 0 till then) says so, with the link's figures and what to do: an
    /// outside tester's client at `--loss 40` sat at frame 0 and then said only `connection
    /// timed out` (the server's refusal had been lost with 40% of the datagrams).
    fn while_joining(&self, e: NetError) -> NetError {
        if self.client.is_some() {
            return e;
        }
        with_note(e, &joining_note(&self.opts.link))
    }

    /// A refusal or a lost connection of a client that could not keep up with the match
    /// says so, with its figures and what to do: an outside tester's clients starved of CPU
    /// were told only that their transport left confirmations unacknowledged.
    fn if_behind(&self, e: NetError) -> NetError {
        match self.behind_note() {
            Some(note) => with_note(e, &note),
            None => e,
        }
    }

    /// Why this client fell behind, if it did: it worked longer per confirmed frame than a
    /// frame lasts, or its delay grew far past the one it was welcomed with.
    fn behind_note(&self) -> Option<String> {
        let client = self.client.as_ref()?;
        let per_frame = self.pace.per_frame()?;
        let (start, delay, tick) = (self.w.delay, self.delay, self.w.tick);
        let grew = delay >= 2 * start && delay >= start + 4;
        if per_frame <= tick && !grew {
            return None;
        }
        let steps = &client.timings.steps;
        let recent = &steps[steps.len().saturating_sub(256)..];
        let step: Duration =
            recent.iter().map(|(_, d)| *d).sum::<Duration>() / recent.len().max(1) as u32;
        let rollbacks = self.past_rollbacks.0 + client.rollbacks;
        let resimulated = self.past_rollbacks.1 + client.resimulated;
        Some(format!(
            "this client fell behind the match: it worked {:.1} ms per frame the server confirmed (each confirmation rolls back and re-simulates the frames predicted past it: {:.1} frames a rollback on average, at {:.2} ms a G.step, with a save and a load), against a frame every {:.1} ms, and its frame delay grew from {start} to {delay} frames, which makes each rollback longer still; it cannot play this match on this machine as it is: give it more CPU (a core of its own), or play a game whose G.step is cheaper or a server with a slower --tick-ms (docs/client-server.md, \"How large a G.step a client can carry\")",
            per_frame.as_secs_f64() * 1e3,
            resimulated as f64 / rollbacks.max(1) as f64,
            step.as_secs_f64() * 1e3,
            tick.as_secs_f64() * 1e3,
        ))
    }

    fn sync_frame(&self) -> u64 {
        self.client.as_ref().map_or(0, |c| c.sync_frame())
    }

    fn finished(&self) -> bool {
        if self.final_digest.is_none() || self.pending_state.is_some() || self.assembly.is_some() {
            return false;
        }
        self.server_end.is_some()
            || self
                .final_at
                .is_some_and(|t| t.elapsed() >= self.opts.end_wait)
    }

    fn on_message(&mut self, msg: ServerMessage) -> Result<(), NetError> {
        let protocol = |what: String| NetError::Protocol {
            peer: self.conn.peer.clone(),
            what,
        };
        match msg {
            ServerMessage::Welcome { .. } => return Err(protocol("a second welcome".into())),
            ServerMessage::Refused { reason } => return Err(refusal(self.opts.server, reason)),
            ServerMessage::Confirm { frame, inputs } => {
                if inputs.len() != self.w.players {
                    return Err(protocol(format!(
                        "a confirmation of frame {frame} with {} inputs for {} players",
                        inputs.len(),
                        self.w.players
                    )));
                }
                if frame >= self.w.frames {
                    return Err(protocol(format!(
                        "a confirmation of frame {frame} in a match of {} frames",
                        self.w.frames
                    )));
                }
                self.confirmed.insert(frame, inputs);
            }
            ServerMessage::Delay { frames } => self.delay = frames.min(MAX_DELAY_FRAMES),
            ServerMessage::Desync {
                frame,
                server,
                client,
            } => {
                self.desyncs += 1;
                (self.observe)(&ClientEvent::Desync {
                    frame,
                    server,
                    client,
                });
            }
            msg @ (ServerMessage::StateHead { .. } | ServerMessage::StatePiece { .. }) => {
                if let Some(whole) =
                    SaveAssembly::take(&mut self.assembly, msg).map_err(protocol)?
                {
                    self.pending_state = Some(whole);
                }
            }
            ServerMessage::End { value_digest, .. } => self.server_end = Some(value_digest),
        }
        Ok(())
    }

    /// Replaces the client's state with the server's save-game (foreign trust).
    fn load_state(
        &mut self,
        WholeSave {
            frame,
            reason,
            save,
        }: WholeSave,
    ) -> Result<(), NetError> {
        let game = Game::from_save(&self.cfg, self.opts.backend, &save)?;
        if game.frame() != frame {
            return Err(NetError::Protocol {
                peer: self.conn.peer.clone(),
                what: format!(
                    "a save-game said to be of frame {frame} holds frame {}",
                    game.frame()
                ),
            });
        }
        if let Some(old) = self.client.take() {
            self.past_rollbacks.0 += old.rollbacks;
            self.past_rollbacks.1 += old.resimulated;
            self.past
                .rollback_overheads
                .extend_from_slice(&old.timings.rollback_overheads);
        }
        self.client = Some(PredictiveClient::new(game)?);
        self.epoch += 1;
        self.confirmed.retain(|&f, _| f >= frame);
        match reason {
            StateReason::Join => {
                self.joined_at = Some(frame);
                self.join_bytes = save.len();
            }
            StateReason::Resync => self.resyncs += 1,
        }
        self.next_command = self.next_command.max(frame);
        (self.observe)(&ClientEvent::Loaded {
            frame,
            bytes: save.len(),
            resync: reason == StateReason::Resync,
        });
        if frame % self.w.check_every == 0 || frame == self.w.frames {
            let game = self.client.as_mut().expect("just made").game_mut();
            let value = game.value_digest()?;
            self.send_digest(frame, value);
        }
        Ok(())
    }

    fn send_digest(&mut self, frame: u64, value: u64) {
        let msg = ClientMessage::Digest {
            frame,
            value,
            epoch: self.epoch,
        };
        self.conn.send(CHANNEL_CONTROL, msg.encode());
        if frame == self.w.frames {
            self.final_digest = Some(value);
            self.final_at.get_or_insert_with(Instant::now);
        }
    }

    /// Applies the confirmations that follow the synchronous form, in one rollback.
    fn apply_confirmed(&mut self) -> Result<(), NetError> {
        let first = self.sync_frame();
        let batch: Vec<Vec<u8>> = self
            .confirmed
            .range(first..)
            .zip(first..)
            .take_while(|((f, _), want)| *f == want)
            .map(|((_, inputs), _)| inputs.clone())
            .collect();
        let Some(last) = batch.last().cloned() else {
            return Ok(());
        };
        let (slot, seed) = (self.w.slot, self.w.seed);
        let (every, frames) = (self.w.check_every, self.w.frames);
        let repredict = |f: u64| {
            let mut v = last.clone();
            v[slot] = scripted_input(seed, f, slot);
            v
        };
        let hook = self.opts.at_sync.clone();
        let mut digests = Vec::new();
        let at_sync = |game: &mut Game| {
            if let Some(h) = &hook {
                h(game)?;
            }
            let n = game.frame();
            if n % every == 0 || n == frames {
                digests.push((n, game.value_digest()?));
            }
            Ok(())
        };
        let client = self.client.as_mut().expect("a game");
        client.confirm_frames(&batch, repredict, at_sync)?;
        self.held = last;
        for (n, value) in digests {
            self.send_digest(n, value);
        }
        let now = self.sync_frame();
        self.confirmed = self
            .confirmed
            .split_off(&now.saturating_sub(HISTORY_FRAMES));
        (self.observe)(&ClientEvent::Confirmed {
            frame: now,
            frames,
            delay: self.delay,
        });
        Ok(())
    }

    /// Predicts up to `delay` frames past the synchronous form, sending the player's
    /// commands for the frames it predicts first.
    fn predict_ahead(&mut self) -> Result<(), NetError> {
        let (slot, seed) = (self.w.slot, self.w.seed);
        let target = (self.sync_frame() + self.delay as u64).min(self.w.frames);
        let client = self.client.as_mut().expect("a game");
        while client.game().frame() < target {
            let f = client.game().frame();
            let own = scripted_input(seed, f, slot);
            if f >= self.next_command {
                if self.last_sent != Some(own) {
                    let msg = ClientMessage::Command {
                        frame: f,
                        input: own,
                    };
                    self.conn.send(CHANNEL_FRAMES, msg.encode());
                    self.last_sent = Some(own);
                }
                self.next_command = f + 1;
            }
            let mut inputs = self.held.clone();
            inputs[slot] = own;
            client.predict(inputs)?;
        }
        Ok(())
    }

    fn report(&mut self) -> Result<ClientReport, NetError> {
        let client = self.client.as_mut().expect("a game at the end");
        let mut overheads = self.past.rollback_overheads.clone();
        overheads.extend_from_slice(&client.timings.rollback_overheads);
        let (sent, received) = self.conn.traffic();
        let game = client.game_mut();
        let value_digest = match self.final_digest {
            Some(d) => d,
            None => game.value_digest()?,
        };
        let game_digest = game.game_digest()?;
        Ok(ClientReport {
            slot: self.w.slot,
            players: self.w.players,
            frames: self.w.frames,
            backend: self.opts.backend,
            joined_at: self.joined_at,
            join_save_bytes: self.join_bytes,
            value_digest,
            server_digest: self.server_end,
            game_digest,
            rollbacks: self.past_rollbacks.0 + client.rollbacks,
            resimulated: self.past_rollbacks.1 + client.resimulated,
            rollback_us_median: quantile_us(&overheads, 0.5),
            rollback_us_p99: quantile_us(&overheads, 0.99),
            rollback_seconds_total: overheads.iter().map(Duration::as_secs_f64).sum(),
            desyncs: self.desyncs,
            resyncs: self.resyncs,
            bytes_sent: sent,
            bytes_received: received,
            delay: self.delay,
            seconds: self.started.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outside tester's F4c: a joiner at 40% loss sat at frame 0 and then said only
    /// `connection timed out`; what it is told names the save, the link's figures and what to
    /// do.
    #[test]
    fn a_joiner_that_never_had_its_save_is_told_why_and_what_to_do() {
        let lossy = LinkConditions {
            latency: Duration::from_millis(30),
            jitter: Duration::ZERO,
            loss: 0.4,
        };
        let note = joining_note(&lossy);
        for part in [
            "before this client had the server's join save-game whole",
            "3 times the save's size plus 64 KiB",
            "loses 40% of the datagrams each way with 30 ms one way (--loss, --latency)",
            "join over a better link",
            "--start-with",
        ] {
            assert!(note.contains(part), "{part:?} not in {note:?}");
        }
        let plain = joining_note(&LinkConditions::NONE);
        assert!(plain.contains("may be too lossy or slow"), "{plain}");
        assert!(!plain.contains("emulated"), "{plain}");
    }
}
