//! `luasnap run SCRIPT.lua [ARGS...]`: the standalone interpreter on an arena.

use luasnap::bridge::{Profile, Table, Value, Vm, VmError};
use std::io::Read;
use std::process::ExitCode;

/// Options of `luasnap run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Cap the Lua heap (e.g. 64M, 2G); running out is Lua's catchable "not enough memory".
    #[arg(long, value_parser = super::size::parse_size)]
    pub memory_limit: Option<usize>,
    /// Use the deterministic profile with this seed (no io/os; seeded math.random).
    #[arg(long, value_name = "SEED")]
    pub deterministic: Option<u64>,
    /// Place the arena at this address (hex with 0x, or decimal).
    #[arg(long, value_parser = parse_address)]
    pub base_address: Option<usize>,
    /// Print the arena digest and the value digest of the globals to stderr at the end.
    #[arg(long)]
    pub digest: bool,
    /// The script ('-' reads standard input), then its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "SCRIPT [ARGS]"
    )]
    pub script_and_args: Vec<String>,
}

fn parse_address(text: &str) -> Result<usize, String> {
    let r = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => text.parse(),
    };
    r.map_err(|_| format!("'{text}' is not an address: use hex like 0x3f0000000000"))
}

/// Runs the script; errors go to stderr like the standalone `lua`.
pub fn run(args: RunArgs, argv: &[String]) -> ExitCode {
    let script = &args.script_and_args[0];
    let source = if script == "-" {
        let mut s = Vec::new();
        match std::io::stdin().read_to_end(&mut s) {
            Ok(_) => s,
            Err(e) => return fail(&format!("cannot read standard input: {e}")),
        }
    } else {
        match std::fs::read(script) {
            Ok(s) => s,
            Err(e) => return fail(&format!("cannot open {script}: {e}")),
        }
    };
    let mut b = Vm::builder().profile(match args.deterministic {
        Some(seed) => Profile::Deterministic { seed },
        None => Profile::Standard,
    });
    if let Some(limit) = args.memory_limit {
        b = b
            .memory_limit(limit)
            .capacity(limit.saturating_mul(2).max(64 << 20));
    }
    if let Some(base) = args.base_address {
        b = b.base_address(base);
    }
    let mut vm = match b.build() {
        Ok(vm) => vm,
        Err(e) => return fail(&e.to_string()),
    };
    // `arg` as the standalone lua builds it: the script at 0, its arguments after, everything
    // before it on the command line at negative indices.
    let script_at = argv.len() - args.script_and_args.len();
    let arg = Table {
        entries: argv
            .iter()
            .enumerate()
            .map(|(i, a)| {
                (
                    Value::Integer(i as i64 - script_at as i64),
                    Value::from(a.as_str()),
                )
            })
            .collect(),
    };
    if let Err(e) = vm.set("arg", arg) {
        return fail(&e.to_string());
    }
    let chunkname = if script == "-" {
        "=stdin".to_string()
    } else {
        format!("@{script}")
    };
    let script_args: Vec<Value> = args.script_and_args[1..]
        .iter()
        .map(|a| Value::from(a.as_str()))
        .collect();
    let result = vm.exec_with_args(&source, &chunkname, &script_args);
    if args.digest {
        eprintln!("arena digest: {:016x}", vm.digest());
        match vm.value_digest() {
            Ok(d) => eprintln!("value digest: {d:016x}"),
            Err(e) => eprintln!("value digest: unavailable ({e})"),
        }
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(VmError::Lua {
            message, traceback, ..
        }) => {
            eprintln!("luasnap: {message}");
            if let Some(tb) = traceback {
                eprintln!("{tb}");
            }
            ExitCode::FAILURE
        }
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("luasnap: {message}");
    ExitCode::FAILURE
}
