//! Tests that run in a child process: a crash, an exit or a hang there fails the test instead
//! of taking the suite down.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that names the test a child process runs.
const CHILD_ENV: &str = "LUASNAP_TEST_CHILD";
/// What a child prints once its body returned.
const DONE: &str = "test-child-finished";
/// How long a child may run before it counts as hung.
const HUNG: Duration = Duration::from_secs(120);

/// Runs `body` in a child process (this test binary, filtered to `name`, the calling test's
/// name). Returns the child's stderr in the parent, None in the child.
pub fn in_child(name: &str, body: impl FnOnce()) -> Option<String> {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        println!("{DONE}");
        return None;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > HUNG {
            child.kill().unwrap();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    match status {
        None => panic!("the child hung (killed after {HUNG:?})\n{stdout}\n{stderr}"),
        Some(st) => assert!(
            st.success() && stdout.contains(DONE),
            "the child did not finish cleanly ({st}): it crashed, exited or failed\n{stdout}\n{stderr}"
        ),
    }
    Some(stderr.into_owned())
}

/// Runs the test `name` of this binary in a child process with the environment variable
/// `var` set to `value` (what the child test reads to know it is the child, and its input),
/// and returns what it printed. A child that fails fails the calling test, with its output.
pub fn run_with(name: &str, var: &str, value: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(var, value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the child process ({name}) failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// What follows `tag` on each line of a child's output that holds it, in order.
pub fn fields(stdout: &str, tag: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.find(tag).map(|at| l[at + tag.len()..].to_string()))
        .collect()
}
