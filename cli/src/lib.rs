//! The `luasnap` command-line tool, as a library: a host binary whose game has natives and
//! userdata types becomes the whole tool for that game (`simulate`, `p2p`, `diff`, with their
//! reports and checks) in a few lines, its natives registered on every game VM the tool
//! builds:
//!
//! ```no_run
//! use luasnap::bridge::runtime::VmSetup;
//!
//! fn main() -> std::process::ExitCode {
//!     luasnap_cli::main_with(VmSetup::new(|b| {
//!         b.native("host.roll", |call| {
//!             call.ret(4);
//!             Ok(())
//!         })
//!     }))
//! }
//! ```
//!
//! `cargo run -p luasnap-cli --example host_game` runs one (examples/host_game.rs). Commands
//! that start a second process (`simulate`'s check and its modes' processes, `p2p`'s second
//! peer) start this same binary, so the natives are there too.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bench;
mod check_save;
mod diff;
mod game_files;
mod gc_pages;
mod loads;
mod mode_process;
mod p2p;
mod reseal;
mod run;
mod save_file;
mod second;
mod serve;
mod simulate;
mod size;
mod tether;
mod trackers;
mod watchdog;

use clap::{Parser, Subcommand};
use luasnap::bridge::runtime::{GameConfig, VmSetup};
use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::RwLock;

/// What a host binary gives the tool for its games (see [`main_for`]).
#[derive(Clone, Default)]
pub struct Host {
    /// Applied to every game VM a command builds, second processes included: the host's
    /// natives and userdata types (as [`GameConfig::setup`]).
    pub setup: VmSetup,
    /// The library functions its games' state holds on purpose (`"load"` for a library that
    /// compiles code), accepted by every load of a save-game as the game's own declaration
    /// would be (as [`GameConfig::permanents`]): `simulate --load`, `client`, and `diff`,
    /// which compiles a game without running it and so cannot read its `G.permanents`.
    pub permanents: Vec<String>,
}

/// The host's setup and permanents, applied to every game a command builds.
static HOST: RwLock<Option<Host>> = RwLock::new(None);

/// A game's configuration as the commands start from: the embedded game, with the host's
/// natives, userdata types and permanents (if any).
pub(crate) fn game_config(players: usize, seed: u64) -> GameConfig {
    let mut cfg = GameConfig::default_game(players, seed);
    if let Some(host) = HOST.read().ok().and_then(|s| s.clone()) {
        cfg.setup = host.setup;
        cfg.permanents = host.permanents;
    }
    cfg
}

/// The permanents the host declared ([`Host::permanents`]).
pub(crate) fn host_permanents() -> Vec<String> {
    HOST.read()
        .ok()
        .and_then(|s| s.as_ref().map(|h| h.permanents.clone()))
        .unwrap_or_default()
}

/// A fresh file in the system's temporary folder, `luasnap-{prefix}…{suffix}`, for a second
/// process to write and this one to read: removed when the returned path drops, so an early
/// return or a failing second process leaves nothing behind.
pub(crate) fn scratch_file(prefix: &str, suffix: &str) -> Result<tempfile::TempPath, String> {
    tempfile::Builder::new()
        .prefix(&format!("luasnap-{prefix}"))
        .suffix(suffix)
        .tempfile()
        .map(tempfile::NamedTempFile::into_temp_path)
        .map_err(|e| {
            format!(
                "cannot make a file in the temporary folder {} (set TMPDIR): {e}",
                std::env::temp_dir().display()
            )
        })
}

/// Instant snapshot and rollback for Lua 5.5, and save-games.
#[derive(Debug, Parser)]
#[command(name = "luasnap", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a Lua script in an arena-backed VM with the full standard library.
    Run(run::RunArgs),
    /// Show which page-tracking mechanisms work on this machine.
    Trackers,
    /// Simulate a networked client that predicts and rolls back, on each save/load backend
    /// (the default command).
    Simulate(simulate::SimulateArgs),
    /// Measure arena snapshots against the graph serializer on game-like heaps.
    Bench(bench::BenchArgs),
    /// Two GGRS peers on 127.0.0.1 running the Lua game with desync detection.
    P2p(p2p::P2pArgs),
    /// Measure pages written per frame under each garbage-collector mode.
    GcPages(gc_pages::GcPagesArgs),
    /// Print the values that differ between two save-games, by path (exit status 1 if any).
    Diff(diff::DiffArgs),
    /// Load kept save-games of older versions into this version of the game, as players'
    /// loads would, and say what became of their functions, or every one that needs a
    /// declaration (exit status 1 if any save is refused).
    CheckSave(check_save::CheckSaveArgs),
    /// Seal a save-game edited by hand again: its header's body length and checksum written
    /// for the bytes it now has (a load still checks everything else).
    Reseal(reseal::ResealArgs),
    /// Host one match: order the clients' commands into frames, run the synchronous model,
    /// check the clients' digests, send save-games to late joiners and to clients that disagree.
    Serve(serve::ServeArgs),
    /// Play one player slot of a `luasnap serve` match (predicting and rolling back), with
    /// simulate's scripted inputs, optionally behind an emulated bad network.
    Client(serve::ClientArgs),
}

/// An error for the terminal: its control characters escaped, newlines and tabs kept, each
/// line after the first indented (`printable_text`). Errors carry the game's text (its error
/// messages, which can quote strings of a foreign save), which could otherwise clear the
/// screen or fake a line of luasnap's own.
pub(crate) fn shown(text: &str) -> String {
    luasnap::bridge::runtime::printable_text(text)
}

/// Why a command failed, which decides its exit status (docs/cli.md, "Exit status").
#[derive(Debug)]
pub(crate) enum CliError {
    /// The command line asks for what the command cannot do: a flag's value out of range or
    /// flags that do not go together. Exit status 2, as clap's own usage errors: nothing ran.
    Usage(String),
    /// The command ran and failed (a game's error, a file that cannot be read, a mode that
    /// does not match). Exit status 1.
    Failed(String),
}

/// The exit status of a usage error, clap's.
const USAGE_EXIT: u8 = 2;

impl From<String> for CliError {
    fn from(e: String) -> CliError {
        CliError::Failed(e)
    }
}

/// A usage error of the command line.
pub(crate) fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

/// Prints a command's failure and gives its exit status: a usage error as clap prints its
/// own (with the command's usage line), exit status 2; any other failure 1.
fn report(command: &str, r: Result<(), CliError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Failed(e)) => {
            eprintln!("luasnap: {}", shown(&e));
            ExitCode::FAILURE
        }
        Err(CliError::Usage(e)) => {
            let mut cli = <Cli as clap::CommandFactory>::command().bin_name("luasnap");
            cli.build();
            let kind = clap::error::ErrorKind::ValueValidation;
            let error = match cli.find_subcommand_mut(command) {
                Some(cmd) => cmd.error(kind, shown(&e)),
                None => cli.error(kind, shown(&e)),
            };
            let _ = error.print();
            ExitCode::from(USAGE_EXIT)
        }
    }
}

/// [`report`] for a command whose errors are all failures of the run.
fn report_failure(command: &str, r: Result<(), String>) -> ExitCode {
    report(command, r.map_err(CliError::Failed))
}

/// The `luasnap` tool: runs the command on this process's command line.
pub fn main() -> ExitCode {
    run_with(std::env::args_os(), VmSetup::default())
}

/// The `luasnap` tool for a game whose host registers natives and userdata types: runs the
/// command on this process's command line with `setup` applied to every game VM it builds
/// (as [`GameConfig::setup`]).
pub fn main_with(setup: VmSetup) -> ExitCode {
    run_with(std::env::args_os(), setup)
}

/// [`main_with`] for a host that also declares its games' permanents ([`Host`]).
pub fn main_for(host: Host) -> ExitCode {
    run_for(std::env::args_os(), host)
}

/// Runs one command, `args` as a command line (the program's name first):
/// `run_with(["host", "simulate", "game.lua", "--frames", "60"], setup)`.
pub fn run_with<I, T>(args: I, setup: VmSetup) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    run_for(
        args,
        Host {
            setup,
            permanents: Vec::new(),
        },
    )
}

/// [`run_with`] for a host that also declares its games' permanents ([`Host`]).
pub fn run_for<I, T>(args: I, host: Host) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    if let Ok(mut h) = HOST.write() {
        *h = Some(host);
    }
    let argv: Vec<String> = args
        .into_iter()
        .map(|a| a.into().to_string_lossy().into_owned())
        .collect();
    // `luasnap run` takes lua's command line, parsed by hand; so does the binary run as `lua`.
    let invoked_as = std::path::Path::new(argv.first().map(String::as_str).unwrap_or(""))
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    // The drop-in `lua` ends on a closed pipe as stock lua (a C program) does.
    if invoked_as.starts_with("lua") && !invoked_as.starts_with("luasnap") {
        luasnap::bridge::default_sigpipe();
        return run::lua_main(&argv);
    }
    if argv.get(1).map(String::as_str) == Some("run") {
        luasnap::bridge::default_sigpipe();
        return run::run_main(&argv);
    }
    let cli = Cli::parse_from(&argv);
    tether::watch_parent();
    match cli.command {
        Some(Command::Run(_)) => unreachable!("`run` is dispatched before clap"),
        Some(Command::Simulate(args)) => report("simulate", simulate::run(args)),
        Some(Command::Bench(args)) => report_failure("bench", bench::run(args)),
        Some(Command::P2p(args)) => report_failure("p2p", p2p::run(args)),
        None => report(
            "simulate",
            simulate::run(simulate::SimulateArgs::parse_from(["simulate"])),
        ),
        Some(Command::GcPages(args)) => report_failure("gc-pages", gc_pages::run(args)),
        Some(Command::Diff(args)) => diff::run(args),
        Some(Command::CheckSave(args)) => check_save::run(args),
        Some(Command::Reseal(args)) => report_failure("reseal", reseal::run(args)),
        Some(Command::Serve(args)) => report("serve", serve::serve(args)),
        Some(Command::Client(args)) => report("client", serve::client(args)),
        Some(Command::Trackers) => {
            trackers::trackers();
            ExitCode::SUCCESS
        }
    }
}
