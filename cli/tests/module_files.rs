//! A multi-file game's files are read once per run, and every VM of the run, in this
//! process or in the second ones it starts, runs those bytes: a module edited while
//! `simulate` or `p2p` runs cannot make two processes (or two peers) run different code.
//!
//! This test binary is its own host binary (`luasnap_cli::run_with`, as
//! examples/host_game.rs), so the second processes the tool starts (this same executable)
//! have its natives: `host.after()` in the first process edits the game's module once its
//! first VM has required it, and `host.before()` in a second process waits for that edit
//! before the script requires the module. The order is fixed by the edit's marker file, not
//! by timing: a second process that read the folder again would run the edited module.
//! `harness = false`: the binary answers the tool's command lines as the tool.

use luasnap::bridge::runtime::VmSetup;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};
use std::time::{Duration, Instant};

/// The game's main script: requires `ai` at its top level, between the two natives.
const MAIN: &str = r#"
host.before()
local ai = require("ai")
host.after()
local G, n = {}, 0
function G.init(players, seed) n = seed end
function G.step(inputs)
  for _, b in ipairs(inputs) do n = (n * 31 + ai.k + b) % 1000003 end
end
function G.digest() return n end
return G
"#;

const AI: &str = "return { k = 1 }\n";
const AI_EDITED: &str = "return { k = 1000 }\n";

/// Is this process one the tool started (a second process, a second peer)?
fn second_process() -> bool {
    std::env::args().any(|a| a == "--peer-of" || a.starts_with("--lockstep") || a == "--replay")
}

/// The game's folder, from the environment the test gave the first process (inherited).
fn folder() -> PathBuf {
    PathBuf::from(std::env::var_os("MODULE_FILES_GAME").expect("MODULE_FILES_GAME is set"))
}

fn setup() -> VmSetup {
    VmSetup::new(|b| {
        b.native("host.before", |_| {
            if second_process() {
                let marker = folder().join("edited");
                let until = Instant::now() + Duration::from_secs(60);
                while !marker.exists() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Ok(())
        })
        .native("host.record", |_| {
            // A second process keeps a copy of the run's record of what it read.
            let args: Vec<String> = std::env::args().collect();
            if let Some(i) = args.iter().position(|a| a == "--game-files") {
                std::fs::copy(&args[i + 1], folder().join("record.copy")).unwrap();
            }
            Ok(())
        })
        .native("host.after", |_| {
            if !second_process() {
                let dir = folder();
                std::fs::write(dir.join("ai.lua"), AI_EDITED).unwrap();
                std::fs::write(dir.join("edited"), "").unwrap();
            }
            Ok(())
        })
    })
}

/// A fresh game folder (main.lua, ai.lua), removed when the guard drops.
fn game() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("luasnap-module-files-")
        .tempdir()
        .unwrap();
    std::fs::write(dir.path().join("main.lua"), MAIN).unwrap();
    std::fs::write(dir.path().join("ai.lua"), AI).unwrap();
    dir
}

/// This binary as the tool, on the game in `dir`.
fn tool(dir: &Path, args: &[&str]) -> Output {
    tool_at(dir, dir, args)
}

/// This binary as the tool, on the game at `game` (a folder or a script) in `dir`.
fn tool_at(game: &Path, dir: &Path, args: &[&str]) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(args)
        .arg(game)
        .env("MODULE_FILES_GAME", dir)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `simulate`'s second process runs the reference on the files the first one read.
fn simulate_second_process_runs_the_files_read_at_start() {
    let dir = game();
    let out = tool(
        dir.path(),
        &["simulate", "--frames", "30", "--mode", "full", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["second_process"]["matches"], true, "{v}");
    // The edit happened: a run started now runs it.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ai.lua")).unwrap(),
        AI_EDITED
    );
}

/// `p2p`'s two peers, in two processes and in one, run the files the first one read.
fn p2p_peers_run_the_files_read_at_start() {
    for one in [false, true] {
        let dir = game();
        let mut args = vec!["p2p", "--frames", "40", "--timeout", "60"];
        if one {
            args.push("--one-process");
        }
        let out = tool(dir.path(), &args);
        let t = text(&out);
        assert!(out.status.success() && t.contains("no desync"), "{t}");
        assert!(dir.path().join("edited").exists(), "{t}");
    }
}

/// A single script in a folder crowded with other Lua files (a downloads folder, /tmp): the
/// run reads the module it requires and nothing else, finds its sibling module although
/// 3,000 files sort before it (more than a walk of the folder reads), and its second process
/// runs the bytes the first read, from the run's record, which names only that module.
fn a_single_script_in_a_crowded_folder_reads_only_what_it_requires() {
    let dir = tempfile::Builder::new()
        .prefix("luasnap-module-files-crowded-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let main = MAIN
        .replace("host.before()", "host.record()")
        .replace("host.after()", "");
    std::fs::write(d.join("game.lua"), main).unwrap();
    std::fs::write(d.join("ai.lua"), AI).unwrap();
    std::fs::write(d.join("broken.lua"), "this is not Lua (").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    for i in 0..3000 {
        let at = if i % 2 == 0 {
            d.to_path_buf()
        } else {
            d.join("sub")
        };
        std::fs::write(at.join(format!("a{i:04}.lua")), "return 1").unwrap();
    }
    let out = tool_at(
        &d.join("game.lua"),
        d,
        &["simulate", "--frames", "30", "--mode", "full", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["second_process"]["matches"], true, "{v}");
    let record = std::fs::read(d.join("record.copy")).expect("the second process ran");
    let has = |b: &[u8]| record.windows(b.len()).any(|w| w == b);
    assert!(has(b"ai.lua") && has(AI.as_bytes()), "the module read");
    assert!(
        !has(b"a0000.lua") && !has(b"broken.lua") && !has(b"sub/"),
        "no other file of the folder in the record"
    );
    assert!(record.len() < 1024, "{} bytes", record.len());
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if matches!(args.get(1).map(String::as_str), Some("simulate" | "p2p")) {
        return luasnap_cli::run_with(args, setup());
    }
    let tests: [(&str, fn()); 3] = [
        (
            "a_single_script_in_a_crowded_folder_reads_only_what_it_requires",
            a_single_script_in_a_crowded_folder_reads_only_what_it_requires,
        ),
        (
            "simulate_second_process_runs_the_files_read_at_start",
            simulate_second_process_runs_the_files_read_at_start,
        ),
        (
            "p2p_peers_run_the_files_read_at_start",
            p2p_peers_run_the_files_read_at_start,
        ),
    ];
    // `cargo test -- NAME` runs the tests whose names contain NAME, as libtest does.
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = 0;
    let mut ran = 0;
    for (name, test) in tests {
        if filter.is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        match std::panic::catch_unwind(test) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n",
        ran - failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
