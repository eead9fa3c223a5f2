//! The chunk registry: loaders stay C functions with stock behaviour, compiled chunks are
//! recorded with their source and collected with their last function.

use luasnap::bridge::{Value, Vm};

const MIB: usize = 1 << 20;

fn vm() -> Vm {
    Vm::builder().capacity(512 * MIB).build().unwrap()
}

fn one(vm: &Vm, code: &str) -> Value {
    let mut v = vm.exec(code, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0)
}

#[test]
fn loaders_are_c_functions() {
    let vm = vm();
    for f in [
        "load",
        "loadfile",
        "dofile",
        "string.dump",
        "package.searchers[2]",
    ] {
        assert_eq!(
            one(&vm, &format!("return debug.getinfo({f}).what")),
            Value::from("C"),
            "{f}"
        );
    }
}

#[test]
fn distinct_loads_leave_nothing_after_a_collection() {
    let vm = vm();
    let kept = one(
        &vm,
        "collectgarbage() collectgarbage()
         local before = collectgarbage('count')
         for i = 1, 100000 do
           local env = {}
           local f = load('local t = {} return ' .. i, 'c' .. i, 't', env)
           assert(f() == i)
         end
         collectgarbage() collectgarbage()
         return (collectgarbage('count') - before) * 1024",
    );
    let Value::Number(bytes) = kept else {
        panic!("{kept:?}")
    };
    // The weak registry table may keep some empty slots; 100,000 kept chunks with their
    // environments would be tens of MB.
    assert!(bytes < 64.0 * 1024.0, "{bytes} bytes kept");
}

#[test]
fn a_chunk_lives_while_a_nested_function_does() {
    let vm = vm();
    let count = "collectgarbage() collectgarbage()
                 local n = 0
                 for _, rec in pairs(debug.getregistry()['luasnap.chunks']) do
                   if debug.getuservalue(rec, 1):sub(1, 9) == '-- marker' then n = n + 1 end
                 end
                 return n";
    vm.exec(
        "keep = load('-- marker\\nlocal env = ... return function() return env end')({})",
        "a",
    )
    .unwrap();
    assert_eq!(one(&vm, count), Value::Integer(1));
    // Its source text and chunk name are kept with it.
    assert_eq!(
        one(
            &vm,
            "for _, rec in pairs(debug.getregistry()['luasnap.chunks']) do
               local src = debug.getuservalue(rec, 1)
               if src:sub(1, 9) == '-- marker' then return src end
             end"
        ),
        Value::from("-- marker\nlocal env = ... return function() return env end")
    );
    vm.exec("keep = nil", "b").unwrap();
    assert_eq!(one(&vm, count), Value::Integer(0));
}

#[test]
fn dump_and_errors_look_stock() {
    let vm = vm();
    // string.dump of functions whose prototypes carry a record round-trips.
    assert_eq!(
        one(
            &vm,
            "local f = load('local k = 40 return function(x) return x + k + 2 end')()
             local g = load(string.dump(f))
             return debug.setupvalue(g, 1, 40) and g(0)"
        ),
        Value::Integer(42)
    );
    assert_eq!(
        one(
            &vm,
            "local ok, e = pcall(dofile, '/nonexistent/x.lua') return e"
        ),
        Value::from("cannot open /nonexistent/x.lua: No such file or directory")
    );
    assert_eq!(
        one(&vm, "local ok, e = pcall(load, {}) return e"),
        Value::from("bad argument #1 to 'load' (function expected, got table)")
    );
    // Line hooks never fire inside the loaders.
    assert_eq!(
        one(
            &vm,
            "local lines = 0
             debug.sethook(function() lines = lines + 1 end, 'l')
             load('return 1')
             debug.sethook()
             return lines"
        ),
        Value::Integer(2)
    );
}
