//! A host binary for a game with natives and a userdata type: the whole `luasnap` tool for
//! that game in a few lines (`luasnap_cli::main_with`), the natives registered on every VM
//! it builds, second processes included.
//!
//! ```text
//! cargo run --release -p luasnap-cli --example host_game                  # simulate its game
//! cargo run --release -p luasnap-cli --example host_game -- simulate cli/examples/host_game.lua --save /tmp/a.sav
//! cargo run --release -p luasnap-cli --example host_game -- p2p cli/examples/host_game.lua
//! cargo run --release -p luasnap-cli --example host_game -- diff /tmp/a.sav /tmp/b.sav --game cli/examples/host_game.lua
//! ```
//!
//! (`luasnap diff` without the natives reads the same saves too, with named stand-ins for
//! them.) cli/tests/host_game.rs runs it.

use luasnap::bridge::runtime::VmSetup;
use luasnap::PlainData;
use std::process::ExitCode;

/// A position: plain data stored inline in the Lua heap.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Vec2 {
    x: f64,
    y: f64,
}

impl PlainData for Vec2 {
    const NAME: &'static str = "Vec2";
}

/// The game's natives and userdata type.
fn setup() -> VmSetup {
    VmSetup::new(|b| {
        b.native("host.clamp", |call| {
            let (x, lo, hi): (f64, f64, f64) = (call.get(0)?, call.get(1)?, call.get(2)?);
            call.ret(x.clamp(lo, hi));
            Ok(())
        })
        .native("host.vec2", |call| {
            call.ret(luasnap::Value::userdata(Vec2 {
                x: call.get(0)?,
                y: call.get(1)?,
            }));
            Ok(())
        })
        // A die that is a pure function of its arguments: rollbacks re-roll the same.
        .native("host.roll", |call| {
            let (seed, tick, p): (i64, i64, i64) = (call.get(0)?, call.get(1)?, call.get(2)?);
            let x = (seed ^ tick.wrapping_mul(0x9E37_79B9) ^ (p << 20)) as u64;
            call.ret(1 + (x.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 61) as i64);
            Ok(())
        })
        .userdata::<Vec2>(|m| {
            m.field_get("x", |v| v.x);
            m.field_get("y", |v| v.y);
            m.field_set("x", |v, x: f64| {
                v.x = x;
                Ok(())
            });
            m.field_set("y", |v, y: f64| {
                v.y = y;
                Ok(())
            });
        })
    })
}

fn main() -> ExitCode {
    if std::env::args_os().len() > 1 {
        return luasnap_cli::main_with(setup());
    }
    // No command: simulate the game next to this file.
    let game = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/host_game.lua");
    luasnap_cli::run_with(["host_game", "simulate", game, "--frames", "120"], setup())
}
