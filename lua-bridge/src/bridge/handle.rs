//! Handles: Lua objects held from Rust ([`LuaRef`], [`LuaTable`], [`Function`], [`Thread`]),
//! and the path-based reads, writes and calls of [`Vm`].
//!
//! # Anchoring, and why it is rollback-safe
//!
//! A handle's object must stay alive while the handle exists, so Lua has to see a reference to
//! it. mlua keeps such references in a "ref thread" whose top and free list are tracked in
//! Rust; a byte-level rollback puts Lua's side back and not Rust's, and the two disagree
//! (reproduced before luasnap was written: handles held across a rollback crashed, and even
//! temporaries corrupted `G(L)->nilvalue`; `docs/bridge.md`). Here:
//!
//! - Every handle borrows the [`Vm`] (`&'vm Vm`), and [`Vm::snapshot`], [`Vm::rollback`] and
//!   [`Vm::restore`] take `&mut Vm`. So **no handle exists at any snapshot or rollback**: the
//!   borrow checker forbids it.
//! - Handles anchor their object in a stack slot of one anchor thread, created when the VM is
//!   built (before any snapshot) and kept in `registry["luasnap.anchors"]`. The slot numbers
//!   and free list live in Rust, but they only have meaning while a handle lives; when the last
//!   handle goes, the anchor stack is emptied and its slots set to nil again. Every snapshot
//!   therefore sees an empty anchor stack, and no Rust-side number survives a rollback.
//! - Anchoring does not allocate Lua objects (it moves a value between two stacks of the same
//!   state), so holding a handle does not change what the garbage collector sees except to
//!   keep the object alive, and dropping it releases the object to the collector at once.
//!
//! ```compile_fail,E0502
//! # use luasnap_bridge::Vm;
//! let mut vm = Vm::builder().capacity(64 << 20).build().unwrap();
//! vm.exec("world = { hp = 1 }", "setup").unwrap();
//! let id = vm.snapshot().unwrap();
//! let world = vm.table("world").unwrap();
//! vm.rollback(id).unwrap(); // error[E0502]: `vm` is borrowed by `world`
//! world.get::<_, i64>("hp").unwrap();
//! ```
//!
//! (With a `&self` method in `rollback`'s place it compiles: `tests/bridge.rs`,
//! `the_compile_fail_examples_fail_only_for_the_borrow`.)

use crate::bridge::convert::{at, Arg, ArgKind, FromLua, FromLuaMulti, IntoLua, IntoLuaMulti};
use crate::bridge::error::VmError;
use crate::bridge::ffi as raw;
use crate::bridge::path::{self, Path};
use crate::bridge::value::Value;
use crate::bridge::vm::Vm;
use mlua_sys::{self as ffi, lua_State};
use std::ffi::c_int;

/// Where [`Vm::require`] remembers modules: Lua's own `package.loaded` (`registry._LOADED`),
/// so Lua's `require` sees them and save-games (which hold `package.loaded`) keep their state.
const MODULES_KEY: &std::ffi::CStr = c"_LOADED";

// ----- arguments (the anchor thread itself: anchors.rs) -----

/// Raises a static message. Only plain frames may be skipped (callers' contract).
unsafe fn raise(L: *mut lua_State, msg: &'static str) -> ! {
    // SAFETY: callers' contract; the message is static.
    unsafe {
        ffi::lua_pushlstring(L, msg.as_ptr().cast(), msg.len());
        ffi::lua_error(L)
    }
}

/// Pushes an argument. May raise (memory).
///
/// # Safety
/// Protected context with a free slot; anchored arguments were checked to belong to `vm`.
unsafe fn push_arg(L: *mut lua_State, arg: &Arg<'_>, vm: &Vm) {
    // SAFETY: callers' contract.
    unsafe {
        match &arg.kind {
            ArgKind::Value(v) => raw::push_value(L, v, vm.natives.registry.types(), 0),
            ArgKind::Anchored { slot, .. } => vm.anchors.push(L, *slot),
        }
    }
}

/// Pushes `args` and calls the value below them; returns the new top. May raise.
///
/// # Safety
/// Protected context, the callee on top; plain frames only.
unsafe fn call_args(L: *mut lua_State, args: &[Arg<'_>], vm: &Vm, extra: c_int) -> c_int {
    // SAFETY: callers' contract; the stack is grown first.
    unsafe {
        ffi::luaL_checkstack(L, args.len() as c_int + 2, c"too many arguments".as_ptr());
        for a in args {
            push_arg(L, a, vm);
        }
        ffi::lua_callk(L, args.len() as c_int + extra, ffi::LUA_MULTRET, 0, None);
        ffi::lua_gettop(L)
    }
}

fn type_name_of(t: c_int) -> &'static str {
    match t {
        ffi::LUA_TNIL => "nil",
        ffi::LUA_TBOOLEAN => "boolean",
        ffi::LUA_TLIGHTUSERDATA => "light userdata",
        ffi::LUA_TNUMBER => "number",
        ffi::LUA_TSTRING => "string",
        ffi::LUA_TTABLE => "table",
        ffi::LUA_TFUNCTION => "function",
        ffi::LUA_TUSERDATA => "userdata",
        ffi::LUA_TTHREAD => "thread",
        _ => "no value",
    }
}

// ----- Vm: paths, handles, loading -----

/// What a path-based operation found where it expected something else.
enum Miss {
    /// Key `i` could not be applied: the value before it is not indexable.
    Intermediate(usize, String),
    /// The final value has the wrong type.
    Final(String),
}

impl Vm {
    /// Checks that every anchored argument belongs to this VM.
    fn own_args(&self, args: &[Arg<'_>]) -> Result<(), VmError> {
        let me = self.anchors.thread();
        for a in args {
            if let ArgKind::Anchored { owner, .. } = a.kind {
                if owner != me {
                    return Err(VmError::ForeignHandle);
                }
            }
        }
        Ok(())
    }

    fn values<R: FromLuaMulti>(&self, L: *mut lua_State, n: c_int) -> Result<R, VmError> {
        R::from_lua_multi(self.collect_values(L, n)?, "result")
    }

    /// Reads the value at a path and converts it.
    ///
    /// Paths are `name(.name | [integer] | ["string"])*`: `score`, `world.players[1].hp`,
    /// `cfg["key with space"]`. A missing last key reads as `nil` (so `Option<T>` reads
    /// `None`); a missing table on the way is [`VmError::NotFound`] naming it; a value that
    /// does not fit `T` is [`VmError::Type`] naming the path and the type.
    ///
    /// ```
    /// # use luasnap_bridge::{Value, Vm, VmError};
    /// let vm = Vm::builder().capacity(64 << 20).build()?;
    /// vm.exec("world = { players = { { hp = 10 } }, ['key with space'] = true }", "setup")?;
    /// assert_eq!(vm.get::<u32>("world.players[1].hp")?, 10);
    /// assert!(vm.get::<bool>(r#"world["key with space"]"#)?);
    /// assert_eq!(vm.get::<Option<u32>>("world.players[2]")?, None);
    /// assert!(matches!(vm.get::<Value>("world.nope.x"), Err(VmError::NotFound { .. })));
    /// assert!(matches!(vm.get::<u8>("world.players[1].hp.x"), Err(VmError::NotFound { .. })));
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn get<T: FromLua>(&self, path: &str) -> Result<T, VmError> {
        let p = Path::parse(path)?;
        if p.method.is_some() {
            return Err(VmError::BadPath {
                path: path.into(),
                at: path[..path.rfind(':').unwrap_or(0)].chars().count(),
                message: "a method path can only be called".into(),
            });
        }
        let mut miss = None;
        let v = self.reading(|| {
            self.run(
                &mut |L| {
                    // SAFETY: protected body; only references live in this frame.
                    unsafe {
                        if let Some(i) = path::push_path(L, &p) {
                            miss = Some(path::not_found(L, &p, i));
                            return 0;
                        }
                    }
                    1
                },
                |L, n| self.collect_values(L, n),
            )
        })??;
        if let Some(e) = miss {
            return Err(e);
        }
        let v = v.into_iter().next().unwrap_or(Value::Nil);
        T::from_lua(v).map_err(|e| at(e, path))
    }

    /// Sets the value at a path (the tables on the way must exist; `__newindex` runs).
    /// `value` may be a handle, which stores the Lua object itself.
    ///
    /// ```
    /// # use luasnap_bridge::{Vm, VmError};
    /// let vm = Vm::builder().capacity(64 << 20).build()?;
    /// vm.exec("cfg = { list = {} }", "setup")?;
    /// vm.set("cfg.list[1]", "first")?;
    /// vm.set(r#"cfg["max hp"]"#, 250u64)?;
    /// assert_eq!(vm.get::<String>("cfg.list[1]")?, "first");
    /// assert_eq!(vm.get::<i32>("cfg['max hp']")?, 250);
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn set<'h>(&self, path: &str, value: impl IntoLua<'h>) -> Result<(), VmError> {
        let p = Path::parse(path)?;
        if p.method.is_some() {
            return Err(VmError::BadPath {
                path: path.into(),
                at: path[..path.rfind(':').unwrap_or(0)].chars().count(),
                message: "cannot set a method path".into(),
            });
        }
        let value = [value.into_lua()?];
        self.own_args(&value)?;
        let vm: &Vm = self;
        let (parent, key) = match p.split_last() {
            Some((parent, key)) => (Some(parent), key.clone()),
            None => (None, p.keys[0].clone()),
        };
        let mut miss = None;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    match &parent {
                        Some(parent) => {
                            if let Some(i) = path::push_path(L, parent) {
                                miss = Some(path::not_found(L, &p, i));
                                return 0;
                            }
                            if !path::indexable(L, -1) {
                                miss = Some(path::not_found(L, &p, parent.keys.len()));
                                return 0;
                            }
                        }
                        None => {
                            ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS);
                        }
                    }
                    ffi::luaL_checkstack(L, 3, c"path".as_ptr());
                    path::push_key(L, &key);
                    push_arg(L, &value[0], vm);
                    ffi::lua_settable(L, -3);
                }
                0
            },
            |_, _| (),
        )?;
        miss.map_or(Ok(()), Err)
    }

    /// Calls the function at a path with `args` and converts its results.
    ///
    /// `args` is one value, a tuple, `()`, or a slice of [`Value`]s. A path ending in `:name`
    /// calls a method, passing the value before the colon as `self` (`obj:name(...)` in Lua).
    ///
    /// ```
    /// # use luasnap_bridge::{Vm, VmError};
    /// let vm = Vm::builder().capacity(64 << 20).build()?;
    /// vm.exec("function add(a, b) return a + b end
    ///          world = { players = { { hp = 10 } } }
    ///          function world.players:count() return #self end", "setup")?;
    /// let sum: i64 = vm.call("add", (2, 40))?;
    /// assert_eq!(sum, 42);
    /// assert_eq!(vm.call::<usize>("world.players:count", ())?, 1);
    /// vm.call::<()>("add", (1, 2))?; // results ignored
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn call<'h, R: FromLuaMulti>(
        &self,
        path: &str,
        args: impl IntoLuaMulti<'h>,
    ) -> Result<R, VmError> {
        let p = Path::parse(path)?;
        let args = args.into_lua_multi()?;
        self.own_args(&args)?;
        let vm: &Vm = self;
        let mut miss = None;
        let out = self.run(
            &mut |L| {
                // SAFETY: protected body: only references live in this frame when Lua raises.
                unsafe {
                    if let Some(i) = path::push_path(L, &p) {
                        miss = Some(Miss::Intermediate(i, raw::type_name(L, -1)));
                        return 0;
                    }
                    let mut extra = 0;
                    if let Some(m) = &p.method {
                        if !path::indexable(L, -1) {
                            miss = Some(Miss::Intermediate(p.keys.len(), raw::type_name(L, -1)));
                            return 0;
                        }
                        ffi::luaL_checkstack(L, 3, c"method".as_ptr());
                        ffi::lua_pushlstring(L, m.as_ptr().cast(), m.len());
                        ffi::lua_gettable(L, -2);
                        ffi::lua_rotate(L, -2, 1); // function, self
                        extra = 1;
                    }
                    let f = -1 - extra;
                    if !raw::is_callable(L, f) {
                        miss = Some(Miss::Final(raw::type_name(L, f)));
                        return 0;
                    }
                    let base = ffi::lua_gettop(L) - 1 - extra;
                    call_args(L, &args, vm, extra) - base
                }
            },
            |L, n| self.collect_values(L, n),
        )?;
        match miss {
            Some(Miss::Intermediate(i, found)) => Err(VmError::NotFound {
                path: if i == 0 {
                    "_G".into()
                } else {
                    p.prefix(i - 1).into()
                },
                expected: "table",
                found,
            }),
            Some(Miss::Final(found)) => Err(VmError::NotFound {
                path: path.into(),
                expected: "function",
                found,
            }),
            None => R::from_lua_multi(out?, "result").map_err(|e| at(e, &format!("{path}: "))),
        }
    }

    /// A handle to the value at a path (any type).
    pub fn handle(&self, path: &str) -> Result<LuaRef<'_>, VmError> {
        let p = Path::parse(path)?;
        let vm: &Vm = self;
        let mut miss = None;
        let slot = self.reading(|| {
            self.run(
                &mut |L| {
                    // SAFETY: protected body.
                    unsafe {
                        if let Some(i) = path::push_path(L, &p) {
                            miss = Some(path::not_found(L, &p, i));
                            return 0;
                        }
                        let slot = vm.anchors.anchor_top(L);
                        ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                        1
                    }
                },
                // SAFETY: the slot number pushed above sits at index 2.
                |L, n| (n == 1).then(|| unsafe { ffi::lua_tointegerx(L, 2, std::ptr::null_mut()) }),
            )
        })?;
        match (slot, miss) {
            (Some(slot), _) => Ok(LuaRef {
                vm: self,
                slot: slot as c_int,
            }),
            (None, Some(e)) => Err(e),
            (None, None) => unreachable!("the walk either anchors or records a miss"),
        }
    }

    /// A handle to the table at a path.
    pub fn table(&self, path: &str) -> Result<LuaTable<'_>, VmError> {
        self.handle(path)?.into_table().map_err(|e| named(e, path))
    }

    /// A handle to the function at a path, for calling it repeatedly.
    pub fn function(&self, path: &str) -> Result<Function<'_>, VmError> {
        self.handle(path)?
            .into_function()
            .map_err(|e| named(e, path))
    }

    /// A handle to the coroutine at a path, to resume it from Rust.
    pub fn thread(&self, path: &str) -> Result<Thread<'_>, VmError> {
        self.handle(path)?.into_thread().map_err(|e| named(e, path))
    }

    /// The globals table.
    ///
    /// # Panics
    /// If the anchor stack cannot grow (the arena's memory limit is reached).
    pub fn globals(&self) -> LuaTable<'_> {
        self.anchor_new(|L| {
            // SAFETY: protected body.
            unsafe { ffi::lua_rawgeti(L, ffi::LUA_REGISTRYINDEX, ffi::LUA_RIDX_GLOBALS) };
        })
        .map(LuaTable)
        .expect("the anchor stack could not grow: the arena's memory limit is reached")
    }

    /// A new empty table.
    pub fn create_table(&self) -> Result<LuaTable<'_>, VmError> {
        self.anchor_new(|L| {
            // SAFETY: protected body.
            unsafe { ffi::lua_createtable(L, 0, 0) };
        })
        .map(LuaTable)
    }

    /// Runs `push` (which pushes one value) protected and anchors the value.
    fn anchor_new(&self, mut push: impl FnMut(*mut lua_State)) -> Result<LuaRef<'_>, VmError> {
        let vm: &Vm = self;
        let slot = self.run(
            &mut |L| {
                push(L);
                // SAFETY: protected body, the value on top.
                unsafe {
                    let slot = vm.anchors.anchor_top(L);
                    ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                }
                1
            },
            // SAFETY: the slot number sits at index 2.
            |L, _| unsafe { ffi::lua_tointegerx(L, 2, std::ptr::null_mut()) } as c_int,
        )?;
        Ok(LuaRef { vm: self, slot })
    }

    /// Compiles and runs a chunk of Lua source, and returns a handle to its first result
    /// (`nil` if none): a module returning its table `G`, a function, a value.
    ///
    /// ```
    /// # use luasnap_bridge::{Vm, VmError};
    /// let vm = Vm::builder().capacity(64 << 20).build()?;
    /// let game = vm.load("local G = {} function G.step(n) return n * 2 end return G", "game")?
    ///     .into_table()?;
    /// assert_eq!(game.call_function::<i64>("step", 21)?, 42);
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn load(&self, source: impl AsRef<[u8]>, chunkname: &str) -> Result<LuaRef<'_>, VmError> {
        self.load_module(source.as_ref(), chunkname, None)
    }

    /// Compiles a chunk of Lua source without running it, and keeps it for the VM's life:
    /// saves that name its functions then load into this VM under foreign trust (their code
    /// is matched against it), while nothing of the chunk runs (a game's top level that calls
    /// the host's natives, say). For VMs that read saves rather than play them.
    ///
    /// ```
    /// # use luasnap_bridge::{Vm, VmError};
    /// let vm = Vm::builder().capacity(64 << 20).build()?;
    /// vm.compile("local x = host.missing() return x", "game")?; // compiled, not run
    /// assert!(vm.compile("return +", "broken").is_err());
    /// # Ok::<(), VmError>(())
    /// ```
    pub fn compile(&self, source: impl AsRef<[u8]>, chunkname: &str) -> Result<(), VmError> {
        let source = source.as_ref();
        let cname = crate::bridge::chunks::host_chunk_name(chunkname)?;
        let mut syntax_error = false;
        let compiled = self.run(
            &mut |L| {
                // SAFETY: protected body; the chunk (or its error) on top, popped or raised.
                unsafe {
                    let st = crate::bridge::chunks::load_host_chunk(L, source, &cname);
                    if st != ffi::LUA_OK {
                        syntax_error = st == ffi::LUA_ERRSYNTAX;
                        ffi::lua_error(L);
                    }
                    ffi::lua_settop(L, -2);
                }
                0
            },
            |_, _| (),
        );
        crate::bridge::chunks::as_syntax_error(compiled, syntax_error)
    }

    /// Like [`load`](Vm::load) for a module, once: the first call runs the chunk (passing
    /// `name` as its `...`) and remembers its result (`true` if it returned nothing) in
    /// `package.loaded[name]`, like Lua's `require` (which, where the package library is open,
    /// finds it too); later calls with the same name return that value without running
    /// anything. The remembered value is Lua state: it rolls back (a rollback to before the
    /// first call drops it), and [`save_game`](Vm::save_game) saves it with the rest of
    /// `package.loaded`, so a module's state survives save and load. After
    /// [`load_game`](Vm::load_game), `require(name, ..)` returns the loaded module table
    /// (handles taken before the load still point to the pre-load table).
    pub fn require(&self, name: &str, source: impl AsRef<[u8]>) -> Result<LuaRef<'_>, VmError> {
        self.load_module(source.as_ref(), name, Some(name))
    }

    fn load_module(
        &self,
        source: &[u8],
        chunkname: &str,
        module: Option<&str>,
    ) -> Result<LuaRef<'_>, VmError> {
        let cname = crate::bridge::chunks::host_chunk_name(chunkname)?;
        let vm: &Vm = self;
        let mut syntax_error = false;
        let slot = self.run(
            &mut |L| {
                // SAFETY: protected body; plain frames only.
                unsafe {
                    if let Some(m) = module {
                        ffi::luaL_getsubtable(L, ffi::LUA_REGISTRYINDEX, MODULES_KEY.as_ptr());
                        ffi::lua_pushlstring(L, m.as_ptr().cast(), m.len());
                        if ffi::lua_rawget(L, -2) != ffi::LUA_TNIL {
                            let slot = vm.anchors.anchor_top(L);
                            ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                            return 1;
                        }
                        ffi::lua_settop(L, -2);
                    }
                    let base = ffi::lua_gettop(L);
                    // Through the chunk registry (saves carry the source text); the host's
                    // chunks are kept for the VM's life.
                    let st = crate::bridge::chunks::load_host_chunk(L, source, &cname);
                    if st != ffi::LUA_OK {
                        syntax_error = st == ffi::LUA_ERRSYNTAX;
                        ffi::lua_error(L);
                    }
                    let n = match module {
                        Some(m) => {
                            ffi::lua_pushlstring(L, m.as_ptr().cast(), m.len());
                            1
                        }
                        None => 0,
                    };
                    ffi::lua_callk(L, n, 1, 0, None);
                    if let Some(m) = module {
                        if ffi::lua_type(L, -1) == ffi::LUA_TNIL {
                            ffi::lua_settop(L, -2);
                            ffi::lua_pushboolean(L, 1);
                        }
                        ffi::lua_pushlstring(L, m.as_ptr().cast(), m.len());
                        ffi::lua_pushvalue(L, -2);
                        ffi::lua_rawset(L, base);
                    }
                    let slot = vm.anchors.anchor_top(L);
                    ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                    1
                }
            },
            // SAFETY: the slot number is the only result.
            |L, _| unsafe { ffi::lua_tointegerx(L, -1, std::ptr::null_mut()) } as c_int,
        );
        let slot = crate::bridge::chunks::as_syntax_error(slot, syntax_error)?;
        Ok(LuaRef { vm: self, slot })
    }
}

/// How a key reads in an error path: `.name`, `[1]`, `["a b"]`, `[<handle>]`.
fn arg_label(key: &Arg<'_>) -> String {
    match &key.kind {
        ArgKind::Value(v) => crate::bridge::convert::key_suffix(v),
        ArgKind::Anchored { .. } => "[<handle>]".into(),
    }
}

/// Puts the path into a handle-conversion error.
fn named(e: VmError, path: &str) -> VmError {
    match e {
        VmError::NotFound {
            expected, found, ..
        } => VmError::NotFound {
            path: path.into(),
            expected,
            found,
        },
        e => e,
    }
}

// ----- handles -----

/// A handle to any Lua value: keeps it alive and lets Rust use it without copying. Borrows
/// the [`Vm`], so it cannot outlive a snapshot or rollback (see the module docs).
pub struct LuaRef<'vm> {
    vm: &'vm Vm,
    slot: c_int,
}

impl std::fmt::Debug for LuaRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LuaRef({})", self.type_name())
    }
}

impl Drop for LuaRef<'_> {
    fn drop(&mut self) {
        self.vm.anchors.release(self.slot);
    }
}

impl Clone for LuaRef<'_> {
    /// Another handle to the same Lua object.
    ///
    /// # Panics
    /// If the anchor stack cannot grow (the arena's memory limit is reached).
    fn clone(&self) -> Self {
        let slot = self.slot;
        self.vm
            .anchor_new(|L| {
                // SAFETY: protected body with free slots; a live slot.
                unsafe { self.vm.anchors.push(L, slot) }
            })
            .expect("the anchor stack could not grow: the arena's memory limit is reached")
    }
}

impl<'vm> LuaRef<'vm> {
    /// Lua's type name of the value (`"table"`, `"function"`, ...).
    pub fn type_name(&self) -> &'static str {
        // SAFETY: a live slot of the anchor thread; lua_type only reads.
        type_name_of(unsafe { ffi::lua_type(self.vm.anchors.thread(), self.slot) })
    }

    /// The VM the handle borrows.
    pub fn vm(&self) -> &'vm Vm {
        self.vm
    }

    /// Runs `body` with the value pushed (at index 1 of the body's stack).
    fn with<R>(
        &self,
        body: &mut dyn FnMut(*mut lua_State) -> c_int,
        collect: impl FnOnce(*mut lua_State, c_int) -> R,
    ) -> Result<R, VmError> {
        let vm: &Vm = self.vm;
        let slot = self.slot;
        self.vm.run(
            &mut |L| {
                // SAFETY: protected body; the stack starts empty with LUA_MINSTACK free slots.
                unsafe { vm.anchors.push(L, slot) };
                body(L)
            },
            collect,
        )
    }

    /// Copies the value out and converts it.
    pub fn get<T: FromLua>(&self) -> Result<T, VmError> {
        let v = self
            .vm
            .reading(|| self.with(&mut |_| 1, |L, n| self.vm.collect_values(L, n)))??;
        T::from_lua(v.into_iter().next().unwrap_or(Value::Nil)).map_err(|e| at(e, "the value"))
    }

    fn expect(self, expected: &'static str, ok: bool) -> Result<Self, VmError> {
        if ok {
            Ok(self)
        } else {
            Err(VmError::NotFound {
                path: "the value".into(),
                expected,
                found: self.type_name().into(),
            })
        }
    }

    /// This value as a table handle (it must be a table).
    pub fn into_table(self) -> Result<LuaTable<'vm>, VmError> {
        let ok = self.type_name() == "table";
        self.expect("table", ok).map(LuaTable)
    }

    /// This value as a function handle (a function, or a value with `__call`).
    pub fn into_function(self) -> Result<Function<'vm>, VmError> {
        let A = self.vm.anchors.thread();
        // SAFETY: a live slot; `callable` only reads (and the anchor stack has spare slots).
        let ok = unsafe { raw::is_callable(A, self.slot) };
        self.expect("function", ok).map(Function)
    }

    /// This value as a coroutine handle.
    pub fn into_thread(self) -> Result<Thread<'vm>, VmError> {
        let ok = self.type_name() == "thread";
        self.expect("thread", ok).map(Thread)
    }
}

impl<'h> IntoLua<'h> for &'h LuaRef<'_> {
    fn into_lua(self) -> Result<Arg<'h>, VmError> {
        Ok(Arg::anchored(self.vm.anchors.thread(), self.slot))
    }
}

macro_rules! handle_into_lua {
    ($($t:ident),*) => {$(
        impl<'h> IntoLua<'h> for &'h $t<'_> {
            fn into_lua(self) -> Result<Arg<'h>, VmError> {
                (&self.0).into_lua()
            }
        }
        impl<'vm> AsRef<LuaRef<'vm>> for $t<'vm> {
            /// The handle as a general value handle.
            fn as_ref(&self) -> &LuaRef<'vm> {
                &self.0
            }
        }
        impl<'vm> From<$t<'vm>> for LuaRef<'vm> {
            fn from(h: $t<'vm>) -> LuaRef<'vm> {
                h.0
            }
        }
    )*};
}
handle_into_lua!(LuaTable, Function, Thread);

/// A handle to a Lua table, read lazily: each access reads what it needs, nothing is copied
/// up front. Reads and writes run metamethods (`__index`, `__newindex`, `__len`) like Lua code
/// does; [`pairs`](LuaTable::pairs) is a raw traversal.
///
/// ```
/// # use luasnap_bridge::{Vm, VmError};
/// let vm = Vm::builder().capacity(64 << 20).build()?;
/// vm.exec("world = { players = { { name = 'ann', hp = 3 }, { name = 'bo', hp = 5 } } }", "setup")?;
/// let players = vm.table("world.players")?;
/// assert_eq!(players.len()?, 2);
/// let bo = players.table(2)?;
/// assert_eq!(bo.get::<_, String>("name")?, "bo");
/// bo.set("hp", 6)?;
/// assert_eq!(vm.get::<i64>("world.players[2].hp")?, 6);
/// let mut total = 0;
/// for p in players.sequence::<luasnap_bridge::Table>()? {
///     total += p.get("hp").and_then(|v| v.as_integer()).unwrap_or(0);
/// }
/// assert_eq!(total, 9);
/// # Ok::<(), VmError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LuaTable<'vm>(LuaRef<'vm>);

impl<'vm> LuaTable<'vm> {
    /// Reads `t[key]` (running `__index`) and converts it.
    pub fn get<'h, K: IntoLua<'h>, V: FromLua>(&self, key: K) -> Result<V, VmError> {
        let key = [key.into_lua()?];
        self.0.vm.own_args(&key)?;
        let vm: &Vm = self.0.vm;
        let v = vm.reading(|| {
            self.0.with(
                &mut |L| {
                    // SAFETY: protected body, the table at 1.
                    unsafe {
                        push_arg(L, &key[0], vm);
                        ffi::lua_gettable(L, 1);
                    }
                    1
                },
                |L, n| self.0.vm.collect_values(L, n),
            )
        })??;
        V::from_lua(v.into_iter().next().unwrap_or(Value::Nil))
            .map_err(|e| at(e, &format!("table{}", arg_label(&key[0]))))
    }

    /// Reads the value at a path relative to this table (`players[1].hp`) and converts it.
    pub fn get_path<V: FromLua>(&self, path: &str) -> Result<V, VmError> {
        let r = self.at_path(path)?;
        r.get().map_err(|e| at(e, path))
    }

    /// A handle to the value at a path relative to this table.
    pub fn at_path(&self, path: &str) -> Result<LuaRef<'vm>, VmError> {
        let p = Path::parse(path)?;
        let vm: &Vm = self.0.vm;
        let mut miss = None;
        let slot = vm.reading(|| {
            self.0.with(
                &mut |L| {
                    // SAFETY: protected body, the table on top.
                    unsafe {
                        if let Some(i) = path::walk(L, &p.keys) {
                            miss = Some(path::not_found(L, &p, i));
                            return 0;
                        }
                        let slot = vm.anchors.anchor_top(L);
                        ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                        1
                    }
                },
                // SAFETY: the slot number sits at index 2 when present.
                |L, n| (n == 1).then(|| unsafe { ffi::lua_tointegerx(L, 2, std::ptr::null_mut()) }),
            )
        })?;
        match (slot, miss) {
            (Some(slot), _) => Ok(LuaRef {
                vm: self.0.vm,
                slot: slot as c_int,
            }),
            (None, Some(e)) => Err(e),
            (None, None) => unreachable!("the walk either anchors or records a miss"),
        }
    }

    /// A handle to `t[key]` (any type).
    pub fn handle<'h, K: IntoLua<'h>>(&self, key: K) -> Result<LuaRef<'vm>, VmError> {
        self.handle_arg(key.into_lua()?)
    }

    fn handle_arg(&self, key: Arg<'_>) -> Result<LuaRef<'vm>, VmError> {
        let key = [key];
        self.0.vm.own_args(&key)?;
        let vm: &Vm = self.0.vm;
        let slot = vm.reading(|| {
            self.0.with(
                &mut |L| {
                    // SAFETY: protected body, the table at 1.
                    unsafe {
                        push_arg(L, &key[0], vm);
                        ffi::lua_gettable(L, 1);
                        let slot = vm.anchors.anchor_top(L);
                        ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                    }
                    1
                },
                // SAFETY: the slot number is the only result.
                |L, _| unsafe { ffi::lua_tointegerx(L, -1, std::ptr::null_mut()) } as c_int,
            )
        })?;
        Ok(LuaRef {
            vm: self.0.vm,
            slot,
        })
    }

    /// A handle to the table `t[key]` (nested access without copying).
    pub fn table<'h, K: IntoLua<'h>>(&self, key: K) -> Result<LuaTable<'vm>, VmError> {
        let key = key.into_lua()?;
        let label = format!("table{}", arg_label(&key));
        self.handle_arg(key)?
            .into_table()
            .map_err(|e| named(e, &label))
    }

    /// A handle to the function `t[key]`.
    pub fn function<'h, K: IntoLua<'h>>(&self, key: K) -> Result<Function<'vm>, VmError> {
        let key = key.into_lua()?;
        let label = format!("table{}", arg_label(&key));
        self.handle_arg(key)?
            .into_function()
            .map_err(|e| named(e, &label))
    }

    /// Sets `t[key] = value` (running `__newindex`). Values may be handles.
    pub fn set<'h, K: IntoLua<'h>, V: IntoLua<'h>>(&self, key: K, value: V) -> Result<(), VmError> {
        let kv = [key.into_lua()?, value.into_lua()?];
        self.0.vm.own_args(&kv)?;
        let vm: &Vm = self.0.vm;
        self.0.with(
            &mut |L| {
                // SAFETY: protected body, the table at 1.
                unsafe {
                    push_arg(L, &kv[0], vm);
                    push_arg(L, &kv[1], vm);
                    ffi::lua_settable(L, 1);
                }
                0
            },
            |_, _| (),
        )
    }

    /// The length `#t` (running `__len`).
    pub fn len(&self) -> Result<i64, VmError> {
        let v = self.0.vm.reading(|| {
            self.0.with(
                &mut |L| {
                    // SAFETY: protected body, the table at 1.
                    unsafe { ffi::lua_len(L, 1) };
                    1
                },
                |L, n| self.0.vm.collect_values(L, n),
            )
        })??;
        i64::from_lua(v.into_iter().next().unwrap_or(Value::Nil)).map_err(|e| at(e, "#table"))
    }

    /// Whether `#t` is 0.
    pub fn is_empty(&self) -> Result<bool, VmError> {
        Ok(self.len()? == 0)
    }

    /// All entries, converted (a raw traversal with `next`, in Lua's order; `__pairs` is not
    /// consulted). Each value is copied, so large nested tables are better read by key.
    pub fn pairs<K: FromLua, V: FromLua>(&self) -> Result<Vec<(K, V)>, VmError> {
        let t = self.0.get::<crate::bridge::value::Table>()?;
        t.entries
            .into_iter()
            .map(|(k, v)| {
                let suffix = crate::bridge::convert::key_suffix(&k);
                let key = K::from_lua(k).map_err(|e| at(e, &format!("table{suffix} (the key)")))?;
                let val = V::from_lua(v).map_err(|e| at(e, &format!("table{suffix}")))?;
                Ok((key, val))
            })
            .collect()
    }

    /// The values `t[1]..t[#t]`, converted.
    pub fn sequence<V: FromLua>(&self) -> Result<Vec<V>, VmError> {
        let n = self.len()?;
        (1..=n)
            .map(|i| self.get(i).map_err(|e| at(e, &format!("[{i}]"))))
            .collect()
    }

    /// Calls `t[name](args...)`.
    pub fn call_function<'h, R: FromLuaMulti>(
        &self,
        name: &str,
        args: impl IntoLuaMulti<'h>,
    ) -> Result<R, VmError> {
        self.function(name)
            .map_err(|e| named(e, name))?
            .call(args)
            .map_err(|e| at(e, &format!("{name}() ")))
    }

    /// Calls the method `t:name(args...)`: `t` is passed as `self`.
    pub fn call_method<'h, R: FromLuaMulti>(
        &self,
        name: &str,
        args: impl IntoLuaMulti<'h>,
    ) -> Result<R, VmError> {
        let f = self.function(name).map_err(|e| named(e, name))?;
        let mut all = vec![(&self.0).into_lua()?];
        all.extend(args.into_lua_multi()?);
        f.call(all).map_err(|e| at(e, &format!(":{name}() ")))
    }

    /// Copies the whole table out (deeply).
    pub fn to_value(&self) -> Result<crate::bridge::value::Table, VmError> {
        self.0.get()
    }
}

/// A handle to a Lua function (or a value with `__call`), taken from a path, a table, a
/// [`LuaRef`] or a call's result.
#[derive(Debug, Clone)]
pub struct Function<'vm>(LuaRef<'vm>);

impl<'vm> Function<'vm> {
    /// Calls the function with `args` and converts its results.
    pub fn call<'h, R: FromLuaMulti>(&self, args: impl IntoLuaMulti<'h>) -> Result<R, VmError> {
        let args = args.into_lua_multi()?;
        self.0.vm.own_args(&args)?;
        let vm: &Vm = self.0.vm;
        self.0.with(
            &mut |L| {
                // SAFETY: protected body, the function at 1.
                unsafe { call_args(L, &args, vm, 0) }
            },
            |L, n| self.0.vm.values::<R>(L, n),
        )?
    }
}

impl<'vm> Function<'vm> {
    /// Calls the function and returns a handle to its first result (`nil` if none): for
    /// results that should stay in Lua (a table built by Lua, a closure).
    pub fn call_handle<'h>(&self, args: impl IntoLuaMulti<'h>) -> Result<LuaRef<'vm>, VmError> {
        let args = args.into_lua_multi()?;
        self.0.vm.own_args(&args)?;
        let vm: &Vm = self.0.vm;
        let slot = self.0.with(
            &mut |L| {
                // SAFETY: protected body, the function at 1.
                unsafe {
                    let top = call_args(L, &args, vm, 0);
                    ffi::lua_settop(L, if top >= 1 { 1 } else { 0 });
                    if top == 0 {
                        ffi::lua_pushnil(L);
                    }
                    let slot = vm.anchors.anchor_top(L);
                    ffi::lua_pushinteger(L, slot as ffi::lua_Integer);
                }
                1
            },
            // SAFETY: the slot number is the only result.
            |L, _| unsafe { ffi::lua_tointegerx(L, -1, std::ptr::null_mut()) } as c_int,
        )?;
        Ok(LuaRef {
            vm: self.0.vm,
            slot,
        })
    }
}

/// What a coroutine can do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadStatus {
    /// Not started yet, or yielded: [`Thread::resume`] runs it.
    Resumable,
    /// Finished, or stopped by an error.
    Dead,
    /// Running, or resuming another coroutine (only seen from inside Lua).
    Running,
}

/// A handle to a Lua coroutine, resumable from Rust.
///
/// ```
/// # use luasnap_bridge::{ThreadStatus, Vm, VmError};
/// let vm = Vm::builder().capacity(64 << 20).build()?;
/// vm.exec("co = coroutine.create(function(a) local b = coroutine.yield(a + 1) return b * 2 end)", "setup")?;
/// let co = vm.thread("co")?;
/// assert_eq!(co.resume::<i64>(1)?, 2);
/// assert_eq!(co.resume::<i64>(20)?, 40);
/// assert_eq!(co.status(), ThreadStatus::Dead);
/// assert!(co.resume::<()>(()).is_err());
/// # Ok::<(), VmError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Thread<'vm>(LuaRef<'vm>);

impl<'vm> Thread<'vm> {
    /// The coroutine's status.
    pub fn status(&self) -> ThreadStatus {
        // SAFETY: a live slot holding a thread; the status checks only read.
        unsafe {
            let co = ffi::lua_tothread(self.0.vm.anchors.thread(), self.0.slot);
            status(co)
        }
    }

    /// Resumes the coroutine with `args`; returns what it yielded or, when it finishes,
    /// returned. An error inside it is [`VmError::Lua`] (with the coroutine's traceback) and
    /// leaves it dead.
    pub fn resume<'h, R: FromLuaMulti>(&self, args: impl IntoLuaMulti<'h>) -> Result<R, VmError> {
        let args = args.into_lua_multi()?;
        self.0.vm.own_args(&args)?;
        match self.status() {
            ThreadStatus::Resumable => {}
            ThreadStatus::Dead => return Err(VmError::NotResumable { status: "dead" }),
            ThreadStatus::Running => return Err(VmError::NotResumable { status: "running" }),
        }
        let vm: &Vm = self.0.vm;
        let out = self.0.with(
            &mut |L| {
                // SAFETY: protected body, the coroutine at 1 (kept alive there). Arguments are
                // pushed on L (raising there is caught by our protected call) and moved over;
                // nothing is ever raised on the coroutine's own stack from here.
                unsafe {
                    let co = ffi::lua_tothread(L, 1);
                    ffi::luaL_checkstack(
                        L,
                        args.len() as c_int + 2,
                        c"too many arguments".as_ptr(),
                    );
                    for a in &args {
                        push_arg(L, a, vm);
                    }
                    // Before the coroutine's stack is touched, as coroutine.resume does
                    // (csrc/corolib.c, ls_auxresume): one dead by an error, or one a load is
                    // building or holding, cannot run.
                    let st = ffi::lua_status(co);
                    if st != ffi::LUA_OK && st != ffi::LUA_YIELD {
                        raise(L, "cannot resume dead coroutine");
                    }
                    if ffi::lua_checkstack(co, args.len() as c_int + 1) == 0 {
                        raise(L, "not enough memory for the coroutine's arguments");
                    }
                    ffi::lua_xmove(L, co, args.len() as c_int);
                    let mut nres: c_int = 0;
                    let st = ffi::lua_resume(co, L, args.len() as c_int, &mut nres);
                    if st == ffi::LUA_OK || st == ffi::LUA_YIELD {
                        if ffi::lua_checkstack(L, nres + 1) == 0 {
                            ffi::lua_settop(co, -nres - 1);
                            crate::bridge::canonical::settle_thread(co);
                            raise(L, "too many results from the coroutine");
                        }
                        ffi::lua_xmove(co, L, nres);
                        crate::bridge::canonical::settle_thread(co);
                        nres
                    } else {
                        // The error object is on the coroutine's top: add its traceback,
                        // then raise it here.
                        ffi::lua_xmove(co, L, 1);
                        let msg = ffi::lua_tolstring(L, -1, std::ptr::null_mut());
                        if !msg.is_null() {
                            ffi::luaL_traceback(L, co, msg, 0);
                        }
                        crate::bridge::canonical::settle_thread(co);
                        ffi::lua_error(L)
                    }
                }
            },
            |L, n| self.0.vm.values::<R>(L, n),
        )?;
        out.map_err(|e| at(e, "coroutine "))
    }
}

/// Status of a coroutine, as `coroutine.status` computes it.
///
/// # Safety
/// A valid thread of a VM built by this crate.
unsafe fn status(co: *mut lua_State) -> ThreadStatus {
    // SAFETY: only reads the thread's state.
    unsafe {
        match ffi::lua_status(co) {
            ffi::LUA_YIELD => ThreadStatus::Resumable,
            ffi::LUA_OK => {
                let mut ar: ffi::lua_Debug = std::mem::zeroed();
                if ffi::lua_getstack(co, 0, &mut ar) != 0 {
                    ThreadStatus::Running
                } else if ffi::lua_gettop(co) == 0 {
                    ThreadStatus::Dead
                } else {
                    ThreadStatus::Resumable
                }
            }
            _ => ThreadStatus::Dead,
        }
    }
}
