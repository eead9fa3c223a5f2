//! Typed conversions between Rust and Lua, in the spirit of mlua's `FromLua`/`IntoLua`.
//!
//! - [`FromLua`]: a Rust type read from a copied [`Value`]. Implemented for [`Value`], `bool`,
//!   every integer width (range-checked; floats only when they hold an exact integer), `f32`,
//!   `f64`, `String`, `Vec<T>` (a sequence `1..n` and nothing else), `HashMap`/`BTreeMap`,
//!   `Option<T>` (`nil` is `None`), [`Table`], [`UserData<T>`] and [`Serde<T>`] (any
//!   `serde::Deserialize` type).
//! - [`IntoLua`]: a Rust value passed to Lua: the same types, plus `&str`, and handles
//!   ([`LuaRef`](crate::LuaRef), [`LuaTable`](crate::LuaTable), [`Function`](crate::Function),
//!   [`Thread`](crate::Thread)) by reference, which pass the Lua object itself.
//! - [`FromLuaMulti`]/[`IntoLuaMulti`]: several values: results and arguments. A single
//!   value, a tuple, `()`, a slice of [`Value`]s, or [`Values`] (all of them).
//!
//! A value that does not fit fails with [`VmError::Type`], which names where it was read (the
//! path, `result #2`, with the position inside: `cfg.tags[3]`) and the type expected.
//!
//! ```
//! use luasnap_bridge::Vm;
//! use std::collections::HashMap;
//!
//! let vm = Vm::builder().capacity(64 << 20).build()?;
//! vm.exec("cfg = { speed = 3, tags = {'a', 'b'}, limits = { hp = 100 } }", "setup")?;
//! let speed: u8 = vm.get("cfg.speed")?;
//! let tags: Vec<String> = vm.get("cfg.tags")?;
//! let limits: HashMap<String, i64> = vm.get("cfg.limits")?;
//! assert_eq!((speed, tags.len(), limits["hp"]), (3, 2, 100));
//! let err = vm.get::<Vec<i32>>("cfg.tags").unwrap_err();
//! assert!(err.to_string().contains("cfg.tags[1]"), "{err}");
//! # Ok::<(), luasnap_bridge::VmError>(())
//! ```

use crate::bridge::error::VmError;
use crate::bridge::value::{PlainData, Table, Value};
use mlua_sys::lua_State;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

/// A Rust type that can be read from a Lua value.
pub trait FromLua: Sized {
    /// Converts, or fails with [`VmError::Type`] whose `path` is the position inside `value`
    /// (empty for the value itself; callers prefix where the value came from).
    fn from_lua(value: Value) -> Result<Self, VmError>;
}

/// What a value is, for error messages: Lua's type name, with the value when it is short.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Number(f) => format!("the float {f}"),
        Value::String(s) if s.len() <= 40 => {
            format!("the string {:?}", String::from_utf8_lossy(s))
        }
        Value::String(s) => format!("a string of {} bytes", s.len()),
        Value::Table(t) => format!("a table of {} entries", t.entries.len()),
        Value::UserData(u) => format!("a {} userdata", u.type_name),
        Value::Opaque(t) => format!("a {t}"),
    }
}

/// A [`VmError::Type`] for `value` at the empty relative path.
pub fn type_error(value: &Value, expected: impl Into<String>, reason: Option<String>) -> VmError {
    VmError::Type {
        path: String::new(),
        expected: expected.into(),
        found: describe(value),
        reason,
    }
}

/// Prefixes the position of a [`VmError::Type`] with `prefix` (other errors pass through).
pub(crate) fn at(e: VmError, prefix: &str) -> VmError {
    match e {
        VmError::Type {
            path,
            expected,
            found,
            reason,
        } => VmError::Type {
            path: format!("{prefix}{path}"),
            expected,
            found,
            reason,
        },
        e => e,
    }
}

/// How a key appears in a position: `.name` for identifiers, `[3]`, `["x y"]` otherwise.
pub(crate) fn key_suffix(k: &Value) -> String {
    match k {
        Value::Integer(i) => format!("[{i}]"),
        Value::String(s) => match std::str::from_utf8(s) {
            Ok(t) if crate::bridge::path::valid_path(t) && !t.contains('.') => format!(".{t}"),
            _ => format!("[{:?}]", String::from_utf8_lossy(s)),
        },
        other => format!("[{}]", describe(other)),
    }
}

impl FromLua for Value {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        Ok(value)
    }
}

impl FromLua for bool {
    /// Only `true` and `false` (not Lua's truthiness: a number where a flag was expected is
    /// a mistake worth reporting).
    fn from_lua(value: Value) -> Result<Self, VmError> {
        match value {
            Value::Boolean(b) => Ok(b),
            v => Err(type_error(&v, "bool", None)),
        }
    }
}

macro_rules! from_lua_int {
    ($($t:ty),*) => {$(
        impl FromLua for $t {
            fn from_lua(value: Value) -> Result<Self, VmError> {
                let expected = stringify!($t);
                let wide: i128 = match value {
                    Value::Integer(i) => i as i128,
                    Value::Number(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 2f64.powi(126) => f as i128,
                    Value::Number(_) => {
                        return Err(type_error(&value, expected, Some("it has no exact integer value".into())))
                    }
                    ref v => return Err(type_error(v, expected, None)),
                };
                <$t>::try_from(wide).map_err(|_| {
                    type_error(&value, expected, Some(format!("out of range {}..={}", <$t>::MIN, <$t>::MAX)))
                })
            }
        }
    )*};
}
from_lua_int!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);

impl FromLua for f64 {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        match value {
            Value::Integer(i) => Ok(i as f64),
            Value::Number(f) => Ok(f),
            v => Err(type_error(&v, "f64", None)),
        }
    }
}

impl FromLua for f32 {
    /// Any number, rounded to the nearest `f32`.
    fn from_lua(value: Value) -> Result<Self, VmError> {
        match value {
            Value::Integer(i) => Ok(i as f32),
            Value::Number(f) => Ok(f as f32),
            v => Err(type_error(&v, "f32", None)),
        }
    }
}

impl FromLua for String {
    /// A string holding UTF-8 (numbers are not converted; read `Value` for raw bytes).
    fn from_lua(value: Value) -> Result<Self, VmError> {
        match value {
            Value::String(s) => String::from_utf8(s).map_err(|e| {
                type_error(
                    &Value::String(e.as_bytes().to_vec()),
                    "String",
                    Some(format!(
                        "not UTF-8 at byte {}; read it as Value",
                        e.utf8_error().valid_up_to()
                    )),
                )
            }),
            v => Err(type_error(&v, "String", None)),
        }
    }
}

impl<T: FromLua> FromLua for Option<T> {
    /// `nil` is `None`; anything else must convert to `T`.
    fn from_lua(value: Value) -> Result<Self, VmError> {
        match value {
            Value::Nil => Ok(None),
            v => T::from_lua(v).map(Some),
        }
    }
}

impl FromLua for Table {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        match value {
            Value::Table(t) => Ok(t),
            v => Err(type_error(&v, "table", None)),
        }
    }
}

impl<T: FromLua> FromLua for Vec<T> {
    /// A sequence: positive integer keys, plus an optional integer `n` giving the length (as
    /// `table.pack` and serde's writer of sequences holding `None` leave it). Holes read as
    /// `nil` (so `Vec<Option<T>>` reads `{1, nil, 3}` and `{1, nil, n = 2}`); a table with
    /// other keys, or one sparser than twice its entry count (plus 64), is refused rather than
    /// read as a huge vector.
    fn from_lua(value: Value) -> Result<Self, VmError> {
        let Value::Table(t) = value else {
            return Err(type_error(&value, "a sequence table", None));
        };
        let mut max = 0u64;
        let mut n = None;
        for (k, v) in &t.entries {
            match (k.as_integer(), k.as_str(), v.as_integer()) {
                (Some(i), _, _) if i >= 1 => max = max.max(i as u64),
                (_, Some("n"), Some(len)) if len >= 0 => n = Some(len as u64),
                _ => {
                    return Err(VmError::Type {
                        path: key_suffix(k),
                        expected: "a sequence (keys 1, 2, ...)".into(),
                        found: describe(v),
                        reason: Some(
                            "the table has other keys; read it as a HashMap or Table".into(),
                        ),
                    })
                }
            }
        }
        if let Some(n) = n {
            if n < max {
                return Err(type_error(
                    &Value::Table(t),
                    "a sequence table",
                    Some(format!("its `n` ({n}) is below its largest key ({max})")),
                ));
            }
            max = n;
        }
        if max > 2 * t.entries.len() as u64 + 64 {
            return Err(type_error(
                &Value::Table(t),
                "a sequence table",
                Some(format!(
                    "too sparse: largest key {max}; read it as a HashMap"
                )),
            ));
        }
        let mut slots: Vec<Option<Value>> = (0..max).map(|_| None).collect();
        for (k, v) in t.entries {
            if let Some(i) = k.as_integer() {
                slots[i as usize - 1] = Some(v);
            }
        }
        slots
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                T::from_lua(v.unwrap_or(Value::Nil)).map_err(|e| at(e, &format!("[{}]", i + 1)))
            })
            .collect()
    }
}

fn map_entries<K: FromLua, V: FromLua>(
    value: Value,
    expected: &str,
) -> Result<impl Iterator<Item = Result<(K, V), VmError>>, VmError> {
    let Value::Table(t) = value else {
        return Err(type_error(&value, expected, None));
    };
    Ok(t.entries.into_iter().map(|(k, v)| {
        let suffix = key_suffix(&k);
        let key = K::from_lua(k).map_err(|e| at(e, &format!("{suffix} (the key)")))?;
        let val = V::from_lua(v).map_err(|e| at(e, &suffix))?;
        Ok((key, val))
    }))
}

impl<K: FromLua + Eq + Hash, V: FromLua, S: BuildHasher + Default> FromLua for HashMap<K, V, S> {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        map_entries(value, "a table (HashMap)")?.collect()
    }
}

impl<K: FromLua + Ord, V: FromLua> FromLua for BTreeMap<K, V> {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        map_entries(value, "a table (BTreeMap)")?.collect()
    }
}

/// A plain-data userdata read or passed by value.
///
/// ```
/// use luasnap_bridge::{PlainData, UserData, Vm};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Vec2 { x: f64, y: f64 }
/// impl PlainData for Vec2 { const NAME: &'static str = "Vec2"; }
///
/// let vm = Vm::builder().capacity(64 << 20).userdata::<Vec2>(|_| {}).build()?;
/// vm.set("origin", UserData(Vec2 { x: 1.0, y: 2.0 }))?;
/// let UserData(v) = vm.get::<UserData<Vec2>>("origin")?;
/// assert_eq!(v, Vec2 { x: 1.0, y: 2.0 });
/// # Ok::<(), luasnap_bridge::VmError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UserData<T>(pub T);

impl<T: PlainData> FromLua for UserData<T> {
    fn from_lua(value: Value) -> Result<Self, VmError> {
        value
            .as_userdata::<T>()
            .map(UserData)
            .ok_or_else(|| type_error(&value, format!("a {} userdata", T::NAME), None))
    }
}

// ----- into Lua -----

/// A value on its way into Lua: a copied [`Value`], or a Lua object held by a handle.
pub struct Arg<'h> {
    pub(crate) kind: ArgKind,
    _handle: PhantomData<&'h ()>,
}

pub(crate) enum ArgKind {
    Value(Value),
    /// Slot `slot` of the anchor thread `owner` (each VM has its own: see `handle.rs`).
    Anchored {
        owner: *mut lua_State,
        slot: c_int,
    },
}

impl<'h> Arg<'h> {
    /// A copied value.
    pub fn value(v: impl Into<Value>) -> Arg<'h> {
        Arg {
            kind: ArgKind::Value(v.into()),
            _handle: PhantomData,
        }
    }

    pub(crate) fn anchored(owner: *mut lua_State, slot: c_int) -> Arg<'h> {
        Arg {
            kind: ArgKind::Anchored { owner, slot },
            _handle: PhantomData,
        }
    }

    /// The copied value; an error for a handle (handles cannot sit inside copied tables).
    pub(crate) fn into_value(self) -> Result<Value, VmError> {
        match self.kind {
            ArgKind::Value(v) => Ok(v),
            ArgKind::Anchored { .. } => Err(VmError::Conversion {
                what: "a handle inside a copied table: copied tables hold copied values only; \
                       set the handle into a table with LuaTable::set instead"
                    .into(),
            }),
        }
    }
}

/// A Rust value that can be passed to Lua. `'h` is the borrow of a handle, for handles.
pub trait IntoLua<'h> {
    /// Converts.
    fn into_lua(self) -> Result<Arg<'h>, VmError>;
}

macro_rules! into_lua_via_value {
    ($($t:ty),*) => {$(
        impl<'h> IntoLua<'h> for $t {
            fn into_lua(self) -> Result<Arg<'h>, VmError> {
                Ok(Arg::value(self))
            }
        }
    )*};
}
into_lua_via_value!(i8, i16, i32, i64, isize, u8, u16, u32, f32, f64, bool, String, Value, Table);

impl<'h> IntoLua<'h> for &str {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        Ok(Arg::value(self))
    }
}

impl<'h> IntoLua<'h> for &String {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        Ok(Arg::value(self.as_str()))
    }
}

impl<'h> IntoLua<'h> for &Value {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        Ok(Arg::value(self.clone()))
    }
}

macro_rules! into_lua_wide {
    ($($t:ty),*) => {$(
        impl<'h> IntoLua<'h> for $t {
            /// An integer if it fits in `i64`, else an error (Lua integers are 64-bit).
            fn into_lua(self) -> Result<Arg<'h>, VmError> {
                i64::try_from(self).map(Arg::value).map_err(|_| VmError::Conversion {
                    what: format!("{self} ({}) to a Lua integer: out of the i64 range", stringify!($t)),
                })
            }
        }
    )*};
}
into_lua_wide!(u64, usize, i128, u128);

impl<'h, T: IntoLua<'h>> IntoLua<'h> for Option<T> {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        match self {
            Some(v) => v.into_lua(),
            None => Ok(Arg::value(Value::Nil)),
        }
    }
}

impl<'h, T: PlainData> IntoLua<'h> for UserData<T> {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        Ok(Arg::value(Value::userdata(self.0)))
    }
}

impl<'h, T: IntoLua<'h>> IntoLua<'h> for Vec<T> {
    /// A sequence table.
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        let items = self
            .into_iter()
            .map(|v| v.into_lua()?.into_value())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arg::value(Table::from_array(items)))
    }
}

fn map_into<'h, K: IntoLua<'h>, V: IntoLua<'h>>(
    entries: impl Iterator<Item = (K, V)>,
) -> Result<Arg<'h>, VmError> {
    let mut t = Table::new();
    for (k, v) in entries {
        t.entries
            .push((k.into_lua()?.into_value()?, v.into_lua()?.into_value()?));
    }
    Ok(Arg::value(t))
}

impl<'h, K: IntoLua<'h>, V: IntoLua<'h>, S> IntoLua<'h> for HashMap<K, V, S> {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        map_into(self.into_iter())
    }
}

impl<'h, K: IntoLua<'h>, V: IntoLua<'h>> IntoLua<'h> for BTreeMap<K, V> {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        map_into(self.into_iter())
    }
}

// ----- several values -----

/// All the values of a call, for [`FromLuaMulti`]/[`IntoLuaMulti`] (a `Vec<Value>` would be
/// one table).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Values(pub Vec<Value>);

/// Several Lua values (a call's results) read as one Rust value: `()` ignores them, a single
/// type reads the first (missing counts as `nil`), a tuple reads one each, [`Values`] keeps
/// them all.
pub trait FromLuaMulti: Sized {
    /// Converts; `what` names the values in errors (`result`).
    fn from_lua_multi(values: Vec<Value>, what: &str) -> Result<Self, VmError>;
}

impl FromLuaMulti for () {
    fn from_lua_multi(_: Vec<Value>, _: &str) -> Result<Self, VmError> {
        Ok(())
    }
}

impl FromLuaMulti for Values {
    fn from_lua_multi(values: Vec<Value>, _: &str) -> Result<Self, VmError> {
        Ok(Values(values))
    }
}

impl<T: FromLua> FromLuaMulti for T {
    fn from_lua_multi(values: Vec<Value>, what: &str) -> Result<Self, VmError> {
        let v = values.into_iter().next().unwrap_or(Value::Nil);
        T::from_lua(v).map_err(|e| at(e, &format!("{what} #1")))
    }
}

macro_rules! tuples {
    ($( ($($n:tt $t:ident),+) )*) => {$(
        impl<$($t: FromLua),+> FromLuaMulti for ($($t,)+) {
            fn from_lua_multi(values: Vec<Value>, what: &str) -> Result<Self, VmError> {
                let mut it = values.into_iter();
                Ok(($(
                    $t::from_lua(it.next().unwrap_or(Value::Nil))
                        .map_err(|e| at(e, &format!("{what} #{}", $n + 1)))?,
                )+))
            }
        }
        impl<'h, $($t: IntoLua<'h>),+> IntoLuaMulti<'h> for ($($t,)+) {
            #[allow(non_snake_case)]
            fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
                let ($($t,)+) = self;
                Ok(vec![$($t.into_lua()?),+])
            }
        }
    )*};
}

/// Several Rust values passed to Lua as separate arguments: a single value, a tuple, `()`
/// (none), a slice or array of [`Value`]s, or [`Values`].
pub trait IntoLuaMulti<'h> {
    /// Converts.
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError>;
}

impl<'h, T: IntoLua<'h>> IntoLuaMulti<'h> for T {
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
        Ok(vec![self.into_lua()?])
    }
}

impl<'h> IntoLuaMulti<'h> for () {
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
        Ok(Vec::new())
    }
}

impl<'h> IntoLuaMulti<'h> for &[Value] {
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
        Ok(self.iter().map(|v| Arg::value(v.clone())).collect())
    }
}

impl<'h, const N: usize> IntoLuaMulti<'h> for &[Value; N] {
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
        self[..].into_lua_multi()
    }
}

impl<'h> IntoLuaMulti<'h> for Values {
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
        Ok(self.0.into_iter().map(Arg::value).collect())
    }
}

impl<'h> IntoLuaMulti<'h> for Vec<Arg<'h>> {
    fn into_lua_multi(self) -> Result<Vec<Arg<'h>>, VmError> {
        Ok(self)
    }
}

tuples! {
    (0 A)
    (0 A, 1 B)
    (0 A, 1 B, 2 C)
    (0 A, 1 B, 2 C, 3 D)
    (0 A, 1 B, 2 C, 3 D, 4 E)
    (0 A, 1 B, 2 C, 3 D, 4 E, 5 F)
    (0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G)
    (0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H)
}

/// Converts all arguments to copied values (for natives calling back into Lua, which hold no
/// handles).
pub(crate) fn plain_args<'h>(args: impl IntoLuaMulti<'h>) -> Result<Vec<Value>, VmError> {
    args.into_lua_multi()?
        .into_iter()
        .map(Arg::into_value)
        .collect()
}
