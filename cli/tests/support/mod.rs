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

/// A game script `source` in a file of its own, named by `name`, removed when the returned
/// path drops.
pub fn write_game(name: &str, source: &str) -> tempfile::TempPath {
    let file = tempfile::Builder::new()
        .prefix(&format!("luasnap-{name}-"))
        .suffix(".lua")
        .tempfile()
        .unwrap();
    std::fs::write(file.path(), source).unwrap();
    file.into_temp_path()
}
