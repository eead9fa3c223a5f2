//! Second processes end with the process that started them.
//!
//! `simulate` and `p2p` start copies of `luasnap` (the lockstep reference, the second peer, the
//! replays). If the first process is killed (Ctrl-C, a test's timeout, `kill -9`), a copy running
//! a game that never ends would run on forever as an orphan. [`tether`] passes the starting
//! process's id in [`PARENT_ENV`]; a copy started with it watches its parent and exits when it
//! has another one (the first process is gone and the copy was adopted).

use std::io::Write;
use std::process::Command;
use std::time::Duration;

/// The environment variable naming the process a second process must not outlive.
pub const PARENT_ENV: &str = "LUASNAP_PARENT_PID";

/// How often a second process checks that its parent is still there.
const POLL: Duration = Duration::from_millis(200);

/// Marks `cmd` as a second process of this one: it exits when this process ends.
pub fn tether(cmd: &mut Command) -> &mut Command {
    cmd.env(PARENT_ENV, std::process::id().to_string())
}

/// In a second process (one started with [`PARENT_ENV`]), starts a watcher that ends this
/// process once its parent is not the process that started it. Does nothing otherwise.
pub fn watch_parent() {
    let Some(parent) = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return;
    };
    std::thread::spawn(move || loop {
        if std::os::unix::process::parent_id() != parent {
            // Not eprintln!: stderr is often a pipe to the parent that ended, and a panic on
            // the broken pipe would end this thread instead of the process.
            let _ = writeln!(
                std::io::stderr(),
                "luasnap: the process that started this one (pid {parent}) has ended; stopping"
            );
            std::process::exit(2);
        }
        std::thread::sleep(POLL);
    });
}
