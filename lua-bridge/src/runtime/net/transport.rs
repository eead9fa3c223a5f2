//! The transport: renet's channels (reliability, ordering, fragmentation of large messages)
//! over netcode (renetcode: connections, timeouts, encrypted datagrams) over a [`Link`].
//!
//! This is the glue renet_netcode provides for a bare `UdpSocket`, written again over a
//! [`Link`] so that the emulated network sits under netcode, and so that the server can count
//! each client's bytes.

use super::link::{Link, LinkConditions};
use super::protocol::{CHANNEL_CONTROL, CHANNEL_FRAMES, CHANNEL_STATE, PROTOCOL_ID};
use renet::{ChannelConfig, ConnectionConfig, RenetClient, RenetServer, SendType};
use renetcode::{
    ClientAuthentication, NetcodeClient, NetcodeServer, ServerAuthentication, ServerConfig,
    ServerResult,
};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often renet's packets (messages, acknowledgements) go out when nothing new is queued:
/// an update runs every millisecond, and acknowledging at that rate would cost each peer a
/// datagram a millisecond.
pub(crate) const SEND_INTERVAL: Duration = Duration::from_millis(5);
/// How long an unacknowledged reliable message waits before it is sent again.
const RESEND: Duration = Duration::from_millis(100);
/// The same for save-games: a slice of one waits longer, so that a save sent over a slow
/// round trip is not sent several times over.
const STATE_RESEND: Duration = Duration::from_millis(400);
/// What a client may hold unacknowledged on each of its channels (commands and digests
/// are a few bytes each: a client that fills this is flooding, and renet disconnects it).
const CLIENT_CHANNEL_BYTES: usize = 256 << 10;
/// What the server may hold unacknowledged on its small channels, per client.
pub(crate) const SERVER_CHANNEL_BYTES: usize = 4 << 20;
/// What the server may hold unacknowledged in save-games, per client.
pub(crate) const STATE_CHANNEL_BYTES: usize = 300 << 20;

fn reliable(channel_id: u8, bytes: usize, resend_time: Duration) -> ChannelConfig {
    ChannelConfig {
        channel_id,
        max_memory_usage_bytes: bytes,
        send_type: SendType::ReliableOrdered { resend_time },
    }
}

/// The channels of a match (see [`super::protocol`]), the same at both ends.
pub(crate) fn connection_config() -> ConnectionConfig {
    ConnectionConfig {
        available_bytes_per_tick: 256 << 10,
        server_channels_config: vec![
            reliable(CHANNEL_CONTROL, SERVER_CHANNEL_BYTES, RESEND),
            reliable(CHANNEL_FRAMES, SERVER_CHANNEL_BYTES, RESEND),
            reliable(CHANNEL_STATE, STATE_CHANNEL_BYTES, STATE_RESEND),
        ],
        client_channels_config: vec![
            reliable(CHANNEL_CONTROL, CLIENT_CHANNEL_BYTES, RESEND),
            reliable(CHANNEL_FRAMES, CLIENT_CHANNEL_BYTES, RESEND),
        ],
    }
}

/// Netcode's clock: both ends must agree on it (connect tokens carry an expiry time).
pub(crate) fn netcode_time() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Bytes one client's datagrams carried, as the server counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Traffic {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

/// The server's end: one socket for every client.
pub(crate) struct ServerTransport {
    link: Link,
    netcode: NetcodeServer,
    books: Books,
}

/// What the server's transport keeps per client.
#[derive(Default)]
struct Books {
    traffic: HashMap<u64, Traffic>,
    /// Whether each connection removed this update had its save-game channel acknowledged
    /// whole as it went (renet forgets the connection before the server hears it left).
    departures: HashMap<u64, bool>,
}

impl ServerTransport {
    /// Serves `max_clients` connections on `socket`.
    pub(crate) fn new(socket: UdpSocket, max_clients: usize) -> io::Result<ServerTransport> {
        let addr = socket.local_addr()?;
        let link = Link::new(socket, LinkConditions::NONE, 1)?;
        let netcode = NetcodeServer::new(ServerConfig {
            current_time: netcode_time(),
            max_clients,
            protocol_id: PROTOCOL_ID,
            public_addresses: vec![addr],
            authentication: ServerAuthentication::Unsecure,
        });
        Ok(ServerTransport {
            link,
            netcode,
            books: Books::default(),
        })
    }

    /// Whether a connection renet reported gone had nothing of its save-game channel
    /// unacknowledged as it went (a client acknowledges what it read as it leaves).
    pub(crate) fn left_with_state_whole(&mut self, client_id: u64) -> bool {
        self.books.departures.remove(&client_id).unwrap_or(false)
    }

    /// A client's address while it is connected.
    pub(crate) fn client_addr(&self, client_id: u64) -> Option<SocketAddr> {
        self.netcode.client_addr(client_id)
    }

    /// A client's traffic so far.
    pub(crate) fn traffic(&self, client_id: u64) -> Traffic {
        self.books
            .traffic
            .get(&client_id)
            .copied()
            .unwrap_or_default()
    }

    /// Stops counting a client's traffic (it left, and its record has its counts).
    pub(crate) fn forget(&mut self, client_id: u64) {
        self.books.traffic.remove(&client_id);
    }

    /// Advances the clocks by `dt` and hands what arrived to renet.
    pub(crate) fn update(&mut self, dt: Duration, server: &mut RenetServer) -> io::Result<()> {
        self.netcode.update(dt);
        for (addr, mut bytes) in self.link.receive()? {
            let n = bytes.len() as u64;
            let result = self.netcode.process_packet(addr, &mut bytes);
            if let ServerResult::Payload { client_id, .. } = &result {
                if let Some(t) = self.books.traffic.get_mut(client_id) {
                    t.received += n;
                }
            }
            handle(result, &mut self.link, &mut self.books, server)?;
        }
        for client_id in self.netcode.clients_id() {
            let result = self.netcode.update_client(client_id);
            handle(result, &mut self.link, &mut self.books, server)?;
        }
        for client_id in server.disconnections_id() {
            let result = self.netcode.disconnect(client_id);
            handle(result, &mut self.link, &mut self.books, server)?;
        }
        Ok(())
    }

    /// Sends what renet has queued for every client.
    pub(crate) fn send_packets(&mut self, server: &mut RenetServer) -> io::Result<()> {
        for client_id in server.clients_id() {
            let Ok(packets) = server.get_packets_to_send(client_id) else {
                continue;
            };
            for packet in packets {
                // A client netcode no longer knows (it timed out this update): renet hears of
                // it on the next update.
                let Ok((addr, payload)) = self.netcode.generate_payload_packet(client_id, &packet)
                else {
                    break;
                };
                if let Some(t) = self.books.traffic.get_mut(&client_id) {
                    t.sent += payload.len() as u64;
                }
                self.link.send_to(payload, addr)?;
            }
        }
        self.link.flush()
    }

    /// Tells every client the match is over (netcode's disconnect packets, at once).
    pub(crate) fn disconnect_all(&mut self, server: &mut RenetServer) -> io::Result<()> {
        for client_id in self.netcode.clients_id() {
            let result = self.netcode.disconnect(client_id);
            handle(result, &mut self.link, &mut self.books, server)?;
        }
        self.link.flush()
    }
}

/// Carries out what netcode decided about a datagram.
/// Carries out what netcode asked for.
fn handle(
    result: ServerResult<'_, '_>,
    link: &mut Link,
    books: &mut Books,
    server: &mut RenetServer,
) -> io::Result<()> {
    match result {
        ServerResult::None => Ok(()),
        ServerResult::PacketToSend { payload, addr } => link.send_to(payload, addr),
        ServerResult::Payload { client_id, payload } => {
            // A payload for a client renet has already dropped is ignored.
            let _ = server.process_packet_from(payload, client_id);
            Ok(())
        }
        ServerResult::ClientConnected {
            client_id,
            addr,
            payload,
            ..
        } => {
            server.add_connection(client_id);
            books.traffic.entry(client_id).or_default().sent += payload.len() as u64;
            link.send_to(payload, addr)
        }
        ServerResult::ClientDisconnected {
            client_id,
            addr,
            payload,
        } => {
            let whole =
                server.channel_available_memory(client_id, CHANNEL_STATE) >= STATE_CHANNEL_BYTES;
            books.departures.insert(client_id, whole);
            server.remove_connection(client_id);
            match payload {
                Some(p) => link.send_to(p, addr),
                None => Ok(()),
            }
        }
    }
}

/// The client's end: one socket to the server, behind the emulated link.
pub(crate) struct ClientTransport {
    link: Link,
    netcode: NetcodeClient,
}

impl ClientTransport {
    /// Starts connecting to `server` as `client_id`, through a link with `conditions`.
    pub(crate) fn connect(
        server: SocketAddr,
        client_id: u64,
        conditions: LinkConditions,
        seed: u64,
    ) -> Result<ClientTransport, String> {
        let bind: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let socket = UdpSocket::bind(bind).map_err(|e| format!("cannot open a UDP socket: {e}"))?;
        let link = Link::new(socket, conditions, seed)
            .map_err(|e| format!("cannot set up the UDP socket: {e}"))?;
        let netcode = NetcodeClient::new(
            netcode_time(),
            ClientAuthentication::Unsecure {
                protocol_id: PROTOCOL_ID,
                client_id,
                server_addr: server,
                user_data: None,
            },
        )
        .map_err(|e| format!("cannot start a netcode connection to {server}: {e}"))?;
        Ok(ClientTransport { link, netcode })
    }

    /// Bytes sent and received so far.
    pub(crate) fn traffic(&self) -> Traffic {
        Traffic {
            sent: self.link.bytes_sent,
            received: self.link.bytes_received,
        }
    }

    /// Whether the server denied the connection (netcode does when every slot is taken).
    pub(crate) fn denied(&self) -> bool {
        matches!(
            self.netcode.disconnect_reason(),
            Some(renetcode::DisconnectReason::ConnectionDenied)
        )
    }

    /// Why netcode closed the connection, if it did.
    pub(crate) fn disconnect_reason(&self) -> Option<String> {
        self.netcode.disconnect_reason().map(|r| r.to_string())
    }

    /// Advances the clocks by `dt` and hands what the server sent to renet; datagrams from
    /// any other address are dropped.
    pub(crate) fn update(&mut self, dt: Duration, client: &mut RenetClient) -> io::Result<()> {
        if self.netcode.is_disconnected() {
            client.disconnect_due_to_transport();
            return Ok(());
        }
        if self.netcode.is_connected() {
            client.set_connected();
        } else if self.netcode.is_connecting() {
            client.set_connecting();
        }
        let server = self.netcode.server_addr();
        for (addr, mut bytes) in self.link.receive()? {
            if addr != server {
                continue;
            }
            if let Some(payload) = self.netcode.process_packet(&mut bytes) {
                client.process_packet(payload);
            }
        }
        if let Some((packet, addr)) = self.netcode.update(dt) {
            self.link.send_to(packet, addr)?;
        }
        Ok(())
    }

    /// Sends the datagrams the emulated link holds that are due.
    pub(crate) fn flush_link(&mut self) -> io::Result<()> {
        self.link.flush()
    }

    /// Sends what renet has queued.
    pub(crate) fn send_packets(&mut self, client: &mut RenetClient) -> io::Result<()> {
        if self.netcode.is_connected() {
            for packet in client.get_packets_to_send() {
                match self.netcode.generate_payload_packet(&packet) {
                    Ok((addr, payload)) => self.link.send_to(payload, addr)?,
                    Err(_) => break,
                }
            }
        }
        self.link.flush()
    }

    /// Leaves: what is queued goes out, then netcode's disconnect packet, past the emulated
    /// network (a leaving client does not wait out its latency).
    /// Once closed (by this client, the server or a timeout), it sends nothing more.
    pub(crate) fn disconnect(&mut self) {
        if self.netcode.is_disconnected() {
            return;
        }
        let _ = self.link.flush();
        if let Ok((addr, packet)) = self.netcode.disconnect() {
            let _ = self.link.send_unconditioned(packet, addr);
        }
    }
}
