//! Plain-data userdata: Rust values stored inline in the Lua heap.
//!
//! A userdata type is any [`bytemuck::Pod`] type: no pointers, no padding, every bit pattern
//! valid. Its bytes live in the arena, so it rolls back with everything else, can be persisted
//! byte for byte, and no Rust memory is ever reachable from Lua.

use crate::bridge::convert::FromLua;
use crate::bridge::error::{NativeError, VmError};
use crate::bridge::natives::Call;
use crate::bridge::value::{PlainData, Value};

/// A method of a userdata type: receives the value (mutable, written back after the call) and
/// the call's other arguments (argument 0 is the userdata itself).
pub type Method<T> = Box<dyn Fn(&mut T, &mut Call<'_>) -> Result<(), NativeError>>;

/// What a registered entry of a userdata type is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// `obj:name(...)`, or a metamethod when the name starts with `__`.
    Method,
    /// `obj.name` reads it.
    Get,
    /// `obj.name = v` calls it with `v` as argument 1.
    Set,
}

/// The methods, metamethods and fields of a userdata type, collected at registration.
///
/// `__index` serves methods and fields alike; `__newindex` serves field setters. Registering
/// your own `__index` together with methods or fields (or `__newindex` with setters) is an
/// error at registration ([`VmError::UserDataConflict`](crate::VmError::UserDataConflict)),
/// never a silent replacement, and so are `__name` (luasnap sets it to the type's name) and
/// `__gc` (plain data owns nothing to release, and a finalizer would run at collection points
/// that move with GC tuning).
///
/// ```
/// use luasnap_bridge::{PlainData, Vm};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Ship { x: f64, hp: i64 }
/// impl PlainData for Ship { const NAME: &'static str = "Ship"; }
///
/// let vm = Vm::builder()
///     .capacity(64 << 20)
///     .native("ship", |call| { call.ret(luasnap_bridge::Value::userdata(Ship { x: 0.0, hp: 3 })); Ok(()) })
///     .userdata::<Ship>(|m| {
///         m.field_get("hp", |s| s.hp);
///         m.field_set("hp", |s, hp: i64| { s.hp = hp.max(0); Ok(()) });
///         m.field_get("x", |s| s.x);
///         m.method("move", |s, call| { s.x += call.number(1)?; Ok(()) });
///     })
///     .build()?;
/// let out = vm.exec("local s = ship(); s:move(2.5); s.hp = s.hp - 5; return s.x, s.hp", "t")?;
/// assert_eq!(out, vec![2.5.into(), 0.into()]);
/// # Ok::<(), luasnap_bridge::VmError>(())
/// ```
pub struct UserDataMethods<T: PlainData> {
    pub(crate) methods: Vec<(String, EntryKind, Method<T>)>,
}

impl<T: PlainData> UserDataMethods<T> {
    pub(crate) fn new() -> Self {
        UserDataMethods {
            methods: Vec::new(),
        }
    }

    /// Adds a method (`obj:name(...)`), or a metamethod if `name` starts with `__`
    /// (`__add`, `__eq`, `__tostring`, `__len`, ...). The method gets a copy of the value,
    /// written back when it returns: a change Lua code makes to the same userdata during a
    /// [`Call::call_function`] from the method is overwritten.
    pub fn method(
        &mut self,
        name: &str,
        f: impl Fn(&mut T, &mut Call<'_>) -> Result<(), NativeError> + 'static,
    ) -> &mut Self {
        self.methods
            .push((name.to_string(), EntryKind::Method, Box::new(f)));
        self
    }

    /// Adds a field read by `obj.name`: `get` returns its value.
    pub fn field_get<V: Into<Value>>(
        &mut self,
        name: &str,
        get: impl Fn(&T) -> V + 'static,
    ) -> &mut Self {
        self.methods.push((
            name.to_string(),
            EntryKind::Get,
            Box::new(move |this: &mut T, call: &mut Call<'_>| {
                call.ret(get(this));
                Ok(())
            }),
        ));
        self
    }

    /// Adds a field written by `obj.name = value`: `set` receives the value converted to `V`
    /// (a value that does not convert is a Lua error naming the field). Writing a field with
    /// no setter is a Lua error too.
    pub fn field_set<V: FromLua>(
        &mut self,
        name: &str,
        set: impl Fn(&mut T, V) -> Result<(), NativeError> + 'static,
    ) -> &mut Self {
        let field = name.to_string();
        self.methods.push((
            name.to_string(),
            EntryKind::Set,
            Box::new(move |this: &mut T, call: &mut Call<'_>| {
                let v: V = call
                    .get(1)
                    .map_err(|e| NativeError::new(format!("field '{field}': {e}")))?;
                set(this, v)
            }),
        ));
        self
    }
}

/// Builds `__index` (methods, then field getters) and `__newindex` (field setters) for a type
/// with fields. Its arguments are the methods, getters and setters tables and the type name.
pub(crate) const FIELD_ACCESS: &str = r#"
local methods, getters, setters, tname = ...
local error, tostring, pcall = error, tostring, pcall
local function index(self, k)
  local m = methods[k]
  if m ~= nil then return m end
  local g = getters[k]
  if g ~= nil then return g(self) end
  return nil
end
local function newindex(self, k, v)
  local s = setters[k]
  if s == nil then
    error("cannot set '" .. tostring(k) .. "' on a " .. tname .. ": it has no field setter", 2)
  end
  -- A setter's error points at the assignment, not at this function.
  local ok, e = pcall(s, self, v)
  if not ok then error(e, 2) end
end
return index, newindex
"#;

/// Refuses entries that luasnap would otherwise replace or that break the plain-data rules.
pub(crate) fn check_entries<T: PlainData>(
    entries: &[(String, EntryKind, Method<T>)],
) -> Result<(), VmError> {
    let conflict = |message: String| VmError::UserDataConflict {
        name: T::NAME,
        message,
    };
    let has = |k: EntryKind| {
        entries
            .iter()
            .any(|(n, kind, _)| *kind == k && !n.starts_with("__"))
    };
    let mut seen = std::collections::HashSet::new();
    for (name, kind, _) in entries {
        if !seen.insert((name.as_str(), *kind == EntryKind::Set)) {
            return Err(conflict(format!(
                "'{name}' is registered twice; register each method or field once"
            )));
        }
        if *kind != EntryKind::Method {
            if name.starts_with("__") {
                return Err(conflict(format!(
                    "field '{name}' starts with '__', which names metamethods; use method() for metamethods"
                )));
            }
            continue;
        }
        match name.as_str() {
            "__index" if has(EntryKind::Method) || has(EntryKind::Get) => {
                return Err(conflict(
                    "a user __index would be replaced by the one serving the type's methods and fields; \
                     drop __index and register fields with field_get, or register no methods or fields"
                        .into(),
                ))
            }
            "__newindex" if has(EntryKind::Set) => {
                return Err(conflict(
                    "a user __newindex would be replaced by the one serving field setters; \
                     drop __newindex or the field_set entries"
                        .into(),
                ))
            }
            "__name" => {
                return Err(conflict(
                    "__name is set to the type's PlainData::NAME; change NAME instead".into(),
                ))
            }
            "__gc" => {
                return Err(conflict(
                    "userdata are plain data without finalizers: there is nothing to release, and a \
                     finalizer would run at collection points that move with GC tuning"
                        .into(),
                ))
            }
            _ => {}
        }
    }
    // A getter named like a method would never be reached.
    for (name, kind, _) in entries {
        if *kind == EntryKind::Get
            && entries
                .iter()
                .any(|(n, k, _)| n == name && *k == EntryKind::Method)
        {
            return Err(conflict(format!(
                "'{name}' is both a method and a field; __index would serve only the method"
            )));
        }
    }
    Ok(())
}
