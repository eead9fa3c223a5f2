//! Lua values as plain Rust data.
//!
//! Values cross the boundary by copy: a [`Value`] never refers into the Lua heap, so it stays
//! valid across any snapshot or rollback.

/// A Rust type usable as Lua userdata: plain data with a unique name.
///
/// ```
/// use luasnap_bridge::PlainData;
///
/// #[repr(C)]
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Vec2 {
///     x: f64,
///     y: f64,
/// }
///
/// impl PlainData for Vec2 {
///     const NAME: &'static str = "Vec2";
/// }
/// ```
///
/// A userdata's bytes are copied as they are by snapshots, rollbacks and save-games, and a
/// foreign save may hold any bytes for them, so a type must be valid for every bit pattern and
/// hold no address: `bytemuck::Pod` has no padding, no pointers and no references (a struct
/// with a reference does not qualify, E0277; nor one with padding, whose derive fails):
///
/// ```compile_fail,E0277
/// use luasnap_bridge::PlainData;
///
/// #[derive(Clone, Copy)]
/// struct Named {
///     name: &'static str, // an address: not plain data
/// }
///
/// impl PlainData for Named {
///     const NAME: &'static str = "Named";
/// }
/// ```
///
/// ```compile_fail,E0512
/// #[repr(C)]
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Padded {
///     tag: u8, // three bytes of padding follow: their contents are undefined
///     hp: u32,
/// }
/// ```
///
/// An integer that a game uses as a handle (an index into the host's tables) is plain data:
/// it is rolled back and saved with the rest, and the host checks it like any input.
pub trait PlainData: bytemuck::Pod {
    /// The type's name, unique in a VM; shown in error messages and used by `__name`.
    const NAME: &'static str;
}

/// A Lua value copied out of (or into) the VM.
///
/// `Debug` shows strings as text when they are UTF-8 (`String("abc")`), as bytes otherwise.
#[derive(Clone, PartialEq, Default)]
pub enum Value {
    /// `nil`.
    #[default]
    Nil,
    /// A boolean.
    Boolean(bool),
    /// An integer (Lua keeps integers and floats apart).
    Integer(i64),
    /// A float.
    Number(f64),
    /// A string: any bytes.
    String(Vec<u8>),
    /// A table, copied deeply.
    Table(Table),
    /// A plain-data userdata of a registered type, copied by value.
    UserData(UserDataValue),
    /// A Lua value with no Rust counterpart (function, thread, light userdata, userdata of an
    /// unregistered type). Only its type name is kept; it cannot be passed back to Lua.
    Opaque(&'static str),
}

/// A table's entries, in the order `next` visited them when copied out of Lua.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Key-value pairs. Keys are never `Nil`.
    pub entries: Vec<(Value, Value)>,
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table::default()
    }

    /// A sequence: keys 1..=n.
    pub fn from_array(items: impl IntoIterator<Item = Value>) -> Table {
        Table {
            entries: items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (Value::Integer(i as i64 + 1), v))
                .collect(),
        }
    }

    /// Adds an entry (chainable).
    pub fn with(mut self, key: impl Into<Value>, value: impl Into<Value>) -> Table {
        self.entries.push((key.into(), value.into()));
        self
    }

    /// The value for `key`, comparing keys by value (integer-valued floats equal integers).
    pub fn get(&self, key: impl Into<Value>) -> Option<&Value> {
        let key = key.into();
        self.entries
            .iter()
            .find(|(k, _)| k.lua_eq(&key))
            .map(|(_, v)| v)
    }

    /// The values at keys 1, 2, ... up to the first missing one.
    pub fn sequence(&self) -> Vec<&Value> {
        let mut out = Vec::new();
        while let Some(v) = self.get(out.len() as i64 + 1) {
            out.push(v);
        }
        out
    }
}

/// A userdata of a registered plain-data type, copied by value.
#[derive(Debug, Clone, PartialEq)]
pub struct UserDataValue {
    /// The registered type name.
    pub type_name: &'static str,
    /// The value's bytes.
    pub bytes: Vec<u8>,
}

impl Value {
    /// A userdata value of a registered plain-data type.
    pub fn userdata<T: PlainData>(value: T) -> Value {
        Value::UserData(UserDataValue {
            type_name: T::NAME,
            bytes: bytemuck::bytes_of(&value).to_vec(),
        })
    }

    /// The userdata as `T`, if it is one of that type.
    pub fn as_userdata<T: PlainData>(&self) -> Option<T> {
        match self {
            Value::UserData(u)
                if u.type_name == T::NAME && u.bytes.len() == std::mem::size_of::<T>() =>
            {
                Some(bytemuck::pod_read_unaligned(&u.bytes))
            }
            _ => None,
        }
    }

    /// Lua's type name for this value.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Boolean(_) => "boolean",
            Value::Integer(_) | Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Table(_) => "table",
            Value::UserData(_) => "userdata",
            Value::Opaque(t) => t,
        }
    }

    /// The integer, if this is one (or a float with an exact integer value).
    pub fn as_integer(&self) -> Option<i64> {
        match *self {
            Value::Integer(i) => Some(i),
            Value::Number(f) if f.fract() == 0.0 && f >= -(2f64.powi(63)) && f < 2f64.powi(63) => {
                Some(f as i64)
            }
            _ => None,
        }
    }

    /// The number as a float, if this is a number.
    pub fn as_number(&self) -> Option<f64> {
        match *self {
            Value::Integer(i) => Some(i as f64),
            Value::Number(f) => Some(f),
            _ => None,
        }
    }

    /// The string as UTF-8 text, if this is a string holding valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The table, if this is one.
    pub fn as_table(&self) -> Option<&Table> {
        match self {
            Value::Table(t) => Some(t),
            _ => None,
        }
    }

    /// Lua's truthiness: everything but `nil` and `false` is true.
    pub fn is_truthy(&self) -> bool {
        !matches!(self, Value::Nil | Value::Boolean(false))
    }

    /// Equality as Lua's raw equality sees it for keys (1 == 1.0).
    pub fn lua_eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Integer(a), Value::Number(b)) | (Value::Number(b), Value::Integer(a)) => {
                (*a as f64) == *b && b.fract() == 0.0
            }
            _ => self == other,
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Nil => f.write_str("Nil"),
            Value::Boolean(b) => f.debug_tuple("Boolean").field(b).finish(),
            Value::Integer(i) => f.debug_tuple("Integer").field(i).finish(),
            Value::Number(n) => f.debug_tuple("Number").field(n).finish(),
            Value::String(s) => match std::str::from_utf8(s) {
                Ok(text) => f.debug_tuple("String").field(&text).finish(),
                Err(_) => f.debug_tuple("String").field(s).finish(),
            },
            Value::Table(t) => f.debug_tuple("Table").field(t).finish(),
            Value::UserData(u) => f.debug_tuple("UserData").field(u).finish(),
            Value::Opaque(t) => f.debug_tuple("Opaque").field(t).finish(),
        }
    }
}

/// Lua source for the value: `{code = 7, "x", [2.5] = true}` (keys in the copied order, a
/// sequence's items without their keys), strings as literals, floats as `%q` writes them
/// (`1e9999` for infinity, `(0/0)` for NaN). A userdata shows its
/// type (`<Vec2 userdata>`), an opaque value its kind (`<function>`): they have no source.
impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Nil => f.write_str("nil"),
            Value::Boolean(b) => write!(f, "{b}"),
            Value::Integer(i) => write!(f, "{i}"),
            Value::Number(n) if n.is_nan() => f.write_str("(0/0)"),
            Value::Number(n) if n.is_infinite() => {
                f.write_str(if *n > 0.0 { "1e9999" } else { "-1e9999" })
            }
            Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e15 => write!(f, "{n:.1}"),
            Value::Number(n) => write!(f, "{n:?}"),
            Value::String(s) => write_quoted(f, s),
            Value::Table(t) => write_table(f, t),
            Value::UserData(u) => write!(f, "<{} userdata>", u.type_name),
            Value::Opaque(kind) => write!(f, "<{kind}>"),
        }
    }
}

/// A string as a Lua literal: `"`, `\\`, newlines and tabs escaped, other control bytes and
/// bytes that are not UTF-8 as `\ddd`.
fn write_quoted(f: &mut std::fmt::Formatter<'_>, s: &[u8]) -> std::fmt::Result {
    use std::fmt::Write;
    f.write_char('"')?;
    for chunk in s.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_ascii_control() => write!(f, "\\{:03}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        for b in chunk.invalid() {
            write!(f, "\\{b:03}")?;
        }
    }
    f.write_char('"')
}

/// A table as a Lua constructor (see [`Value`]'s `Display`).
fn write_table(f: &mut std::fmt::Formatter<'_>, t: &Table) -> std::fmt::Result {
    const KEYWORDS: [&str; 22] = [
        "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "global",
        "goto", "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true",
        "until",
    ];
    f.write_str("{")?;
    let mut next_item = 1;
    for (i, (k, v)) in t.entries.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        match k {
            Value::Integer(n) if *n == next_item => next_item += 1,
            Value::String(s)
                if s.first()
                    .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
                    && s.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
                    && !KEYWORDS.iter().any(|w| w.as_bytes() == s.as_slice()) =>
            {
                write!(f, "{} = ", String::from_utf8_lossy(s))?
            }
            k => write!(f, "[{k}] = ")?,
        }
        write!(f, "{v}")?;
    }
    f.write_str("}")
}

/// The message of an error object copied out of Lua: its source, cut at 300 characters.
pub(crate) fn error_text(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Integer(v as i64)
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32, isize);

macro_rules! from_wide {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            /// An integer when it fits in Lua's 64-bit integers, else the nearest float (a
            /// `u64` above `i64::MAX`). Use [`IntoLua`](crate::IntoLua) to get an error instead.
            fn from(v: $t) -> Value {
                match i64::try_from(v) {
                    Ok(i) => Value::Integer(i),
                    Err(_) => Value::Number(v as f64),
                }
            }
        }
    )*};
}
from_wide!(u64, usize);

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Number(v)
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::Number(v as f64)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Boolean(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.as_bytes().to_vec())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::String(v.into_bytes())
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::String(v.to_vec())
    }
}

impl From<Table> for Value {
    fn from(v: Table) -> Value {
        Value::Table(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Nil, Into::into)
    }
}

impl From<()> for Value {
    fn from(_: ()) -> Value {
        Value::Nil
    }
}
