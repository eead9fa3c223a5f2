//! What the tests of the `luasnap` binary share: the command, its output, files to run.
#![allow(dead_code)] // each test binary uses its own subset

use std::process::{Child, Command, Output, Stdio};

/// The `luasnap` binary under test, as a command to add arguments to.
pub fn luasnap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_luasnap"))
}

/// `luasnap ARGS` run to its end.
pub fn output(args: &[&str]) -> Output {
    luasnap().args(args).output().unwrap()
}

/// `luasnap ARGS` started, its standard output and error piped.
pub fn spawn(args: &[&str]) -> Child {
    luasnap()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The JSON report of a started `luasnap ... --json` once it ended, which must be a success.
pub fn json_of(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What a run wrote to its standard error.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fresh folder named by `tag`, removed with all it holds when the returned guard drops: at
/// the end of the test, and while a failing test unwinds.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("luasnap-{tag}-"))
        .tempdir()
        .unwrap()
}

/// A game script `source` in a folder of its own (a script's folder is its game's folder,
/// which the commands read: not the shared temporary folder), named by `name`, removed when
/// the returned guard drops.
pub fn write_game(name: &str, source: &str) -> GameFile {
    let dir = temp_dir(name);
    let path = dir.path().join(format!("{name}.lua"));
    std::fs::write(&path, source).unwrap();
    GameFile { _dir: dir, path }
}

/// A game script [`write_game`] wrote: a path, removed with its folder when this drops.
pub struct GameFile {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl std::ops::Deref for GameFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for GameFile {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl AsRef<std::path::Path> for GameFile {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

/// Versions of a game for the update tests, each a folder of files, under one temporary
/// folder (removed when this drops) that also holds their save-games.
pub struct GameVersions {
    root: tempfile::TempDir,
}

impl GameVersions {
    /// An empty set, its folder named by `tag`.
    pub fn new(tag: &str) -> GameVersions {
        GameVersions {
            root: temp_dir(tag),
        }
    }

    /// The version `name`: a folder holding `files` (each a path in the folder and its
    /// text; folders made as needed), written over what was there. Returns the folder.
    pub fn write(&self, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = self.path(name);
        for (rel, text) in files {
            let path = dir.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    /// `rel` in the root folder: a save-game's path, a version's file.
    pub fn path(&self, rel: &str) -> std::path::PathBuf {
        self.root.path().join(rel)
    }
}

/// `luasnap simulate GAME --frames FRAMES --save SAVE EXTRA...`, which must succeed.
pub fn simulate_and_save(
    game: &std::path::Path,
    frames: u64,
    save: &std::path::Path,
    extra: &[&str],
) {
    let out = luasnap()
        .arg("simulate")
        .arg(game)
        .args(["--frames", &frames.to_string(), "--save"])
        .arg(save)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `luasnap simulate GAME --load SAVE EXTRA...` run to its end: its output.
pub fn simulate_loading(game: &std::path::Path, save: &std::path::Path, extra: &[&str]) -> Output {
    luasnap()
        .arg("simulate")
        .arg(game)
        .arg("--load")
        .arg(save)
        .args(extra)
        .output()
        .unwrap()
}
