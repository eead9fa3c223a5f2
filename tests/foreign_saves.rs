//! Foreign-trust loads, round four (issue 21): whatever a load does is bounded by its file,
//! it writes only into objects it built, finalizers come only from the game's own functions,
//! and the globals are permanents only where the host opts in. One test per class found;
//! each failed (or crashed) before its fix.
//!
//! Loads that crashed before their fix run in a child process (`in_child`): the test fails,
//! rather than the whole suite dying, if one comes back.

use luasnap::bridge::persist::forge::{self, Node, Proto};
use luasnap::bridge::persist::Trust;
use luasnap::bridge::Vm;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const CHILD_ENV: &str = "LUASNAP_FOREIGN_CHILD";
const DONE: &str = "foreign-child-finished";

/// A VM with the whole standard library (os, io and debug included: what an attack reaches).
fn vm() -> Vm {
    Vm::builder()
        .capacity(2048 * MIB)
        .memory_limit(1536 * MIB)
        .build()
        .unwrap()
}

/// Runs `body` in a child process (this test binary, filtered to `name`): a crash there fails
/// the test instead of taking the suite down.
fn in_child(name: &str, body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        println!("{DONE}");
        return;
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
        if start.elapsed() > Duration::from_secs(120) {
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
        None => panic!("the child hung (killed after 120 s)\n{stdout}\n{stderr}"),
        Some(st) => assert!(
            st.success() && stdout.contains(DONE),
            "the child did not finish cleanly ({st}): it crashed or failed\n{stdout}\n{stderr}"
        ),
    }
}

// ----- prototypes a failed compile leaves behind -----

#[test]
fn a_failed_compile_leaves_no_prototype_a_foreign_load_can_reach() {
    // A compile that fails leaves its half-built main prototype alive (NULL child slots, code
    // without its final return) until the collector frees it. A foreign load that names a
    // fingerprint the registered chunks lack searches every live prototype, and hashed that
    // one: a segfault.
    in_child(
        "a_failed_compile_leaves_no_prototype_a_foreign_load_can_reach",
        || {
            let mut vm = vm();
            vm.exec(
                "load('local function a() end local function b() end }')",
                "=x",
            )
            .unwrap();
            let node = Node::LClosure {
                proto: Proto::New {
                    index: 0,
                    hash: 12345,
                    src: b"=f".to_vec(),
                    line: 1,
                    code: vec![],
                    home: None,
                },
                n: 0,
                upvals: vec![],
            };
            let e = vm
                .unpersist(&forge::file(&node), "x", Trust::Foreign)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not among the chunks this VM has loaded"), "{e}");
        },
    );
}

