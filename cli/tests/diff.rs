//! `luasnap diff` and the checks `luasnap simulate` makes before a long run.

mod support;

use std::path::Path;
use support::output as luasnap;

/// A save-game of `game` after `frames` frames, written to `path` by `luasnap simulate`.
fn simulate_save(game: &str, frames: u64, path: &Path, extra: &[&str]) {
    support::simulate_and_save(
        Path::new(game),
        frames,
        path,
        &[&["--mode", "full"], extra].concat(),
    );
}

#[test]
fn diff_of_two_saves_lists_paths_bounded_with_exit_status_1() {
    let tmp = support::temp_dir("diff");
    let dir = tmp.path();
    let game = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../lua-bridge/games/dungeon_crawl.lua"
    );
    let save = |frames: u64, name: &str| {
        let path = dir.join(name);
        simulate_save(game, frames, &path, &[]);
        path
    };
    let (a, b, c) = (save(20, "a.sav"), save(23, "b.sav"), save(20, "c.sav"));
    let (a, b, c) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
    );
    let same = luasnap(&["diff", a, c, "--game", game]);
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    let differ = luasnap(&["diff", a, b, "--game", game, "--limit", "3"]);
    assert_eq!(
        differ.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&differ.stderr)
    );
    let text = String::from_utf8_lossy(&differ.stdout);
    assert!(text.contains("luasnap_frame: 20 vs 23"), "{text}");
    let (listed, _) = text
        .split_once("keys on one side only")
        .unwrap_or((&text, ""));
    assert_eq!(
        listed.lines().filter(|l| l.starts_with("  ")).count(),
        4,
        "3 paths and a '...' line: {text}"
    );
    let json = luasnap(&["diff", a, b, "--game", game, "--json"]);
    assert_eq!(json.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["equal"], false);
    assert!(v["differences"].as_array().unwrap().len() <= 20);
    assert!(v["differences"][0]["path"].is_string());
    // Not a save: said so, exit status 2.
    let text_file = dir.join("six.txt");
    std::fs::write(&text_file, "hello\n").unwrap();
    let bad = luasnap(&["diff", text_file.to_str().unwrap(), a]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a luasnap save-game"));
    // Without --game: the error names the game's own function (not the runtime's glue) and
    // says what to pass; with --trust own the code comes from the saves.
    let blind = luasnap(&["diff", a, b]);
    assert_eq!(blind.status.code(), Some(2));
    let e = String::from_utf8_lossy(&blind.stderr);
    assert!(
        e.contains("dungeon_crawl.lua") && e.contains("--game"),
        "{e}"
    );
    assert!(!e.contains("luasnap runtime"), "{e}");
    // A --game that is not there is named as the flag's file, not taken for a save.
    let missing = dir.join("no_such_game.lua");
    let lost = luasnap(&["diff", a, b, "--game", missing.to_str().unwrap()]);
    assert_eq!(lost.status.code(), Some(2));
    let e = String::from_utf8_lossy(&lost.stderr);
    assert!(
        e.contains("the game given by --game: cannot read") && e.contains("no_such_game.lua"),
        "{e}"
    );
    let own = luasnap(&["diff", a, b, "--trust", "own"]);
    assert_eq!(
        own.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&own.stderr)
    );
}

#[test]
fn simulate_checks_before_running() {
    let out = luasnap(&[
        "simulate",
        "--save",
        "/nonexistent/dir/x.sav",
        "--frames",
        "5",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write the save-game"));
    let out = luasnap(&["simulate", "--window", "0", "--delay", "0"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--window must be at least 2"), "{e}");
    let out = luasnap(&["simulate", "--window", "4", "--delay", "5"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("use --window 7 or a delay of at most 2"), "{e}");
}

/// A save-game of the globals `code` sets in a plain deterministic VM (no game, no code in
/// the state).
fn plain_save(code: &str) -> Vec<u8> {
    let vm = luasnap::bridge::Vm::builder()
        .capacity(64 << 20)
        .deterministic(0)
        .build()
        .unwrap();
    vm.exec(code, "state").unwrap();
    vm.save_game().unwrap()
}

#[test]
fn diff_of_plain_saves_respects_limit_0_and_identical_files_are_equal() {
    let tmp = support::temp_dir("diff0");
    let dir = tmp.path();
    let save = |code: &str, name: &str| {
        let path = dir.join(name);
        std::fs::write(&path, plain_save(code)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let a = save("x = 1 y = 'a'", "a.sav");
    let b = save("x = 2 y = 'b'", "b.sav");
    let differ = luasnap(&["diff", &a, &b, "--limit", "0", "--trust", "own"]);
    assert_eq!(
        differ.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&differ.stderr)
    );
    let text = String::from_utf8_lossy(&differ.stdout);
    assert!(!text.contains("x:") && !text.contains("y:"), "{text}");
    assert!(text.contains("not listed: --limit 0"), "{text}");
    // Identical files are equal without loading anything (a game save needs no --game).
    let game_save = dir.join("game.sav");
    let out = luasnap(&[
        "simulate",
        "--frames",
        "5",
        "--mode",
        "full",
        "--save",
        game_save.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let g = game_save.to_str().unwrap();
    let same = luasnap(&["diff", g, g]);
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(String::from_utf8_lossy(&same.stdout).contains("byte-identical"));
}

#[test]
fn simulate_reports_a_failing_mode_beside_the_others() {
    // A gmatch iterator in the state: the serializer refuses it, the arena modes do not care.
    let tmp = support::temp_dir("failmode");
    let dir = tmp.path();
    let game = dir.join("words.lua");
    std::fs::write(
        &game,
        "local G = {} local it
         function G.init() it = ('a b c d e f g h'):gmatch('%a') end
         function G.step(i) G.last = it() or G.last end
         return G",
    )
    .unwrap();
    let out = luasnap(&[
        "simulate",
        game.to_str().unwrap(),
        "--frames",
        "30",
        "--mode",
        "all",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let modes: Vec<&str> = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["full", "incremental", "auto"], "{v}");
    assert_eq!(v["failed_modes"][0]["mode"], "serialize", "{v}");
    assert!(
        v["failed_modes"][0]["error"]
            .as_str()
            .unwrap()
            .contains("gmatch"),
        "{v}"
    );
}

#[test]
fn simulate_says_when_g_step_seems_to_loop_forever() {
    use std::io::{BufRead, BufReader};
    let tmp = support::temp_dir("stall");
    let dir = tmp.path();
    let game = dir.join("loop.lua");
    std::fs::write(
        &game,
        "local G = {} local n = 0
         function G.init() end
         function G.step(i) n = n + 1 if n == 5 then while true do end end end
         return G",
    )
    .unwrap();
    let mut child = support::luasnap()
        .args(["simulate", game.to_str().unwrap(), "--frames", "10"])
        // The step budget would stop this loop first (tests/step_budget.rs); the warning
        // is for runs without one, and for loops inside C functions, which it does not count.
        .args(["--step-budget", "off"])
        .env("LUASNAP_STALL_WARNING_SECS", "1")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Read until the warning (the game never ends by itself), then stop it.
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let line = stderr
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("no frame has finished"));
    child.kill().ok();
    child.wait().ok();
    let line = line.expect("a stall warning before stderr closed");
    assert!(
        line.contains("reference run (at frame 4)") && line.contains("endless loop"),
        "{line}"
    );
}

/// `luasnap diff` reads files from anyone: it never runs a function the file names, neither a
/// finalizer (`__gc`, which ran when the diff's VM closed, outside the load's budget: an
/// attacker's `__gc = table.concat` took 2.9 GB) nor the root's `__index` (looked up after
/// the load's checks ended).
#[test]
fn diff_runs_no_function_the_files_name() {
    let tmp = support::temp_dir("diff-code");
    let dir = tmp.path();
    let script = dir.join("mk.lua");
    std::fs::write(
        &script,
        r#"
        local function write(name, v)
          local f = assert(io.open(name, "wb")) f:write(eris.persist(v)) f:close()
        end
        write("gc.sav", { globals = { x = setmetatable({}, { __gc = print }) } })
        write("root.sav", setmetatable({}, { __index = print }))
        write("plain.sav", { globals = { x = 1 } })
        "#,
    )
    .unwrap();
    let made = support::luasnap()
        .current_dir(dir)
        .args(["run", "mk.lua"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let at = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let gc = luasnap(&["diff", &at("gc.sav"), &at("plain.sav")]);
    assert_eq!(gc.status.code(), Some(1), "{gc:?}");
    let out = String::from_utf8_lossy(&gc.stdout);
    assert!(
        out.contains("x: table vs 1") && !out.contains("table: 0x"),
        "{out}"
    );
    let root = luasnap(&["diff", &at("root.sav"), &at("plain.sav")]);
    assert_eq!(root.status.code(), Some(2), "{root:?}");
    assert!(
        !String::from_utf8_lossy(&root.stdout).contains("table: 0x"),
        "{root:?}"
    );
    assert!(
        String::from_utf8_lossy(&root.stderr).contains("not a whole-game save"),
        "{root:?}"
    );
}

/// `simulate --load` takes no code from the file unless told to trust it: a save of an older
/// script version runs this version's code (its functions rebound by place, which the load's
/// line says); one holding a function this version lacks is refused with the flag that
/// accepts it, and `--trust own` keeps that function's saved code.
#[test]
fn simulate_load_trusts_the_file_only_when_told() {
    let v1 = "local G = {}
W = {}
function G.init() W.x = 0 W.f = function(x) return x + 1 end end
function G.step(i) W.x = W.f(W.x) end
return G
";
    let versions = support::GameVersions::new("sim-trust");
    let version = |name: &str, script: &str| {
        versions
            .write(name, &[("game.lua", script)])
            .join("game.lua")
    };
    let game = version("v1", v1);
    let save = versions.path("v1.sav");
    let full = ["--frames", "5", "--mode", "full"];
    support::simulate_and_save(&game, 10, &save, &["--mode", "full"]);
    // The same script: loads as a foreign file.
    let same = support::simulate_loading(&game, &save, &full);
    assert!(same.status.success(), "{same:?}");
    // Version 2 of the script: the saved closure is bound to version 2's W.f.
    let v2 = version("v2", &v1.replace("x + 1", "x + 50"));
    let updated = support::simulate_loading(&v2, &save, &full);
    assert!(updated.status.success(), "{updated:?}");
    let e = String::from_utf8_lossy(&updated.stderr);
    assert!(e.contains("rebound") && e.contains("W.f"), "{e}");
    // Version 3 makes W.f elsewhere (inside a new function): the saved closure's function is
    // not in it.
    let v3 = version(
        "v3",
        &v1.replace(
            "W.f = function(x) return x + 1 end",
            "W.f = (function() return function(x) return x + 7 end end)()",
        ),
    );
    let refused = support::simulate_loading(&v3, &save, &full);
    assert!(!refused.status.success(), "{refused:?}");
    let e = String::from_utf8_lossy(&refused.stderr);
    assert!(e.contains("pass --trust own") && e.contains("W.f"), "{e}");
    let own = support::simulate_loading(&v3, &save, &[&full[..], &["--trust", "own"]].concat());
    assert!(own.status.success(), "{own:?}");
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("missing from this version"),
        "{own:?}"
    );
}

#[test]
fn diff_of_deep_saves_stays_within_its_memory_or_says_so() {
    // Two saves of tables nested 300,000 deep (2.1 MB each): diff loads each under half of
    // --max-memory and builds each graph under a quarter; past that it stops with an error
    // that names the flag (it used to build an uncapped graph: 1.2 GB for two 7 MB files).
    use luasnap_bridge::persist::forge::{self, Node};
    let tmp = support::temp_dir("diff-deep");
    let dir = tmp.path();
    let write = |name: &str, leaf: i64| {
        let path = dir.join(name);
        let table = |entries| Node::Table {
            narr: 0,
            nhash: 1,
            meta: Box::new(Node::Nil),
            entries,
        };
        let deep = Node::Raw(forge::nested_tables(300_000, leaf));
        let globals = table(vec![(Node::Str(b"deep".to_vec()), deep)]);
        let file = forge::file(&table(vec![(Node::Str(b"globals".to_vec()), globals)]));
        std::fs::write(&path, file).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (a, b) = (write("deep-a.sav", 1), write("deep-b.sav", 2));
    let small = luasnap(&["diff", &a, &b, "--max-memory", "24"]);
    let stderr = String::from_utf8_lossy(&small.stderr);
    assert_eq!(small.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--max-memory"), "{stderr}");
    // In the command line's words only.
    assert!(
        !stderr.contains("LoadOptions") && !stderr.contains("Vm::"),
        "{stderr}"
    );
    let enough = luasnap(&["diff", &a, &b, "--limit", "3"]);
    assert_eq!(
        enough.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&enough.stderr)
    );
}

/// A save whose state holds `load` (a game that compiles code keeps it on purpose): a
/// foreign diff refuses it, naming diff's own flag, whether or not the game declares it in
/// `G.permanents` (diff compiles the game, it does not run it); `--allow-permanent load`
/// accepts it.
#[test]
fn diff_refuses_a_held_load_naming_allow_permanent_and_accepts_it_with_the_flag() {
    let tmp = support::temp_dir("diff-perm");
    let dir = tmp.path();
    let game = dir.join("game.lua");
    std::fs::write(
        &game,
        "local G = { permanents = { 'load' } } local s
         function G.init() s = { n = 0, keep = load } end
         function G.step(i) s.n = s.n + i[1] end
         function G.digest() return s.n end return G",
    )
    .unwrap();
    let game = game.to_str().unwrap();
    let save = |frames: u64, name: &str| {
        let path = dir.join(name);
        simulate_save(game, frames, &path, &["--second-process", "off"]);
        path.to_str().unwrap().to_string()
    };
    let (a, b) = (save(5, "a.sav"), save(8, "b.sav"));
    let refused = luasnap(&["diff", &a, &b, "--game", game]);
    let e = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{e}");
    assert!(
        e.contains("--allow-permanent load") && !e.contains("LoadOptions"),
        "{e}"
    );
    let accepted = luasnap(&["diff", &a, &b, "--game", game, "--allow-permanent", "load"]);
    let e = String::from_utf8_lossy(&accepted.stderr);
    assert_eq!(accepted.status.code(), Some(1), "{e}");
    let out = String::from_utf8_lossy(&accepted.stdout);
    assert!(out.contains("s.n") || out.contains(".n:"), "{out}");
    // A host binary that declares `load` for its games (luasnap_cli::Host::permanents):
    // its diff accepts it without the flag.
    let host = luasnap_cli::Host {
        permanents: vec!["load".into()],
        ..Default::default()
    };
    let code = luasnap_cli::run_for(["host", "diff", &a, &b, "--game", game], host);
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::from(1))
    );
}

/// A game whose entities key a set (`world.all[e] = true`, found by an outside tester): the
/// diff pairs each entity by its key identity and lists its fields under `@key` with its `id`,
/// before the entities on one side only.
#[test]
fn diff_of_a_set_keyed_game_compares_entities_field_by_field() {
    let tmp = support::temp_dir("diff-keys");
    let dir = tmp.path();
    let game = dir.join("set_keyed.lua");
    std::fs::write(
        &game,
        "local G = {}
         local world
         function G.init(players, seed)
           world = { all = {}, next_id = 1 }
         end
         function G.step(inputs)
           if world.next_id <= 12 then
             local e = { id = world.next_id, hp = 10, pos = { x = 0, y = 0 } }
             world.next_id = world.next_id + 1
             world.all[e] = true
           end
           for e in pairs(world.all) do
             e.pos.x = e.pos.x + e.id
             e.hp = e.hp - 1
             if e.hp <= 0 then world.all[e] = nil end
           end
         end
         function G.digest() return tostring(world.next_id) end
         return G",
    )
    .unwrap();
    let game = game.to_str().unwrap();
    let (a, b) = (dir.join("a.sav"), dir.join("b.sav"));
    simulate_save(game, 9, &a, &[]);
    simulate_save(game, 11, &b, &[]);
    let out = luasnap(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--game",
        game,
        "--limit",
        "30",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", support::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let (listed, counted) = text
        .split_once("keys on one side only")
        .unwrap_or((&text, ""));
    // Two entities died in frames 10 and 11, two were born.
    assert!(
        counted.contains("world.all: 2 keys only on the left, 2 only on the right"),
        "{text}"
    );
    let lines: Vec<&str> = listed.lines().filter(|l| l.starts_with("  ")).collect();
    // Entity 3 is on both sides: its fields, named by its identity and id.
    let hp = lines
        .iter()
        .position(|l| l.contains("{id=3}]@key.hp"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(lines[hp].contains("world.all[table #"), "{text}");
    assert!(
        lines.iter().any(|l| l.contains("{id=3}]@key.pos.x")),
        "{text}"
    );
    // Entities born in frames 10 and 11: membership lines, after every field difference.
    let first_member = lines
        .iter()
        .position(|l| l.contains("(absent) vs true"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(first_member > hp, "{text}");
    assert!(
        lines[first_member..].iter().all(|l| l.contains("(absent)")),
        "{text}"
    );
    assert!(lines[first_member].contains("{id=10}"), "{text}");
}

/// Keys on one side only are counted per table, every one, in a line per table after the
/// differences, while the `(absent)` lines stay bounded by `--limit`.
#[test]
fn diff_counts_the_keys_on_one_side_per_table() {
    let tmp = support::temp_dir("diff-keys-one-side");
    let save = |code: &str, name: &str| {
        let path = tmp.path().join(name);
        std::fs::write(&path, plain_save(code)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let a = save("t = { a = 1, b = 2, c = 3, d = 4 } u = { x = 1 }", "a.sav");
    let b = save("t = { d = 4, e = 5 } u = { x = 1, y = 2, z = 3 }", "b.sav");
    let diff = |extra: &[&str]| {
        let out = luasnap(&[&["diff", &a, &b, "--trust", "own"][..], extra].concat());
        assert_eq!(out.status.code(), Some(1), "{}", support::stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = diff(&[]);
    assert!(text.contains("t.a: 1 vs (absent)"), "{text}");
    assert!(text.contains("keys on one side only, by table"), "{text}");
    assert!(
        text.contains("  t: 3 keys only on the left, 1 only on the right\n"),
        "{text}"
    );
    assert!(text.contains("  u: 2 keys only on the right\n"), "{text}");
    // Two lines listed; the counts are still of every key.
    let text = diff(&["--limit", "2"]);
    assert!(text.contains("raise --limit"), "{text}");
    assert!(
        text.contains("t: 3 keys only on the left, 1 only on the right")
            && text.contains("u: 2 keys only on the right"),
        "{text}"
    );
    let text = diff(&["--limit", "1"]);
    assert!(text.contains("(1 more tables; raise --limit)"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&diff(&["--json", "--limit", "1"])).unwrap();
    let keys = v["keys_on_one_side"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{v}");
    let t = keys.iter().find(|k| k["table"] == "t").unwrap();
    assert_eq!(
        (t["only_left"].as_u64(), t["only_right"].as_u64()),
        (Some(3), Some(1))
    );
}

/// A save edited by hand is refused by its checksum, with the command that seals it again;
/// resealed, it loads and diff shows the edit. The seal is no pass: a body broken by the
/// edit is resealed, and its load still refuses it. What is not a save-game of this format
/// is refused.
#[test]
fn reseal_seals_an_edited_save_again_and_loads_still_check_it() {
    let tmp = support::temp_dir("reseal");
    let saved = plain_save("hero = { name = 'knight', gold = 10 }");
    let file = |name: &str, bytes: &[u8]| {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_string()
    };
    let a = file("a.sav", &saved);
    let at = saved.windows(6).position(|w| w == b"knight").unwrap();
    let mut edited = saved.clone();
    edited[at..at + 6].copy_from_slice(b"wizard");
    let b = file("b.sav", &edited);
    let diff = |x: &str| luasnap(&["diff", &a, x, "--trust", "own"]);
    let out = diff(&b);
    assert_eq!(out.status.code(), Some(2));
    let e = support::stderr(&out);
    assert!(
        e.contains("checksum mismatch") && e.contains("luasnap reseal"),
        "{e}"
    );
    let out = luasnap(&["reseal", &b]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    assert!(support::stderr(&out).contains("sealed again"));
    let out = diff(&b);
    assert_eq!(out.status.code(), Some(1), "{}", support::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hero.name: \"knight\" vs \"wizard\""),
        "{text}"
    );
    let out = luasnap(&["reseal", &b]);
    assert!(out.status.success());
    assert!(support::stderr(&out).contains("matches its body already"));
    // Bytes added to the body: the length and checksum are written again, the load refuses
    // the body.
    let broken = file("c.sav", &[&saved[..], &[0xff, 0xff, 0xff]].concat());
    let d = tmp.path().join("d.sav");
    let out = luasnap(&["reseal", &broken, "--output", d.to_str().unwrap()]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    assert_eq!(std::fs::read(&broken).unwrap().len(), saved.len() + 3);
    let out = diff(d.to_str().unwrap());
    assert_eq!(out.status.code(), Some(2));
    let e = support::stderr(&out);
    assert!(!e.contains("checksum") && !e.contains("body bytes"), "{e}");
    // Not a save-game of this build's formats: refused, not sealed.
    let mut future = saved.clone();
    future[8..10].copy_from_slice(&999u16.to_le_bytes());
    let future = file("future.sav", &future);
    for (path, says) in [
        (future.as_str(), "format"),
        (&a[..a.len() - 5], "cannot read"),
    ] {
        let out = luasnap(&["reseal", path]);
        assert!(!out.status.success());
        assert!(
            support::stderr(&out).contains(says),
            "{}",
            support::stderr(&out)
        );
    }
    let text = file("notes.txt", b"not a save");
    let out = luasnap(&["reseal", &text]);
    assert!(support::stderr(&out).contains("not a luasnap save-game"));
}

#[test]
fn diff_pairs_c_function_keys_by_name() {
    // An outside tester's diffcf2: one side lacks `set[assert]`; every C-function key used to
    // pair with whichever came first on the other side (`set[error]: 2 vs 8`).
    let tmp = support::temp_dir("diffcf");
    let game = tmp.path().join("cfkeys.lua");
    std::fs::write(
        &game,
        r#"local G = {}
local world
local FNS = { assert, error, ipairs, pairs, print, rawget, rawset, select, tonumber, tostring, type, next, math.floor, math.abs, string.format }
function G.init(players, seed)
  world = { tick = 0, names = {}, set = {} }
  for i, f in ipairs(FNS) do world.names[f] = tostring(i); world.set[f] = i end
end
function G.step(inputs)
  world.tick = world.tick + 1
  if world.tick == 2 then world.set[assert] = nil end
end
function G.digest() return world.tick end
return G
"#,
    )
    .unwrap();
    let game = game.to_str().unwrap();
    let (a, b) = (tmp.path().join("a.sav"), tmp.path().join("b.sav"));
    simulate_save(game, 1, &a, &[]);
    simulate_save(game, 2, &b, &[]);
    let out = luasnap(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--game",
        game,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(
        listed,
        [
            "luasnap_frame: 1 vs 2",
            "luasnap_game.digest@world.tick: 1 vs 2",
            "luasnap_game.digest@world.set[assert]: 1 vs (absent)",
            "luasnap_game.digest@world.set: 1 key only on the left",
        ],
        "{text}"
    );
}

/// An outside tester's "what did the update change in this save": a save of version 1 and one
/// of version 2 (a module's function changed, lines moved) compared with `--game` naming
/// version 2. diff refused the older save, saying the module's file was not found; it binds
/// functions to the given version by place, as the game's own loads do.
#[test]
fn diff_compares_saves_of_two_versions_with_the_newer_game() {
    let main = "local M = require 'mod'
local G = {}
function G.init() W = { x = 0, f = M.bump } end
function G.step(i) W.x = W.f(W.x) end
return G
";
    let module = "local M = {}\nfunction M.bump(x) return x + 1 end\nreturn M\n";
    let versions = support::GameVersions::new("diff-versions");
    let v1 = versions.write("v1", &[("main.lua", main), ("mod.lua", module)]);
    let v2_module = format!("-- version 2\n\n{}", module.replace("x + 1", "x + 2"));
    let v2 = versions.write("v2", &[("main.lua", main), ("mod.lua", &v2_module)]);
    let (s1, s2) = (versions.path("v1.sav"), versions.path("v2.sav"));
    support::simulate_and_save(&v1, 10, &s1, &["--mode", "full"]);
    support::simulate_and_save(&v2, 10, &s2, &["--mode", "full"]);
    let out = luasnap(&[
        "diff",
        s1.to_str().unwrap(),
        s2.to_str().unwrap(),
        "--game",
        v2.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", support::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("W.x: 10 vs 20"), "{text}");
}
