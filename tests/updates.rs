//! Updates that keep saves: a save of version 1 of a game loads into version 2, each saved
//! function bound to version 2's function at the same place (`FunctionBinding::Current`).

use luasnap::bridge::persist::{Accept, FunctionBinding, LoadError, LoadOptions, Trust};
use luasnap::bridge::{Value, Vm};

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder().capacity(256 * MIB).build().unwrap()
}

fn int(vm: &Vm, code: &str) -> i64 {
    vm.exec(code, "=check").unwrap()[0]
        .as_integer()
        .unwrap_or_else(|| panic!("{code}: not an integer"))
}

const V1: &str = r#"
local Agent = {}
Agent.__index = Agent
local step_size = 1
function Agent.new(name) return setmetatable({ name = name, hp = 10 }, Agent) end
function Agent:hit(n) self.hp = self.hp - n return self.hp end
function make_counter() local n = 0 return function() n = n + step_size return n end end
function version() return 1 end
Game = { Agent = Agent }
"#;

/// Version 2: lines moved (a comment block and a new function first), `Agent:hit` halves
/// damage, `version` says 2, the counter counts by a new local helper.
const V2: &str = r#"
-- version 2
-- (lines moved)
local function double(x) return 2 * x end
local Agent = {}
Agent.__index = Agent
local step_size = 1
function Agent:heal(n) self.hp = self.hp + n return self.hp end
function Agent.new(name) return setmetatable({ name = name, hp = 10 }, Agent) end
function Agent:hit(n) self.hp = self.hp - n // 2 return self.hp end
function make_counter() local n = 0 return function() n = n + double(step_size) return n end end
function version() return 2 end
Game = { Agent = Agent }
"#;

fn v1_save() -> Vec<u8> {
    save_of(
        V1,
        "@game.lua",
        "local p = Game.Agent.new('ann') p:hit(2)
         local c = make_counter() c() c()
         saved = { player = p, counter = c, version = version, hit = Game.Agent.hit }",
    )
}

/// `file` (a persisted global `saved`) loaded into a new VM that ran `v2` as `chunk`, under
/// `trust`, each saved function bound to the current version's (`FunctionBinding::Current`).
fn load_into(
    v2: &str,
    chunk: &str,
    file: &[u8],
    trust: Trust,
) -> Result<(Vm, luasnap::bridge::persist::LoadReport), LoadError> {
    let mut b = vm();
    b.exec(v2, chunk).unwrap();
    let opts = LoadOptions {
        functions: FunctionBinding::Current,
        ..LoadOptions::new(trust)
    };
    let report = b.unpersist_reporting(file, "saved", &opts)?;
    Ok((b, report))
}

/// The global `saved` of a VM that ran `v1` as `chunk`, then `setup`, persisted.
fn save_of(v1: &str, chunk: &str, setup: &str) -> Vec<u8> {
    let a = vm();
    a.exec(v1, chunk).unwrap();
    a.exec(setup, "=setup").unwrap();
    a.persist("saved").unwrap()
}

fn load_into_v2(trust: Trust) -> Result<(Vm, luasnap::bridge::persist::LoadReport), LoadError> {
    load_into(V2, "@game.lua", &v1_save(), trust)
}

#[test]
fn a_v1_save_runs_v2_code_under_foreign_trust() {
    let (b, report) = load_into_v2(Trust::Foreign).unwrap();
    eprintln!("{}", report.summary());
    assert_eq!(int(&b, "return saved.version()"), 2);
    assert_eq!(int(&b, "return saved.player.hp"), 8);
    assert_eq!(int(&b, "return saved.hit(saved.player, 4)"), 6);
    // The counter keeps its saved count and counts by version 2's helper.
    assert_eq!(int(&b, "return saved.counter()"), 4);
    let places: Vec<&str> = report.rebound.iter().map(|f| f.place.as_str()).collect();
    assert!(places.contains(&"version"), "{places:?}");
    assert!(places.contains(&"Agent.hit"), "{places:?}");
    assert!(report.summary().contains("rebound"), "{}", report.summary());
    // Every rebound function is shown at this version's line.
    let hit = report
        .rebound
        .iter()
        .find(|f| f.place == "Agent.hit")
        .unwrap();
    assert_eq!((hit.line, hit.now), (6, Some(10)));
    assert!(
        report.summary().contains("Agent.hit (game.lua:10)"),
        "{}",
        report.summary()
    );
}

#[test]
fn a_v1_save_runs_v2_code_under_own_trust() {
    let (b, report) = load_into_v2(Trust::Own).unwrap();
    eprintln!("{}", report.summary());
    assert_eq!(int(&b, "return saved.version()"), 2);
    assert_eq!(int(&b, "return saved.hit(saved.player, 4)"), 6);
    assert_eq!(int(&b, "return saved.counter()"), 4);
}

#[test]
fn a_loaded_v2_state_saves_and_loads_again() {
    for trust in [Trust::Foreign, Trust::Own] {
        let (b, _) = load_into_v2(trust).unwrap();
        let again = b.persist("saved").unwrap();
        let mut c = vm();
        c.exec(V2, "@game.lua").unwrap();
        c.unpersist_with(&again, "saved", &LoadOptions::new(Trust::Foreign))
            .unwrap();
        assert_eq!(int(&c, "return saved.counter()"), 4);
        assert_eq!(int(&c, "return saved.version()"), 2);
        let _ = Value::Nil;
    }
}

/// A coroutine suspended in a function whose code changed: own loads keep its saved code (it
/// is at a pc of that code), foreign loads refuse it, naming the function.
#[test]
fn a_coroutine_suspended_in_changed_code_keeps_it_under_own_and_is_refused_under_foreign() {
    let v1 = "function walker() local i = 0 while true do i = i + 1 coroutine.yield(i) end end";
    let v2 = "function walker() local i = 0 while true do i = i + 100 coroutine.yield(i) end end";
    let file = save_of(
        v1,
        "@ai.lua",
        "saved = coroutine.wrap(walker) saved() saved()",
    );
    let e = load_into(v2, "@ai.lua", &file, Trust::Foreign).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LoadError::Refused { .. }), "{msg}");
    assert!(msg.contains("walker") && msg.contains("suspended"), "{msg}");
    assert!(msg.contains("Trust::Own"), "{msg}");
    let (c, report) = load_into(v2, "@ai.lua", &file, Trust::Own).unwrap();
    assert_eq!(
        int(&c, "return saved()"),
        3,
        "the suspended call goes on in its saved code"
    );
    assert!(
        report.kept.iter().any(|f| f.place == "walker"),
        "{}",
        report.summary()
    );
}

/// A coroutine suspended in functions that only moved resumes in this version's functions
/// under foreign trust (they are the saved code at other lines: checked against the text the
/// save carries), a closure sharing one of its locals included, and so does one whose own
/// code is the same but a nested function's changed; without that text (a save written
/// without code) the load cannot check it and refuses, saying why.
#[test]
fn a_coroutine_suspended_in_moved_code_resumes_there_if_the_save_carries_its_text() {
    let v1 = "function walker()\n  local i = 0\n  peek = function() return i end\n  while true do i = i + 1 coroutine.yield(i) end\nend";
    let v2 = format!("-- moved\n{v1}");
    let setup = "saved = { co = coroutine.wrap(walker) } saved.co() saved.co() saved.peek = peek";
    let file = save_of(v1, "@ai.lua", setup);
    let (b, report) = load_into(&v2, "@ai.lua", &file, Trust::Foreign).unwrap();
    assert_eq!(int(&b, "return saved.co()"), 3);
    assert_eq!(
        int(&b, "return saved.peek()"),
        3,
        "the closure shares the local"
    );
    assert!(
        report.moved.iter().any(|f| f.place == "walker") && report.kept.is_empty(),
        "{}",
        report.summary()
    );
    // A function whose nested function changed is the same code itself: it resumes, and its
    // local holding the nested function's closure runs the newer code.
    let v1b = "function walker()\n  local i = 0\n  local function step(n) return n + 1 end\n  while true do i = step(i) coroutine.yield(i) end\nend";
    let v2b = v1b.replace("n + 1", "n + 10");
    let file = save_of(
        v1b,
        "@ai.lua",
        "saved = coroutine.wrap(walker) saved() saved()",
    );
    let (b, report) = load_into(&v2b, "@ai.lua", &file, Trust::Foreign).unwrap();
    assert_eq!(int(&b, "return saved()"), 12);
    let rebound: Vec<&str> = report.rebound.iter().map(|f| f.place.as_str()).collect();
    assert!(rebound.contains(&"walker > step"), "{}", report.summary());

    let a = vm();
    a.exec(v1, "@ai.lua").unwrap();
    a.exec(setup, "=setup").unwrap();
    let opts = luasnap::bridge::persist::PersistOptions {
        code: false,
        ..Default::default()
    };
    let bare = a.persist_with("saved", &opts).unwrap();
    let e = load_into(&v2, "@ai.lua", &bare, Trust::Foreign).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LoadError::Refused { .. }), "{msg}");
    assert!(
        msg.contains("walker")
            && msg.contains("only moved")
            && msg.contains("PersistOptions::code"),
        "{msg}"
    );
}

/// A function this version no longer has: kept with its saved code under own trust (the
/// report says so), refused by name under foreign trust.
#[test]
fn a_function_removed_in_v2_is_kept_under_own_and_refused_by_name_under_foreign() {
    let v1 = "function bonus() return 7 end function score() return 1 end";
    let v2 = "function score() return 2 end";
    let file = save_of(v1, "@rules.lua", "saved = { bonus = bonus, score = score }");
    let e = load_into(v2, "@rules.lua", &file, Trust::Foreign).unwrap_err();
    assert!(e.to_string().contains("bonus"), "{e}");
    assert!(e.to_string().contains("no longer has"), "{e}");
    let (c, report) = load_into(v2, "@rules.lua", &file, Trust::Own).unwrap();
    assert_eq!(int(&c, "return saved.bonus() + saved.score()"), 9);
    assert!(
        report.missing.iter().any(|f| f.place == "bonus"),
        "{}",
        report.summary()
    );
    assert!(
        report.rebound.iter().any(|f| f.place == "score"),
        "{}",
        report.summary()
    );
    assert!(report.summary().contains("missing"), "{}", report.summary());
}

/// Version 3 of V1: three comment lines above, `version` says 3. Every other function only
/// moved: the same code three lines down.
#[test]
fn functions_that_only_moved_are_reported_as_moved_at_this_versions_lines() {
    let v3 = format!(
        "-- version 3\n-- (three lines\n-- of comments)\n{}",
        V1.replace("return 1 end", "return 3 end")
    );
    let (b, report) = load_into(&v3, "@game.lua", &v1_save(), Trust::Foreign).unwrap();
    assert_eq!(int(&b, "return saved.version()"), 3);
    assert_eq!(int(&b, "return saved.hit(saved.player, 4)"), 4);
    let rebound: Vec<(&str, u64, Option<u64>)> = report
        .rebound
        .iter()
        .map(|f| (f.place.as_str(), f.line, f.now))
        .collect();
    assert_eq!(rebound, [("version", 8, Some(11))], "{}", report.summary());
    let mut moved: Vec<(&str, u64, Option<u64>)> = report
        .moved
        .iter()
        .map(|f| (f.place.as_str(), f.line, f.now))
        .collect();
    moved.sort();
    assert!(
        moved.contains(&("Agent.hit", 6, Some(9))) && moved.contains(&("Agent.new", 5, Some(8))),
        "{}",
        report.summary()
    );
    let summary = report.summary();
    assert!(
        summary.contains("1 rebound to this version (version (game.lua:11))")
            && summary.contains("moved to other lines, code unchanged (")
            && summary.contains("Agent.hit (game.lua:9)"),
        "{summary}"
    );
}

/// A function renamed in v2 without changing its body or its lines: a foreign load finds it
/// by its code (the newer version's own, identical), as docs/updates.md says; renamed with a
/// changed body, it has no counterpart and is refused by name.
#[test]
fn a_renamed_function_with_identical_code_is_found_by_its_code_under_foreign() {
    let v1 = "function bonus() return 7 end\nfunction score() return 1 end";
    let file = save_of(v1, "@rules.lua", "saved = { bonus = bonus, score = score }");
    let same = "function extra() return 7 end\nfunction score() return 2 end";
    let (c, report) = load_into(same, "@rules.lua", &file, Trust::Foreign).unwrap();
    assert_eq!(int(&c, "return saved.bonus() + saved.score()"), 9);
    assert!(
        report.missing.is_empty() && report.unchanged >= 1,
        "{}",
        report.summary()
    );
    let changed = "function extra() return 8 end\nfunction score() return 2 end";
    let e = load_into(changed, "@rules.lua", &file, Trust::Foreign).unwrap_err();
    assert!(
        e.to_string().contains("bonus") && e.to_string().contains("no longer has"),
        "{e}"
    );
}

/// `eris.unpersist` keeps Eris's behaviour: saved functions run their saved code.
/// A function that read a global in version 1 (its `_ENV` holds the globals) and reads none
/// in version 2 (a `require` or a global call taken out): the saved `_ENV` has no slot in the
/// new function and is dropped; a foreign load is not refused as "_G somewhere else".
#[test]
fn a_function_that_no_longer_reads_globals_loads_under_foreign_trust() {
    let v1 = "local state = { n = 0 }
        function init() state.n = 0 state.m = tostring(1) end
        function bump() state.n = state.n + 1 return state.n end";
    let v2 = "local state = { n = 0 }
        function init() state.n = 0 state.m = false end
        function bump() state.n = state.n + 1 return state.n end";
    let save = save_of(
        v1,
        "@game.lua",
        "init() bump() saved = { init = init, bump = bump }",
    );
    let (b, report) = load_into(v2, "@game.lua", &save, Trust::Foreign).unwrap();
    let places: Vec<&str> = report.rebound.iter().map(|f| f.place.as_str()).collect();
    assert_eq!(places, ["init"], "{}", report.summary());
    assert_eq!(int(&b, "return saved.bump()"), 2);
    // The rebound init runs version 2's code, which reads no global.
    b.exec("saved.init()", "=check").unwrap();
    assert_eq!(int(&b, "return saved.bump()"), 1);
    // The globals anywhere else than an `_ENV` are still refused.
    let elsewhere = save_of(v1, "@game.lua", "saved = { init = init, g = _G }");
    let e = load_into(v2, "@game.lua", &elsewhere, Trust::Foreign).unwrap_err();
    assert!(e.to_string().contains("globals table (_G)"), "{e}");
    // ... and say which permanent accepts them.
    assert!(
        matches!(&e, LoadError::Refused { accept: Accept::Permanent(n), .. } if n == "_G"),
        "{e:?}"
    );
}

/// A chunk name with a NUL byte (a hostile save's): the refusal shows it escaped, whole.
#[test]
fn a_chunk_name_with_a_nul_byte_is_shown_escaped_in_the_refusal() {
    use luasnap::bridge::persist::forge::{body_of, seal_body};
    let file = v1_save();
    let mut body = body_of(&file).unwrap().to_vec();
    while let Some(at) = body.windows(9).position(|w| w == b"@game.lua") {
        body[at + 5] = 0;
    }
    let e = load_into(V2, "@game.lua", &seal_body(&body, true), Trust::Foreign).unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains('\0'), "{msg:?}");
    assert!(msg.contains("@game\\0lua"), "{msg}");
    assert!(msg.contains("(at byte "), "{msg}");
}

#[test]
fn eris_unpersist_keeps_the_saved_code() {
    let a = vm();
    a.exec("function version() return 1 end", "@v.lua").unwrap();
    a.exec("saved = { version = version }", "=setup").unwrap();
    let file = a.persist("saved").unwrap();
    let b = vm();
    b.exec("function version() return 2 end", "@v.lua").unwrap();
    b.set("file", Value::String(file)).unwrap();
    assert_eq!(
        int(
            &b,
            "eris.settings('trust', 'own') return eris.unpersist(file).version()"
        ),
        1
    );
}

mod game {
    use luasnap::bridge::persist::LoadError;
    use luasnap::bridge::runtime::{Backend, Game, GameConfig, GameError};

    fn config(script: &str) -> GameConfig {
        GameConfig {
            script: script.into(),
            chunk_name: "@main.lua".into(),
            base_address: None,
            capacity: 256 << 20,
            ..GameConfig::default_game(2, 3)
        }
    }

    const V1: &str = r#"
local G = {}
local state = { n = 0 }
function G.init(players, seed) state.n = 0 end
function G.step(inputs) state.n = state.n + 1 end
function G.digest() return state.n end
return G
"#;

    /// Version 2: a new helper above (the lines of everything move), and G.step counts ten.
    const V2: &str = r#"
local G = {}
local state = { n = 0 }
local function ten() return 10 end
-- G.step now counts by ten
function G.init(players, seed) state.n = 0 end
function G.step(inputs) state.n = state.n + ten() end
function G.digest() return state.n end
return G
"#;

    #[test]
    fn a_v1_save_loads_into_v2_by_default_and_v2s_code_runs() {
        let mut g = Game::new(&config(V1), Backend::ArenaFull).unwrap();
        for _ in 0..5 {
            g.step(&[0u8, 0u8]).unwrap();
        }
        let save = g.save_game().unwrap();
        drop(g);
        let mut g2 = Game::from_save(&config(V2), Backend::ArenaFull, &save).unwrap();
        assert_eq!(g2.game_digest().unwrap(), Some(5));
        g2.step(&[0u8, 0u8]).unwrap();
        assert_eq!(
            g2.game_digest().unwrap(),
            Some(15),
            "version 2's G.step runs"
        );
        let report = g2.load_report().unwrap();
        assert!(
            report
                .rebound
                .iter()
                .any(|f| f.place == "G.step" && f.chunk == "main.lua"),
            "{}",
            report.summary()
        );
    }

    /// The state holds `load` (as tiny-ecs keeps `local loadstring = loadstring or load`).
    const HOLDS_LOAD: &str = r#"
local G = {}
local state = { n = 0 }
function G.init(players, seed) state.n = 0 state.compile = load end
function G.step(inputs) state.n = state.n + 1 end
function G.digest() return state.n end
return G
"#;

    #[test]
    fn a_save_holding_load_loads_once_the_game_declares_it_and_the_refusal_says_how() {
        let mut g = Game::new(&config(HOLDS_LOAD), Backend::ArenaFull).unwrap();
        g.step(&[0u8, 0u8]).unwrap();
        let save = g.save_game().unwrap();
        drop(g);
        let e = Game::<u8>::from_save(&config(HOLDS_LOAD), Backend::ArenaFull, &save).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, GameError::Load(LoadError::Refused { .. })),
            "{msg}"
        );
        assert!(msg.contains("\"load\""), "{msg}");
        assert!(msg.contains("G.permanents"), "{msg}");
        assert!(msg.contains("GameConfig::permanents"), "{msg}");
        // Declared in the script ...
        let declared =
            HOLDS_LOAD.replace("local G = {}", "local G = { permanents = { \"load\" } }");
        let g2: Game = Game::from_save(&config(&declared), Backend::ArenaFull, &save).unwrap();
        assert_eq!(g2.game_digest().unwrap(), Some(1));
        drop(g2);
        // ... or in the configuration.
        let mut cfg = config(HOLDS_LOAD);
        cfg.permanents = vec!["load".into()];
        let g3: Game = Game::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
        assert_eq!(g3.game_digest().unwrap(), Some(1));
    }

    #[test]
    fn eris_is_not_a_global_in_game_vms() {
        let g: Game = Game::new(&config(V1), Backend::ArenaFull).unwrap();
        let r = g
            .vm()
            .exec("return eris == nil, type(require)", "=check")
            .unwrap();
        assert_eq!(r[0], luasnap::bridge::Value::Boolean(true));
    }
}

/// Version 1 of a game whose handler `M.a.b` is saved; version 2 adds an unrelated handler
/// under the key "a.b" above it (and, in `changed`, changes `M.a.b`'s code).
const KEYS_V1: &str = "M = { a = {} }\nM.a.b = function() return 1 end";
fn keys_v2(changed: bool) -> String {
    let body = if changed { "return 2" } else { "return 1" };
    format!("M = {{ a = {{}} }}\nM[\"a.b\"] = function() return 1000 end\nM.a.b = function() {body} end")
}

/// A key that is no name is a place of its own (`M["a.b"]`), never `M.a.b`: a save's
/// `M.a.b` stays bound to `M.a.b` when a version adds `M["a.b"]` (an outside tester's
/// place1 w1/w2, where the saved handler silently ran the new one).
#[test]
fn a_quoted_key_is_not_the_path_of_names_it_reads_as() {
    let save = save_of(KEYS_V1, "@game.lua", "saved = { f = M.a.b }");
    for changed in [false, true] {
        let (b, report) = load_into(&keys_v2(changed), "@game.lua", &save, Trust::Foreign).unwrap();
        assert_eq!(
            int(&b, "return saved.f()"),
            if changed { 2 } else { 1 },
            "{}",
            report.summary()
        );
        let rebound: Vec<&str> = report
            .rebound
            .iter()
            .chain(&report.moved)
            .map(|f| f.place.as_str())
            .collect();
        assert_eq!(rebound, ["M.a.b"], "{}", report.summary());
    }
    // Both in the save: each to its own.
    let both = save_of(
        &keys_v2(false),
        "@game.lua",
        "saved = { f = M.a.b, g = M['a.b'] }",
    );
    let (b, report) = load_into(&keys_v2(true), "@game.lua", &both, Trust::Foreign).unwrap();
    assert_eq!(int(&b, "return saved.f() * 10000 + saved.g()"), 21000);
    let places: Vec<&str> = report.rebound.iter().map(|f| f.place.as_str()).collect();
    assert_eq!(places, ["M.a.b"], "{}", report.summary());
}

/// A hand-made save (the crate's forge) reads as a save of this build: its header carries the
/// quoted-places flag an honest save carries, so its `M.a.b` is never taken for `M["a.b"]`;
/// an old save is forged only on purpose (`seal_old_body`).
#[test]
fn a_forged_save_reads_as_this_builds_unless_forged_old() {
    use luasnap::bridge::persist::forge::{body_of, seal_body, seal_old_body};
    use luasnap::bridge::persist::{FLAG_QUOTED_PLACES, FORMAT_VERSION};
    let honest = save_of(KEYS_V1, "@game.lua", "saved = { f = M.a.b }");
    let (flags, body) = (honest[32], body_of(&honest).unwrap());
    assert_eq!(seal_old_body(body, FORMAT_VERSION, flags), honest);
    let forged = seal_body(body, flags & 1 != 0); // flag 1: bytecode
    let (b, report) = load_into(&keys_v2(true), "@game.lua", &forged, Trust::Foreign)
        .unwrap_or_else(|e| panic!("a forged save read as an old one: {e}"));
    assert_eq!(int(&b, "return saved.f()"), 2, "{}", report.summary());
    let old = seal_old_body(body, FORMAT_VERSION, flags & !FLAG_QUOTED_PLACES);
    let e = load_into(&keys_v2(true), "@game.lua", &old, Trust::Foreign).unwrap_err();
    assert!(e.to_string().contains("cannot be told"), "{e}");
}

/// A save written before places quoted keys (its header lacks the flag) read `M["a.b"]` as
/// `M.a.b`: such a place is bound only to the function with the saved code, and refused
/// under foreign trust, naming the functions it could be, when none has it.
#[test]
fn an_old_save_binds_a_place_two_functions_read_as_only_by_its_code() {
    let mut save = save_of(KEYS_V1, "@game.lua", "saved = { f = M.a.b }");
    save[32] &= !luasnap::bridge::persist::FLAG_QUOTED_PLACES;
    let (b, report) = load_into(&keys_v2(false), "@game.lua", &save, Trust::Foreign).unwrap();
    assert_eq!(int(&b, "return saved.f()"), 1, "{}", report.summary());
    let e = load_into(&keys_v2(true), "@game.lua", &save, Trust::Foreign).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("M[\"a.b\"] (game.lua:2), M.a.b (game.lua:3)")
            && msg.contains("cannot be told"),
        "{msg}"
    );
    assert!(
        matches!(
            &e,
            LoadError::Refused {
                accept: Accept::TrustOwn,
                ..
            }
        ),
        "{e:?}"
    );
    let (b, report) = load_into(&keys_v2(true), "@game.lua", &save, Trust::Own).unwrap();
    assert_eq!(int(&b, "return saved.f()"), 1, "{}", report.summary());
    assert_eq!(report.kept.len(), 1, "{}", report.summary());
    // With no quoted key in the family, an old save's place is bound as before.
    let plain = save_of(KEYS_V1, "@game.lua", "saved = { f = M.a.b }");
    let (b, _) = load_into(
        "M = { a = {} }\nM.a.b = function() return 3 end",
        "@game.lua",
        &plain,
        Trust::Foreign,
    )
    .unwrap();
    assert_eq!(int(&b, "return saved.f()"), 3);
}

/// Names a hostile save provides reach no message raw: a place with a line break and a
/// terminal escape is shown escaped (an outside tester's upd2 esc.sav).
#[test]
fn a_saved_place_with_control_characters_is_shown_escaped() {
    use luasnap::bridge::persist::forge::{body_of, seal_body};
    let v1 = "function cheat() return 1 end\nfunction keep() return 2 end";
    let file = save_of(v1, "@game.lua", "saved = { f = cheat }");
    let mut body = body_of(&file).unwrap().to_vec();
    let at = body.windows(5).rposition(|w| w == b"cheat").unwrap();
    body[at..at + 5].copy_from_slice(b"\n\x1b[1m");
    let e = load_into(
        "function keep() return 2 end",
        "@game.lua",
        &seal_body(&body, true),
        Trust::Foreign,
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    assert!(
        msg.contains("function \\n\\u{1b}[1m (@game.lua:1)"),
        "{msg}"
    );
}
