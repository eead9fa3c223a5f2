//! `luasnap serve` and `luasnap client`: the seed's client-server model over a real network.

use crate::simulate::{parse_step_budget, StepBudget};
use crate::{usage, CliError};
use luasnap::bridge::runtime::net::{
    ClientEvent, ClientOptions, ClientReport, LinkConditions, MatchClient, MatchServer, NetError,
    ServerEvent, ServerOptions, ServerReport,
};
use luasnap::bridge::runtime::{Backend, GameConfig, GameError, DEFAULT_STEP_BUDGET};
use serde_json::json;
use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options of `luasnap serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The game: its folder (main.lua and its modules) or its main script (default: the
    /// embedded Arena Brawl); clients must run the same files.
    pub game: Option<PathBuf>,
    /// The UDP port to listen on.
    #[arg(long, default_value_t = 7000)]
    pub port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: std::net::IpAddr,
    /// Player slots of the match.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub players: u64,
    /// Frames the match lasts.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub frames: u64,
    /// Seeds the game and the clients' scripted inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Milliseconds between frames.
    #[arg(long, default_value_t = 33, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub tick_ms: u64,
    /// Clients compare value digests with the server every this many frames (and at the last).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub check_every: u64,
    /// Start the clock once this many clients are there (default: every player); the others
    /// join the running match from a save-game.
    #[arg(long)]
    pub start_with: Option<u64>,
    /// Print one JSON object at the end instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Lua instructions one G.step may run before it is stopped with an error naming the
    /// frame; `off` for no limit.
    #[arg(long, default_value_t = StepBudget(Some(DEFAULT_STEP_BUDGET)), value_parser = parse_step_budget)]
    pub step_budget: StepBudget,
    /// Frames between the runtime's collection points: a full collection at the end of every
    /// Nth frame, the only moments besides the game's own `collectgarbage()` where weak
    /// entries are cleared and finalizers run; 0 for none. It overrides the game's own
    /// `G.collect_every` (as GameConfig::collect_every does); without it, the game's, else 60.
    /// Part of the match's game: clients must give the same (a client that differs is
    /// refused).
    #[arg(long, value_name = "N")]
    pub collect_every: Option<u64>,
}

/// Options of `luasnap client`.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The game: its folder or its main script (default: the embedded Arena Brawl): the
    /// server's, the same files under the same names.
    pub game: Option<PathBuf>,
    /// The server, HOST:PORT.
    #[arg(long)]
    pub connect: String,
    /// Milliseconds of emulated one-way latency, each direction (the round trip grows by
    /// twice this).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub latency: u64,
    /// Milliseconds by which each datagram's latency varies, either way.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub jitter: u64,
    /// Percent of datagrams lost, each direction.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// How the client saves and restores its synchronous form.
    #[arg(long, default_value = "auto", value_parser = ["auto", "full", "incremental", "serialize"])]
    pub mode: String,
    /// Print one JSON object at the end instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Lua instructions one G.step may run before it is stopped; `off` for no limit.
    #[arg(long, default_value_t = StepBudget(Some(DEFAULT_STEP_BUDGET)), value_parser = parse_step_budget)]
    pub step_budget: StepBudget,
    /// A library function the game's state holds on purpose (`load`, `collectgarbage`): the
    /// server's save-games (a late join, a resync; loaded as foreign files) then accept it, as
    /// the names the game lists in `G.permanents`; repeat for more.
    #[arg(long = "allow-permanent", value_name = "NAME")]
    pub allow_permanent: Vec<String>,
    /// The server's `--collect-every` (frames between the runtime's collection points), if
    /// it gave one: part of the match's game, so a client that differs is refused.
    #[arg(long, value_name = "N")]
    pub collect_every: Option<u64>,
}

/// The game both ends run: a game's folder or its main script, as `simulate` takes it. Chunk
/// names are the main script's file name and the modules' paths in the game's folder, so a
/// server and its clients started from different folders agree on the game (save-games name
/// their chunks).
fn game_config(
    path: Option<&Path>,
    players: usize,
    seed: u64,
    budget: StepBudget,
    collect_every: Option<u64>,
) -> Result<GameConfig, String> {
    let mut cfg = crate::game_config(players, seed);
    cfg.base_address = None;
    cfg.step_budget = budget.0;
    cfg.collect_every = collect_every;
    if let Some(path) = path {
        cfg = cfg.game_at(path).map_err(|e| e.to_string())?;
    }
    Ok(cfg)
}

fn progress_bar(len: u64, prefix: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("  {prefix} [{bar:30}] {pos}/{len} frames {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(prefix.to_string());
    bar
}

/// The process's CPU time, seconds.
fn cpu_seconds() -> f64 {
    cpu_time::ProcessTime::try_now()
        .map(|t| t.as_duration().as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs `luasnap serve`.
pub fn serve(args: ServeArgs) -> Result<(), CliError> {
    let players = args.players as usize;
    let cfg = game_config(
        args.game.as_deref(),
        players,
        args.seed,
        args.step_budget,
        args.collect_every,
    )?;
    let mut opts = ServerOptions::new(cfg, args.frames);
    opts.tick = Duration::from_millis(args.tick_ms);
    opts.check_every = args.check_every;
    opts.start_with = args.start_with.map_or(players, |n| n as usize);
    let addr = SocketAddr::new(args.bind, args.port);
    let server = MatchServer::bind(addr, opts).map_err(|e| match e {
        // The options out of range or that do not go together (--start-with above --players).
        NetError::Config(e) => usage(e),
        e => CliError::Failed(e.to_string()),
    })?;
    let local = server.local_addr().map_err(|e| e.to_string())?;
    let terminal = !args.json && std::io::stderr().is_terminal();
    eprintln!(
        "luasnap serve: {} on {local} | {players} players | {} frames | seed {}",
        args.game
            .as_ref()
            .map_or("the embedded default game".into(), |p| p
                .display()
                .to_string()),
        args.frames,
        args.seed
    );
    let bar = terminal.then(|| progress_bar(args.frames, "serve"));
    let cpu_start = cpu_seconds();
    let report = server
        .run(|e| match e {
            ServerEvent::Frame { frame, clients, .. } => {
                if let Some(bar) = &bar {
                    bar.set_position(*frame);
                    bar.set_message(format!("{clients} clients"));
                }
            }
            other => match &bar {
                Some(bar) => bar.println(format!("  {}", crate::shown(&other.to_string()))),
                None => eprintln!("luasnap serve: {}", crate::shown(&other.to_string())),
            },
        })
        .map_err(|e| e.to_string())?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let cpu = cpu_seconds() - cpu_start;
    let text = if args.json {
        format!("{}\n", server_json(&report, cpu))
    } else {
        server_table(&report, cpu)
    };
    print!("{text}");
    let wrong = report
        .clients
        .iter()
        .filter(|c| c.left.is_none() && !c.matches(report.value_digest))
        .count();
    if wrong > 0 {
        return Err(CliError::Failed(format!(
            "{wrong} clients did not end on the server's value digest {:016x}",
            report.value_digest
        )));
    }
    Ok(())
}

fn server_json(r: &ServerReport, cpu: f64) -> serde_json::Value {
    let clients: Vec<_> = r
        .clients
        .iter()
        .map(|c| {
            json!({
                "slot": c.slot,
                "addr": c.addr.to_string(),
                "joined_at": c.joined_at,
                "joined_from_save": c.joined_from_save,
                "left": c.left.as_ref().map(|(f, why)| json!({"frame": f, "reason": why})),
                "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received,
                "desyncs": c.desyncs,
                "resyncs": c.resyncs,
                "checks_passed": c.checks_passed,
                "late_commands": c.late_commands,
                "delay_frames": c.delay,
                "refused_messages": c.refused,
                "final_value_digest": c.final_digest.map(|d| format!("{d:016x}")),
                "matches_server": c.matches(r.value_digest),
            })
        })
        .collect();
    json!({
        "frames": r.frames,
        "value_digest": format!("{:016x}", r.value_digest),
        "game_digest": r.game_digest,
        "seconds": r.seconds,
        "cpu_seconds": cpu,
        "cpu_us_per_frame": cpu * 1e6 / r.frames.max(1) as f64,
        "busy_us_per_frame": r.busy_us_per_frame,
        "step_us": r.step_us,
        "digest_us": r.digest_us,
        "saves": r.saves,
        "resyncs": r.clients.iter().map(|c| c.resyncs as u64).sum::<u64>(),
        "clients": clients,
        "departed_beyond_kept": {
            "clients": r.departed.clients,
            "bytes_sent": r.departed.bytes_sent,
            "bytes_received": r.departed.bytes_received,
            "refused_messages": r.departed.refused,
        },
    })
}

fn server_table(r: &ServerReport, cpu: f64) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "frames {} | value digest {:016x} | {:.1} s | CPU {:.0} µs per frame (G.step {:.0} µs, digest {:.0} µs) | {} save-games",
        r.frames,
        r.value_digest,
        r.seconds,
        cpu * 1e6 / r.frames.max(1) as f64,
        r.step_us,
        r.digest_us,
        r.saves
    );
    let _ = writeln!(t, "\n| slot | address | joined | left | sent | received | delay | late | desyncs | resyncs | refused | final digest |");
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in &r.clients {
        let _ = writeln!(
            t,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.slot + 1,
            c.addr,
            c.joined_at,
            if c.joined_from_save { " (save)" } else { "" },
            c.left
                .as_ref()
                .map_or("-".into(), |(f, why)| format!("{f}: {why}")),
            kib(c.bytes_sent),
            kib(c.bytes_received),
            c.delay,
            c.late_commands,
            c.desyncs,
            c.resyncs,
            c.refused,
            match c.final_digest {
                Some(d) if d == r.value_digest => "equal".to_string(),
                Some(d) => format!("DIFFERS ({d:016x})"),
                None => "-".into(),
            }
        );
    }
    let d = &r.departed;
    if d.clients > 0 {
        let _ = writeln!(
            t,
            "| {} more | (left) | | | {} | {} | | | | | {} | |",
            d.clients,
            kib(d.bytes_sent),
            kib(d.bytes_received),
            d.refused
        );
    }
    t
}

fn kib(b: u64) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

/// Runs `luasnap client`.
pub fn client(args: ClientArgs) -> Result<(), CliError> {
    let server = args
        .connect
        .to_socket_addrs()
        .map_err(|e| usage(format!("--connect {}: {e} (give HOST:PORT)", args.connect)))?
        .next()
        .ok_or_else(|| {
            usage(format!(
                "--connect {}: no address (give HOST:PORT)",
                args.connect
            ))
        })?;
    if !(0.0..=100.0).contains(&args.loss) {
        return Err(usage(format!(
            "--loss must be a percentage 0..=100, got {}",
            args.loss
        )));
    }
    let mut cfg = game_config(
        args.game.as_deref(),
        1,
        0,
        args.step_budget,
        args.collect_every,
    )?;
    cfg.permanents.extend(args.allow_permanent.iter().cloned());
    let mut opts = ClientOptions::new(cfg, server);
    opts.backend = Backend::from_name(&args.mode).expect("clap checked the value");
    opts.link = LinkConditions {
        latency: Duration::from_millis(args.latency),
        jitter: Duration::from_millis(args.jitter),
        loss: args.loss / 100.0,
    };
    opts.link_seed = std::process::id() as u64;
    let terminal = !args.json && std::io::stderr().is_terminal();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let cpu_start = cpu_seconds();
    let client = MatchClient::connect(opts).map_err(|e| e.to_string())?;
    let report = client
        .run(|e| {
            let line = match e {
                ClientEvent::Welcome {
                    slot,
                    players,
                    frames,
                    from_save,
                } => {
                    if terminal {
                        bar = Some(progress_bar(*frames, &format!("slot {}", slot + 1)));
                    }
                    format!(
                        "slot {} of {players}, {frames} frames{}",
                        slot + 1,
                        if *from_save { ", joining the running match from a save-game" } else { "" }
                    )
                }
                ClientEvent::Loaded { frame, bytes, resync } => format!(
                    "{} at frame {frame} from the server's {bytes}-byte save-game",
                    if *resync { "resynced" } else { "joined" }
                ),
                ClientEvent::Desync { frame, server, client } => format!(
                    "the server found this state wrong at frame {frame} (value digest {client:016x}, the server's {server:016x})"
                ),
                ClientEvent::Confirmed { frame, delay, .. } => {
                    if let Some(bar) = &bar {
                        bar.set_position(*frame);
                        bar.set_message(format!("delay {delay}"));
                    }
                    return;
                }
                _ => return,
            };
            match &bar {
                Some(bar) => bar.println(format!("  {}", crate::shown(&line))),
                None if !args.json => eprintln!("luasnap client: {}", crate::shown(&line)),
                None => {}
            }
        })
        .map_err(|e| match e {
            NetError::Game(GameError::Load(e)) => format!(
                "the server's save-game: {}",
                crate::loads::load_error_on_the_command_line(&e, crate::loads::CLIENT)
            ),
            e => e.to_string(),
        })?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let cpu = cpu_seconds() - cpu_start;
    if args.json {
        println!("{}", client_json(&report, cpu));
    } else {
        print!("{}", client_table(&report, cpu));
    }
    if !report.matches_server() {
        return Err(CliError::Failed(match report.server_digest {
            Some(s) => format!(
                "this client ended on value digest {:016x}, the server on {s:016x}",
                report.value_digest
            ),
            None => "the server's end message did not arrive: the final digests were not compared"
                .into(),
        }));
    }
    Ok(())
}

fn client_json(r: &ClientReport, cpu: f64) -> serde_json::Value {
    json!({
        "slot": r.slot,
        "players": r.players,
        "frames": r.frames,
        "mode": r.backend.name(),
        "joined_at": r.joined_at,
        "join_save_bytes": r.join_save_bytes,
        "value_digest": format!("{:016x}", r.value_digest),
        "server_value_digest": r.server_digest.map(|d| format!("{d:016x}")),
        "matches_server": r.matches_server(),
        "game_digest": r.game_digest,
        "rollbacks": r.rollbacks,
        "resimulated_frames": r.resimulated,
        "rollback_overhead_us_median": r.rollback_us_median,
        "rollback_overhead_us_p99": r.rollback_us_p99,
        "rollback_overhead_seconds_total": r.rollback_seconds_total,
        "desyncs": r.desyncs,
        "resyncs": r.resyncs,
        "bytes_sent": r.bytes_sent,
        "bytes_received": r.bytes_received,
        "delay_frames": r.delay,
        "seconds": r.seconds,
        "cpu_seconds": cpu,
    })
}

fn client_table(r: &ClientReport, cpu: f64) -> String {
    format!(
        "slot {} of {} | {} frames | mode {} | {} | value digest {:016x} ({}) | rollbacks {} ({} frames again; overhead µs median {:.0} / p99 {:.0}) | desyncs {} | resyncs {} | sent {} | received {} | delay {} | {:.1} s, CPU {:.1} s\n",
        r.slot + 1,
        r.players,
        r.frames,
        r.backend.name(),
        match r.joined_at {
            Some(f) => format!("joined at frame {f} from a {}-byte save-game", r.join_save_bytes),
            None => "from G.init".into(),
        },
        r.value_digest,
        if r.matches_server() { "the server's" } else { "NOT the server's" },
        r.rollbacks,
        r.resimulated,
        r.rollback_us_median,
        r.rollback_us_p99,
        r.desyncs,
        r.resyncs,
        kib(r.bytes_sent),
        kib(r.bytes_received),
        r.delay,
        r.seconds,
        cpu
    )
}
