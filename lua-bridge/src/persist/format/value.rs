//! The values without children (`Scalar`): a tag and at most one field.

use super::tag::Tag;
use super::wire::{Bad, Reader, Writer};

/// A value without children: a primitive, a string, a light userdata, or a reference to a
/// string or object written before. `B` holds a string's bytes (a slice of the body when
/// decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar<B> {
    Nil,
    False,
    True,
    Int(i64),
    /// A float, by its bits (NaN payloads and -0.0 kept).
    Float(u64),
    Str(B),
    Light(u64),
    /// A string id.
    StrRef(u64),
    /// An object id.
    Ref(u64),
}

impl<B: AsRef<[u8]>> Scalar<B> {
    /// Writes the tag and the field.
    #[inline(always)]
    pub fn encode(&self, w: &mut Writer) {
        match self {
            Scalar::Nil => w.tag(Tag::Nil),
            Scalar::False => w.tag(Tag::False),
            Scalar::True => w.tag(Tag::True),
            Scalar::Int(v) => w.tagged(Tag::Int, super::wire::zigzag(*v)),
            Scalar::Float(bits) => w.tagged_u64(Tag::Float, *bits),
            Scalar::Str(b) => {
                let b = b.as_ref();
                w.tagged(Tag::Str, b.len() as u64);
                w.buf.extend_from_slice(b);
            }
            Scalar::Light(p) => w.tagged_u64(Tag::Light, *p),
            Scalar::StrRef(sid) => w.tagged(Tag::StrRef, *sid),
            Scalar::Ref(id) => w.tagged(Tag::Ref, *id),
        }
    }
}

impl<'a> Scalar<&'a [u8]> {
    /// The scalar whose tag, `tag`, was just read: its field. (A string id or an object id is
    /// not checked against what was defined: that is the reader's to do.)
    #[inline(always)]
    pub fn decode(tag: Tag, r: &mut Reader<'a>) -> Result<Self, Bad> {
        Ok(match tag {
            Tag::Nil => Scalar::Nil,
            Tag::False => Scalar::False,
            Tag::True => Scalar::True,
            Tag::Int => Scalar::Int(r.i64().ok_or("bad integer")?),
            Tag::Float => Scalar::Float(r.u64().ok_or("bad float")?),
            Tag::Str => Scalar::Str(r.bytes().ok_or("bad string length")?),
            Tag::Light => Scalar::Light(r.u64().ok_or("bad light userdata")?),
            Tag::StrRef => Scalar::StrRef(r.varint().ok_or("bad string reference")?),
            Tag::Ref => Scalar::Ref(r.varint().ok_or("bad reference")?),
            _ => return Err("not a scalar"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_round_trip_and_report_their_field() {
        let all: [Scalar<&[u8]>; 9] = [
            Scalar::Nil,
            Scalar::False,
            Scalar::True,
            Scalar::Int(-300),
            Scalar::Float((-0.0f64).to_bits()),
            Scalar::Str(b"abc"),
            Scalar::Light(0xdead_beef),
            Scalar::StrRef(200),
            Scalar::Ref(7),
        ];
        for s in all {
            let mut w = Writer::default();
            s.encode(&mut w);
            let mut r = Reader::new(&w.buf);
            let tag = Tag::from_u8(r.u8().unwrap()).unwrap();
            assert_eq!(Scalar::decode(tag, &mut r), Ok(s));
            assert_eq!(r.remaining(), 0);
            // Truncated after the tag: the field's message, the reader at the field (a string
            // past its length).
            if w.buf.len() > 1 {
                let mut r = Reader::new(&w.buf[1..w.buf.len() - 1]);
                assert!(Scalar::decode(tag, &mut r).is_err(), "{s:?}");
            }
        }
        assert_eq!(
            Scalar::decode(Tag::Table, &mut Reader::new(&[])),
            Err("not a scalar")
        );
    }
}
