//! The fields records are made of: varints (LEB128), zigzag varints for signed values, bytes,
//! 8-byte little-endian words and length-prefixed byte strings. Every read is bounds-checked;
//! every field reader and writer is `#[inline(always)]`, so the hot paths that call them
//! directly (the writer's scan encoders, the loader's batch decoder) cost what hand-written
//! code would.

use super::tag::Tag;

/// Why a record does not decode: the loader's message for it (after "malformed save-game: ").
pub type Bad = &'static str;

/// A signed integer as the format's varints carry it (zigzag: small magnitudes stay short).
#[inline(always)]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The signed integer a zigzag varint carries.
#[inline(always)]
pub fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Appends to a body (or to a layout blob).
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
    /// `buf` starts with room for the header (see [`Writer::file`]).
    pub(super) header: bool,
}

impl Writer {
    #[inline(always)]
    pub fn tag(&mut self, t: Tag) {
        self.buf.push(t as u8);
    }

    #[inline(always)]
    pub fn u8(&mut self, b: u8) {
        self.buf.push(b);
    }

    #[inline(always)]
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    #[inline(always)]
    pub fn i64(&mut self, v: i64) {
        self.varint(zigzag(v));
    }

    #[inline(always)]
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline(always)]
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    /// A tag and a varint: `tag` then `varint`, with one capacity check for the usual one-byte
    /// varint.
    #[inline(always)]
    pub fn tagged(&mut self, tag: Tag, v: u64) {
        if v < 0x80 {
            self.buf.extend_from_slice(&[tag as u8, v as u8]);
        } else {
            self.buf.push(tag as u8);
            self.varint(v);
        }
    }

    /// A tag and an 8-byte word: `tag` then `u64`, in one append.
    #[inline(always)]
    pub fn tagged_u64(&mut self, tag: Tag, v: u64) {
        let mut b = [0u8; 9];
        b[0] = tag as u8;
        b[1..].copy_from_slice(&v.to_le_bytes());
        self.buf.extend_from_slice(&b);
    }
}

/// Reads a body; every read is bounds-checked. `Copy`, so a hot loop can work on a local copy
/// (kept in registers) and write its position back.
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    pub data: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    #[inline(always)]
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// The next byte, not consumed.
    #[inline(always)]
    pub fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    #[inline(always)]
    pub fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// A varint; None, with the reader left where it was, if there is none (truncated, or
    /// more than ten bytes).
    #[inline(always)]
    pub fn varint(&mut self) -> Option<u64> {
        // Most varints (ids, lengths, small integers) are one byte, most others two.
        let b0 = *self.data.get(self.pos)?;
        if b0 < 0x80 {
            self.pos += 1;
            return Some(b0 as u64);
        }
        match self.data.get(self.pos + 1) {
            Some(&b1) if b1 < 0x80 => {
                self.pos += 2;
                Some((b0 & 0x7f) as u64 | (b1 as u64) << 7)
            }
            _ => {
                // By value, not through `self`: a caller's copy of the reader stays in
                // registers.
                let (v, pos) = varint_long(self.data, self.pos)?;
                self.pos = pos;
                Some(v)
            }
        }
    }

    #[inline(always)]
    pub fn i64(&mut self) -> Option<i64> {
        Some(unzigzag(self.varint()?))
    }

    #[inline(always)]
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.data.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some(u64::from_le_bytes(b.try_into().unwrap()))
    }

    /// A byte string; None if its length is not a varint or runs past the end (the reader is
    /// then past the length).
    #[inline(always)]
    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.varint()?;
        if n > self.remaining() as u64 {
            return None;
        }
        let b = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Some(b)
    }
}

/// A varint of any length (at most ten bytes) at `pos`, and the position after it (None, with
/// the reader left where it was, if there is none).
#[cold]
#[inline(never)]
fn varint_long(data: &[u8], mut pos: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *data.get(pos)?;
        pos += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Some((v, pos));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: [u64; 9] = [
        0,
        1,
        0x7f,
        0x80,
        0x3fff,
        0x4000,
        1 << 35,
        u64::MAX >> 1,
        u64::MAX,
    ];

    #[test]
    fn varints_round_trip() {
        let mut w = Writer::default();
        let vals = [0i64, 1, -1, 63, -64, 1 << 40, i64::MIN, i64::MAX];
        for v in vals {
            w.i64(v);
        }
        let mut r = Reader::new(&w.buf);
        for v in vals {
            assert_eq!(r.i64(), Some(v));
        }
        assert_eq!(r.remaining(), 0);
        assert_eq!(Reader::new(&[0xff; 11]).varint(), None);
        // Every length, and encodings with needless continuation bytes, as before.
        for v in [0u64, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX] {
            let mut w = Writer::default();
            w.varint(v);
            let mut r = Reader::new(&w.buf);
            assert_eq!((r.varint(), r.remaining()), (Some(v), 0));
            // Truncated: no value.
            assert_eq!(Reader::new(&w.buf[..w.buf.len() - 1]).varint(), None);
        }
        let mut r = Reader::new(&[0x81, 0x80, 0x00, 7]);
        assert_eq!((r.varint(), r.pos), (Some(1), 3));
        // A varint that is not one (truncated, or more than ten bytes) leaves the reader
        // where it was: errors name the byte where it starts.
        for bad in [&[0x80][..], &[0x80, 0x81], &[0xff; 10], &[0xff; 12]] {
            let mut r = Reader::new(bad);
            assert_eq!((r.varint(), r.pos), (None, 0), "{bad:?}");
        }
    }

    #[test]
    fn tagged_writes_are_a_tag_then_the_field() {
        for v in SAMPLES {
            let mut w = Writer::default();
            w.tag(Tag::StrRef);
            w.varint(v);
            let mut t = Writer::default();
            t.tagged(Tag::StrRef, v);
            assert_eq!(t.buf, w.buf, "{v:#x}");
            let mut w = Writer::default();
            w.tag(Tag::Float);
            w.u64(v);
            let mut t = Writer::default();
            t.tagged_u64(Tag::Float, v);
            assert_eq!(t.buf, w.buf, "{v:#x}");
            let i = v as i64;
            assert_eq!(unzigzag(zigzag(i)), i);
        }
    }
}
