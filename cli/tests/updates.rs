//! Updates that move files (`G.moved`) and checking kept saves before shipping
//! (`luasnap check-save`), on the newcomer team's game (`tests/newcomer-game`): a version 1
//! save written by one process, loaded by others.

mod support;

use std::path::{Path, PathBuf};
use support::{simulate_and_save, simulate_loading, stderr, GameVersions};

fn newcomer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/newcomer-game")
}

/// Copies the files of folder `from` into `to` (made), folders included.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Version 3 in `versions`' folder `name`, `edit` applied to it, `declarations` added to the
/// table its script returns.
fn v3(versions: &GameVersions, name: &str, declarations: &str, edit: impl Fn(&Path)) -> PathBuf {
    let dir = versions.path(name);
    copy_folder(&newcomer().join("v3"), &dir);
    edit(&dir);
    let main = std::fs::read_to_string(dir.join("main.lua")).unwrap();
    let main = main.replace("\nreturn G", &format!("\n{declarations}\nreturn G"));
    assert!(main.contains(declarations));
    std::fs::write(dir.join("main.lua"), main).unwrap();
    dir
}

/// Version 3 reorganised: `src/entity.lua` is `src/entity/init.lua` (the same `require`
/// name), and the folder `lib/` is `vendor/` (its `require`s follow).
fn reorganise(dir: &Path) {
    std::fs::create_dir_all(dir.join("src/entity")).unwrap();
    std::fs::rename(dir.join("src/entity.lua"), dir.join("src/entity/init.lua")).unwrap();
    std::fs::rename(dir.join("lib"), dir.join("vendor")).unwrap();
    for file in [
        "src/entity/init.lua",
        "src/world.lua",
        "src/effects.lua",
        "main.lua",
    ] {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("require \"lib.", "require \"vendor.")).unwrap();
    }
}

const RENAMED: &str = r#"G.renamed = { ["Entity.hurt"] = "Entity.take_damage" }"#;
const MOVED: &str =
    r#"G.moved = { ["src/entity.lua"] = "src/entity/init.lua", ["lib/"] = "vendor/" }"#;

fn digest(out: &std::process::Output) -> i64 {
    assert!(out.status.success(), "{}", stderr(out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["game_digest"].as_i64().expect("a game digest")
}

/// A version 1 save loads under foreign trust into a version 3 that moved a module to
/// another file and a folder elsewhere, once it declares the moves, and plays on exactly as
/// in version 3 with the old layout; without the declaration the refusal says to declare
/// it.
#[test]
fn a_save_loads_into_a_version_that_moved_a_file_and_a_folder_once_declared() {
    let versions = GameVersions::new("moved");
    let save = versions.path("v1.sav");
    simulate_and_save(&newcomer().join("v1"), 120, &save, &["--mode", "full"]);
    let same_layout = v3(&versions, "v3", RENAMED, |_| {});
    let moved = v3(
        &versions,
        "v3-moved",
        &format!("{RENAMED}\n{MOVED}"),
        reorganise,
    );
    let undeclared = v3(&versions, "v3-undeclared", RENAMED, reorganise);
    let more = ["--frames", "60", "--mode", "full", "--json"];

    let expected = digest(&simulate_loading(&same_layout, &save, &more));
    let out = simulate_loading(&moved, &save, &more);
    let e = stderr(&out);
    assert_eq!(digest(&out), expected, "{e}");
    assert!(
        e.contains("src/entity.lua to src/entity/init.lua")
            && e.contains("lib/class.lua to vendor/class.lua")
            && e.contains("files moved as the game declares")
            && e.contains("1 renamed as the game declares (Entity.hurt as Entity.take_damage (src/entity.lua:"),
        "{e}"
    );

    let out = simulate_loading(&undeclared, &save, &more);
    let e = stderr(&out);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains("no file") && e.contains("G.moved = { ["),
        "the refusal says to declare the move: {e}"
    );
}

/// `simulate GAME` with no save: the game's start, where declarations are checked.
fn start(game: &Path) -> std::process::Output {
    support::luasnap()
        .arg("simulate")
        .arg(game)
        .args(["--frames", "1", "--mode", "full", "--second-process", "off"])
        .output()
        .unwrap()
}

/// A move to a file the game lacks, from a file it still has, a cycle and a malformed path
/// fail as the game starts, naming the declaration; the declared game starts.
#[test]
fn mistakes_in_g_moved_fail_as_the_game_starts() {
    let versions = GameVersions::new("moved-mistakes");
    let good = v3(&versions, "good", MOVED, reorganise);
    assert!(start(&good).status.success(), "{}", stderr(&start(&good)));
    for (name, declaration, says) in [
        (
            "typo",
            r#"G.moved = { ["src/entity.lua"] = "src/entity/int.lua", ["lib/"] = "vendor/" }"#,
            r#"G.moved["src/entity.lua"] = "src/entity/int.lua" moves it to src/entity/int.lua, no Lua file of the game"#,
        ),
        (
            "still-there",
            r#"G.moved = { ["src/world.lua"] = "src/entity/init.lua", ["lib/"] = "vendor/" }"#,
            "names src/world.lua, which this version of the game still has",
        ),
        (
            "cycle",
            r#"G.moved = { ["a.lua"] = "b.lua", ["b.lua"] = "a.lua" }"#,
            "cycle",
        ),
        (
            "chunk-name",
            r#"G.moved = { ["@src/entity.lua"] = "src/entity/init.lua" }"#,
            "without the '@'",
        ),
        (
            "not-a-table",
            r#"G.moved = "src/entity/init.lua""#,
            "G.moved must be a table",
        ),
    ] {
        let dir = v3(&versions, name, declaration, reorganise);
        let out = start(&dir);
        let e = stderr(&out);
        assert!(!out.status.success(), "{name}: {e}");
        assert!(e.contains(says), "{name}: {e}");
    }
}

/// `check-save` names every saved function the version lacks at once (exit status 1), in
/// text and JSON, and reports what the loads did once the game declares them (status 0).
#[test]
fn check_save_names_every_function_a_version_lacks_before_it_ships() {
    let versions = GameVersions::new("check-save");
    let save = versions.path("v1.sav");
    simulate_and_save(&newcomer().join("v1"), 120, &save, &["--mode", "full"]);
    let scores = |dir: &Path| {
        let path = dir.join("src/world.lua");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("function World:scoreboard()", "function World:scores()");
        std::fs::write(&path, text).unwrap();
    };
    let undeclared = v3(&versions, "undeclared", "", scores);
    let declared = v3(
        &versions,
        "declared",
        r#"G.renamed = { ["Entity.hurt"] = "Entity.take_damage", ["World.scoreboard"] = "World.scores" }"#,
        scores,
    );
    let check = |game: &Path, json: bool| {
        let mut cmd = support::luasnap();
        cmd.arg("check-save").arg(game).arg(&save).arg(&save);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };

    let out = check(&undeclared, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(
        text.contains("refused: cannot load: the save holds 2 functions this version of the game no longer has")
            && text.contains("Entity.hurt (@src/entity.lua:27)")
            && text.contains("World.scoreboard (@src/world.lua:60)")
            && text.contains("--trust own")
            && text.contains("0 of 2 save-games load"),
        "{text}"
    );
    let out = check(&undeclared, true);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["refused"], 2);
    assert_eq!(v["saves"][0]["loads"], false);
    assert!(v["saves"][0]["error"]
        .as_str()
        .unwrap()
        .contains("World.scoreboard"));

    let out = check(&declared, true);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["refused"], 0);
    let renamed: Vec<&str> = v["saves"][1]["renamed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        renamed
            .iter()
            .any(|r| r.starts_with("Entity.hurt as Entity.take_damage"))
            && renamed
                .iter()
                .any(|r| r.starts_with("World.scoreboard as World.scores")),
        "{renamed:?}"
    );
    assert!(!v["saves"][1]["rebound"].as_array().unwrap().is_empty());
}
