//! serde support: any `Serialize` type into a [`Value`], any `Deserialize` type out of one.
//!
//! Structs and maps are tables with string keys; sequences, tuples and tuple structs are
//! sequence tables (`{1, 2, 3}`); `None` and `()` are `nil`; a unit enum variant is its name as a
//! string, other variants a one-entry table `{ Variant = value }` (serde's externally tagged
//! form). Integers keep Lua's integer type, floats its float type; a float holding an exact
//! integer reads into an integer field, an integer into a float field.
//!
//! A sequence holding `None`s (`vec![Some(1), None]`) would leave holes or lose its trailing
//! `None`s, so it is written with its length in `n`, like `table.pack` does:
//! `{ 1, nil, n = 2 }`. Sequences are read up to `n` when present, else up to the largest
//! integer key, holes reading as `None` (`{ 1, nil, 3 }` from Lua reads as
//! `[Some(1), None, Some(3)]`); other keys, or lengths far beyond the entries, are refused.
//! A conversion error names the failing part's path and its own type (`'p.hp' is the integer
//! 300, expected u8`).
//!
//! ```
//! use luasnap_bridge::{Serde, Vm};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Player { name: String, hp: u16, pos: (f64, f64), tags: Vec<String> }
//!
//! let vm = Vm::builder().capacity(64 << 20).build()?;
//! vm.set("p", Serde(Player { name: "ann".into(), hp: 3, pos: (1.0, 2.5), tags: vec![] }))?;
//! vm.exec("p.hp = p.hp + 1", "t")?;
//! let Serde(p) = vm.get::<Serde<Player>>("p")?;
//! assert_eq!(p.hp, 4);
//! vm.exec("p.hp = -1", "t")?;
//! let err = vm.get::<Serde<Player>>("p").unwrap_err();
//! assert!(err.to_string().contains("p.hp"), "{err}");
//! # Ok::<(), luasnap_bridge::VmError>(())
//! ```

use crate::bridge::convert::{describe, Arg, FromLua, IntoLua};
use crate::bridge::error::VmError;
use crate::bridge::value::{Table, Value};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde::ser::{self, Serialize};
use std::fmt;

/// A value converted with serde: `vm.get::<Serde<T>>(path)`, `vm.set(path, Serde(value))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Serde<T>(pub T);

impl<T: DeserializeOwned> FromLua for Serde<T> {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        from_value(value).map(Serde)
    }
}

impl<'h, T: Serialize> IntoLua<'h> for Serde<T> {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        to_value(&self.0).map(Arg::value)
    }
}

/// Converts any `Serialize` value into a [`Value`].
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, VmError> {
    value
        .serialize(Serializer)
        .map_err(|e| VmError::Conversion {
            what: format!("a {} into Lua: {}", std::any::type_name::<T>(), e.message),
        })
}

/// Converts a [`Value`] into any `Deserialize` type. Errors are [`VmError::Type`] naming the
/// position inside the value (`.players[2].hp`).
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, VmError> {
    T::deserialize(Deserializer {
        value,
        path: String::new(),
    })
    .map_err(|e| VmError::Type {
        path: e.path.unwrap_or_default(),
        // The failing part's type (`u8` for a struct's `hp` field), else the whole type.
        expected: e
            .expected
            .unwrap_or_else(|| std::any::type_name::<T>().to_string()),
        found: e.found.unwrap_or_else(|| "a value".into()),
        reason: Some(e.message),
    })
}

/// A serde error, with where it happened once known.
#[derive(Debug)]
pub struct Error {
    message: String,
    path: Option<String>,
    found: Option<String>,
    /// What the failing part expected (`u8`), when serde says.
    expected: Option<String>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error {
            message: msg.to_string(),
            path: None,
            found: None,
            expected: None,
        }
    }
}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        <Error as ser::Error>::custom(msg)
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Error {
            expected: Some(exp.to_string()),
            ..<Error as ser::Error>::custom(format_args!("invalid type: {unexp}, expected {exp}"))
        }
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Error {
            expected: Some(exp.to_string()),
            ..<Error as ser::Error>::custom(format_args!("invalid value: {unexp}, expected {exp}"))
        }
    }
}

impl Error {
    fn at(mut self, path: &str, found: impl FnOnce() -> String) -> Error {
        if self.path.is_none() {
            self.path = Some(path.to_string());
            self.found = Some(found());
        }
        self
    }
}

// ----- Rust -> Value -----

struct Serializer;

fn ser_err(msg: impl Into<String>) -> Error {
    Error {
        message: msg.into(),
        path: None,
        found: None,
        expected: None,
    }
}

fn variant(name: &str, v: Value) -> Value {
    Value::Table(Table::new().with(name, v))
}

impl ser::Serializer for Serializer {
    type Ok = Value;
    type Error = Error;
    type SerializeSeq = SeqSer;
    type SerializeTuple = SeqSer;
    type SerializeTupleStruct = SeqSer;
    type SerializeTupleVariant = SeqSer;
    type SerializeMap = MapSer;
    type SerializeStruct = MapSer;
    type SerializeStructVariant = MapSer;

    fn serialize_bool(self, v: bool) -> Result<Value, Error> {
        Ok(Value::Boolean(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Value, Error> {
        Ok(Value::Integer(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<Value, Error> {
        Ok(Value::Integer(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<Value, Error> {
        Ok(Value::Integer(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<Value, Error> {
        Ok(Value::Integer(v))
    }
    fn serialize_i128(self, v: i128) -> Result<Value, Error> {
        i64::try_from(v)
            .map(Value::Integer)
            .map_err(|_| ser_err(format!("{v} does not fit a Lua integer (i64)")))
    }
    fn serialize_u8(self, v: u8) -> Result<Value, Error> {
        Ok(Value::Integer(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Value, Error> {
        Ok(Value::Integer(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Value, Error> {
        Ok(Value::Integer(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Value, Error> {
        self.serialize_i128(v.into())
    }
    fn serialize_u128(self, v: u128) -> Result<Value, Error> {
        i64::try_from(v)
            .map(Value::Integer)
            .map_err(|_| ser_err(format!("{v} does not fit a Lua integer (i64)")))
    }
    fn serialize_f32(self, v: f32) -> Result<Value, Error> {
        Ok(Value::Number(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<Value, Error> {
        Ok(Value::Number(v))
    }
    fn serialize_char(self, v: char) -> Result<Value, Error> {
        Ok(Value::from(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, Error> {
        Ok(Value::String(v.to_vec()))
    }
    fn serialize_none(self) -> Result<Value, Error> {
        Ok(Value::Nil)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Value, Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, Error> {
        Ok(Value::Nil)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Value, Error> {
        Ok(Value::Nil)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
    ) -> Result<Value, Error> {
        Ok(Value::from(v))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Value, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
        value: &T,
    ) -> Result<Value, Error> {
        Ok(variant(v, value.serialize(Serializer)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqSer, Error> {
        Ok(SeqSer {
            items: Vec::with_capacity(len.unwrap_or(0)),
            variant: None,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqSer, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<SeqSer, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
        len: usize,
    ) -> Result<SeqSer, Error> {
        Ok(SeqSer {
            items: Vec::with_capacity(len),
            variant: Some(v),
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<MapSer, Error> {
        Ok(MapSer {
            table: Table::new(),
            key: None,
            variant: None,
        })
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<MapSer, Error> {
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
        _: usize,
    ) -> Result<MapSer, Error> {
        Ok(MapSer {
            table: Table::new(),
            key: None,
            variant: Some(v),
        })
    }
}

struct SeqSer {
    items: Vec<Value>,
    variant: Option<&'static str>,
}

impl SeqSer {
    fn push<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.items.push(v.serialize(Serializer)?);
        Ok(())
    }
    fn finish(self) -> Value {
        // A `nil` element (a `None`) would leave a hole, or shorten the sequence if last:
        // the length goes in `n` (like `table.pack`) so the sequence reads back whole.
        let n = self
            .items
            .iter()
            .any(|v| matches!(v, Value::Nil))
            .then_some(self.items.len());
        let mut t = Table::from_array(self.items);
        if let Some(n) = n {
            t = t.with("n", n as i64);
        }
        let t = Value::Table(t);
        match self.variant {
            Some(v) => variant(v, t),
            None => t,
        }
    }
}

impl ser::SerializeSeq for SeqSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.push(v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

impl ser::SerializeTuple for SeqSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.push(v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

impl ser::SerializeTupleStruct for SeqSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.push(v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

impl ser::SerializeTupleVariant for SeqSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        self.push(v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

struct MapSer {
    table: Table,
    key: Option<Value>,
    variant: Option<&'static str>,
}

impl MapSer {
    fn entry(&mut self, k: Value, v: Value) -> Result<(), Error> {
        match &k {
            Value::Nil => return Err(ser_err("a map key serialized as nil (None or ())")),
            Value::Number(f) if f.is_nan() => return Err(ser_err("a map key is NaN")),
            _ => {}
        }
        if !matches!(v, Value::Nil) {
            self.table.entries.push((k, v));
        }
        Ok(())
    }
    fn finish(self) -> Value {
        let t = Value::Table(self.table);
        match self.variant {
            Some(v) => variant(v, t),
            None => t,
        }
    }
}

impl ser::SerializeMap for MapSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), Error> {
        self.key = Some(k.serialize(Serializer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        let k = self
            .key
            .take()
            .ok_or_else(|| ser_err("a map value without a key"))?;
        let v = v.serialize(Serializer)?;
        self.entry(k, v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

impl ser::SerializeStruct for MapSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        k: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        let v = v.serialize(Serializer)?;
        self.entry(Value::from(k), v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

impl ser::SerializeStructVariant for MapSer {
    type Ok = Value;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        k: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        let v = v.serialize(Serializer)?;
        self.entry(Value::from(k), v)
    }
    fn end(self) -> Result<Value, Error> {
        Ok(self.finish())
    }
}

// ----- Value -> Rust -----

struct Deserializer {
    value: Value,
    path: String,
}

impl Deserializer {
    fn fail(&self, message: impl Into<String>) -> Error {
        Error {
            message: message.into(),
            path: Some(self.path.clone()),
            found: Some(describe(&self.value)),
            expected: None,
        }
    }

    fn invalid(&self, expected: &str) -> Error {
        Error {
            expected: Some(expected.to_string()),
            ..self.fail(format!("expected {expected}"))
        }
    }

    /// The table's entries as a sequence, if its keys are exactly 1..n.
    fn sequence(t: Table) -> Result<Vec<Value>, Table> {
        let n = t.entries.len();
        if t.entries
            .iter()
            .all(|(k, _)| matches!(k.as_integer(), Some(i) if i >= 1 && i as usize <= n))
        {
            let mut items = vec![Value::Nil; n];
            for (k, v) in t.entries {
                items[k.as_integer().expect("checked") as usize - 1] = v;
            }
            Ok(items)
        } else {
            Err(t)
        }
    }

    /// The table as a sequence that may have holes (`nil`s, read as `None` by `Option`
    /// elements): positive integer keys, plus an optional integer `n` giving the length
    /// (written by [`to_value`] when a sequence holds `nil`s; without it the length is the
    /// largest key). Refused (the table given back) with other keys, an `n` below the
    /// largest key, or a length beyond twice the entries plus 65536 (a hostile table).
    fn sequence_with_holes(t: Table) -> Result<Vec<Value>, Table> {
        let mut max = 0i64;
        let mut n = None;
        for (k, v) in &t.entries {
            match (k.as_integer(), k.as_str(), v.as_integer()) {
                (Some(i), _, _) if i >= 1 => max = max.max(i),
                (_, Some("n"), Some(len)) if len >= 0 => n = Some(len),
                _ => return Err(t),
            }
        }
        let len = n.unwrap_or(max);
        if len < max || len as u64 > 2 * t.entries.len() as u64 + 65536 {
            return Err(t);
        }
        let mut items = vec![Value::Nil; len as usize];
        for (k, v) in t.entries {
            if let Some(i) = k.as_integer() {
                items[i as usize - 1] = v;
            }
        }
        Ok(items)
    }
}

fn child(path: &str, suffix: &str) -> String {
    format!("{path}{suffix}")
}

macro_rules! de_int {
    ($($m:ident),*) => {$(
        fn $m<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            match self.value {
                Value::Integer(i) => visitor.visit_i64(i).map_err(|e: Error| e.at(&self.path, || format!("the integer {i}"))),
                Value::Number(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => visitor
                    .visit_i64(f as i64)
                    .map_err(|e: Error| e.at(&self.path, || format!("the float {f}"))),
                _ => Err(self.invalid("an integer")),
            }
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Deserializer {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = self.path;
        match self.value {
            Value::Nil => visitor.visit_unit(),
            Value::Boolean(b) => visitor.visit_bool(b),
            Value::Integer(i) => visitor.visit_i64(i),
            Value::Number(f) => visitor.visit_f64(f),
            Value::String(s) => match String::from_utf8(s) {
                Ok(text) => visitor.visit_string(text),
                Err(e) => visitor.visit_byte_buf(e.into_bytes()),
            },
            Value::Table(t) => match Deserializer::sequence(t) {
                Ok(items) => visitor.visit_seq(SeqDe {
                    items: items.into_iter().enumerate(),
                    path: path.clone(),
                }),
                Err(t) => visitor.visit_map(MapDe {
                    entries: t.entries.into_iter(),
                    value: None,
                    path: path.clone(),
                }),
            },
            v @ (Value::UserData(_) | Value::Opaque(_)) => {
                return Err(Deserializer { value: v, path }
                    .invalid("plain data (not a userdata or function)"))
            }
        }
        .map_err(|e| e.at(&path, || "a value".into()))
    }

    de_int!(
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_i128,
        deserialize_u128
    );

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Integer(i) => visitor.visit_f64(i as f64),
            Value::Number(f) => visitor.visit_f64(f),
            _ => Err(self.invalid("a number")),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Boolean(b) => visitor.visit_bool(b),
            _ => Err(self.invalid("a boolean")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.value {
            Value::String(s) => match std::str::from_utf8(s) {
                Ok(text) => visitor.visit_string(text.to_string()),
                Err(_) => Err(self.invalid("a UTF-8 string")),
            },
            _ => Err(self.invalid("a string")),
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::String(s) => visitor.visit_byte_buf(s),
            _ => Err(self.invalid("a string")),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Nil => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Nil => visitor.visit_unit(),
            _ => Err(self.invalid("nil")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = self.path.clone();
        match self.value {
            Value::Table(t) => match Deserializer::sequence_with_holes(t) {
                Ok(items) => visitor
                    .visit_seq(SeqDe {
                        items: items.into_iter().enumerate(),
                        path: path.clone(),
                    })
                    .map_err(|e| e.at(&path, || "a sequence table".into())),
                Err(t) => Err(Deserializer {
                    value: Value::Table(t),
                    path,
                }
                .invalid("a sequence table (keys 1..n, optionally `n` = the length)")),
            },
            _ => Err(self.invalid("a sequence table")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let path = self.path.clone();
        match self.value {
            Value::Table(t) => visitor
                .visit_map(MapDe {
                    entries: t.entries.into_iter(),
                    value: None,
                    path: path.clone(),
                })
                .map_err(|e| e.at(&path, || "a table".into())),
            _ => Err(self.invalid("a table")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let path = self.path.clone();
        match self.value {
            Value::String(s) => {
                let name = String::from_utf8(s)
                    .map_err(|_| ser_err("a variant name that is not UTF-8"))?;
                visitor.visit_enum(name.into_deserializer())
            }
            Value::Table(t) if t.entries.len() == 1 => {
                let (k, v) = t.entries.into_iter().next().expect("one entry");
                let Some(name) = k.as_str().map(str::to_string) else {
                    return Err(Deserializer { value: k, path }.invalid("a variant name"));
                };
                visitor.visit_enum(EnumDe {
                    path: child(&path, &format!(".{name}")),
                    name,
                    value: v,
                })
            }
            _ => Err(self.invalid("a variant name or a table { Variant = value }")),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

struct SeqDe {
    items: std::iter::Enumerate<std::vec::IntoIter<Value>>,
    path: String,
}

impl<'de> de::SeqAccess<'de> for SeqDe {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.items.next() {
            None => Ok(None),
            Some((i, value)) => {
                let path = child(&self.path, &format!("[{}]", i + 1));
                let found = describe(&value);
                seed.deserialize(Deserializer {
                    value,
                    path: path.clone(),
                })
                .map(Some)
                .map_err(|e| e.at(&path, || found))
            }
        }
    }
}

struct MapDe {
    entries: std::vec::IntoIter<(Value, Value)>,
    value: Option<(Value, String)>,
    path: String,
}

impl<'de> de::MapAccess<'de> for MapDe {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            None => Ok(None),
            Some((k, v)) => {
                let path = child(&self.path, &crate::bridge::convert::key_suffix(&k));
                let key = seed.deserialize(Deserializer {
                    value: k,
                    path: format!("{path} (the key)"),
                })?;
                self.value = Some((v, path));
                Ok(Some(key))
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let (value, path) = self
            .value
            .take()
            .ok_or_else(|| ser_err("a map value asked for before its key"))?;
        let found = describe(&value);
        seed.deserialize(Deserializer {
            value,
            path: path.clone(),
        })
        .map_err(|e| e.at(&path, || found))
    }
}

struct EnumDe {
    name: String,
    value: Value,
    path: String,
}

impl<'de> de::EnumAccess<'de> for EnumDe {
    type Error = Error;
    type Variant = Deserializer;
    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Deserializer), Error> {
        let name: de::value::StringDeserializer<Error> = self.name.into_deserializer();
        let v = seed.deserialize(name)?;
        Ok((
            v,
            Deserializer {
                value: self.value,
                path: self.path,
            },
        ))
    }
}

impl<'de> de::VariantAccess<'de> for Deserializer {
    type Error = Error;
    fn unit_variant(self) -> Result<(), Error> {
        match self.value {
            Value::Nil => Ok(()),
            _ => Err(self.invalid("nothing for a unit variant")),
        }
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_seq(self, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_map(self, visitor)
    }
}
