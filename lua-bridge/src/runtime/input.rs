//! What a game's host supplies: per-player inputs of a type the game chooses, and a setup hook
//! that registers natives and userdata on the game's VM.

use crate::bridge::error::VmError;
use crate::bridge::value::PlainData;
use crate::bridge::value::Value;
use crate::bridge::vm::VmBuilder;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// One player's input for one frame, as the game's `G.step(inputs)` sees it: `inputs[p]` is
/// [`to_lua`](GameInput::to_lua) of player `p`'s input.
///
/// Integers and `bool` are implemented (a number, a boolean). For your own type, derive serde
/// and write `impl GameInput for Pad {}`: it reaches Lua as a table (see
/// [`serde_value`](crate::bridge::serde_value)). Wrap a plain-data type in [`PodInput`] to hand Lua a
/// userdata instead. GGRS needs `Copy + PartialEq + Default + Serialize + Deserialize` too.
///
/// ```
/// use luasnap_bridge::runtime::GameInput;
///
/// #[derive(Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
/// struct Pad { dx: i8, dy: i8, fire: bool }
/// impl GameInput for Pad {}
///
/// let v = Pad { dx: 1, dy: 0, fire: true }.to_lua().unwrap();
/// assert_eq!(v.as_table().unwrap().get("fire"), Some(&luasnap_bridge::Value::Boolean(true)));
/// ```
pub trait GameInput: Clone + Serialize {
    /// The Lua value of this input (a serde conversion unless overridden).
    fn to_lua(&self) -> Result<Value, VmError> {
        crate::bridge::serde_value::to_value(self)
    }
}

macro_rules! plain_inputs {
    ($($t:ty),*) => {$( impl GameInput for $t {} )*};
}
plain_inputs!(u8, u16, u32, i8, i16, i32, i64, bool);

/// A plain-data input that reaches Lua as a userdata of type `T` (register `T` in the game's
/// [`VmSetup`] with [`VmBuilder::userdata`]). On the wire (GGRS) it is its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodInput<T>(pub T);

impl<T: PlainData> Default for PodInput<T> {
    fn default() -> Self {
        PodInput(T::zeroed())
    }
}

impl<T: PlainData> Serialize for PodInput<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytemuck::bytes_of(&self.0))
    }
}

impl<'de, T: PlainData> Deserialize<'de> for PodInput<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: Vec<u8> = serde::de::Deserialize::deserialize(d)?;
        if bytes.len() != std::mem::size_of::<T>() {
            return Err(serde::de::Error::invalid_length(
                bytes.len(),
                &"the size of the input type",
            ));
        }
        Ok(PodInput(bytemuck::pod_read_unaligned(&bytes)))
    }
}

impl<T: PlainData> GameInput for PodInput<T> {
    fn to_lua(&self) -> Result<Value, VmError> {
        Ok(Value::userdata(self.0))
    }
}

/// Registers natives and userdata types on a game's VM before the game's script runs (see
/// [`GameConfig::setup`](crate::runtime::GameConfig::setup)). Runs once per VM: every peer,
/// every `Game::new` and `Game::from_save`.
///
/// ```
/// use luasnap_bridge::runtime::{GameConfig, VmSetup};
///
/// let mut cfg = GameConfig::default_game(2, 1);
/// cfg.setup = VmSetup::new(|b| {
///     b.native("host.clamp", |call| {
///         let (x, lo, hi) = (call.number(0)?, call.number(1)?, call.number(2)?);
///         call.ret(x.clamp(lo, hi));
///         Ok(())
///     })
/// });
/// ```
#[derive(Clone, Default)]
pub struct VmSetup(Option<Arc<dyn Fn(VmBuilder) -> VmBuilder + Send + Sync>>);

impl VmSetup {
    /// A hook adding natives and userdata to the builder.
    pub fn new(f: impl Fn(VmBuilder) -> VmBuilder + Send + Sync + 'static) -> VmSetup {
        VmSetup(Some(Arc::new(f)))
    }

    /// Applies the hook (or nothing).
    pub fn apply(&self, b: VmBuilder) -> VmBuilder {
        match &self.0 {
            Some(f) => f(b),
            None => b,
        }
    }
}

impl std::fmt::Debug for VmSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "VmSetup(hook)"
        } else {
            "VmSetup(none)"
        })
    }
}
