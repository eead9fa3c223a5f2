//! Builds Lua 5.5.1 from `csrc/lua-5.5.1` (the release's sources with the small patches listed in
//! `csrc/lua-5.5.1/LUASNAP-PATCHES.md`), then the C helpers that reach into Lua's internals,
//! against the same headers. mlua-sys (feature `external`) declares the C API and leaves the
//! library to this script.
use std::path::Path;

/// luasnap's one C file in the Lua library itself (see its top).
const CFIDS: &str = "csrc/cfids.c";

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
    // The identities of light C functions as table keys, which ltable.c calls (patch 5): part
    // of the Lua library, not a helper.
    lua.file(CFIDS);
    // Frame pointers off, as stock Lua is built: cc keeps them whenever the profile has debug
    // info (ours has line tables), which costs every function a push and a register (rbp) that
    // luaV_execute needs: 5.5% more instructions on the library workloads (benches/lua/libs).
    lua.include(lua_dir)
        .define("LUA_USE_LINUX", None)
        .force_frame_pointer(false)
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
        .filter(|path| path.extension().is_some_and(|e| e == "c") && path != Path::new(CFIDS))
        .collect();
    files.sort();
    helpers
        .files(files)
        .include(lua_dir)
        .define("LUA_USE_LINUX", None)
        .force_frame_pointer(false)
        .warnings(true)
        .flag("-Wmissing-prototypes")
        .flag("-Werror=missing-prototypes")
        .flag("-Werror=implicit-function-declaration")
        .compile("luasnap_helpers");

    let header = std::fs::read_to_string("csrc/luasnap.h").expect("csrc/luasnap.h");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("luasnap_h.rs"), rust_from_header(&header))
        .expect("writing the constants generated from csrc/luasnap.h");
}

/// Rust's side of what csrc/luasnap.h defines for both: the kinds (`#define LS_<NAME> <n>`, with
/// the comment just above as the doc) as `kind::<NAME>: u64`, the numbers
/// (`#define LUASNAP_<NAME> <n>`) as `<NAME>: usize`, and for each `LUASNAP_MIRROR(ctype,
/// RustType, size)` and `LUASNAP_FIELD(ctype, field, offset, size)` line a const assertion
/// that the Rust mirror has that size and the field that offset and size (the header asserts
/// the same of the C type). Included by src/bridge/helpers.rs.
fn rust_from_header(header: &str) -> String {
    let mut kinds = String::new();
    let mut numbers = String::new();
    let mut checks = String::new();
    let mut mirrors: Vec<(String, String)> = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut in_comment = false;
    for line in header.lines() {
        let t = line.trim();
        if in_comment || t.starts_with("/*") {
            let text = t
                .trim_start_matches("/*")
                .trim_start_matches("**")
                .trim_end_matches("*/");
            if !in_comment {
                doc.clear();
            }
            if !text.trim().is_empty() {
                doc.push(text.trim().to_string());
            }
            in_comment = !t.ends_with("*/");
            continue;
        }
        let words: Vec<&str> = t.split_whitespace().collect();
        if let ["#define", name, value] = words[..] {
            if let Ok(n) = value.parse::<u64>() {
                let docs: String = doc.iter().map(|d| format!("    /// {d}\n")).collect();
                if let Some(kind) = name.strip_prefix("LS_") {
                    kinds += &format!("{docs}    pub(crate) const {kind}: u64 = {n};\n");
                } else if let Some(number) = name.strip_prefix("LUASNAP_") {
                    numbers += &format!(
                        "{}pub(crate) const {number}: usize = {n};\n",
                        docs.replace("    ///", "///")
                    );
                }
            }
        }
        let args = |prefix: &str| -> Option<Vec<String>> {
            let rest = t.strip_prefix(prefix)?.strip_suffix(");")?;
            Some(rest.split(',').map(|a| a.trim().to_string()).collect())
        };
        if let Some(a) = args("LUASNAP_MIRROR(") {
            let (ctype, rust, size) = (&a[0], &a[1], &a[2]);
            checks += &format!(
                "const _: () = assert!(core::mem::size_of::<{rust}>() == {size}, \"{rust} is not the size of {ctype} (csrc/luasnap.h)\");\n"
            );
            mirrors.push((ctype.clone(), rust.clone()));
        } else if let Some(a) = args("LUASNAP_FIELD(") {
            let (ctype, field, offset, size) = (&a[0], &a[1], &a[2], &a[3]);
            let rust = &mirrors
                .iter()
                .find(|(c, _)| c == ctype)
                .unwrap_or_else(|| panic!("LUASNAP_FIELD({ctype}, ...) before its LUASNAP_MIRROR"))
                .1;
            checks += &format!(
                "const _: () = assert!(core::mem::offset_of!({rust}, {field}) == {offset} && field_size(|s: &{rust}| &s.{field}) == {size}, \"{rust}.{field} is not where {ctype}.{field} is (csrc/luasnap.h)\");\n"
            );
        }
        doc.clear();
    }
    format!(
        "// Generated by lua-bridge/build.rs from csrc/luasnap.h: change the header, not this.\n\n\
         /// Kinds of a value handed between the helpers and the serializer ([`RawVal`]`::kind`,\n\
         /// [`ScanEntry`]`::kkind` and `vkind`): the `LS_*` constants of csrc/luasnap.h.\n\
         #[allow(dead_code)] // every kind of the header, whether Rust names it or not\n\
         pub(crate) mod kind {{\n{kinds}}}\n\n{numbers}\n{checks}"
    )
}
