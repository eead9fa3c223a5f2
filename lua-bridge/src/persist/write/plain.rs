//! Values written without a frame: primitives, strings and references to objects written
//! already, from the top of the stack (the general path) or from a scan's description (a
//! [`RawVal`], or a [`ScanEntry`](super::csrc::ScanEntry) side: a `kind` and its `bits`).
//!
//! Strings of `MIN_STRREF_LEN` bytes or more are written once and referred to afterwards by
//! string id, found by identity: short strings are interned, so an identity is one content
//! (a long string with the content of another is written again, which is correct, only
//! larger).

use super::super::format::{Scalar, MIN_STRREF_LEN};
use super::csrc::{kind, luasnap_string_bytes, RawVal};
use super::ids::IdSpace;
use super::persister::Persister;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_void;

/// A value without children, as the writer writes it (strings from Lua's memory).
pub(super) type Plain<'a> = Scalar<&'a [u8]>;

/// Whether a scanned value's kind is a primitive or a string (no id lookup to write it).
#[inline(always)]
pub(super) fn is_prim(k: u64) -> bool {
    matches!(k, kind::FALSE..=kind::STR | kind::NIL)
}

/// Whether a scanned value's kind is an object the writer can know by identity alone.
#[inline(always)]
pub(super) fn is_obj(k: u64) -> bool {
    matches!(k, kind::OBJ | kind::TABLE | kind::LCLOSURE)
}

/// The identity in a scanned value's bits.
#[inline(always)]
pub(super) fn identity(bits: u64) -> *const c_void {
    bits as usize as *const c_void
}

/// A scanned value (`kind`, `bits` of a scan entry) as a [`RawVal`], a string's bytes
/// included.
///
/// # Safety
/// **Fresh**: the value was described by a scan and no Lua code ran since.
pub(super) unsafe fn full_val(kind: u64, bits: u64) -> RawVal {
    let mut v = RawVal {
        kind,
        bits,
        ..RawVal::EMPTY
    };
    if kind == kind::STR {
        let mut len = 0usize;
        // SAFETY: bits is a live string (callers' contract); reads only.
        v.s = unsafe { luasnap_string_bytes(identity(bits), &mut len) };
        v.len = len as u64;
    }
    v
}

/// What a described value is to the writer (see [`Persister::classify`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Class {
    /// A primitive or a string.
    Plain,
    /// An object written already, with this id.
    Written(u32),
    /// An object not written yet (maybe a permanent).
    Unwritten,
    /// Anything else: for the general path.
    Other,
}

impl Persister<'_> {
    /// What a described value is to the writer, with one id lookup for an object.
    #[inline]
    pub(super) fn classify(&self, v: &RawVal) -> Class {
        if is_prim(v.kind) {
            return Class::Plain;
        }
        if !is_obj(v.kind) {
            return Class::Other;
        }
        match self.sc.refs.get(identity(v.bits), IdSpace::Obj) {
            Some(id) => Class::Written(id),
            None => Class::Unwritten,
        }
    }

    /// Whether a described value can be written without the general path: a primitive, a
    /// string, or an object already written (a reference).
    pub(super) fn plain(&self, v: &RawVal) -> bool {
        match v.kind {
            kind::FALSE..=kind::STR | kind::NIL => true,
            kind::OBJ | kind::TABLE | kind::LCLOSURE => self.sc.refs.contains(identity(v.bits)),
            _ => false,
        }
    }

    /// Writes a value `classify` found `Plain` or `Written`.
    ///
    /// # Safety
    /// As for `write_plain`.
    #[inline]
    pub(super) unsafe fn write_classified(&mut self, v: &RawVal, class: Class) {
        match class {
            Class::Written(id) => Plain::Ref(id as u64).encode(&mut self.w),
            // SAFETY: callers' contract.
            _ => unsafe { self.write_plain(v) },
        }
    }

    /// Writes a described value for which `plain` holds.
    ///
    /// # Safety
    /// **Fresh**: `v` was described by a scan and no Lua code ran since.
    pub(super) unsafe fn write_plain(&mut self, v: &RawVal) {
        match v.kind {
            kind::NIL => Plain::Nil.encode(&mut self.w),
            kind::FALSE => Plain::False.encode(&mut self.w),
            kind::TRUE => Plain::True.encode(&mut self.w),
            kind::INT => Plain::Int(v.bits as i64).encode(&mut self.w),
            kind::FLOAT => Plain::Float(v.bits).encode(&mut self.w),
            kind::STR => {
                // SAFETY: the scan pointed at the live string's bytes (callers' contract).
                let bytes = unsafe { std::slice::from_raw_parts(v.s.cast::<u8>(), v.len as usize) };
                self.string(identity(v.bits), bytes);
            }
            _ => {
                let id = self
                    .sc
                    .refs
                    .get(identity(v.bits), IdSpace::Obj)
                    .expect("`plain` checked that the object is written");
                Plain::Ref(id as u64).encode(&mut self.w);
            }
        }
    }

    /// Writes a scanned primitive or string (`is_prim(kind)` holds; `bits` as the scan gave
    /// them: a string by identity).
    ///
    /// # Safety
    /// **Fresh**: the value was described by a scan and no Lua code ran since.
    #[inline(always)]
    pub(super) unsafe fn write_scanned(&mut self, kind: u64, bits: u64) {
        match kind {
            kind::STR => {
                let obj = identity(bits);
                // Most strings are written already: their reference, inline (a string without
                // an id is new, or too short to refer to).
                match self.sc.refs.get(obj, IdSpace::Str) {
                    Some(id) => Plain::StrRef(id as u64).encode(&mut self.w),
                    // SAFETY: a live string (callers' contract).
                    None => unsafe { self.new_scanned_string(obj) },
                }
            }
            kind::INT => Plain::Int(bits as i64).encode(&mut self.w),
            kind::FALSE => Plain::False.encode(&mut self.w),
            kind::TRUE => Plain::True.encode(&mut self.w),
            kind::FLOAT => Plain::Float(bits).encode(&mut self.w),
            _ => Plain::Nil.encode(&mut self.w),
        }
    }

    /// Writes the scanned string `obj` that has no string id yet.
    ///
    /// # Safety
    /// **Fresh**: `obj` is a live string's identity from a scan; no Lua code ran since.
    #[inline(never)]
    unsafe fn new_scanned_string(&mut self, obj: *const c_void) {
        let mut len = 0usize;
        // SAFETY: obj is a live string (callers' contract); reads only.
        let p = unsafe { luasnap_string_bytes(obj, &mut len) };
        // SAFETY: the string's bytes, alive while it is (nothing runs meanwhile).
        let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
        self.new_string(obj, bytes);
    }

    /// Writes the string `bytes` whose identity is `obj`: by reference if written before.
    #[inline(always)]
    pub(super) fn string(&mut self, obj: *const c_void, bytes: &[u8]) {
        if bytes.len() >= MIN_STRREF_LEN {
            // Most strings are written already: their reference, inline.
            if let Some(old) = self.sc.refs.get(obj, IdSpace::Str) {
                Plain::StrRef(old as u64).encode(&mut self.w);
                return;
            }
        }
        self.new_string(obj, bytes);
    }

    /// `string`, for a string to write whole (new, or too short to refer to).
    #[inline(never)]
    fn new_string(&mut self, obj: *const c_void, bytes: &[u8]) {
        if bytes.len() < MIN_STRREF_LEN {
            Plain::Str(bytes).encode(&mut self.w);
            return;
        }
        match self.sc.refs.get_or_insert(obj, IdSpace::Str, self.nstrs) {
            Some(old) => Plain::StrRef(old as u64).encode(&mut self.w),
            None => {
                self.nstrs += 1;
                Plain::Str(bytes).encode(&mut self.w);
                self.sc.unanchored.push(obj);
            }
        }
    }

    /// Writes the boolean on top (left there).
    ///
    /// # Safety
    /// A boolean is on top.
    pub(super) unsafe fn boolean_on_top(&mut self, L: *mut lua_State) {
        // SAFETY: callers' contract.
        let b = unsafe { ffi::lua_toboolean(L, -1) } != 0;
        let v = if b { Plain::True } else { Plain::False };
        v.encode(&mut self.w);
    }

    /// Writes the number on top (left there): integers and floats apart.
    ///
    /// # Safety
    /// A number is on top.
    pub(super) unsafe fn number_on_top(&mut self, L: *mut lua_State) {
        // SAFETY: callers' contract.
        let is_integer = unsafe { ffi::lua_isinteger(L, -1) } != 0;
        if is_integer {
            // SAFETY: an integer is on top: no conversion.
            let i = unsafe { ffi::lua_tointegerx(L, -1, std::ptr::null_mut()) };
            Plain::Int(i).encode(&mut self.w);
        } else {
            // SAFETY: a float is on top: no conversion.
            let f = unsafe { ffi::lua_tonumberx(L, -1, std::ptr::null_mut()) };
            Plain::Float(f.to_bits()).encode(&mut self.w);
        }
    }

    /// Writes the string on top (left there).
    ///
    /// # Safety
    /// A string is on top (**Alive** while it is written: nothing pops it meanwhile).
    #[inline]
    pub(super) unsafe fn string_on_top(&mut self, L: *mut lua_State) {
        let mut len = 0;
        // SAFETY: callers' contract; a string converts nothing and allocates nothing.
        let (p, obj) = unsafe {
            (
                ffi::lua_tolstring(L, -1, &mut len),
                ffi::lua_topointer(L, -1),
            )
        };
        // SAFETY: the string's bytes, alive while it is on the stack.
        let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
        self.string(obj, bytes);
    }

    /// Writes the light userdata on top (left there), by address.
    ///
    /// # Safety
    /// A light userdata is on top.
    pub(super) unsafe fn light_on_top(&mut self, L: *mut lua_State) {
        // SAFETY: callers' contract.
        let p = unsafe { ffi::lua_touserdata(L, -1) } as u64;
        Plain::Light(p).encode(&mut self.w);
    }
}
