//! A game's modules: the Lua files the deterministic profile's `require` loads. That profile
//! has no package library (no search paths, no C modules), so the host gives the VM its
//! modules: by name and source (`VmBuilder::module`), or as a game's folder
//! (`VmBuilder::module_folder`), where
//! `require "a.b"` finds `a/b.lua` or `a/b/init.lua` as stock Lua does with
//! `package.path = "DIR/?.lua;DIR/?/init.lua"`, and nothing outside it. `Vm::module` is the
//! lookup `require` uses.
//!
//! Each module's chunk is named by its path in the game's folder (`@lib/bump.lua`), never by
//! where the folder is: a save names the chunks of the functions it holds, so a game moved to
//! another folder keeps its saves. Modules are the host's own code: their chunks are kept for
//! the VM's life, so saves carry them and a newer version of a module is found by name
//! (`FunctionBinding::Current` in `persist`).
//!
//! Determinism: a module is read once per VM, the first time it is required; later requires
//! of it (after a rollback to before the first, too) load those same bytes. VMs that share a
//! [`FolderFiles`] (a game's run) share that: a module is read once per run.

use crate::bridge::helpers::{luasnap_require_load, luasnap_require_loaded};
use crate::bridge::per_vm::{PerVm, Registered};
use mlua_sys::{self as ffi, lua_State};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::path::{Path, PathBuf};

/// A Lua module a VM's `require` can load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// The name `require` takes (`lib.bump`, `town`).
    pub name: String,
    /// Its file's path in the game's folder (`lib/bump.lua`, `town/init.lua`): its chunk is
    /// named `@path`, and `require` returns the path as its second value.
    pub path: String,
    /// Its source text.
    pub source: Vec<u8>,
}

impl Module {
    /// A module by name and source; its path is the name with dots as folders, `.lua`
    /// (`lib.bump` -> `lib/bump.lua`).
    pub fn new(name: &str, source: impl Into<Vec<u8>>) -> Module {
        Module {
            name: name.to_string(),
            path: format!("{}.lua", name.replace('.', "/")),
            source: source.into(),
        }
    }

    /// The module `name` in the game's folder `dir`: `name.lua`, else `name/init.lua`, with
    /// dots as folders; `None` if neither is a file. Names that could leave the folder (empty
    /// parts, `..`, slashes, NUL) find nothing.
    pub fn in_folder(dir: &Path, name: &str) -> std::io::Result<Option<Module>> {
        let Some(paths) = module_paths(name) else {
            return Ok(None);
        };
        for path in paths {
            let file = dir.join(&path);
            if file.is_file() {
                return Ok(Some(Module {
                    name: name.to_string(),
                    path,
                    source: read_source(&file)?,
                }));
            }
        }
        Ok(None)
    }

    /// Every Lua file in the game's folder `dir` that `require` could load, as a module named
    /// by its path (`lib/bump.lua` -> `lib.bump`, `town/init.lua` -> `town.init`), in path
    /// order: a game's identity in a match (`runtime::net`) covers them all. Hidden folders and
    /// files are skipped. A symbolic link counts as what it points to, wherever that is (as
    /// stock Lua's `require` follows it), under the link's own path: a folder reached again
    /// through a link is not walked twice, and a link named `*.lua` to nothing is an error
    /// naming it. A game given as one script has its script's folder, which may be a shared
    /// one (`/tmp`, a downloads folder): what vanishes while it is walked and what this user
    /// may not read there are skipped, not errors (a module among them is not found, as a
    /// missing one). At most [`FOLDER_DEPTH`] folders deep and [`FOLDER_FILES`] files, so a
    /// game that lives in a large folder costs a bounded walk; a file over [`SOURCE_BYTES`]
    /// or a folder over [`FOLDER_BYTES`] of them is an error naming it, not a read of
    /// whatever someone left there (a sparse file of gigabytes in `/tmp`).
    pub(crate) fn all_in_folder(dir: &Path) -> std::io::Result<Vec<Module>> {
        use std::io::ErrorKind::{NotFound, PermissionDenied};
        let named =
            |path: &str, e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"));
        let mut found = Vec::new();
        let mut bytes = 0;
        let mut walked = std::collections::HashSet::new();
        let mut pending = vec![(dir.to_path_buf(), String::new(), 0)];
        'walk: while let Some((folder, prefix, depth)) = pending.pop() {
            // A folder met again through a link (`lib/self -> ..`) adds nothing new.
            if !walked.insert(std::fs::canonicalize(&folder).unwrap_or_else(|_| folder.clone())) {
                continue;
            }
            let entries = std::fs::read_dir(&folder).and_then(|d| d.collect::<Result<Vec<_>, _>>());
            let mut entries = match entries {
                Ok(entries) => entries,
                Err(e) if depth > 0 && matches!(e.kind(), NotFound | PermissionDenied) => continue,
                Err(e) => return Err(named(if prefix.is_empty() { "." } else { &prefix }, e)),
            };
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let Some(name) = e.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                let path = format!("{prefix}{name}");
                if name.starts_with('.') {
                    continue;
                }
                // Followed: the link's target's kind.
                let meta = match std::fs::metadata(e.path()) {
                    Ok(meta) => meta,
                    Err(err) if name.ends_with(".lua") && e.path().is_symlink() => {
                        return Err(named(&path, link_error(&e.path(), err)));
                    }
                    Err(_) => continue,
                };
                if meta.is_dir() && depth < FOLDER_DEPTH {
                    pending.push((e.path(), format!("{path}/"), depth + 1));
                } else if meta.is_file() && name.ends_with(".lua") {
                    let source = match read_source(&e.path()) {
                        Ok(source) => source,
                        Err(err) if matches!(err.kind(), NotFound | PermissionDenied) => continue,
                        Err(err) => return Err(named(&path, err)),
                    };
                    bytes += source.len();
                    if bytes > FOLDER_BYTES {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!(
                                "{path}: the game's folder holds more than {} MiB of .lua files \
                                 (up to this one): give the game a folder of its own",
                                FOLDER_BYTES >> 20
                            ),
                        ));
                    }
                    found.push(Module {
                        name: path.trim_end_matches(".lua").replace('/', "."),
                        path,
                        source,
                    });
                    if found.len() >= FOLDER_FILES {
                        break 'walk;
                    }
                }
            }
        }
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }
}

/// Why the symbolic link at `at` cannot be read, saying where it points.
fn link_error(at: &Path, e: std::io::Error) -> std::io::Error {
    match std::fs::read_link(at) {
        Ok(target) => std::io::Error::new(
            e.kind(),
            format!(
                "a symbolic link to {}, which cannot be read ({e}): point it at the module's file or remove it",
                target.display()
            ),
        ),
        Err(_) => e,
    }
}

/// The paths in a game's folder where `require(name)` looks (`a.b`: `a/b.lua`, then
/// `a/b/init.lua`); `None` for a name that could leave the folder (empty parts, `..`,
/// slashes, NUL).
fn module_paths(name: &str) -> Option<[String; 2]> {
    let parts: Vec<&str> = name.split('.').collect();
    let bad = |p: &&str| p.is_empty() || *p == ".." || p.contains(['/', '\\', '\0']);
    if parts.iter().any(bad) {
        return None;
    }
    let stem = parts.join("/");
    Some([format!("{stem}.lua"), format!("{stem}/init.lua")])
}

/// Reads the file at `path` in a game's folder for [`FolderFiles::with_reader`]: its bytes,
/// `None` if it is not a file there.
pub type FolderReader = dyn Fn(&Path, &str) -> std::io::Result<Option<Vec<u8>>> + Send + Sync;

/// A game's folder as one run reads it: each Lua file is read once, the first time any VM
/// built from it looks for it (a `require`, a load's chunk), and every later lookup, in any
/// VM of the run, gets those same bytes; a file looked for and missing stays missing. A file
/// never looked for is never read. Shared by the VMs of a run through an `Arc`
/// ([`GameConfig::folder_files`](crate::runtime::GameConfig::folder_files)).
pub struct FolderFiles {
    dir: PathBuf,
    /// By path in the folder: the bytes read, `None` for a file looked for and missing.
    memo: std::sync::Mutex<std::collections::BTreeMap<String, Option<Vec<u8>>>>,
    /// Every file was listed when made ([`Module::all_in_folder`]): a path not in `memo` is
    /// missing, and nothing is read.
    complete: bool,
    /// How a file missing from `memo` is read; `None`: from `dir`.
    reader: Option<Box<FolderReader>>,
}

impl std::fmt::Debug for FolderFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderFiles")
            .field("dir", &self.dir)
            .field("complete", &self.complete)
            .field("read", &self.files().len())
            .finish()
    }
}

impl FolderFiles {
    /// The folder `dir`, each file read the first time it is looked for.
    pub fn lazy(dir: impl Into<PathBuf>) -> FolderFiles {
        FolderFiles {
            dir: dir.into(),
            memo: Default::default(),
            complete: false,
            reader: None,
        }
    }

    /// The folder `dir`, each file read by `reader(dir, path)` the first time it is looked
    /// for (a second process reads them from the first one's record of what it read).
    pub fn with_reader(dir: impl Into<PathBuf>, reader: Box<FolderReader>) -> FolderFiles {
        FolderFiles {
            reader: Some(reader),
            ..FolderFiles::lazy(dir)
        }
    }

    /// The folder `dir` read now, whole ([`Module::all_in_folder`]): a file it did not list
    /// is missing.
    pub(crate) fn read_all(dir: &Path) -> std::io::Result<FolderFiles> {
        let files = Module::all_in_folder(dir)?;
        Ok(FolderFiles {
            dir: dir.to_path_buf(),
            memo: std::sync::Mutex::new(
                files
                    .into_iter()
                    .map(|m| (m.path, Some(m.source)))
                    .collect(),
            ),
            complete: true,
            reader: None,
        })
    }

    /// The file at `path` (`lib/bump.lua`) of the folder `dir` on disk, `None` if it is not
    /// a file there (a symbolic link counts as what it points to). What [`FolderFiles::lazy`]
    /// reads.
    pub fn read_from_disk(dir: &Path, path: &str) -> std::io::Result<Option<Vec<u8>>> {
        let file = dir.join(path);
        if !file.is_file() {
            if file.is_symlink() && !file.exists() {
                let gone = std::io::Error::from(std::io::ErrorKind::NotFound);
                let e = link_error(&file, gone);
                return Err(std::io::Error::new(e.kind(), format!("{path}: {e}")));
            }
            return Ok(None);
        }
        match read_source(&file) {
            Ok(source) => Ok(Some(source)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether every file of the folder was read when this was made (read whole at once, as
    /// `serve` does to compute a game id), so a file it does not hold is missing.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The files read so far, as modules named by their paths (`lib/bump.lua` ->
    /// `lib.bump`), in path order.
    pub fn files(&self) -> Vec<Module> {
        let memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        memo.iter()
            .filter_map(|(path, source)| {
                Some(Module {
                    name: path.trim_end_matches(".lua").replace('/', "."),
                    path: path.clone(),
                    source: source.clone()?,
                })
            })
            .collect()
    }

    /// The bytes of the file at `path` in the folder: as read the first time it was looked
    /// for, in any VM of the run; `None` if it was missing then. `path` is not checked here.
    pub fn file(&self, path: &str) -> std::io::Result<Option<Vec<u8>>> {
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = memo.get(path) {
            return Ok(known.clone());
        }
        if self.complete {
            return Ok(None);
        }
        // Read under the lock: two VMs of the run asking at once get the same bytes.
        let read = match &self.reader {
            Some(reader) => reader(&self.dir, path)?,
            None => FolderFiles::read_from_disk(&self.dir, path)?,
        };
        memo.insert(path.to_string(), read.clone());
        Ok(read)
    }
}

/// Where a VM's `require` finds the modules it was not given by name: a game's folder, each
/// module read the first time this VM or another sharing the [`FolderFiles`] requires it.
#[derive(Debug, Clone)]
pub(crate) struct ModuleFolder(pub(crate) std::sync::Arc<FolderFiles>);

impl ModuleFolder {
    /// The module `name` in this folder (see [`Module::in_folder`]). A file deeper than
    /// [`FOLDER_DEPTH`] folders is not one of the game's (the folder is read whole to that
    /// depth for a match's game id): finding one is an error saying so, so `simulate` stops
    /// where a served match would not find the module, instead of running it.
    fn find(&self, name: &str) -> std::io::Result<Option<Module>> {
        let Some(paths) = module_paths(name) else {
            return Ok(None);
        };
        for path in paths {
            let deep = path.split('/').count() > FOLDER_DEPTH + 1;
            if let Some(source) = self.0.file(&path)? {
                if deep {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "{path} lies more than {FOLDER_DEPTH} folders deep in the game's \
                             folder, deeper than a game's modules may be (move it up)"
                        ),
                    ));
                }
                return Ok(Some(Module {
                    name: name.to_string(),
                    path,
                    source,
                }));
            }
        }
        Ok(None)
    }
}

/// The source of the file chunk `path` (a chunk's name without its `@`: `src/ai.lua`) of the
/// game's folder `dir`, for a load that compiles the chunks a save names: `None` unless `path`
/// is a Lua file that [`Module::all_in_folder`] would list, i.e. relative, `/`-separated,
/// ending in `.lua`, at most [`FOLDER_DEPTH`] folders deep, no part empty or hidden (so no
/// `.` or `..`). A save names these paths, and a hostile one names `../../etc/passwd` or
/// `/etc/passwd`: nothing is read but by a path inside the folder. A symbolic link in the
/// folder counts as what it points to, as for `require` and [`Module::all_in_folder`]: the
/// links are the host's, part of its game as the files are (the save is the adversary here,
/// not the file system).
pub(crate) fn chunk_in_folder(dir: &Path, path: &str) -> Option<Vec<u8>> {
    if !chunk_path_ok(path) {
        return None;
    }
    let parts: Vec<&str> = path.split('/').collect();
    let mut at = dir.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = std::fs::metadata(&at).ok()?;
        let last = i + 1 == parts.len();
        if (last && !meta.is_file()) || (!last && !meta.is_dir()) {
            return None;
        }
    }
    read_source(&at).ok()
}

/// Whether a save's chunk name `path` may name a file of a game's folder (see
/// [`chunk_in_folder`]).
pub(crate) fn chunk_path_ok(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let bad = |p: &&str| p.is_empty() || p.starts_with('.') || p.contains(['\\', '\0', ':']);
    path.ends_with(".lua") && parts.len() <= FOLDER_DEPTH + 1 && !parts.iter().any(bad)
}

/// How many folders deep [`Module::all_in_folder`] looks.
const FOLDER_DEPTH: usize = 6;

/// How many files [`Module::all_in_folder`] reads at most.
pub(crate) const FOLDER_FILES: usize = 2000;

/// The largest Lua source file of a game read (a module, the main script, a chunk a save
/// names): 64 MiB, far above any real module (Penlight's largest file is 40 KiB).
pub(crate) const SOURCE_BYTES: u64 = 64 << 20;

/// The most bytes of `.lua` files [`Module::all_in_folder`] reads in all.
const FOLDER_BYTES: usize = 256 << 20;

/// The bytes of the Lua source file at `file`, at most [`SOURCE_BYTES`]: a larger one (or
/// one that grows past it while read) is an error saying so, naming no path (the caller
/// does).
pub(crate) fn read_source(file: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let too_big = |len: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} MiB or more, over the {} MiB a Lua source file of a game may have",
                len >> 20,
                SOURCE_BYTES >> 20
            ),
        )
    };
    let f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    if len > SOURCE_BYTES {
        return Err(too_big(len));
    }
    let mut source = Vec::with_capacity(len as usize);
    f.take(SOURCE_BYTES + 1).read_to_end(&mut source)?;
    if source.len() as u64 > SOURCE_BYTES {
        return Err(too_big(source.len() as u64));
    }
    Ok(source)
}

/// The modules' part of one VM, which `require` finds from a `lua_State`.
///
/// Invariant: entries of `found` are never removed or replaced while the VM lives, so the
/// bytes `require` hands to C stay where they are until C has copied them.
pub(crate) struct ModuleState {
    found: RefCell<HashMap<String, Module>>,
    /// Why a module could not be read (an unreadable file, a dangling link, a run record
    /// that went away), by name; entries are never removed or replaced while the VM lives,
    /// as for `found`, so the message `require` hands to C stays where it is.
    unreadable: RefCell<HashMap<String, String>>,
    folder: Option<ModuleFolder>,
}

static STATE: PerVm<ModuleState> = PerVm::new();

/// Registers the modules' part of the VM whose arena starts at `base`: the `given` modules,
/// and the game's folder to look the others up in.
pub(crate) fn register(
    base: usize,
    given: Vec<Module>,
    folder: Option<ModuleFolder>,
) -> Option<Registered<ModuleState>> {
    let found = given.into_iter().map(|m| (m.name.clone(), m)).collect();
    STATE.register(
        base,
        ModuleState {
            found: RefCell::new(found),
            unreadable: RefCell::new(HashMap::new()),
            folder,
        },
    )
}

impl ModuleState {
    /// The module `name`: given, found before, or now read from the folder (and kept).
    pub(crate) fn find(&self, name: &str) -> Result<Option<Module>, std::io::Error> {
        if let Some(m) = self.found.borrow().get(name) {
            return Ok(Some(m.clone()));
        }
        let Some(dir) = &self.folder else {
            return Ok(None);
        };
        let found = dir.find(name)?;
        if let Some(m) = &found {
            self.found.borrow_mut().insert(name.to_string(), m.clone());
        }
        Ok(found)
    }

    /// What `require` hands to C for module `name`, as pointers into `found` or `unreadable`
    /// (see the invariant).
    fn locate(&self, name: &str) -> Located {
        match self.find(name) {
            Ok(Some(_)) => {}
            Ok(None) => return Located::Missing,
            Err(e) => {
                let mut unreadable = self.unreadable.borrow_mut();
                let why = unreadable
                    .entry(name.to_string())
                    .or_insert_with(|| e.to_string());
                return Located::Unreadable(why.as_ptr(), why.len());
            }
        }
        let found = self.found.borrow();
        match found.get(name) {
            Some(m) => Located::Found(
                m.path.as_ptr(),
                m.path.len(),
                m.source.as_ptr(),
                m.source.len(),
            ),
            None => Located::Missing,
        }
    }
}

/// A module looked up for `require`: its path and source, or why it could not be read
/// (pointer and length of each), or nothing.
enum Located {
    Found(*const u8, usize, *const u8, usize),
    Unreadable(*const u8, usize),
    Missing,
}

/// The deterministic profile's `require(name)` (a `lua_CFunction`): package.loaded[name] if
/// it is true, else the module `name` loaded from the VM's modules (see the module doc), with
/// stock `require`'s results and errors.
///
/// # Safety
/// Called by Lua, on a thread of a VM built by this crate.
pub(crate) unsafe extern "C-unwind" fn require(L: *mut lua_State) -> c_int {
    // SAFETY: called by Lua with its arguments; may raise (a bad name), with no Rust value
    // alive.
    if unsafe { luasnap_require_loaded(L) } != 0 {
        return 1;
    }
    // The lookup, in a block: every Rust value with a destructor is gone before the C step,
    // which may raise.
    let located = {
        let mut len = 0;
        // SAFETY: argument 1 is a string (checked by step 1), alive during the lookup.
        let name = unsafe {
            let p = ffi::lua_tolstring(L, 1, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        };
        match std::str::from_utf8(name) {
            // SAFETY: a VM built by this crate registers its modules' part when built.
            Ok(name) => unsafe { STATE.of(L) }.locate(name),
            Err(_) => Located::Missing,
        }
    };
    let null = std::ptr::null();
    let (path, pathlen, src, srclen) = match located {
        Located::Found(path, pathlen, src, srclen) => (path, pathlen, src, srclen),
        Located::Unreadable(why, len) => (null, 0, why, len),
        Located::Missing => (null, 0, null, 0),
    };
    // SAFETY: [name, package.loaded] from step 1; the bytes live in the VM's modules' part
    // (its invariant) and C copies them before anything else runs.
    unsafe { luasnap_require_load(L, path.cast(), pathlen, src.cast(), srclen) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.lua` file over the limit (a sparse file: nothing is written) is refused by every
    /// way a game's files are read, naming it where the caller knows the path, and read by
    /// none of them.
    #[test]
    fn files_past_the_limits_are_refused_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.lua"), "return {}").unwrap();
        let big = std::fs::File::create(dir.path().join("big.lua")).unwrap();
        big.set_len(SOURCE_BYTES + 1).unwrap();
        let over = |e: std::io::Error| {
            let e = e.to_string();
            assert!(e.contains("over the 64 MiB a Lua source file"), "{e}");
            e
        };
        let e = over(Module::all_in_folder(dir.path()).unwrap_err());
        assert!(e.starts_with("big.lua: "), "{e}");
        over(Module::in_folder(dir.path(), "big").unwrap_err());
        over(FolderFiles::read_from_disk(dir.path(), "big.lua").unwrap_err());
        assert_eq!(chunk_in_folder(dir.path(), "big.lua"), None);
        assert!(chunk_in_folder(dir.path(), "main.lua").is_some());
        // Modules deeper than a game's folder is read are errors, in every folder lookup.
        let deep = dir.path().join("a/b/c/d/e/f/g");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("m.lua"), "return 1").unwrap();
        std::fs::write(dir.path().join("a/b/c/d/e/f/ok.lua"), "return 2").unwrap();
        let folder = ModuleFolder(std::sync::Arc::new(FolderFiles::lazy(dir.path())));
        let e = folder.find("a.b.c.d.e.f.g.m").unwrap_err().to_string();
        assert!(
            e.contains("a/b/c/d/e/f/g/m.lua lies more than 6 folders deep"),
            "{e}"
        );
        assert!(folder.find("a.b.c.d.e.f.ok").unwrap().is_some());
        assert!(folder.find("a.b.c.d.e.f.missing").unwrap().is_none());
        // At the limit, it is read.
        big.set_len(SOURCE_BYTES).unwrap();
        assert_eq!(
            read_source(&dir.path().join("big.lua")).unwrap().len() as u64,
            SOURCE_BYTES
        );
    }
}
