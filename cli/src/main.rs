//! The `luasnap` command-line tool.
#![forbid(unsafe_code)]

mod bench;
mod diff;
mod gc_pages;
mod loads;
mod p2p;
mod run;
mod second;
mod serve;
mod simulate;
mod size;
mod tether;
mod trackers;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

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
    /// Host one match: order the clients' commands into frames, run the synchronous model,
    /// check the clients' digests, send save-games to late joiners and to clients that disagree.
    Serve(serve::ServeArgs),
    /// Play one player slot of a `luasnap serve` match (predicting and rolling back), with
    /// simulate's scripted inputs, optionally behind an emulated bad network.
    Client(serve::ClientArgs),
}

fn report(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("luasnap: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
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
    let cli = Cli::parse();
    tether::watch_parent();
    match cli.command {
        Some(Command::Run(_)) => unreachable!("`run` is dispatched before clap"),
        Some(Command::Simulate(args)) => report(simulate::run(args)),
        Some(Command::Bench(args)) => report(bench::run(args)),
        Some(Command::P2p(args)) => report(p2p::run(args)),
        None => report(simulate::run(simulate::SimulateArgs::parse_from([
            "simulate",
        ]))),
        Some(Command::GcPages(args)) => match gc_pages::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("luasnap: {e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Diff(args)) => diff::run(args),
        Some(Command::Serve(args)) => report(serve::serve(args)),
        Some(Command::Client(args)) => report(serve::client(args)),
        Some(Command::Trackers) => {
            trackers::trackers();
            ExitCode::SUCCESS
        }
    }
}
