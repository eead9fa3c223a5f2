//! The save-game methods of [`Vm`]: a value at a global path or the whole game, to bytes and
//! back.

use super::error::{Accept, LoadError, SaveError};
use super::format;
use super::options::{LoadOptions, PersistOptions, Trust};
use super::permanents::add_permanent;
use super::place::each_place;
use super::protected::GAME_KEYS;
use super::protected::{load_protected, mark_constructor, persist_protected};
use super::read;
use super::report::LoadReport;
use crate::bridge::error::VmError;
use crate::bridge::ffi as raw;
use crate::bridge::helpers::{
    luasnap_chunk_current, luasnap_finalizers_head, luasnap_finalizers_replaced,
    luasnap_set_key_counter,
};
use crate::bridge::vm::Vm;
use mlua_sys::{self as ffi, lua_State};
use std::collections::HashSet;
use std::ffi::{CStr, CString};

/// What the root of a persist is.
enum Root<'a> {
    Path(&'a CStr),
    Game,
}

impl Vm {
    fn persist_root(&self, root: Root<'_>, opts: &PersistOptions) -> Result<Vec<u8>, SaveError> {
        let mut staged: Option<String> = None;
        let mut result: Option<Vec<u8>> = None;
        let mut parts = super::game::GameRootParts::default();
        let r = self.run(
            &mut |L| {
                // SAFETY: protected body; builds the root, then persists it in a nested
                // protected call so the Persister's state is dropped before errors propagate.
                // The root's host memory (`parts`) is owned outside.
                unsafe {
                    ffi::lua_pushnil(L);
                    match &root {
                        Root::Path(p) => raw::push_path(L, p),
                        Root::Game => super::game::push_game_root(L, &mut parts),
                    }
                    let game = matches!(root, Root::Game).then_some(&parts.removed[..]);
                    let (st, err, file) = persist_protected(L, opts, false, game);
                    staged = err;
                    if st != ffi::LUA_OK {
                        ffi::lua_error(L);
                    }
                    result = file;
                    0
                }
            },
            |_, _| (),
        );
        match (r, staged, result) {
            (Ok(()), _, Some(bytes)) => Ok(bytes),
            (Err(VmError::Lua { message, .. }), Some(staged), _) if message.contains(&staged) => {
                Err(SaveError::Unpersistable { message: staged })
            }
            (Err(e), _, _) => Err(SaveError::Lua(e)),
            (Ok(()), _, None) => Err(SaveError::Unpersistable {
                message: "nothing was written".into(),
            }),
        }
    }

    /// Persists the value at a dotted global path (and everything reachable from it).
    pub fn persist(&self, path: &str) -> Result<Vec<u8>, SaveError> {
        self.persist_with(path, &PersistOptions::default())
    }

    /// Like [`persist`](Vm::persist), with options.
    pub fn persist_with(&self, path: &str, opts: &PersistOptions) -> Result<Vec<u8>, SaveError> {
        let p = self.checked_path(path).map_err(SaveError::Lua)?;
        self.persist_root(Root::Path(&p), opts)
    }

    /// Saves the whole game: the globals and `package.loaded` (library tables and functions go
    /// by name, as permanents).
    pub fn save_game(&self) -> Result<Vec<u8>, SaveError> {
        // math.random's state is not a Lua value: copied where the root includes it.
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { crate::bridge::random_state::stage(L) };
                0
            },
            |_, _| (),
        )
        .map_err(SaveError::Lua)?;
        self.persist_root(Root::Game, &PersistOptions::default())
    }

    fn load_root(
        &mut self,
        data: &[u8],
        opts: &LoadOptions,
        store: Option<&CStr>,
    ) -> Result<LoadReport, LoadError> {
        // Refuse bad headers before touching the VM.
        let opened = format::open(data).map_err(LoadError::from)?;
        super::renames::check(&opts.renames).map_err(|message| LoadError::Invalid { message })?;
        super::moved::check(&opts.moved).map_err(|message| LoadError::Invalid { message })?;
        self.check_idle("load a save-game")
            .map_err(LoadError::Lua)?;
        let old_limit = self.arena.stats().limit_bytes as usize;
        // Whether the arena's limit is the load's cap: Lua's memory error then means the cap.
        let mut capped = false;
        if let Some(growth) = opts.max_heap_growth {
            // The arena's limit bounds the bytes of live blocks.
            let cap = (self.arena.stats().bytes_allocated as usize)
                .saturating_add(growth)
                .min(old_limit);
            let cap = cap
                .next_multiple_of(luasnap_alloc::PAGE_SIZE)
                .min(old_limit);
            capped = cap < old_limit && self.arena.set_limit(cap).is_ok();
        }
        let mut over_cap = false;
        let mut staged: Option<String> = None;
        let mut accept: Option<Accept> = None;
        let mut report = LoadReport::default();
        let mut unchanged_chunks = Default::default();
        let r = self.run(
            &mut |L| {
                // SAFETY: protected body; the load itself runs in a nested protected call.
                unsafe {
                    // The replaced state's marked objects (see `luasnap_finalizers_replaced`).
                    let replaced_marks = luasnap_finalizers_head(L);
                    ffi::lua_pushnil(L);
                    ffi::lua_pushnil(L); // the file is read from `data`, not copied into Lua
                    let mut out = load_protected(L, opts, Some(opened));
                    // A whole-game load keeps the removed keys the file gives `_G` and
                    // `package.loaded` for the restore, under the root: [.., list, root].
                    let game = store.is_none() && out.status == ffi::LUA_OK;
                    out.take_game_removed(L, game);
                    if game {
                        ffi::lua_rotate(L, -2, 1);
                    }
                    (staged, accept, report) = (out.error, out.accept, out.report);
                    unchanged_chunks = out.unchanged_chunks;
                    over_cap = out.over_cap;
                    if out.status != ffi::LUA_OK {
                        ffi::lua_error(L);
                    }
                    match store {
                        Some(path) => store_at_path(L, path),
                        None => match game_key_counter(L, out.max_ident, out.shared_ident) {
                            Ok(counter) => {
                                let update = opts.functions == super::FunctionBinding::Current;
                                let list = ffi::lua_gettop(L) - 1;
                                let added =
                                    super::game::restore_game(L, update, &unchanged_chunks, list);
                                ffi::lua_settop(L, list - 1);
                                report.added = added.added;
                                report.not_added = added.not_added;
                                // The identities new keys get continue the saving VM's.
                                if let Some(n) = counter {
                                    luasnap_set_key_counter(L, n);
                                }
                                // The replaced state's finalizers must not run in this one:
                                // its pending ones are dropped, and its marked objects
                                // nothing reaches lose their marks at the next full
                                // collection (Lua patch 14).
                                luasnap_finalizers_replaced(L, replaced_marks);
                            }
                            Err(why) => {
                                staged = Some(why.to_string());
                                ffi::lua_pushlstring(L, why.as_ptr().cast(), why.len());
                                ffi::lua_error(L);
                            }
                        },
                    }
                    0
                }
            },
            |_, _| (),
        );
        let _ = self.arena.set_limit(old_limit);
        // The loader's own error, when it is what ended the load.
        let staged = staged.filter(|staged| {
            matches!(&r, Err(VmError::Lua { message, .. }) if message.contains(staged.as_str()))
        });
        match (r, staged) {
            (Ok(()), _) => Ok(report),
            (Err(e), staged) if over_cap || (capped && e.is_out_of_memory()) => {
                Err(LoadError::NeedsMoreMemory {
                    cap: opts.max_heap_growth.unwrap_or(old_limit),
                    message: staged.unwrap_or_else(|| e.to_string()),
                })
            }
            (Err(_), Some(staged)) => Err(match accept {
                Some(accept) => LoadError::Refused {
                    message: staged,
                    accept,
                },
                None => LoadError::Invalid { message: staged },
            }),
            (Err(e), _) => Err(LoadError::Lua(e)),
        }
    }

    /// Loads a save-game written by `trust` (with that level's default options) and stores
    /// the value at a dotted global path.
    pub fn unpersist(&mut self, data: &[u8], path: &str, trust: Trust) -> Result<(), LoadError> {
        self.unpersist_with(data, path, &LoadOptions::new(trust))
    }

    /// Like [`unpersist`](Vm::unpersist), with options.
    pub fn unpersist_with(
        &mut self,
        data: &[u8],
        path: &str,
        opts: &LoadOptions,
    ) -> Result<(), LoadError> {
        self.unpersist_reporting(data, path, opts).map(drop)
    }

    /// Like [`unpersist_with`](Vm::unpersist_with), returning what the load did with the
    /// saved functions (see [`FunctionBinding`](super::FunctionBinding)).
    pub fn unpersist_reporting(
        &mut self,
        data: &[u8],
        path: &str,
        opts: &LoadOptions,
    ) -> Result<LoadReport, LoadError> {
        let p = self.checked_path(path).map_err(LoadError::Lua)?;
        self.load_root(data, opts, Some(&p))
    }

    /// Loads a whole-game save written by `trust`: restores the globals and
    /// `package.loaded` in place (entries not in the save are removed, `_G` itself stays the
    /// same table).
    pub fn load_game(&mut self, data: &[u8], trust: Trust) -> Result<(), LoadError> {
        self.load_game_with(data, &LoadOptions::new(trust))
    }

    /// Like [`load_game`](Vm::load_game), with options.
    pub fn load_game_with(&mut self, data: &[u8], opts: &LoadOptions) -> Result<(), LoadError> {
        self.load_game_reporting(data, opts).map(drop)
    }

    /// Like [`load_game_with`](Vm::load_game_with), returning what the load did with the
    /// saved functions (see [`FunctionBinding`](super::FunctionBinding)).
    pub fn load_game_reporting(
        &mut self,
        data: &[u8],
        opts: &LoadOptions,
    ) -> Result<LoadReport, LoadError> {
        let report = self.load_root(data, opts, None)?;
        // The loaded copy of math.random's state goes back into the generator.
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe { crate::bridge::random_state::unstage(L) };
                0
            },
            |_, _| (),
        )
        .map_err(LoadError::Lua)?;
        Ok(report)
    }

    /// Marks the function at a dotted global path as a constructor: loads of foreign saves
    /// may call it at load time (as a `__persist` rebuild, create or init function), and
    /// closures of the functions defined inside it (the rebuild closures a `__persist`
    /// function returns). Nothing else runs while a foreign save loads.
    pub fn register_constructor(&mut self, path: &str) -> Result<(), VmError> {
        let p = self.checked_path(path)?;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    raw::push_path(L, &p);
                    if ffi::lua_type(L, -1) != ffi::LUA_TFUNCTION {
                        ffi::lua_pushstring(
                            L,
                            c"register_constructor: the value at that path is not a function"
                                .as_ptr(),
                        );
                        ffi::lua_error(L);
                    }
                    mark_constructor(L);
                }
                0
            },
            |_, _| (),
        )
    }

    /// Makes the value at a dotted global path a permanent under `name`: saves refer to it by
    /// name instead of persisting it, and loads take it from the loading VM.
    pub fn register_permanent(&mut self, name: &str, path: &str) -> Result<(), VmError> {
        let p = self.checked_path(path)?;
        let n = CString::new(name).map_err(|_| VmError::BadName { name: name.into() })?;
        self.run(
            &mut |L| {
                // SAFETY: protected body.
                unsafe {
                    raw::push_path(L, &p);
                    add_permanent(L, &n);
                }
                0
            },
            |_, _| (),
        )
    }
}

impl Vm {
    /// The places of this VM's current version of the chunk `name` (`@src/entity.lua`): the
    /// places an update load binds saved functions at (`read::rebind`), or None if the VM has
    /// no chunk of that name. Runs nothing; allocates only the name's string.
    pub(crate) fn chunk_places(
        &self,
        name: &str,
    ) -> Result<Option<HashSet<Vec<Vec<u8>>>>, VmError> {
        let mut places = None;
        self.run(
            &mut |L| {
                // SAFETY: protected body; luasnap_chunk_current makes room for the main
                // closure it pushes (popped here), which keeps the prototypes walked alive.
                unsafe {
                    let main = luasnap_chunk_current(L, name.as_ptr().cast(), name.len());
                    if !main.is_null() {
                        let mut found = HashSet::new();
                        each_place(main, &mut |_, _, place| {
                            found.insert(place.to_vec());
                        });
                        places = Some(found);
                        ffi::lua_settop(L, -2);
                    }
                }
                0
            },
            |_, _| (),
        )?;
        Ok(places)
    }
}

/// Stores the loaded value (on top) at the global path.
unsafe fn store_at_path(L: *mut lua_State, path: &CStr) {
    // SAFETY: protected context; the value is on top.
    unsafe {
        let bytes = path.to_bytes();
        match bytes.iter().rposition(|&b| b == b'.') {
            Some(dot) => {
                let parent = CString::new(&bytes[..dot]).expect("from a CStr");
                raw::push_path(L, &parent);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_pushlstring(L, bytes[dot + 1..].as_ptr().cast(), bytes.len() - dot - 1);
                ffi::lua_rotate(L, -2, 1);
                ffi::lua_settable(L, -3);
                ffi::lua_settop(L, -2);
            }
            None => ffi::lua_setglobal(L, path.as_ptr()),
        }
    }
}

/// The key counter of the whole-game save whose root is on top (None in saves of format 6 and
/// older: the loading VM's counter goes on), checked against the identities its file gave
/// (the highest `max_ident`; `shared` if one went to two objects).
///
/// # Safety
/// A protected context; the root on top.
unsafe fn game_key_counter(
    L: *mut lua_State,
    max_ident: u32,
    shared: bool,
) -> Result<Option<u64>, &'static str> {
    // SAFETY: callers' contract; a raw read of one field, popped.
    unsafe {
        if ffi::lua_type(L, -1) != ffi::LUA_TTABLE {
            return Ok(None); // restore_game refuses it
        }
        ffi::lua_pushstring(L, GAME_KEYS.as_ptr());
        let t = ffi::lua_rawget(L, -2);
        let mut isnum = 0;
        let n = ffi::lua_tointegerx(L, -1, &mut isnum);
        ffi::lua_settop(L, -2);
        match t {
            ffi::LUA_TNIL if max_ident == 0 && !shared => Ok(None),
            ffi::LUA_TNUMBER if isnum != 0 => read::check_counter(n, max_ident, shared).map(Some),
            _ => Err("malformed save-game: the key counter of a whole-game save is missing or not an integer"),
        }
    }
}
