//! `luasnap serve` and `luasnap client` as separate processes on 127.0.0.1: a client behind an
//! emulated bad network and one joining late end on the server's value digest; a client
//! running another game is refused, saying why.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TINY: &str = include_str!("../../tests/lua/tiny_game.lua");

fn luasnap(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn json(child: Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_served_match_ends_on_one_digest_across_processes() {
    let dir = std::env::temp_dir().join(format!("luasnap-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let game = dir.join("tiny_game.lua");
    std::fs::write(&game, TINY).unwrap();
    let other = dir.join("other").join("tiny_game.lua");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::write(&other, format!("{TINY}\n-- another version\n")).unwrap();
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let g = game.to_str().unwrap();
    let server = luasnap(&[
        "serve",
        g,
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--players",
        "3",
        "--frames",
        "150",
        "--tick-ms",
        "20",
        "--check-every",
        "25",
        "--start-with",
        "2",
        "--json",
    ]);
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
    let refused = luasnap(&["client", other.to_str().unwrap(), "--connect", &addr]);
    let refused = refused.wait_with_output().unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("refused this client") && why.contains("run the same GAME file"),
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
    let _ = std::fs::remove_dir_all(&dir);
}
