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

/// Differences within a table are listed in key order, numbers by value (`[2]` before
/// `[10]`, found by a newcomer), then strings; entries on one side only come after every
/// other difference (`value_diff_keys.rs`), in the same order.
#[test]
fn differences_are_listed_in_key_order_numbers_by_value() {
    let paths = |text: &[String]| -> Vec<String> {
        text.iter()
            .map(|t| t.split(':').next().unwrap().to_string())
            .collect()
    };
    let text = diff(
        "t = {} for i = 1, 12 do t[i] = i end t[2.5] = 0 t[-3] = 0 t.b = 1 t.a = 1",
        "t = {} for i = 1, 12 do t[i] = -i end t[2.5] = 1 t[-3] = 1 t.b = 2 t.a = 2",
    );
    assert_eq!(
        paths(&text),
        ["t[-3]", "t[1]", "t[2]", "t[2.5]", "t[3]", "t[4]", "t[5]", "t[6]", "t[7]", "t[8]"],
        "{text:#?}"
    );
    let text = diff(
        "t = { [10] = 1, [2] = 1, b = 1, a = 1 }",
        "t = { [1e300] = 1, [3] = 1, [-0.5] = 1 }",
    );
    assert_eq!(
        paths(&text),
        ["t[2]", "t[10]", "t.a", "t.b", "t[-0.5]", "t[3]", "t[1e300]"],
        "{text:#?}"
    );
}
