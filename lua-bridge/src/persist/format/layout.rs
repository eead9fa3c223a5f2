//! Table layouts (format 5): the hash part of a table as it was saved, so `next` visits the
//! loaded table's entries in the saved order. A table's entries end with `Tag::Layout` and a
//! byte string, the blob:
//!
//! ```text
//! LayoutHeader: seed, node count (a power of two), lastfree
//! then per node a LayoutNode:
//!   0                       free
//!   2, link, RemovedKey     removed: its chain link, then its dead key (kind, then payload)
//!   code >= 1, link         otherwise: the entry's code and its chain link (zigzag)
//! ```
//!
//! Decoding checks only the blob's shape (sizes, codes and links inside the node count, every
//! byte used); the loader's C side checks the layout against the table's entries and places
//! nothing unless it matches, so a forged layout can only make a load fail. The codes are
//! `luasnap_table_layout`'s (csrc/tscan.c).

use super::wire::{unzigzag, zigzag, Bad, Reader, Writer};
use crate::bridge::helpers::kind;

/// Why a layout's bytes are refused.
pub const BAD_LAYOUT: Bad = "a table layout that is not one (bad sizes or links)";

/// The start of a layout blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutHeader {
    /// The hash seed of the VM that wrote it (a layout applies only under the same seed).
    pub seed: u32,
    /// The node count.
    pub size: u32,
    /// The index below which insertions look for free nodes (`size` if none).
    pub lastfree: u32,
}

impl LayoutHeader {
    #[inline(always)]
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.seed as u64);
        w.varint(self.size as u64);
        w.varint(self.lastfree as u64);
    }

    /// The header of a blob of `blob_len` bytes: every node takes at least one byte, sizes
    /// are powers of two below 2^31.
    #[inline(always)]
    pub fn decode(r: &mut Reader<'_>, blob_len: usize) -> Option<Self> {
        let (seed, size, lastfree) = (r.varint()?, r.varint()?, r.varint()?);
        if seed > u32::MAX as u64
            || size < 2
            || !size.is_power_of_two()
            || size > (1 << 30)
            || size > blob_len as u64
            || lastfree > size
        {
            return None;
        }
        Some(LayoutHeader {
            seed: seed as u32,
            size: size as u32,
            lastfree: lastfree as u32,
        })
    }
}

/// One node of a layout: its code and chain link (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutNode {
    pub code: u32,
    pub link: i32,
}

impl LayoutNode {
    /// The code of a removed entry whose key is not written here: dead (cleared by a
    /// collection), an object or a light C function (format 10 on, the file may give it its
    /// key after the root: [`RemovedKeys`](super::RemovedKeys)).
    pub const KEY_ELSEWHERE: u32 = 1;
    /// The code of a removed entry whose dead key follows ([`RemovedKey`]).
    pub const REMOVED: u32 = 2;

    #[inline(always)]
    pub fn encode(&self, w: &mut Writer) {
        w.varint(self.code as u64);
        if self.code != 0 {
            w.varint(zigzag(self.link as i64));
        }
    }

    /// A node of a layout of `size` nodes: its code at most `size + 2`, its link below `size`
    /// either way.
    #[inline(always)]
    pub fn decode(r: &mut Reader<'_>, size: u32) -> Option<Self> {
        let c = r.varint().filter(|&c| c <= size as u64 + 2)?;
        if c == 0 {
            return Some(LayoutNode { code: 0, link: 0 });
        }
        let v = unzigzag(r.varint()?);
        if v.unsigned_abs() >= size as u64 {
            return None;
        }
        Some(LayoutNode {
            code: c as u32,
            link: v as i32,
        })
    }
}

/// The dead key of a removed entry (a later `t[k] = v` reuses its node): a boolean, number or
/// string. Its kind is one of the [`kind`] codes the C helpers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovedKey<B> {
    False,
    True,
    Int(i64),
    /// By its bits (never NaN).
    Float(u64),
    Str(B),
}

impl<B: AsRef<[u8]>> RemovedKey<B> {
    pub fn encode(&self, w: &mut Writer) {
        match self {
            RemovedKey::False => w.varint(kind::FALSE),
            RemovedKey::True => w.varint(kind::TRUE),
            RemovedKey::Int(i) => {
                w.varint(kind::INT);
                w.varint(zigzag(*i));
            }
            RemovedKey::Float(bits) => {
                w.varint(kind::FLOAT);
                w.varint(*bits);
            }
            RemovedKey::Str(b) => {
                w.varint(kind::STR);
                w.bytes(b.as_ref());
            }
        }
    }
}

impl<'a> RemovedKey<&'a [u8]> {
    /// The key's kind (the first part of decoding: a loader makes room for the key before it
    /// reads the rest).
    pub fn kind(r: &mut Reader<'_>) -> Option<u64> {
        r.varint()
    }

    /// The rest of a key of kind `k`.
    pub fn payload(k: u64, r: &mut Reader<'a>) -> Option<Self> {
        Some(match k {
            kind::FALSE => RemovedKey::False,
            kind::TRUE => RemovedKey::True,
            kind::INT => RemovedKey::Int(unzigzag(r.varint()?)),
            kind::FLOAT => match r.varint()? {
                b if f64::from_bits(b).is_nan() => return None,
                b => RemovedKey::Float(b),
            },
            kind::STR => RemovedKey::Str(r.bytes()?),
            _ => return None,
        })
    }
}

/// Decodes the nodes of a layout of `size` nodes into `codes` and `links` (one per node), as
/// [`LayoutNode::decode`] would, refusing removed keys (code 2): the reader's position after
/// them, or None. The loader's batch decoder's, apart from its loop and by value, for registers
/// of its own.
#[inline(never)]
pub fn layout_nodes(
    mut r: Reader<'_>,
    size: u32,
    codes: &mut [u32],
    links: &mut [i32],
) -> Option<usize> {
    let size = size as u64;
    for (c, nx) in codes.iter_mut().zip(links) {
        let code = r.varint()?;
        if code > size + 2 || code == LayoutNode::REMOVED as u64 {
            return None;
        }
        if code == 0 {
            (*c, *nx) = (0, 0);
            continue;
        }
        // The link, zigzag-coded: |link| = z / 2 + (z & 1), below the node count.
        let z = r.varint()?;
        if (z >> 1) + (z & 1) >= size {
            return None;
        }
        (*c, *nx) = (code as u32, unzigzag(z) as i32);
    }
    Some(r.pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(nodes: &[(u32, i32)]) -> Vec<u8> {
        let mut w = Writer::default();
        for &(code, link) in nodes {
            LayoutNode { code, link }.encode(&mut w);
        }
        w.buf
    }

    /// `layout_nodes` over `bytes`, and `LayoutNode::decode` node by node: the same nodes (or
    /// both refuse), except that only the latter takes removed keys.
    fn both(bytes: &[u8], size: u32) -> Option<(usize, Vec<u32>, Vec<i32>)> {
        let (mut c, mut l) = (vec![9; size as usize], vec![9; size as usize]);
        let fast = layout_nodes(Reader::new(bytes), size, &mut c, &mut l).map(|end| (end, c, l));
        let mut r = Reader::new(bytes);
        let slow: Option<Vec<LayoutNode>> = (0..size)
            .map(|_| LayoutNode::decode(&mut r, size).filter(|n| n.code != LayoutNode::REMOVED))
            .collect();
        let slow = slow.map(|nodes| {
            let codes = nodes.iter().map(|n| n.code).collect();
            let links = nodes.iter().map(|n| n.link).collect();
            (r.pos, codes, links)
        });
        assert_eq!(fast, slow, "{bytes:?}");
        fast
    }

    #[test]
    fn layout_nodes_decode_as_layout_node_does() {
        let ok = enc(&[(0, 0), (3, -3), (5, 3), (1, 0)]);
        assert_eq!(
            both(&ok, 4),
            Some((ok.len(), vec![0, 3, 5, 1], vec![0, -3, 3, 0]))
        );
        // Links at the node count either way, codes past it, removed keys, truncation.
        assert_eq!(both(&enc(&[(3, 4), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(both(&enc(&[(3, -4), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(both(&enc(&[(7, 0), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(both(&enc(&[(2, 0), (0, 0), (0, 0), (0, 0)]), 4), None);
        assert_eq!(both(&ok[..ok.len() - 1], 4), None);
        // A link of i64::MIN (zigzag u64::MAX) is refused, not wrapped.
        let mut w = Writer::default();
        w.varint(3);
        w.varint(u64::MAX);
        assert_eq!(both(&w.buf, 1), None);
    }

    #[test]
    fn headers_and_removed_keys_round_trip() {
        let h = LayoutHeader {
            seed: 77,
            size: 8,
            lastfree: 8,
        };
        let mut w = Writer::default();
        h.encode(&mut w);
        w.buf.extend_from_slice(&[0; 8]);
        let mut r = Reader::new(&w.buf);
        assert_eq!(LayoutHeader::decode(&mut r, w.buf.len()), Some(h));
        // Eight nodes cannot fit in fewer than eight bytes.
        assert_eq!(LayoutHeader::decode(&mut Reader::new(&w.buf), 7), None);
        let keys: [RemovedKey<&[u8]>; 5] = [
            RemovedKey::False,
            RemovedKey::True,
            RemovedKey::Int(-5),
            RemovedKey::Float(2.5f64.to_bits()),
            RemovedKey::Str(b"k1"),
        ];
        for k in keys {
            let mut w = Writer::default();
            k.encode(&mut w);
            let mut r = Reader::new(&w.buf);
            let kind = RemovedKey::kind(&mut r).unwrap();
            assert_eq!(RemovedKey::payload(kind, &mut r), Some(k));
            assert_eq!(r.remaining(), 0);
        }
        let mut w = Writer::default();
        RemovedKey::<&[u8]>::Float(f64::NAN.to_bits()).encode(&mut w);
        let mut r = Reader::new(&w.buf);
        let kind = RemovedKey::kind(&mut r).unwrap();
        assert_eq!(RemovedKey::payload(kind, &mut r), None, "NaN");
    }
}
