//! Whole-game saves across trust levels: the library's own bindings (`_G.string`,
//! `_G.collectgarbage`, `package.loaded.os`, ...) are kept from the loading VM, so a foreign
//! load restores an ordinary game, while a denied permanent anywhere else is still refused.
//! And values a save cannot hold get an error that says what to do.

use luasnap::bridge::persist::{LoadError, SaveError, Trust};
use luasnap::bridge::{Value, Vm};

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder()
        .capacity(256 * MIB)
        .deterministic(11)
        .build()
        .unwrap()
}

const GAME: &str = r#"
    state = { frame = 0, names = { "a", "b" }, pos = { x = 1.5, y = -2 } }
    function step()
        state.frame = state.frame + 1
        state.pos.x = state.pos.x + math.floor(state.frame / 2)
        table.insert(state.names, string.format("n%d", state.frame))
        collectgarbage("step")
    end
    for _ = 1, 5 do step() end
"#;

fn check(vm: &Vm, expr: &str) {
    let out = vm
        .exec(format!("return {expr}"), "check")
        .unwrap_or_else(|e| panic!("{expr}: {e}"));
    assert_eq!(out, vec![Value::Boolean(true)], "check failed: {expr}");
}

#[test]
fn a_foreign_load_restores_an_ordinary_game_and_keeps_the_library() {
    let a = vm();
    a.exec(GAME, "game").unwrap();
    let save = a.save_game().unwrap();
    let mut b = vm();
    b.exec(GAME, "game").unwrap();
    b.exec("for _ = 1, 7 do step() end extra = true", "diverge")
        .unwrap();
    b.load_game(&save, Trust::Foreign)
        .unwrap_or_else(|e| panic!("{e}"));
    check(
        &b,
        "state.frame == 5 and #state.names == 7 and extra == nil",
    );
    check(
        &b,
        "type(collectgarbage) == 'function' and type(string.format) == 'function' \
         and (package == nil or package.loaded.string == string) and _G._G == _G",
    );
    // The game goes on in the loading VM exactly as in the saving one.
    a.exec("for _ = 1, 3 do step() end", "go").unwrap();
    b.exec("for _ = 1, 3 do step() end", "go").unwrap();
    let digest = "return state.frame, state.pos.x, #state.names, state.names[#state.names]";
    assert_eq!(a.exec(digest, "d").unwrap(), b.exec(digest, "d").unwrap());
}

fn refused(code: &str, denied: &str) {
    let a = vm();
    a.exec(code, "game").unwrap();
    let save = a.save_game().unwrap();
    let mut b = vm();
    b.exec(code, "game").unwrap();
    match b.load_game(&save, Trust::Foreign) {
        Err(LoadError::Refused { message, .. }) => assert!(
            message.contains(&format!("{denied:?}")),
            "{code}: {message}"
        ),
        other => panic!("{code}: a denied permanent got through: {other:?}"),
    }
    // An own load of the same save is fine.
    b.load_game(&save, Trust::Own)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_denied_permanent_anywhere_but_its_own_global_is_still_refused() {
    refused("my_gc = collectgarbage", "collectgarbage");
    refused("state = { gc = collectgarbage }", "collectgarbage");
    refused(
        "local gc = collectgarbage function f() return gc end",
        "collectgarbage",
    );
    refused(
        "state = setmetatable({}, { __index = collectgarbage })",
        "collectgarbage",
    );
    // Swapped: each name holds another library value.
    refused(
        "collectgarbage, tostring = tostring, collectgarbage",
        "collectgarbage",
    );
}

#[test]
fn a_kept_name_only_keeps_what_the_loading_vm_itself_binds_there() {
    // A forged root: kept names the loading VM binds to something else (or not at all) stay
    // absent; a kept list that is not an array of names is refused.
    let a = vm();
    a.exec(
        "fake = { globals = { x = 1 }, globals_kept = { 'collectgarbage', 'mine', 'nothing' } }
         bad = { globals = {}, globals_kept = { 'print', 7 } }
         bad2 = { globals = {}, globals_kept = { [1] = 'print', z = 'tostring' } }",
        "forge",
    )
    .unwrap();
    let fake = a.persist("fake").unwrap();
    let mut b = vm();
    b.exec("mine = 5", "host").unwrap();
    b.load_game(&fake, Trust::Foreign)
        .unwrap_or_else(|e| panic!("{e}"));
    check(
        &b,
        // Only the save's globals now: no `type`.
        "x == 1 and collectgarbage ~= nil and mine == nil and nothing == nil and print == nil",
    );
    for forged in ["bad", "bad2"] {
        let bytes = a.persist(forged).unwrap();
        let mut c = vm();
        let err = c.load_game(&bytes, Trust::Foreign).unwrap_err();
        assert!(err.to_string().contains("kept library bindings"), "{err}");
        // The failed load left the VM's globals alone.
        check(&c, "type(print) == 'function'");
    }
}

#[test]
fn a_gmatch_iterator_in_the_state_gets_an_error_saying_what_to_do() {
    let a = vm();
    a.exec(
        "state = { words = string.gmatch('one two three', '%a+') } state.words()",
        "game",
    )
    .unwrap();
    for r in [a.save_game(), a.persist("state")] {
        match r {
            Err(SaveError::Unpersistable { message }) => {
                assert!(
                    message.contains("a string.gmatch iterator cannot be saved")
                        && message.contains("iterate it to completion")
                        && message.contains("words"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
