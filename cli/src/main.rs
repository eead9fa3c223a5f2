//! The `luasnap` command-line tool (the library is the tool; see `luasnap_cli::main_with` for
//! a host binary whose game has natives).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    luasnap_cli::main()
}
