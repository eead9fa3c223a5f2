//! The crate's umbrella error: every error of the VM, save-games and the runtime in one type.
//!
//! It names an error of each layer (`bridge`, `persist`, `runtime`), so it lives here at the
//! crate root, above all three: no layer imports a layer above it.

use crate::bridge::error::VmError;
use crate::persist::{LoadError, SaveError};
use crate::runtime::GameError;
use luasnap_alloc::ArenaError;
use luasnap_snap::SnapError;

/// Every error of this crate in one type, for applications that want a single `?` target.
///
/// The specific types stay: [`VmError`] for running Lua, [`SaveError`] and [`LoadError`] for
/// save-games, [`GameError`] for the runtime. Each converts into this one with `?`, and
/// [`NativeError`](crate::NativeError) accepts any of them inside a native.
///
/// ```
/// use luasnap_bridge::{Error, Vm};
///
/// fn run() -> Result<Vec<u8>, Error> {
///     let vm = Vm::builder().capacity(64 << 20).build()?;     // VmError
///     vm.exec("score = 1", "setup")?;                          // VmError
///     Ok(vm.save_game()?)                                       // SaveError
/// }
/// assert!(!run().unwrap().is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Running Lua, converting values, snapshots.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Writing a save-game.
    #[error(transparent)]
    Save(#[from] SaveError),
    /// Reading a save-game.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The game runtime.
    #[error(transparent)]
    Game(#[from] GameError),
}

impl From<ArenaError> for Error {
    fn from(e: ArenaError) -> Error {
        Error::Vm(e.into())
    }
}

impl From<SnapError> for Error {
    fn from(e: SnapError) -> Error {
        Error::Vm(e.into())
    }
}
