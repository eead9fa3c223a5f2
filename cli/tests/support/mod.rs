//! What the tests of the `luasnap` binary share: the command, its output, files to run.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
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

/// A fresh folder for this test process, named by `tag`.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("luasnap-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A game script `source` in a file of its own, named by `name`.
pub fn write_game(name: &str, source: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("luasnap-{name}-{}.lua", std::process::id()));
    std::fs::write(&path, source).unwrap();
    path
}
