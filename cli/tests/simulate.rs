//! `luasnap simulate` and `luasnap p2p`: what they report about games that go wrong, their JSON,
//! and save-games written and loaded through the command line.

mod support;

use std::process::Command;
use support::{
    luasnap, simulate_and_save, simulate_loading, stderr, temp_dir, write_game, GameVersions,
};

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
    let path = write_game("addr", script);
    let run = |mode: &str| {
        luasnap()
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
    assert!(ok.status.success(), "{}", stderr(&ok));
    let bad = run("serialize");
    assert!(!bad.status.success());
    let e = stderr(&bad);
    assert!(e.contains("first differs after frame "), "{e}");
    assert!(
        e.contains("@s.h: "),
        "the message names the differing value by path: {e}"
    );
    // --json carries the explanation too.
    let json = luasnap()
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
    let bad = luasnap()
        .args(["simulate", "--load", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("not a luasnap save-game"),
        "{}",
        stderr(&bad)
    );
    for args in [
        vec!["--delay", "20"],
        vec!["--players", "0"],
        vec!["--frames", "0"],
    ] {
        let out = luasnap().arg("simulate").args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let e = stderr(&out);
        assert!(
            e.contains("must be") || e.contains("needs a window"),
            "{args:?}: {e}"
        );
    }
    let missing = luasnap()
        .args(["simulate", "/nonexistent/game.lua"])
        .output()
        .unwrap();
    assert!(stderr(&missing).contains("cannot read"));
}

#[test]
fn simulate_json_and_save_load_through_the_cli() {
    let tmp = temp_dir("sim");
    let dir = tmp.path();
    let game = dir.join("tiny.lua");
    std::fs::write(&game, TINY).unwrap();
    let save = dir.join("g.sav");
    let run = |extra: &[&str]| -> serde_json::Value {
        let out = luasnap()
            .arg("simulate")
            .arg(&game)
            .args(["--json", "--seed", "3"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
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
    // The costs measured as differences from the reference never come out negative: when the
    // steps' noise beats them they are 0, flagged, with the raw figure beside them.
    for (cost, flag) in [
        ("snapshot_cost_us_per_frame", "snapshot_cost_within_noise"),
        (
            "rollback_overhead_with_tracking_us_median",
            "rollback_overhead_with_tracking_within_noise",
        ),
    ] {
        let reported = m[cost].as_f64().unwrap_or_else(|| panic!("modes[].{cost}"));
        let raw = m[format!("{cost}_raw")].as_f64();
        let within = m[flag]
            .as_bool()
            .unwrap_or_else(|| panic!("modes[].{flag}"));
        assert!(reported >= 0.0, "{cost} {reported}");
        assert_eq!(within, !matches!(raw, Some(r) if r >= 0.0), "{flag}");
        if !within {
            assert_eq!(Some(reported), raw, "{cost}");
        } else {
            assert_eq!(reported, 0.0, "{cost}");
        }
    }
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
}

#[test]
fn simulate_cli_reports_what_users_ask_about() {
    let output_of = |args: &[&str]| luasnap().args(args).output().unwrap();
    let tmp = temp_dir("simcli");
    let dir = tmp.path();
    let game = dir.join("tiny.lua");
    std::fs::write(&game, TINY).unwrap();
    let game = game.to_str().unwrap();
    // Seeds above i64::MAX are refused, not wrapped.
    let out = output_of(&["simulate", game, "--seed", "18446744073709551615"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("the seed must be 0..=9223372036854775807"),
        "{e}"
    );
    // One player: no rollback, and the output says why.
    let out = output_of(&["simulate", game, "--frames", "20", "--players", "1"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("nothing is predicted, so no rollback happens"),
        "{text}"
    );
    // --save confirms what it wrote.
    let save = dir.join("s.sav");
    let out = output_of(&[
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
    let e = stderr(&out);
    assert!(
        e.contains(&format!("saved frame 20 to {}", save.display())),
        "{e}"
    );
    // Loaded with other players than the save's: the flag to give, not only the mismatch.
    let out = output_of(&[
        "simulate",
        game,
        "--frames",
        "5",
        "--players",
        "3",
        "--load",
        save.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("the save-game is for 2 players, not 3") && e.contains("--players 2"),
        "{e}"
    );
    // A memory limit is a size as every size option takes it, T included, from 1M to 1T.
    for (limit, ok) in [("1K", false), ("2T", false), ("1T", true), ("64M", true)] {
        let out = output_of(&[
            "simulate",
            game,
            "--frames",
            "2",
            "--mode",
            "full",
            "--second-process",
            "off",
            "--memory-limit",
            limit,
        ]);
        assert_eq!(out.status.success(), ok, "{limit}: {}", stderr(&out));
        if !ok {
            let e = stderr(&out);
            assert!(e.contains("the arena's size goes from 1M to 1T"), "{e}");
        }
    }
    // A reader that stops early (`| head -1`) ends the output quietly, no panic.
    let mut child = luasnap()
        .args(["simulate", game, "--frames", "20", "--mode", "full"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let e = stderr(&out);
    assert!(!e.contains("panicked"), "{e}");
    assert!(out.status.success(), "{e}");
}

#[test]
fn running_out_of_memory_names_the_frame_the_run_and_the_limit() {
    let path = write_game(
        "leak",
        "local G = {} local hoard function G.init() hoard = {} end
         function G.step(i) for n = 1, 2000 do hoard[#hoard + 1] = string.rep('x', 100) .. #hoard end end
         return G",
    );
    let out = luasnap()
        .args(["simulate", path.to_str().unwrap(), "--frames", "1000"])
        .args(["--memory-limit", "16M"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
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
    let out = luasnap()
        .args(["simulate", path.to_str().unwrap(), "--frames", "10"])
        .args(["--memory-limit", "16M"])
        .output()
        .unwrap();
    let e = stderr(&out);
    assert!(
        e.contains("one allocation asked for more than the rest of the arena")
            && !e.contains("grows every frame"),
        "{e}"
    );
}

/// A game whose eighth `G.step` (frame 7) loops for ever, in a fresh directory named after
/// `what`: (the directory, removed when it drops, and the script's path).
fn runaway_game(what: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = temp_dir(&format!("budget-{what}"));
    let path = dir.path().join("runaway.lua");
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
    let (_dir, path) = runaway_game("simulate");
    let out = luasnap()
        .args(["simulate", path.to_str().unwrap(), "--frames", "20"])
        .args(["--step-budget", "5000000"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("frame 7"), "{err}");
    assert!(err.contains("instruction budget of 5000000"), "{err}");
    assert!(err.contains("runaway.lua:2:"), "{err}");
    // Off: the same game would run for ever, so only the flag's parsing is checked.
    let out = luasnap()
        .args(["simulate", "--frames", "2", "--step-budget", "lots"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("--step-budget"), "{err}");
}

#[test]
fn p2p_stops_a_runaway_step_too() {
    let (_dir, path) = runaway_game("p2p");
    let out = luasnap()
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
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("instruction budget of 5000000"), "{err}");
    assert!(err.contains("runaway.lua:2:"), "{err}");
}

/// A game whose state depends on where the executable was loaded (ASLR moves it in every
/// process): the address of `print`, from `tostring`, enters the state after a few frames. The
/// digest covers it, so peers comparing checksums see it too.
const PROCESS_DEPENDENT: &str = "local G = {} local s
    function G.init() s = { v = 0, h = 0 } end
    function G.step(i)
      s.v = s.v + i[1]
      if s.v > 50 then s.h = (s.h + tonumber(tostring(print):match('0x(%x+)'), 16)) % 1000003 end
    end
    function G.digest() return s.v * 1000003 + s.h end
    return G";

#[test]
fn simulate_checks_its_reference_in_a_second_process() {
    // One mode runs in one process with its reference, so they agree on a game that depends
    // on the process; the reference run again in a second process does not, and says where.
    let path = write_game("process-dependent", PROCESS_DEPENDENT);
    let run = |extra: &[&str]| {
        luasnap()
            .args(["simulate", path.to_str().unwrap(), "--frames", "60"])
            .args(["--mode", "incremental"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("differs in a second process"), "{e}");
    assert!(e.contains("first differs after frame "), "{e}");
    assert!(e.contains("@s.h: "), "the differing value by path: {e}");
    let json = run(&["--json"]);
    assert!(!json.status.success());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let second = &v["second_process"];
    assert_eq!(second["matches"], false, "{second}");
    assert!(second["first_differing_frame"].is_u64(), "{second}");
    assert!(
        second["differences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["path"].as_str().unwrap().contains("@s.h")),
        "{second}"
    );
    // The modes alone agree: they share the process.
    let off = run(&["--second-process", "off"]);
    assert!(off.status.success(), "{}", stderr(&off));
    // A game that does not depend on the process agrees, and the report says so.
    let tiny = write_game("tiny-second", TINY);
    let ok = luasnap()
        .args(["simulate", tiny.to_str().unwrap(), "--frames", "40"])
        .args(["--mode", "incremental", "--json"])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", stderr(&ok));
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(v["second_process"]["matches"], true, "{v}");
    assert_eq!(
        v["second_process"]["value_digest"], v["reference_value_digest"],
        "{v}"
    );
}

#[test]
fn every_mode_of_all_runs_in_a_process_of_its_own() {
    let game = write_game("own-processes", TINY);
    let child = support::spawn(&[
        "simulate",
        game.to_str().unwrap(),
        "--frames",
        "30",
        "--second-process",
        "off",
        "--json",
    ]);
    let parent = child.id();
    let v = support::json_of(child);
    assert_eq!(v["process"], parent, "{v}");
    let modes = v["modes"].as_array().unwrap();
    let names: Vec<_> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, ["full", "incremental", "auto", "serialize"], "{v}");
    let mut processes: Vec<u64> = modes
        .iter()
        .map(|m| m["process"].as_u64().unwrap())
        .collect();
    assert!(!processes.contains(&u64::from(parent)), "{v}");
    processes.sort_unstable();
    processes.dedup();
    assert_eq!(processes.len(), 4, "one process per mode: {v}");
    for m in modes {
        assert_eq!(m["matches_reference"], true, "{m}");
        // Compared across processes by the value digest (the arena holds addresses).
        assert_eq!(m["value_digest"], v["reference_value_digest"], "{m}");
    }
    // One mode runs here, beside its reference.
    let child = support::spawn(&[
        "simulate",
        game.to_str().unwrap(),
        "--frames",
        "30",
        "--mode",
        "full",
        "--second-process",
        "off",
        "--json",
    ]);
    let parent = child.id();
    let v = support::json_of(child);
    assert_eq!(v["modes"][0]["process"], parent, "{v}");
}

#[test]
fn a_mode_that_fails_in_its_process_is_named_with_what_the_process_said() {
    // Arena snapshots copy the gmatch iterator's bytes; the serializer cannot save it.
    let game = write_game(
        "gmatch-held",
        "local G = {} local s
         function G.init() s = { v = 0, it = string.gmatch('a b c', '%a') } end
         function G.step(i) s.v = s.v + i[1] end
         return G",
    );
    let out = luasnap()
        .args(["simulate", game.to_str().unwrap(), "--frames", "20"])
        .args(["--second-process", "off", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("mode serialize failed: cannot save: a string.gmatch iterator"),
        "{e}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed = v["failed_modes"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["mode"], "serialize", "{v}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("gmatch"),
        "{v}"
    );
    let ran: Vec<_> = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["full", "incremental", "auto"], "{v}");
}

#[test]
fn a_mode_whose_process_is_killed_is_reported_with_the_signal() {
    // Steps slow enough that the first mode's process is still running when it is killed.
    let game = write_game(
        "killed-mode",
        "local G = {} local s
         function G.init() s = { v = 0 } end
         function G.step(i)
           local x = 0 for k = 1, 200000 do x = x + k % 7 end
           s.v = s.v + i[1] + x % 3
         end
         return G",
    );
    let parent = support::spawn(&[
        "simulate",
        game.to_str().unwrap(),
        "--frames",
        "100",
        "--second-process",
        "off",
        "--json",
    ]);
    // The first process it starts is the first mode's (bounded wait).
    let mut first = Vec::new();
    for _ in 0..6000 {
        first = children_of(parent.id());
        if !first.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        !first.is_empty(),
        "simulate started no process for its modes"
    );
    let killed = Command::new("kill")
        .args(["-KILL", &first[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = parent.wait_with_output().unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    let said = format!(
        "its process (pid {}) was killed by signal 9 (SIGKILL)",
        first[0]
    );
    assert!(e.contains(&format!("mode full failed: {said}")), "{e}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed_modes"][0]["mode"], "full", "{v}");
    assert_eq!(v["failed_modes"][0]["error"], said.as_str(), "{v}");
    // The other modes ran, each in its own process.
    let ran: Vec<_> = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(ran, ["incremental", "auto", "serialize"], "{v}");
}

#[test]
fn all_modes_are_compared_with_the_reference_of_another_process() {
    // Each mode agrees with the reference of its own process; the first process's reference
    // differs from theirs, which is explained as a second process's difference is.
    let path = write_game("process-dependent-all", PROCESS_DEPENDENT);
    let out = luasnap()
        .args(["simulate", path.to_str().unwrap(), "--frames", "60"])
        .args(["--second-process", "off", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("mode full did not end in the reference state: in its own process"),
        "{e}"
    );
    assert!(e.contains("first differs after frame "), "{e}");
    assert!(e.contains("@s.h: "), "the differing value by path: {e}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for m in v["modes"].as_array().unwrap() {
        assert_eq!(m["matches_reference"], false, "{m}");
    }
    let d = &v["divergence"];
    assert_eq!(d["mode"], "full", "{d}");
    assert!(d["first_differing_frame"].is_u64(), "{d}");
    assert!(
        d["differences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["path"].as_str().unwrap().contains("@s.h")),
        "{d}"
    );
}

#[test]
fn p2p_runs_its_peers_in_two_processes_and_explains_a_desync() {
    let path = write_game("p2p-process-dependent", PROCESS_DEPENDENT);
    let run = |extra: &[&str]| {
        luasnap()
            .args(["p2p", path.to_str().unwrap(), "--frames", "60"])
            .args(["--timeout", "60"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("desyncs detected"), "{e}");
    assert!(e.contains("first differs after frame "), "{e}");
    assert!(e.contains("@s.h: "), "{e}");
    // In one process both peers share the executable's address: no desync to see.
    let one = run(&["--one-process"]);
    assert!(one.status.success(), "{}", stderr(&one));
}

#[test]
fn p2p_peers_agree_on_a_set_keyed_by_tables() {
    // The first entity of pairs() over a set of tables picks what happens next. Two peers in
    // one process have arenas at other addresses: before keys hashed by identity they
    // desynced at the first checksum.
    let game = "local G = {} local W
        function G.init(players, seed)
          W = { set = {}, picked = {}, n = 0 }
          for i = 1, 50 do W.set[{ id = i }] = true end
        end
        function G.step(inputs)
          local first = next(W.set)
          W.picked[#W.picked + 1] = first.id
          W.set[first] = nil
          W.n = W.n + 1
          W.set[{ id = 1000 + W.n, hp = inputs[1] }] = true
        end
        function G.digest() local s = 0 for i, id in ipairs(W.picked) do s = (s * 31 + id) % 1000000007 end return s end
        return G";
    let path = write_game("p2p-table-keys", game);
    let sparse = ["--sparse-saving"];
    let sparse_one = ["--sparse-saving", "--one-process"];
    for extra in [
        &[][..],
        &["--one-process"][..],
        &sparse[..],
        &sparse_one[..],
    ] {
        let out = luasnap()
            .args(["p2p", path.to_str().unwrap(), "--frames", "80"])
            .args(["--timeout", "60"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(said.contains("no desync"), "{said}");
        assert_eq!(
            said.contains("sparse saving"),
            extra.contains(&"--sparse-saving"),
            "{said}"
        );
    }
}

/// The children a process has started, from /proc (every thread's list).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether a process is still running (a zombie has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// A simulate or p2p killed (`kill -9`) while its game loops forever takes its second
/// process with it (one had run on as an orphan, using a core, for as long as the machine was
/// up): the lockstep reference of simulate, the second peer of p2p.
#[test]
fn a_killed_simulate_leaves_no_second_process_behind() {
    let game = write_game(
        "endless",
        "local G = {} local n = 0
         function G.init() end
         function G.step(i) n = n + 1 if n == 3 then while true do end end end
         return G",
    );
    for command in [&["simulate", "--second-process", "on"][..], &["p2p"][..]] {
        let mut parent = luasnap()
            .args(&command[..1])
            .args([game.to_str().unwrap(), "--frames", "10"])
            .args(&command[1..])
            .args(["--step-budget", "off"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The second process starts with the run; wait until it is there (bounded).
        let mut second = Vec::new();
        for _ in 0..600 {
            second = children_of(parent.id());
            if !second.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(!second.is_empty(), "{command:?} started no second process");
        parent.kill().unwrap(); // SIGKILL: the parent gets no chance to stop its children
        parent.wait().unwrap();
        // Generous: the watcher checks five times a second.
        let mut left: Vec<u32> = second.clone();
        for _ in 0..600 {
            left.retain(|&p| running(p));
            if left.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for &p in &left {
            let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
        }
        assert!(
            left.is_empty(),
            "{command:?}: second processes {left:?} outlived their killed parent"
        );
    }
}

/// A game of several files runs from its folder (`require` finds its modules there); a save
/// written by the game in one folder loads when the game runs from another (chunk names are
/// relative to the game's folder), and `--load` says what it did with the saved functions. A
/// state holding `load` is refused with the flag and the declaration that accept it.
#[test]
fn a_game_folder_runs_and_its_saves_load_from_another_folder() {
    let versions = GameVersions::new("folder");
    let game = |name: &str, holds_load: bool| {
        let main = format!(
            "local count = require('lib.count')
             local G = {{}} local s
             function G.init() s = {{ n = 0, keep = {} }} end
             function G.step(i) s.n = count.add(s.n, i[1]) end
             function G.digest() return s.n end return G",
            if holds_load { "load" } else { "false" }
        );
        let count = "local M = {} function M.add(n, k) return n + k end return M";
        versions.write(name, &[("main.lua", &main), ("lib/count.lua", count)])
    };
    let (a, b) = (game("a", false), game("b", false));
    let save = versions.path("s.sav");
    simulate_and_save(&a, 20, &save, &[]);
    let out = simulate_loading(&b.join("main.lua"), &save, &["--frames", "10"]);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    assert!(
        e.contains("luasnap: loaded") && e.contains("unchanged"),
        "{e}"
    );
    // A state holding `load`: refused, naming how to accept it.
    let c = game("c", true);
    simulate_and_save(&c, 5, &save, &[]);
    let load = |extra: &[&str]| simulate_loading(&c, &save, &[&["--frames", "5"], extra].concat());
    let out = load(&[]);
    let e = stderr(&out);
    assert!(!out.status.success());
    assert!(
        e.contains("--allow-permanent load") && e.contains("G.permanents"),
        "{e}"
    );
    let out = load(&["--allow-permanent", "load"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `--json` reports `G.digest()`'s value at the end: the figure another implementation of
/// the game must reach with the same inputs, here the stock driver (`stock_driver.lua`, made
/// for stock Lua) under `luasnap run`.
#[test]
fn simulate_json_reports_the_final_game_digest() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let game = format!("{root}/tests/lua/tiny_game.lua");
    let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args([
            "simulate", &game, "--json", "--seed", "3", "--frames", "120",
        ])
        .args(["--mode", "full", "--second-process", "off"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let digest = v["game_digest"]
        .as_i64()
        .expect("game_digest is an integer");
    let driver = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args([
            "run",
            &format!("{root}/lua-bridge/games/stock_driver.lua"),
            &game,
        ])
        .args(["--seed", "3", "--frames", "120"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&driver.stdout);
    assert!(
        text.contains(&format!("digest after 120 frames: {digest} ")),
        "simulate's game_digest {digest}, the driver's run:\n{text}{}",
        String::from_utf8_lossy(&driver.stderr)
    );
    // A game without G.digest reports null.
    let plain = write_game(
        "nodigest",
        "local G, n = {}, 0 function G.init() end function G.step() n = n + 1 end return G",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args([
            "simulate",
            plain.to_str().unwrap(),
            "--json",
            "--frames",
            "10",
        ])
        .args(["--mode", "full", "--second-process", "off"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["game_digest"].is_null(), "{v}");
}

/// A tiny-ecs game (its filters compiled at run time with `load`, in `G.init` and every 25
/// frames): `simulate --load` of its save, a foreign file, compiles the filters from the text
/// the save carries once the game declares `load` (here with `--allow-permanent load`; the
/// script of `tests/lua/ecs_swarm.lua` declares it in `G.permanents`), says so in its load
/// line, and its run matches the reference. Without the declaration the refusal names it.
#[test]
fn simulate_loads_a_tiny_ecs_save_compiling_its_filters_with_allow_permanent_load() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let tiny =
        std::fs::read_to_string(format!("{root}/lua-bridge/games/ecs_arena/lib/tiny.lua")).unwrap();
    let main = std::fs::read_to_string(format!("{root}/tests/lua/ecs_swarm.lua")).unwrap();
    let undeclared = main.replace("local G = { permanents = { \"load\" } }", "local G = {}");
    assert_ne!(main, undeclared);
    let versions = GameVersions::new("ecs-swarm");
    let game = versions.write(
        "swarm",
        &[("lib/tiny.lua", &tiny), ("main.lua", &undeclared)],
    );
    let save = versions.path("swarm.sav");
    let quick = ["--mode", "full", "--second-process", "off"];
    simulate_and_save(&game, 60, &save, &quick);
    let load = |extra: &[&str]| {
        simulate_loading(
            &game,
            &save,
            &[&["--frames", "40"][..], &quick, extra].concat(),
        )
    };
    let out = load(&[]);
    let e = stderr(&out);
    assert!(!out.status.success());
    assert!(
        e.contains("--allow-permanent load") && e.contains("G.permanents"),
        "{e}"
    );
    let out = load(&["--allow-permanent", "load"]);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    assert!(
        e.contains("compiled from the save's text")
            && e.contains("[string \"return function(_, e)"),
        "{e}"
    );
}

/// An update that adds a method called from an existing one, and renames another: a save of
/// version 1 (classes in modules, in the style of rxi/classic) loads into version 2 in a new
/// process, the new methods are added to the saved class tables (the saved ones kept), and
/// the load line names them.
#[test]
fn methods_new_in_an_update_are_added_to_the_saved_classes() {
    let main = "local W = require('src.world')
         local G = {} local w
         function G.init() w = W.new() end
         function G.step(i) w:step(i[1]) end
         function G.digest() return w.score * 1000 + w.n end return G";
    let world_v1 = "local Object = {} Object.__index = Object
         function Object:extend() local c = setmetatable({}, self) c.__index = c return c end
         local W = Object:extend()
         function W.new() return setmetatable({ score = 0, n = 0, tick = 1 }, W) end
         function W:inc_score(k) self.score = self.score + k end
         function W:step(k) self.n = self.n + 1 self:inc_score(k) end
         return W";
    let world_v2 = "local Object = {} Object.__index = Object
         function Object:extend() local c = setmetatable({}, self) c.__index = c return c end
         local W = Object:extend()
         local BONUS = 3
         function W.new() return setmetatable({ score = 0, n = 0, tick = 1 }, W) end
         function W:bonus() return BONUS + self.n % 2 end
         function W:add_score(k) self.score = self.score + k end
         function W:step(k) self.n = self.n + 1 self:add_score(k + self:bonus()) end
         return W";
    let versions = GameVersions::new("added");
    let v1 = versions.write("v1", &[("main.lua", main), ("src/world.lua", world_v1)]);
    let v2 = versions.write("v2", &[("main.lua", main), ("src/world.lua", world_v2)]);
    let save = versions.path("s.sav");
    simulate_and_save(&v1, 20, &save, &[]);
    // The renamed method's saved code (still referenced by the saved class) is taken only
    // from a file the player trusts; the added ones are this version's own code.
    let out = simulate_loading(&v2, &save, &["--frames", "10", "--trust", "own"]);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    assert!(e.contains("2 added (functions new in this version"), "{e}");
    assert!(
        e.contains("src.world.bonus") && e.contains("src.world.add_score"),
        "{e}"
    );
    assert!(!e.contains("not added"), "{e}");
    let out = simulate_loading(&v2, &save, &[]);
    let e = stderr(&out);
    assert!(!out.status.success() && e.contains("W.inc_score"), "{e}");
}

/// A game whose weak cache loses its entry at every collection point, and counts the misses:
/// its `G.digest()` is 1 + the collection points before its last frame. `every` is its own
/// `G.collect_every` (none: the default, 60).
fn weak_cache_game(every: Option<u64>) -> support::GameFile {
    let own = every.map_or(String::new(), |n| format!("G.collect_every = {n}"));
    write_game(
        "weak-cache",
        &format!(
            "local G = {{}} {own} local s
             function G.init() s = {{ cache = setmetatable({{}}, {{ __mode = 'v' }}), misses = 0 }} end
             function G.step(i)
               if s.cache.entry == nil then s.misses = s.misses + 1 s.cache.entry = {{}} end
             end
             function G.digest() return s.misses end
             return G"
        ),
    )
}

/// `--collect-every` sets the frames between the runtime's collection points, over the
/// game's own `G.collect_every`; the second process runs with it too (else the reference and
/// its check would part); a `--load`, whose count is in the save, refuses it.
#[test]
fn collect_every_sets_the_collection_points_over_the_games_own() {
    let misses = |game: &std::path::Path, extra: &[&str]| {
        let out = luasnap()
            .args(["simulate", game.to_str().unwrap(), "--frames", "120"])
            .args(["--mode", "incremental", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["second_process"]["matches"], true, "{extra:?}: {v}");
        v["game_digest"].as_i64().unwrap()
    };
    let plain = weak_cache_game(None);
    assert_eq!(
        misses(&plain, &[]),
        2,
        "the default: points after frames 60 and 120"
    );
    assert_eq!(misses(&plain, &["--collect-every", "10"]), 12);
    assert_eq!(misses(&plain, &["--collect-every", "0"]), 1);
    let own = weak_cache_game(Some(30));
    assert_eq!(misses(&own, &[]), 4, "the game's G.collect_every");
    assert_eq!(
        misses(&own, &["--collect-every", "10"]),
        12,
        "the flag wins"
    );
    for wrong in ["1.5", "-1", "0/0", "1e300", "'60'"] {
        let game = write_game(
            "collect-every-wrong",
            &format!(
                "local G = {{ collect_every = {wrong} }} function G.init() end
                 function G.step() end return G"
            ),
        );
        let out = luasnap()
            .args(["simulate", game.to_str().unwrap(), "--frames", "2"])
            .output()
            .unwrap();
        assert!(
            !out.status.success() && stderr(&out).contains("must be an integer from 0 to 2^53"),
            "{wrong}: {}",
            stderr(&out)
        );
    }
    let bad = luasnap()
        .args(["simulate", "--collect-every", "often"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("--collect-every"), "{}", stderr(&bad));
    let dir = temp_dir("collect-every");
    let save = dir.path().join("s.sav");
    simulate_and_save(&own, 20, &save, &["--mode", "full"]);
    let out = simulate_loading(&own, &save, &["--collect-every", "10"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--collect-every") && stderr(&out).contains("--load"),
        "{}",
        stderr(&out)
    );
}

/// Both peers of `p2p` run with `--collect-every` (the second process is given it): the
/// weak cache's misses, in the checksum, agree.
#[test]
fn p2p_gives_collect_every_to_its_second_peer() {
    let game = weak_cache_game(Some(30));
    let out = luasnap()
        .args(["p2p", game.to_str().unwrap(), "--frames", "90"])
        .args(["--timeout", "60", "--collect-every", "7"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no desync"));
}

/// The AI module of `a_coroutine_suspended_in_a_function_that_only_moved_resumes_there`: a
/// coroutine (`brain`, started by a closure of `M.new`) that yields each frame, records the
/// line it runs at (an error's position) and leaves a closure reading one of its locals.
const AI_V1: &str = "local M = {}
local STEP = 1
local function brain(s)
  local count = 0
  s.peek = function() return count end
  while true do
    count = count + STEP
    s.n = s.n + 1 + s.input % 3
    local _, msg = pcall(error, 'probe', 2)
    s.line = tonumber(msg:match(':(%d+):'))
    coroutine.yield()
  end
end
function M.new()
  local s = { n = 0, line = 0, input = 0 }
  s.co = coroutine.create(function() brain(s) end)
  return s
end
function M.step(s, input)
  s.input = input
  assert(coroutine.resume(s.co))
end
return M
";

/// A save whose coroutine is suspended in functions an update only moved (a comment line
/// added above them) loads under the default (foreign) trust in a new process, and the
/// coroutine goes on in the new version's code: its digest after more frames is a straight
/// run's of the new version (which differs from the old one's only in the line the coroutine
/// reports). One added local (registers shifted, the same lines) or a changed body is still
/// refused as code that changed; own trust keeps the saved code as before.
#[test]
fn a_coroutine_suspended_in_a_function_that_only_moved_resumes_there() {
    let tmp = temp_dir("comoved");
    let base = tmp.path();
    let game = |name: &str, ai: &str| {
        let dir = base.join(name);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(
            dir.join("main.lua"),
            "local ai = require('src.ai')
             local G = {} local s
             function G.init() s = ai.new() end
             function G.step(inputs) ai.step(s, inputs[1]) end
             function G.digest()
               return s.n * 1000000 + s.line * 1000 + (s.peek and s.peek() or 0) % 1000
             end
             return G",
        )
        .unwrap();
        std::fs::write(dir.join("src/ai.lua"), ai).unwrap();
        dir.to_str().unwrap().to_owned()
    };
    let v1 = game("v1", AI_V1);
    let moved = game("moved", &format!("-- a comment added above\n{AI_V1}"));
    let shifted = AI_V1.replace("  local count = 0\n", "  local pad, count = 0, 0\n");
    let changed = AI_V1.replace("count + STEP", "count + 2 * STEP");
    assert!(shifted != AI_V1 && changed != AI_V1);
    let (shifted, changed) = (game("shifted", &shifted), game("changed", &changed));
    let save = base.join("s30.sav");
    let save = save.to_str().unwrap();
    let run = |args: &[&str]| {
        luasnap()
            .arg("simulate")
            .args(args)
            .args(["--mode", "full", "--second-process", "off", "--json"])
            .output()
            .unwrap()
    };
    let digest = |out: &std::process::Output| {
        assert!(out.status.success(), "{}", stderr(out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["game_digest"].as_i64().expect("a game digest")
    };
    let out = run(&[&v1, "--frames", "30", "--save", save]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v1_straight = digest(&run(&[&v1, "--frames", "50"]));
    let moved_straight = digest(&run(&[&moved, "--frames", "50"]));
    assert_ne!(
        v1_straight, moved_straight,
        "the reported line tells them apart"
    );

    let out = run(&[&moved, "--frames", "20", "--load", save]);
    let e = stderr(&out);
    assert_eq!(digest(&out), moved_straight, "{e}");
    assert!(
        e.contains("moved to other lines, code unchanged")
            && e.contains("brain (src/ai.lua:4)")
            && !e.contains("kept"),
        "{e}"
    );
    // The old version goes on as before.
    assert_eq!(
        digest(&run(&[&v1, "--frames", "20", "--load", save])),
        v1_straight
    );

    for refused in [&shifted, &changed] {
        let out = run(&[refused, "--frames", "20", "--load", save]);
        let e = stderr(&out);
        assert!(!out.status.success(), "{refused}: {e}");
        assert!(
            e.contains("suspended in the function brain (src/ai.lua:3), whose code changed")
                && e.contains("--trust own"),
            "{refused}: {e}"
        );
    }
    // Own trust: the suspended functions keep their saved code (its lines), as before.
    let out = run(&[&moved, "--frames", "20", "--load", save, "--trust", "own"]);
    let e = stderr(&out);
    assert_eq!(digest(&out), v1_straight, "{e}");
    assert!(e.contains("kept with their saved code, which every later call through them runs too, coroutines started from them later included (brain"), "{e}");
}

/// A chunk the game compiles at run time under a name of its own (`load(text, "=rules")` in
/// `G.init`) is not compiled from a foreign save: the refusal tells the game's author the two
/// ways out, and the second (compile it at the script's top level, keep its function) loads.
#[test]
fn a_chunk_loaded_under_its_own_name_is_refused_saying_what_the_game_can_do() {
    let tmp = temp_dir("named-chunk");
    let game = |name: &str, top: &str, init: &str| {
        let path = tmp.path().join(name);
        std::fs::write(
            &path,
            format!(
                "local G = {{}} local s
                 {top}
                 function G.init() s = {{ n = 0 }} s.rule = {init} end
                 function G.step() s.n = s.rule(s.n) end
                 function G.digest() return s.n end
                 return G"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    };
    let text = "'return function(n) return n + 1 end'";
    let in_init = game("init.lua", "", &format!("load({text}, '=rules')()"));
    let at_top = game(
        "top.lua",
        &format!("local make_rule = load({text}, '=rules')"),
        "make_rule()",
    );
    let quick = ["--mode", "full", "--second-process", "off"];
    for (script, loads) in [(&in_init, false), (&at_top, true)] {
        let save = format!("{script}.sav");
        let out = luasnap()
            .args(["simulate", script, "--frames", "10", "--save", &save])
            .args(quick)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let out = luasnap()
            .args(["simulate", script, "--frames", "10", "--load", &save])
            .args(quick)
            .output()
            .unwrap();
        let e = stderr(&out);
        assert_eq!(out.status.success(), loads, "{e}");
        if !loads {
            assert!(
                e.contains("rules:1")
                    && e.contains("load(text) without a chunk name")
                    && e.contains("G.permanents")
                    && e.contains("at its script's top level"),
                "{e}"
            );
        }
    }
}

/// With `--load`, `--seed` chooses the scripted inputs of the frames played from the save
/// (the game's own random state is the save's): the saving run's seed continues its game as
/// one straight run, another seed plays other inputs, and the load's line says which seed.
#[test]
fn simulate_load_takes_the_seed_of_the_inputs_it_plays() {
    let game = write_game("seed-load", TINY);
    let dir = temp_dir("seed-load");
    let save = dir.path().join("at50.luasave");
    let quick = ["--mode", "full", "--second-process", "off", "--json"];
    simulate_and_save(&game, 50, &save, &[&quick[..], &["--seed", "7"]].concat());
    let digest = |out: std::process::Output| {
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["game_digest"].as_i64().unwrap(), stderr(&out))
    };
    let straight = digest(
        luasnap()
            .arg("simulate")
            .arg(&game)
            .args(["--frames", "100", "--seed", "7"])
            .args(quick)
            .output()
            .unwrap(),
    );
    let load = |seed: &str| {
        digest(simulate_loading(
            &game,
            &save,
            &[&quick[..], &["--frames", "50", "--seed", seed]].concat(),
        ))
    };
    let (same, said) = load("7");
    assert_eq!(same, straight.0, "continued with the saving seed");
    assert!(said.contains("inputs from --seed 7"), "{said}");
    assert_ne!(load("9").0, straight.0, "another seed, other inputs");
}

/// A module reached through a symbolic link (a library shared by games) runs in every mode
/// and in the second process; a `.lua` link to nothing that the game does not require is
/// not read.
#[cfg(unix)]
#[test]
fn simulate_follows_a_symbolic_link_in_the_games_folder() {
    let root = temp_dir("link-game");
    let (game, shared) = (root.path().join("game"), root.path().join("shared"));
    std::fs::create_dir_all(&game).unwrap();
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("count.lua"), "return { by = 3 }").unwrap();
    std::os::unix::fs::symlink(&shared, game.join("lib")).unwrap();
    std::fs::write(
        game.join("main.lua"),
        "local count = require('lib.count') local G, n = {}, 0
         function G.init() n = 0 end
         function G.step(i) n = n + count.by * i[1] end
         function G.digest() return n end
         return G",
    )
    .unwrap();
    let run = || {
        luasnap()
            .arg("simulate")
            .arg(&game)
            .args(["--frames", "20", "--json"])
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["second_process"]["matches"], true, "{v}");
    // A file the game never requires is never read: a `.lua` link to nothing beside it
    // changes nothing (`serve` reads the folder whole and stops naming it).
    std::os::unix::fs::symlink(root.path().join("gone.lua"), game.join("old.lua")).unwrap();
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    // A required module that is a link to nothing is named as such, not "not found".
    std::fs::remove_file(shared.join("count.lua")).unwrap();
    std::os::unix::fs::symlink(root.path().join("moved.lua"), shared.join("count.lua")).unwrap();
    let out = run();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("module 'lib.count' could not be read")
            && err.contains("lib/count.lua: a symbolic link to")
            && err.contains("moved.lua, which cannot be read"),
        "{err}"
    );
}

/// The newcomer team's game (`tests/newcomer-game`, written outside the project): its
/// version 3 renamed `Entity:hurt` to `Entity:take_damage` and changed its body, and the
/// saved class table still holds the old method. A version 1 save loads into version 3
/// under the default (foreign) trust in another process once the game declares the rename
/// (`G.renamed`), and plays on as under `--trust own` (which keeps the old method's saved
/// code; version 3 never calls it). Without the declaration the refusal names the
/// declaration to add; a declaration naming a place version 3 lacks is refused, naming it.
#[test]
fn the_newcomers_renamed_method_loads_under_foreign_trust_once_declared() {
    let game = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/newcomer-game");
    let versions = GameVersions::new("renamed");
    let declaring = |name: &str, declaration: &str| {
        let dir = versions.path(name);
        copy_folder(&game.join("v3"), &dir);
        let main = std::fs::read_to_string(dir.join("main.lua")).unwrap();
        let main = main.replace("\nreturn G", &format!("\n{declaration}\nreturn G"));
        assert!(main.contains(declaration));
        std::fs::write(dir.join("main.lua"), main).unwrap();
        dir
    };
    let renamed = declaring(
        "v3-renamed",
        r#"G.renamed = { ["Entity.hurt"] = "Entity.take_damage" }"#,
    );
    let mistyped = declaring(
        "v3-mistyped",
        r#"G.renamed = { ["Entity.hurt"] = "Entity.take_dmg" }"#,
    );
    let save = versions.path("v1.sav");
    simulate_and_save(&game.join("v1"), 120, &save, &["--mode", "full"]);
    let more = ["--frames", "60", "--mode", "full", "--json"];
    let digest = |out: &std::process::Output| {
        assert!(out.status.success(), "{}", stderr(out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["game_digest"].as_i64().expect("a game digest")
    };

    let own = simulate_loading(
        &game.join("v3"),
        &save,
        &[&more[..], &["--trust", "own"]].concat(),
    );
    let out = simulate_loading(&renamed, &save, &more);
    let e = stderr(&out);
    assert_eq!(digest(&out), digest(&own), "{e}");
    assert!(
        e.contains("1 renamed as the game declares (Entity.hurt as Entity.take_damage (src/entity.lua:28))"),
        "{e}"
    );

    let out = simulate_loading(&game.join("v3"), &save, &more);
    let e = stderr(&out);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains("the save holds the function Entity.hurt")
            && e.contains(r#"G.renamed = { ["Entity.hurt"] = "its name now" }"#)
            && e.contains("--trust own"),
        "{e}"
    );

    let out = simulate_loading(&mistyped, &save, &more);
    let e = stderr(&out);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains(r#"G.renamed["Entity.hurt"] = "Entity.take_dmg" names Entity.take_dmg, which this version of src/entity.lua does not have (it has Entity.init, Entity.take_damage, Entity.update)"#),
        "{e}"
    );

    // The typo shows as the game starts, with no save at all: a developer's plain run.
    let out = support::output(&[
        "simulate",
        mistyped.to_str().unwrap(),
        "--frames",
        "1",
        "--mode",
        "full",
        "--second-process",
        "off",
    ]);
    let e = stderr(&out);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains(r#"G.renamed["Entity.hurt"] = "Entity.take_dmg" names Entity.take_dmg, which this version of src/entity.lua does not have (it has Entity.init, Entity.take_damage, Entity.update), nor does any other file of the game; correct G.renamed"#),
        "{e}"
    );
}

/// Copies the files of folder `from` into `to` (made), folders included.
fn copy_folder(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A game that removes a module's function while it runs (`M.listeners.on_tick = nil`, an
/// unsubscribe) and is continued from its own save in another process plays on as the
/// straight run: the load adds back no function of a module whose code is the saved one (it
/// used to, as "new in this version", and a late joiner of a served match was resynced until
/// dropped). A function a new version of the module adds is still added.
#[test]
fn a_function_the_game_removed_stays_removed_after_a_load() {
    let module = "local M = {}
M.listeners = { on_tick = function(w) w.x = w.x + 1 end }
function M.fire(w) local f = M.listeners.on_tick if f then f(w) end end
return M
";
    let main = "local M = require 'M'
local G, world = {}
function G.init() world = { tick = 0, x = 0 } end
function G.step()
  world.tick = world.tick + 1
  if world.tick == 5 then M.listeners.on_tick = nil end
  M.fire(world)
  if M.bonus then world.x = world.x + M.bonus() end
end
function G.digest() return world.tick * 1000 + world.x end
return G
";
    let versions = GameVersions::new("removed-fn");
    let v1 = versions.write("v1", &[("main.lua", main), ("M.lua", module)]);
    let with_bonus = module.replace("return M", "function M.bonus() return 100 end\nreturn M");
    let v2 = versions.write("v2", &[("main.lua", main), ("M.lua", &with_bonus)]);
    let args = ["--mode", "full", "--second-process", "off"];
    let digest = |out: &std::process::Output| {
        assert!(out.status.success(), "{}", stderr(out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["game_digest"].as_i64().expect("a game digest")
    };
    let straight = luasnap()
        .arg("simulate")
        .arg(&v1)
        .args(["--frames", "20", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(digest(&straight), 20004, "four ticks counted, then none");
    let save = versions.path("v1.sav");
    simulate_and_save(&v1, 10, &save, &args);
    let more = [
        "--frames",
        "10",
        "--json",
        "--mode",
        "full",
        "--second-process",
        "off",
    ];
    let same = simulate_loading(&v1, &save, &more);
    assert_eq!(digest(&same), 20004, "{}", stderr(&same));
    assert!(!stderr(&same).contains("added"), "{}", stderr(&same));
    // Version 2 changed M.lua: its new M.bonus is added; the removed listener is not (its
    // chunk changed, so this load cannot tell: it is added back, as the docs say).
    let updated = simulate_loading(&v2, &save, &more);
    let said = stderr(&updated);
    assert!(said.contains("M.bonus"), "{said}");
    assert!(digest(&updated) >= 20000 + 4 + 10 * 100, "{said}");
}

/// A saved handler `M.a.b` stays bound to `M.a.b` in a new process when the update adds an
/// unrelated `M["a.b"]` above it: a key that is no name is a place of its own (an outside
/// tester's place1 w1/w2, where the save ran the new handler: G.digest() 10010, not 20).
#[test]
fn a_new_quoted_key_does_not_take_over_a_saved_functions_place() {
    let tmp = temp_dir("quoted");
    let base = tmp.path();
    let game = |name: &str, extra: &str| {
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("main.lua"),
            format!(
                "local G = {{}} local world
                 local M = {{ a = {{}} }}
                 {extra}
                 M.a.b = function(w) w.x = w.x + 1 end
                 function G.init() world = {{ x = 0, f = M.a.b }} end
                 function G.step() world.f(world) end
                 function G.digest() return world.x end
                 return G"
            ),
        )
        .unwrap();
        dir.to_str().unwrap().to_owned()
    };
    let w1 = game("w1", "");
    let w2 = game("w2", "M[\"a.b\"] = function(w) w.x = w.x + 1000 end");
    let save = base.join("w1.sav");
    let save = save.to_str().unwrap();
    let run = |args: &[&str]| {
        luasnap()
            .arg("simulate")
            .args(args)
            .args(["--mode", "full", "--second-process", "off", "--json"])
            .output()
            .unwrap()
    };
    let out = run(&[&w1, "--frames", "10", "--save", save]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&[&w2, "--frames", "10", "--load", save]);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["game_digest"].as_i64(), Some(20), "{e}");
    assert!(
        e.contains("5 functions unchanged") && !e.contains("rebound"),
        "{e}"
    );
}

/// A saved function of a file the update removed: no declaration can bind it (a new place is
/// in the same file), and the refusal says the file was not found and what to do.
#[test]
fn a_function_of_a_removed_file_is_refused_naming_the_file() {
    let main = "local Brain = require 'ai.brain'
local G, world = {}
function G.think(w) w.x = w.x + 1 end
function G.init() world = { x = 0, f = Brain.think } end
function G.step() world.f(world) end
function G.digest() return world.x end
return G
";
    let brain = "local Brain = {}\nfunction Brain.think(w) w.x = w.x + 1 end\nreturn Brain\n";
    let versions = GameVersions::new("removed-file");
    let v1 = versions.write("v1", &[("main.lua", main), ("ai/brain.lua", brain)]);
    let inlined = main
        .replace(
            "local Brain = require 'ai.brain'",
            "local Brain = { think = function(w) w.x = w.x + 1 end }",
        )
        .replace(
            "return G\n",
            "G.removed = { [\"ai/brain.lua:Brain.think\"] = \"G.think\" }\nreturn G\n",
        );
    let v2 = versions.write("v2", &[("main.lua", &inlined)]);
    let save = versions.path("v1.sav");
    simulate_and_save(
        &v1,
        5,
        &save,
        &["--mode", "full", "--second-process", "off"],
    );
    let out = simulate_loading(&v2, &save, &["--frames", "3", "--mode", "full"]);
    let said = stderr(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("no file ai/brain.lua was found among the game's files")
            && said.contains("--trust own"),
        "{said}"
    );
}
