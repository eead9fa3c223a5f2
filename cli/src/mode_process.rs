//! `simulate --mode all`: each mode in a process of its own.
//!
//! Modes that run one after another in one process share its caches, its malloc heap and page
//! tables, the page tracker's once-per-process cost measurements, and whatever the runs before
//! left behind, so the order of the runs favours some; and each is checked against a lockstep
//! reference of that same process only. So every mode runs in a child: this binary, the same
//! game and options ([`second::same_game`](crate::second::same_game)) with `--mode NAME
//! --json` and [`SimulateArgs::mode_process`]. The child runs as `--mode NAME` does: its own
//! lockstep reference (the baseline of its steps' timings, and the arena digest its mode must
//! end in: arena digests hold addresses, so they are compared within a process only), then
//! its mode, and prints its JSON report, whose `process` field is its id. Its progress goes to
//! its stderr as [`PROGRESS`] lines for the parent to draw; anything else it writes there is
//! its message. The parent compares each mode's final value digest with its own reference's
//! (value digests are the same in every process: docs/determinism.md).

use crate::simulate::{SavingArg, SimulateArgs};
use luasnap::bridge::runtime::Backend;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

/// What a mode's process writes on stderr before `RUN DONE TOTAL` as a run progresses.
pub const PROGRESS: &str = "luasnap-progress: ";

/// What a mode's process writes on stderr before its stall warning, for the parent to print
/// at once (its other lines are its error message, shown at its end).
pub const STALL: &str = "luasnap-stall: ";

/// Writes its stall warning (in a mode's process), on one line.
pub fn report_stall(text: &str) {
    use std::io::Write;
    let line = text.replace('\n', " ");
    let _ = writeln!(std::io::stderr(), "{STALL}{line}");
}

/// Writes one progress line (in a mode's process).
pub fn report_progress(run: &str, done: u64, total: u64) {
    use std::io::Write;
    // Not eprintln!: a parent that went away closes the pipe, which is no reason to panic.
    let _ = writeln!(std::io::stderr(), "{PROGRESS}{run} {done} {total}");
}

/// What a mode's process gave.
#[derive(Debug)]
pub enum ModeOutcome {
    /// It ran to the end: its entry of `modes` in the JSON report, and, if it did not end in
    /// its process's reference state, the explanation (the report's `divergence`).
    Ran {
        /// The mode's figures (`modes[0]` of the child's report).
        report: serde_json::Value,
        /// Why it did not match the reference in its process.
        divergence: Option<serde_json::Value>,
    },
    /// It stopped: what the child said (a Lua error, a step over its budget, the arena run
    /// out), or how it ended (a signal).
    Failed(String),
}

/// Runs `backend` in a process of its own (see the module's doc); `progress` gets the child's
/// progress: (the run, `reference` or the mode's name; frames done; frames in the run);
/// `stalled` its stall warnings.
pub fn run(
    args: &SimulateArgs,
    backend: Backend,
    progress: &mut dyn FnMut(&str, u64, u64),
    stalled: &mut dyn FnMut(&str),
) -> ModeOutcome {
    match run_child(args, backend, progress, stalled) {
        Ok(outcome) => outcome,
        Err(e) => ModeOutcome::Failed(e),
    }
}

fn run_child(
    args: &SimulateArgs,
    backend: Backend,
    progress: &mut dyn FnMut(&str, u64, u64),
    stalled: &mut dyn FnMut(&str),
) -> Result<ModeOutcome, String> {
    let mut cmd = crate::second::same_game(args)?;
    cmd.args(["--mode", backend.name(), "--json", "--mode-process"])
        .args(["--delay", &args.delay.to_string()])
        .args(["--window", &args.window.to_string()])
        .args([
            "--saving",
            match args.saving {
                SavingArg::Every => "every",
                SavingArg::Sparse => "sparse",
                SavingArg::New => "new",
            },
        ]);
    if args.cpu_time {
        cmd.arg("--cpu-time");
    }
    let mut child = crate::tether::tether(&mut cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start its process: {e}"))?;
    let pid = child.id();
    // Read apart: a report larger than the pipe holds would otherwise wait for this process
    // to read stdout while this one waits for stderr to close.
    let mut stdout = child.stdout.take().expect("piped");
    let report = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout.read_to_end(&mut bytes).map(|_| bytes)
    });
    let mut said = Vec::new();
    for line in BufReader::new(child.stderr.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        if let Some(text) = line.strip_prefix(STALL) {
            stalled(text);
            continue;
        }
        match progress_line(&line) {
            Some((run, done, total)) => progress(run, done, total),
            None => said.push(line),
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("its process (pid {pid}): {e}"))?;
    let stdout = report
        .join()
        .map_err(|_| format!("its process (pid {pid}): its report could not be read"))?
        .map_err(|e| format!("its process (pid {pid}): its report: {e}"))?;
    Ok(outcome(pid, status, &stdout, &message(&said)))
}

/// `RUN DONE TOTAL` of a [`PROGRESS`] line.
fn progress_line(line: &str) -> Option<(&str, u64, u64)> {
    let rest = line.strip_prefix(PROGRESS)?;
    let mut words = rest.rsplitn(3, ' ');
    let total = words.next()?.parse().ok()?;
    let done = words.next()?.parse().ok()?;
    Some((words.next()?, done, total))
}

/// What the child said on stderr, without the tool's `luasnap: ` before its error, nor the
/// indent it printed its continuation lines with (this process indents them again when it
/// prints them).
fn message(lines: &[String]) -> String {
    let continuation = luasnap::bridge::runtime::CONTINUATION;
    let text = lines
        .iter()
        .map(|l| l.strip_prefix(continuation).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let text = text.trim();
    text.strip_prefix("luasnap: ").unwrap_or(text).to_string()
}

/// What a mode's process that ended with `status`, printed `stdout` and said `said` gave.
fn outcome(pid: u32, status: ExitStatus, stdout: &[u8], said: &str) -> ModeOutcome {
    if let Some(signal) = status.signal() {
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        let mut e = format!(
            "its process (pid {pid}) was killed by signal {signal} ({}{core})",
            signal_name(signal)
        );
        if !said.is_empty() {
            e.push_str(&format!("; it said: {said}"));
        }
        return ModeOutcome::Failed(e);
    }
    let report: Option<serde_json::Value> = serde_json::from_slice(stdout).ok();
    match report {
        // A mode that did not match its reference ends with an error, after its report.
        Some(mut v)
            if v["modes"][0].is_object() && (status.success() || !v["divergence"].is_null()) =>
        {
            let divergence = Some(v["divergence"].take()).filter(|d| !d.is_null());
            ModeOutcome::Ran {
                report: v["modes"][0].take(),
                divergence,
            }
        }
        _ if !said.is_empty() => ModeOutcome::Failed(said.to_string()),
        _ => ModeOutcome::Failed(format!(
            "its process (pid {pid}) ended ({status}) without a report"
        )),
    }
}

/// The usual name of a signal that ends a process.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        31 => "SIGSYS",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_read_back_and_other_lines_are_the_message() {
        assert_eq!(
            progress_line("luasnap-progress: reference 3 600"),
            Some(("reference", 3, 600))
        );
        assert_eq!(
            progress_line("luasnap-progress: incremental 600 600"),
            Some(("incremental", 600, 600))
        );
        assert_eq!(progress_line("luasnap: the game ran out of memory"), None);
        assert_eq!(progress_line("luasnap-progress: full x 600"), None);
        let said = [
            "luasnap: error in G.step".to_string(),
            "  at frame 7".into(),
        ];
        // The child indented its continuation lines; this process indents them when it
        // prints the message.
        assert_eq!(message(&said), "error in G.step\nat frame 7");
    }

    #[test]
    fn a_child_killed_by_a_signal_is_reported_as_such_even_after_a_report() {
        let killed = ExitStatus::from_raw(9);
        let report = br#"{"modes":[{"mode":"full"}],"divergence":null}"#;
        match outcome(42, killed, report, "") {
            ModeOutcome::Failed(e) => {
                assert!(
                    e.contains("pid 42") && e.contains("signal 9 (SIGKILL)"),
                    "{e}"
                )
            }
            o => panic!("{o:?}"),
        }
        // A report and a clean exit: it ran; an error exit without an explanation: it failed.
        assert!(matches!(
            outcome(42, ExitStatus::from_raw(0), report, ""),
            ModeOutcome::Ran {
                divergence: None,
                ..
            }
        ));
        match outcome(
            42,
            ExitStatus::from_raw(1 << 8),
            b"",
            "mode full failed: boom",
        ) {
            ModeOutcome::Failed(e) => assert_eq!(e, "mode full failed: boom"),
            o => panic!("{o:?}"),
        }
        match outcome(42, ExitStatus::from_raw(1 << 8), b"", "") {
            ModeOutcome::Failed(e) => assert!(e.contains("without a report"), "{e}"),
            o => panic!("{o:?}"),
        }
    }
}
