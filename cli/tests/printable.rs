//! Text from the game reaches the terminal with its control characters escaped: a game's error
//! (which can quote strings of a foreign save) cannot clear the screen, retitle the terminal
//! or hide what follows it; newlines and tabs stay, so tracebacks read as before.

mod support;

use support::{output, stderr, write_game};

/// A game whose `G.step` raises, at frame 4, an error holding a screen clear, a title change
/// and a bell, then a line made to look like luasnap's own.
const ANSI: &str = "local G = {} local t = 0
function G.init(p, s) t = 0 end
function G.digest() return t end
function G.step(i) t = t + 1 if t == 5 then error('\\27[2J\\27]0;pwned\\7owned\\nluasnap: all modes match') end end
return G";

fn assert_escaped(err: &str) {
    assert!(!err.contains('\u{1b}'), "{err:?}");
    assert!(!err.contains('\u{7}'), "{err:?}");
    assert!(err.contains(r"\u{1b}[2J\u{1b}]0;pwned\u{7}owned"), "{err}");
    // The game's second line is indented: no line but the tool's own starts with `luasnap:`.
    assert!(err.contains("owned\n  luasnap: all modes match"), "{err}");
    for line in err.lines().filter(|l| l.starts_with("luasnap")) {
        assert!(
            !line.contains("all modes match"),
            "a fake status line: {err}"
        );
    }
    // The traceback keeps its lines, nested under the error, indented once.
    assert!(err.contains("\n  stack traceback:\n  \t"), "{err}");
    assert!(!err.contains("\n    "), "indented twice: {err}");
}

#[test]
fn simulate_escapes_the_control_characters_of_a_game_error() {
    let game = write_game("ansi", ANSI);
    for mode in ["full", "all"] {
        let out = output(&[
            "simulate",
            game.to_str().unwrap(),
            "--frames",
            "10",
            "--mode",
            mode,
            "--second-process",
            "off",
        ]);
        assert!(!out.status.success());
        assert_escaped(&stderr(&out));
    }
}

#[test]
fn p2p_escapes_the_control_characters_of_a_game_error() {
    let game = write_game("ansi", ANSI);
    let out = output(&["p2p", game.to_str().unwrap(), "--frames", "10"]);
    assert!(!out.status.success());
    assert_escaped(&stderr(&out));
}
