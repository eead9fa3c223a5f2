//! `luasnap simulate` and `luasnap p2p`: what they report about games that go wrong, their JSON,
//! and save-games written and loaded through the command line.

use std::process::Command;

const TINY: &str = include_str!("../../tests/lua/tiny_game.lua");

#[test]
fn a_game_that_depends_on_addresses_is_reported_with_the_first_diverging_frame() {
    // The game keeps a number derived from a fresh table's address. Arena snapshots restore
    // addresses exactly, so those runs agree; the graph serializer rebuilds objects elsewhere,
    // so after a load the game diverges, and simulate must say from which frame.
    let script = "local G = {} local s function G.init() s = { v = 0, h = 0 } end
                  function G.step(i)
                    s.v = s.v + i[1]
                    s.h = (s.h + tonumber(tostring({}):match('0x(%x+)'), 16)) % 1000003
                  end
                  function G.digest() return s.v * 1000003 + s.h end return G";
    let path = std::env::temp_dir().join(format!("luasnap-addr-{}.lua", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let run = |mode: &str| {
        Command::new(env!("CARGO_BIN_EXE_luasnap"))
            .args([
                "simulate",
                path.to_str().unwrap(),
                "--frames",
                "60",
                "--mode",
                mode,
            ])
            .output()
            .unwrap()
    };
    let ok = run("incremental");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = run("serialize");
    assert!(!bad.status.success());
    let e = String::from_utf8_lossy(&bad.stderr);
    assert!(e.contains("first differs after frame "), "{e}");
    assert!(
        e.contains("@s.h: "),
        "the message names the differing value by path: {e}"
    );
    // --json carries the explanation too.
    let json = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args([
            "simulate",
            path.to_str().unwrap(),
            "--frames",
            "60",
            "--mode",
            "serialize",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(!json.status.success());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let d = &v["divergence"];
    assert_eq!(d["mode"], "serialize");
    assert!(d["first_differing_frame"].is_u64(), "{d}");
    assert!(
        d["differences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["path"].as_str().unwrap().contains("@s.h")),
        "{d}"
    );
    // A save file that is not one, and options out of range, are clear errors.
    let bad = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", "--load", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not a luasnap save-game"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    for args in [
        vec!["--delay", "20"],
        vec!["--players", "0"],
        vec!["--frames", "0"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
            .arg("simulate")
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.contains("must be") || e.contains("needs a window"),
            "{args:?}: {e}"
        );
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", "/nonexistent/game.lua"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
    std::fs::remove_file(&path).ok();
}

#[test]
fn simulate_json_and_save_load_through_the_cli() {
    let dir = std::env::temp_dir().join(format!("luasnap-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let game = dir.join("tiny.lua");
    std::fs::write(&game, TINY).unwrap();
    let save = dir.join("g.sav");
    let run = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
            .arg("simulate")
            .arg(&game)
            .args(["--json", "--seed", "3"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let straight = run(&["--frames", "600", "--mode", "incremental"]);
    for key in [
        "frames",
        "players",
        "delay",
        "heap_bytes",
        "reference_digest",
        "reference_value_digest",
        "modes",
    ] {
        assert!(straight.get(key).is_some(), "missing {key}");
    }
    let m = &straight["modes"][0];
    for key in [
        "mode",
        "rollbacks",
        "resimulated_frames",
        "save_us_median",
        "save_us_p99",
        "load_us_median",
        "load_us_p99",
        "final_digest",
        "value_digest",
        "matches_reference",
    ] {
        assert!(m.get(key).is_some(), "missing modes[].{key}");
    }
    assert_eq!(m["matches_reference"], true);
    run(&[
        "--frames",
        "300",
        "--mode",
        "full",
        "--save",
        save.to_str().unwrap(),
    ]);
    let resumed = run(&[
        "--frames",
        "300",
        "--mode",
        "serialize",
        "--load",
        save.to_str().unwrap(),
    ]);
    assert_eq!(
        resumed["reference_value_digest"],
        straight["reference_value_digest"]
    );
    assert_eq!(
        resumed["modes"][0]["value_digest"],
        straight["reference_value_digest"]
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn simulate_cli_reports_what_users_ask_about() {
    let luasnap = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_luasnap"))
            .args(args)
            .output()
            .unwrap()
    };
    let dir = std::env::temp_dir().join(format!("luasnap-simcli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let game = dir.join("tiny.lua");
    std::fs::write(&game, TINY).unwrap();
    let game = game.to_str().unwrap();
    // Seeds above i64::MAX are refused, not wrapped.
    let out = luasnap(&["simulate", game, "--seed", "18446744073709551615"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("the seed must be 0..=9223372036854775807"),
        "{e}"
    );
    // One player: no rollback, and the output says why.
    let out = luasnap(&["simulate", game, "--frames", "20", "--players", "1"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("nothing is predicted, so no rollback happens"),
        "{text}"
    );
    // --save confirms what it wrote.
    let save = dir.join("s.sav");
    let out = luasnap(&[
        "simulate",
        game,
        "--frames",
        "20",
        "--mode",
        "full",
        "--save",
        save.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains(&format!("saved frame 20 to {}", save.display())),
        "{e}"
    );
    // A reader that stops early (`| head -1`) ends the output quietly, no panic.
    let mut child = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", game, "--frames", "20", "--mode", "full"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!e.contains("panicked"), "{e}");
    assert!(out.status.success(), "{e}");
}

#[test]
fn running_out_of_memory_names_the_frame_the_run_and_the_limit() {
    let path = std::env::temp_dir().join(format!("luasnap-leak-{}.lua", std::process::id()));
    std::fs::write(
        &path,
        "local G = {} local hoard function G.init() hoard = {} end
         function G.step(i) for n = 1, 2000 do hoard[#hoard + 1] = string.rep('x', 100) .. #hoard end end
         return G",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", path.to_str().unwrap(), "--frames", "1000"])
        .args(["--memory-limit", "16M"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("the game ran out of memory at frame ")
            && e.contains("in the reference (lockstep) run")
            && e.contains("of a 16777216-byte arena")
            && e.contains("--memory-limit")
            && e.contains("look for state that grows every frame"),
        "{e}"
    );
    // One huge request in a small heap is not blamed on growing state (a newcomer's
    // `string.rep("x", 1 << 34)` was).
    std::fs::write(
        &path,
        "local G = {} function G.init() end
         function G.step(i) local s = string.rep('x', 1 << 34) end
         return G",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", path.to_str().unwrap(), "--frames", "10"])
        .args(["--memory-limit", "16M"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("one allocation asked for more than the rest of the arena")
            && !e.contains("grows every frame"),
        "{e}"
    );
    std::fs::remove_file(&path).ok();
}

/// A game whose eighth `G.step` (frame 7) loops for ever, in a fresh directory named after
/// `what`: (the directory, the script's path).
fn runaway_game(what: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("luasnap-budget-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runaway.lua");
    std::fs::write(
        &path,
        "local G, n = {}, 0 function G.init() end
         function G.step(i) n = n + 1 if n == 8 then while true do end end end
         return G",
    )
    .unwrap();
    (dir, path)
}

#[test]
fn simulate_names_the_frame_of_a_runaway_step() {
    let (dir, path) = runaway_game("simulate");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", path.to_str().unwrap(), "--frames", "20"])
        .args(["--step-budget", "5000000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("frame 7"), "{err}");
    assert!(err.contains("instruction budget of 5000000"), "{err}");
    assert!(err.contains("runaway.lua:2:"), "{err}");
    // Off: the same game would run for ever, so only the flag's parsing is checked.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["simulate", "--frames", "2", "--step-budget", "lots"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--step-budget"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn p2p_stops_a_runaway_step_too() {
    let (dir, path) = runaway_game("p2p");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args([
            "p2p",
            path.to_str().unwrap(),
            "--frames",
            "40",
            "--timeout",
            "60",
        ])
        .args(["--step-budget", "5000000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("instruction budget of 5000000"), "{err}");
    assert!(err.contains("runaway.lua:2:"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
