//! `luasnap run` takes stock `lua`'s command line; a save-game one run writes, another reads.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use support::temp_dir;

/// `luasnap run ARGS` with `stdin`, its cache in a folder of its own (so that `run`'s `lua`
/// entry point is made there, not in the user's cache), gone when it ends.
fn run(args: &[&str], stdin: &str) -> Output {
    run_cached(temp_dir("run-cache").path(), args, stdin)
}

/// [`run`] with `cache` as its cache folder (`XDG_CACHE_HOME`), where the `lua` entry point of
/// `arg_names_a_lua_that_runs_luasnap_again` is made and looked at.
fn run_cached(cache: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_luasnap"))
        .arg("run")
        .args(args)
        .env_remove("LUA_INIT")
        .env_remove("LUA_INIT_5_5")
        .env("XDG_CACHE_HOME", cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A script `code` named `name` in `dir`: its path.
fn script(dir: &tempfile::TempDir, name: &str, code: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, code).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn options_run_in_order_and_the_script_gets_its_arguments() {
    let dir = temp_dir("run-cli");
    let s = script(
        &dir,
        "args.lua",
        "#!/usr/bin/env lua\nprint(a, str.upper('x'), ...) print(#arg, arg[0] ~= nil, arg[-1])",
    );
    let o = run(
        &["-e", "a = 1", "-l", "str=string", "-ea=a+1", &s, "p", "q"],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "2\tX\tp\tq\n2\ttrue\t-ea=a+1\n");
}

#[test]
fn arg_names_a_lua_that_runs_luasnap_again() {
    // Test suites that start the interpreter again take it from `arg`: luaunit's functional
    // tests run `arg[-1]`, Penlight's run.lua and Lua's main.lua the lowest index.
    let (dir, cache) = (temp_dir("run-cli"), temp_dir("run-cache"));
    let run = |args: &[&str], stdin: &str| run_cached(cache.path(), args, stdin);
    let s = script(
        &dir,
        "spawn.lua",
        r#"local low = -1 while arg[low - 1] do low = low - 1 end
print(low, arg[-1])
local child = assert(io.popen('"' .. arg[-1] .. '" -e "print(type(eris), arg[-1], arg[0])" 2>&1'))
io.write(child:read("a"))
assert(child:close())"#,
    );
    let o = run(&[&s], "");
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    let link = std::fs::read_dir(cache.path().join("luasnap"))
        .unwrap()
        .map(|e| e.unwrap().path().join("lua"))
        .find(|l| std::fs::read_link(l).is_ok())
        .expect("a `lua` link in the cache");
    let bin = std::fs::canonicalize(env!("CARGO_BIN_EXE_luasnap")).unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), bin);
    let link = link.to_str().unwrap();
    // The child is luasnap (`eris` is there) and its own `arg` starts at the same link.
    assert_eq!(
        out(&o),
        format!("-1\t{link}\ntable\tnil\t{link}\n"),
        "{}",
        err(&o)
    );
    // Options sit between the entry point and the script, as stock lua has them.
    let lowest = script(
        &dir,
        "lowest.lua",
        "local low = -1 while arg[low - 1] do low = low - 1 end print(low, arg[low], arg[-1])",
    );
    let o = run(&["-W", "-e", "x = 1", &lowest], "");
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), format!("-4\t{link}\tx = 1\n"));
    // A link left pointing elsewhere (another build at the same path) is made again.
    std::fs::remove_file(link).unwrap();
    std::os::unix::fs::symlink("/bin/false", link).unwrap();
    let o = run(&[&s], "");
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(std::fs::read_link(link).unwrap(), bin);
}

#[test]
fn errors_are_reported_as_lua_does_with_exit_code_1() {
    let o = run(
        &[
            "-e",
            "error(setmetatable({}, {__tostring = function() return 'custom' end}))",
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).ends_with(": custom\n"), "{}", err(&o));
    let o = run(&["-e", "error('boom')"], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("(command line):1: boom\nstack traceback:"),
        "{}",
        err(&o)
    );
    let o = run(&["-e", "os.exit(7)"], "");
    assert_eq!(o.status.code(), Some(7));
}

#[test]
fn usage_errors_and_version() {
    let o = run(&["-x"], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("unrecognized option '-x'"), "{}", err(&o));
    let o = run(&["-e"], "");
    assert!(err(&o).contains("'-e' needs argument"), "{}", err(&o));
    let o = run(&["-v"], "");
    assert!(o.status.success());
    assert!(out(&o).starts_with("Lua 5.5.1"), "{}", out(&o));
    let o = run(&["--base-address", "0xffffffffffff0000", "-e", ""], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("out of range"), "{}", err(&o));
}

#[test]
fn stdin_dash_and_the_repl() {
    let o = run(&["-"], "print(1 + 1)");
    assert_eq!(out(&o), "2\n");
    let o = run(&["--", "-"], "");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a script literally named '-' after --"
    );
    let o = run(
        &["-e", "_PROMPT = '' _PROMPT2 = ''", "-i"],
        "x = 6 *\n7\nx\n",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("42\n"), "{}", out(&o));
    // As lua.c's REPL: an error message inside the loop has no program name before it.
    let o = run(&["-i"], "error('x')\n");
    assert!(
        err(&o).lines().any(|l| l.starts_with("stdin:1: x")),
        "{}",
        err(&o)
    );
}

#[test]
fn the_deterministic_profile_explains_a_missing_library() {
    let o = run(&["--deterministic", "1", "-e", "print(os.time())"], "");
    assert_eq!(o.status.code(), Some(1));
    let first = err(&o).lines().next().unwrap_or("").to_string();
    assert!(
        first.contains("(global 'os')") && first.contains("left out of the deterministic profile"),
        "{}",
        err(&o)
    );
}

#[test]
fn c_api_is_exported_for_c_modules() {
    // package.loadlib resolves symbols against the process: the API must be there.
    let o = run(
        &[
            "-e",
            "local f, e, w = package.loadlib('', 'lua_gettop') print(type(f), e, w)",
        ],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "function\tnil\tnil\n", "{}", err(&o));
}

#[test]
fn memory_limit_stack_overflow_and_growth() {
    // Stock Lua 5.5.1 under a 64 MiB cap reports this overflow as "stack overflow" (from 56
    // MiB on) and grows this array to 2^22 entries (README, `luasnap run`).
    let o = run(
        &[
            "--memory-limit",
            "64M",
            "-e",
            "local function f(n) return 1 + f(n + 1) end
             print((select(2, pcall(f, 1)):match('stack overflow')))",
        ],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "stack overflow\n");
    let o = run(
        &[
            "--memory-limit",
            "64M",
            "-e",
            "local t = {}
             pcall(function() local i = 0 while true do i = i + 1 t[i] = i end end)
             print(#t)",
        ],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "4194304\n");
}

#[test]
fn memory_limit_after_stack_overflows() {
    // A deep recursion leaves Lua's spare CallInfo records freed every other one, so their
    // spans half empty. Stock Lua 5.5.1 under a 64 MiB cap still grows this array to 2^22
    // entries after the overflow (luasnap reached 2^21 while free span slots counted), and
    // reports the last overflow below as "stack overflow" (luasnap: "not enough memory").
    let o = run(
        &[
            "--memory-limit",
            "64M",
            "-e",
            "local function f(n) return 1 + f(n + 1) end
             print((select(2, pcall(f, 1)):match('stack overflow')))
             collectgarbage()
             local t = {}
             pcall(function() local i = 0 while true do i = i + 1 t[i] = i end end)
             print(#t)",
        ],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "stack overflow\n4194304\n");
    let o = run(
        &[
            "--memory-limit",
            "64M",
            "-e",
            "local function auxy() auxy() end
             local function yy() collectgarbage('stop') auxy() collectgarbage('restart') end
             for _ = 1, 4 do pcall(yy) end
             collectgarbage('restart')
             local function loop(x, y, z) return 1 + loop(x, y, z) end
             print((select(2, xpcall(loop, function(m) return m end)):match('stack overflow')))",
        ],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "stack overflow\n");
}

/// Stock Lua 5.5.1 starts and prints under a cap of about 24 KB (its state and standard
/// library hold 18.8 KB, about 23.9 KB counted as malloc chunks). luasnap's own tables (the
/// save-game permanents, the `eris` module, the chunk registry: about 27 KB) do not count
/// against the cap, and the spans its first blocks open do not bind it either: it needed
/// 80 KB before.
#[test]
fn a_small_memory_limit_starts_like_stock_lua() {
    let o = run(&["--memory-limit", "24K", "-e", "print(1)"], "");
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "1\n");
    // What the cap leaves is what the program gets: 64 KiB holds about 40 KB of 1 KB strings
    // beyond the state (33 here; stock, counting malloc chunks: about 38), not 40 KB less
    // luasnap's tables (9).
    let o = run(
        &[
            "--memory-limit",
            "64K",
            "-e",
            "local t = {}
             print(pcall(function() for i = 1, 1000 do t[i] = ('x'):rep(1000) .. i end end))
             print(#t >= 24 and #t < 64)",
        ],
        "",
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).starts_with("false\tnot enough memory\ntrue"),
        "{}",
        out(&o)
    );
    // Below what the standard library needs: as stock, the state cannot be created.
    let o = run(&["--memory-limit", "16K", "-e", "print(1)"], "");
    assert!(!o.status.success());
    assert!(err(&o).contains("not enough memory"), "{}", err(&o));
}

#[test]
fn a_save_game_written_by_one_process_loads_in_another() {
    let tmp = temp_dir("save");
    let dir = tmp.path();
    let save = dir.join("game.sav");
    let game = r#"
        local Player = {} Player.__index = Player
        function Player:score() return self.points * 10 end
        players = { setmetatable({ name = "ana", points = 4 }, Player), setmetatable({ name = "bo", points = 7 }, Player) }
        local ticks = 0
        function tick() ticks = ticks + 1 return ticks end
    "#;
    std::fs::write(dir.join("game.lua"), game).unwrap();
    let game = format!("dofile({:?})", dir.join("game.lua").to_str().unwrap());
    let script1 = dir.join("save.lua");
    std::fs::write(
        &script1,
        format!("{game}\ntick() tick()\nlocal f = assert(io.open(arg[1], 'wb')) f:write(eris.persist({{ players = players, tick = tick, G = _G }})) f:close()"),
    )
    .unwrap();
    let script2 = dir.join("load.lua");
    std::fs::write(
        &script2,
        format!(
            "{game}\nlocal f = assert(io.open(arg[1], 'rb')) local g = eris.unpersist(f:read('a')) f:close()
             print(g.players[2]:score(), g.tick(), g.players[1].name, g.G == _G, g.G.string == string)"
        ),
    )
    .unwrap();
    let run = |script: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_luasnap"))
            .args(["run", script.to_str().unwrap(), save.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(&script1);
    assert_eq!(run(&script2).trim(), "70\t3\tana\ttrue\ttrue");
}

#[test]
fn the_deterministic_profile_requires_the_scripts_own_modules() {
    // An outside tester's driver beside a game's main.lua could not `require "main"`: the
    // profile's require loads only the game's files, and `run` named no folder for them.
    let dir = temp_dir("run-det-require");
    script(
        &dir,
        "main.lua",
        "local G = {} function G.answer() return 42 end return G",
    );
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    script(
        &dir,
        "lib/util.lua",
        "return { twice = function(x) return 2 * x end }",
    );
    let driver = script(
        &dir,
        "driver.lua",
        "local G = require 'main' local u = require 'lib.util' print(u.twice(G.answer()))",
    );
    let o = run(&["--deterministic", "7", &driver], "");
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "84\n");
}
