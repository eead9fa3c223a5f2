//! Output primitives of the hot paths: the bytes [`Writer`](super::super::format::Writer)
//! writes, appended to its buffer with fewer capacity checks.

use super::super::format::Tag;

/// Appends a tag and a varint (the hot paths' `Writer::tag` + `Writer::varint`, with one
/// capacity check for the usual one- or two-byte varint).
#[inline(always)]
pub(super) fn put_tagged(out: &mut Vec<u8>, tag: Tag, v: u64) {
    if v < 0x80 {
        out.extend_from_slice(&[tag as u8, v as u8]);
    } else {
        out.push(tag as u8);
        put_varint(out, v);
    }
}

/// Appends a tag and 8 little-endian bytes (`Writer::tag` + `Writer::u64`).
#[inline]
pub(super) fn put_tagged_u64(out: &mut Vec<u8>, tag: Tag, v: u64) {
    let mut b = [0u8; 9];
    b[0] = tag as u8;
    b[1..].copy_from_slice(&v.to_le_bytes());
    out.extend_from_slice(&b);
}

/// Appends `v` as a varint (the format's, as `Writer::varint`).
#[inline]
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A signed integer as the format's varints carry it (zigzag: small magnitudes stay short),
/// as `Writer::i64`.
#[inline(always)]
pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[cfg(test)]
mod tests {
    use super::{put_tagged, put_tagged_u64, put_varint, zigzag};
    use crate::persist::format::{Tag, Writer};

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
    fn tagged_writes_are_the_writers_bytes() {
        for v in SAMPLES {
            let mut w = Writer::default();
            w.tag(Tag::StrRef);
            w.varint(v);
            let mut out = Vec::new();
            put_tagged(&mut out, Tag::StrRef, v);
            assert_eq!(out, w.buf, "{v:#x}");
            let mut w = Writer::default();
            w.tag(Tag::Float);
            w.u64(v);
            out.clear();
            put_tagged_u64(&mut out, Tag::Float, v);
            assert_eq!(out, w.buf, "{v:#x}");
        }
    }

    #[test]
    fn varints_are_the_writers_bytes() {
        for v in SAMPLES {
            let mut w = Writer::default();
            w.varint(v);
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out, w.buf, "{v:#x}");
            let i = v as i64;
            let mut w = Writer::default();
            w.i64(i);
            out.clear();
            put_varint(&mut out, zigzag(i));
            assert_eq!(out, w.buf, "{i}");
        }
    }
}
