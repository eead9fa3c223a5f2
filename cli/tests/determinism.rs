//! The deterministic profile across processes: `luasnap run --deterministic` twice.

use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lua/determinism.lua");

fn run_cli(seed: &str, base: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_luasnap"));
    cmd.args(["run", "--deterministic", seed, "--digest"]);
    if let Some(b) = base {
        cmd.args(["--base-address", b]);
    }
    let out = cmd.arg(SCRIPT).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    let value_digest = stderr
        .lines()
        .find(|l| l.starts_with("value digest:"))
        .unwrap()
        .to_string();
    (String::from_utf8(out.stdout).unwrap(), value_digest)
}

#[test]
fn two_processes_agree_on_results_and_value_digest() {
    // With a fixed base address even pointer-keyed iteration and tostring() agree.
    let a = run_cli("42", Some("0x3d0000000000"));
    let b = run_cli("42", Some("0x3d0000000000"));
    assert_eq!(a, b);
    assert!(a.0.contains("address\ttable: 0x3d00"), "{}", a.0);
    // A different seed changes string-key order and the random stream.
    let c = run_cli("43", Some("0x3d0000000000"));
    assert_ne!(a.0, c.0);
    assert_ne!(a.1, c.1);
    // Without a fixed base, everything but tostring() still agrees: the order of table keys
    // comes from their identities, not their addresses, and so do the memory counts (a
    // table rehashes when the same keys collide).
    let d = run_cli("42", None);
    let e = run_cli("42", None);
    let keep = |s: &str, memory: bool| -> String {
        s.lines()
            .filter(|l| !l.starts_with("address") && (memory || !l.starts_with("memory")))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(keep(&d.0, true), keep(&e.0, true));
    // (`arg` holds the command line, longer with --base-address: other memory counts.)
    assert_eq!(
        keep(&d.0, false),
        keep(&a.0, false),
        "string and object key order, random stream and sort do not depend on addresses"
    );
    assert_eq!(d.1, e.1);
}

/// `luasnap run --deterministic 5 --digest` of a script in tests/lua, without a fixed base
/// address: what it printed and its value digest.
fn run_script(name: &str) -> (String, String) {
    let script = format!("{}/tests/lua/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["run", "--deterministic", "5", "--digest", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let digest = stderr
        .lines()
        .find(|l| l.starts_with("value digest:"))
        .unwrap_or_else(|| panic!("{stderr}"))
        .to_string();
    (String::from_utf8(out.stdout).unwrap(), digest)
}

#[test]
fn keys_that_are_c_functions_or_objects_iterate_alike_in_three_processes() {
    // C functions are pointers into the executable (ASLR moves them in each process), tables,
    // closures and coroutines live at addresses that differ without a fixed base: the order
    // comes from their names and identities instead.
    let a = run_script("key_order.lua");
    assert!(a.0.starts_with("c functions\t"), "{}", a.0);
    for _ in 0..2 {
        assert_eq!(
            run_script("key_order.lua"),
            a,
            "another process, another state"
        );
    }
}

/// Runs a corpus game for 60 frames under `luasnap run --deterministic` (the script on
/// standard input: the game, then a driver) and returns what it printed and its value digest.
fn run_game_cli(game: &str) -> (String, String) {
    use std::io::Write;
    let source = std::fs::read_to_string(format!(
        "{}/../lua-bridge/games/{game}.lua",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let script = format!(
        "local G = (function(...) {source}\nend)()
         G.init(2, 7)
         local s = 12345
         for f = 1, 60 do
           local inp = {{}}
           for p = 1, 2 do s = (s * 1103515245 + 12345) % 2147483648; inp[p] = (s >> 8) & 63 end
           G.step(inp)
         end
         print(G.digest and G.digest() or 'no digest', collectgarbage('count') > 0)"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(["run", "--deterministic", "3", "--digest", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{game}: {stderr}");
    let digest = stderr
        .lines()
        .find(|l| l.starts_with("value digest:"))
        .unwrap_or_else(|| panic!("{game}: {stderr}"))
        .to_string();
    (String::from_utf8_lossy(&out.stdout).into_owned(), digest)
}

#[test]
fn every_corpus_game_is_deterministic_under_plain_run() {
    for game in [
        "arena_shooter",
        "ai_village",
        "bulk_market",
        "dungeon_crawl",
        "arena_brawl",
    ] {
        let (a, b) = (run_game_cli(game), run_game_cli(game));
        assert_eq!(a, b, "{game}: two processes disagree");
    }
}
