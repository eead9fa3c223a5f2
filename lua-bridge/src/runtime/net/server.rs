//! The match server: orders the clients' commands into frames, runs the synchronous model,
//! confirms every frame to every client, checks their digests, and sends save-games to
//! clients that join late or disagree.

use super::error::NetError;
use super::order::{DelayControl, FrameOrder};
use super::protocol::{
    game_id, save_head, save_piece, ClientMessage, ServerMessage, Start, StateReason,
    CHANNEL_CONTROL, CHANNEL_FRAMES, CHANNEL_STATE, MAX_PLAYERS, REFUSED_FULL, SAVE_PIECE_BYTES,
};
use super::transport::{
    connection_config, ServerTransport, SEND_INTERVAL, SERVER_CHANNEL_BYTES, STATE_CHANNEL_BYTES,
};
use crate::runtime::{Backend, Game, GameConfig, GameError};
use renet::RenetServer;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages of one client the server handles per update; more are refused as a flood.
const MAX_MESSAGES_PER_UPDATE: usize = 256;
/// Updates with a flood a client may cause before it is dropped.
const MAX_FLOOD_UPDATES: u32 = 20;
/// Refused messages a client may send before it is dropped.
const MAX_REFUSALS: u32 = 32;
/// Frames closed in one update at most (when the server runs late, it catches up over
/// several updates and keeps reading the network between them).
const MAX_FRAMES_PER_UPDATE: u32 = 8;
/// Digests of the server's own state kept for comparison (check frames).
const CHECKS_KEPT: usize = 256;
/// The clock starts this long after the last of the first clients said hello.
const START_DELAY: Duration = Duration::from_millis(300);
/// How long the server keeps sending after the end, so the last messages arrive.
const LINGER: Duration = Duration::from_millis(1500);
/// Departed clients whose records the report keeps one by one; later departures are summed
/// into [`ServerReport::departed`] (each (re)connection would otherwise cost memory for the
/// whole match and a row of the report).
pub const DEPARTED_RECORDS_KEPT: usize = 64;
/// What the server may send a client while a save-game is on its way to it: this many times
/// the save's size, plus [`STATE_BUDGET_SLACK`] (confirmations and digests go with it). An
/// honest client on a round trip shorter than the save channel's resend time (400 ms) is
/// sent a save about once, plus its losses; one on a 1 s round trip about twice.
pub const STATE_BUDGET_SAVES: u64 = 3;
/// See [`STATE_BUDGET_SAVES`].
pub const STATE_BUDGET_SLACK: u64 = 64 << 10;
/// The most bytes of save-games the server leaves unacknowledged with one client: the next
/// piece goes to renet only when the client's unacknowledged pieces are fewer. Renet 2.0.1's
/// receiving end keeps what it acknowledges as at most 64 runs of packet numbers, until it
/// hears its acknowledgement arrived; at a loss rate p a run starts at about p(1-p) <= 1/4 of
/// the packets, so 64 runs cover at least ~256 packets sent in that time, and a packet past
/// them is never acknowledged and is sent again and again. A save of several MB handed to
/// renet whole went out as thousands of packets within milliseconds: a joiner at 40% loss had
/// much of it resent though it had arrived, until the server's budget was spent (F4c).
/// 128 pieces (one packet each) stay within the runs however the round trip goes, and keep
/// ~450 KiB/s going at 40% loss on a short round trip (a lost piece waits the save channel's
/// 400 ms resend), more with less loss; about this window per round trip on a long one.
pub const STATE_WINDOW_BYTES: usize = 128 << 10;
/// An address whose connection left a save-game unacknowledged (it was dropped for it, or it
/// left before it had the save whole) is sent no save-game for this long; each further such
/// departure within [`SAVE_BACKOFF_MAX`] doubles it.
pub const SAVE_BACKOFF: Duration = Duration::from_secs(10);
/// The longest wait of [`SAVE_BACKOFF`].
pub const SAVE_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A refused client's connection is closed once it has acknowledged the message saying why
/// (renet resends it every 100 ms till then), or at the latest this long after its slot is
/// freed. Closed at once, the message would not reach a client that reads both in one update
/// (it drops the message); closed after a fixed 250 ms, as it once was, a client at 40% loss
/// missed it about once in 16 (all three sendings lost). At 40% loss, twenty sendings are all
/// lost about once in 10^8.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Connections netcode takes beyond the player slots. A refused or dropped client's
/// connection stays open until it has its refusal, at most [`CLOSE_GRACE`], after its slot
/// is free (and a client that left without saying so, until it times out): with netcode's
/// slots only as many as the players', a client retrying at once with the right flags was
/// denied as if the match were full. A connection for which no slot is free is refused as
/// full ([`REFUSED_FULL`]) and closed the same way.
const SPARE_CONNECTIONS: usize = 8;
/// Addresses whose backoff the server remembers at most (the oldest are forgotten first).
const BACKOFF_ADDRESSES: usize = 4096;

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The game (its `players` and `seed` are the match's).
    pub game: GameConfig,
    /// Frames the match lasts.
    pub frames: u64,
    /// Time between frames.
    pub tick: Duration,
    /// Clients compare value digests with the server every this many frames (and at the last).
    pub check_every: u64,
    /// The clock starts once this many clients have said hello (the others join late).
    pub start_with: usize,
    /// How long after the last frame the server waits for the clients' final digests.
    pub end_wait: Duration,
    /// Resyncs one client may need before it is dropped as unable to follow.
    pub max_resyncs: u32,
    /// A connection that has not said hello this long after netcode's handshake is dropped
    /// (it would hold a player slot without playing).
    pub hello_timeout: Duration,
    /// While the clock runs, a client that sends no command or digest for this long is
    /// dropped (transport acknowledgements alone do not keep a slot).
    pub quiet_timeout: Duration,
    /// A client that acknowledges nothing more of a save-game sent to it (a join or a resync)
    /// for this long is dropped, so that it cannot make the server send the save again and
    /// again until the transport's own timeout. Progress is counted in pieces of the save
    /// (1 KiB, one packet each).
    pub state_ack_timeout: Duration,
    /// While the clock runs, a client must send the digest of each check frame within this
    /// long of the server closing that frame (or of the client having its last save-game
    /// whole, if later); one that does not is dropped. A digest is what shows the server a
    /// client follows the match: commands alone do not.
    pub digest_timeout: Duration,
    /// A client whose transport leaves the server's confirmations of this long unacknowledged
    /// (the frames channel holds more unacknowledged bytes than the confirmations of this
    /// many seconds of frames) is dropped: every unacknowledged confirmation is sent again
    /// every 100 ms, so the cost of a client that never acknowledges grows with the square
    /// of the time it is kept.
    pub ack_timeout: Duration,
}

/// The default of [`ServerOptions::hello_timeout`].
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The default of [`ServerOptions::quiet_timeout`].
pub const QUIET_TIMEOUT: Duration = Duration::from_secs(15);
/// The default of [`ServerOptions::state_ack_timeout`].
pub const STATE_ACK_TIMEOUT: Duration = Duration::from_secs(3);
/// The default of [`ServerOptions::digest_timeout`].
pub const DIGEST_TIMEOUT: Duration = Duration::from_secs(20);
/// The default of [`ServerOptions::ack_timeout`].
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

impl ServerOptions {
    /// A match of `frames` frames of `game` at 30 frames a second, digests every 30 frames,
    /// starting when every player is there.
    pub fn new(game: GameConfig, frames: u64) -> ServerOptions {
        let players = game.players;
        ServerOptions {
            game,
            frames,
            tick: Duration::from_micros(33_333),
            check_every: 30,
            start_with: players,
            end_wait: Duration::from_secs(20),
            max_resyncs: 5,
            hello_timeout: HELLO_TIMEOUT,
            quiet_timeout: QUIET_TIMEOUT,
            state_ack_timeout: STATE_ACK_TIMEOUT,
            digest_timeout: DIGEST_TIMEOUT,
            ack_timeout: ACK_TIMEOUT,
        }
    }

    fn validate(&self) -> Result<(), NetError> {
        let players = self.game.players;
        if players == 0 || players > MAX_PLAYERS {
            return Err(NetError::Config(format!(
                "--players must be 1..={MAX_PLAYERS}, got {players}"
            )));
        }
        if self.frames == 0 || self.frames > 100_000_000 {
            return Err(NetError::Config(format!(
                "--frames must be 1..=100000000, got {}",
                self.frames
            )));
        }
        if self.tick < Duration::from_millis(1) || self.tick > Duration::from_secs(1) {
            return Err(NetError::Config(format!(
                "--tick-ms must be 1..=1000, got {} ms",
                self.tick.as_millis()
            )));
        }
        if self.check_every == 0 || self.check_every > u32::MAX as u64 {
            return Err(NetError::Config(
                "--check-every must be at least 1 frame".into(),
            ));
        }
        if self.start_with == 0 || self.start_with > players {
            return Err(NetError::Config(format!(
                "--start-with must be 1..={players} (the players), got {}",
                self.start_with
            )));
        }
        Ok(())
    }
}

/// Something that happened in a match, for a host's log. Each names who (slot and address).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// A frame was closed and confirmed.
    Frame {
        /// Frames closed.
        frame: u64,
        /// Frames of the match.
        frames: u64,
        /// Clients playing.
        clients: usize,
    },
    /// The clock started.
    Started {
        /// Clients playing.
        clients: usize,
    },
    /// A client took a slot.
    Joined {
        /// Its slot (0-based).
        slot: usize,
        /// Its address.
        addr: SocketAddr,
        /// The frame it starts at.
        frame: u64,
        /// Bytes of the save-game it was sent (0: it starts from `G.init`).
        save_bytes: usize,
    },
    /// A client's digest disagreed: it is sent the server's state.
    Resync {
        /// Its slot.
        slot: usize,
        /// Its address.
        addr: SocketAddr,
        /// The frame of the digests.
        frame: u64,
        /// The server's value digest.
        server: u64,
        /// The client's.
        client: u64,
    },
    /// A client's message was refused.
    Refused {
        /// Its slot.
        slot: usize,
        /// Its address.
        addr: SocketAddr,
        /// What was wrong.
        what: String,
    },
    /// A client left or was dropped; its slot plays no input from `frame` on.
    Left {
        /// Its slot.
        slot: usize,
        /// Its address.
        addr: SocketAddr,
        /// The next frame the server closes.
        frame: u64,
        /// Why.
        reason: String,
    },
}

/// Slots are shown from 1, as `luasnap serve`'s table, `luasnap client` and the game's own player
/// numbers count them; the `slot` fields are 0-based.
impl fmt::Display for ServerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerEvent::Frame { frame, frames, .. } => write!(f, "frame {frame}/{frames}"),
            ServerEvent::Started { clients } => {
                write!(
                    f,
                    "the match started with {clients} client{}",
                    if *clients == 1 { "" } else { "s" }
                )
            }
            ServerEvent::Joined {
                slot,
                addr,
                frame,
                save_bytes,
            } => match save_bytes {
                0 => write!(f, "slot {} ({addr}) joined at frame {frame} from G.init", slot + 1),
                n => write!(
                    f,
                    "slot {} ({addr}) joined at frame {frame} from a {n}-byte save-game",
                    slot + 1
                ),
            },
            ServerEvent::Resync {
                slot,
                addr,
                frame,
                server,
                client,
            } => write!(
                f,
                "slot {} ({addr}) disagreed at frame {frame} (value digest {client:016x}, the server's {server:016x}): resyncing it from a save-game",
                slot + 1
            ),
            ServerEvent::Refused { slot, addr, what } => {
                write!(f, "slot {} ({addr}): refused {what}", slot + 1)
            }
            ServerEvent::Left {
                slot,
                addr,
                frame,
                reason,
            } => write!(
                f,
                "slot {} ({addr}) left at frame {frame}: {reason}; the slot plays no input",
                slot + 1
            ),
        }
    }
}

/// One client's part in a match, as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRecord {
    /// Its slot (0-based).
    pub slot: usize,
    /// Its address.
    pub addr: SocketAddr,
    /// Netcode's client id.
    pub client_id: u64,
    /// The frame it started at (0: from `G.init`).
    pub joined_at: u64,
    /// Whether it started from a save-game.
    pub joined_from_save: bool,
    /// The frame it left at, and why, if it left before the end.
    pub left: Option<(u64, String)>,
    /// Datagram bytes the server sent it.
    pub bytes_sent: u64,
    /// Datagram bytes received from it.
    pub bytes_received: u64,
    /// Digests that disagreed with the server's.
    pub desyncs: u32,
    /// Save-games sent to bring it back in step.
    pub resyncs: u32,
    /// Digests that agreed.
    pub checks_passed: u64,
    /// Its commands that arrived after their frame closed.
    pub late_commands: u64,
    /// Its frame delay at the end.
    pub delay: u32,
    /// Messages refused.
    pub refused: u32,
    /// Its value digest at the last frame, if it sent one.
    pub final_digest: Option<u64>,
}

impl ClientRecord {
    /// Whether it ended on the server's value digest.
    pub fn matches(&self, server_digest: u64) -> bool {
        self.final_digest == Some(server_digest)
    }
}

/// What a match gave.
#[derive(Debug, Clone)]
pub struct ServerReport {
    /// Frames closed.
    pub frames: u64,
    /// The server's value digest after the last frame.
    pub value_digest: u64,
    /// `G.digest()` after the last frame, if the game has one.
    pub game_digest: Option<i64>,
    /// Every client that took a slot, in order of arrival, but for departures past the first
    /// [`DEPARTED_RECORDS_KEPT`]: those are summed in `departed`.
    pub clients: Vec<ClientRecord>,
    /// The clients that left after the first [`DEPARTED_RECORDS_KEPT`] departures, summed.
    pub departed: DepartedTotals,
    /// Time the server spent working (not waiting), per frame, in microseconds.
    pub busy_us_per_frame: f64,
    /// Mean time of one `G.step` on the server, in microseconds.
    pub step_us: f64,
    /// Mean time of one value digest on the server, in microseconds.
    pub digest_us: f64,
    /// Save-games written for joins and resyncs.
    pub saves: u64,
    /// Wall time of the match from the first frame, in seconds.
    pub seconds: f64,
}

/// Clients that left, summed (the report keeps the first [`DEPARTED_RECORDS_KEPT`] one by
/// one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DepartedTotals {
    /// Connections.
    pub clients: u64,
    /// Datagram bytes the server sent them.
    pub bytes_sent: u64,
    /// Datagram bytes received from them.
    pub bytes_received: u64,
    /// Messages refused.
    pub refused: u64,
}

/// Why a client is dropped for the confirmations its transport left unacknowledged.
struct AckFault {
    /// Bytes of the frames channel unacknowledged.
    unacked: usize,
    /// The most it may leave ([`ServerOptions::ack_timeout`]'s frames).
    limit: usize,
    timeout: Duration,
    /// How far the client fell behind, if its commands show it did (an honest client too slow
    /// for the match: its acknowledgements come late because it is busy re-simulating).
    behind: Option<Behind>,
}

/// A client whose delay lateness raised far past its start: it fell behind the match.
struct Behind {
    delay: u32,
    start: u32,
    /// The newest check frame it sent a digest of (or the frame it started at).
    last_digest: u64,
    /// The next frame the server closes.
    server_frame: u64,
    tick: Duration,
}

impl fmt::Display for AckFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let transport = format!(
            "its transport left {} bytes of confirmations unacknowledged, more than {} s of frames ({} bytes)",
            self.unacked,
            self.timeout.as_secs_f64(),
            self.limit
        );
        let Some(b) = &self.behind else {
            return write!(f, "dropped: {transport}");
        };
        write!(
            f,
            "dropped: it fell behind the match: its commands kept arriving after their frames closed, which raised its frame delay from {} to {} frames ({:.1} s at a frame every {} ms), its newest digest is of frame {} ({} frames before the server's {}), and {transport}. A client falls behind when its machine cannot re-simulate its delay's frames each frame (about delay + 1 G.steps, a save and a load per tick): give it a core of its own, make G.step cheaper, or serve a slower --tick-ms (docs/client-server.md, \"How large a G.step a client can carry\")",
            b.start,
            b.delay,
            b.delay as f64 * b.tick.as_secs_f64(),
            b.tick.as_millis(),
            b.last_digest,
            b.server_frame.saturating_sub(b.last_digest),
            b.server_frame,
        )
    }
}

/// A client in a slot.
struct Seat {
    client_id: u64,
    addr: SocketAddr,
    /// Its record, while it is seated (it moves to the match's departed records when it
    /// leaves).
    record: ClientRecord,
    /// Its place in the order of arrival.
    arrival: u64,
    /// When netcode's handshake was done.
    connected_at: Instant,
    /// When it last sent a message the protocol expects (its hello, a command or a digest
    /// that was accepted).
    last_useful: Instant,
    /// A save-game it has not acknowledged whole.
    state_wait: Option<StateWait>,
    /// The check frames after this frame are due from it, each no earlier than the time
    /// given plus [`ServerOptions::digest_timeout`] (the time its state last started:
    /// its hello, or its last save-game acknowledged whole).
    digest_from: (u64, Instant),
    hello: bool,
    delay: DelayControl,
    /// Save-games sent to it (its digests name the count they follow).
    epoch: u32,
    flood_updates: u32,
    /// The frame the server was closing when this client's last message arrived.
    last_heard: u64,
}

/// A save-game on its way to a client. Its pieces go to renet as the earlier ones are
/// acknowledged, at most [`STATE_WINDOW_BYTES`] unacknowledged.
struct StateWait {
    save: Arc<Vec<u8>>,
    /// The bytes of the save handed to renet so far (its head went first).
    next: usize,
    /// Bytes of state messages handed to renet for this client: those unacknowledged when
    /// this save was queued, and this save's since. Less the channel's unacknowledged bytes,
    /// what the client has acknowledged (it never falls).
    handed: usize,
    /// The most of `handed` the client had acknowledged at the last look.
    acked: usize,
    /// When that grew last.
    since: Instant,
    /// The bytes sent to the client when the save was queued.
    sent_before: u64,
    /// The bytes the server may send it before it has the save whole.
    budget: u64,
}

/// Addresses whose connections left save-games unacknowledged: no save-game goes to them
/// until their time is up.
#[derive(Default)]
struct SaveBackoff {
    /// Per address: no save before this time; departures counted (each doubles the wait).
    until: HashMap<IpAddr, (Instant, u32)>,
}

impl StateWait {
    /// Whether every piece has been handed to renet.
    fn all_handed(&self) -> bool {
        self.next == self.save.len()
    }
}

impl SaveBackoff {
    /// How long `ip` must still wait for a save-game, if at all.
    fn wait(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let (until, _) = self.until.get(&ip)?;
        (*until > now).then(|| *until - now)
    }

    /// `ip`'s connection left a save-game unacknowledged: the next waits longer. Returns the
    /// wait.
    fn punish(&mut self, ip: IpAddr, now: Instant) -> Duration {
        // The count starts again once the last wait and SAVE_BACKOFF_MAX after it are over.
        let strikes = match self.until.get(&ip) {
            Some((until, n)) if now < *until + SAVE_BACKOFF_MAX => n + 1,
            _ => 1,
        };
        let wait = SAVE_BACKOFF
            .saturating_mul(1 << (strikes - 1).min(16))
            .min(SAVE_BACKOFF_MAX);
        if self.until.len() >= BACKOFF_ADDRESSES && !self.until.contains_key(&ip) {
            self.until
                .retain(|_, (until, _)| now < *until + SAVE_BACKOFF_MAX);
            if self.until.len() >= BACKOFF_ADDRESSES {
                let oldest = self
                    .until
                    .iter()
                    .min_by_key(|(_, (u, _))| *u)
                    .map(|(a, _)| *a);
                oldest.map(|a| self.until.remove(&a));
            }
        }
        self.until.insert(ip, (now + wait, strikes));
        wait
    }
}

/// A match server bound to its port; [`MatchServer::run`] plays the match.
pub struct MatchServer {
    socket: UdpSocket,
    opts: ServerOptions,
    /// The game's identity, read once when the server is bound: a game folder that changes
    /// under a running server (an edit, a checkout) does not change the game its clients
    /// must run.
    game_id: u64,
}

impl MatchServer {
    /// Binds the server's UDP socket (`0.0.0.0:7000`, or port 0 for any free port), having
    /// read the game's identity (its script and modules; the game's folder is read now).
    pub fn bind(addr: SocketAddr, mut opts: ServerOptions) -> Result<MatchServer, NetError> {
        opts.validate()?;
        // Reads the game's folder into `opts.game`: the match runs the files identified here.
        let game_id = game_id(&mut opts.game)?;
        let socket = UdpSocket::bind(addr).map_err(|error| NetError::Io {
            what: format!("cannot bind UDP {addr} (--port)"),
            error,
        })?;
        Ok(MatchServer {
            socket,
            opts,
            game_id,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, NetError> {
        self.socket.local_addr().map_err(|error| NetError::Io {
            what: "cannot read the server's address".into(),
            error,
        })
    }

    /// Plays the match to its last frame and returns the report; `observe` hears of every
    /// frame, join, resync, refusal and departure.
    pub fn run(self, observe: impl FnMut(&ServerEvent)) -> Result<ServerReport, NetError> {
        let players = self.opts.game.players;
        let io = |what: &str| {
            let what = what.to_string();
            move |error| NetError::Io { what, error }
        };
        let transport = ServerTransport::new(self.socket, players + SPARE_CONNECTIONS)
            .map_err(io("cannot set up the server's socket"))?;
        let mut cfg = self.opts.game.clone();
        cfg.base_address = None;
        let game = Game::new(&cfg, Backend::ArenaFull)?;
        let mut m = Match {
            game_id: self.game_id,
            game,
            order: FrameOrder::new(players),
            seats: (0..players).map(|_| None).collect(),
            by_client: HashMap::new(),
            departed: Vec::new(),
            departed_totals: DepartedTotals::default(),
            arrivals: 0,
            checks: BTreeMap::new(),
            closed_at: BTreeMap::new(),
            backoff: SaveBackoff::default(),
            closing: Vec::new(),
            renet: RenetServer::new(connection_config()),
            transport,
            opts: self.opts,
            started: None,
            next_tick: None,
            cached_save: None,
            end_sent: false,
            stats: Stats::default(),
            observe: Box::new(observe),
        };
        m.play()
    }
}

#[derive(Default)]
struct Stats {
    busy: Duration,
    steps: Duration,
    digests: Duration,
    digest_count: u64,
    saves: u64,
}

/// A match in progress.
struct Match<'o> {
    game_id: u64,
    game: Game,
    order: FrameOrder,
    seats: Vec<Option<Seat>>,
    by_client: HashMap<u64, usize>,
    /// Records of clients that left (the first [`DEPARTED_RECORDS_KEPT`]), with their arrival.
    departed: Vec<(u64, ClientRecord)>,
    /// Clients that left past those.
    departed_totals: DepartedTotals,
    arrivals: u64,
    /// The server's value digest after each check frame.
    checks: BTreeMap<u64, u64>,
    /// When each check frame of `checks` was closed.
    closed_at: BTreeMap<u64, Instant>,
    backoff: SaveBackoff,
    /// Dropped clients' connections, closed at the time given.
    closing: Vec<(u64, Instant)>,
    renet: RenetServer,
    transport: ServerTransport,
    opts: ServerOptions,
    started: Option<Instant>,
    next_tick: Option<Instant>,
    cached_save: Option<(u64, Arc<Vec<u8>>)>,
    end_sent: bool,
    stats: Stats,
    observe: Box<dyn FnMut(&ServerEvent) + 'o>,
}

impl Match<'_> {
    fn play(&mut self) -> Result<ServerReport, NetError> {
        let mut last = Instant::now();
        let mut last_send = last;
        let mut ended: Option<Instant> = None;
        let mut end_sent: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let dt = now - last;
            last = now;
            self.network_in(dt)?;
            self.watch_seats(now);
            self.close_dropped(now);
            let before = self.order.next();
            self.close_due_frames(now)?;
            if self.order.next() == self.opts.frames {
                let ended_at = *ended.get_or_insert(now);
                if end_sent.is_none() && (self.all_final() || now - ended_at >= self.opts.end_wait)
                {
                    self.send_end()?;
                    self.end_sent = true;
                    end_sent = Some(now);
                }
            }
            // Renet's packets go out with each frame, or every SEND_INTERVAL (what a client
            // sent is acknowledged, joins and resyncs flow).
            if self.order.next() > before || now - last_send >= SEND_INTERVAL {
                last_send = now;
                self.transport
                    .send_packets(&mut self.renet)
                    .map_err(NetError::cannot_send)?;
            }
            self.stats.busy += now.elapsed();
            if end_sent.is_some_and(|t| now - t >= LINGER) {
                break;
            }
            let wake = self
                .next_tick
                .filter(|_| self.order.next() < self.opts.frames)
                .map_or(Duration::from_millis(1), |t| {
                    t.saturating_duration_since(Instant::now())
                });
            std::thread::sleep(wake.min(Duration::from_millis(1)));
        }
        let _ = self.transport.disconnect_all(&mut self.renet);
        self.report()
    }

    fn all_final(&self) -> bool {
        self.seats.iter().flatten().all(|s| {
            !s.hello || s.record.final_digest == self.checks.get(&self.opts.frames).copied()
        })
    }

    /// Drops the connections that hold a slot without playing (no hello in time, no command
    /// nor digest for too long while the clock runs, a save-game left unacknowledged, which
    /// the transport would send again and again) or that do not follow the match (no
    /// digest of a check frame in time, confirmations left unacknowledged), telling each
    /// why.
    fn watch_seats(&mut self, now: Instant) {
        for slot in 0..self.seats.len() {
            if let Some(reason) = self.seat_fault(slot, now) {
                self.expel(slot, reason);
            }
        }
    }

    /// Why a seat must go, if it must.
    fn seat_fault(&mut self, slot: usize, now: Instant) -> Option<String> {
        let running = !self.end_sent && self.order.next() < self.opts.frames;
        let seat = self.seats[slot].as_ref()?;
        let secs = |d: Duration| d.as_secs_f64();
        if !seat.hello {
            let timeout = self.opts.hello_timeout;
            return (now - seat.connected_at >= timeout).then(|| {
                format!("dropped: no hello within {} s of connecting (a connection that does not say which game it runs holds no slot)", secs(timeout))
            });
        }
        if let Some(reason) = self.ack_fault(slot) {
            return Some(reason);
        }
        if self.seats[slot].as_ref()?.state_wait.is_some() {
            return self.state_fault(slot, now);
        }
        let seat = self.seats[slot].as_ref()?;
        let started = self.started.filter(|_| running)?;
        let timeout = self.opts.quiet_timeout;
        if now - seat.last_useful.max(started) >= timeout {
            return Some(format!(
                "dropped: no command nor digest for {} s while the match ran",
                secs(timeout)
            ));
        }
        let (from, since) = seat.digest_from;
        let (&due, &closed) = self.closed_at.range(from + 1..).next()?;
        let timeout = self.opts.digest_timeout;
        (now - closed.max(since) >= timeout).then(|| {
            format!(
                "dropped: no digest of frame {due} within {} s of the server closing it (a client sends the value digest of every check frame, every {} frames)",
                secs(timeout),
                self.opts.check_every
            )
        })
    }

    /// A client whose transport leaves more of the confirmations unacknowledged than those
    /// of [`ServerOptions::ack_timeout`] must go, honest or not (each unacknowledged
    /// confirmation is sent again every 100 ms); the reason says whether it fell behind.
    fn ack_fault(&self, slot: usize) -> Option<String> {
        let seat = self.seats[slot].as_ref()?;
        let unacked = SERVER_CHANNEL_BYTES.saturating_sub(
            self.renet
                .channel_available_memory(seat.client_id, CHANNEL_FRAMES),
        );
        let limit = self.unacked_frames_limit();
        let fault = AckFault {
            unacked,
            limit,
            timeout: self.opts.ack_timeout,
            behind: seat.delay.grew().then(|| Behind {
                delay: seat.delay.delay(),
                start: seat.delay.start(),
                last_digest: seat.digest_from.0,
                server_frame: self.order.next(),
                tick: self.opts.tick,
            }),
        };
        (unacked > limit).then(|| fault.to_string())
    }

    /// The bytes of the confirmations of [`ServerOptions::ack_timeout`] (at least 64 of them).
    fn unacked_frames_limit(&self) -> usize {
        let confirm = ServerMessage::Confirm {
            frame: 0,
            inputs: vec![0; self.opts.game.players],
        }
        .encode()
        .len();
        let frames = self.opts.ack_timeout.as_secs_f64() / self.opts.tick.as_secs_f64();
        confirm * (frames.ceil() as usize).max(64)
    }

    /// Hands renet the next pieces of the save-game on its way to a slot while fewer than
    /// [`STATE_WINDOW_BYTES`] are unacknowledged; returns the bytes unacknowledged.
    fn hand_pieces(&mut self, slot: usize) -> Option<usize> {
        let seat = self.seats[slot].as_mut()?;
        let wait = seat.state_wait.as_mut()?;
        let mut unacked = STATE_CHANNEL_BYTES.saturating_sub(
            self.renet
                .channel_available_memory(seat.client_id, CHANNEL_STATE),
        );
        while unacked < STATE_WINDOW_BYTES && !wait.all_handed() {
            let piece = save_piece(&wait.save, wait.next);
            wait.next = wait.save.len().min(wait.next + SAVE_PIECE_BYTES);
            wait.handed += piece.len();
            unacked += piece.len();
            self.renet
                .send_message(seat.client_id, CHANNEL_STATE, piece);
        }
        Some(unacked)
    }

    /// Follows a save-game on its way ([`Match::hand_pieces`]): no further piece
    /// acknowledged for [`ServerOptions::state_ack_timeout`], or more than its budget sent,
    /// and the client must go; acknowledged whole, and its digests are due from now on.
    fn state_fault(&mut self, slot: usize, now: Instant) -> Option<String> {
        let unacked = self.hand_pieces(slot)?;
        let seat = self.seats[slot].as_mut()?;
        let wait = seat.state_wait.as_mut()?;
        if unacked == 0 && wait.all_handed() {
            seat.state_wait = None;
            seat.last_useful = seat.last_useful.max(now);
            seat.digest_from.1 = now;
            return None;
        }
        let sent = self.transport.traffic(seat.client_id).sent - wait.sent_before;
        if sent > wait.budget {
            return Some(format!(
                "dropped: it was sent {sent} bytes since its save-game and had not acknowledged it whole (the limit is {} times the save plus {} KiB)",
                STATE_BUDGET_SAVES,
                STATE_BUDGET_SLACK >> 10
            ));
        }
        let acked = wait.handed.saturating_sub(unacked);
        if acked > wait.acked {
            wait.acked = acked;
            wait.since = now;
            return None;
        }
        let timeout = self.opts.state_ack_timeout;
        (now - wait.since >= timeout).then(|| {
            format!(
                "dropped: it acknowledged nothing more of the save-game sent to it for {} s",
                timeout.as_secs_f64()
            )
        })
    }

    /// Tells a client why it must go, then drops it.
    fn expel(&mut self, slot: usize, reason: String) {
        let Some(client_id) = self.seats[slot].as_ref().map(|s| s.client_id) else {
            return;
        };
        self.tell_refused(client_id, &reason);
        self.drop_seat_closing(slot, reason, CLOSE_GRACE);
    }

    /// Sends a client the reason it is refused, now: before its seat goes, so the message
    /// leaves with the next packets.
    fn tell_refused(&mut self, client_id: u64, reason: &str) {
        let msg = ServerMessage::Refused {
            reason: reason.to_string(),
        }
        .encode();
        self.renet.send_message(client_id, CHANNEL_CONTROL, msg);
        let _ = self.transport.send_packets(&mut self.renet);
    }

    /// Closes the connections of dropped clients that have acknowledged all the server's
    /// control messages (their refusal among them) or whose grace is over.
    fn close_dropped(&mut self, now: Instant) {
        let renet = &self.renet;
        let told = |client_id: u64| {
            renet.channel_available_memory(client_id, CHANNEL_CONTROL) >= SERVER_CHANNEL_BYTES
        };
        let (due, wait): (Vec<_>, Vec<_>) = self
            .closing
            .iter()
            .partition(|&&(client_id, at)| at <= now || told(client_id));
        self.closing = wait;
        for (client_id, _) in due {
            if self.renet.is_connected(client_id) {
                self.renet.disconnect(client_id);
            }
            self.transport.forget(client_id);
        }
    }

    fn send_end(&mut self) -> Result<(), NetError> {
        let value_digest = self.checks.get(&self.opts.frames).copied().unwrap_or(0);
        let msg = ServerMessage::End {
            frame: self.opts.frames,
            value_digest,
        }
        .encode();
        for seat in self.seats.iter().flatten().filter(|s| s.hello) {
            self.renet
                .send_message(seat.client_id, CHANNEL_CONTROL, msg.clone());
        }
        Ok(())
    }

    fn report(&mut self) -> Result<ServerReport, NetError> {
        let mut clients = std::mem::take(&mut self.departed);
        for slot in 0..self.seats.len() {
            if let Some(mut seat) = self.seats[slot].take() {
                self.finish_record(&mut seat);
                clients.push((seat.arrival, seat.record));
            }
        }
        clients.sort_by_key(|(arrival, _)| *arrival);
        let frames = self.order.next();
        let per = |d: Duration, n: u64| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        Ok(ServerReport {
            frames,
            value_digest: self.game.value_digest()?,
            game_digest: self.game.game_digest()?,
            clients: clients.into_iter().map(|(_, r)| r).collect(),
            departed: self.departed_totals,
            busy_us_per_frame: per(self.stats.busy, frames),
            step_us: per(self.stats.steps, frames),
            digest_us: per(self.stats.digests, self.stats.digest_count),
            saves: self.stats.saves,
            seconds: self.started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
        })
    }

    /// Reads the network: connections, departures, and each client's messages.
    fn network_in(&mut self, dt: Duration) -> Result<(), NetError> {
        self.renet.update(dt);
        self.transport
            .update(dt, &mut self.renet)
            .map_err(|error| NetError::Io {
                what: "cannot receive".into(),
                error,
            })?;
        while let Some(event) = self.renet.get_event() {
            match event {
                renet::ServerEvent::ClientConnected { client_id } => self.seat(client_id),
                renet::ServerEvent::ClientDisconnected { client_id, reason } => {
                    let state_whole = self.transport.left_with_state_whole(client_id);
                    if let Some(&slot) = self.by_client.get(&client_id) {
                        if let Some(seat) = self.seats[slot].as_mut() {
                            if state_whole
                                && seat.state_wait.as_ref().is_none_or(StateWait::all_handed)
                            {
                                // It acknowledged its save-game whole as it left (a client
                                // that read the save and refused it): not one it left owing.
                                seat.state_wait = None;
                            }
                        }
                        if self.end_sent {
                            self.leave_after_end(slot);
                        } else {
                            let heard = self.seats[slot].as_ref().map_or(0, |s| s.last_heard);
                            self.drop_seat(
                                slot,
                                format!("disconnected ({reason}); last heard at frame {heard}"),
                            );
                        }
                    }
                }
            }
        }
        for slot in 0..self.seats.len() {
            self.read_messages(slot)?;
        }
        Ok(())
    }

    /// Gives a new connection the first free slot.
    fn seat(&mut self, client_id: u64) {
        let Some(slot) = self.seats.iter().position(Option::is_none) else {
            self.tell_refused(client_id, REFUSED_FULL);
            self.closing.push((client_id, Instant::now() + CLOSE_GRACE));
            return;
        };
        let addr = self
            .transport
            .client_addr(client_id)
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let record = ClientRecord {
            slot,
            addr,
            client_id,
            joined_at: self.order.next(),
            joined_from_save: false,
            left: None,
            bytes_sent: 0,
            bytes_received: 0,
            desyncs: 0,
            resyncs: 0,
            checks_passed: 0,
            late_commands: 0,
            delay: 0,
            refused: 0,
            final_digest: None,
        };
        let now = Instant::now();
        self.arrivals += 1;
        self.seats[slot] = Some(Seat {
            client_id,
            addr,
            record,
            arrival: self.arrivals,
            connected_at: now,
            last_useful: now,
            state_wait: None,
            digest_from: (self.order.next(), now),
            hello: false,
            delay: DelayControl::new(0.0, self.order.next()),
            epoch: 0,
            flood_updates: 0,
            last_heard: self.order.next(),
        });
        self.by_client.insert(client_id, slot);
    }

    /// A client leaves once the match is over: its record is final.
    fn leave_after_end(&mut self, slot: usize) {
        if let Some(seat) = self.seats[slot].take() {
            self.by_client.remove(&seat.client_id);
            self.depart(seat, true);
        }
    }

    /// Keeps a departed client's record, or adds it to the totals once
    /// [`DEPARTED_RECORDS_KEPT`] are kept (a client that played to the end is always kept:
    /// there are at most as many as players); the transport forgets the client.
    fn depart(&mut self, mut seat: Seat, at_end: bool) {
        self.finish_record(&mut seat);
        self.transport.forget(seat.client_id);
        if at_end || self.departed.len() < DEPARTED_RECORDS_KEPT {
            self.departed.push((seat.arrival, seat.record));
        } else {
            let t = &mut self.departed_totals;
            t.clients += 1;
            t.bytes_sent += seat.record.bytes_sent;
            t.bytes_received += seat.record.bytes_received;
            t.refused += seat.record.refused as u64;
        }
    }

    /// Copies a seat's counters into its record.
    fn finish_record(&mut self, seat: &mut Seat) {
        let t = self.transport.traffic(seat.client_id);
        let r = &mut seat.record;
        r.bytes_sent = t.sent;
        r.bytes_received = t.received;
        r.delay = seat.delay.delay();
        r.late_commands = seat.delay.late;
    }

    /// Frees a slot: the client is disconnected and its slot plays no input.
    fn drop_seat(&mut self, slot: usize, reason: String) {
        self.drop_seat_closing(slot, reason, Duration::ZERO);
    }

    /// [`Match::drop_seat`], the connection closed `grace` later (it holds one of netcode's
    /// connections till then).
    fn drop_seat_closing(&mut self, slot: usize, reason: String, grace: Duration) {
        let Some(mut seat) = self.seats[slot].take() else {
            return;
        };
        self.by_client.remove(&seat.client_id);
        self.order.clear(slot);
        let frame = self.order.next();
        let mut reason = reason;
        if seat.state_wait.is_some() {
            // It left with a save-game unacknowledged: its address waits for the next.
            let wait = self.backoff.punish(seat.addr.ip(), Instant::now());
            reason += &format!(
                " (with its save-game unacknowledged: its address is sent none for {} s)",
                wait.as_secs()
            );
        }
        seat.record.left = Some((frame, reason.clone()));
        if grace.is_zero() && self.renet.is_connected(seat.client_id) {
            self.renet.disconnect(seat.client_id);
        } else if self.renet.is_connected(seat.client_id) {
            self.closing.push((seat.client_id, Instant::now() + grace));
        }
        let addr = seat.addr;
        self.depart(seat, false);
        (self.observe)(&ServerEvent::Left {
            slot,
            addr,
            frame,
            reason,
        });
    }

    /// Handles a slot's messages, at most [`MAX_MESSAGES_PER_UPDATE`] of them.
    fn read_messages(&mut self, slot: usize) -> Result<(), NetError> {
        let Some(client_id) = self.seats[slot].as_ref().map(|s| s.client_id) else {
            return Ok(());
        };
        let mut handled = 0;
        let mut flooded = 0usize;
        for channel in [CHANNEL_CONTROL, CHANNEL_FRAMES] {
            while let Some(bytes) = self.renet.receive_message(client_id, channel) {
                if handled >= MAX_MESSAGES_PER_UPDATE {
                    flooded += 1;
                    continue;
                }
                handled += 1;
                let now = self.order.next();
                if let Some(seat) = self.seats[slot].as_mut() {
                    seat.last_heard = now;
                }
                match ClientMessage::decode(&bytes) {
                    Ok(msg) => self.handle(slot, msg)?,
                    Err(e) => self.refuse(slot, e.to_string()),
                }
                if self.seats[slot].is_none() {
                    return Ok(());
                }
            }
        }
        if flooded > 0 {
            let seat = self.seats[slot].as_mut().expect("seated");
            seat.flood_updates += 1;
            let times = seat.flood_updates;
            self.refuse(
                slot,
                format!("{flooded} messages over the limit of {MAX_MESSAGES_PER_UPDATE} in one update (a flood; {times} so far)"),
            );
            if times > MAX_FLOOD_UPDATES && self.seats[slot].is_some() {
                self.drop_seat(
                    slot,
                    format!("dropped for flooding ({times} updates over the message limit)"),
                );
            }
        }
        Ok(())
    }

    /// Records a refused message; a client that keeps sending them is dropped.
    fn refuse(&mut self, slot: usize, what: String) {
        let Some(seat) = self.seats[slot].as_mut() else {
            return;
        };
        let addr = seat.addr;
        seat.record.refused += 1;
        let count = seat.record.refused;
        (self.observe)(&ServerEvent::Refused { slot, addr, what });
        if count > MAX_REFUSALS {
            self.drop_seat(slot, format!("dropped after {count} refused messages"));
        }
    }

    fn handle(&mut self, slot: usize, msg: ClientMessage) -> Result<(), NetError> {
        let hello = self.seats[slot].as_ref().is_some_and(|s| s.hello);
        match msg {
            ClientMessage::Hello { game_id } if !hello => self.hello(slot, game_id),
            ClientMessage::Hello { .. } => {
                self.refuse(slot, "a second hello".into());
                Ok(())
            }
            _ if !hello => {
                self.refuse(slot, "a message before its hello".into());
                Ok(())
            }
            ClientMessage::Command { frame, input } => {
                self.command(slot, frame, input);
                Ok(())
            }
            ClientMessage::Digest {
                frame,
                value,
                epoch,
            } => self.digest(slot, frame, value, epoch),
        }
    }

    fn command(&mut self, slot: usize, frame: u64, input: u8) {
        match self.order.place(slot, frame, input) {
            Ok(placement) => {
                let next = self.order.next();
                let seat = self.seats[slot].as_mut().expect("seated");
                seat.last_useful = Instant::now();
                if let Some(delay) = seat.delay.observe(placement, next) {
                    let msg = ServerMessage::Delay { frames: delay }.encode();
                    self.renet
                        .send_message(seat.client_id, CHANNEL_CONTROL, msg);
                }
            }
            Err(e) => self.refuse(slot, e.to_string()),
        }
    }

    fn hello(&mut self, slot: usize, game_id: u64) -> Result<(), NetError> {
        let seat = self.seats[slot].as_mut().expect("seated");
        if game_id != self.game_id {
            let points = match self.opts.game.collect_every {
                Some(n) => format!("collection points every {n} frames (`--collect-every {n}`, GameConfig::collect_every)"),
                None => "the game's own collection points (no `--collect-every`, GameConfig::collect_every None)".into(),
            };
            let reason = format!(
                "it runs another game (game id {game_id:016x}, the server's is {:016x}): run the server's GAME (its main script and modules, the same files under the same names) with {points}",
                self.game_id
            );
            let client_id = seat.client_id;
            self.tell_refused(client_id, &reason);
            self.drop_seat_closing(slot, format!("refused: {reason}"), CLOSE_GRACE);
            return Ok(());
        }
        let from_save = self.started.is_some();
        if let Some(wait) = from_save
            .then(|| self.backoff.wait(seat.addr.ip(), Instant::now()))
            .flatten()
        {
            let reason = format!(
                "turned away: a connection from this address left a save-game unacknowledged, and no save-game (which a join needs) goes to it for {} s more; try again then",
                wait.as_secs().max(1)
            );
            self.expel(slot, reason);
            return Ok(());
        }
        // A join needs a save-game; a state that cannot be saved now turns this joiner away
        // and leaves the match as it is (a later join tries again).
        let save = match from_save.then(|| self.current_save()) {
            Some(Err(e)) => {
                let reason = format!(
                    "turned away: the server cannot save the match's state, which a join needs: {e}; try again later (the game may hold what cannot be saved only for a while)"
                );
                self.expel(slot, reason);
                return Ok(());
            }
            Some(Ok(save)) => Some(save),
            None => None,
        };
        let seat = self.seats[slot].as_mut().expect("seated");
        seat.hello = true;
        seat.last_useful = Instant::now();
        seat.digest_from = (self.order.next(), Instant::now());
        let frame = self.order.next();
        let rtt_ticks = self.renet.rtt(seat.client_id) / self.opts.tick.as_secs_f64();
        seat.delay = DelayControl::new(rtt_ticks, frame);
        let welcome = ServerMessage::Welcome {
            slot: slot as u8,
            players: self.opts.game.players as u8,
            seed: self.opts.game.seed,
            frames: self.opts.frames,
            tick_us: self.opts.tick.as_micros() as u32,
            check_every: self.opts.check_every as u32,
            delay: seat.delay.delay(),
            start: if from_save { Start::Save } else { Start::Init },
        };
        let client_id = seat.client_id;
        let addr = seat.addr;
        self.renet
            .send_message(client_id, CHANNEL_CONTROL, welcome.encode());
        let save_bytes = save.map_or(0, |save| self.send_state(slot, StateReason::Join, save));
        let r = &mut self.seats[slot].as_mut().expect("seated").record;
        r.joined_at = frame;
        r.joined_from_save = from_save;
        (self.observe)(&ServerEvent::Joined {
            slot,
            addr,
            frame,
            save_bytes,
        });
        let hellos = self.seats.iter().flatten().filter(|s| s.hello).count();
        if self.started.is_none() && hellos >= self.opts.start_with {
            self.started = Some(Instant::now());
            self.next_tick = Some(Instant::now() + START_DELAY);
            (self.observe)(&ServerEvent::Started { clients: hellos });
        }
        Ok(())
    }

    /// The synchronous state as a save-game, made once per frame for that frame's joins and
    /// resyncs. A state that cannot be saved is not remembered: the next join or resync tries
    /// again.
    fn current_save(&mut self) -> Result<Arc<Vec<u8>>, GameError> {
        let frame = self.order.next();
        if let Some((f, save)) = &self.cached_save {
            if *f == frame {
                return Ok(Arc::clone(save));
            }
        }
        let save = Arc::new(self.game.save_game()?);
        self.stats.saves += 1;
        self.cached_save = Some((frame, Arc::clone(&save)));
        Ok(save)
    }

    /// Sends a slot `save`, the synchronous state ([`Match::current_save`]); returns its size.
    fn send_state(&mut self, slot: usize, reason: StateReason, save: Arc<Vec<u8>>) -> usize {
        let frame = self.order.next();
        let seat = self.seats[slot].as_mut().expect("seated");
        seat.epoch += 1;
        // A save goes only to a client that loaded the last one (its digest names the last
        // epoch), so the last one's pieces were all handed to renet; were they not, they go
        // now, before the next head, which the client takes only after a whole save.
        if let Some(last) = seat.state_wait.take() {
            for offset in (last.next..last.save.len()).step_by(SAVE_PIECE_BYTES) {
                let piece = save_piece(&last.save, offset);
                self.renet
                    .send_message(seat.client_id, CHANNEL_STATE, piece);
            }
        }
        let unacked = STATE_CHANNEL_BYTES.saturating_sub(
            self.renet
                .channel_available_memory(seat.client_id, CHANNEL_STATE),
        );
        // The head now; the pieces as the client acknowledges (state_fault, each update).
        let head = save_head(frame, reason, &save);
        let handed = unacked + head.len();
        self.renet.send_message(seat.client_id, CHANNEL_STATE, head);
        let sent_before = self.transport.traffic(seat.client_id).sent;
        seat.state_wait = Some(StateWait {
            save: Arc::clone(&save),
            next: 0,
            handed,
            acked: unacked,
            since: Instant::now(),
            sent_before,
            budget: STATE_BUDGET_SAVES * save.len() as u64 + STATE_BUDGET_SLACK,
        });
        seat.digest_from = (frame, Instant::now());
        save.len()
    }

    fn digest(&mut self, slot: usize, frame: u64, value: u64, epoch: u32) -> Result<(), NetError> {
        let seat = self.seats[slot].as_ref().expect("seated");
        if epoch > seat.epoch {
            self.refuse(
                slot,
                format!(
                    "a digest after {epoch} save-games; the server sent {}",
                    seat.epoch
                ),
            );
            return Ok(());
        }
        if epoch < seat.epoch {
            return Ok(()); // of a state since replaced
        }
        if frame > self.order.next() {
            let next = self.order.next();
            self.refuse(
                slot,
                format!("a digest for frame {frame}, which the server has not reached (it is at frame {next})"),
            );
            return Ok(());
        }
        if frame % self.opts.check_every != 0 && frame != self.opts.frames {
            let every = self.opts.check_every;
            self.refuse(
                slot,
                format!("a digest for frame {frame}, not a check frame (every {every} frames and the last)"),
            );
            return Ok(());
        }
        let Some(&ours) = self.checks.get(&frame) else {
            return Ok(()); // older than the digests kept
        };
        let addr = seat.addr;
        let seat = self.seats[slot].as_mut().expect("seated");
        seat.last_useful = Instant::now();
        seat.digest_from.0 = seat.digest_from.0.max(frame);
        let r = &mut seat.record;
        if ours == value {
            r.checks_passed += 1;
            if frame == self.opts.frames {
                r.final_digest = Some(value);
            }
            return Ok(());
        }
        r.desyncs += 1;
        if frame == self.opts.frames {
            r.final_digest = Some(value);
        }
        if r.resyncs >= self.opts.max_resyncs {
            let n = r.resyncs;
            self.drop_seat(
                slot,
                format!("dropped: its state disagreed with the server's again after {n} resyncs"),
            );
            return Ok(());
        }
        // A resync needs a save-game. A client whose state disagrees and that cannot be
        // resynced cannot follow the match: it goes, told why; the others play on.
        let save = match self.current_save() {
            Ok(save) => save,
            Err(e) => {
                self.expel(
                    slot,
                    format!(
                        "dropped: its state disagreed with the server's at frame {frame} (value digest {value:016x}, the server's {ours:016x}) and the server cannot save its state to resync it: {e}"
                    ),
                );
                return Ok(());
            }
        };
        let r = &mut self.seats[slot].as_mut().expect("seated").record;
        r.resyncs += 1;
        (self.observe)(&ServerEvent::Resync {
            slot,
            addr,
            frame,
            server: ours,
            client: value,
        });
        let seat = self.seats[slot].as_ref().expect("seated");
        let notice = ServerMessage::Desync {
            frame,
            server: ours,
            client: value,
        };
        self.renet
            .send_message(seat.client_id, CHANNEL_CONTROL, notice.encode());
        self.send_state(slot, StateReason::Resync, save);
        Ok(())
    }

    /// Closes the frames whose time has come.
    fn close_due_frames(&mut self, now: Instant) -> Result<(), NetError> {
        let Some(mut next_tick) = self.next_tick else {
            return Ok(());
        };
        let mut closed = 0;
        while now >= next_tick
            && self.order.next() < self.opts.frames
            && closed < MAX_FRAMES_PER_UPDATE
        {
            self.close_frame()?;
            next_tick += self.opts.tick;
            closed += 1;
        }
        self.next_tick = Some(next_tick);
        Ok(())
    }

    fn close_frame(&mut self) -> Result<(), NetError> {
        let (frame, inputs) = self.order.close();
        let t = Instant::now();
        self.game.step(&inputs)?;
        self.stats.steps += t.elapsed();
        let msg = ServerMessage::Confirm { frame, inputs }.encode();
        for seat in self.seats.iter().flatten().filter(|s| s.hello) {
            self.renet
                .send_message(seat.client_id, CHANNEL_FRAMES, msg.clone());
        }
        let count = frame + 1;
        if count % self.opts.check_every == 0 || count == self.opts.frames {
            let t = Instant::now();
            let digest = self.game.value_digest()?;
            self.stats.digests += t.elapsed();
            self.stats.digest_count += 1;
            self.checks.insert(count, digest);
            self.closed_at.insert(count, Instant::now());
            while self.checks.len() > CHECKS_KEPT {
                self.checks.pop_first();
                self.closed_at.pop_first();
            }
        }
        let clients = self.seats.iter().flatten().filter(|s| s.hello).count();
        (self.observe)(&ServerEvent::Frame {
            frame: count,
            frames: self.opts.frames,
            clients,
        });
        Ok(())
    }
}
