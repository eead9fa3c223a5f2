//! Compiles the serializer's C helper against the internal headers of the Lua release that
//! mlua vendors (csrc/lua-5.5.1; lua-src is pinned to match in Cargo.toml).
fn main() {
    println!("cargo:rerun-if-changed=csrc");
    cc::Build::new()
        .file("csrc/internals.c")
        .file("csrc/chunks.c")
        .file("csrc/readline.c")
        .file("csrc/detsort.c")
        .include("csrc/lua-5.5.1")
        .define("LUA_USE_LINUX", None)
        .warnings(true)
        .compile("luasnap_internals");
}
