//! The Rust API: typed conversions, paths, handles, natives calling back, loading.

use luasnap::bridge::{
    Function, LuaTable, NativeError, PlainData, Table, ThreadStatus, UserData, Value, Values, Vm,
    VmError,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder()
        .capacity(256 * MIB)
        .deterministic(7)
        .build()
        .unwrap()
}

/// Reads the same state through handles, then the same way again: the anchor stack is back
/// to the same bytes each time, whatever it held, and nothing stays anchored.
#[test]
fn handles_leave_the_arena_as_they_found_it() {
    let vm = vm();
    vm.exec(
        "world = { players = { { hp = 1 }, { hp = 2 } } }
         probe = setmetatable({}, { __mode = 'k' })",
        "setup",
    )
    .unwrap();
    let read = |i: i64| {
        let t = vm.table("world.players").unwrap();
        let p = t.table(i).unwrap();
        let _copy = p.clone();
        p.get::<_, i64>("hp").unwrap()
    };
    assert_eq!(read(1), 1);
    let _ = vm.get::<i64>("world.players[1].hp").unwrap();
    let first = vm.digest();
    assert_eq!(read(2), 2);
    let _ = vm.get::<i64>("world.players[1].hp").unwrap();
    assert_eq!(
        vm.digest(),
        first,
        "the anchor stack depends on what it held"
    );
    // A dropped handle no longer keeps its object alive.
    {
        let t = vm.create_table().unwrap();
        vm.table("probe").unwrap().set(&t, true).unwrap();
    }
    vm.gc_collect().unwrap();
    assert_eq!(
        vm.exec("return next(probe)", "probe").unwrap(),
        vec![Value::Nil]
    );
}

#[test]
fn integers_of_every_width_are_range_checked() {
    let vm = vm();
    vm.exec(
        "big = math.maxinteger; neg = -1; half = 2.5; whole = 3.0; huge = 2^80; s = '7'",
        "setup",
    )
    .unwrap();
    assert_eq!(vm.get::<i64>("big").unwrap(), i64::MAX);
    assert_eq!(vm.get::<u64>("big").unwrap(), i64::MAX as u64);
    assert_eq!(vm.get::<i8>("neg").unwrap(), -1);
    assert_eq!(vm.get::<u8>("whole").unwrap(), 3);
    assert_eq!(vm.get::<f32>("half").unwrap(), 2.5);
    assert_eq!(vm.get::<i128>("neg").unwrap(), -1);
    for (path, err) in [
        ("big", vm.get::<i32>("big").unwrap_err()),
        ("neg", vm.get::<u8>("neg").unwrap_err()),
        ("neg", vm.get::<usize>("neg").unwrap_err()),
        ("half", vm.get::<u8>("half").unwrap_err()),
        ("huge", vm.get::<i64>("huge").unwrap_err()),
        ("s", vm.get::<i64>("s").unwrap_err()),
        ("s", vm.get::<bool>("s").unwrap_err()),
        ("nothing", vm.get::<f64>("nothing").unwrap_err()),
    ] {
        match &err {
            VmError::Type { path: p, .. } => assert_eq!(p, path),
            other => panic!("{path}: {other:?}"),
        }
    }
    let msg = vm.get::<u8>("half").unwrap_err().to_string();
    assert!(
        msg.contains("'half'") && msg.contains("u8") && msg.contains("2.5"),
        "{msg}"
    );
    // Into Lua: u64 above i64::MAX does not fit a Lua integer.
    assert!(matches!(
        vm.set("x", u64::MAX),
        Err(VmError::Conversion { .. })
    ));
    vm.set("x", u64::MAX / 2).unwrap();
    assert_eq!(vm.get::<u64>("x").unwrap(), u64::MAX / 2);
}

#[test]
fn containers_convert_both_ways_and_errors_name_the_position() {
    let vm = vm();
    vm.exec(
        "cfg = { tags = {'a', 'b'}, hp = { ann = 3, bo = 5 }, grid = { {1, 2}, {3, 4.5} },
                 holes = { 1, nil, 3 }, mixed = { 1, 2, x = 3 }, bytes = '\\255' }",
        "setup",
    )
    .unwrap();
    assert_eq!(vm.get::<Vec<String>>("cfg.tags").unwrap(), ["a", "b"]);
    let hp: HashMap<String, u32> = vm.get("cfg.hp").unwrap();
    assert_eq!(hp["bo"], 5);
    let sorted: BTreeMap<String, i64> = vm.get("cfg.hp").unwrap();
    assert_eq!(sorted.keys().collect::<Vec<_>>(), ["ann", "bo"]);
    assert_eq!(
        vm.get::<Vec<Vec<f64>>>("cfg.grid").unwrap(),
        [[1.0, 2.0], [3.0, 4.5]]
    );
    assert_eq!(
        vm.get::<Vec<Option<i64>>>("cfg.holes").unwrap(),
        [Some(1), None, Some(3)]
    );
    let err = vm.get::<Vec<Vec<i64>>>("cfg.grid").unwrap_err();
    match &err {
        VmError::Type { path, .. } => assert_eq!(path, "cfg.grid[2][2]"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        vm.get::<Vec<i64>>("cfg.mixed"),
        Err(VmError::Type { path, .. }) if path == "cfg.mixed.x"
    ));
    assert!(matches!(
        vm.get::<HashMap<String, String>>("cfg.hp"),
        Err(VmError::Type { path, .. }) if path.starts_with("cfg.hp.")
    ));
    assert!(matches!(
        vm.get::<String>("cfg.bytes"),
        Err(VmError::Type { reason: Some(r), .. }) if r.contains("UTF-8")
    ));
    // Back into Lua.
    let mut m = HashMap::new();
    m.insert("speed".to_string(), vec![1u8, 2, 3]);
    vm.set("from_rust", m).unwrap();
    assert_eq!(vm.get::<u8>("from_rust.speed[3]").unwrap(), 3);
    vm.set("opt", Some("x")).unwrap();
    vm.set("none", None::<i32>).unwrap();
    assert_eq!(
        vm.get::<Option<String>>("opt").unwrap().as_deref(),
        Some("x")
    );
    assert_eq!(vm.get::<Option<String>>("none").unwrap(), None);
    // Debug shows strings as text.
    assert_eq!(format!("{:?}", Value::from("hi")), "String(\"hi\")");
}

#[test]
fn calls_take_tuples_and_return_tuples() {
    let vm = vm();
    vm.exec(
        "function divmod(a, b) return a // b, a % b end
         function echo(...) return ... end
         function count(...) return select('#', ...) end",
        "setup",
    )
    .unwrap();
    let (q, r): (i64, i64) = vm.call("divmod", (17, 5)).unwrap();
    assert_eq!((q, r), (3, 2));
    assert_eq!(vm.call::<usize>("count", ()).unwrap(), 0);
    assert_eq!(vm.call::<usize>("count", (1, "two", 3.0, true)).unwrap(), 4);
    // A Vec is one table argument; a slice of Values is several arguments.
    assert_eq!(vm.call::<usize>("count", vec![1, 2, 3]).unwrap(), 1);
    assert_eq!(
        vm.call::<usize>("count", &[Value::Nil, Value::Nil][..])
            .unwrap(),
        2
    );
    let Values(all) = vm.call("echo", (1, "a")).unwrap();
    assert_eq!(all, vec![Value::Integer(1), Value::from("a")]);
    let (a, b, c): (i64, Option<i64>, Option<i64>) = vm.call("echo", 1).unwrap();
    assert_eq!((a, b, c), (1, None, None));
    // Result conversion errors name the function and the result.
    match vm.call::<(i64, String)>("divmod", (7, 2)) {
        Err(VmError::Type { path, .. }) => assert_eq!(path, "divmod: result #2"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn paths_parse_integer_and_quoted_keys_and_name_what_is_missing() {
    let vm = vm();
    vm.exec(
        r#"world = { players = { { hp = 10, name = "ann" } }, ["key with space"] = 1, [-2] = "neg" }
           function world.players:first() return self[1].name end
           obj = setmetatable({}, { __index = function(_, k) return k .. "!" end })"#,
        "setup",
    )
    .unwrap();
    assert_eq!(vm.get::<i64>("world.players[1].hp").unwrap(), 10);
    assert_eq!(vm.get::<i64>(r#"world["key with space"]"#).unwrap(), 1);
    assert_eq!(vm.get::<String>("world[-2]").unwrap(), "neg");
    assert_eq!(vm.get::<String>("obj.anything").unwrap(), "anything!");
    assert_eq!(vm.call::<String>("world.players:first", ()).unwrap(), "ann");
    // A missing table on the way is NotFound naming the prefix.
    match vm.get::<Value>("world.nope.x") {
        Err(VmError::NotFound { path, found, .. }) => {
            assert_eq!((path.as_str(), found.as_str()), ("world.nope", "nil"))
        }
        other => panic!("{other:?}"),
    }
    match vm.call::<()>("world.players[3]:hit", ()) {
        Err(VmError::NotFound { path, .. }) => assert_eq!(path, "world.players[3]"),
        other => panic!("{other:?}"),
    }
    match vm.call::<()>("world.players:nope", ()) {
        Err(VmError::NotFound { path, expected, .. }) => {
            assert_eq!(
                (path.as_str(), expected),
                ("world.players:nope", "function")
            )
        }
        other => panic!("{other:?}"),
    }
    // A last key that is missing reads as nil.
    assert_eq!(
        vm.get::<Option<i64>>("world.players[1].mana").unwrap(),
        None
    );
    // Writes through paths.
    vm.set("world.players[1].hp", 11).unwrap();
    vm.set(r#"world["new key"]"#, "v").unwrap();
    assert_eq!(vm.get::<i64>("world.players[1].hp").unwrap(), 11);
    assert_eq!(vm.get::<String>("world['new key']").unwrap(), "v");
    assert!(matches!(
        vm.set("world.none.x", 1),
        Err(VmError::NotFound { path, .. }) if path == "world.none"
    ));
    // Parse errors point at the character.
    for (path, at) in [("world..x", 6), ("world[1", 7), ("world[x]", 6), ("a b", 1)] {
        match vm.get::<Value>(path) {
            Err(VmError::BadPath { at: got, .. }) => assert_eq!(got, at, "{path}"),
            other => panic!("{path}: {other:?}"),
        }
    }
}

#[test]
fn tables_are_read_lazily_through_handles() {
    let vm = vm();
    vm.exec(
        "world = { players = { { name = 'ann', hp = 3 }, { name = 'bo', hp = 5 } }, n = 0 }
         function world:add(k) self.n = self.n + k return self.n end",
        "setup",
    )
    .unwrap();
    let world = vm.table("world").unwrap();
    let players = world.table("players").unwrap();
    assert_eq!(players.len().unwrap(), 2);
    assert_eq!(world.get_path::<String>("players[2].name").unwrap(), "bo");
    let names: Vec<String> = players
        .sequence::<Table>()
        .unwrap()
        .iter()
        .map(|p| p.get("name").unwrap().as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ann", "bo"]);
    let pairs: Vec<(i64, Table)> = players.pairs().unwrap();
    assert_eq!(pairs.len(), 2);
    // Set a handle into another table: the Lua object itself is stored.
    let ann = players.table(1).unwrap();
    world.set("leader", &ann).unwrap();
    ann.set("hp", 30).unwrap();
    assert_eq!(vm.get::<i64>("world.leader.hp").unwrap(), 30);
    assert_eq!(world.call_method::<i64>("add", 4).unwrap(), 4);
    assert_eq!(vm.call::<i64>("world:add", 1).unwrap(), 5);
    // A handle of the wrong type is refused with what it is.
    assert!(matches!(
        vm.table("world.n"),
        Err(VmError::NotFound { path, found, .. }) if path == "world.n" && found == "number"
    ));
    // The globals and a new table.
    let g = vm.globals();
    let t: LuaTable = vm.create_table().unwrap();
    t.set(1, "x").unwrap();
    g.set("made", &t).unwrap();
    assert_eq!(vm.get::<Vec<String>>("made").unwrap(), ["x"]);
}

#[test]
fn functions_come_from_any_value_and_can_be_passed_back() {
    let vm = vm();
    vm.exec(
        "handlers = { on_hit = function(x) return x * 2 end }
         function make_adder(n) return function(x) return x + n end end
         function apply(f, x) return f(x) end",
        "setup",
    )
    .unwrap();
    let on_hit: Function = vm.table("handlers").unwrap().function("on_hit").unwrap();
    assert_eq!(on_hit.call::<i64>(21).unwrap(), 42);
    let add5 = vm
        .function("make_adder")
        .unwrap()
        .call::<Values>(5)
        .map(|_| ())
        .and_then(|_| vm.load("return make_adder(5)", "mk"))
        .unwrap()
        .into_function()
        .unwrap();
    assert_eq!(add5.call::<i64>(1).unwrap(), 6);
    assert_eq!(vm.call::<i64>("apply", (&add5, 10)).unwrap(), 15);
    // A handle of another VM is refused.
    let other = self::vm();
    other.exec("function f() end", "o").unwrap();
    let foreign = other.function("f").unwrap();
    assert!(matches!(
        vm.call::<()>("apply", (&foreign, 1)),
        Err(VmError::ForeignHandle)
    ));
}

#[test]
fn coroutines_resume_from_rust() {
    let vm = vm();
    vm.exec(
        "gen = coroutine.create(function(n)
             for i = 1, n do coroutine.yield(i, i * i) end
             return 'done'
         end)
         bad = coroutine.create(function() error('boom') end)",
        "setup",
    )
    .unwrap();
    let gen = vm.thread("gen").unwrap();
    assert_eq!(gen.status(), ThreadStatus::Resumable);
    assert_eq!(gen.resume::<(i64, i64)>(2).unwrap(), (1, 1));
    assert_eq!(gen.resume::<(i64, i64)>(()).unwrap(), (2, 4));
    assert_eq!(gen.resume::<String>(()).unwrap(), "done");
    assert_eq!(gen.status(), ThreadStatus::Dead);
    assert!(matches!(
        gen.resume::<()>(()),
        Err(VmError::NotResumable { status: "dead" })
    ));
    match vm.thread("bad").unwrap().resume::<()>(()) {
        Err(VmError::Lua { message, .. }) => assert!(message.contains("boom"), "{message}"),
        other => panic!("{other:?}"),
    }
    // The VM is usable afterwards.
    assert_eq!(
        vm.exec("return 1", "after").unwrap(),
        vec![Value::Integer(1)]
    );
}

#[test]
fn natives_call_back_into_lua() {
    let vm = Vm::builder()
        .capacity(256 * MIB)
        .native("host.sort_by", |call| {
            let mut items: Vec<Value> = call.get(0)?;
            let mut err = None;
            items.sort_by(
                |a, b| match call.call_function::<bool>(1, (a.clone(), b.clone())) {
                    Ok(true) => std::cmp::Ordering::Less,
                    Ok(false) => std::cmp::Ordering::Greater,
                    Err(e) => {
                        err.get_or_insert(e);
                        std::cmp::Ordering::Equal
                    }
                },
            );
            if let Some(e) = err {
                return Err(e);
            }
            call.ret(Table::from_array(items));
            Ok(())
        })
        .native("host.emit", |call| {
            // An event handler that itself calls a native.
            let n: i64 = call.call_function(0, "ping")?;
            call.ret(n + 1);
            Ok(())
        })
        .native("host.twice", |call| {
            let x: i64 = call.get(0)?;
            call.ret(x * 2);
            Ok(())
        })
        .build()
        .unwrap();
    let out = vm
        .exec(
            "local t = host.sort_by({3, 1, 2}, function(a, b) return a > b end)
             return t[1], t[2], t[3]",
            "sort",
        )
        .unwrap();
    assert_eq!(
        out,
        vec![Value::Integer(3), Value::Integer(2), Value::Integer(1)]
    );
    let out = vm
        .exec(
            "return host.emit(function(what) return host.twice(#what) end)",
            "emit",
        )
        .unwrap();
    assert_eq!(out, vec![Value::Integer(9)]);
    // An error in the callback comes back to the native, which raises it.
    let out = vm
        .exec(
            "return pcall(host.sort_by, {1, 2}, function() error('cmp failed') end)",
            "err",
        )
        .unwrap();
    assert_eq!(out[0], Value::Boolean(false));
    let msg = out[1].as_str().unwrap();
    assert!(
        msg.contains("host.sort_by") && msg.contains("cmp failed"),
        "{msg}"
    );
    // A non-function argument is a bad-argument error.
    let out = vm.exec("return pcall(host.emit, 5)", "notfn").unwrap();
    assert!(
        out[1].as_str().unwrap().contains("function expected"),
        "{out:?}"
    );
    // Yielding across the native is Lua's usual error, not a crash.
    let out = vm
        .exec(
            "local co = coroutine.wrap(function()
                 return host.emit(function() coroutine.yield(1) end)
             end)
             return pcall(co)",
            "yield",
        )
        .unwrap();
    assert_eq!(out[0], Value::Boolean(false), "{out:?}");
}

#[test]
fn a_snapshot_from_a_callback_inside_a_native_is_refused() {
    let cell: Rc<RefCell<Option<Vm>>> = Rc::new(RefCell::new(None));
    let inside = cell.clone();
    let vm = Vm::builder()
        .capacity(256 * MIB)
        .native("host.each", |call| {
            call.call_function::<()>(0, ())?;
            Ok(())
        })
        .native("host.snap", move |_| {
            let mut guard = inside
                .try_borrow_mut()
                .map_err(|_| NativeError::new("the VM is in use"))?;
            let vm = guard.as_mut().ok_or(NativeError::new("no vm"))?;
            vm.snapshot()?;
            Ok(())
        })
        .build()
        .unwrap();
    *cell.borrow_mut() = Some(vm);
    let guard = cell.borrow();
    let vm = guard.as_ref().unwrap();
    let out = vm
        .exec(
            "return pcall(host.each, function() host.snap() end)",
            "snap",
        )
        .unwrap();
    assert_eq!(out[0], Value::Boolean(false));
    assert!(out[1].as_str().unwrap().contains("in use"), "{out:?}");
}

#[test]
fn loading_returns_the_chunk_value_and_require_runs_once() {
    let vm = vm();
    let game = vm
        .load(
            "local G = { n = 0 } function G.step(k) G.n = G.n + k return G.n end return G",
            "game",
        )
        .unwrap()
        .into_table()
        .unwrap();
    assert_eq!(game.call_function::<i64>("step", 2).unwrap(), 2);
    let src = "counter = (counter or 0) + 1 return { name = ... }";
    let a = vm.require("mod.a", src).unwrap().into_table().unwrap();
    let b = vm.require("mod.a", src).unwrap().into_table().unwrap();
    assert_eq!(a.get::<_, String>("name").unwrap(), "mod.a");
    assert_eq!(b.get::<_, String>("name").unwrap(), "mod.a");
    assert_eq!(vm.get::<i64>("counter").unwrap(), 1);
    assert!(vm.require("empty", "x = 1").unwrap().get::<bool>().unwrap());
    match vm.load("return +", "broken") {
        Err(VmError::Lua { kind, message, .. }) => {
            assert_eq!(kind, luasnap::bridge::LuaErrorKind::Syntax);
            assert!(message.contains("broken"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(vm.load("", "nothing").unwrap().type_name(), "nil");
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Vec2 {
    x: f64,
    y: f64,
}

impl PlainData for Vec2 {
    const NAME: &'static str = "Vec2";
}

#[test]
fn userdata_convert_by_value() {
    let vm = Vm::builder()
        .capacity(256 * MIB)
        .userdata::<Vec2>(|_| {})
        .build()
        .unwrap();
    vm.set("p", UserData(Vec2 { x: 1.0, y: 2.0 })).unwrap();
    assert_eq!(
        vm.get::<UserData<Vec2>>("p").unwrap().0,
        Vec2 { x: 1.0, y: 2.0 }
    );
    assert!(matches!(
        vm.get::<UserData<Vec2>>("nothing"),
        Err(VmError::Type { expected, .. }) if expected.contains("Vec2")
    ));
}

#[test]
fn userdata_fields_and_methods_share_index() {
    let vm = Vm::builder()
        .capacity(256 * MIB)
        .native("vec2", |call| {
            call.ret(Value::userdata(Vec2 {
                x: call.number(0)?,
                y: call.number(1)?,
            }));
            Ok(())
        })
        .userdata::<Vec2>(|m| {
            m.field_get("x", |v| v.x);
            m.field_get("y", |v| v.y);
            m.field_set("x", |v, x: f64| {
                v.x = x;
                Ok(())
            });
            m.method("len", |v, call| {
                call.ret((v.x * v.x + v.y * v.y).sqrt());
                Ok(())
            });
            m.method("__tostring", |v, call| {
                call.ret(format!("({}, {})", v.x, v.y));
                Ok(())
            });
        })
        .build()
        .unwrap();
    let out = vm
        .exec(
            "local v = vec2(3, 4)
             local l = v:len()
             v.x = 6
             local _, e1 = pcall(function() v.y = 1 end)
             local _, e2 = pcall(function() v.x = 'a' end)
             return l, v.x, v.y, tostring(v), v.nothing, e1, e2",
            "fields",
        )
        .unwrap();
    assert_eq!(
        &out[..5],
        &[
            5.0.into(),
            6.0.into(),
            4.0.into(),
            "(6, 4)".into(),
            Value::Nil
        ]
    );
    assert!(
        out[5].as_str().unwrap().contains("no field setter"),
        "{out:?}"
    );
    assert!(out[6].as_str().unwrap().contains("field 'x'"), "{out:?}");
    // Both errors point at the assignment in the game's code.
    assert!(out[5].as_str().unwrap().starts_with("fields:4:"), "{out:?}");
    assert!(out[6].as_str().unwrap().starts_with("fields:5:"), "{out:?}");
}

#[test]
fn userdata_metamethods_are_never_silently_replaced() {
    let build = |f: fn(&mut luasnap::bridge::UserDataMethods<Vec2>)| {
        Vm::builder().capacity(64 * MIB).userdata::<Vec2>(f).build()
    };
    for (what, f) in [
        (
            "__index",
            (|m| {
                m.method("__index", |_, _| Ok(()));
                m.method("len", |_, _| Ok(()));
            }) as fn(&mut luasnap::bridge::UserDataMethods<Vec2>),
        ),
        ("__index", |m| {
            m.method("__index", |_, _| Ok(()));
            m.field_get("x", |v| v.x);
        }),
        ("__newindex", |m| {
            m.method("__newindex", |_, _| Ok(()));
            m.field_set("x", |_, _: f64| Ok(()));
        }),
        ("__gc", |m| {
            m.method("__gc", |_, _| Ok(()));
        }),
        ("__name", |m| {
            m.method("__name", |_, _| Ok(()));
        }),
        ("twice", |m| {
            m.field_get("x", |v| v.x);
            m.field_get("x", |v| v.y);
        }),
    ] {
        match build(f) {
            Err(VmError::UserDataConflict { name: "Vec2", .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    // A user __index alone (no methods, no fields) is kept.
    let vm = Vm::builder()
        .capacity(64 * MIB)
        .native("vec2", |call| {
            call.ret(Value::userdata(Vec2 { x: 1.0, y: 2.0 }));
            Ok(())
        })
        .userdata::<Vec2>(|m| {
            m.method("__index", |v, call| {
                let k = call.str(1)?.to_string();
                call.ret(if k == "sum" { v.x + v.y } else { 0.0 });
                Ok(())
            });
        })
        .build()
        .unwrap();
    assert_eq!(
        vm.exec("return vec2().sum", "idx").unwrap(),
        vec![3.0.into()]
    );
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
enum Action {
    Idle,
    Move { dx: i32, dy: i32 },
    Say(String),
    Pair(u8, u8),
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
struct Player {
    name: String,
    hp: u16,
    pos: (f64, f64),
    inventory: Vec<String>,
    stats: BTreeMap<String, i64>,
    pet: Option<String>,
    actions: Vec<Action>,
}

#[test]
fn serde_types_round_trip_and_errors_name_the_field() {
    use luasnap::bridge::Serde;
    let vm = vm();
    let p = Player {
        name: "ann".into(),
        hp: 7,
        pos: (1.5, -2.0),
        inventory: vec!["sword".into(), "key".into()],
        stats: [("str".to_string(), 4), ("dex".to_string(), 9)].into(),
        pet: None,
        actions: vec![
            Action::Idle,
            Action::Move { dx: 1, dy: -1 },
            Action::Say("hi".into()),
            Action::Pair(1, 2),
        ],
    };
    vm.set("p", Serde(p.clone())).unwrap();
    // Lua sees plain tables and strings.
    let out = vm
        .exec(
            "return p.name, p.pos[2], p.inventory[2], p.stats.dex, p.pet, p.actions[1], p.actions[2].Move.dx, p.actions[3].Say",
            "read",
        )
        .unwrap();
    assert_eq!(
        out,
        vec![
            "ann".into(),
            (-2.0).into(),
            "key".into(),
            9.into(),
            Value::Nil,
            "Idle".into(),
            1.into(),
            "hi".into()
        ]
    );
    assert_eq!(vm.get::<Serde<Player>>("p").unwrap().0, p);
    // Lua writes a float holding an integer: it reads back into the integer field.
    vm.exec("p.hp = 8.0; p.pet = 'cat'", "write").unwrap();
    let back = vm.get::<Serde<Player>>("p").unwrap().0;
    assert_eq!((back.hp, back.pet.as_deref()), (8, Some("cat")));
    for (script, path) in [
        ("p.hp = 70000", "p.hp"),
        ("p.hp = 1.5", "p.hp"),
        ("p.inventory[2] = 5", "p.inventory[2]"),
        ("p.actions[2].Move.dy = 'x'", "p.actions[2].Move.dy"),
        ("p.name = nil", "p"),
    ] {
        vm.set("p", Serde(p.clone())).unwrap();
        vm.exec(script, "break").unwrap();
        match vm.get::<Serde<Player>>("p") {
            Err(VmError::Type {
                path: got, reason, ..
            }) => {
                assert_eq!(got, path, "{script}: {reason:?}")
            }
            other => panic!("{script}: {other:?}"),
        }
    }
    vm.set("p", Serde(p.clone())).unwrap();
    vm.exec("p.name = nil", "missing").unwrap();
    let msg = vm.get::<Serde<Player>>("p").unwrap_err().to_string();
    assert!(msg.contains("missing field `name`"), "{msg}");
    // Values that Lua cannot hold are refused going in.
    assert!(matches!(
        vm.set("big", Serde(u64::MAX)),
        Err(VmError::Conversion { .. })
    ));
}

/// A panic inside a native becomes a Lua error carrying its message, and prints nothing: the
/// test re-runs itself in a child process and reads the child's stderr.
#[test]
fn a_panic_in_a_native_prints_no_report() {
    if std::env::var_os("LUASNAP_PANIC_CHILD").is_some() {
        let vm = Vm::builder()
            .capacity(64 * MIB)
            .native("boom", |_| panic!("kaboom {}", 42))
            .build()
            .unwrap();
        let out = vm.exec("return pcall(boom)", "panic").unwrap();
        assert!(out[1].as_str().unwrap().contains("kaboom 42"), "{out:?}");
        eprintln!("child done");
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panic_in_a_native_prints_no_report",
            "--nocapture",
        ])
        .env("LUASNAP_PANIC_CHILD", "1")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "{stderr}");
    assert!(stderr.contains("child done"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_call_result_can_stay_in_lua_as_a_handle() {
    let vm = vm();
    vm.exec(
        "function make(n) local t = { n = n } function t.get() return t.n end return t end
         function nothing() end",
        "setup",
    )
    .unwrap();
    let t = vm
        .function("make")
        .unwrap()
        .call_handle(5)
        .unwrap()
        .into_table()
        .unwrap();
    assert_eq!(t.call_function::<i64>("get", ()).unwrap(), 5);
    t.set("n", 6).unwrap();
    assert_eq!(t.call_function::<i64>("get", ()).unwrap(), 6);
    let none = vm.function("nothing").unwrap().call_handle(()).unwrap();
    assert_eq!(none.type_name(), "nil");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = (String, Value)> {
        prop_oneof![
            "[A-Za-z_][A-Za-z0-9_]{0,6}".prop_map(|s| (format!(".{s}"), Value::from(s.as_str()))),
            any::<i64>().prop_map(|i| (format!("[{i}]"), Value::Integer(i))),
            "[ -~]{0,8}".prop_map(|s| {
                let quoted = s.replace('\\', "\\\\").replace('"', "\\\"");
                (format!("[\"{quoted}\"]"), Value::from(s.as_str()))
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any text: a value, or a typed error pointing inside the text; never a panic.
        #[test]
        fn any_path_text_reads_or_fails_cleanly(text in "\\PC{0,24}") {
            let vm = vm();
            match vm.get::<Value>(&text) {
                Ok(_) => {}
                Err(VmError::BadPath { at, .. }) => prop_assert!(at <= text.chars().count()),
                Err(VmError::NotFound { .. }) => {}
                // A value that cannot be copied out (`_G` holds itself) is a typed error too.
                Err(VmError::Conversion { .. }) => {}
                Err(e) => prop_assert!(false, "{text:?}: {e:?}"),
            }
        }

        /// A value stored through a generated path reads back through the same path.
        #[test]
        fn generated_paths_write_and_read_back(keys in prop::collection::vec(key(), 1..5), v in any::<i64>()) {
            let vm = vm();
            // Build the nested tables in Lua from the keys, then write and read the leaf.
            let mut path = "root".to_string();
            vm.exec("root = {}", "root").unwrap();
            for (text, k) in &keys[..keys.len() - 1] {
                let parent = vm.table(&path).unwrap();
                parent.set(k.clone(), vm.create_table().unwrap().as_ref()).unwrap();
                path += text;
            }
            path += &keys[keys.len() - 1].0;
            vm.set(&path, v).unwrap();
            prop_assert_eq!(vm.get::<i64>(&path).unwrap(), v);
        }

        /// Every integer width reads a Lua integer exactly when it fits, else a Type error.
        #[test]
        fn integer_widths_match_try_from(v in prop_oneof![any::<i64>(), -300i64..300]) {
            let vm = vm();
            vm.set("v", v).unwrap();
            macro_rules! check {
                ($($t:ty),*) => {$(
                    match (vm.get::<$t>("v"), <$t>::try_from(v)) {
                        (Ok(got), Ok(want)) => prop_assert_eq!(got, want),
                        (Err(VmError::Type { .. }), Err(_)) => {}
                        (got, want) => prop_assert!(false, "{} {v}: {got:?} vs {want:?}", stringify!($t)),
                    }
                )*};
            }
            check!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);
        }
    }
}

#[test]
fn unbounded_recursion_through_a_native_is_a_lua_error() {
    let vm = Vm::builder()
        .capacity(256 * MIB)
        .native("host.call", |call| {
            let n: i64 = call.call_function(0, call.get::<i64>(1)? + 1)?;
            call.ret(n);
            Ok(())
        })
        .build()
        .unwrap();
    let out = vm
        .exec(
            "local function f(n) return host.call(f, n) end
             return pcall(f, 0)",
            "recurse",
        )
        .unwrap();
    assert_eq!(out[0], Value::Boolean(false), "{out:?}");
    let msg = out[1].as_str().unwrap();
    assert!(msg.contains("stack overflow"), "{msg}");
    // Said once, not once more per level it passed through.
    assert_eq!(msg.matches("host.call").count(), 1, "{msg}");
    assert_eq!(
        vm.exec("return 1", "after").unwrap(),
        vec![Value::Integer(1)]
    );
}

#[test]
fn a_callback_error_passes_through_natives_as_it_was_raised() {
    let vm = Vm::builder()
        .capacity(64 * MIB)
        .native("host.call", |call| {
            call.call_function::<()>(0, ())?;
            Ok(())
        })
        .native("host.fail", |_| Err(NativeError::new("boom")))
        .build()
        .unwrap();
    // Two natives between the failing one and the pcall: the message names the place and
    // the native that raised it, and the native it passed through once (it had a
    // "nest:N: host.call: " before it per level).
    let out = vm
        .exec(
            "local ok, e = pcall(host.call, function()\n\
               return host.call(function()\n\
                 host.fail()\n\
               end)\n\
             end)\n\
             return e",
            "nest",
        )
        .unwrap();
    assert_eq!(
        out[0].as_str().unwrap(),
        "host.call: nest:3: host.fail: boom"
    );
}

#[test]
fn hostile_tables_are_refused_not_allocated() {
    let vm = vm();
    vm.exec(
        "sparse = { [1] = 1, [1e15] = 2 }
         deep = {} local t = deep for i = 1, 500 do t.x = {} t = t.x end
         cyc = {} cyc.me = cyc
         nan_key = { [0/0 ~= 0/0 and 1 or 2] = 1 }",
        "hostile",
    )
    .unwrap();
    assert!(matches!(
        vm.get::<Vec<i64>>("sparse"),
        Err(VmError::Type { reason: Some(r), .. }) if r.contains("sparse")
    ));
    // Too deep or cyclic to copy: a Conversion error; a path or a handle reads them anyway.
    assert!(matches!(
        vm.get::<Value>("deep"),
        Err(VmError::Conversion { .. })
    ));
    assert!(matches!(
        vm.get::<Value>("cyc"),
        Err(VmError::Conversion { .. })
    ));
    assert_eq!(vm.get::<Option<i64>>("deep.x.x.x.y").unwrap(), None);
    assert_eq!(
        vm.table("cyc")
            .unwrap()
            .table("me")
            .unwrap()
            .get::<_, Option<i64>>("v")
            .unwrap(),
        None
    );
    assert!(matches!(
        vm.get::<Value>("x:y"),
        Err(VmError::BadPath { at: 1, .. })
    ));
}

/// A module loaded with `Vm::require` lives in `package.loaded`: its state goes into
/// `save_game` and comes back with `load_game`.
#[test]
fn required_module_state_survives_save_game() {
    use luasnap::bridge::persist::Trust;
    const GAME: &str = "local G = { tick = 0 } function G.step() G.tick = G.tick + 1 end return G";
    let vm = vm();
    let g = vm.require("game", GAME).unwrap().into_table().unwrap();
    for _ in 0..5 {
        g.call_function::<()>("step", ()).unwrap();
    }
    drop(g);
    let save = vm.save_game().unwrap();
    let mut vm2 = self::vm();
    vm2.require("game", GAME).unwrap();
    vm2.load_game(&save, Trust::Own).unwrap();
    let g2 = vm2.require("game", GAME).unwrap().into_table().unwrap();
    assert_eq!(g2.get::<_, i64>("tick").unwrap(), 5);
    g2.call_function::<()>("step", ()).unwrap();
    assert_eq!(g2.get::<_, i64>("tick").unwrap(), 6);
}

/// `FrameSession` and `PredictiveClient` take any `GameInput`, here a serde struct that
/// reaches `G.step` as a table; a rollback re-simulates with the corrected structured inputs.
#[test]
fn frame_session_and_predictive_client_take_structured_inputs() {
    use luasnap::bridge::runtime::{
        Backend, FrameSession, Game, GameConfig, GameInput, PredictiveClient,
    };
    #[derive(Clone, Copy, Default, serde::Serialize)]
    struct Pad {
        dx: i8,
        fire: bool,
    }
    impl GameInput for Pad {}
    let mut cfg = GameConfig::default_game(2, 1);
    cfg.base_address = None;
    cfg.capacity = 64 * MIB;
    cfg.script = "G = { x = 0, shots = 0 }
        function G.init(players, seed) end
        function G.step(inputs)
          for _, p in ipairs(inputs) do
            G.x = G.x + p.dx
            if p.fire then G.shots = G.shots + 1 end
          end
        end
        return G"
        .into();
    cfg.chunk_name = "=test".into();
    let pad = |dx, fire| Pad { dx, fire };
    let mut fs: FrameSession<Pad> =
        FrameSession::new(Game::new(&cfg, Backend::ArenaIncremental).unwrap(), 8);
    fs.advance(&[pad(1, false), pad(2, true)]).unwrap();
    fs.advance(&[pad(1, false), pad(2, true)]).unwrap();
    assert_eq!(fs.game().vm().get::<i64>("G.x").unwrap(), 6);
    fs.rollback_and_resimulate(1, |_| vec![pad(-1, false), pad(0, false)])
        .unwrap();
    assert_eq!(fs.game().vm().get::<i64>("G.x").unwrap(), 2);
    assert_eq!(fs.game().vm().get::<i64>("G.shots").unwrap(), 1);

    let mut client: PredictiveClient<Pad> =
        PredictiveClient::new(Game::new(&cfg, Backend::Serialize).unwrap()).unwrap();
    client.predict(vec![pad(5, true), pad(0, false)]).unwrap();
    client
        .confirm(&[pad(1, false), pad(1, false)], |_| unreachable!())
        .unwrap();
    assert_eq!(client.game().vm().get::<i64>("G.x").unwrap(), 2);
    assert_eq!(client.game().vm().get::<i64>("G.shots").unwrap(), 0);
}

/// A native over a standard library function is refused unless asked for explicitly.
#[test]
fn native_over_a_library_function_needs_native_override() {
    let Err(err) = Vm::builder()
        .capacity(64 * MIB)
        .deterministic(1)
        .native("math.floor", |c| {
            c.ret(7i64);
            Ok(())
        })
        .build()
    else {
        panic!("math.floor exists: the native must be refused");
    };
    assert!(
        matches!(&err, VmError::NativeOverride { name, found } if name == "math.floor" && found == "function"),
        "{err}"
    );
    assert!(err.to_string().contains("native_override"), "{err}");
    let vm = Vm::builder()
        .capacity(64 * MIB)
        .deterministic(1)
        .native_override("math.floor", |c| {
            c.ret(7i64);
            Ok(())
        })
        .native("mylib.helper", |c| {
            c.ret(1i64);
            Ok(())
        })
        .build()
        .unwrap();
    assert_eq!(
        vm.load("return math.floor(2.5) + mylib.helper()", "t")
            .unwrap()
            .get::<i64>()
            .unwrap(),
        8
    );
}

/// Conversion errors through handles name the key, index or result that failed.
#[test]
fn handle_errors_name_the_key_and_the_result() {
    let vm = vm();
    vm.exec(
        "t = { { name = 'ann' }, n = 'x' } function t.f() return 'str' end",
        "setup",
    )
    .unwrap();
    let t = vm.table("t").unwrap();
    let msg = |e: VmError| e.to_string();
    let e = msg(t.get::<_, u8>("nope").unwrap_err());
    assert!(e.contains("'table.nope' is nil"), "{e}");
    let e = msg(t.get::<_, u8>(1).unwrap_err());
    assert!(e.contains("'table[1]'"), "{e}");
    let e = msg(t.table(1).unwrap().table("name").unwrap_err());
    assert!(e.contains("'table.name'") && e.contains("string"), "{e}");
    let e = msg(t.handle("f").unwrap().get::<u8>().unwrap_err());
    assert!(e.contains("'the value'") && e.contains("function"), "{e}");
    let e = msg(t.call_function::<u8>("f", ()).unwrap_err());
    assert!(e.contains("'f() result #1'"), "{e}");
    let e = msg(t.function("f").unwrap().call::<u8>(()).unwrap_err());
    assert!(e.contains("'result #1'"), "{e}");
}

/// serde: sequences holding `None` read back whole (holes and trailing `None`s, through the
/// explicit `n` the writer adds), and a failing field names its own type.
#[test]
fn serde_option_sequences_round_trip_and_errors_name_the_field_type() {
    use luasnap::bridge::Serde;
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Player {
        hp: u8,
        slots: Vec<Option<u32>>,
    }
    let vm = vm();
    let p = Player {
        hp: 3,
        slots: vec![Some(1), None, Some(3), None],
    };
    vm.set("p", Serde(&p)).unwrap();
    assert_eq!(vm.get::<Option<i64>>("p.slots[2]").unwrap(), None);
    assert_eq!(vm.get::<i64>("p.slots.n").unwrap(), 4);
    assert_eq!(vm.get::<Serde<Player>>("p").unwrap().0, p);
    // A Lua-made sequence with a hole (no `n`) reads up to its largest key.
    vm.exec("p.slots = { 1, nil, 3 }", "t").unwrap();
    assert_eq!(
        vm.get::<Serde<Player>>("p").unwrap().0.slots,
        vec![Some(1), None, Some(3)]
    );
    // The plain conversion reads the same table, `n` included.
    vm.set("p", Serde(&p)).unwrap();
    assert_eq!(
        vm.get::<Vec<Option<u32>>>("p.slots").unwrap(),
        vec![Some(1), None, Some(3), None]
    );
    // No `None`s: a plain sequence, no `n`.
    vm.set("q", Serde(vec![1, 2])).unwrap();
    assert_eq!(vm.get::<Option<i64>>("q.n").unwrap(), None);
    // Hostile lengths are refused.
    vm.exec("p.slots = { n = 1e12 // 1 }", "t").unwrap();
    assert!(vm.get::<Serde<Player>>("p").is_err());
    vm.exec("p.slots = {} p.hp = 300", "t").unwrap();
    let e = vm.get::<Serde<Player>>("p").unwrap_err();
    assert!(
        matches!(&e, VmError::Type { path, expected, .. } if path == "p.hp" && expected == "u8"),
        "{e}"
    );
}

/// The plain Vm explains a library the deterministic profile leaves out, once.
#[test]
fn deterministic_vm_explains_a_missing_library() {
    let vm = vm();
    let e = vm
        .exec("return os.time()", "clock")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'os' is left out of the deterministic profile"),
        "{e}"
    );
    assert_eq!(e.matches("left out").count(), 1, "{e}");
    let full = Vm::builder().capacity(64 * MIB).build().unwrap();
    let e = full.exec("return nope.x", "t").unwrap_err().to_string();
    assert!(!e.contains("left out"), "{e}");
}

/// The deterministic profile keeps `debug.traceback` (for `xpcall(f, debug.traceback)`, the
/// error handler game code uses everywhere) and nothing else of `debug`, and says so.
#[test]
fn deterministic_vm_has_debug_traceback_only() {
    let vm = vm();
    let out = vm
        .exec(
            "local ok, tb = xpcall(function() error('boom') end, debug.traceback)
             return ok, tb",
            "=game",
        )
        .unwrap();
    assert_eq!(out[0], Value::Boolean(false));
    let Value::String(tb) = &out[1] else {
        panic!("{out:?}")
    };
    let tb = String::from_utf8_lossy(tb);
    assert!(tb.starts_with("game:1: boom\nstack traceback:"), "{tb}");
    assert!(tb.contains("in global 'xpcall'"), "{tb}");
    // No addresses: the same text from a second VM.
    let again = self::vm()
        .exec(
            "local ok, tb = xpcall(function() error('boom') end, debug.traceback)
             return tb",
            "=game",
        )
        .unwrap();
    assert_eq!(again[0], out[1]);
    let n = vm
        .exec(
            "local n = 0 for _ in pairs(debug) do n = n + 1 end return n",
            "t",
        )
        .unwrap();
    assert_eq!(n, vec![Value::Integer(1)]);
    let e = vm
        .exec("return debug.getinfo(1)", "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("(field 'getinfo')")
            && e.contains("if this is debug.getinfo: it is left out of the deterministic profile"),
        "{e}"
    );
    // The function is a permanent: a save refers to it by name (a foreign file may not name
    // anything of `debug`).
    vm.exec("F = { handler = debug.traceback }", "t").unwrap();
    let bytes = vm.persist("F").unwrap();
    let mut other = self::vm();
    let e = other
        .unpersist(&bytes, "F2", luasnap::bridge::persist::Trust::Foreign)
        .unwrap_err();
    assert!(e.to_string().contains("\"debug.traceback\""), "{e}");
    other
        .unpersist(&bytes, "F2", luasnap::bridge::persist::Trust::Own)
        .unwrap();
    assert_eq!(
        other
            .exec("return F2.handler == debug.traceback", "t")
            .unwrap(),
        vec![Value::Boolean(true)]
    );
}

/// A second game at default_game's fixed base address gets advice, and `None` works.
#[test]
fn a_second_game_at_the_fixed_base_address_is_told_to_use_none() {
    use luasnap::bridge::runtime::{Backend, Game, GameConfig, GameError};
    let mut cfg = GameConfig::default_game(2, 1);
    cfg.capacity = 64 * MIB;
    cfg.script =
        "G = {} function G.init() G.x = 0 end function G.step(i) G.x = G.x + i[1] end return G"
            .into();
    cfg.chunk_name = "=test".into();
    let mut first = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
    first.step(&[1u8, 2]).unwrap();
    let save = first.save_game().unwrap();
    let Err(err) = Game::<u8>::from_save(&cfg, Backend::ArenaIncremental, &save) else {
        panic!("the fixed address is taken: the second game must be refused");
    };
    assert!(
        matches!(&err, GameError::Config(m) if m.contains("base_address: None")),
        "{err}"
    );
    cfg.base_address = None;
    let second: Game = Game::from_save(&cfg, Backend::ArenaIncremental, &save).unwrap();
    assert_eq!(second.frame(), 1);
}

/// `Game::from_save` takes no code from the file (it may come from another player): a save
/// of another version runs this version's code, bound by place; a save whose functions this
/// version lacks is refused with the trust level that would accept it; and `from_save_with`
/// with `Trust::Own` and Eris's binding (`LoadOptions::new`) runs the saved version's code.
/// (An attacker's file ran its own code through `luasnap simulate --load`.)
#[test]
fn from_save_takes_no_code_from_the_file_unless_trusted() {
    use luasnap::bridge::persist::{LoadOptions, Trust};
    use luasnap::bridge::runtime::{Backend, Game, GameConfig};
    let mut cfg = GameConfig::default_game(1, 0);
    cfg.capacity = 64 * MIB;
    cfg.base_address = None;
    cfg.script = "G = {} function G.init() W = { f = function(x) return x + 1 end, x = 0 } end
                  function G.step(i) W.x = W.f(W.x) end return G"
        .into();
    cfg.chunk_name = "=test".into();
    let mut v1 = Game::new(&cfg, Backend::ArenaFull).unwrap();
    v1.step(&[0u8]).unwrap();
    let save = v1.save_game().unwrap();
    drop(v1);
    // The same script: its functions match.
    let mut same = Game::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
    same.step(&[0u8]).unwrap();
    drop(same);
    // Version 2 of the script: the saved closure is bound to version 2's function.
    let v1_script = cfg.script.clone();
    cfg.script = v1_script.replace("x + 1", "x + 2");
    let mut v2 = Game::from_save(&cfg, Backend::ArenaFull, &save).unwrap();
    v2.step(&[0u8]).unwrap();
    assert_eq!(
        v2.vm().exec("return W.x", "t").unwrap(),
        vec![Value::Integer(3)],
        "version 2's code runs"
    );
    let report = v2.load_report().unwrap().summary();
    assert!(
        report.contains("rebound") && report.contains("G.init > f"),
        "{report}"
    );
    drop(v2);
    // Version 3 renamed it: the saved closure's function is not in it.
    cfg.script = v1_script.replace(
        "f = function(x) return x + 1",
        "g = function(x) return x + 3",
    );
    let Err(err) = Game::<u8>::from_save(&cfg, Backend::ArenaFull, &save) else {
        panic!("a save of a function this version lacks needs its code");
    };
    let err = err.to_string();
    assert!(
        err.contains("Trust::Own") && err.contains("G.init > f"),
        "{err}"
    );
    cfg.script = v1_script.replace("x + 1", "x + 2");
    let mut own = Game::from_save_with(
        &cfg,
        Backend::ArenaFull,
        &save,
        &LoadOptions::new(Trust::Own),
    )
    .unwrap();
    own.step(&[0u8]).unwrap();
    assert_eq!(
        own.vm().exec("return W.x", "t").unwrap(),
        vec![Value::Integer(2)],
        "the saved closure runs version 1's code"
    );
}

/// An error value that is not a string, raised in a callback a native calls, reaches the
/// Lua `pcall` around the native as the value itself (as in plain Lua); strings keep the
/// native's name prefix.
#[test]
fn error_values_pass_through_a_natives_callback() {
    let vm = Vm::builder()
        .capacity(64 * MIB)
        .deterministic(1)
        .native("host.call", |c| {
            let n: i64 = c.call_function(0, ())?;
            c.ret(n);
            Ok(())
        })
        .native("host.swallow", |c| {
            let first = c.call_function::<()>(0, ()).is_err();
            c.ret(first);
            let n: i64 = c.call_function(1, ())?;
            c.ret(n);
            Ok(())
        })
        .build()
        .unwrap();
    let r = vm
        .exec(
            "local ok, e = pcall(host.call, function() error({ code = 7 }) end)
             local ok2, e2 = pcall(host.call, function() error('plain') end)
             local ok3, a, b = pcall(host.swallow, function() error({}) end, function() return 5 end)
             local ok4, e4 = pcall(host.swallow, function() error({}) end,
                                   function() error({ code = 9 }) end)
             return ok, type(e), e.code, e2, ok3, a, b, ok4, e4.code",
            "t",
        )
        .unwrap();
    assert_eq!(
        r,
        vec![
            Value::Boolean(false),
            Value::from("table"),
            Value::Integer(7),
            Value::from("host.call: t:2: plain"),
            Value::Boolean(true),
            Value::Boolean(true),
            Value::Integer(5),
            Value::Boolean(false),
            Value::Integer(9),
        ]
    );
}

/// An error object that is not a string reaches the host whole: `VmError::Lua`'s `value`,
/// with a message that shows it (its `__tostring`, else its contents as Lua source), from
/// `exec`, from a coroutine resumed by the host and from a game's `G.step`.
#[test]
fn error_values_that_are_tables_reach_the_host_whole() {
    let vm = vm();
    match vm.exec("error({ code = 7, items = { 1, 2 } })", "shop") {
        Err(VmError::Lua {
            message,
            value: Some(Value::Table(t)),
            traceback: Some(traceback),
            ..
        }) => {
            assert_eq!(t.get("code"), Some(&Value::Integer(7)));
            let items = t.get("items").and_then(Value::as_table).unwrap();
            assert_eq!(items.sequence(), [&Value::Integer(1), &Value::Integer(2)]);
            assert!(
                message == "{code = 7, items = {1, 2}}" || message == "{items = {1, 2}, code = 7}",
                "{message}"
            );
            assert!(traceback.contains("shop:1: in main chunk"), "{traceback}");
        }
        other => panic!("{other:?}"),
    }
    // `__tostring` gives the message, as `lua` prints it; the object still arrives.
    let e = vm
        .exec(
            "error(setmetatable({ code = 8 }, { __tostring = function(e) return 'E' .. e.code end }))",
            "shop",
        )
        .unwrap_err();
    match &e {
        VmError::Lua {
            message,
            value: Some(v),
            ..
        } => {
            assert_eq!(message, "E8");
            assert_eq!(v.as_table().unwrap().get("code"), Some(&Value::Integer(8)));
        }
        other => panic!("{other:?}"),
    }
    // Strings and numbers stay messages; an object that contains itself keeps Lua's words.
    match vm.exec("error('plain', 0)", "x") {
        Err(VmError::Lua { message, value, .. }) => {
            assert_eq!((message.as_str(), value), ("plain", None))
        }
        other => panic!("{other:?}"),
    }
    match vm.exec("local t = {} t.self = t error(t)", "x") {
        Err(VmError::Lua { message, value, .. }) => {
            assert_eq!(message, "(error object is a table value)");
            assert_eq!(value, None);
        }
        other => panic!("{other:?}"),
    }
    // Raised inside a coroutine the host resumes.
    vm.exec(
        "co = coroutine.create(function() coroutine.yield() error({ code = 9, at = 'ai' }) end)",
        "ai",
    )
    .unwrap();
    let co = vm.thread("co").unwrap();
    co.resume::<()>(()).unwrap();
    match co.resume::<()>(()) {
        Err(VmError::Lua { value: Some(v), .. }) => {
            assert_eq!(v.as_table().unwrap().get("at"), Some(&Value::from("ai")))
        }
        other => panic!("{other:?}"),
    }
    drop(co);
    // From a game's G.step, through GameError.
    use luasnap::bridge::runtime::{Backend, Game, GameConfig};
    let mut cfg = GameConfig::default_game(1, 1);
    cfg.base_address = None;
    cfg.capacity = 64 * MIB;
    cfg.script = "local G = {} function G.init() end
        function G.step() error({ reason = 'desk closed' }) end return G"
        .into();
    cfg.chunk_name = "=test".into();
    let mut game = Game::new(&cfg, Backend::ArenaFull).unwrap();
    let e = game.step(&[0u8]).unwrap_err();
    let chain = format!("{e} {:?}", std::error::Error::source(&e));
    assert!(chain.contains("{reason = \"desk closed\"}"), "{chain}");
}

/// A script that indexes a namespace of natives nobody registered is told so, and how to
/// register one, in the Rust API's words.
#[test]
fn an_unregistered_native_namespace_says_how_to_register_it() {
    let vm = Vm::builder()
        .capacity(64 * MIB)
        .deterministic(1)
        .native("host.add", |call| {
            let sum = call.integer(0)? + call.integer(1)?;
            call.ret(sum);
            Ok(())
        })
        .build()
        .unwrap();
    let e = vm
        .exec("return input.poll()", "game")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("attempt to index a nil value (global 'input')"),
        "{e}"
    );
    assert!(
        e.contains("no native named 'input.…' is registered")
            && e.contains("VmBuilder::native(\"input.<function>\"")
            && e.contains("GameConfig::setup"),
        "{e}"
    );
    // The hint sits before the traceback.
    assert!(
        e.find("VmBuilder").unwrap() < e.find("stack traceback").unwrap(),
        "{e}"
    );
    // A registered namespace the script cleared, and a missing function of a registered
    // namespace, keep Lua's message.
    let e = vm
        .exec("host = nil return host.add(1, 2)", "game")
        .unwrap_err()
        .to_string();
    assert!(!e.contains("VmBuilder"), "{e}");
    let e = vm.exec("return os.time()", "game").unwrap_err().to_string();
    assert!(!e.contains("VmBuilder") && e.contains("left out"), "{e}");
}
