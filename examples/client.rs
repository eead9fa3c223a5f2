//! A small game client on luasnap: Rust natives and a plain-data userdata registered through
//! the game's setup hook, structured per-player inputs, a GGRS SyncTest written against the
//! re-exported `luasnap::ggrs`, two P2P peers on 127.0.0.1, and a save-game written by one run
//! and continued by another.
//!
//! ```text
//! cargo run --release --example client                       # everything, one process
//! cargo run --release --example client -- save /tmp/g.save   # run 1: play, write a save-game
//! cargo run --release --example client -- load /tmp/g.save   # run 2: load it, play on
//! ```
//!
//! `cargo test` runs it too (the `tests` module at the bottom), the second run in a child
//! process.

use luasnap::bridge::ggrs_adapter::{p2p_pair_with, Checksum, GgrsGame, LuaGgrs, SessionOptions};
use luasnap::bridge::runtime::{Backend, Game, GameConfig, GameInput, VmSetup};
use luasnap::ggrs::{GgrsError, SessionBuilder};
use luasnap::{Error, PlainData, Value};
use std::time::Duration;

/// The game: players steer ships; a shot hits the nearest other ship. `host.*` are natives.
const GAME: &str = r#"
local G, world = {}, nil
function G.init(players, seed)
  world = { tick = 0, ships = {}, log = {} }
  G.world = world -- reachable from Rust as `luasnap_game.world`
  for p = 1, players do
    world.ships[p] = { name = "ship" .. p, pos = host.vec2(p * 10, 0), hp = 5, kills = 0 }
  end
end
function G.step(inputs)
  world.tick = world.tick + 1
  for p, pad in ipairs(inputs) do
    local ship = world.ships[p]
    if ship.hp > 0 then
      ship.pos.x = host.clamp(ship.pos.x + pad.dx, -100, 100)
      ship.pos.y = host.clamp(ship.pos.y + pad.dy, -100, 100)
      if pad.fire then
        -- The native sorts the other ships' numbers with a Lua comparator (a callback into
        -- Lua). Values cross by copy, so it sorts numbers, not the ship tables themselves.
        local others = {}
        for q, other in ipairs(world.ships) do
          if q ~= p and other.hp > 0 then others[#others + 1] = q end
        end
        local sorted = host.sort_by(others, function(a, b)
          return ship.pos:dist(world.ships[a].pos) < ship.pos:dist(world.ships[b].pos)
        end)
        local target = world.ships[sorted[1]]
        if target then
          target.hp = target.hp - 1
          if target.hp == 0 then ship.kills = ship.kills + 1 end
          world.log[#world.log % 8 + 1] = ship.name .. " hit " .. target.name
        end
      end
    end
  end
end
function G.digest()
  local h = world.tick
  for _, s in ipairs(world.ships) do
    h = (h * 31 + math.floor(s.pos.x) * 7 + math.floor(s.pos.y) * 3 + s.hp * 5 + s.kills) % 0x7fffffff
  end
  return h
end
return G
"#;

/// One player's input for a frame; Lua sees `{ dx = .., dy = .., fire = .. }`.
#[derive(Clone, Copy, PartialEq, Default, Debug, serde::Serialize, serde::Deserialize)]
struct Pad {
    dx: i8,
    dy: i8,
    fire: bool,
}

impl GameInput for Pad {}

/// A position: plain data stored inline in the Lua heap, with fields and a method.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Vec2 {
    x: f64,
    y: f64,
}

impl PlainData for Vec2 {
    const NAME: &'static str = "Vec2";
}

/// The inputs: a pure function of (seed, frame, player), as a recorded match would be.
fn pad(seed: u64, frame: u64, player: usize) -> Pad {
    let b = luasnap::bridge::runtime::scripted_input(seed, frame, player);
    Pad {
        dx: (b & 3) as i8 - 1,
        dy: ((b >> 2) & 3) as i8 - 1,
        fire: b & 16 != 0 && frame % 3 == 0,
    }
}

fn config(players: usize, seed: u64) -> GameConfig {
    let mut cfg = GameConfig::default_game(players, seed);
    cfg.script = GAME.into();
    cfg.chunk_name = "=ships".into();
    cfg.capacity = 256 << 20;
    cfg.base_address = None; // several VMs in one process: let the OS place each arena
    cfg.setup = VmSetup::new(|b| {
        b.native("host.clamp", |call| {
            let (x, lo, hi): (f64, f64, f64) = (call.get(0)?, call.get(1)?, call.get(2)?);
            call.ret(x.clamp(lo, hi));
            Ok(())
        })
        .native("host.vec2", |call| {
            call.ret(Value::userdata(Vec2 {
                x: call.get(0)?,
                y: call.get(1)?,
            }));
            Ok(())
        })
        .native("host.sort_by", |call| {
            // A stable merge sort in Rust driven by a Lua comparator: deterministic.
            let mut items: Vec<Value> = call.get(0)?;
            let mut failed = None;
            items.sort_by(
                |a, b| match call.call_function::<bool>(1, (a.clone(), b.clone())) {
                    Ok(true) => std::cmp::Ordering::Less,
                    Ok(false) => std::cmp::Ordering::Greater,
                    Err(e) => {
                        failed.get_or_insert(e);
                        std::cmp::Ordering::Equal
                    }
                },
            );
            if let Some(e) = failed {
                return Err(e);
            }
            call.ret(luasnap::Table::from_array(items));
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
            m.method("dist", |a, call| {
                let b = *call.userdata::<Vec2>(1)?;
                call.ret((a.x - b.x).hypot(a.y - b.y));
                Ok(())
            });
        })
    });
    cfg
}

/// Plays `frames` frames from the game's current frame.
fn play(game: &mut Game<Pad>, frames: u64) -> Result<(), Error> {
    let players = game.players();
    for _ in 0..frames {
        let f = game.frame();
        let inputs: Vec<Pad> = (0..players).map(|p| pad(game.seed(), f, p)).collect();
        game.step(&inputs)?;
    }
    Ok(())
}

/// Typed reads of the game's state, lazily through handles: nothing is copied but what is
/// read.
fn report(game: &Game<Pad>) -> Result<String, Error> {
    let vm = game.vm();
    let mut out = format!("frame {}:", game.frame());
    let ships = vm.table("luasnap_game.world.ships")?;
    for i in 1..=ships.len()? {
        let ship = ships.table(i)?;
        let name: String = ship.get("name")?;
        let (hp, kills): (u8, u32) = (ship.get("hp")?, ship.get("kills")?);
        let x: f64 = ship.get_path("pos.x")?; // a userdata field, through its getter
        out += &format!(" {name}(hp={hp} kills={kills} x={x})");
    }
    let digest: i64 = vm.call("luasnap_game.digest", ())?;
    out += &format!(" digest={digest}");
    Ok(out)
}

/// A GGRS SyncTest written against the re-exported `luasnap::ggrs`: every frame, GGRS rolls
/// back `check_distance` frames, re-simulates them and compares their checksums.
fn sync_test(frames: u64) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = config(2, 7);
    let game = Game::new(&cfg, Backend::ArenaAuto)?;
    let mut session = SessionBuilder::<LuaGgrs<Pad>>::new()
        .with_num_players(2)?
        .with_check_distance(6)
        .start_synctest_session()?;
    let mut driver = GgrsGame::<LuaGgrs<Pad>>::new(game, Checksum::Auto, &session)?;
    for f in 0..frames {
        for p in 0..2 {
            session.add_local_input(p, pad(cfg.seed, f, p))?;
        }
        match session.advance_frame() {
            Ok(requests) => driver.handle(requests)?,
            Err(GgrsError::MismatchedChecksum { current_frame, .. }) => {
                return Err(format!("desync at frame {current_frame}").into())
            }
            Err(e) => return Err(e.into()),
        }
    }
    println!(
        "synctest: {frames} frames, {} rollbacks, {} frames advanced; {}",
        driver.loads,
        driver.advances,
        report(driver.game())?
    );
    Ok(())
}

/// Two peers, each with its own VM, over UDP on 127.0.0.1 with desync detection.
fn p2p(frames: u64) -> Result<(), Box<dyn std::error::Error>> {
    let [a, b] = p2p_pair_with(
        &config(2, 11),
        frames,
        Duration::from_secs(120),
        &SessionOptions::default(),
        pad,
    )?;
    if !a.desyncs.is_empty() || !b.desyncs.is_empty() {
        return Err(format!("desync: {:?} {:?}", a.desyncs, b.desyncs).into());
    }
    println!(
        "p2p: peers reached frames {} and {} with {} and {} rollbacks, no desync",
        a.frames, b.frames, a.rollbacks, b.rollbacks
    );
    Ok(())
}

/// Run 1: play, then write a save-game.
fn save_run(path: &std::path::Path, frames: u64) -> Result<i64, Box<dyn std::error::Error>> {
    let mut game = Game::new(&config(3, 5), Backend::ArenaAuto)?;
    play(&mut game, frames)?;
    std::fs::write(path, game.save_game()?)?;
    println!("saved {} ({})", path.display(), report(&game)?);
    Ok(game.game_digest()?.unwrap_or(0))
}

/// Run 2: load the save-game (the natives and userdata come from the same setup hook) and
/// play on.
fn load_run(path: &std::path::Path, frames: u64) -> Result<i64, Box<dyn std::error::Error>> {
    let mut game = Game::from_save(&config(3, 5), Backend::ArenaAuto, &std::fs::read(path)?)?;
    let loaded_at = game.frame();
    play(&mut game, frames)?;
    println!("loaded at frame {loaded_at}, played on: {}", report(&game)?);
    Ok(game.game_digest()?.unwrap_or(0))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, path] if cmd == "save" => {
            save_run(path.as_ref(), 200)?;
        }
        [cmd, path] if cmd == "load" => {
            load_run(path.as_ref(), 100)?;
        }
        [] => {
            sync_test(240)?;
            p2p(120)?;
            let path =
                std::env::temp_dir().join(format!("luasnap-client-{}.save", std::process::id()));
            save_run(&path, 200)?;
            load_run(&path, 100)?;
            std::fs::remove_file(&path)?;
        }
        _ => return Err("usage: client [save PATH | load PATH]".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_test_and_p2p_run_without_desync() {
        sync_test(120).unwrap();
        p2p(60).unwrap();
    }

    /// The save is written here and continued in a second process; its state after 100 more
    /// frames matches a game that played all 300 frames straight.
    #[test]
    fn a_save_game_continues_in_a_second_process() {
        if let Some(path) = std::env::var_os("CLIENT_SAVE") {
            let digest = load_run(path.as_ref(), 100).unwrap();
            println!("DIGEST {digest}");
            return;
        }
        let path =
            std::env::temp_dir().join(format!("luasnap-client-test-{}.save", std::process::id()));
        save_run(&path, 200).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::a_save_game_continues_in_a_second_process",
                "--nocapture",
            ])
            .env("CLIENT_SAVE", &path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let second: i64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("DIGEST "))
            .expect("the child reports its digest")
            .trim()
            .parse()
            .unwrap();
        let mut straight = Game::new(&config(3, 5), Backend::ArenaFull).unwrap();
        play(&mut straight, 300).unwrap();
        assert_eq!(Some(second), straight.game_digest().unwrap());
        let _ = std::fs::remove_file(&path);
    }
}
