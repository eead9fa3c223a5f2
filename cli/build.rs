//! Exports the Lua C API from the `luasnap` binary, as the stock `lua` interpreter does, so C
//! modules (`require`, `package.loadlib`) resolve `lua_*`, `luaL_*` and `luaopen_*` against
//! the VM's own Lua. The dynamic list also keeps those functions from `--gc-sections`.
fn main() {
    let list = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua-api.dynlist");
    println!("cargo:rerun-if-changed={}", list.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--dynamic-list={}",
            list.display()
        );
    }
}
