//! The seed's client-server model over a real network: a [`MatchServer`] keeps the
//! synchronous model in lockstep, and each [`MatchClient`] plays one player slot with a
//! [`PredictiveClient`](crate::runtime::PredictiveClient).
//!
//! # The model
//!
//! The server owns the clock. Every tick it *closes* the next frame: each slot's input is the
//! last command that slot's client sent for a frame up to this one (held, as a pad's buttons
//! are held; 0 for an empty slot), the server steps its own game with them, and confirms the
//! frame's inputs to every client. A command naming a frame already closed is late and takes
//! effect at the next open frame: the server orders commands into frames; clients never
//! negotiate among themselves.
//!
//! A client's synchronous form is the state after the frames confirmed so far; its
//! asynchronous form, what the player sees, is that plus its predicted frames (its own
//! scripted input, the others' last confirmed inputs). When confirmations arrive it rolls
//! back to the synchronous form (an arena snapshot, or a save-game for the serialize
//! backend), applies them, snapshots, and predicts again. It predicts `delay` frames past the
//! last confirmation and sends each command for the frame it predicts it at; the server sets
//! each client's delay from the round trip and raises it when that client's commands arrive
//! late, lowers it when they arrive with frames to spare (its *adaptive frame delay*).
//!
//! Every `check_every` frames, and at the last, each client sends the value digest of its
//! synchronous state (address-independent: arenas differ between processes); the server
//! compares it with its own. A client that disagrees is *resynced*: the server sends its
//! state as a save-game, loaded with foreign trust (no code from the file, budgets on), and
//! the client goes on from it. A client that joins a match already running gets the same.
//!
//! ```text
//!  client (slot 1)                     server                      client (slot 2)
//!    | hello{game id} ------------------>|                                |
//!    |<------ welcome{slot, seed, delay} |                                |
//!    |              (start: G.init, or a save-game on the state channel)  |
//!    | command{frame f+d, input} ------->|<--------- command{frame, input} |
//!    |                                   | tick: close frame f, step      |
//!    |<--------- confirm{f, inputs} -----|------ confirm{f, inputs} ----->|
//!    | roll back, apply f, snapshot,     |                                |
//!    | predict f+1 .. f+d                |                                |
//!    |<--------------- delay{d'} --------|  (a command arrived late)      |
//!    | digest{frame n, value} ---------->| compare with its own at n      |
//!    |<----- desync{n}, state{save} -----|  (when they differ)            |
//!    |                ...                |                                |
//!    | digest{last frame} -------------->|<------------ digest{last frame} |
//!    |<--------- end{value digest} ------|------- end{value digest} ----->|
//! ```
//!
//! # Transport
//!
//! renet's reliable ordered channels (control, frames, save-games: three channels so that one
//! never waits behind another) over netcode (renetcode) over UDP. A [`LinkConditions`] puts an
//! emulated network under a client's socket: latency, jitter and loss, inside the process.
//!
//! # Hostile peers
//!
//! The server reads at most a bounded number of datagrams and messages per client per update;
//! a malformed message, a command for a frame too far ahead or back in time, a digest for a
//! frame not yet closed, is refused and reported ([`ServerEvent::Refused`]) naming the slot,
//! the address and what was wrong; a client that keeps at it, floods, or disagrees too often
//! is dropped. A client that leaves is dropped, and its slot plays no input (0) from then on.
//! So is a connection that holds a slot without playing: no hello within
//! [`ServerOptions::hello_timeout`], no command nor digest for
//! [`ServerOptions::quiet_timeout`] while the clock runs, or nothing more of a save-game
//! acknowledged for [`ServerOptions::state_ack_timeout`] (the transport would send it again
//! and again). Text a peer sends that is printed (a server's refusal) has its control
//! characters escaped.
//! Nothing a client sends stops the match for the others.
//!
//! Inputs are one byte per player (the scripted input source of `luasnap simulate`).

mod client;
mod error;
mod link;
mod order;
mod protocol;
mod server;
mod transport;

pub use client::{ClientEvent, ClientOptions, ClientReport, MatchClient, SyncHook};
pub use error::NetError;
pub use link::LinkConditions;
pub use protocol::DecodeError;
pub use server::{
    ClientRecord, DepartedTotals, MatchServer, ServerEvent, ServerOptions, ServerReport,
    ACK_TIMEOUT, DEPARTED_RECORDS_KEPT, DIGEST_TIMEOUT, HELLO_TIMEOUT, QUIET_TIMEOUT, SAVE_BACKOFF,
    SAVE_BACKOFF_MAX, STATE_ACK_TIMEOUT, STATE_BUDGET_SAVES, STATE_BUDGET_SLACK,
};

#[cfg(feature = "fuzzing")]
pub mod testing;
