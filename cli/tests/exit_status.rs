//! Exit statuses (docs/cli.md, "Exit status"): a usage error, a flag's value out of range or
//! flags that do not go together, exits 2 whether clap or luasnap finds it (an outside tester
//! found `serve --players 0` exit 2 and `simulate --players 0` exit 1); a run that fails
//! exits 1.

mod support;

use support::{output, stderr, write_game};

/// `luasnap ARGS` fails as a usage error: status 2, clap's form, with the command's usage
/// line, saying `says`.
fn assert_usage_error(args: &[&str], says: &str) {
    let out = output(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: {says:?} not in {err}");
    assert!(err.contains("try '--help'"), "{args:?}: {err}");
}

#[test]
fn flag_values_out_of_range_exit_2_from_every_command() {
    assert_usage_error(
        &["simulate", "--players", "0"],
        "--players must be 1..=16, got 0",
    );
    assert_usage_error(&["serve", "--players", "0"], "0 is not in 1..=16");
    assert_usage_error(
        &["simulate", "--frames", "0"],
        "--frames must be 1..=10000000, got 0",
    );
    assert_usage_error(
        &["bench", "--sizes", "0"],
        "--sizes takes MB values in 1..=4096",
    );
    assert_usage_error(
        &["simulate", "--window", "1"],
        "--window must be at least 2",
    );
    assert_usage_error(
        &["client", "--connect", "127.0.0.1:9", "--loss", "200"],
        "--loss must be a percentage 0..=100, got 200",
    );
    assert_usage_error(
        &["client", "--connect", "nowhere"],
        "--connect nowhere: invalid socket address (give HOST:PORT)",
    );
}

#[test]
fn flags_that_do_not_go_together_exit_2() {
    assert_usage_error(
        &["simulate", "--delay", "20"],
        "--delay 20 needs a window of at least 22 snapshots (window is 10); use --window 22",
    );
    assert_usage_error(
        &["serve", "--players", "2", "--start-with", "3"],
        "--start-with must be 1..=2 (the players), got 3",
    );
    // The hidden side of a mode's process is not one of `--mode all`'s.
    assert_usage_error(
        &["simulate", "--mode", "all", "--mode-process"],
        "--mode-process is the side of one mode's process of `--mode all`",
    );
    assert_usage_error(&["simulate", "--mode-process"], "give it with --mode full");
}

/// `--memory-limit 1K` and `64T` said different things (the second "give bytes or a number
/// with K, M or G"); both say the range and the forms it takes.
#[test]
fn a_memory_limit_out_of_range_says_the_range_and_the_forms() {
    for (limit, side) in [("1K", "below 1M"), ("64T", "above 1T")] {
        assert_usage_error(
            &["simulate", "--memory-limit", limit],
            &format!("\"{limit}\" is {side}; the arena's size goes from 1M to 1T: bytes (1048576 and up), or a number with K, M, G or T"),
        );
    }
    assert_usage_error(
        &["simulate", "--memory-limit", "lots"],
        "'lots' is not a size",
    );
}

/// A failure of the run is status 1, with luasnap's own line.
#[test]
fn a_run_that_fails_exits_1() {
    let game = write_game(
        "fails",
        "local G = {} function G.init() end function G.step() error('boom') end return G",
    );
    let out = output(&[
        "simulate",
        game.to_str().unwrap(),
        "--frames",
        "5",
        "--mode",
        "full",
        "--second-process",
        "off",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("luasnap: "), "{err}");
    assert!(err.contains("boom"), "{err}");
    let missing = output(&["simulate", "/nonexistent/game.lua", "--frames", "5"]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
}
