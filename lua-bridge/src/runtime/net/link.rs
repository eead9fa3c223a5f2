//! A UDP socket with an emulated network in front of it: latency, jitter and loss, inside the
//! process, so tests and measurements see a bad network without sending anything anywhere but
//! to the peer.
//!
//! Each datagram, in each direction, is lost with probability `loss` or else held for
//! `latency ± jitter` (uniform, at least zero) before it is sent or delivered; jitter can
//! reorder datagrams, as a real network does. The draws come from a seeded generator, so a
//! run's losses are reproducible for a given seed and order of datagrams.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// The most datagrams one [`Link::receive`] reads off the socket: a flood of datagrams is cut
/// into bounded slices of work (the socket's buffer drops the rest, as UDP may).
pub(crate) const MAX_DATAGRAMS_PER_RECEIVE: usize = 4096;
/// The largest datagram read (netcode's packets are at most 1400 bytes).
const DATAGRAM_BYTES: usize = 1500;

/// A network's conditions, applied to every datagram in each direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConditions {
    /// One-way delay added to each datagram (so the round trip grows by twice this).
    pub latency: Duration,
    /// Each datagram's delay varies uniformly by up to this much either way.
    pub jitter: Duration,
    /// Fraction of datagrams lost (0.0..=1.0), each direction.
    pub loss: f64,
}

impl LinkConditions {
    /// A perfect link: nothing added.
    pub const NONE: LinkConditions = LinkConditions {
        latency: Duration::ZERO,
        jitter: Duration::ZERO,
        loss: 0.0,
    };

    /// Checks the ranges; the message names the option.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.loss) || self.loss.is_nan() {
            return Err(format!(
                "loss must be a fraction 0..=1 (`--loss` takes a percentage 0..=100), got {}",
                self.loss
            ));
        }
        if self.latency > Duration::from_secs(10) || self.jitter > Duration::from_secs(10) {
            return Err("latency and jitter must be at most 10 s".into());
        }
        Ok(())
    }

    fn is_perfect(&self) -> bool {
        self.latency.is_zero() && self.jitter.is_zero() && self.loss == 0.0
    }
}

/// A datagram held back by the emulated network.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    due: Instant,
    order: u64,
    addr: SocketAddr,
    bytes: Vec<u8>,
}

/// A UDP socket behind emulated conditions, counting the bytes it carries.
#[derive(Debug)]
pub(crate) struct Link {
    socket: UdpSocket,
    conditions: LinkConditions,
    rng: u64,
    order: u64,
    outgoing: BinaryHeap<Reverse<Held>>,
    incoming: BinaryHeap<Reverse<Held>>,
    buffer: Vec<u8>,
    /// Datagram bytes handed to the link to send (lost ones included).
    pub(crate) bytes_sent: u64,
    /// Datagram bytes delivered by the link.
    pub(crate) bytes_received: u64,
    /// Datagrams the emulated network dropped, both directions.
    pub(crate) dropped: u64,
}

impl Link {
    /// Wraps a socket (made non-blocking); `seed` drives the emulated network's draws.
    pub(crate) fn new(
        socket: UdpSocket,
        conditions: LinkConditions,
        seed: u64,
    ) -> io::Result<Link> {
        socket.set_nonblocking(true)?;
        Ok(Link {
            socket,
            conditions,
            rng: seed | 1,
            order: 0,
            outgoing: BinaryHeap::new(),
            incoming: BinaryHeap::new(),
            buffer: vec![0; DATAGRAM_BYTES],
            bytes_sent: 0,
            bytes_received: 0,
            dropped: 0,
        })
    }

    /// A uniform draw in 0..1 (xorshift64*).
    fn draw(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// When a datagram passing now is due, or `None` if the network loses it.
    fn fate(&mut self, now: Instant) -> Option<Instant> {
        if self.conditions.loss > 0.0 && self.draw() < self.conditions.loss {
            self.dropped += 1;
            return None;
        }
        let jitter = self.conditions.jitter.as_secs_f64() * (2.0 * self.draw() - 1.0);
        let delay = (self.conditions.latency.as_secs_f64() + jitter).max(0.0);
        Some(now + Duration::from_secs_f64(delay))
    }

    fn hold(&mut self, due: Instant, addr: SocketAddr, bytes: &[u8], incoming: bool) {
        self.order += 1;
        let held = Reverse(Held {
            due,
            order: self.order,
            addr,
            bytes: bytes.to_vec(),
        });
        if incoming {
            self.incoming.push(held);
        } else {
            self.outgoing.push(held);
        }
    }

    /// Sends a datagram to `addr` through the emulated network. A failure of the socket
    /// itself is returned; loss is not a failure.
    pub(crate) fn send_to(&mut self, bytes: &[u8], addr: SocketAddr) -> io::Result<()> {
        self.bytes_sent += bytes.len() as u64;
        if self.conditions.is_perfect() {
            return self.send_now(bytes, addr);
        }
        let now = Instant::now();
        match self.fate(now) {
            Some(due) if due <= now => self.send_now(bytes, addr),
            Some(due) => {
                self.hold(due, addr, bytes, false);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Sends a datagram at once, past the emulated network (a last word before leaving).
    pub(crate) fn send_unconditioned(&mut self, bytes: &[u8], addr: SocketAddr) -> io::Result<()> {
        self.bytes_sent += bytes.len() as u64;
        self.send_now(bytes, addr)
    }

    fn send_now(&self, bytes: &[u8], addr: SocketAddr) -> io::Result<()> {
        match self.socket.send_to(bytes, addr) {
            Ok(_) => Ok(()),
            // The peer's port is closed (it left), or the socket's buffer is full: as a lost
            // datagram.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::WouldBlock
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Sends the held datagrams that are due.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        let now = Instant::now();
        while self.outgoing.peek().is_some_and(|h| h.0.due <= now) {
            let Reverse(h) = self.outgoing.pop().expect("peeked");
            self.send_now(&h.bytes, h.addr)?;
        }
        Ok(())
    }

    /// Reads what the socket holds (at most [`MAX_DATAGRAMS_PER_RECEIVE`] datagrams), passes
    /// it through the emulated network, and returns the datagrams now due, oldest first.
    pub(crate) fn receive(&mut self) -> io::Result<Vec<(SocketAddr, Vec<u8>)>> {
        let now = Instant::now();
        let mut out = Vec::new();
        for _ in 0..MAX_DATAGRAMS_PER_RECEIVE {
            let (n, addr) = match self.socket.recv_from(&mut self.buffer) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => break,
                // An ICMP "port unreachable" of an earlier send (a peer that left).
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e),
            };
            if self.conditions.is_perfect() {
                self.bytes_received += n as u64;
                out.push((addr, self.buffer[..n].to_vec()));
                continue;
            }
            if let Some(due) = self.fate(now) {
                let bytes = self.buffer[..n].to_vec();
                self.hold(due, addr, &bytes, true);
            }
        }
        while self.incoming.peek().is_some_and(|h| h.0.due <= now) {
            let Reverse(h) = self.incoming.pop().expect("peeked");
            self.bytes_received += h.bytes.len() as u64;
            out.push((h.addr, h.bytes));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(c: LinkConditions) -> (Link, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        b.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        (Link::new(a, c, 42).unwrap(), b)
    }

    #[test]
    fn latency_holds_datagrams_until_due() {
        let c = LinkConditions {
            latency: Duration::from_millis(60),
            ..LinkConditions::NONE
        };
        let (mut link, peer) = pair(c);
        let to = peer.local_addr().unwrap();
        link.send_to(b"hi", to).unwrap();
        link.flush().unwrap();
        peer.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        assert!(peer.recv_from(&mut buf).is_err(), "not before the latency");
        std::thread::sleep(Duration::from_millis(80));
        link.flush().unwrap();
        peer.set_nonblocking(false).unwrap();
        let (n, _) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi");
    }

    #[test]
    fn loss_drops_about_its_fraction() {
        let c = LinkConditions {
            loss: 0.25,
            ..LinkConditions::NONE
        };
        let (mut link, peer) = pair(c);
        let to = peer.local_addr().unwrap();
        for _ in 0..2000 {
            link.send_to(b"x", to).unwrap();
        }
        assert!(
            (350..650).contains(&link.dropped),
            "dropped {} of 2000",
            link.dropped
        );
        assert!(LinkConditions {
            loss: 1.5,
            ..LinkConditions::NONE
        }
        .validate()
        .is_err());
    }
}
