//! `simulate`'s stall warning says where the time goes, and watches from before the first
//! frame: an endless `G.init` or top level with `--step-budget off` was silent, and a 1 GB
//! heap's seconds-long saves were told "is G.step in an endless loop?" (an outside tester's
//! finding 12). Each test's game never ends by itself: the test reads until the warning,
//! then stops it.

mod support;

use std::io::{BufRead, BufReader};

/// The first stall warning of `simulate GAME --step-budget off`, warning after 1 s.
fn stall_warning(game: &str, extra: &[&str]) -> String {
    let mut child = support::luasnap()
        .args(["simulate", game, "--frames", "10", "--step-budget", "off"])
        .args(extra)
        .env("LUASNAP_STALL_WARNING_SECS", "1")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let line = stderr
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("no frame has finished"));
    child.kill().ok();
    child.wait().ok();
    line.expect("a stall warning before stderr closed")
}

#[test]
fn an_endless_g_init_without_a_budget_is_named_before_the_first_frame() {
    let game = support::write_game(
        "initloop",
        "local G = {} function G.init() while true do end end function G.step() end return G",
    );
    let line = stall_warning(game.to_str().unwrap(), &[]);
    for part in [
        "luasnap: no frame has finished for 1 s since the run began (no frame yet: the game is being built)",
        "in G.init",
        "running now: G.init(players, seed)",
        "Is G.init in an endless loop? Ctrl-C stops the run (--step-budget is off; with a budget",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(!line.contains("G.step"), "{line}");
}

#[test]
fn an_endless_top_level_without_a_budget_is_named() {
    let game = support::write_game("toploop", "while true do end return {}");
    let line = stall_warning(game.to_str().unwrap(), &["--mode", "full"]);
    assert!(
        line.contains("running now: the script's top level (with the modules it requires there)"),
        "{line}"
    );
    assert!(
        line.contains("Is the script's top level in an endless loop?"),
        "{line}"
    );
}
