//! examples/host_game.rs: a host binary with natives and a userdata type runs the tool on its
//! game, and `luasnap diff` (without them) compares that game's saves.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The example's binary, built (or found fresh) here with the profile the tool was built
/// with: `cargo test` builds the examples beside the tool, but not when this test target runs
/// alone (`cargo test -p luasnap-cli --test host_game`), and a stale one may be there.
fn example() -> PathBuf {
    let tool = PathBuf::from(env!("CARGO_BIN_EXE_luasnap"));
    let bin = tool.with_file_name("examples").join("host_game");
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let release = tool.parent().and_then(|p| p.file_name()) == Some("release".as_ref());
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "luasnap-cli", "--example", "host_game"]);
        if release {
            cargo.arg("--release");
        }
        let out = cargo.output().unwrap();
        assert!(
            out.status.success(),
            "building the host_game example failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    bin
}

const GAME: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/host_game.lua");

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_host_binary_simulates_its_game_and_diff_reads_its_saves_without_the_natives() {
    // With no command it simulates its game: every mode matches the reference.
    let out = Command::new(example()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("| yes |") && !t.contains("| NO |"), "{t}");

    let tmp = tempfile::Builder::new()
        .prefix("luasnap-host-game-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let save = |frames: &str, name: &str| {
        let path = dir.join(name);
        let out = Command::new(example())
            .args(["simulate", GAME, "--frames", frames, "--mode", "full"])
            .arg("--save")
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        path
    };
    let (a, b) = (save("40", "a.sav"), save("70", "b.sav"));
    // The stock tool has neither host.* nor Vec2: they load as named stand-ins, and the rest
    // compares (exit status 1: the states differ, not 2: an error).
    let diff = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_luasnap"))
            .arg("diff")
            .args([&a, &b])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = diff(&["--game", GAME]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("luasnap_frame: 40 vs 70"), "{t}");
    // A Vec2's bytes are compared: the ships moved.
    assert!(
        t.contains(".pos: userdata (16 bytes) vs userdata (16 bytes) (contents differ)"),
        "{t}"
    );
    // The saves name the native the state holds; the stand-ins say which.
    let out = diff(&["--game", GAME, "--json", "--limit", "100"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The host binary diffs them with its natives registered, to the same verdict.
    let out = Command::new(example())
        .args(["diff".as_ref(), a.as_os_str(), b.as_os_str()])
        .args(["--game", GAME])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}
