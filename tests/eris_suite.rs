//! Eris's own test suite, ported to Lua 5.5 (`tests/eris/`), run as Eris runs it: one process
//! persists, another that never ran the persisting script unpersists and checks.
//!
//! Each case either passes or is listed in `tests/eris/known-failures.txt` with the reason. The
//! test fails on a case that fails without being listed, and on a listed case that now passes
//! (so the list only ever shrinks, and says exactly what is left).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use luasnap::bridge::{PlainData, Value, Vm};

/// The stand-in for the C boxes of Eris's test host: 8 bytes of plain data.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ErisBox {
    value: i64,
}

impl PlainData for ErisBox {
    const NAME: &'static str = "ErisBox";
}

/// Host functions Eris's C test host defines (`createludata`, `boxinteger`, `boxboolean`,
/// `unboxboolean`, plus `unboxinteger`), written with what a luasnap host has: a plain-data box
/// given a metatable of its own, so it persists through `__persist` as Eris's userdata do.
const HOST_PRELUDE: &str = r#"
local newbox, boxvalue = erishost.newbox, erishost.boxvalue
erishost = nil
local boxmt = debug.getmetatable(newbox(0))
local function read(ud)
  local mt = debug.getmetatable(ud)
  debug.setmetatable(ud, boxmt)
  local ok, v = pcall(boxvalue, ud)
  debug.setmetatable(ud, mt)
  if not ok then error(v, 2) end
  return v
end
function createludata()
  local x = {}
  return debug.upvalueid(function() return x end, 1)
end
function boxinteger(n)
  return debug.setmetatable(newbox(n), { __persist = true })
end
function unboxinteger(ud) return read(ud) end
function boxboolean(b)
  return debug.setmetatable(newbox(b and 1 or 0), { __persist = booleanpersist })
end
function unboxboolean(ud) return read(ud) ~= 0 end
"#;

fn host_vm() -> Vm {
    Vm::builder()
        .capacity(512 << 20)
        .native("erishost.newbox", |call| {
            let v = call.integer(0)?;
            call.ret(Value::userdata(ErisBox { value: v }));
            Ok(())
        })
        .native("erishost.boxvalue", |call| {
            let v = call.userdata::<ErisBox>(0)?.value;
            call.ret(v);
            Ok(())
        })
        .userdata::<ErisBox>(|_| {})
        .build()
        .expect("a VM for the Eris suite")
}

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/eris")
}

/// Runs one side of the suite in this process (called in a child process).
fn run_side(side: &str, dir: &str) {
    let vm = host_vm();
    vm.exec(HOST_PRELUDE, "=eris_host")
        .unwrap_or_else(|e| panic!("host prelude: {e}"));
    let script = suite_dir().join(format!("{side}.lua"));
    let source = std::fs::read(&script).unwrap();
    let chunkname = format!("@{}", script.display());
    vm.exec_with_args(source, &chunkname, &[Value::from(dir)])
        .unwrap_or_else(|e| panic!("{side}.lua: {e}"));
}

/// Entry point of the child processes: does nothing unless the parent set `ERIS_SIDE`.
#[test]
fn eris_child() {
    if let (Ok(side), Ok(dir)) = (std::env::var("ERIS_SIDE"), std::env::var("ERIS_DIR")) {
        run_side(&side, &dir);
    }
}

fn child(side: &str, dir: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "eris_child", "--nocapture", "--test-threads=1"])
        .env("ERIS_SIDE", side)
        .env("ERIS_DIR", dir)
        .output()
        .expect("spawn the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{side} process failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `name -> reason` from known-failures.txt (`name: reason` per line, `#` comments).
fn known_failures() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(suite_dir().join("known-failures.txt")).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, why) = l.split_once(':').unwrap_or((l, ""));
            (name.trim().to_string(), why.trim().to_string())
        })
        .collect()
}

#[test]
fn eris_suite_across_processes() {
    if std::env::var("ERIS_SIDE").is_ok() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("luasnap-eris-")
        .tempdir()
        .unwrap();
    child("persist", dir.path());
    let report = child("unpersist", dir.path());
    drop(dir);

    let mut results = BTreeMap::new();
    for line in report.lines() {
        let Some(rest) = line.strip_prefix("CASE ") else {
            continue;
        };
        let (name, verdict) = rest.split_once(' ').unwrap();
        results.insert(name.to_string(), verdict.to_string());
    }
    assert!(results.len() >= 60, "too few cases ran:\n{report}");
    let known = known_failures();
    let passed = results.values().filter(|v| *v == "PASSED").count();
    println!("Eris suite: {passed} of {} cases passed", results.len());

    let mut problems = Vec::new();
    for (name, verdict) in &results {
        match (verdict == "PASSED", known.contains_key(name)) {
            (false, false) => problems.push(format!("{name} failed: {verdict}")),
            (true, true) => problems.push(format!(
                "{name} passes now: remove it from tests/eris/known-failures.txt"
            )),
            _ => {}
        }
    }
    for name in known.keys() {
        if !results.contains_key(name) {
            problems.push(format!(
                "{name} is listed as a known failure but did not run"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n\nfull report:\n{report}",
        problems.join("\n")
    );
}
