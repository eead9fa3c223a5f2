//! The file header (see the module docs): written in place in front of the body, checked
//! before anything is built.

use super::wire::Writer;
use xxhash_rust::xxh3::xxh3_64;

/// Identifies a save-game.
pub const MAGIC: &[u8; 8] = b"LUASNAPS";
/// Version of this format. Files of other versions are refused with a clear error.
pub const FORMAT_VERSION: u16 = 11;
/// The first format whose whole-game saves may carry, after the root, the objects awaiting
/// finalization that nothing else reaches ([`Pending`](super::Pending)).
pub const PENDING_FORMAT: u16 = 9;
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
/// Flag: the file's places write a key that is no Lua name quoted (`M["a.b"]`), so no two
/// functions of one version share one; without it (files before), `M["a.b"]` reads `M.a.b`.
pub const FLAG_QUOTED_PLACES: u8 = 4;

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

impl Writer {
    /// A writer for a whole file: the header's room comes first, so [`finish`](Self::finish)
    /// fills it in place instead of copying the body behind a new header.
    pub fn file() -> Self {
        Writer {
            buf: vec![0; HEADER_LEN],
            header: true,
        }
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

/// Checks every field of the header at the start of `file` but the body's length and checksum,
/// and returns the flags, the format version and the body length the header declares: what a
/// reader can check from the first [`HEADER_LEN`] bytes alone, before it reads the body.
pub fn check_head(file: &[u8]) -> Result<(u8, u16, u64), HeaderError> {
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
    Ok((file[32], format, u64_at(34)))
}

/// Checks the header and returns the body, flags and format version.
pub fn open(file: &[u8]) -> Result<Opened<'_>, HeaderError> {
    let (flags, format, len) = check_head(file)?;
    let body = &file[HEADER_LEN..];
    if len != body.len() as u64 {
        return Err(HeaderError::Length {
            declared: len,
            actual: body.len(),
        });
    }
    let checksum = u64::from_le_bytes(file[42..HEADER_LEN].try_into().unwrap());
    if xxh3_64(body) != checksum {
        return Err(HeaderError::Checksum);
    }
    Ok(Opened {
        body,
        flags,
        format,
    })
}

/// `file` with the body length and checksum of its header written for the body it has: `None`
/// when they match already. Every other field must check out as [`open`] checks it.
pub fn reseal(file: &[u8]) -> Result<Option<Vec<u8>>, HeaderError> {
    match open(file) {
        Ok(_) => return Ok(None),
        Err(HeaderError::Length { .. } | HeaderError::Checksum) => {}
        Err(e) => return Err(e),
    }
    let body = &file[HEADER_LEN..];
    let mut out = file.to_vec();
    out[34..42].copy_from_slice(&(body.len() as u64).to_le_bytes());
    out[42..HEADER_LEN].copy_from_slice(&xxh3_64(body).to_le_bytes());
    debug_assert!(open(&out).is_ok());
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::super::Tag;
    use super::*;

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
        let next = FORMAT_VERSION + 1;
        v2[8..10].copy_from_slice(&next.to_le_bytes());
        assert_eq!(open(&v2), Err(HeaderError::Format { found: next }));
        assert_eq!(open(&file[..20]), Err(HeaderError::Truncated { len: 20 }));
        assert_eq!(
            open(b"PK\x03\x04 not a save game at all, sorry!!!!!!!!!!!!!!!!!!!!"),
            Err(HeaderError::Magic)
        );
    }

    #[test]
    fn reseal_writes_only_the_length_and_checksum() {
        let mut w = Writer::default();
        w.tag(Tag::True);
        let file = w.finish(0);
        assert_eq!(reseal(&file), Ok(None));
        let mut edited = file.clone();
        edited[HEADER_LEN] = Tag::False as u8;
        edited.push(Tag::Nil as u8);
        let sealed = reseal(&edited).unwrap().expect("resealed");
        assert_eq!(open(&sealed).unwrap().body, &edited[HEADER_LEN..]);
        assert_eq!(sealed[..34], file[..34], "no other header field changes");
        let mut v2 = edited.clone();
        let next = FORMAT_VERSION + 1;
        v2[8..10].copy_from_slice(&next.to_le_bytes());
        assert_eq!(reseal(&v2), Err(HeaderError::Format { found: next }));
        assert_eq!(reseal(&file[..20]), Err(HeaderError::Truncated { len: 20 }));
    }
}
