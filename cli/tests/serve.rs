//! `luasnap serve` and `luasnap client` as separate processes on 127.0.0.1: a client behind an
//! emulated bad network and one joining late end on the server's value digest; a client
//! running another game is refused, saying why; a game that is a folder (a main script and
//! its modules) is served and joined by its folder or its main script.

mod support;

use std::process::Child;
use std::time::Duration;
use support::{json_of as json, spawn as luasnap};

const TINY: &str = include_str!("../../tests/lua/tiny_game.lua");

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `luasnap serve GAME --json` on a free port of 127.0.0.1 with a tick of 20 ms, for
/// `players`, starting with `start_with` clients, for `frames` frames; and its address.
fn serve(
    game: &str,
    players: &str,
    start_with: &str,
    frames: &str,
    extra: &[&str],
) -> (Child, String) {
    let port = free_port().to_string();
    let mut args = vec!["serve", game, "--port", &port, "--bind", "127.0.0.1"];
    args.extend_from_slice(&["--players", players, "--start-with", start_with]);
    args.extend_from_slice(&["--frames", frames, "--tick-ms", "20", "--json"]);
    args.extend_from_slice(extra);
    (luasnap(&args), format!("127.0.0.1:{port}"))
}

/// The error of `luasnap client ARGS`, which must be refused.
fn refused(args: &[&str]) -> String {
    let out = luasnap(&[&["client"], args].concat())
        .wait_with_output()
        .unwrap();
    assert!(!out.status.success());
    support::stderr(&out)
}

#[test]
fn a_served_match_ends_on_one_digest_across_processes() {
    let tmp = support::temp_dir("serve");
    let dir = tmp.path();
    let game = dir.join("tiny_game.lua");
    std::fs::write(&game, TINY).unwrap();
    let other = dir.join("other").join("tiny_game.lua");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::write(&other, format!("{TINY}\n-- another version\n")).unwrap();
    let g = game.to_str().unwrap();
    let (server, addr) = serve(g, "3", "2", "150", &["--check-every", "25"]);
    std::thread::sleep(Duration::from_millis(300));
    let near = luasnap(&["client", g, "--connect", &addr, "--json"]);
    let far = luasnap(&[
        "client",
        g,
        "--connect",
        &addr,
        "--latency",
        "40",
        "--jitter",
        "15",
        "--loss",
        "5",
        "--mode",
        "serialize",
        "--json",
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    let why = refused(&[other.to_str().unwrap(), "--connect", &addr]);
    assert!(
        why.contains("refused this client") && why.contains("run the server's GAME"),
        "{why}"
    );
    let late = luasnap(&["client", g, "--connect", &addr, "--json"]);
    let (near, far, late, server) = (json(near), json(far), json(late), json(server));
    let digest = server["value_digest"].as_str().unwrap();
    for c in [&near, &far, &late] {
        assert_eq!(c["value_digest"].as_str(), Some(digest), "{c}");
        assert_eq!(c["matches_server"], true);
        assert_eq!(c["desyncs"], 0);
    }
    assert!(late["joined_at"].as_u64().unwrap() > 0, "{late}");
    assert!(near["joined_at"].is_null());
    let clients = server["clients"].as_array().unwrap();
    assert!(
        clients
            .iter()
            .filter(|c| c["matches_server"] == true)
            .count()
            >= 3,
        "{server}"
    );
    assert!(clients.iter().any(|c| c["joined_from_save"] == true));
}

/// A two-file game: `main.lua` requires `lib/rules.lua`, whose `bump` moves each player.
fn folder_game(dir: &std::path::Path, rule: &str) {
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(
        dir.join("lib").join("rules.lua"),
        format!("local R = {{}}\nfunction R.bump(x, input) return {rule} end\nreturn R\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("main.lua"),
        "local rules = require 'lib.rules'\n\
         local G = {}\n\
         local world\n\
         function G.init(players, seed) world = { tick = 0, xs = {} } \
           for p = 1, players do world.xs[p] = p end end\n\
         function G.step(inputs) world.tick = world.tick + 1 \
           for p, input in ipairs(inputs) do world.xs[p] = rules.bump(world.xs[p], input) end end\n\
         function G.digest() local h = world.tick \
           for _, x in ipairs(world.xs) do h = (h * 31 + x) % 0x7fffffff end return h end\n\
         return G\n",
    )
    .unwrap();
}

#[test]
fn a_folder_game_is_served_by_its_folder_and_joined_by_its_main_script() {
    let tmp = support::temp_dir("serve-folder");
    let root = tmp.path();
    let game = root.join("game");
    let other = root.join("other");
    folder_game(&game, "(x + input) % 1000");
    folder_game(&other, "(x + input + 1) % 1000");
    let (server, addr) = serve(game.to_str().unwrap(), "2", "1", "120", &[]);
    std::thread::sleep(Duration::from_millis(300));
    let main = game.join("main.lua");
    let client = luasnap(&[
        "client",
        main.to_str().unwrap(),
        "--connect",
        &addr,
        "--json",
    ]);
    std::thread::sleep(Duration::from_millis(700));
    // Same main script, another lib/rules.lua: another game.
    let why = refused(&[other.to_str().unwrap(), "--connect", &addr]);
    assert!(why.contains("another game"), "{why}");
    let (client, server) = (json(client), json(server));
    assert_eq!(client["value_digest"], server["value_digest"], "{client}");
    assert_eq!(client["matches_server"], true, "{client}");
    assert_eq!(client["game_digest"], server["game_digest"], "{client}");
    assert!(server["game_digest"].is_i64(), "{server}");
}

/// A game whose state holds `load` without declaring it in `G.permanents`: a late joiner
/// (which loads the server's save-game as a foreign file) is refused, the message naming
/// client's flag, and joins with `--allow-permanent load`.
#[test]
fn a_late_joiner_accepts_a_held_load_with_allow_permanent() {
    let tmp = support::temp_dir("serve-perm");
    let dir = tmp.path();
    let game = dir.join("holds_load.lua");
    std::fs::write(
        &game,
        "local G = {} local s
         function G.init() s = { n = 0, keep = load } end
         function G.step(i) s.n = s.n + i[1] end
         function G.digest() return s.n end return G",
    )
    .unwrap();
    let g = game.to_str().unwrap();
    let (mut server, addr) = serve(g, "3", "1", "150", &[]);
    std::thread::sleep(Duration::from_millis(300));
    let first = luasnap(&["client", g, "--connect", &addr, "--json"]);
    std::thread::sleep(Duration::from_millis(600));
    let why = refused(&[g, "--connect", &addr]);
    assert!(
        why.contains("--allow-permanent load") && !why.contains("LoadOptions"),
        "{why}"
    );
    let late = luasnap(&[
        "client",
        g,
        "--connect",
        &addr,
        "--allow-permanent",
        "load",
        "--json",
    ]);
    let late = json(late);
    assert!(late["joined_at"].as_u64().unwrap() > 0, "{late}");
    assert_eq!(late["matches_server"], true, "{late}");
    let _ = first.wait_with_output();
    let _ = server.kill();
    let _ = server.wait();
}

/// The game's identity is read once, when the server starts: a game folder changed under a
/// running server (an edit, a checkout) does not change the game its clients must run.
#[test]
fn a_served_game_keeps_the_identity_it_started_with() {
    use std::io::{BufRead, Read};
    let tmp = support::temp_dir("serve-edit");
    let root = tmp.path();
    let (game, copy) = (root.join("game"), root.join("copy"));
    folder_game(&game, "(x + input) % 1000");
    folder_game(&copy, "(x + input) % 1000");
    let (mut server, addr) = serve(game.to_str().unwrap(), "2", "1", "120", &[]);
    let client = luasnap(&[
        "client",
        copy.to_str().unwrap(),
        "--connect",
        &addr,
        "--json",
    ]);
    // Once a client has joined, the server runs the game it read at start.
    let mut events = std::io::BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("joined") {
        line.clear();
        let read = events.read_line(&mut line).unwrap();
        assert!(read > 0, "the server ended before a client joined");
    }
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = events.read_to_string(&mut s);
        s
    });
    folder_game(&game, "(x + input + 1) % 1000");
    let why = refused(&[game.to_str().unwrap(), "--connect", &addr]);
    assert!(why.contains("another game"), "{why}");
    let (client, server) = (json(client), json(server));
    assert_eq!(client["value_digest"], server["value_digest"], "{client}");
    assert_eq!(client["matches_server"], true, "{client}");
    let events = rest.join().unwrap();
    assert!(events.contains("refused"), "{events}");
}

/// The collection points are part of the match's game: a client whose `--collect-every`
/// differs from the server's is refused, saying so; with the server's it plays to the end.
#[test]
fn a_client_with_other_collection_points_is_refused() {
    let tmp = support::temp_dir("serve-collect");
    let game = tmp.path().join("tiny_game.lua");
    std::fs::write(&game, TINY).unwrap();
    let g = game.to_str().unwrap();
    let (server, addr) = serve(g, "1", "1", "60", &["--collect-every", "10"]);
    std::thread::sleep(Duration::from_millis(300));
    for other in [&[][..], &["--collect-every", "20"][..]] {
        let why = refused(&[&[g, "--connect", &addr][..], other].concat());
        assert!(
            why.contains("another game") && why.contains("--collect-every"),
            "{other:?}: {why}"
        );
    }
    let client_ok = json(luasnap(&[
        "client",
        g,
        "--connect",
        &addr,
        "--collect-every",
        "10",
        "--json",
    ]));
    let server = json(server);
    assert_eq!(client_ok["matches_server"], true, "{client_ok}");
    assert_eq!(client_ok["value_digest"], server["value_digest"]);
}

/// An outside tester's finding 10 (`bad/gmatch`): a game whose state holds a `string.gmatch`
/// iterator, which cannot be saved, ended the match for everyone when a late joiner needed a
/// save-game (the server exited with status 1). The joiner is turned away with the save's
/// error, the first client plays on to the end, and a later join, once the game let go of
/// the iterator (frame 100 here, unlike the tester's game, so that it can be saved again and
/// the final digests compare no iterator), is sent a save-game and joins.
#[test]
fn a_join_the_server_cannot_save_for_is_refused_and_the_match_goes_on() {
    let tmp = support::temp_dir("serve-gmatch");
    let game = tmp.path().join("main.lua");
    std::fs::write(
        &game,
        "local G = {} local state
         function G.init(p, s) state = { t = 0, words = string.gmatch(string.rep('w ', 100000), '%a') } end
         function G.step(inputs) state.t = state.t + 1
           if state.words then state.last = state.words() end
           if state.t == 100 then state.words = nil end end
         function G.digest() return state.t end
         return G",
    )
    .unwrap();
    let g = game.to_str().unwrap();
    // Digests only at the end (300 frames of 20 ms), when no iterator is held: the value
    // digest hashes a gmatch iterator's match state, which holds addresses (docs/determinism.md).
    let (server, addr) = serve(g, "3", "1", "300", &["--check-every", "300"]);
    std::thread::sleep(Duration::from_millis(300));
    let first = luasnap(&["client", g, "--connect", &addr, "--json"]);
    std::thread::sleep(Duration::from_millis(600));
    let why = refused(&[g, "--connect", &addr]);
    assert!(
        why.contains("refused this client")
            && why.contains("cannot save the match's state")
            && why.contains("string.gmatch iterator cannot be saved"),
        "{why}"
    );
    // Frame 100 is 2 s after the clock started; the match ends at 6 s.
    std::thread::sleep(Duration::from_millis(2500));
    let later = luasnap(&["client", g, "--connect", &addr, "--json"]);
    let (first, later, server) = (json(first), json(later), json(server));
    let digest = server["value_digest"].as_str().unwrap();
    for c in [&first, &later] {
        assert_eq!(c["value_digest"].as_str(), Some(digest), "{c}");
        assert_eq!(c["matches_server"], true, "{c}");
    }
    assert!(later["joined_at"].as_u64().unwrap() > 100, "{later}");
    let clients = server["clients"].as_array().unwrap();
    assert!(
        clients.iter().any(|c| c["left"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("string.gmatch iterator cannot be saved"))),
        "{server}"
    );
}
