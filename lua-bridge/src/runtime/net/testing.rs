//! A raw connection to a match server, for tests of hostile clients: any bytes on any
//! channel. Not part of the API (feature `fuzzing`).

use super::client::Conn;
use super::error::NetError;
use super::link::LinkConditions;
use super::protocol::{
    game_id_of, ClientMessage, SaveAssembly, ServerMessage, CHANNEL_CONTROL, CHANNEL_FRAMES,
};
use std::net::SocketAddr;
use std::time::Duration;

/// The control channel (hello, digests).
pub const CONTROL: u8 = CHANNEL_CONTROL;
/// The frames channel (commands).
pub const FRAMES: u8 = CHANNEL_FRAMES;

/// A connected peer that sends what it is told.
pub struct RawPeer {
    conn: Conn,
}

impl RawPeer {
    /// Connects (netcode's handshake only; no hello).
    pub fn connect(server: SocketAddr) -> Result<RawPeer, NetError> {
        let mut conn = Conn::open(server, LinkConditions::NONE, 99)?;
        conn.wait_connected(server, Duration::from_secs(10))?;
        Ok(RawPeer { conn })
    }

    /// Queues a message of any bytes.
    pub fn send(&mut self, channel: u8, bytes: Vec<u8>) {
        self.conn.send(channel, bytes);
    }

    /// Sends what is queued and reads what arrived (raw messages).
    pub fn pump(&mut self) -> Result<Vec<Vec<u8>>, NetError> {
        self.conn.flush()?;
        Ok(self.conn.pump()?.into_iter().map(|(_, b)| b).collect())
    }

    /// Sends what is queued without reading anything: what the server sent is never
    /// acknowledged.
    pub fn send_only(&mut self) -> Result<(), NetError> {
        self.conn.flush()
    }

    /// Whether the server still holds the connection.
    pub fn is_connected(&self) -> bool {
        self.conn.ended().is_none()
    }

    /// Leaves.
    pub fn close(&mut self) {
        self.conn.close();
    }
}

/// A hello for the game `script` named `chunk_name`.
pub fn hello(chunk_name: &str, script: &str) -> Vec<u8> {
    ClientMessage::Hello {
        game_id: game_id_of(chunk_name, script.as_bytes(), &[]),
    }
    .encode()
}

/// A command.
pub fn command(frame: u64, input: u8) -> Vec<u8> {
    ClientMessage::Command { frame, input }.encode()
}

/// A digest.
pub fn digest(frame: u64, value: u64, epoch: u32) -> Vec<u8> {
    ClientMessage::Digest {
        frame,
        value,
        epoch,
    }
    .encode()
}

/// The reason of a server's refusal, if `bytes` is one.
pub fn refusal(bytes: &[u8]) -> Option<String> {
    match ServerMessage::decode(bytes) {
        Ok(ServerMessage::Refused { reason }) => Some(reason),
        _ => None,
    }
}

/// Puts the server's save-games back together from their pieces, as a client does.
#[derive(Debug, Default)]
pub struct SaveReader {
    assembly: Option<SaveAssembly>,
}

impl SaveReader {
    /// Takes a raw message: true if it made a save-game whole. Messages that are not a
    /// save-game's are passed over; pieces out of order panic (the server sends them in
    /// order).
    pub fn whole(&mut self, bytes: &[u8]) -> bool {
        match ServerMessage::decode(bytes) {
            Ok(msg @ (ServerMessage::StateHead { .. } | ServerMessage::StatePiece { .. })) => {
                SaveAssembly::take(&mut self.assembly, msg)
                    .unwrap_or_else(|e| panic!("the server's save-game: {e}"))
                    .is_some()
            }
            _ => false,
        }
    }
}
