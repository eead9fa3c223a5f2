//! `luasnap run [luasnap options] [lua options] [script [args]]`: the standalone `lua`
//! interpreter on an arena. It takes `lua`'s command line (`-e`, `-l`, `-i`, `-v`, `-E`, `-W`,
//! `-`, `--`), runs `LUA_INIT_5_5`/`LUA_INIT`, builds `arg`, reports errors and sets the exit
//! code as `lua` does; luasnap's own options come first. Invoked under a name starting with
//! `lua` (a `lua` symlink to the binary), `luasnap` behaves as `luasnap run`; `run` names such a
//! symlink (made in the user's cache) at `arg`'s lowest index, where scripts that start the
//! interpreter again look for it.

use luasnap::bridge::{GcMode, Profile, ReplOutcome, Step, Table, Value, Vm, VmBuilder};
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

/// Default arena reservation of `luasnap run`: address space only (`MAP_NORESERVE`), committed
/// as used, so the interpreter is limited by the machine's memory as stock `lua` is.
pub const RUN_CAPACITY: usize = 1 << 40;

/// The version banner, as `lua -v` prints it.
const VERSION: &str = "Lua 5.5.1  Copyright (C) 1994-2026 Lua.org, PUC-Rio";

/// Options of `luasnap run` (parsed by hand: the command line is `lua`'s).
#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
pub struct RunArgs {
    /// `[--memory-limit SIZE] [--capacity SIZE] [--deterministic SEED] [--base-address ADDR]
    /// [--digest] [--fresh-keys]` then lua's options (`-e stat`, `-i`, `-l mod`, `-l g=mod`, `-v`, `-E`, `-W`,
    /// `--`, `-`) and `[script [args]]`
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

/// luasnap's own options.
#[derive(Debug, Default)]
struct Own {
    memory_limit: Option<usize>,
    capacity: Option<usize>,
    deterministic: Option<u64>,
    base_address: Option<usize>,
    digest: bool,
    fresh_keys: bool,
}

/// An action of the command line, in order.
#[derive(Debug)]
enum Action {
    Exec(String),
    Library(String),
    Warnings,
}

/// What `lua`'s option scan found.
#[derive(Debug, Default)]
struct Parsed {
    own: Own,
    actions: Vec<Action>,
    interactive: bool,
    version: bool,
    ignore_env: bool,
    exec: bool,
    /// Index in argv of the script (or `-`), if any.
    script: Option<usize>,
}

enum ParseError {
    /// lua's usage error for this option.
    Usage(String),
    /// A luasnap option with a bad value.
    Own(String),
}

fn parse_address(text: &str) -> Result<usize, String> {
    let r = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => text.parse(),
    };
    r.map_err(|_| format!("'{text}' is not an address: use hex like 0x3f0000000000"))
}

/// Scans `argv[first..]` as lua.c does, taking luasnap's long options before the script.
fn parse(argv: &[String], first: usize) -> Result<Parsed, ParseError> {
    let mut p = Parsed::default();
    let mut i = first;
    while i < argv.len() {
        let a = argv[i].as_str();
        if !a.starts_with('-') || a == "-" {
            p.script = Some(i);
            return Ok(p);
        }
        if a == "--" {
            p.script = (i + 1 < argv.len()).then_some(i + 1);
            return Ok(p);
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let value = |i: &mut usize| -> Result<String, ParseError> {
                if let Some(v) = inline.clone() {
                    return Ok(v);
                }
                *i += 1;
                argv.get(*i)
                    .cloned()
                    .ok_or_else(|| ParseError::Own(format!("--{name} needs a value")))
            };
            match name {
                "memory-limit" => {
                    let v = value(&mut i)?;
                    p.own.memory_limit =
                        Some(crate::size::parse_size(&v).map_err(ParseError::Own)?);
                }
                "capacity" => {
                    let v = value(&mut i)?;
                    p.own.capacity = Some(crate::size::parse_size(&v).map_err(ParseError::Own)?);
                }
                "deterministic" => {
                    let v = value(&mut i)?;
                    p.own.deterministic = Some(v.parse().map_err(|_| {
                        ParseError::Own(format!(
                            "--deterministic: '{v}' is not a seed (an integer)"
                        ))
                    })?);
                }
                "base-address" => {
                    let v = value(&mut i)?;
                    p.own.base_address = Some(parse_address(&v).map_err(ParseError::Own)?);
                }
                "digest" if inline.is_none() => p.own.digest = true,
                "fresh-keys" if inline.is_none() => p.own.fresh_keys = true,
                "help" => return Err(ParseError::Usage(a.to_string())),
                _ => return Err(ParseError::Usage(a.to_string())),
            }
            i += 1;
            continue;
        }
        let rest = &a[2..];
        match a.as_bytes()[1] {
            b'E' if rest.is_empty() => p.ignore_env = true,
            b'W' if rest.is_empty() => p.actions.push(Action::Warnings),
            b'i' if rest.is_empty() => {
                p.interactive = true;
                p.version = true;
            }
            b'v' if rest.is_empty() => p.version = true,
            b'e' | b'l' => {
                let arg = if rest.is_empty() {
                    i += 1;
                    match argv.get(i) {
                        Some(next) if !next.starts_with('-') => next.clone(),
                        _ => return Err(ParseError::Usage(a.to_string())),
                    }
                } else {
                    rest.to_string()
                };
                if a.as_bytes()[1] == b'e' {
                    p.exec = true;
                    p.actions.push(Action::Exec(arg));
                } else {
                    p.actions.push(Action::Library(arg));
                }
            }
            _ => return Err(ParseError::Usage(a.to_string())),
        }
        i += 1;
    }
    Ok(p)
}

fn usage(progname: &str, bad: &str) {
    if bad == "--help" {
        eprintln!("usage: {progname} [luasnap options] [options] [script [args]]");
    } else if bad.starts_with("-e") || bad.starts_with("-l") {
        eprintln!("{progname}: '{bad}' needs argument");
    } else {
        eprintln!("{progname}: unrecognized option '{bad}'");
    }
    eprintln!(
        "usage: {progname} [options] [script [args]]
Available options are:
  -e stat   execute string 'stat'
  -i        enter interactive mode after executing 'script'
  -l mod    require library 'mod' into global 'mod'
  -l g=mod  require library 'mod' into global 'g'
  -v        show version information
  -E        ignore environment variables
  -W        turn warnings on
  --        stop handling options
  -         stop handling options and execute stdin
luasnap options (before lua's):
  --memory-limit SIZE   cap the bytes of live Lua blocks (64M, 2G), as a cap on malloc would;
                        luasnap's own tables are not charged; past it, Lua's \"not enough memory\"
  --capacity SIZE       arena reservation: the address space the heap may span (default 1T,
                        4G with --deterministic); the same error when the heap reaches it
  --deterministic SEED  the deterministic profile (no io/os, seeded math.random)
  --base-address ADDR   place the arena at this address (hex with 0x)
  --digest              print the arena and value digests to stderr at the end
  --fresh-keys          a removed table key set again is inserted anew (Lua patch 11), as in
                        the deterministic profile: to run a test suite under that rule"
    );
}

/// Reports a message as lua.c does (`progname: message` on stderr).
fn message(progname: &str, msg: &str) {
    eprintln!("{progname}: {msg}");
    let _ = std::io::stderr().flush();
}

/// `luasnap run ...`: `argv` is the whole command line, `run` at `argv[1]`. The script sees the
/// `arg` table stock `lua` would build had it been started as this binary's `lua` entry point
/// ([`lua_entry`]) with the same options: the entry point at the lowest index (`arg[-1]` when
/// only a script is given), so a script that starts the interpreter again
/// (`os.execute(arg[-1] .. " test.lua")`: Penlight's `run.lua`, luaunit's functional tests, Lua's
/// own `main.lua`) starts luasnap's. Without an entry point, `arg` shows the command as typed.
pub fn run_main(argv: &[String]) -> ExitCode {
    let progname = argv.first().map(String::as_str).unwrap_or("luasnap");
    match lua_entry() {
        Some(entry) => {
            let mut as_lua = Vec::with_capacity(argv.len().saturating_sub(1));
            as_lua.push(entry);
            as_lua.extend_from_slice(argv.get(2..).unwrap_or_default());
            interpreter(progname, &as_lua, 1)
        }
        None => interpreter(progname, argv, 2),
    }
}

/// The binary run under a name starting with `lua` (a symlink): `argv` is `lua`'s command line.
pub fn lua_main(argv: &[String]) -> ExitCode {
    interpreter(argv.first().map(String::as_str).unwrap_or("lua"), argv, 1)
}

/// This binary's `lua` entry point: a symlink named `lua` to the running executable, in a
/// folder of the user's cache kept for that executable
/// (`$XDG_CACHE_HOME/luasnap/lua-<hash of its path>/lua`, `~/.cache/luasnap/...` without
/// `XDG_CACHE_HOME`, `$TMPDIR/luasnap-<uid>/...` without a home). Made on first use, remade if
/// it points elsewhere; every folder on the way that luasnap owns must be the user's and
/// writable by no one else, so no other user can point it at their program. `None` when no
/// such link can be made (a read-only home and temporary folder).
pub fn lua_entry() -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let exe = std::env::current_exe().ok()?;
    // FNV-1a of the executable's path: one folder per binary (a debug and a release build
    // each get their own `lua`).
    let hash = exe
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf29ce484222325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
    let leaf = format!("lua-{hash:016x}");
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
        .filter(|p| p.is_absolute());
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").ok()?);
    let tmp = std::env::temp_dir().join(format!("luasnap-{uid}"));
    cache
        .map(|c| c.join("luasnap"))
        .into_iter()
        .chain([tmp])
        .find_map(|base| entry_in(&base, &leaf, &exe, uid))
}

/// `base/leaf/lua`, made to point at `exe` (see [`lua_entry`]).
fn entry_in(base: &std::path::Path, leaf: &str, exe: &std::path::Path, uid: u32) -> Option<String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = base.join(leaf);
    let link = dir.join("lua");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .ok()?;
    for d in [base, &dir] {
        let m = std::fs::symlink_metadata(d).ok()?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
            return None;
        }
    }
    if std::fs::read_link(&link).ok().as_deref() != Some(exe) {
        // Made under a name of this process's, then renamed over: runs starting together
        // each see a whole link.
        let fresh = dir.join(format!(".lua-{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        std::os::unix::fs::symlink(exe, &fresh).ok()?;
        std::fs::rename(&fresh, &link).ok()?;
    }
    link.into_os_string().into_string().ok()
}

/// The interpreter: `argv` is lua's command line, its options from `argv[first]`; messages
/// start with `progname`.
fn interpreter(progname: &str, argv: &[String], first: usize) -> ExitCode {
    let p = match parse(argv, first) {
        Ok(p) => p,
        Err(ParseError::Usage(bad)) => {
            usage(progname, &bad);
            return ExitCode::FAILURE;
        }
        Err(ParseError::Own(m)) => {
            message(progname, &m);
            return ExitCode::FAILURE;
        }
    };
    if p.version {
        println!("{VERSION}");
    }
    if p.ignore_env {
        // The package library reads these when it opens; `-E` makes it use its defaults.
        for v in [
            "LUA_PATH",
            "LUA_PATH_5_5",
            "LUA_CPATH",
            "LUA_CPATH_5_5",
            "LUA_INIT",
            "LUA_INIT_5_5",
        ] {
            std::env::remove_var(v);
        }
    }
    // The deterministic profile's `require` loads only the game's own files: the script's.
    let folder = p
        .script
        .map(|i| argv[i].as_str())
        .filter(|s| *s != "-")
        .map(|s| match std::path::Path::new(s).parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        });
    let mut vm = match builder(&p.own, folder).build() {
        Ok(vm) => vm,
        Err(e) => {
            message(progname, &e.to_string());
            return ExitCode::FAILURE;
        }
    };
    let ok = match run_vm(&vm, argv, first, &p, progname) {
        Ok(ok) => ok,
        Err(e) => {
            message(progname, &e.to_string());
            false
        }
    };
    if p.own.digest {
        eprintln!("arena digest: {:016x}", vm.digest());
        match vm.value_digest() {
            Ok(d) => eprintln!("value digest: {d:016x}"),
            Err(e) => eprintln!("value digest: unavailable ({e})"),
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The VM `own` asks for; in the deterministic profile, `require` loads the Lua files of
/// `folder` (the script's), as a folder game's does.
fn builder(own: &Own, folder: Option<std::path::PathBuf>) -> VmBuilder {
    let mut b = Vm::builder()
        .profile(match own.deterministic {
            Some(seed) => Profile::Deterministic { seed },
            None => Profile::Standard,
        })
        // lua.c runs its state in generational mode.
        .gc(GcMode::GENERATIONAL)
        // The deterministic profile keeps the library's default layout (a game's addresses,
        // hence its pointer-keyed iteration order, depend on it).
        .capacity(own.capacity.unwrap_or(if own.deterministic.is_some() {
            luasnap::bridge::DEFAULT_CAPACITY
        } else {
            RUN_CAPACITY
        }));
    if let Some(limit) = own.memory_limit {
        b = b.memory_limit(limit);
    }
    if let Some(base) = own.base_address {
        b = b.base_address(base);
    }
    if own.fresh_keys {
        b = b.fresh_keys(true);
    }
    if let (Some(_), Some(dir)) = (own.deterministic, folder) {
        b = b.module_folder(dir);
    }
    b
}

/// Runs the command line's steps; `Ok(false)` when one failed (already reported).
fn run_vm(
    vm: &Vm,
    argv: &[String],
    first: usize,
    p: &Parsed,
    progname: &str,
) -> Result<bool, luasnap::bridge::VmError> {
    let step = |s: Step<'_>| -> Result<bool, luasnap::bridge::VmError> {
        match vm.standalone(s)? {
            Ok(()) => Ok(true),
            Err(m) => {
                message(progname, &m);
                Ok(false)
            }
        }
    };
    if p.ignore_env {
        step(Step::IgnoreEnv)?;
    }
    // `arg`: the script at 0, its arguments after, everything before it at negative indices
    // (with no script, the word before the first option is at 0).
    let zero = p.script.unwrap_or(first.saturating_sub(1)) as i64;
    let arg = Table {
        entries: argv
            .iter()
            .enumerate()
            .map(|(i, a)| (Value::Integer(i as i64 - zero), Value::from(a.as_str())))
            .collect(),
    };
    vm.set("arg", arg)?;
    if !p.ignore_env {
        let init = ["LUA_INIT_5_5", "LUA_INIT"]
            .into_iter()
            .find_map(|name| std::env::var(name).ok().map(|v| (name, v)));
        if let Some((name, init)) = init {
            let ok = match init.strip_prefix('@') {
                Some(file) => step(Step::File(Some(file)))?,
                None => step(Step::Code {
                    code: init.as_bytes(),
                    name: &format!("={name}"),
                })?,
            };
            if !ok {
                return Ok(false);
            }
        }
    }
    step(Step::Warnings(false))?;
    for a in &p.actions {
        let ok = match a {
            Action::Exec(code) => step(Step::Code {
                code: code.as_bytes(),
                name: "=(command line)",
            })?,
            Action::Library(spec) => {
                let (global, module) = match spec.split_once('=') {
                    Some((g, m)) => (g, m),
                    // `-l a-b` loads module "a-b" into global "a" (lua's LUA_IGMARK).
                    None => (spec.split('-').next().unwrap_or(spec), spec.as_str()),
                };
                step(Step::Library { global, module })?
            }
            Action::Warnings => step(Step::Warnings(true))?,
        };
        if !ok {
            return Ok(false);
        }
    }
    if let Some(s) = p.script {
        let stdin = argv[s] == "-" && argv[s - 1] != "--";
        if !step(Step::Script((!stdin).then_some(argv[s].as_str())))? {
            return Ok(false);
        }
    }
    if p.interactive {
        repl(vm, p.ignore_env)?;
    } else if p.script.is_none() && !p.exec && !p.version {
        if std::io::stdin().is_terminal() {
            println!("{VERSION}");
            repl(vm, p.ignore_env)?;
        } else if !step(Step::File(None))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The read-eval-print loop: readline if it loads, `_PROMPT`/`_PROMPT2`, multi-line input,
/// results printed.
fn repl(vm: &Vm, ignore_env: bool) -> Result<(), luasnap::bridge::VmError> {
    let lib = (!ignore_env)
        .then(|| std::env::var("LUA_READLINELIB").ok())
        .flatten()
        .unwrap_or_else(|| "libreadline.so".to_string());
    vm.readline_init(&lib)?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut read = |prompt: &str| -> Option<String> {
        if let Some(line) = luasnap::bridge::readline(prompt) {
            return line;
        }
        print!("{prompt}");
        let _ = std::io::stdout().flush();
        lines.next().and_then(Result::ok)
    };
    loop {
        let Some(mut input) = read(&vm.prompt(false)?) else {
            println!();
            return Ok(());
        };
        let trimmed = input.trim_start_matches([' ', '\t']);
        if trimmed.starts_with("local") && matches!(trimmed.as_bytes().get(5), Some(b' ' | b'\t')) {
            eprintln!("warning: locals do not survive across lines in interactive mode");
        }
        let mut first_line = true;
        loop {
            let outcome = vm.repl_eval(&input, first_line)?;
            first_line = false;
            match outcome {
                ReplOutcome::Incomplete(m) => match read(&vm.prompt(true)?) {
                    Some(more) => {
                        input.push('\n');
                        input.push_str(&more);
                    }
                    None => {
                        eprintln!("{m}");
                        break;
                    }
                },
                ReplOutcome::Done => break,
                // As lua.c's doREPL: messages inside the loop carry no program name.
                ReplOutcome::Failed(m) => {
                    eprintln!("{m}");
                    break;
                }
            }
        }
    }
}
