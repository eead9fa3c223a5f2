//! The value diff of games whose sets are keyed by entity tables (`world.all[e] = true`): an
//! entity keyed on both sides is paired by its key identity and compared field by field under
//! `@key`; key objects are named by a path or by identity with their `id`; membership lines
//! come after value differences.

use luasnap::bridge::Vm;

fn vm() -> Vm {
    Vm::builder()
        .capacity(64 << 20)
        .deterministic(3)
        .build()
        .unwrap()
}

/// A world of `n` entities in a set keyed by them; `after` runs on it.
fn world(n: usize, after: &str) -> Vm {
    let v = vm();
    let script = format!(
        "world = {{ all = {{}} }}
         for i = 1, {n} do
           local e = {{ id = i, hp = 10, pos = {{ x = i, y = 0 }} }}
           world.all[e] = true
         end
         {after}"
    );
    v.exec(&script, "world").unwrap();
    v
}

fn diff(a: &mut Vm, b: &mut Vm, limit: usize) -> (Vec<String>, bool) {
    let d = a
        .value_graph()
        .unwrap()
        .diff(&b.value_graph().unwrap(), limit);
    assert!(!d.equal);
    // Identities as `#N`: their numbers depend on the keys the VM's setup made first.
    let ident = |t: String| {
        let mut out = String::new();
        let mut rest = t.as_str();
        while let Some(at) = rest.find('#') {
            out.push_str(&rest[..=at]);
            let digits = rest[at + 1..].trim_start_matches(|c: char| c.is_ascii_digit());
            if digits.len() < rest[at + 1..].len() {
                out.push('N');
            }
            rest = digits;
        }
        out + rest
    };
    (
        d.differences.iter().map(|x| ident(x.to_string())).collect(),
        d.truncated,
    )
}

const HURT_3: &str = "for e in pairs(world.all) do
    if e.id == 3 then e.hp = 4; e.pos.x = 30 end
  end";

#[test]
fn an_entity_keyed_on_both_sides_is_compared_field_by_field() {
    let (mut a, mut b) = (world(5, ""), world(5, HURT_3));
    let (text, truncated) = diff(&mut a, &mut b, 10);
    assert!(!truncated);
    assert_eq!(
        text,
        [
            "world.all[table #N {id=3}]@key.hp: 10 vs 4",
            "world.all[table #N {id=3}]@key.pos.x: 3 vs 30",
        ],
        "{text:#?}"
    );
}

#[test]
fn a_key_reachable_as_a_value_is_named_by_its_path() {
    let list = "workers = {} for e in pairs(world.all) do workers[e.id] = e end ";
    let (mut a, mut b) = (world(4, list), world(4, &format!("{list} {HURT_3}")));
    let (text, _) = diff(&mut a, &mut b, 10);
    // Reported once, at its shortest path (the list), and named by it in the set.
    assert_eq!(
        text,
        ["workers[3].hp: 10 vs 4", "workers[3].pos.x: 3 vs 30"]
    );
    // An entity only on one side: a membership line naming it by its path.
    let mut c = world(4, &format!("{list} world.all[workers[2]] = nil"));
    let (text, _) = diff(&mut a, &mut c, 10);
    assert_eq!(
        text,
        ["world.all[workers[2] {id=2}]: true vs (absent)"],
        "{text:#?}"
    );
}

#[test]
fn membership_lines_come_after_value_differences_and_stay_bounded() {
    // Left: 40 entities, the third hurt. Right: the first 35 alike, the third unhurt.
    let (mut a, mut b) = (
        world(40, HURT_3),
        world(
            5,
            "for i = 6, 35 do world.all[{ id = i, hp = 10, pos = { x = i, y = 0 } }] = true end",
        ),
    );
    let (text, truncated) = diff(&mut a, &mut b, 4);
    assert!(truncated);
    assert_eq!(text.len(), 4, "{text:#?}");
    assert!(text[0].contains("{id=3}]@key.hp: 4 vs 10"), "{text:#?}");
    assert!(text[1].contains("{id=3}]@key.pos.x: 30 vs 3"), "{text:#?}");
    assert!(text[2].ends_with("true vs (absent)"), "{text:#?}");
    let (all, truncated) = diff(&mut a, &mut b, 1000);
    assert!(!truncated);
    // Entities 36..40 only on the left.
    let members = all.iter().filter(|t| t.contains("(absent)")).count();
    assert_eq!(members, 5, "{all:#?}");
    let first_member = all.iter().position(|t| t.contains("(absent)")).unwrap();
    assert!(
        all[first_member..].iter().all(|t| t.contains("(absent)")),
        "{all:#?}"
    );
}

#[test]
fn equal_entities_pair_by_content_and_an_extra_one_is_one_line() {
    // Equal entities pair by content (equal states are equal); one more is one line.
    let mut a = world(3, "");
    let mut b = world(3, "");
    let mut a2 = world(3, "world.all[{ id = 9 }] = true");
    let d = a.value_graph().unwrap().diff(&b.value_graph().unwrap(), 10);
    assert!(d.equal);
    let (text, _) = diff(&mut a, &mut a2, 10);
    assert_eq!(text, ["world.all[table #N {id=9}]: (absent) vs true"]);
}

/// Keys on one side only are counted per table, all of them, past the limit of the lines
/// listed, and the count is in the order the walk met the tables.
#[test]
fn keys_on_one_side_are_counted_per_table_past_the_limit() {
    let mut a = world(50, "extra = { 1, 2, 3 }");
    let mut b = world(
        50,
        "for e in pairs(world.all) do if e.id <= 30 then world.all[e] = nil end end
         for i = 1, 5 do world.all[{ id = 100 + i, hp = 1, pos = { x = 0, y = 0 } }] = true end
         extra = { 1 }",
    );
    let d = a.value_graph().unwrap().diff(&b.value_graph().unwrap(), 4);
    assert!(d.truncated);
    assert!(d.differences.len() <= 4);
    let counts: Vec<String> = d.keys_on_one_side.iter().map(|k| k.to_string()).collect();
    assert!(
        counts.contains(&"world.all: 30 keys only on the left, 5 only on the right".to_string()),
        "{counts:?}"
    );
    assert!(
        counts.contains(&"extra: 2 keys only on the left".to_string()),
        "{counts:?}"
    );
}

#[test]
fn library_functions_as_keys_pair_by_name() {
    // An outside tester's case: one side lacks `set[assert]`; C function keys all looked
    // alike, so the others paired with whichever came first (`set[error]: 2 vs 8`).
    let script = |after: &str| {
        let v = vm();
        v.exec(
            format!(
                "local fns = {{ assert, error, ipairs, pairs, print, rawget, rawset, select,
                   tonumber, tostring, type, next, math.floor, math.abs, string.format }}
                 world = {{ set = {{}} }}
                 for i, f in ipairs(fns) do world.set[f] = i end
                 {after}"
            ),
            "fns",
        )
        .unwrap();
        v
    };
    let (mut a, mut b) = (script(""), script("world.set[assert] = nil"));
    let (lines, _) = diff(&mut a, &mut b, 20);
    assert_eq!(lines, ["world.set[assert]: 1 vs (absent)"], "{lines:?}");
    // Swapped values: each key with its own value, named by the function's name where no
    // value path reaches it (`ipairs`'s iterator).
    let (mut a, mut b) = (
        script("world.set[(ipairs({}))] = 16 world.set[assert] = 100"),
        script("world.set[(ipairs({}))] = 17 world.set[error] = 100"),
    );
    let (lines, _) = diff(&mut a, &mut b, 20);
    assert_eq!(
        lines,
        [
            "world.set[C function ipairs#aux]: 16 vs 17",
            "world.set[assert]: 100 vs 1",
            "world.set[error]: 2 vs 100",
        ],
        "{lines:?}"
    );
}
