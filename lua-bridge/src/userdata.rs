//! Plain-data userdata: Rust values stored inline in the Lua heap.
//!
//! A userdata type is any [`bytemuck::Pod`] type: no pointers, no padding, every bit pattern
//! valid. Its bytes live in the arena, so it rolls back with everything else, can be persisted
//! byte for byte, and no Rust memory is ever reachable from Lua.

use crate::error::NativeError;
use crate::ffi::Call;

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
pub trait PlainData: bytemuck::Pod {
    /// The type's name, unique in a VM; shown in error messages and used by `__name`.
    const NAME: &'static str;
}

/// A method of a userdata type: receives the value (mutable, written back after the call) and
/// the call's other arguments (argument 0 is the userdata itself).
pub type Method<T> = Box<dyn Fn(&mut T, &mut Call<'_>) -> Result<(), NativeError>>;

/// The methods and metamethods of a userdata type, collected at registration.
pub struct UserDataMethods<T: PlainData> {
    pub(crate) methods: Vec<(String, Method<T>)>,
}

impl<T: PlainData> UserDataMethods<T> {
    pub(crate) fn new() -> Self {
        UserDataMethods {
            methods: Vec::new(),
        }
    }

    /// Adds a method (`obj:name(...)`), or a metamethod if `name` starts with `__`
    /// (`__add`, `__eq`, `__tostring`, `__len`, ...).
    pub fn method(
        &mut self,
        name: &str,
        f: impl Fn(&mut T, &mut Call<'_>) -> Result<(), NativeError> + 'static,
    ) -> &mut Self {
        self.methods.push((name.to_string(), Box::new(f)));
        self
    }
}
