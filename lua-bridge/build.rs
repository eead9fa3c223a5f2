//! Builds Lua 5.5.1 from `csrc/lua-5.5.1` (the release's sources with the small patches listed in
//! `csrc/lua-5.5.1/LUASNAP-PATCHES.md`), then the C helpers that reach into Lua's internals,
//! against the same headers. mlua-sys (feature `external`) declares the C API and leaves the
//! library to this script.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    let lua_dir = Path::new("csrc/lua-5.5.1");
    let mut lua = cc::Build::new();
    for entry in std::fs::read_dir(lua_dir).expect("csrc/lua-5.5.1 holds Lua's sources") {
        let path = entry.expect("a readable directory entry").path();
        if path.extension().is_some_and(|e| e == "c") {
            lua.file(path);
        }
    }
    // As lua-src builds it for mlua: Linux features, API checks in debug builds.
    // `LUASNAP_LUA_ASSERTS=1` also turns on Lua's internal assertions (`lua_assert`) and API
    // checks in any build, in Lua and in the helpers that build its objects directly: the
    // test suite run that way checks those helpers against Lua's own invariants.
    println!("cargo:rerun-if-env-changed=LUASNAP_LUA_ASSERTS");
    let asserts = std::env::var("LUASNAP_LUA_ASSERTS").is_ok_and(|v| v == "1");
    if asserts || std::env::var("PROFILE").as_deref() == Ok("debug") {
        lua.define("LUA_USE_APICHECK", None);
    }
    if asserts {
        lua.define("LUAI_ASSERT", None);
    }
    lua.include(lua_dir)
        .define("LUA_USE_LINUX", None)
        .flag_if_supported("-fno-common")
        .warnings(false)
        .compile("lua5.5");

    let mut helpers = cc::Build::new();
    if asserts {
        helpers
            .define("LUAI_ASSERT", None)
            .define("LUA_USE_APICHECK", None);
    }
    // Every .c file of csrc is a helper; each exported function must have its prototype in
    // csrc/luasnap.h (or an internal header), or the build fails.
    let mut files: Vec<_> = std::fs::read_dir("csrc")
        .expect("csrc holds the helpers")
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "c"))
        .collect();
    files.sort();
    helpers
        .files(files)
        .include(lua_dir)
        .define("LUA_USE_LINUX", None)
        .warnings(true)
        .flag("-Wmissing-prototypes")
        .flag("-Werror=missing-prototypes")
        .flag("-Werror=implicit-function-declaration")
        .compile("luasnap_helpers");
}
