//! Renamed and removed functions in update loads: what the game declares (`G.renamed`,
//! `G.removed`, `LoadOptions::renames`) binds a saved function whose place this version no
//! longer has, under the rules of a function at its own place; nothing a save holds declares
//! anything. See "Renamed and removed functions" in docs/updates.md.

use luasnap::bridge::persist::{
    Accept, FunctionBinding, LoadError, LoadOptions, LoadReport, Rename, Trust,
};
use luasnap::bridge::Vm;

fn vm() -> Vm {
    Vm::builder().capacity(256 << 20).build().unwrap()
}

fn int(vm: &Vm, code: &str) -> i64 {
    vm.exec(code, "=check").unwrap()[0]
        .as_integer()
        .unwrap_or_else(|| panic!("{code}: not an integer"))
}

/// The global `saved` of a VM that ran `v1` as `@rules.lua`, then `setup`, persisted.
fn save_of(v1: &str, setup: &str) -> Vec<u8> {
    let a = vm();
    a.exec(v1, "@rules.lua").unwrap();
    a.exec(setup, "=setup").unwrap();
    a.persist("saved").unwrap()
}

/// `file` loaded as the global `saved` into a VM that ran `v2` as `@rules.lua`, under
/// `trust`, with the declarations `renames`.
fn load_into(
    v2: &str,
    file: &[u8],
    trust: Trust,
    renames: &[Rename],
) -> Result<(Vm, LoadReport), LoadError> {
    let mut b = vm();
    b.exec(v2, "@rules.lua").unwrap();
    let opts = LoadOptions {
        functions: FunctionBinding::Current,
        renames: renames.to_vec(),
        ..LoadOptions::new(trust)
    };
    let report = b.unpersist_reporting(file, "saved", &opts)?;
    Ok((b, report))
}

const V1: &str = "function bonus(n) return 7 + n end\nfunction score() return 1 end";

#[test]
fn a_renamed_function_with_changed_code_is_rebound_under_foreign_trust() {
    let file = save_of(V1, "saved = { bonus = bonus, score = score }");
    let v2 = "function extra(n) return 8 + n end\nfunction score() return 2 end";
    // Undeclared: refused, naming what to declare.
    let e = load_into(v2, &file, Trust::Foreign, &[]).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { accept: Accept::Rename(p), .. } if p == "bonus"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(r#"G.renamed = { ["bonus"] = "its name now" }"#)
            && msg.contains("LoadOptions::renames")
            && msg.contains("Trust::Own"),
        "{msg}"
    );
    let (b, report) = load_into(
        v2,
        &file,
        Trust::Foreign,
        &[Rename::renamed("bonus", "extra")],
    )
    .unwrap();
    assert_eq!(int(&b, "return saved.bonus(1) + saved.score()"), 11);
    assert_eq!(report.renamed.len(), 1, "{}", report.summary());
    let r = &report.renamed[0];
    assert_eq!(
        (
            r.saved.place.as_str(),
            r.to.as_str(),
            r.saved.line,
            r.saved.now,
            r.replacement
        ),
        ("bonus", "extra", 1, Some(1), false)
    );
    assert!(
        report.rebound.iter().any(|f| f.place == "extra"),
        "{}",
        report.summary()
    );
    assert!(
        report
            .summary()
            .contains("1 renamed as the game declares (bonus as extra (rules.lua:1))"),
        "{}",
        report.summary()
    );
    // Own trust binds it alike (the saved code is not kept: the game said where it went).
    let (c, report) =
        load_into(v2, &file, Trust::Own, &[Rename::renamed("bonus", "extra")]).unwrap();
    assert_eq!(int(&c, "return saved.bonus(1)"), 9);
    assert!(report.missing.is_empty(), "{}", report.summary());
}

#[test]
fn a_renamed_function_that_only_moved_is_moved_and_its_nested_functions_follow() {
    let v1 = "function make(k)\n  return function(n) return n * k end\nend";
    let file = save_of(v1, "saved = { times3 = make(3) }");
    // The same code two lines down, under another name.
    let v2 = "-- version 2\nlocal unused = 1\nfunction build(k)\n  return function(n) return n * k end\nend";
    let (b, report) = load_into(
        v2,
        &file,
        Trust::Foreign,
        &[Rename::renamed("make", "build")],
    )
    .unwrap();
    assert_eq!(int(&b, "return saved.times3(5)"), 15);
    let places: Vec<(&str, &str)> = report
        .renamed
        .iter()
        .map(|r| (r.saved.place.as_str(), r.to.as_str()))
        .collect();
    assert_eq!(places, [("make > (function #1)", "build > (function #1)")]);
    assert!(
        report
            .moved
            .iter()
            .any(|f| f.place == "build > (function #1)"),
        "{}",
        report.summary()
    );
    // Changed code in the nested function: rebound, its saved upvalue `k` kept by name.
    let v3 = "function build(k)\n  return function(n) return n * k + 1 end\nend";
    let (c, _) = load_into(
        v3,
        &file,
        Trust::Foreign,
        &[Rename::renamed("make", "build")],
    )
    .unwrap();
    assert_eq!(int(&c, "return saved.times3(5)"), 16);
    // No nested function there any more: missing, as at its own place (own trust keeps its
    // saved code, foreign refuses naming the declaration that would bind it), and a
    // declaration of its own binds it.
    let v4 = "function triple(n) return 3 * n end\nfunction build(k) return k end";
    let renames = [Rename::renamed("make", "build")];
    let e = load_into(v4, &file, Trust::Foreign, &renames).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { accept: Accept::Rename(p), .. } if p == "make > (function #1)"),
        "{e}"
    );
    assert!(e.to_string().contains("nested in a function the game declares renamed (G.renamed[\"make\"] = \"build\"), and this version has no function at build > (function #1)"), "{e}");
    let (d, report) = load_into(v4, &file, Trust::Own, &renames).unwrap();
    assert_eq!(int(&d, "return saved.times3(5)"), 15);
    assert_eq!(report.missing.len(), 1, "{}", report.summary());
    let renames = [
        Rename::renamed("make", "build"),
        Rename::replaced("make > (function #1)", "triple"),
    ];
    let (e, _) = load_into(v4, &file, Trust::Foreign, &renames).unwrap();
    assert_eq!(int(&e, "return saved.times3(5)"), 15);
}

#[test]
fn a_coroutine_suspended_in_a_renamed_function_resumes_only_in_the_same_code() {
    let v1 =
        "function brain()\n  local i = 0\n  while true do i = i + 1 coroutine.yield(i) end\nend";
    let setup = "local co = coroutine.create(brain) coroutine.resume(co) coroutine.resume(co)
                 saved = { co = co }";
    let file = save_of(v1, setup);
    let moved = format!("-- a comment\n{}", v1.replace("brain", "think"));
    let (b, report) = load_into(
        &moved,
        &file,
        Trust::Foreign,
        &[Rename::renamed("brain", "think")],
    )
    .unwrap();
    assert_eq!(
        int(&b, "local _, i = coroutine.resume(saved.co) return i"),
        3,
        "{}",
        report.summary()
    );
    let changed = v1.replace("brain", "think").replace("i + 1", "i + 2");
    let e = load_into(
        &changed,
        &file,
        Trust::Foreign,
        &[Rename::renamed("brain", "think")],
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("think") && e.to_string().contains("code changed"),
        "{e}"
    );
}

#[test]
fn a_removed_function_becomes_its_replacement_or_is_refused_under_every_trust() {
    let v1 = "function poke() return 1 end\nfunction hit() return 5 end";
    let file = save_of(v1, "saved = { callbacks = { poke, hit } }");
    let v2 = "function hit() return 6 end";
    let (b, report) = load_into(
        v2,
        &file,
        Trust::Foreign,
        &[Rename::replaced("poke", "hit")],
    )
    .unwrap();
    assert_eq!(
        int(
            &b,
            "return saved.callbacks[1]() * 10 + saved.callbacks[2]()"
        ),
        66
    );
    assert!(report.renamed[0].replacement, "{}", report.summary());
    assert!(
        report
            .summary()
            .contains("poke replaced by hit (rules.lua:1)"),
        "{}",
        report.summary()
    );
    for trust in [Trust::Foreign, Trust::Own] {
        let e = load_into(v2, &file, trust, &[Rename::removed("poke")]).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, LoadError::Invalid { .. }), "{msg}");
        assert!(
            msg.contains("the save holds the function poke (rules.lua:1), which the game declares removed with no replacement (G.removed[\"poke\"] = false)"),
            "{msg}"
        );
    }
}

#[test]
fn declarations_naming_no_place_of_this_version_or_malformed_are_refused_by_name() {
    let file = save_of(V1, "saved = { bonus = bonus }");
    let v2 = "function extra(n) return 8 + n end\nfunction score() return 2 end";
    let e = load_into(v2, &file, Trust::Own, &[Rename::renamed("bonus", "extar")]).unwrap_err();
    assert!(
        e.to_string().contains(r#"G.renamed["bonus"] = "extar" names extar, which this version of rules.lua does not have (it has extra, score)"#),
        "{e}"
    );
    let e = load_into(
        v2,
        &file,
        Trust::Foreign,
        &[Rename::renamed("bonus", "rules.lua:extra")],
    )
    .unwrap_err();
    assert!(e.to_string().contains("stays in its file"), "{e}");
    // A declaration limited to another file does not apply here.
    let e = load_into(
        v2,
        &file,
        Trust::Foreign,
        &[Rename::renamed("other.lua:bonus", "extra")],
    )
    .unwrap_err();
    assert!(matches!(e, LoadError::Refused { .. }), "{e}");
    load_into(
        v2,
        &file,
        Trust::Foreign,
        &[Rename::renamed("rules.lua:bonus", "extra")],
    )
    .unwrap();
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
local W = {}
local state
function W.hurt(s, n) s.hp = s.hp - n end
function G.init() state = { hp = 100, hit = W.hurt } end
function G.step() state.hit(state, 1) end
function G.digest() return state.hp end
return G
"#;

    /// Version 2: `W.hurt` renamed `W.take_damage`, which halves damage over 1.
    const V2: &str = r#"
local G = {}
local W = {}
local state
function W.take_damage(s, n) s.hp = s.hp - math.max(1, n // 2) - 1 end
function G.init() state = { hp = 100, hit = W.take_damage } end
function G.step() state.hit(state, 1) end
function G.digest() return state.hp end
return G
"#;

    fn v1_save(script: &str) -> Vec<u8> {
        let mut g = Game::new(&config(script), Backend::ArenaFull).unwrap();
        for _ in 0..5 {
            g.step(&[0u8, 0u8]).unwrap();
        }
        g.save_game().unwrap()
    }

    #[test]
    fn the_games_g_renamed_is_read_from_this_version_before_the_load() {
        let save = v1_save(V1);
        let e = Game::<u8>::from_save(&config(V2), Backend::ArenaFull, &save).unwrap_err();
        assert!(
            matches!(e, GameError::Load(LoadError::Refused { .. })),
            "{e}"
        );
        let declared = V2.replace(
            "\nreturn G",
            "\nG.renamed = { [\"W.hurt\"] = \"W.take_damage\" }\nreturn G",
        );
        let mut g = Game::<u8>::from_save(&config(&declared), Backend::ArenaFull, &save).unwrap();
        assert_eq!(g.load_report().unwrap().renamed.len(), 1);
        g.step(&[0u8, 0u8]).unwrap();
        assert_eq!(g.game_digest().unwrap(), Some(93), "version 2's code runs");
    }

    /// A save is the saved game's state, its `G` included: a version 1 whose own `G` holds
    /// a declaration (as a hostile save can hold any table there) declares nothing to the
    /// version that loads it. (Set in `G.init`: one its script returned would have to name
    /// places version 1 has, checked as it starts.)
    #[test]
    fn a_save_declares_nothing() {
        let save = v1_save(&V1.replace(
            "function G.init() ",
            "function G.init() G.renamed = { [\"W.hurt\"] = \"W.take_damage\" }; G.removed = { [\"G.step\"] = false }; ",
        ));
        let e = Game::<u8>::from_save(&config(V2), Backend::ArenaFull, &save).unwrap_err();
        assert!(
            matches!(e, GameError::Load(LoadError::Refused { .. }))
                && e.to_string().contains("W.hurt"),
            "{e}"
        );
    }

    #[test]
    fn malformed_declarations_in_g_are_named() {
        let save = v1_save(V1);
        for (decl, says) in [
            ("G.renamed = 'W.take_damage'", "G.renamed must be a table keyed by saved places"),
            ("G.renamed = { W.take_damage }", "G.renamed has a key that is a number"),
            ("G.renamed = { ['W.hurt'] = W.take_damage }", "G.renamed[\"W.hurt\"] must be the place of the function in this version"),
            ("G.removed = { ['W.hurt'] = 1 }", "G.removed[\"W.hurt\"] must be the place of the function of this version that replaces it"),
            ("G.renamed = { ['W.hurt'] = 'W.take_damage' } G.removed = { ['W.hurt'] = false }", "declares a place that another declaration declares too"),
            (
                "G.renamed = { ['W.hurt'] = 'main.lua:W.take_damage' }",
                "a renamed function stays in its file",
            ),
        ] {
            let script = V2.replace("\nreturn G", &format!("\n{decl}\nreturn G"));
            let e = Game::<u8>::from_save(&config(&script), Backend::ArenaFull, &save).unwrap_err();
            assert!(e.to_string().contains(says), "{decl}: {e}");
        }
    }

    /// A declaration is checked every time the game starts, before any save exists: a new
    /// place or replacement this version does not have fails `Game::new`, naming the
    /// declaration and what the file has there, as a load would.
    #[test]
    fn a_mistyped_declaration_fails_as_the_game_starts() {
        for (decl, says) in [
            (
                "G.renamed = { ['W.hurt'] = 'W.take_dmg' }",
                r#"the game's declaration G.renamed["W.hurt"] = "W.take_dmg" names W.take_dmg, which this version of main.lua does not have (it has W.take_damage), nor does any other file of the game; correct G.renamed"#,
            ),
            (
                "G.removed = { ['W.poke'] = 'W.take_dmg' }",
                r#"G.removed["W.poke"] = "W.take_dmg" names W.take_dmg, which this version of main.lua does not have (it has W.take_damage), nor does any other file of the game; correct G.removed"#,
            ),
            (
                "G.renamed = { ['main.lua:W.hurt'] = 'W.take_dmg' }",
                r#"G.renamed["main.lua:W.hurt"] = "W.take_dmg" names W.take_dmg, which this version of main.lua does not have (it has W.take_damage); correct G.renamed"#,
            ),
            (
                "G.renamed = { ['W.hurt'] = 'Nowhere.f' }",
                r#"names Nowhere.f, which this version of the game does not have (no file of it has a function of that name)"#,
            ),
        ] {
            let script = V2.replace("\nreturn G", &format!("\n{decl}\nreturn G"));
            let e = Game::<u8>::new(&config(&script), Backend::ArenaFull).unwrap_err();
            assert!(
                matches!(&e, GameError::Declared { message } if message.contains(says)),
                "{decl}: {e}"
            );
        }
        // Malformed tables fail the start as they fail a load.
        let script = V2.replace("\nreturn G", "\nG.renamed = { W.take_damage }\nreturn G");
        let e = Game::<u8>::new(&config(&script), Backend::ArenaFull).unwrap_err();
        assert!(
            matches!(&e, GameError::Declared { message } if message.contains("G.renamed has a key that is a number")),
            "{e}"
        );
    }

    /// Correct declarations start; so does one whose old place this version has again (a
    /// new function at the old name: the declaration says where the saved one went).
    #[test]
    fn correct_declarations_start_and_an_old_place_may_exist_again() {
        for decl in [
            "G.renamed = { ['W.hurt'] = 'W.take_damage' }",
            "G.removed = { ['W.poke'] = 'W.take_damage', ['Debug.cheat'] = false }",
            "G.renamed = { ['main.lua:W.hurt'] = 'W.take_damage' }",
            "function W.hurt() end G.renamed = { ['W.hurt'] = 'W.take_damage' }",
        ] {
            let script = V2.replace("\nreturn G", &format!("\n{decl}\nreturn G"));
            let mut g = Game::<u8>::new(&config(&script), Backend::ArenaFull)
                .unwrap_or_else(|e| panic!("{decl}: {e}"));
            g.step(&[0u8, 0u8]).unwrap();
        }
    }

    /// A new place in a module is found in the module's file, which the check compiles and
    /// never runs; a declaration naming that file is looked for there only.
    #[test]
    fn a_new_place_in_a_module_is_found_there() {
        let module = "local E = {}\nfunction E.take_damage(s, n) s.hp = s.hp - n end\nreturn E\n";
        let with = |decl: &str| GameConfig {
            modules: vec![luasnap::bridge::Module::new("ent", module)],
            ..config(&V2.replace("\nreturn G", &format!("\n{decl}\nreturn G")))
        };
        Game::<u8>::new(
            &with("G.renamed = { ['E.hurt'] = 'E.take_damage' }"),
            Backend::ArenaFull,
        )
        .unwrap();
        Game::<u8>::new(
            &with("G.renamed = { ['ent.lua:E.hurt'] = 'E.take_damage' }"),
            Backend::ArenaFull,
        )
        .unwrap();
        let e = Game::<u8>::new(
            &with("G.renamed = { ['main.lua:E.hurt'] = 'E.take_damage' }"),
            Backend::ArenaFull,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("names E.take_damage, which this version of main.lua does not have (it has no function of that name)"),
            "{e}"
        );
        let e = Game::<u8>::new(
            &with("G.renamed = { ['E.hurt'] = 'E.take_dmg' }"),
            Backend::ArenaFull,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("which this version of ent.lua does not have (it has E.take_damage), nor does any other file of the game"),
            "{e}"
        );
    }
}

/// A place with a quoted key (`H["a > b"]`) is declared as it is written: its ` > ` and `.`
/// are the key's, not a nested place's or a file's.
#[test]
fn a_quoted_key_is_declared_as_it_is_written() {
    let v1 = "H = {}\nH[\"a > b.lua:c\"] = function() return 1 end";
    let file = save_of(v1, "saved = { f = H[\"a > b.lua:c\"] }");
    let v2 = "H = {}\nfunction H.renamed() return 2 end";
    let e = load_into(v2, &file, Trust::Foreign, &[]).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { accept: Accept::Rename(p), .. } if p == r#"H["a > b.lua:c"]"#),
        "{e}"
    );
    let declared = [Rename::renamed(r#"H["a > b.lua:c"]"#, "H.renamed")];
    let (b, report) = load_into(v2, &file, Trust::Foreign, &declared).unwrap();
    assert_eq!(int(&b, "return saved.f()"), 2, "{}", report.summary());
}

/// A coroutine suspended in a function the game declares removed, replaced by another: the
/// refusal names the saved function and says the replacement is other code (an outside
/// tester's upd2 co3 named the replacement "whose code changed"); own trust keeps the saved
/// function's code for it, and the report names that function.
#[test]
fn a_coroutine_in_a_replaced_function_is_named_by_its_saved_place() {
    let v1 = "Entity = {}\nfunction Entity.hurt(e) e.hp = e.hp - 1 end
function Entity.ai(e) while true do e.hp = e.hp + 1 coroutine.yield() end end";
    let file = save_of(
        v1,
        "local e = { hp = 0 } local co = coroutine.create(Entity.ai) coroutine.resume(co, e)
         saved = { co = co, e = e }",
    );
    let v2 = format!("{v1}\nx = 1");
    let declared = [Rename::replaced("Entity.ai", "Entity.hurt")];
    let e = load_into(&v2, &file, Trust::Foreign, &declared).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("suspended in the function Entity.ai (rules.lua:3), which the game declares replaced by Entity.hurt (rules.lua:2), a function with other code"),
        "{msg}"
    );
    let (b, report) = load_into(&v2, &file, Trust::Own, &declared).unwrap();
    let kept: Vec<&str> = report.kept.iter().map(|f| f.place.as_str()).collect();
    assert_eq!(kept, ["Entity.ai"], "{}", report.summary());
    b.exec("coroutine.resume(saved.co)", "=check").unwrap();
    assert_eq!(int(&b, "return saved.e.hp"), 2);
}
