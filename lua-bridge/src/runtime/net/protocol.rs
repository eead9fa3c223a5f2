//! The messages of a match, and their bytes.
//!
//! Every message is one tag byte and fixed little-endian fields; a save-game travels as a
//! length-prefixed byte string. Decoding checks every length against the bytes present and
//! against this module's limits, and a message must use all its bytes: a peer's malformed
//! message is a [`DecodeError`] naming what is wrong, never a panic or an allocation the
//! message did not pay for.
//!
//! A save-game goes as a head that announces its size, then pieces of at most
//! [`SAVE_PIECE_BYTES`] in order ([`save_head`], [`save_piece`]); the client puts them
//! together with a [`SaveAssembly`]. In pieces because renet frees a reliable message's
//! memory only once every slice of it is acknowledged: sent as one message, a save showed the
//! server no progress until it was whole, and a joiner on a lossy link that was getting it
//! was dropped for acknowledging nothing (an outside tester's F4c, at 40% loss). A piece fits
//! one renet packet, so that the server's unacknowledged bytes are exactly the pieces in
//! flight, which it keeps few (see `server::STATE_WINDOW_BYTES`).

use std::fmt;

/// Renet channel of the control messages, both ways (hello, welcome, delay, digests,
/// desync notices, the end): reliable and ordered.
pub(crate) const CHANNEL_CONTROL: u8 = 0;
/// Renet channel of the frames, both ways (commands up, confirmations down): reliable and
/// ordered, apart from control so that a burst of one never waits behind the other.
pub(crate) const CHANNEL_FRAMES: u8 = 1;
/// Renet channel of save-games, server to client (joins, resyncs): reliable and ordered,
/// last in priority so that a save sent to one client never delays confirmations.
pub(crate) const CHANNEL_STATE: u8 = 2;

/// The netcode protocol id: a match server accepts only clients of the same protocol.
pub(crate) const PROTOCOL_ID: u64 = 0x6c75_6173_6e61_7002; // "luasnap" + version 2 (saves in pieces)

/// The largest save-game a client accepts from the server (a joining or resynced state).
pub(crate) const MAX_SAVE_BYTES: usize = 256 << 20;
/// The most bytes of a save-game one [`ServerMessage::StatePiece`] carries. A piece, encoded,
/// is at most [`RENET_SMALL_MESSAGE`]: renet sends it whole in one packet and frees its
/// memory as that packet is acknowledged (a larger message is sliced, and freed only when
/// every slice is), so the server sees each piece acknowledged as it arrives.
pub(crate) const SAVE_PIECE_BYTES: usize = 1 << 10;
/// The largest message renet 2.0.1 sends in one packet (its `SLICE_SIZE`, which it does not
/// export), less the message's own framing in the packet (its length and id, at most 9 bytes
/// each as varints).
const RENET_SMALL_MESSAGE: usize = 1200 - 18;
// A piece's tag, offset and length (9 bytes) with its bytes are one renet packet.
const _: () = assert!(9 + SAVE_PIECE_BYTES <= RENET_SMALL_MESSAGE);
/// The longest refusal text.
const MAX_TEXT: usize = 1024;
/// The reason of a refusal that says every player slot is taken (the client reports it as
/// [`NetError::Full`](super::error::NetError::Full), as when netcode itself denies it).
pub(crate) const REFUSED_FULL: &str = "full";
/// The most players of a match (as for [`GameConfig::players`](crate::runtime::GameConfig)).
pub(crate) const MAX_PLAYERS: usize = 16;

/// How a client's state starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// From `G.init(players, seed)`, at frame 0: the match has not started.
    Init,
    /// From the save-game that follows on the state channel.
    Save,
}

/// What a client says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientMessage {
    /// First message: which game the client runs (see [`game_id`]).
    Hello { game_id: u64 },
    /// The player's input from `frame` on (held until the next command).
    Command { frame: u64, input: u8 },
    /// The value digest of the client's synchronous state after `frame` frames; `epoch`
    /// counts the save-games the client has loaded (so digests of a state the server has
    /// since replaced are told apart).
    Digest { frame: u64, value: u64, epoch: u32 },
}

/// Why a save-game is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateReason {
    /// The client joined a match already running.
    Join,
    /// The client's digest disagreed with the server's.
    Resync,
}

/// What the server says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerMessage {
    /// The client's slot and the match's parameters.
    Welcome {
        slot: u8,
        players: u8,
        seed: u64,
        frames: u64,
        tick_us: u32,
        check_every: u32,
        delay: u32,
        start: Start,
    },
    /// The client cannot play; it is disconnected after this.
    Refused { reason: String },
    /// The inputs of frame `frame` (one per player), final.
    Confirm { frame: u64, inputs: Vec<u8> },
    /// How many frames ahead of the confirmed frame the client's commands should be.
    Delay { frames: u32 },
    /// The client's digest after `frame` frames was not the server's; a save follows.
    Desync {
        frame: u64,
        server: u64,
        client: u64,
    },
    /// The synchronous state after `frame` frames, as a save-game of `bytes` bytes: its
    /// pieces follow, in order, on the same channel.
    StateHead {
        frame: u64,
        reason: StateReason,
        bytes: u32,
    },
    /// The bytes of the save-game announced last from `offset` on.
    StatePiece { offset: u32, data: Vec<u8> },
    /// The match is over: the server's value digest after `frame` frames.
    End { frame: u64, value_digest: u64 },
}

/// What is wrong with a message's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The message kind being read, or `message` before the tag was known.
    pub kind: &'static str,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed {}: {}", self.kind, self.what)
    }
}

impl std::error::Error for DecodeError {}

/// An identity of a game's code: both ends of a match must run the same script and the
/// same modules (those given by name and every Lua file in the game's folder, by path), and
/// the same collection points where the host sets them ([`GameConfig::collect_every`]: a
/// game's own `G.collect_every` is in its script), since they decide when weak entries are
/// cleared. The folder is read whole into `cfg` ([`GameConfig::read_folder`]) if it was not
/// already (a folder read lazily is read again, whole), so that the games built from `cfg` run the files the identity names, not the
/// folder as it is when they start or require a module.
///
/// [`GameConfig::collect_every`]: crate::runtime::GameConfig::collect_every
/// [`GameConfig::read_folder`]: crate::runtime::GameConfig::read_folder
pub(crate) fn game_id(cfg: &mut crate::runtime::GameConfig) -> Result<u64, super::error::NetError> {
    if !cfg.folder_files.as_ref().is_some_and(|f| f.is_complete()) {
        *cfg = cfg
            .clone()
            .read_folder()
            .map_err(|e| super::error::NetError::Config(e.to_string()))?;
    }
    let mut modules = cfg.modules.clone();
    modules.extend(cfg.folder_files.iter().flat_map(|f| f.files()));
    let code = game_id_of(&cfg.chunk_name, cfg.script.as_bytes(), &modules);
    Ok(match cfg.collect_every {
        // The id of a game run as it says stays its code's.
        None => code,
        Some(n) => xxhash_rust::xxh3::xxh3_64(&[code.to_le_bytes(), n.to_le_bytes()].concat()),
    })
}

/// [`game_id`] of a script named `chunk_name` and its modules.
pub(crate) fn game_id_of(
    chunk_name: &str,
    script: &[u8],
    modules: &[crate::bridge::modules::Module],
) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut field = |b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(chunk_name.as_bytes());
    field(script);
    for m in modules {
        field(m.name.as_bytes());
        field(m.path.as_bytes());
        field(&m.source);
    }
    h.digest()
}

/// Reads fields off a message, each checked against the bytes left.
struct Reader<'a> {
    bytes: &'a [u8],
    kind: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads a whole message: its tag, then its fields by `fields(tag, reader)`, which must
    /// use every byte.
    fn message<T>(
        bytes: &'a [u8],
        fields: impl FnOnce(u8, &mut Reader<'a>) -> Result<T, DecodeError>,
    ) -> Result<T, DecodeError> {
        let Some((&tag, rest)) = bytes.split_first() else {
            return Err(DecodeError {
                kind: "message",
                what: "empty".into(),
            });
        };
        let mut r = Reader {
            bytes: rest,
            kind: "message",
        };
        let msg = fields(tag, &mut r)?;
        r.end()?;
        Ok(msg)
    }

    fn fail(&self, what: impl Into<String>) -> DecodeError {
        DecodeError {
            kind: self.kind,
            what: what.into(),
        }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(self.fail(format!(
                "truncated at {field}: needs {n} bytes, {} left",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, field: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    fn u32(&mut self, field: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, field: &str) -> Result<u64, DecodeError> {
        let b = self.take(8, field)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A byte string of at most `max` bytes, after its u32 length.
    fn bytes(&mut self, field: &str, max: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(field)? as usize;
        if n > max {
            return Err(self.fail(format!("{field} of {n} bytes is over the limit of {max}")));
        }
        self.take(n, field)
    }

    fn end(self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.fail(format!("{} bytes after the last field", self.bytes.len())))
        }
    }
}

/// Writes a message: its tag, then fixed little-endian fields (what [`Reader`] reads back).
struct Writer(Vec<u8>);

impl Writer {
    fn message(tag: u8, capacity: usize) -> Writer {
        let mut out = Vec::with_capacity(capacity);
        out.push(tag);
        Writer(out)
    }

    fn u8(&mut self, v: u8) -> &mut Writer {
        self.0.push(v);
        self
    }

    fn u32(&mut self, v: u32) -> &mut Writer {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn u64(&mut self, v: u64) -> &mut Writer {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A byte string after its u32 length.
    fn bytes(&mut self, b: &[u8]) -> &mut Writer {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
}

impl ClientMessage {
    /// The message's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w;
        match self {
            ClientMessage::Hello { game_id } => {
                w = Writer::message(1, 9);
                w.u64(*game_id);
            }
            ClientMessage::Command { frame, input } => {
                w = Writer::message(2, 10);
                w.u64(*frame).u8(*input);
            }
            ClientMessage::Digest {
                frame,
                value,
                epoch,
            } => {
                w = Writer::message(3, 21);
                w.u64(*frame).u64(*value).u32(*epoch);
            }
        }
        w.0
    }

    /// Reads a message; any defect is an error naming it.
    pub(crate) fn decode(bytes: &[u8]) -> Result<ClientMessage, DecodeError> {
        Reader::message(bytes, |tag, r| {
            Ok(match tag {
                1 => {
                    r.kind = "hello";
                    ClientMessage::Hello {
                        game_id: r.u64("game id")?,
                    }
                }
                2 => {
                    r.kind = "command";
                    ClientMessage::Command {
                        frame: r.u64("frame")?,
                        input: r.u8("input")?,
                    }
                }
                3 => {
                    r.kind = "digest";
                    ClientMessage::Digest {
                        frame: r.u64("frame")?,
                        value: r.u64("value")?,
                        epoch: r.u32("epoch")?,
                    }
                }
                t => return Err(r.fail(format!("unknown tag {t:#04x}"))),
            })
        })
    }
}

impl ServerMessage {
    /// The message's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w;
        match self {
            ServerMessage::Welcome {
                slot,
                players,
                seed,
                frames,
                tick_us,
                check_every,
                delay,
                start,
            } => {
                w = Writer::message(1, 32);
                w.u8(*slot).u8(*players).u64(*seed).u64(*frames);
                w.u32(*tick_us).u32(*check_every).u32(*delay);
                w.u8(match start {
                    Start::Init => 0,
                    Start::Save => 1,
                });
            }
            ServerMessage::Refused { reason } => {
                w = Writer::message(2, 32);
                w.bytes(&reason.as_bytes()[..reason.len().min(MAX_TEXT)]);
            }
            ServerMessage::Confirm { frame, inputs } => {
                w = Writer::message(3, 32);
                w.u64(*frame).u8(inputs.len() as u8);
                w.0.extend_from_slice(inputs);
            }
            ServerMessage::Delay { frames } => {
                w = Writer::message(4, 32);
                w.u32(*frames);
            }
            ServerMessage::Desync {
                frame,
                server,
                client,
            } => {
                w = Writer::message(5, 32);
                w.u64(*frame).u64(*server).u64(*client);
            }
            ServerMessage::StateHead {
                frame,
                reason,
                bytes,
            } => {
                w = Writer::message(6, 32);
                w.u64(*frame).u8(match reason {
                    StateReason::Join => 0,
                    StateReason::Resync => 1,
                });
                w.u32(*bytes);
            }
            ServerMessage::StatePiece { offset, data } => {
                w = Writer::message(8, 9 + data.len());
                w.u32(*offset).bytes(data);
            }
            ServerMessage::End {
                frame,
                value_digest,
            } => {
                w = Writer::message(7, 32);
                w.u64(*frame).u64(*value_digest);
            }
        }
        w.0
    }

    /// Reads a message; any defect is an error naming it. A refusal's text comes from the
    /// peer: its control characters are escaped (`\n`, `\u{1b}`), so that it cannot end a
    /// line, colour or retitle the terminal it is printed to.
    pub(crate) fn decode(bytes: &[u8]) -> Result<ServerMessage, DecodeError> {
        Reader::message(bytes, |tag, r| {
            Ok(match tag {
                1 => decode_welcome(r)?,
                2 => {
                    r.kind = "refusal";
                    let text = r.bytes("reason", MAX_TEXT)?;
                    ServerMessage::Refused {
                        reason: crate::runtime::printable_line(&String::from_utf8_lossy(text)),
                    }
                }
                3 => {
                    r.kind = "confirmation";
                    let frame = r.u64("frame")?;
                    let n = r.u8("player count")? as usize;
                    if n == 0 || n > MAX_PLAYERS {
                        return Err(r.fail(format!("{n} players (1..={MAX_PLAYERS})")));
                    }
                    ServerMessage::Confirm {
                        frame,
                        inputs: r.take(n, "inputs")?.to_vec(),
                    }
                }
                4 => {
                    r.kind = "delay";
                    ServerMessage::Delay {
                        frames: r.u32("frames")?,
                    }
                }
                5 => {
                    r.kind = "desync notice";
                    ServerMessage::Desync {
                        frame: r.u64("frame")?,
                        server: r.u64("server digest")?,
                        client: r.u64("client digest")?,
                    }
                }
                6 => {
                    r.kind = "state";
                    let frame = r.u64("frame")?;
                    let reason = match r.u8("reason")? {
                        0 => StateReason::Join,
                        1 => StateReason::Resync,
                        v => return Err(r.fail(format!("reason {v} (0 join, 1 resync)"))),
                    };
                    let bytes = r.u32("size")?;
                    if bytes == 0 || bytes as usize > MAX_SAVE_BYTES {
                        return Err(r.fail(format!(
                            "a save-game of {bytes} bytes (1..={MAX_SAVE_BYTES})"
                        )));
                    }
                    ServerMessage::StateHead {
                        frame,
                        reason,
                        bytes,
                    }
                }
                8 => {
                    r.kind = "state piece";
                    let offset = r.u32("offset")?;
                    let data = r.bytes("piece", SAVE_PIECE_BYTES)?;
                    if data.is_empty() {
                        return Err(r.fail("an empty piece"));
                    }
                    ServerMessage::StatePiece {
                        offset,
                        data: data.to_vec(),
                    }
                }
                7 => {
                    r.kind = "end";
                    ServerMessage::End {
                        frame: r.u64("frame")?,
                        value_digest: r.u64("value digest")?,
                    }
                }
                t => return Err(r.fail(format!("unknown tag {t:#04x}"))),
            })
        })
    }
}

/// The head of `save`, the state after `frame` frames: the first message that carries it.
pub(crate) fn save_head(frame: u64, reason: StateReason, save: &[u8]) -> Vec<u8> {
    ServerMessage::StateHead {
        frame,
        reason,
        bytes: save.len() as u32,
    }
    .encode()
}

/// The piece of `save` that starts at byte `offset` (at most [`SAVE_PIECE_BYTES`]); `offset`
/// is below the save's length.
pub(crate) fn save_piece(save: &[u8], offset: usize) -> Vec<u8> {
    let end = save.len().min(offset + SAVE_PIECE_BYTES);
    ServerMessage::StatePiece {
        offset: offset as u32,
        data: save[offset..end].to_vec(),
    }
    .encode()
}

/// The messages that carry `save`: its head, then its pieces in order.
#[cfg(test)]
pub(crate) fn state_messages(frame: u64, reason: StateReason, save: &[u8]) -> Vec<Vec<u8>> {
    std::iter::once(save_head(frame, reason, save))
        .chain(
            (0..save.len())
                .step_by(SAVE_PIECE_BYTES)
                .map(|offset| save_piece(save, offset)),
        )
        .collect()
}

/// A save-game being put together from its head and pieces. Invariant: `save` holds the
/// first `save.len()` of the `bytes` announced, and grows only by the pieces that arrived
/// (a head alone allocates nothing: a hostile server announcing the largest save pays for
/// every byte of it).
#[derive(Debug)]
pub(crate) struct SaveAssembly {
    frame: u64,
    reason: StateReason,
    bytes: usize,
    save: Vec<u8>,
}

/// A save-game put together whole: the state after `frame` frames.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WholeSave {
    pub(crate) frame: u64,
    pub(crate) reason: StateReason,
    pub(crate) save: Vec<u8>,
}

impl SaveAssembly {
    /// Takes the next message of the state channel: a head starts a save (none may be in
    /// progress), a piece must be the next bytes of the one in progress. Returns the save
    /// once whole. A message out of this order, or of another kind, is an error naming it.
    pub(crate) fn take(
        assembly: &mut Option<SaveAssembly>,
        msg: ServerMessage,
    ) -> Result<Option<WholeSave>, String> {
        match (msg, assembly.as_mut()) {
            (ServerMessage::StateHead { frame, .. }, Some(a)) => Err(format!(
                "a save-game of frame {frame} announced before the last one (of frame {}) was whole ({} of {} bytes)",
                a.frame,
                a.save.len(),
                a.bytes
            )),
            (
                ServerMessage::StateHead {
                    frame,
                    reason,
                    bytes,
                },
                None,
            ) => {
                *assembly = Some(SaveAssembly {
                    frame,
                    reason,
                    bytes: bytes as usize,
                    save: Vec::new(),
                });
                Ok(None)
            }
            (ServerMessage::StatePiece { offset, .. }, None) => Err(format!(
                "a piece of a save-game (at byte {offset}) with no save-game announced"
            )),
            (ServerMessage::StatePiece { offset, data }, Some(a)) => {
                if offset as usize != a.save.len() {
                    return Err(format!(
                        "a piece of a save-game at byte {offset} where byte {} was next",
                        a.save.len()
                    ));
                }
                if data.len() > a.bytes - a.save.len() {
                    return Err(format!(
                        "a piece of {} bytes at byte {offset} of a save-game of {} bytes",
                        data.len(),
                        a.bytes
                    ));
                }
                a.save.extend_from_slice(&data);
                if a.save.len() < a.bytes {
                    return Ok(None);
                }
                let a = assembly.take().expect("in progress");
                Ok(Some(WholeSave {
                    frame: a.frame,
                    reason: a.reason,
                    save: a.save,
                }))
            }
            (_, _) => Err("a message other than a save-game's head or piece".into()),
        }
    }
}

fn decode_welcome(r: &mut Reader<'_>) -> Result<ServerMessage, DecodeError> {
    r.kind = "welcome";
    let slot = r.u8("slot")?;
    let players = r.u8("players")?;
    if players == 0 || players as usize > MAX_PLAYERS || slot >= players {
        return Err(r.fail(format!("slot {slot} of {players} players")));
    }
    let msg = ServerMessage::Welcome {
        slot,
        players,
        seed: r.u64("seed")?,
        frames: r.u64("frames")?,
        tick_us: r.u32("tick")?,
        check_every: r.u32("check interval")?,
        delay: r.u32("delay")?,
        start: match r.u8("start")? {
            0 => Start::Init,
            1 => Start::Save,
            v => return Err(r.fail(format!("start {v} (0 init, 1 save)"))),
        },
    };
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_and_every_truncation_is_refused() {
        let client = [
            ClientMessage::Hello { game_id: 7 },
            ClientMessage::Command {
                frame: 12,
                input: 31,
            },
            ClientMessage::Digest {
                frame: 30,
                value: u64::MAX,
                epoch: 2,
            },
        ];
        for m in client {
            let b = m.encode();
            assert_eq!(ClientMessage::decode(&b), Ok(m));
            for n in 0..b.len() {
                assert!(ClientMessage::decode(&b[..n]).is_err());
            }
            let mut long = b.clone();
            long.push(0);
            assert!(ClientMessage::decode(&long).is_err());
        }
        let server = [
            ServerMessage::Welcome {
                slot: 1,
                players: 4,
                seed: 9,
                frames: 600,
                tick_us: 33_000,
                check_every: 30,
                delay: 4,
                start: Start::Save,
            },
            ServerMessage::Refused {
                reason: "full".into(),
            },
            ServerMessage::Confirm {
                frame: 3,
                inputs: vec![1, 2, 3],
            },
            ServerMessage::Delay { frames: 5 },
            ServerMessage::Desync {
                frame: 30,
                server: 1,
                client: 2,
            },
            ServerMessage::StateHead {
                frame: 90,
                reason: StateReason::Resync,
                bytes: 1 << 20,
            },
            ServerMessage::StatePiece {
                offset: 65536,
                data: vec![9; 100],
            },
            ServerMessage::End {
                frame: 600,
                value_digest: 5,
            },
        ];
        for m in server {
            let b = m.encode();
            assert_eq!(ServerMessage::decode(&b), Ok(m));
            for n in 0..b.len() {
                assert!(ServerMessage::decode(&b[..n]).is_err());
            }
        }
    }

    #[test]
    fn a_refusals_control_characters_arrive_escaped() {
        let hostile = "\n\x1b[1;32mluasnap client: slot 1\x1b[0m\n\x1b]0;owned\x07\u{202e}é";
        let b = ServerMessage::Refused {
            reason: hostile.into(),
        }
        .encode();
        let Ok(ServerMessage::Refused { reason }) = ServerMessage::decode(&b) else {
            panic!("not a refusal");
        };
        assert!(!reason.chars().any(|c| c.is_control()), "{reason:?}");
        assert_eq!(
            reason,
            "\\n\\u{1b}[1;32mluasnap client: slot 1\\u{1b}[0m\\n\\u{1b}]0;owned\\u{7}\\u{202e}é"
        );
    }

    #[test]
    fn errors_name_the_message_and_the_field() {
        let e = ClientMessage::decode(&[2, 1, 2]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed command: truncated at frame: needs 8 bytes, 2 left"
        );
        let e = ClientMessage::decode(&[0x7f]).unwrap_err();
        assert_eq!(e.to_string(), "malformed message: unknown tag 0x7f");
        let mut huge = vec![6];
        huge.extend_from_slice(&0u64.to_le_bytes());
        huge.push(0);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = ServerMessage::decode(&huge).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed state: a save-game of 4294967295 bytes (1..=268435456)"
        );
        huge[10..].copy_from_slice(&0u32.to_le_bytes());
        let e = ServerMessage::decode(&huge).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed state: a save-game of 0 bytes (1..=268435456)"
        );
        let mut piece = vec![8];
        piece.extend_from_slice(&0u32.to_le_bytes());
        piece.extend_from_slice(&(SAVE_PIECE_BYTES as u32 + 1).to_le_bytes());
        piece.resize(piece.len() + SAVE_PIECE_BYTES + 1, 0);
        let e = ServerMessage::decode(&piece).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed state piece: piece of 1025 bytes is over the limit of 1024"
        );
        let e = ServerMessage::decode(&[8, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(e.to_string(), "malformed state piece: an empty piece");
    }

    /// A save-game's messages put back together: the head, then pieces in order.
    fn assemble(msgs: &[Vec<u8>]) -> Result<Option<WholeSave>, String> {
        let mut assembly = None;
        let mut whole = None;
        for m in msgs {
            let msg = ServerMessage::decode(m).map_err(|e| e.to_string())?;
            if let Some(w) = SaveAssembly::take(&mut assembly, msg)? {
                whole = Some(w);
            }
        }
        Ok(whole)
    }

    #[test]
    fn a_save_goes_in_pieces_and_is_put_back_together() {
        let save: Vec<u8> = (0..3 * SAVE_PIECE_BYTES + 17).map(|i| i as u8).collect();
        let msgs = state_messages(90, StateReason::Join, &save);
        assert_eq!(msgs.len(), 1 + 4);
        assert!(msgs.iter().all(|m| m.len() <= RENET_SMALL_MESSAGE));
        assert_eq!(
            assemble(&msgs),
            Ok(Some(WholeSave {
                frame: 90,
                reason: StateReason::Join,
                save: save.clone(),
            }))
        );
        // Not whole till the last piece.
        assert_eq!(assemble(&msgs[..4]), Ok(None));
        // One piece exactly.
        let small = state_messages(3, StateReason::Resync, &[5; 10]);
        assert_eq!(small.len(), 2);
        assert_eq!(assemble(&small).unwrap().unwrap().save, vec![5; 10]);
    }

    #[test]
    fn pieces_out_of_order_or_past_the_announced_size_are_refused() {
        let save = vec![1u8; 2 * SAVE_PIECE_BYTES + 5];
        let msgs = state_messages(30, StateReason::Resync, &save);
        let err = |msgs: Vec<Vec<u8>>| assemble(&msgs).unwrap_err();
        // A piece with no head.
        assert!(err(msgs[1..].to_vec()).contains("no save-game announced"));
        // A piece skipped, a piece twice.
        let e = err(vec![msgs[0].clone(), msgs[2].clone()]);
        let second = format!("at byte {SAVE_PIECE_BYTES} where byte 0 was next");
        assert!(e.contains(&second), "{e}");
        let e = err(vec![msgs[0].clone(), msgs[1].clone(), msgs[1].clone()]);
        let again = format!("at byte 0 where byte {SAVE_PIECE_BYTES} was next");
        assert!(e.contains(&again), "{e}");
        // A second head before the first save is whole.
        let e = err(vec![msgs[0].clone(), msgs[1].clone(), msgs[0].clone()]);
        assert!(e.contains("before the last one"), "{e}");
        // More bytes than announced.
        let head = ServerMessage::StateHead {
            frame: 1,
            reason: StateReason::Join,
            bytes: 10,
        };
        let piece = ServerMessage::StatePiece {
            offset: 0,
            data: vec![0; 11],
        };
        let e = err(vec![head.encode(), piece.encode()]);
        assert!(
            e.contains("a piece of 11 bytes at byte 0 of a save-game of 10 bytes"),
            "{e}"
        );
        // Another kind of message is not a piece.
        let e = err(vec![
            msgs[0].clone(),
            ServerMessage::Delay { frames: 1 }.encode(),
        ]);
        assert!(e.contains("other than a save-game"), "{e}");
    }

    #[test]
    fn a_head_alone_allocates_nothing() {
        let mut assembly = None;
        let head = ServerMessage::StateHead {
            frame: 1,
            reason: StateReason::Join,
            bytes: MAX_SAVE_BYTES as u32,
        };
        assert_eq!(SaveAssembly::take(&mut assembly, head), Ok(None));
        assert_eq!(assembly.as_ref().map(|a| a.save.capacity()), Some(0));
        let piece = ServerMessage::StatePiece {
            offset: 0,
            data: vec![7; 100],
        };
        assert_eq!(SaveAssembly::take(&mut assembly, piece), Ok(None));
        assert!(assembly.as_ref().unwrap().save.capacity() < 1 << 20);
    }
}
