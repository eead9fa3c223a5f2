//! Why a match could not be served or played.

use crate::runtime::GameError;

/// Why a match could not be served or played.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// Options out of range; the message names the option.
    #[error("{0}")]
    Config(String),
    /// The socket failed.
    #[error("{what}: {error}")]
    Io {
        /// What was being done (`cannot bind 0.0.0.0:7000`).
        what: String,
        /// The system's error.
        error: std::io::Error,
    },
    /// The client could not reach the server.
    #[error("no answer from the server at {server} within {seconds} s ({reason}): is `luasnap serve` running there, and is the port open for UDP?")]
    Connect {
        /// The server's address.
        server: std::net::SocketAddr,
        /// Seconds waited.
        seconds: u64,
        /// What netcode said, if anything.
        reason: String,
    },
    /// Every player slot of the server is taken (netcode denied the connection).
    #[error("the server at {server} is full: every player slot (its --players) is taken; try again when a player leaves")]
    Full {
        /// The server's address.
        server: std::net::SocketAddr,
    },
    /// The server refused the client.
    #[error("the server at {server} refused this client: {reason}")]
    Refused {
        /// The server's address.
        server: std::net::SocketAddr,
        /// The server's reason.
        reason: String,
    },
    /// The connection ended before the match did.
    #[error("the connection to {peer} ended at frame {frame}: {reason}")]
    Disconnected {
        /// Who is gone (`the server at 127.0.0.1:7000`).
        peer: String,
        /// The frame the client or server had reached.
        frame: u64,
        /// Why.
        reason: String,
    },
    /// The peer broke the protocol.
    #[error("{peer} broke the protocol: {what}")]
    Protocol {
        /// Who.
        peer: String,
        /// What.
        what: String,
    },
    /// The game failed (the server's model, or a client's).
    #[error(transparent)]
    Game(#[from] GameError),
}

impl NetError {
    /// The socket failed to send renet's packets.
    pub(crate) fn cannot_send(error: std::io::Error) -> NetError {
        NetError::Io {
            what: "cannot send".into(),
            error,
        }
    }
}
