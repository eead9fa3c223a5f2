//! The save-game format: a header, then a body of tagged values.
//!
//! ```text
//! header (50 bytes, little-endian):
//!   magic        8   "LUASNAPS"
//!   format       u16 FORMAT_VERSION
//!   lua          u32 50501 (Lua 5.5.1: the exact release, since prototypes are matched structurally)
//!   int_size     u8  8      number formats of the writer
//!   num_size     u8  8
//!   int_check    i64 0x0102030405060708
//!   num_check    f64 -370.5
//!   flags        u8  bit 0: contains bytecode; bit 1: contains source text
//!   reserved     u8
//!   body_len     u64
//!   checksum     u64 XXH3-64 of the body
//! body: one value (the root), depth first; see `Tag`.
//! ```
//!
//! Every object gets the next id (0, 1, ...) at its first occurrence, in the same order when
//! writing and reading; later occurrences are `Ref(id)`. Strings are numbered apart: each `Str`
//! of at least [`min_strref_len`] bytes gets the next string id, and a later occurrence of the
//! same string is `StrRef(sid)`. That length is 1 from format 3 on (every string but the empty
//! one: a reference loads without hashing and interning the bytes again) and 4 in format 2;
//! format 1 files have no `StrRef` and read as format 2. Tables list their metatable, then
//! key-value pairs, then `Nil` in key position.
//!
//! A Lua closure names its prototype by index; the first occurrence of a prototype (format 4)
//! gives its fingerprint, its line, and its home:
//!
//! ```text
//! LClosure index [fingerprint u64, line, home] nupvalues upvalues...
//! home 0:      detached (compiled outside the chunk registry): short source, bytecode or empty
//! home c + 1:  chunk c; the first time: kind u8 (0 source text, 1 binary), chunk name,
//!              main fingerprint u64, code (the text or binary chunk, or empty); then
//!              the path: depth, then depth child indices from the chunk's main prototype
//! ```
//!
//! Formats 1 to 3 gave each new prototype its fingerprint, short source, line and bytecode.

use xxhash_rust::xxh3::xxh3_64;

/// Identifies a save-game.
pub const MAGIC: &[u8; 8] = b"LUASNAPS";
/// Version of this format. Files of other versions are refused with a clear error.
pub const FORMAT_VERSION: u16 = 5;
/// The oldest format version this build still reads (formats 2 and 3 only added and widened
/// `StrRef`).
pub const OLDEST_FORMAT_VERSION: u16 = 1;
/// The Lua release whose prototypes the file refers to (`LUA_VERSION_RELEASE_NUM`).
pub const LUA_RELEASE: u32 = 50501;
/// Length of the header.
pub const HEADER_LEN: usize = 50;
const INT_CHECK: i64 = 0x0102_0304_0506_0708;
const NUM_CHECK: f64 = -370.5;
/// Flag: the file carries bytecode (binary chunks, functions outside any chunk).
pub const FLAG_BYTECODE: u8 = 1;
/// Flag: the file carries source text (from format 4 on).
pub const FLAG_SOURCE: u8 = 2;

/// Strings at least this long are written once and referred to afterwards, in files of this
/// build's format.
pub const MIN_STRREF_LEN: usize = 1;

/// The string length from which a file of format `format` numbers its strings.
pub fn min_strref_len(format: u16) -> usize {
    if format >= 3 {
        1
    } else {
        4
    }
}

/// A file whose header checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened<'a> {
    pub body: &'a [u8],
    pub flags: u8,
    pub format: u16,
}

/// Value tags.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Nil = 0,
    False = 1,
    True = 2,
    Int = 3,
    Float = 4,
    Str = 5,
    Light = 6,
    StrRef = 7,
    Ref = 10,
    Perm = 11,
    Table = 20,
    LClosure = 21,
    CClosure = 22,
    UdBytes = 23,
    UdPlain = 24,
    Thunk = 25,
    TwoPhase = 26,
    /// Ends a table's entries like `Nil`, followed by the layout of its hash part (bytes).
    Layout = 27,
    Thread = 29,
    MainThread = 32,
    UpvalNew = 40,
    UpvalRef = 41,
    UpvalOpen = 42,
}

impl Tag {
    pub fn from_u8(b: u8) -> Option<Tag> {
        use Tag::*;
        Some(match b {
            0 => Nil,
            1 => False,
            2 => True,
            3 => Int,
            4 => Float,
            5 => Str,
            6 => Light,
            7 => StrRef,
            10 => Ref,
            11 => Perm,
            20 => Table,
            21 => LClosure,
            22 => CClosure,
            23 => UdBytes,
            24 => UdPlain,
            25 => Thunk,
            26 => TwoPhase,
            27 => Layout,
            29 => Thread,
            32 => MainThread,
            40 => UpvalNew,
            41 => UpvalRef,
            42 => UpvalOpen,
            _ => return None,
        })
    }
}

/// Coroutine states in the file.
pub const THREAD_NOT_STARTED: u8 = 0;
pub const THREAD_DEAD: u8 = 1;
pub const THREAD_SUSPENDED: u8 = 2;

/// Appends to a body.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
    /// `buf` starts with room for the header (see [`Writer::file`]).
    header: bool,
}

impl Writer {
    /// A writer for a whole file: the header's room comes first, so [`finish`](Self::finish)
    /// fills it in place instead of copying the body behind a new header.
    pub fn file() -> Self {
        Writer {
            buf: vec![0; HEADER_LEN],
            header: true,
        }
    }

    #[inline]
    pub fn tag(&mut self, t: Tag) {
        self.buf.push(t as u8);
    }

    #[inline]
    pub fn u8(&mut self, b: u8) {
        self.buf.push(b);
    }

    #[inline]
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    #[inline]
    pub fn i64(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }

    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    /// The complete file: header plus this body.
    pub fn finish(self, flags: u8) -> Vec<u8> {
        let body_at = if self.header { HEADER_LEN } else { 0 };
        let body = &self.buf[body_at..];
        let mut h = [0u8; HEADER_LEN];
        let fields: [&[u8]; 9] = [
            MAGIC,
            &FORMAT_VERSION.to_le_bytes(),
            &LUA_RELEASE.to_le_bytes(),
            &[8, 8],
            &INT_CHECK.to_le_bytes(),
            &NUM_CHECK.to_le_bytes(),
            &[flags, 0],
            &(body.len() as u64).to_le_bytes(),
            &xxh3_64(body).to_le_bytes(),
        ];
        let mut at = 0;
        for f in fields {
            h[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        debug_assert_eq!(at, HEADER_LEN);
        if self.header {
            let mut out = self.buf;
            out[..HEADER_LEN].copy_from_slice(&h);
            out
        } else {
            let mut out = Vec::with_capacity(HEADER_LEN + self.buf.len());
            out.extend_from_slice(&h);
            out.extend_from_slice(&self.buf);
            out
        }
    }
}

/// Why a file's header is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    Truncated { len: usize },
    Magic,
    Format { found: u16 },
    Lua { found: u32 },
    Numbers,
    Length { declared: u64, actual: usize },
    Checksum,
}

/// Checks the header and returns the body, flags and format version.
pub fn open(file: &[u8]) -> Result<Opened<'_>, HeaderError> {
    if file.len() < HEADER_LEN {
        if file.len() >= 8 && &file[..8] != MAGIC {
            return Err(HeaderError::Magic);
        }
        return Err(HeaderError::Truncated { len: file.len() });
    }
    if &file[..8] != MAGIC {
        return Err(HeaderError::Magic);
    }
    let u16_at = |i: usize| u16::from_le_bytes(file[i..i + 2].try_into().unwrap());
    let u32_at = |i: usize| u32::from_le_bytes(file[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(file[i..i + 8].try_into().unwrap());
    let format = u16_at(8);
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&format) {
        return Err(HeaderError::Format { found: format });
    }
    let lua = u32_at(10);
    if lua != LUA_RELEASE {
        return Err(HeaderError::Lua { found: lua });
    }
    if file[14] != 8
        || file[15] != 8
        || u64_at(16) as i64 != INT_CHECK
        || f64::from_bits(u64_at(24)) != NUM_CHECK
    {
        return Err(HeaderError::Numbers);
    }
    let flags = file[32];
    let len = u64_at(34);
    let body = &file[HEADER_LEN..];
    if len != body.len() as u64 {
        return Err(HeaderError::Length {
            declared: len,
            actual: body.len(),
        });
    }
    if xxh3_64(body) != u64_at(42) {
        return Err(HeaderError::Checksum);
    }
    Ok(Opened {
        body,
        flags,
        format,
    })
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

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// The next byte, not consumed.
    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    #[inline]
    pub fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    #[inline]
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

    #[inline]
    pub fn i64(&mut self) -> Option<i64> {
        let z = self.varint()?;
        Some(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    #[inline]
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.data.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some(u64::from_le_bytes(b.try_into().unwrap()))
    }

    #[inline]
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
    fn header_checks() {
        let mut w = Writer::default();
        w.tag(Tag::True);
        let file = w.finish(0);
        let opened = open(&file).unwrap();
        assert_eq!(
            (opened.body, opened.flags, opened.format),
            (&[Tag::True as u8][..], 0, FORMAT_VERSION)
        );
        let mut bad = file.clone();
        bad[HEADER_LEN] ^= 1;
        assert_eq!(open(&bad), Err(HeaderError::Checksum));
        let mut v2 = file.clone();
        v2[8] = 9;
        assert_eq!(open(&v2), Err(HeaderError::Format { found: 9 }));
        assert_eq!(open(&file[..20]), Err(HeaderError::Truncated { len: 20 }));
        assert_eq!(
            open(b"PK\x03\x04 not a save game at all, sorry!!!!!!!!!!!!!!!!!!!!"),
            Err(HeaderError::Magic)
        );
    }
}
