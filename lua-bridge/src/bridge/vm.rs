//! The VM: a Lua 5.5 state whose every allocation comes from one arena.

use crate::bridge::anchors::Anchors;
use crate::bridge::budget::RunningBudget;
use crate::bridge::error::{LuaErrorKind, NativeError, VmError};
use crate::bridge::ffi::{self as raw, LuaFailure, UserDataType};
use crate::bridge::helpers::{
    luasnap_chunks_install, luasnap_clear_dead_stack, luasnap_det_randomseed, luasnap_det_sort,
    luasnap_fresh_keys, luasnap_gc_defer_begin, luasnap_gc_defer_end, luasnap_gc_full_quiet,
    luasnap_gc_nopoints, luasnap_gc_quiet, luasnap_gc_uncounted, luasnap_key_counter,
    luasnap_strtab_longest_chain,
};
use crate::bridge::modules::{self, Module, ModuleState};
use crate::bridge::natives::{self, Call, NativeFn, NativeState};
use crate::bridge::per_vm::Registered;
use crate::bridge::userdata::{EntryKind, UserDataMethods};
use crate::bridge::value::PlainData;
use crate::bridge::value::Value;
use crate::bridge::warn::{self, WarnState};
use luasnap_alloc::{Arena, ArenaStats, TrackerPreference};
use luasnap_snap::{CopyStrategy, RingConfig, Snapshot, SnapshotId, SnapshotMode, SnapshotRing};
use mlua_sys::{self as ffi, lua_State};
use std::any::Any;
use std::cell::Cell;
use std::ffi::{c_int, CStr, CString};
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::ptr::NonNull;

/// Default arena reservation: 4 GiB of address space, committed only as used.
pub const DEFAULT_CAPACITY: usize = 4 << 30;

/// Registry key of the permanent natives table (name → function).
const NATIVES_KEY: &std::ffi::CStr = c"luasnap.natives";

/// Which standard libraries and sources of nondeterminism a VM has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The full standard library, a random string-hash seed: what `luasnap run` uses.
    Standard,
    /// For games that must replay identically across runs, processes and peers:
    /// a fixed string-hash seed and `math.random` seed derived from `seed`; no `io`, `os`,
    /// `package`, `dofile` or `loadfile`, and of `debug` only `debug.traceback`; `load` accepts source text only (never
    /// bytecode); and `table.sort` is Lua's own quicksort with a deterministic pivot (stock
    /// Lua re-randomizes it from the clock on badly imbalanced partitions), so its result
    /// depends only on the input and the comparator. See `docs/determinism.md` for what it guarantees.
    Deterministic {
        /// Seeds the string hash and `math.random`.
        seed: u64,
    },
}

/// Garbage-collector mode and parameters. `None` keeps Lua's default for a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcMode {
    /// Incremental mark and sweep.
    Incremental {
        /// Pause between cycles, in percent of the heap after the last cycle.
        pause: Option<i32>,
        /// Work per step, in percent.
        step_multiplier: Option<i32>,
        /// Step granularity (Lua 5.5 `LUA_GCPSTEPSIZE`).
        step_size: Option<i32>,
    },
    /// Generational: frequent minor collections of young objects.
    Generational {
        /// Minor collection frequency, in percent of heap growth.
        minor_multiplier: Option<i32>,
        /// Threshold to shift from major back to minor collections (`LUA_GCPMAJORMINOR`).
        major_minor: Option<i32>,
        /// Threshold to shift from minor to major collections (`LUA_GCPMINORMAJOR`).
        minor_major: Option<i32>,
    },
}

impl GcMode {
    /// Incremental with Lua's default parameters.
    pub const INCREMENTAL: GcMode = GcMode::Incremental {
        pause: None,
        step_multiplier: None,
        step_size: None,
    };
    /// Generational with Lua's default parameters.
    pub const GENERATIONAL: GcMode = GcMode::Generational {
        minor_multiplier: None,
        major_minor: None,
        minor_major: None,
    };
}

type PendingNative = (
    String,
    Box<dyn Fn(&mut Call<'_>) -> Result<(), NativeError>>,
    bool,
);
type PendingUserData = Box<dyn FnOnce(&mut Vm) -> Result<(), VmError>>;

/// What a layer above the bridge adds to every VM a builder makes, without the bridge knowing
/// the layer: the save-game layer adds its permanents and the `eris` module
/// (`persist/install.rs`, which also defines [`Vm::builder`] with it).
#[derive(Clone, Copy)]
pub(crate) struct Extension {
    /// Runs once the profile's libraries are open (and the deterministic prelude ran), before
    /// natives and userdata types are registered.
    pub install: fn(&mut Vm) -> Result<(), VmError>,
    /// Runs inside the protected body that registers a native, with the native's closure on
    /// top of the stack, which it pops; `name` is the native's path.
    ///
    /// # Safety
    /// Called in a protected context (it may allocate) with a value on top.
    pub native_added: unsafe fn(*mut lua_State, &CStr),
}

/// Builds a [`Vm`]; see [`Vm::builder`].
pub struct VmBuilder {
    capacity: usize,
    base: Option<usize>,
    limit: Option<usize>,
    profile: Profile,
    ring: RingConfig,
    gc: Option<GcMode>,
    quiet: Option<bool>,
    fresh_keys: Option<bool>,
    natives: Vec<PendingNative>,
    userdata: Vec<PendingUserData>,
    extensions: Vec<Extension>,
    modules: Vec<Module>,
    module_folder: Option<modules::ModuleFolder>,
}

impl VmBuilder {
    /// A builder with the defaults and no extension (see [`Vm::builder`], which adds the
    /// layers above the bridge).
    pub(crate) fn bare() -> VmBuilder {
        VmBuilder {
            capacity: DEFAULT_CAPACITY,
            base: None,
            limit: None,
            profile: Profile::Standard,
            ring: RingConfig {
                mode: SnapshotMode::Incremental(TrackerPreference::Auto),
                ..RingConfig::default()
            },
            gc: None,
            quiet: None,
            fresh_keys: None,
            natives: Vec::new(),
            userdata: Vec::new(),
            extensions: Vec::new(),
            modules: Vec::new(),
            module_folder: None,
        }
    }

    /// Adds a layer's extension (run in the order added).
    pub(crate) fn extension(mut self, extension: Extension) -> Self {
        self.extensions.push(extension);
        self
    }

    /// Address space reserved for the arena (default [`DEFAULT_CAPACITY`]).
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = bytes;
        self
    }

    /// Place the arena at a fixed address, so two processes lay out objects identically
    /// (pointer-keyed tables iterate in the same order, `tostring` of tables agrees).
    pub fn base_address(mut self, address: usize) -> Self {
        self.base = Some(address);
        self
    }

    /// Cap the Lua heap: past it, allocations fail with Lua's "not enough memory" error,
    /// which `pcall` can catch. The cap counts the bytes of live blocks (a small block at its
    /// size class, a large one in whole pages; the cap itself is counted in whole 4 KiB
    /// pages), as a capping `lua_Alloc` wrapper around malloc counts them, from the Lua state
    /// with its standard library on: what luasnap itself adds when it builds the VM (the
    /// save-game permanents, the `eris` module, the chunk registry, natives and userdata
    /// types, about 27 KB) is not counted, so a cap means what it means for stock Lua. The
    /// pages the arena holds for the blocks (free slots of partly used spans included) may
    /// reach at most twice the cap plus one span per size class. A cap below what the
    /// standard library needs fails [`build`](VmBuilder::build) with a memory error.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.limit = Some(bytes);
        self
    }

    /// The library profile (default [`Profile::Standard`]).
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = profile;
        self
    }

    /// Shorthand for `profile(Profile::Deterministic { seed })`.
    pub fn deterministic(self, seed: u64) -> Self {
        self.profile(Profile::Deterministic { seed })
    }

    /// Gives the deterministic profile's `require` a module (`require(module.name)` loads
    /// it, as the chunk `@module.path`); a module of the same name replaces an earlier one,
    /// and one given here is found before the folder's ([`module_folder`](VmBuilder::module_folder)).
    /// The standard profile's `require` searches `package.path` as stock Lua's does and does
    /// not see these.
    pub fn module(mut self, module: Module) -> Self {
        self.modules.retain(|m| m.name != module.name);
        self.modules.push(module);
        self
    }

    /// The game's folder: the deterministic profile's `require "a.b"` loads `a/b.lua`, else
    /// `a/b/init.lua`, from it (read the first time it is required), and nothing from outside
    /// it; its chunks are named by their paths in the folder (`@a/b.lua`), so a game moved
    /// elsewhere keeps its saves. See [`Module`] and [`Vm::module`].
    pub fn module_folder(mut self, dir: impl Into<PathBuf>) -> Self {
        let files = modules::FolderFiles::lazy(dir);
        self.module_folder = Some(modules::ModuleFolder(std::sync::Arc::new(files)));
        self
    }

    /// [`module_folder`](VmBuilder::module_folder) through `files`, shared with other VMs:
    /// a module any of them read is not read again, and all of them run its same bytes.
    pub(crate) fn module_files(mut self, files: std::sync::Arc<modules::FolderFiles>) -> Self {
        self.module_folder = Some(modules::ModuleFolder(files));
        self
    }

    /// Snapshots retained (default 8).
    pub fn window(mut self, snapshots: usize) -> Self {
        self.ring.window = snapshots;
        self
    }

    /// How snapshots are copied (default: incremental with the best page tracker).
    pub fn snapshot_mode(mut self, mode: SnapshotMode) -> Self {
        self.ring.mode = mode;
        self
    }

    /// Fraction of pages written per snapshot above which the snapshot copies everything and
    /// page tracking pauses (default: the tracker's break-even). `1.0` never pauses.
    pub fn full_copy_above(mut self, fraction: f64) -> Self {
        self.ring.full_copy_above = Some(fraction);
        self
    }

    /// The garbage collector's mode and parameters.
    pub fn gc(mut self, mode: GcMode) -> Self {
        self.gc = Some(mode);
        self
    }

    /// Whether collections other than full ones asked for ([`Vm::gc_collect`],
    /// `collectgarbage()`) are quiet: clear no weak entry and call no finalizer, so that when
    /// the collector runs changes no result (Lua patch 10, `docs/gc.md`, "Collection points").
    /// Default: quiet in the deterministic profile, stock in the standard one. Stock
    /// collections in the deterministic profile are for measuring what quiet ones cost: a
    /// game's results then follow the collector's schedule again.
    pub fn quiet_collections(mut self, on: bool) -> Self {
        self.quiet = Some(on);
        self
    }

    /// Whether a table entry that was removed and is set again with the same key (a table,
    /// function, C function, userdata, light userdata, thread or string: not a number or a
    /// boolean) is inserted anew, as it is once the
    /// collector has marked the old key dead, rather than stored back into its old node, as
    /// stock Lua does until then: so where the entry lands, and the order `pairs` gives, does
    /// not depend on when the collector ran (Lua patch 11, `docs/determinism.md`). Default: on
    /// in the deterministic profile, off in the standard one. Off in the deterministic profile
    /// is for measuring what it costs: `pairs` order can then differ after a load.
    pub fn fresh_keys(mut self, on: bool) -> Self {
        self.fresh_keys = Some(on);
        self
    }

    /// Registers a native: a Rust function Lua sees at the dotted global path `name` (tables
    /// on the way are created). Arguments are read from the [`Call`] (typed with
    /// [`Call::get`]), results added with [`Call::ret`], and Lua functions passed in can be
    /// called with [`Call::call_function`]; an `Err` or a panic becomes a Lua error.
    ///
    /// A path that already holds a value (`math.floor`, a global the profile defines) is
    /// refused when the VM is built ([`VmError::NativeOverride`]); use
    /// [`native_override`](VmBuilder::native_override) to replace it on purpose.
    pub fn native(
        mut self,
        name: &str,
        f: impl Fn(&mut Call<'_>) -> Result<(), NativeError> + 'static,
    ) -> Self {
        self.natives.push((name.to_string(), Box::new(f), false));
        self
    }

    /// Like [`native`](VmBuilder::native), but replaces the value already at `name` (a
    /// standard library function, say) instead of refusing to.
    pub fn native_override(
        mut self,
        name: &str,
        f: impl Fn(&mut Call<'_>) -> Result<(), NativeError> + 'static,
    ) -> Self {
        self.natives.push((name.to_string(), Box::new(f), true));
        self
    }

    /// Registers a plain-data userdata type with its methods.
    pub fn userdata<T: PlainData>(
        mut self,
        methods: impl FnOnce(&mut UserDataMethods<T>) + 'static,
    ) -> Self {
        self.userdata.push(Box::new(move |vm: &mut Vm| {
            vm.register_userdata::<T>(methods)
        }));
        self
    }

    /// Creates the arena and the Lua state, opens the profile's libraries and registers
    /// everything.
    pub fn build(self) -> Result<Vm, VmError> {
        let mut arena = {
            let mut b = Arena::builder().capacity(self.capacity);
            if let Some(base) = self.base {
                b = b.base_address(base);
            }
            // The limit is set once the VM is built (see `memory_limit`).
            b.build()?
        };
        let seed = match self.profile {
            Profile::Deterministic { seed } => seed,
            Profile::Standard => RandomState::new().hash_one(std::time::SystemTime::now()),
        };
        // The Rust state Lua's callbacks find by the arena's base: registered until the Vm (or,
        // on failure below, this function) drops it, after the Lua state is closed.
        let base = arena.base().as_ptr() as usize;
        let too_many = || VmError::Conversion {
            what: "a new VM: too many VMs alive in this process (4096); drop some first".into(),
        };
        let natives = natives::register(base).ok_or_else(too_many)?;
        let warn = warn::register(base).ok_or_else(too_many)?;
        let modules =
            modules::register(base, self.modules, self.module_folder).ok_or_else(too_many)?;
        let ud = arena.raw().as_ptr();
        // The arena's allocator, behind a layer that scrubs freed stacks.
        let alloc: ffi::lua_Alloc = crate::bridge::canonical::scrubbing_alloc;
        let hash_seed = (seed ^ (seed >> 32)) as u32;
        // SAFETY: the allocator and its ud come from `arena`, which the Vm owns and drops after
        // closing the state; Lua calls it only from this thread.
        let state = unsafe { ffi::lua_newstate(alloc, ud, hash_seed) };
        let Some(state) = NonNull::new(state) else {
            return Err(VmError::Lua {
                kind: LuaErrorKind::Memory,
                message: "not enough memory to create the Lua state".into(),
                traceback: None,
                value: None,
            });
        };
        let L = state.as_ptr();
        // SAFETY: a fresh main thread; the warn function's state is registered under the
        // arena's base (its `ud`) until the Vm is dropped, after the state is closed.
        unsafe {
            ffi::lua_atpanic(L, raw::at_panic);
            ffi::lua_setwarnf(L, Some(warn::warn_to_stderr), arena.base().as_ptr().cast());
        }
        let deterministic = matches!(self.profile, Profile::Deterministic { .. });
        if self.quiet.unwrap_or(deterministic) {
            // What a game sees of the collector (weak entries cleared, finalizers called)
            // happens only at full collections asked for, never at the moments the heap's
            // history picks (a load's heap has another): see `Vm::gc_collect`.
            // SAFETY: sets a flag of a fresh state; no collection is running.
            unsafe { luasnap_gc_quiet(L, 1) };
        }
        if self.fresh_keys.unwrap_or(deterministic) {
            // Where a removed key set again lands does not follow the collector's schedule.
            // SAFETY: sets a flag of a fresh state; no table operation is running.
            unsafe { luasnap_fresh_keys(L, 1) };
        }
        let ring = match SnapshotRing::new(&mut arena, self.ring) {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: the state was never used; close it before its arena goes.
                unsafe { ffi::lua_close(L) };
                return Err(e.into());
            }
        };
        let mut vm = Vm {
            state,
            natives,
            budget_used: Cell::new(0),
            _warn: warn,
            modules,
            anchors: Anchors::new(),
            depth: Cell::new(0),
            ring,
            ring_config: self.ring,
            arena,
            profile: self.profile,
            extensions: self.extensions,
            parts: Vec::new(),
        };
        let stock_bytes = vm.open_libraries(seed)?;
        vm.run(
            &mut |L| {
                // SAFETY: protected body on the main thread, before any snapshot.
                unsafe { vm.anchors.install(L) };
                0
            },
            |_, _| (),
        )?;
        for (name, f, replace) in self.natives {
            vm.register_boxed_native(name, f, replace)?;
        }
        for register in self.userdata {
            register(&mut vm)?;
        }
        if let Some(mode) = self.gc {
            vm.set_gc_mode(mode)?;
        }
        // Setup left values in dead stack slots (one of them clock-derived, from math's
        // initial seed): clear them, so two VMs built alike are byte-identical.
        // SAFETY: the state is idle; only slots above the top are written.
        unsafe { raw::finish_host_call(vm.L()) };
        // SAFETY: as above.
        unsafe { luasnap_clear_dead_stack(vm.L()) };
        if let Some(limit) = self.limit {
            vm.apply_memory_limit(limit, stock_bytes)?;
        }
        Ok(vm)
    }
}

/// A Lua 5.5 VM living entirely in one arena, with snapshot and rollback.
///
/// Lua code runs through `&self` ([`exec`](Vm::exec), [`call`](Vm::call), [`Function`](crate::Function));
/// snapshot and rollback take `&mut self`, so the borrow checker forbids any handle into the
/// VM from outliving a rollback:
///
/// ```compile_fail,E0502
/// # use luasnap_bridge::Vm;
/// let mut vm = Vm::builder().capacity(64 << 20).build().unwrap();
/// vm.exec("function f() return 1 end", "setup").unwrap();
/// let id = vm.snapshot().unwrap();
/// let f = vm.function("f").unwrap();
/// vm.rollback(id).unwrap(); // error[E0502]: `vm` is borrowed by `f`
/// f.call::<i64>(()).unwrap();
/// ```
///
/// (With a `&self` method in `rollback`'s place the same code compiles: `tests/bridge.rs`,
/// `the_compile_fail_examples_fail_only_for_the_borrow`.) Natives cannot reach the VM at all:
/// a native is `'static`, so it cannot borrow one (and a snapshot would need `&mut` besides):
///
/// ```compile_fail,E0597
/// # use luasnap_bridge::Vm;
/// let vm = Vm::builder().capacity(64 << 20).build().unwrap();
/// let vm_ref = &vm;
/// let other = Vm::builder()
///     .capacity(64 << 20)
///     .native("peek", move |call| {
///         call.ret(vm_ref.lua_memory() as i64);
///         Ok(())
///     })
///     .build()
///     .unwrap(); // error[E0597]: the native must be 'static, and `vm_ref` borrows `vm`
/// ```
pub struct Vm {
    state: NonNull<lua_State>,
    /// Natives, userdata types and what natives stage (`natives.rs`): the trampoline's part.
    pub(crate) natives: Registered<NativeState>,
    /// Instructions the last `call_with_budget` charged (`budget.rs`).
    budget_used: Cell<u64>,
    /// The warn function's part (`warn.rs`), used only by Lua's calls of it.
    _warn: Registered<WarnState>,
    /// The modules `require` finds (`modules.rs`).
    pub(crate) modules: Registered<ModuleState>,
    /// What the layers above keep for this VM (the save-game loader's budget), registered by
    /// their extensions (see [`Extension`]); dropped after the Lua state is closed.
    ///
    /// Every registration (this and the fields above) is declared before `arena`, so it is
    /// released before the arena is unmapped: another thread's new VM may get the same base
    /// address as soon as it is unmapped, and must not find this VM's parts under it.
    parts: Vec<Box<dyn Any>>,
    /// The Lua objects of live handles (`anchors.rs`).
    pub(crate) anchors: Anchors,
    /// Host calls into Lua running: 0 or 1 (a call from inside a native is refused).
    depth: Cell<u32>,
    ring: SnapshotRing,
    ring_config: RingConfig,
    pub(crate) arena: Arena,
    profile: Profile,
    /// The layers above the bridge that this VM carries (see [`Extension`]).
    extensions: Vec<Extension>,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("profile", &self.profile)
            .field("arena", &self.arena)
            .field("ring", &self.ring)
            .finish()
    }
}

/// Lua instructions that the finalizers and `__close` handlers a [`Vm`] runs when it is dropped
/// (Lua's `lua_close`) may execute in all; past them each is stopped (Lua reports that as a
/// warning), so dropping a VM always ends. A game function that a foreign save made a
/// finalizer could otherwise keep the drop from returning.
pub const CLOSE_BUDGET: u64 = 100_000_000;

impl Drop for Vm {
    fn drop(&mut self) {
        // Finalizers and `__close` handlers that `lua_close` runs are counted against
        // CLOSE_BUDGET (or what a budgeted call that drops this VM has left: one budget per
        // OS thread), and stopped past it (Lua patch 8).
        let budget = RunningBudget::begin(CLOSE_BUDGET, crate::bridge::budget::CLOSE);
        // SAFETY: the state is idle (nothing borrows the Vm) and the arena is still alive;
        // closing runs finalizers in protected mode and frees everything into the arena.
        unsafe { ffi::lua_close(self.state.as_ptr()) };
        drop(budget);
        // The per-VM parts (fields) are dropped next, releasing their registrations, then
        // the arena (declared after them).
    }
}

const DETERMINISTIC_PRELUDE: &str = r##"
local seed = ...
math.randomseed(seed)
dofile, loadfile = nil, nil
local rawload, select = load, select
-- Source text only, never bytecode.
function load(chunk, name, mode, ...)
  if select("#", ...) > 0 then return rawload(chunk, name, "t", ...) end
  return rawload(chunk, name, "t")
end
"##;

impl Vm {
    fn L(&self) -> *mut lua_State {
        self.state.as_ptr()
    }

    /// Keeps a part of a layer above the bridge (its registration in a per-VM table) until
    /// the Vm is dropped, after its Lua state is closed. For extensions' `install`.
    pub(crate) fn keep(&mut self, part: Box<dyn Any>) {
        self.parts.push(part);
    }

    /// Where the VM's arena starts: the key of its per-VM state (`per_vm.rs`).
    pub(crate) fn arena_base(&self) -> usize {
        self.arena.base().as_ptr() as usize
    }

    /// The number of strings in the longest chain of Lua's string table: interning a string
    /// walks the chain its keyed hash picks (Lua patch 9), so this stays small whatever
    /// strings a save-game brings. For tests.
    #[doc(hidden)]
    pub fn string_table_longest_chain(&self) -> usize {
        // SAFETY: reads the string table of our state, which nothing changes meanwhile (no
        // Lua code runs: `&self` and no allocation).
        unsafe { luasnap_strtab_longest_chain(self.L()) as usize }
    }

    /// Calls the function at `path` like [`Vm::call`], stopping its Lua code once it has run
    /// more than `budget` Lua VM instructions: the call then fails with
    /// [`VmError::InstructionBudget`] and the VM stays usable (roll back to a snapshot taken
    /// before the call to undo what it did half-way). The runtime runs `G.step` this way
    /// ([`GameConfig::step_budget`](crate::runtime::GameConfig::step_budget)).
    ///
    /// How instructions are counted: Lua's VM charges a Lua function one instruction as it
    /// is called and, as it returns or tail-calls, the instructions up to where it does; a
    /// loop, each time it goes round, the length of its body (a patch to Lua: patch 6 of
    /// `csrc/lua-5.5.1/LUASNAP-PATCHES.md`). That is close to the instructions run (code a
    /// forward jump skips is charged too), costs a subtraction and a branch per call, return
    /// and loop round (a count hook costs a C call per instruction), and code that never ends
    /// always pays: it must call, return or jump back.
    ///
    /// What is counted: all Lua code this OS thread runs during the call, on the main thread
    /// and in every coroutine (the budget belongs to the OS thread, not to a `lua_State`, so a
    /// coroutine created before the call is covered with nothing passed on). Not counted:
    /// time inside C functions (a long `string.rep`). Finalizers (`__gc`) that the collector
    /// runs during the call are counted and stopped too (Lua runs them with hooks off; Lua
    /// patch 8 keeps hooks allowed for them when the thread has no debug hook of its own): a
    /// finalizer still running when the budget is spent is stopped, Lua reports that as a
    /// warning, and the call fails. Nothing is stopped while Lua's hooks are off: in a debug
    /// hook, and in the message handler of the budget's error.
    ///
    /// Once the budget is spent, Lua code fails at each call, return and backward jump, so a
    /// `pcall` in the game catches the error only to fail again at the next one outside it:
    /// the error reaches the host. The budget leaves nothing in the arena (snapshots,
    /// rollbacks and save-games do not see it): two runs of the same calls leave the same
    /// bytes whatever their budgets, if neither is spent. One budgeted call at a time per OS
    /// thread: a budgeted call made while another runs on the thread (from a native, into
    /// another VM) fails with [`VmError::LuaRunning`]. [`Vm::last_budget_used`] says how
    /// much of its budget the last call charged.
    ///
    /// ```
    /// # use luasnap_bridge::{Vm, VmError};
    /// let mut vm = Vm::builder().capacity(64 << 20).build()?;
    /// vm.exec("n = 0 function spin() while true do n = n + 1 end end
    ///          function count(k) for _ = 1, k do n = n + 1 end end", "setup")?;
    /// let before = vm.snapshot()?;
    /// let e = vm.call_with_budget::<()>("spin", (), 1_000_000).unwrap_err();
    /// assert!(matches!(e, VmError::InstructionBudget { budget: 1_000_000, .. }));
    /// vm.rollback(before)?;
    /// vm.call_with_budget::<()>("count", 1000, 1_000_000)?; // well within the budget
    /// assert_eq!(vm.get::<i64>("n")?, 1000);
    /// assert!(vm.last_budget_used() > 1000); // the loop's 1000 rounds, and the calls
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn call_with_budget<'h, R: crate::bridge::convert::FromLuaMulti>(
        &self,
        path: &str,
        args: impl crate::bridge::convert::IntoLuaMulti<'h>,
        budget: u64,
    ) -> Result<R, VmError> {
        self.budgeted(budget, || self.call(path, args))
    }

    /// Runs `f` under an instruction budget (see [`Vm::call_with_budget`]): the runtime runs
    /// every call into a game this way (its script's top level, `G.init`, `G.digest()`).
    pub(crate) fn budgeted<R>(
        &self,
        budget: u64,
        f: impl FnOnce() -> Result<R, VmError>,
    ) -> Result<R, VmError> {
        if self.depth.get() != 0 {
            return Err(VmError::LuaRunning {
                operation: "call into Lua from inside a native",
            });
        }
        let Some(running) = RunningBudget::begin(budget, crate::bridge::budget::CALL) else {
            return Err(VmError::LuaRunning {
                operation: "a budgeted call while another runs on the same thread",
            });
        };
        let out = f();
        let outcome = running.end();
        self.budget_used.set(outcome.used);
        if !outcome.spent {
            return out;
        }
        // Spent, even if a pcall in the callee swallowed the last error: what it did is
        // incomplete.
        Err(VmError::InstructionBudget {
            budget,
            location: outcome.location,
            traceback: match out {
                Err(VmError::Lua { traceback, .. }) => traceback,
                _ => None,
            },
        })
    }

    /// The instructions the last [`Vm::call_with_budget`] charged (counted as it says; at
    /// most its budget): how close a call came to its budget.
    pub fn last_budget_used(&self) -> u64 {
        self.budget_used.get()
    }

    /// How many identities as table keys this VM has given: an object gets the next one the
    /// first time it becomes a key, and its position in every table follows from it
    /// (`docs/determinism.md`, "Key order"). A whole-game save carries the count and a load
    /// continues it, so two VMs that make the same calls number alike; a difference shows
    /// calls one made and the other did not (a host call that used a new object as a key).
    ///
    /// Identities themselves go up to 2^31 - 1, then start again at 1 (bit 31 marks the
    /// identities permanents take from their names): past that many, two keys may share one,
    /// which only shares a collision chain; this count goes on.
    pub fn key_identities(&self) -> u64 {
        // SAFETY: reads a counter of the global state, which is idle between host calls.
        unsafe { luasnap_key_counter(self.L()) }
    }

    /// Sets the count [`key_identities`](Vm::key_identities) reads, and so the next identity
    /// an object gets: for tests of a game that has keyed 2^31 objects, which would take
    /// minutes to key them one by one. Not for games: identities an object already has stay.
    #[doc(hidden)]
    pub fn set_key_identities_for_tests(&mut self, n: u64) {
        // SAFETY: sets a counter of the global state, which is idle between host calls
        // (`&mut self`); any value keeps the invariant (ltable.c, luaH_keyid).
        unsafe { crate::bridge::helpers::luasnap_set_key_counter(self.L(), n) }
    }

    /// Runs `body` with collections asked for refused (a `collectgarbage()` inside raises an
    /// error): for the host's reads of the game's state (`G.digest()`), which must not change
    /// it (Lua patch 10, `luasnap_gc_nopoints`).
    pub(crate) fn refusing_collections<R>(&self, body: impl FnOnce() -> R) -> R {
        /// Restores the flag when dropped, so that a panic in `body` leaves it as it was.
        struct Restore(*mut lua_State, c_int);
        impl Drop for Restore {
            fn drop(&mut self) {
                // SAFETY: sets a flag of the global state; `body` has returned or unwound.
                unsafe { luasnap_gc_nopoints(self.0, self.1) };
            }
        }
        // SAFETY: sets a flag of the global state between host calls (no Lua code runs).
        let _restore = Restore(self.L(), unsafe { luasnap_gc_nopoints(self.L(), 1) });
        body()
    }

    /// Runs `body`, a host read of the state, with the collector's steps deferred to the
    /// game's next allocation check (`luasnap_gc_defer_begin`): a read of values that exist
    /// allocates nothing, so it leaves the arena as it was, and the next frame collects at the
    /// same allocation as in a run without the read. Without it a read's key push could take the
    /// step that was due, and a rollback followed by a read (`Game::load`) would collect at
    /// another moment than the straight run.
    pub(crate) fn reading<R>(&self, body: impl FnOnce() -> R) -> R {
        /// Gives the debt back when dropped, so that a panic in `body` does too.
        struct GiveBack(*mut lua_State, i64);
        impl Drop for GiveBack {
            fn drop(&mut self) {
                // SAFETY: sets the collector's debt of the global state; `body` has returned
                // or unwound, so no Lua code runs.
                unsafe { luasnap_gc_defer_end(self.0, self.1) };
            }
        }
        // SAFETY: sets the collector's debt between host calls (no Lua code runs).
        let _give_back = GiveBack(self.L(), unsafe { luasnap_gc_defer_begin(self.L()) });
        body()
    }

    /// Runs `body` protected, counting it as Lua running.
    pub(crate) fn run<R>(
        &self,
        body: &mut dyn FnMut(*mut lua_State) -> c_int,
        collect: impl FnOnce(*mut lua_State, c_int) -> R,
    ) -> Result<R, VmError> {
        let depth = &self.depth;
        if depth.get() != 0 {
            // Re-entry from inside a native (through shared ownership of the Vm): the main
            // thread's stack belongs to the running call, so refuse.
            return Err(VmError::LuaRunning {
                operation: "call into Lua from inside a native",
            });
        }
        depth.set(1);
        // SAFETY: our main thread, idle (depth was 0).
        let outcome = unsafe { raw::protected(self.L(), self.natives.registry.types(), body) };
        let result = match outcome {
            Ok(n) => {
                let r = collect(self.L(), n);
                // SAFETY: drop the results and the handler; clear the slots the call used.
                unsafe { raw::finish_host_call(self.L()) };
                Ok(r)
            }
            Err(LuaFailure {
                kind,
                message,
                traceback,
                value,
            }) => Err(VmError::Lua {
                kind,
                message: crate::bridge::error::explain_missing_native(
                    match self.profile {
                        Profile::Deterministic { .. } => {
                            crate::bridge::error::explain_left_out(message)
                        }
                        _ => message,
                    },
                    |namespace| self.natives.registry.has_namespace(namespace),
                ),
                traceback,
                value,
            }),
        };
        depth.set(0);
        // Staged results of natives interrupted by errors are garbage now.
        // SAFETY: no native is running (depth 0).
        unsafe { self.natives.staging.clear() };
        result
    }

    pub(crate) fn collect_values(
        &self,
        L: *mut lua_State,
        n: c_int,
    ) -> Result<Vec<Value>, VmError> {
        (0..n)
            .map(|i| {
                // SAFETY: results sit at indices 2..=n+1; to_value does not raise.
                unsafe { raw::to_value(L, i + 2, self.natives.registry.types()) }.map_err(|what| {
                    VmError::Conversion {
                        what: format!("result #{}: {what}", i + 1),
                    }
                })
            })
            .collect()
    }

    /// Sets the arena's limit to `limit` plus what the VM holds beyond `stock_bytes` (the bytes
    /// of live blocks once the standard library was open): luasnap's own tables do not count
    /// against a user's cap. Not collected first: the build's garbage (the permanents' probes,
    /// about 10 KB) counts as luasnap's until a collection frees it (a VM built with
    /// [`VmBuilder::gc`] has collected it already: switching modes runs a full cycle), and
    /// collecting here would change what a fresh VM holds.
    fn apply_memory_limit(&mut self, limit: usize, stock_bytes: u64) -> Result<(), VmError> {
        use luasnap_alloc::{ArenaError, PAGE_SIZE};
        let built = self.arena.stats().bytes_allocated;
        let own = (built.saturating_sub(stock_bytes) as usize).next_multiple_of(PAGE_SIZE);
        let too_small = || {
            VmError::Lua {
            kind: LuaErrorKind::Memory,
            message: format!(
                "not enough memory to create the Lua state under a memory limit of {limit} bytes (its standard library alone holds {stock_bytes} bytes of blocks)"
            ),
            traceback: None,
            value: None,
        }
        };
        let rounded = limit / PAGE_SIZE * PAGE_SIZE;
        if (rounded as u64) < stock_bytes {
            return Err(too_small());
        }
        match self.arena.set_limit(rounded.saturating_add(own)) {
            Ok(()) => Ok(()),
            Err(ArenaError::LimitBelowUsage { .. }) => Err(too_small()),
            // Above the capacity: the arena's error says so, with the user's figure.
            Err(ArenaError::LimitAboveCapacity { usable, .. }) => {
                Err(ArenaError::LimitAboveCapacity { limit, usable }.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the profile's libraries and luasnap's own tables; returns the bytes of live
    /// blocks right after the standard library opened (what a stock state holds).
    fn open_libraries(&mut self, seed: u64) -> Result<u64, VmError> {
        let (mask, deterministic) = match self.profile {
            Profile::Standard => (!0, false),
            Profile::Deterministic { .. } => (
                ffi::LUA_GLIBK
                    | ffi::LUA_COLIBK
                    | ffi::LUA_TABLIBK
                    | ffi::LUA_STRLIBK
                    | ffi::LUA_MATHLIBK
                    | ffi::LUA_UTF8LIBK,
                true,
            ),
        };
        let mut stock_bytes = 0;
        let arena = &self.arena;
        self.run(
            &mut |L| {
                // SAFETY: protected body; may raise a memory error with nothing to drop.
                unsafe {
                    ffi::luaL_openselectedlibs(L, mask, 0);
                    stock_bytes = arena.stats().bytes_allocated;
                    crate::bridge::canonical::install(L);
                    crate::bridge::random_state::install(L);
                    ffi::lua_createtable(L, 0, 0);
                    ffi::lua_setfield(L, ffi::LUA_REGISTRYINDEX, NATIVES_KEY.as_ptr());
                }
                0
            },
            |_, _| (),
        )?;
        self.run(
            &mut |L| {
                // SAFETY: protected body; may raise a memory error with nothing to drop.
                unsafe { luasnap_chunks_install(L) };
                if deterministic {
                    // table.sort with a deterministic pivot (csrc/detsort.c).
                    // SAFETY: protected body; the libraries are open; balanced pushes.
                    unsafe {
                        let top = ffi::lua_gettop(L);
                        if ffi::lua_getglobal(L, c"table".as_ptr()) == ffi::LUA_TTABLE {
                            ffi::lua_pushcclosure(L, luasnap_det_sort, 0);
                            ffi::lua_setfield(L, -2, c"sort".as_ptr());
                        }
                        ffi::lua_settop(L, top);
                        // math.randomseed(): no seeding from the clock. The library's
                        // function becomes the wrapper's upvalue.
                        if ffi::lua_getglobal(L, c"math".as_ptr()) == ffi::LUA_TTABLE
                            && ffi::lua_getfield(L, -1, c"randomseed".as_ptr())
                                == ffi::LUA_TFUNCTION
                        {
                            ffi::lua_pushcclosure(L, luasnap_det_randomseed, 1);
                            ffi::lua_setfield(L, -2, c"randomseed".as_ptr());
                        }
                        ffi::lua_settop(L, top);
                        // `debug` holds `traceback` alone: error handlers written as
                        // `xpcall(f, debug.traceback)` are everywhere in game code, and a
                        // traceback names sources, lines and functions, never addresses.
                        // The rest of the library reads and writes locals, upvalues,
                        // hooks and the registry, so it stays out.
                        ffi::lua_pushcclosure(L, ffi::luaopen_debug, 0);
                        ffi::lua_callk(L, 0, 1, 0, None);
                        ffi::lua_createtable(L, 0, 1);
                        ffi::lua_getfield(L, -2, c"traceback".as_ptr());
                        ffi::lua_setfield(L, -2, c"traceback".as_ptr());
                        ffi::lua_setglobal(L, c"debug".as_ptr());
                        ffi::lua_settop(L, top);
                        // `require` finds the game's own modules only (modules.rs).
                        ffi::lua_pushcclosure(L, modules::require, 0);
                        ffi::lua_setglobal(L, c"require".as_ptr());
                    }
                }
                0
            },
            |_, _| (),
        )?;
        if deterministic {
            self.exec_with_args(
                DETERMINISTIC_PRELUDE,
                "=luasnap.deterministic",
                &[Value::Integer(seed as i64)],
            )?;
        }
        for extension in self.extensions.clone() {
            (extension.install)(self)?;
        }
        Ok(stock_bytes)
    }

    /// The module `require(name)` loads in this VM (given to its builder, or found in its
    /// game's folder), if there is one. Reading it from the folder makes it this VM's copy:
    /// `require` loads those bytes. See [`Module`].
    pub fn module(&self, name: &str) -> Result<Option<Module>, VmError> {
        self.modules.find(name).map_err(|e| VmError::Conversion {
            what: format!("module {name:?}: {e}"),
        })
    }

    // ----- running Lua -----

    /// Compiles and runs a chunk of Lua source (never bytecode) and returns its results.
    /// `name` appears in error messages and tracebacks.
    pub fn exec(&self, source: impl AsRef<[u8]>, name: &str) -> Result<Vec<Value>, VmError> {
        self.exec_with_args(source, name, &[])
    }

    /// Like [`exec`](Vm::exec), passing `args` to the chunk (its `...`).
    pub fn exec_with_args(
        &self,
        source: impl AsRef<[u8]>,
        name: &str,
        args: &[Value],
    ) -> Result<Vec<Value>, VmError> {
        let source = source.as_ref();
        let chunkname = crate::bridge::chunks::host_chunk_name(name)?;
        let types = self.natives.registry.types();
        let mut syntax_error = false;
        let out = self.run(
            &mut |L| {
                // SAFETY: protected body; raising skips only this frame and the ones above it,
                // which hold only references.
                unsafe {
                    // Through the chunk registry, which keeps the source text for saves.
                    let st = crate::bridge::chunks::load_host_chunk(L, source, &chunkname);
                    if st != ffi::LUA_OK {
                        syntax_error = st == ffi::LUA_ERRSYNTAX;
                        ffi::lua_error(L);
                    }
                    raw::call_with(L, args, types)
                }
            },
            |L, n| self.collect_values(L, n),
        );
        crate::bridge::chunks::as_syntax_error(out, syntax_error)?
    }

    pub(crate) fn checked_path(&self, path: &str) -> Result<CString, VmError> {
        if !crate::bridge::path::valid_path(path) {
            return Err(VmError::BadName { name: path.into() });
        }
        Ok(CString::new(path).expect("identifiers have no NUL"))
    }

    // ----- natives and userdata -----

    /// Registers a native after building (before the first snapshot only). Like
    /// [`VmBuilder::native`], a path that already holds a value is refused.
    pub fn register_native(
        &mut self,
        name: &str,
        f: impl Fn(&mut Call<'_>) -> Result<(), NativeError> + 'static,
    ) -> Result<(), VmError> {
        self.register_boxed_native(name.to_string(), Box::new(f), false)
    }

    fn check_open(&self, name: &str) -> Result<(), VmError> {
        if self.depth.get() != 0 {
            return Err(VmError::LuaRunning {
                operation: "register natives",
            });
        }
        if self.natives.registry.is_closed() {
            return Err(VmError::RegistryClosed { name: name.into() });
        }
        Ok(())
    }

    fn add_native(&mut self, name: String, f: NativeFn) -> usize {
        // SAFETY: Lua is idle (checked by callers) and `&mut self` excludes any reference
        // into the registry; it is open (checked by callers).
        unsafe { self.natives.registry.add_native(name, f) }
    }

    fn register_boxed_native(
        &mut self,
        name: String,
        f: NativeFn,
        replace: bool,
    ) -> Result<(), VmError> {
        self.check_open(&name)?;
        if !crate::bridge::path::valid_path(&name) {
            return Err(VmError::BadName { name });
        }
        if self.natives.registry.has_native(&name) {
            return Err(VmError::DuplicateName { name });
        }
        if !replace {
            let cname = CString::new(name.clone()).expect("validated");
            let mut existing: Option<String> = None;
            self.run(
                &mut |L| {
                    // SAFETY: protected body; raw reads along the path, no metamethods.
                    unsafe {
                        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
                        for part in cname.to_bytes().split(|&b| b == b'.') {
                            if ffi::lua_type(L, -1) != ffi::LUA_TTABLE {
                                ffi::lua_pushnil(L);
                                break;
                            }
                            ffi::lua_pushlstring(L, part.as_ptr().cast(), part.len());
                            ffi::lua_rawget(L, -2);
                        }
                        if ffi::lua_type(L, -1) != ffi::LUA_TNIL {
                            existing = Some(raw::type_name(L, -1));
                        }
                    }
                    0
                },
                |_, _| (),
            )?;
            if let Some(found) = existing {
                return Err(VmError::NativeOverride { name, found });
            }
        }
        let index = self.add_native(name.clone(), f);
        let cname = CString::new(name.clone()).expect("validated");
        let extensions = &self.extensions;
        let result = self.run(
            &mut |L| {
                // SAFETY: protected body; creates the closure, stores it in the permanent
                // natives table, hands a copy to each extension (which pops it) and stores it
                // at its global path (creating tables on the way).
                unsafe {
                    ffi::lua_getfield(L, ffi::LUA_REGISTRYINDEX, NATIVES_KEY.as_ptr());
                    ffi::lua_pushinteger(L, index as ffi::lua_Integer);
                    ffi::lua_pushcclosure(L, natives::native_trampoline, 1);
                    ffi::lua_pushvalue(L, -1);
                    ffi::lua_setfield(L, -3, cname.as_ptr());
                    for extension in extensions {
                        ffi::lua_pushvalue(L, -1);
                        (extension.native_added)(L, cname.as_c_str());
                    }
                    set_global_path(L, cname.as_bytes());
                }
                0
            },
            |_, _| (),
        );
        if result.is_err() {
            // The Lua side was not created: forget the Rust side too.
            // SAFETY: Lua is idle again; `&mut self` excludes references into the registry.
            unsafe { self.natives.registry.truncate_natives(index) };
        }
        result
    }

    /// Registers a plain-data userdata type after building (before the first snapshot only).
    pub fn register_userdata<T: PlainData>(
        &mut self,
        methods: impl FnOnce(&mut UserDataMethods<T>),
    ) -> Result<(), VmError> {
        self.check_open(T::NAME)?;
        if std::mem::align_of::<T>() > 8 {
            return Err(VmError::UserDataAlignment {
                name: T::NAME,
                align: std::mem::align_of::<T>(),
            });
        }
        if self
            .natives
            .registry
            .types()
            .iter()
            .any(|t| t.name == T::NAME)
        {
            return Err(VmError::DuplicateName {
                name: T::NAME.into(),
            });
        }
        let mut m = UserDataMethods::<T>::new();
        methods(&mut m);
        crate::bridge::userdata::check_entries::<T>(&m.methods)?;
        let has = |k: EntryKind| m.methods.iter().any(|(_, kind, _)| *kind == k);
        let (getters, setters) = (has(EntryKind::Get), has(EntryKind::Set));
        let first = self.natives.registry.native_count();
        let mut entries: Vec<(CString, EntryKind, usize)> = Vec::new();
        for (name, kind, f) in m.methods {
            let cname =
                CString::new(name.clone()).map_err(|_| VmError::BadName { name: name.clone() })?;
            let index = self.add_native(
                format!("{}:{name}", T::NAME),
                Box::new(move |call: &mut Call<'_>| {
                    let mut this = *call.userdata::<T>(0)?;
                    let result = f(&mut this, call);
                    *call.userdata::<T>(0)? = this;
                    result
                }),
            );
            entries.push((cname, kind, index));
        }
        let tname = CString::new(T::NAME).map_err(|_| VmError::BadName {
            name: T::NAME.into(),
        })?;
        let factory = crate::bridge::userdata::FIELD_ACCESS;
        let metatable = self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    ffi::lua_createtable(L, 0, 4); // 1: metatable
                    ffi::lua_pushstring(L, tname.as_ptr());
                    ffi::lua_setfield(L, 1, c"__name".as_ptr());
                    ffi::lua_createtable(L, 0, entries.len() as c_int); // 2: methods
                    ffi::lua_createtable(L, 0, 0); // 3: getters
                    ffi::lua_createtable(L, 0, 0); // 4: setters
                    for (name, kind, index) in &entries {
                        ffi::lua_pushinteger(L, *index as ffi::lua_Integer);
                        ffi::lua_pushcclosure(L, natives::native_trampoline, 1);
                        let target = match kind {
                            EntryKind::Method if name.as_bytes().starts_with(b"__") => 1,
                            EntryKind::Method => 2,
                            EntryKind::Get => 3,
                            EntryKind::Set => 4,
                        };
                        ffi::lua_setfield(L, target, name.as_ptr());
                    }
                    if getters || setters {
                        // __index and __newindex are Lua closures over the three tables.
                        let st = crate::bridge::chunks::load_host_chunk(
                            L,
                            factory.as_bytes(),
                            c"=luasnap.userdata",
                        );
                        if st != ffi::LUA_OK {
                            ffi::lua_error(L);
                        }
                        ffi::lua_pushvalue(L, 2);
                        ffi::lua_pushvalue(L, 3);
                        ffi::lua_pushvalue(L, 4);
                        ffi::lua_pushstring(L, tname.as_ptr());
                        ffi::lua_callk(L, 4, 2, 0, None);
                        if setters {
                            ffi::lua_setfield(L, 1, c"__newindex".as_ptr());
                        } else {
                            ffi::lua_settop(L, -2);
                        }
                        ffi::lua_setfield(L, 1, c"__index".as_ptr());
                        ffi::lua_settop(L, 1);
                    } else if !entries.is_empty()
                        && ffi::lua_getfield(L, 1, c"__index".as_ptr()) == ffi::LUA_TNIL
                    {
                        // Methods only (a user __index was refused above): the table serves.
                        ffi::lua_settop(L, 2);
                        ffi::lua_setfield(L, 1, c"__index".as_ptr());
                    }
                    ffi::lua_settop(L, 1);
                    // registry[light(mt)] = mt: found again by its identity when pushing.
                    let mt = ffi::lua_topointer(L, -1);
                    ffi::lua_pushlightuserdata(L, mt.cast_mut());
                    ffi::lua_pushvalue(L, -2);
                    ffi::lua_rawset(L, ffi::LUA_REGISTRYINDEX);
                    ffi::lua_pushlightuserdata(L, mt.cast_mut());
                    1
                }
            },
            // SAFETY: the light userdata pushed last sits at index 2.
            |L, _| unsafe { ffi::lua_touserdata(L, 2) } as *const std::ffi::c_void,
        );
        match metatable {
            Ok(mt) => {
                // SAFETY: Lua is idle and `&mut self` excludes references into the registry,
                // which is open (checked above).
                unsafe {
                    self.natives.registry.add_type(UserDataType {
                        name: T::NAME,
                        size: std::mem::size_of::<T>(),
                        metatable: mt,
                    })
                };
                Ok(())
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { self.natives.registry.truncate_natives(first) };
                Err(e)
            }
        }
    }

    // ----- snapshots -----

    pub(crate) fn check_idle(&self, operation: &'static str) -> Result<(), VmError> {
        // SAFETY: reading the main thread's status.
        if self.depth.get() != 0 || unsafe { ffi::lua_status(self.L()) } != ffi::LUA_OK {
            return Err(VmError::LuaRunning { operation });
        }
        Ok(())
    }

    /// Takes a snapshot of the whole VM. Seals natives and userdata types.
    pub fn snapshot(&mut self) -> Result<SnapshotId, VmError> {
        self.check_idle("take a snapshot")?;
        self.natives.registry.close();
        Ok(self.ring.snapshot(&mut self.arena)?)
    }

    /// Restores the VM to a retained snapshot, byte for byte. Newer snapshots are invalidated.
    pub fn rollback(&mut self, id: SnapshotId) -> Result<(), VmError> {
        self.check_idle("roll back")?;
        self.ring.rollback(&mut self.arena, id)?;
        Ok(())
    }

    /// A full copy of the VM's state, outside the snapshot ring (for restarting runs from the
    /// same bytes, or keeping a state beyond the window). Seals natives and userdata types,
    /// as [`snapshot`](Vm::snapshot) does: a type registered later would be gone after a
    /// restore of this capture.
    pub fn capture(&self) -> Snapshot {
        self.natives.registry.close();
        Snapshot::capture(&self.arena)
    }

    /// Restores a [`Vm::capture`] of this VM, byte for byte. Snapshots in the ring are
    /// discarded (a fresh ring starts with the same configuration).
    pub fn restore(&mut self, snapshot: &Snapshot) -> Result<(), VmError> {
        self.check_idle("restore a capture")?;
        snapshot.restore(&mut self.arena)?;
        self.arena.disable_tracking();
        self.ring = SnapshotRing::new(&mut self.arena, self.ring_config)?;
        Ok(())
    }

    /// Replaces the snapshot ring with a fresh one: another copy mode or window. Retained
    /// snapshots are discarded.
    pub fn reconfigure_snapshots(
        &mut self,
        mode: SnapshotMode,
        window: usize,
    ) -> Result<(), VmError> {
        self.check_idle("reconfigure snapshots")?;
        let config = RingConfig {
            mode,
            window,
            ..self.ring_config
        };
        // A previous ring's page tracker must not keep costing write faults.
        self.arena.disable_tracking();
        self.ring = SnapshotRing::new(&mut self.arena, config)?;
        self.ring_config = config;
        Ok(())
    }

    /// The snapshot ring (retained snapshots, statistics, copy strategy).
    pub fn snapshots(&self) -> &SnapshotRing {
        &self.ring
    }

    /// How snapshots are being copied.
    pub fn snapshot_strategy(&self) -> CopyStrategy {
        self.ring.strategy()
    }

    /// A hash of the arena's bytes: equal digests mean byte-identical VMs.
    pub fn digest(&self) -> u64 {
        luasnap_snap::digest(&self.arena)
    }

    /// The arena (for statistics and state ranges).
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The arena's allocator statistics.
    pub fn arena_stats(&self) -> ArenaStats {
        self.arena.stats()
    }

    /// Lua's own count of its heap, in bytes (`collectgarbage("count")` × 1024).
    pub fn lua_memory(&self) -> usize {
        // SAFETY: LUA_GCCOUNT/COUNTB only read counters.
        unsafe {
            let kb = ffi::lua_gc(self.L(), ffi::LUA_GCCOUNT) as usize;
            let b = ffi::lua_gc(self.L(), ffi::LUA_GCCOUNTB) as usize;
            kb * 1024 + b
        }
    }

    /// Bytes of the arena the collector keeps for its own bookkeeping outside
    /// [`lua_memory`](Vm::lua_memory): the remembered set of generational mode (Lua patch 12),
    /// which Lua does not count so that its collector runs on stock Lua's schedule.
    /// `lua_memory() + collector_bookkeeping_bytes()` is what Lua holds in the arena.
    pub fn collector_bookkeeping_bytes(&self) -> usize {
        // SAFETY: reads two fields of the state's global_State; no Lua call.
        unsafe { luasnap_gc_uncounted(self.L()) }
    }

    /// The profile this VM was built with.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    // ----- garbage collector -----

    /// Switches the collector's mode and sets its parameters.
    pub fn set_gc_mode(&mut self, mode: GcMode) -> Result<(), VmError> {
        self.check_idle("change the GC mode")?;
        let L = self.L();
        let set = |p: c_int, v: Option<i32>| {
            if let Some(v) = v {
                // SAFETY: LUA_GCPARAM only stores a parameter.
                unsafe { ffi::lua_gc(L, ffi::LUA_GCPARAM, p, v as c_int) };
            }
        };
        match mode {
            GcMode::Incremental {
                pause,
                step_multiplier,
                step_size,
            } => {
                // SAFETY: switching modes runs collector work; finalizers run protected inside.
                unsafe { ffi::lua_gc(L, ffi::LUA_GCINC) };
                set(ffi::LUA_GCPPAUSE, pause);
                set(ffi::LUA_GCPSTEPMUL, step_multiplier);
                set(ffi::LUA_GCPSTEPSIZE, step_size);
            }
            GcMode::Generational {
                minor_multiplier,
                major_minor,
                minor_major,
            } => {
                // SAFETY: as above.
                unsafe { ffi::lua_gc(L, ffi::LUA_GCGEN) };
                set(ffi::LUA_GCPMINORMUL, minor_multiplier);
                set(ffi::LUA_GCPMAJORMINOR, major_minor);
                set(ffi::LUA_GCPMINORMAJOR, minor_major);
            }
        }
        Ok(())
    }

    /// Runs a full collection: a **collection point**. In the deterministic profile it is the
    /// only collection that clears weak tables' entries to collected objects and calls
    /// finalizers (with `collectgarbage()`, `"collect"`, which is the same); every other one,
    /// automatic or [`gc_collect_settled`](Self::gc_collect_settled), frees only objects no
    /// program can reach in any way, so when it runs changes no result (Lua patch 10,
    /// `docs/gc.md`). The standard profile's collections are all stock.
    pub fn gc_collect(&self) -> Result<(), VmError> {
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { ffi::lua_gc(L, ffi::LUA_GCCOLLECT) };
                0
            },
            |_, _| (),
        )
    }

    /// [`gc_collect`](Self::gc_collect) with the finalizers it calls under an instruction
    /// budget, counted as [`Vm::call_with_budget`] counts: a finalizer that outlives it is
    /// stopped (its error a warning, as any finalizer's) and the collection fails with
    /// [`VmError::InstructionBudget`].
    pub fn gc_collect_with_budget(&self, budget: u64) -> Result<(), VmError> {
        self.budgeted(budget, || self.gc_collect())
    }

    /// Runs a full collection after which a generational collector does minor collections
    /// again, scheduled from the live heap, as when it was first switched on (an incremental
    /// collector just collects, as [`gc_collect`](Self::gc_collect)).
    ///
    /// Not a collection point (see [`gc_collect`](Self::gc_collect)): in the deterministic
    /// profile it clears no weak entry and calls no finalizer, so a process that settles at
    /// other moments (after a load) keeps the same results.
    ///
    /// For after building a whole state at once (a game's init, a load): the loader allocates
    /// with the collector stopped, and the first minor collection after it counts every loaded
    /// byte as newly old and shifts to major collections (lgc.c, `checkminormajor`), in which
    /// the heap grows to twice its live bytes and more before each cycle; a full collection
    /// keeps that mode. Leaving generational mode and entering it again is Lua's own way back
    /// (`entergen`: a full collection that ages every survivor and sets the next minor
    /// collection from the live bytes).
    pub fn gc_collect_settled(&mut self) -> Result<(), VmError> {
        self.check_idle("run the collector")?;
        self.run(
            &mut |L| {
                // SAFETY: protected body; a mode switch runs collector work, finalizers
                // protected inside.
                unsafe {
                    if ffi::lua_gc(L, ffi::LUA_GCINC) == ffi::LUA_GCGEN {
                        ffi::lua_gc(L, ffi::LUA_GCGEN);
                    } else {
                        luasnap_gc_full_quiet(L);
                    }
                }
                0
            },
            |_, _| (),
        )
    }

    /// Does one step of incremental collection; returns whether a cycle finished.
    pub fn gc_step(&self) -> Result<bool, VmError> {
        let mut done = 0;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                done = unsafe { ffi::lua_gc(L, ffi::LUA_GCSTEP, 0 as c_int) };
                0
            },
            |_, _| (),
        )?;
        Ok(done != 0)
    }

    /// Stops (`false`) or restarts (`true`) automatic collection.
    pub fn gc_running(&self, on: bool) {
        // SAFETY: LUA_GCSTOP/RESTART only flip a flag.
        unsafe {
            ffi::lua_gc(
                self.L(),
                if on {
                    ffi::LUA_GCRESTART
                } else {
                    ffi::LUA_GCSTOP
                },
            )
        };
    }
}

/// Pops the value on top and stores it at the dotted global path `name`, creating tables.
unsafe fn set_global_path(L: *mut lua_State, name: &[u8]) {
    // SAFETY: protected context (callers); the stack has the value on top.
    unsafe {
        let parts: &[u8] = name;
        ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
        let mut rest = parts;
        while let Some(dot) = rest.iter().position(|&b| b == b'.') {
            let part = &rest[..dot];
            ffi::lua_pushlstring(L, part.as_ptr().cast(), part.len());
            ffi::lua_rawget(L, -2);
            if ffi::lua_type(L, -1) != ffi::LUA_TTABLE {
                ffi::lua_settop(L, -2);
                ffi::lua_createtable(L, 0, 4);
                ffi::lua_pushlstring(L, part.as_ptr().cast(), part.len());
                ffi::lua_pushvalue(L, -2);
                ffi::lua_rawset(L, -4);
            }
            ffi::lua_rotate(L, -2, 1);
            ffi::lua_settop(L, -2);
            rest = &rest[dot + 1..];
        }
        // stack: value, table
        ffi::lua_pushlstring(L, rest.as_ptr().cast(), rest.len());
        ffi::lua_pushvalue(L, -3);
        ffi::lua_rawset(L, -3);
        ffi::lua_settop(L, -3);
    }
}
