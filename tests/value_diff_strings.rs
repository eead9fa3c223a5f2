//! The value diff shows differing strings where they differ: a window around the first
//! differing byte with its offset, binary bytes as `\xNN`.

use luasnap::bridge::Vm;

fn vm() -> Vm {
    Vm::builder()
        .capacity(64 << 20)
        .deterministic(3)
        .build()
        .unwrap()
}

fn diff(setup_a: &str, setup_b: &str) -> Vec<String> {
    let (mut a, mut b) = (vm(), vm());
    a.exec(setup_a, "a").unwrap();
    b.exec(setup_b, "b").unwrap();
    let d = a.value_graph().unwrap().diff(&b.value_graph().unwrap(), 10);
    assert!(!d.equal);
    d.differences.iter().map(|x| x.to_string()).collect()
}

#[test]
fn long_strings_show_the_bytes_around_the_first_difference() {
    let text = diff(
        "s = string.rep('=', 200) .. 'LEFT' .. string.rep('=', 51)",
        "s = string.rep('=', 200) .. 'RIGHT' .. string.rep('=', 50)",
    );
    assert_eq!(text.len(), 1, "{text:#?}");
    let t = &text[0];
    assert!(t.starts_with("s: ...\"===================="), "{t}");
    assert!(t.contains("LEFT") && t.contains("RIGHT"), "{t}");
    assert!(
        t.contains("(strings of 255 and 255 bytes, first differing at byte 200)"),
        "{t}"
    );
}

#[test]
fn binary_strings_are_escaped_not_replaced() {
    let text = diff("s = '\\0\\1\\255abc\\n'", "s = '\\0\\1\\254abc\\n'");
    assert_eq!(
        text,
        vec![
            "s: \"\\x00\\x01\\xFFabc\\n\" vs \"\\x00\\x01\\xFEabc\\n\" \
             (strings of 7 and 7 bytes, first differing at byte 2)"
        ]
    );
    // UTF-8 stays readable; a string against another type is shown whole up to 57 bytes.
    let text = diff("s = 'héllo'", "s = 42");
    assert_eq!(text, vec!["s: \"héllo\" vs 42"]);
}
