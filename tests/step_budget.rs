//! The instruction budget of `G.step`: a runaway frame is stopped with a typed error that names
//! the frame, wherever the loop is (the step itself, a coroutine made before the budget was
//! set, a `pcall`), the game rolls back and goes on, and the budget (which lives in the OS
//! thread, not in the arena) never makes two runs of the same frames differ.

mod common;

use luasnap::bridge::runtime::{
    scripted_input, Backend, FrameSession, Game, GameConfig, GameError, DEFAULT_STEP_BUDGET,
};
use luasnap::bridge::simulate::{SimOptions, Simulation};
use luasnap::{Vm, VmError};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A game whose `G.step` runs `LOOP(kind)` when player 1's input is 99: `kind` picks where the
/// endless (or long) loop is. The coroutines are made in `G.init`, before any budget is set.
const GAME: &str = r#"
local G = {}
local n, gen, co = 0, nil, nil
local function spin(limit)
  local i = 0
  while limit == nil or i < limit do i = i + 1 end
  return i
end
function G.init()
  gen = coroutine.wrap(function()
    while true do
      local limit = coroutine.yield(n)
      if limit then spin(limit > 0 and limit or nil) end
    end
  end)
  gen()
  co = coroutine.create(function(limit)
    while true do
      if limit then spin(limit > 0 and limit or nil) end
      limit = coroutine.yield()
    end
  end)
end
local kinds = {
  plain = function(limit) spin(limit) end,
  wrap = function(limit) gen(limit or 0) end,
  resume = function(limit) assert(coroutine.resume(co, limit or 0)) end,
  pcall = function(limit) pcall(spin, limit) end,
  pcall_loop = function() while true do pcall(spin) end end,
  xpcall = function(limit) xpcall(spin, function(m) return m end, limit) end,
  wrap_in_pcall = function(limit) pcall(gen, limit or 0) end,
  close = function()
    local c = coroutine.create(function()
      local guard <close> = setmetatable({}, { __close = function() spin() end })
      coroutine.yield()
    end)
    coroutine.resume(c)
    coroutine.close(c)
  end,
}
function G.step(inputs)
  n = n + inputs[1]
  if inputs[2] == 99 then kinds[LOOP_KIND](LOOP_LIMIT) end
  gen()
end
function G.digest() return n end
return G
"#;

fn game(kind: &str, limit: Option<u64>, budget: Option<u64>) -> GameConfig {
    let script = GAME.replace("LOOP_KIND", &format!("{kind:?}")).replace(
        "LOOP_LIMIT",
        &limit.map_or("nil".to_string(), |l| l.to_string()),
    );
    let mut cfg = common::config(kind, &script, 2, 3);
    cfg.step_budget = budget;
    cfg
}

fn expect_budget_error(e: GameError, frame: u64, budget: u64) -> String {
    let text = e.to_string();
    match e {
        GameError::StepBudget {
            frame: f,
            budget: b,
            location,
            ..
        } => {
            assert_eq!((f, b), (frame, budget), "{text}");
            // The loop itself (`spin`, line 6 of GAME), even where a pcall caught the first
            // error and a later one, outside it, stopped the frame.
            let location = location.expect("where the budget ran out");
            assert!(location.ends_with(":6"), "{location}");
            assert!(text.contains(&format!("stopped at {location}")), "{text}");
        }
        other => panic!("expected GameError::StepBudget, got {other:?}"),
    }
    assert!(text.contains(&format!("frame {frame}")), "{text}");
    assert!(text.contains("endless loop"), "{text}");
    assert!(text.contains("roll back"), "{text}");
    text
}

/// Runs frames 0..3 normally, then frame 3 loops; the error names frame 3. Rolls back to the
/// snapshot of frame 3 and replays it without the loop: the arena equals that of a game that
/// never looped (the budget left nothing behind), and the game goes on.
fn stopped_then_rolled_back(kind: &str, limit: Option<u64>, budget: u64) -> String {
    let mut cfg = game(kind, limit, Some(budget));
    // Arena digests compare only at one base address: one per call (tests run in parallel),
    // used by the straight run and then by the session.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    cfg.base_address = Some(0x3a00_0000_0000 + (NEXT.fetch_add(1, Ordering::Relaxed) << 32));
    let calm = |f: u64| vec![scripted_input(3, f, 0), 1];
    let (straight_arena, straight_digest) = {
        let mut straight = Game::new(&cfg, Backend::ArenaIncremental).unwrap();
        for f in 0..6 {
            straight.step(&calm(f)).unwrap();
        }
        (straight.arena_digest(), straight.game_digest().unwrap())
    };
    let mut session: FrameSession =
        FrameSession::new(Game::new(&cfg, Backend::ArenaIncremental).unwrap(), 8);
    for f in 0..3 {
        session.advance(&calm(f)).unwrap();
    }
    let e = session.advance(&[5, 99]).unwrap_err();
    let text = expect_budget_error(e, 3, budget);
    // The VM is usable before the rollback too.
    session.game_mut().value_digest().unwrap();
    session.load_frame(3).unwrap();
    for f in 3..6 {
        session.advance(&calm(f)).unwrap();
    }
    assert_eq!(
        session.game().arena_digest(),
        straight_arena,
        "{kind}: after the rollback the arena is not that of a run that never looped"
    );
    assert_eq!(session.game().game_digest().unwrap(), straight_digest);
    text
}

#[test]
fn an_endless_loop_in_g_step_is_stopped_and_the_game_rolls_back() {
    let text = stopped_then_rolled_back("plain", None, 2_000_000);
    // Lua's traceback says where the loop was.
    assert!(
        text.contains("in upvalue 'spin'") || text.contains("spin"),
        "{text}"
    );
}

#[test]
fn an_endless_loop_in_a_coroutine_made_before_the_budget_is_stopped() {
    stopped_then_rolled_back("wrap", None, 2_000_000);
    stopped_then_rolled_back("resume", None, 2_000_000);
}

#[test]
fn a_pcall_does_not_swallow_the_budget_error() {
    stopped_then_rolled_back("pcall", None, 2_000_000);
    stopped_then_rolled_back("xpcall", None, 2_000_000);
    stopped_then_rolled_back("wrap_in_pcall", None, 2_000_000);
}

/// `while true do pcall(spin) end`: the loop around the pcall is stopped too.
#[test]
fn a_loop_of_pcalls_is_stopped() {
    let cfg = game("pcall_loop", None, Some(2_000_000));
    let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
    g.step(&[1, 1]).unwrap();
    match g.step(&[1, 99]).unwrap_err() {
        GameError::StepBudget { frame: 1, .. } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn close_handlers_of_a_coroutine_run_under_the_budget() {
    stopped_then_rolled_back("close", None, 2_000_000);
}

/// A game continued from a save-game, in a new VM: its coroutines (made by `G.init` before
/// the save) run under the budget as before, with every backend.
#[test]
fn coroutines_of_a_loaded_save_run_under_the_budget() {
    for kind in ["wrap", "resume"] {
        let cfg = game(kind, None, Some(2_000_000));
        let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
        for f in 0..3 {
            g.step(&[scripted_input(3, f, 0), 1]).unwrap();
        }
        let save = g.save_game().unwrap();
        for backend in Backend::ALL {
            let mut loaded = Game::from_save(&cfg, backend, &save).unwrap();
            loaded.step(&[1, 1]).unwrap();
            expect_budget_error(loaded.step(&[1, 99]).unwrap_err(), 4, 2_000_000);
        }
    }
}

/// Finite loops: over the budget they are stopped (these would pass, not hang, if a kind of
/// thread escaped the budget); under it, or with no budget, they finish.
#[test]
fn long_loops_count_against_the_budget_in_every_thread() {
    for kind in ["plain", "wrap", "resume", "pcall", "wrap_in_pcall"] {
        for (budget, stopped) in [
            (Some(1_000_000), true),
            (Some(20_000_000), false),
            (None, false),
        ] {
            let cfg = game(kind, Some(2_000_000), budget);
            let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
            g.step(&[1, 1]).unwrap();
            let r = g.step(&[1, 99]);
            if stopped {
                expect_budget_error(r.unwrap_err(), 1, budget.unwrap());
            } else {
                r.unwrap_or_else(|e| panic!("{kind} {budget:?}: {e}"));
                g.step(&[1, 1]).unwrap();
            }
        }
    }
}

/// The budget leaves nothing in the arena: the same frames give the same bytes whatever the
/// budget's size, and host calls without a budget between frames (which resume the
/// coroutines) do not make runs differ.
#[test]
fn the_budget_leaves_the_same_bytes_in_every_run() {
    let run = |budget: Option<u64>, peek: bool| {
        // One base address for every run (they run one after the other).
        let mut cfg = game("wrap", Some(3000), budget);
        cfg.base_address = Some(0x3b00_0000_0000);
        let mut g = Game::new(&cfg, Backend::ArenaFull).unwrap();
        for f in 0..20 {
            g.step(&[scripted_input(3, f, 0), if f % 3 == 0 { 99 } else { 1 }])
                .unwrap();
            if peek {
                g.game_digest().unwrap();
            }
        }
        g.arena_digest()
    };
    let small = run(Some(1_000_000), false);
    assert_eq!(small, run(Some(DEFAULT_STEP_BUDGET), false));
    assert_eq!(small, run(Some(u64::MAX), false));
    assert_eq!(
        run(Some(1_000_000), true),
        run(Some(DEFAULT_STEP_BUDGET), true)
    );
}

/// Every backend still ends in the reference state with the budget on (the default) on a game
/// whose coroutines are resumed every frame.
#[test]
fn every_backend_matches_the_reference_under_the_budget() {
    let opts = SimOptions {
        game: game("wrap", Some(3000), Some(DEFAULT_STEP_BUDGET)),
        frames: 120,
        delay: 3,
        start: None,
        start_trust: luasnap::bridge::persist::Trust::Foreign,
        saving: luasnap::bridge::runtime::Saving::EveryFrame,
    };
    let mut sim = Simulation::new(opts).unwrap();
    let (reference, _) = sim.reference(false).unwrap();
    for b in Backend::ALL {
        let r = sim.run(b, &reference).unwrap();
        assert!(r.matches_reference, "{b:?}");
    }
}

/// `Vm::call_with_budget` on its own: the main thread's hook is put back, a coroutine keeps
/// no budget after the call, and a spent budget does not leak into the next call.
#[test]
fn vm_calls_with_a_budget() {
    let mut vm = Vm::builder().capacity(64 << 20).build().unwrap();
    vm.exec(
        "co = coroutine.wrap(function(k) while true do
            for _ = 1, k do end
            k = coroutine.yield()
          end end)
         function spin() while true do end end
         function work(k) return co(k) end",
        "setup",
    )
    .unwrap();
    let before = vm.snapshot().unwrap();
    let e = vm.call_with_budget::<()>("spin", (), 100_000).unwrap_err();
    assert!(
        matches!(
            e,
            VmError::InstructionBudget {
                budget: 100_000,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("endless loop"), "{e}");
    // The coroutine ran under a budget and was over it; without one it runs freely.
    assert!(matches!(
        vm.call_with_budget::<()>("work", 2_000_000, 100_000),
        Err(VmError::InstructionBudget { .. })
    ));
    vm.rollback(before).unwrap();
    vm.call_with_budget::<()>("work", 1000, 100_000).unwrap();
    vm.call::<()>("work", 2_000_000).unwrap();
    vm.call_with_budget::<()>("work", 1000, 100_000).unwrap();
}

/// Code without loops pays at each call and return: an exponential recursion, an endless
/// chain of tail calls and recursions that only end by overflowing the stack are stopped,
/// located in the functions they keep entering.
#[test]
fn recursion_and_tail_calls_are_stopped() {
    let vm = Vm::builder().capacity(64 << 20).build().unwrap();
    vm.exec(
        "local function tree(n)
           if n > 0 then tree(n - 1) tree(n - 1) end
         end
         local function chase(n)
           return chase(n + 1)
         end
         local function deep() deep() end
         local function retry() pcall(deep) retry() end
         function grow() tree(60) end
         function run() chase(0) end
         function dive() retry() end",
        "calls",
    )
    .unwrap();
    // `dive`: each `pcall(deep)` recurses until the stack overflows, without a return, a loop
    // or a tail call; `retry` goes one level deeper each time.
    for (f, lines) in [("grow", 1..=3), ("run", 4..=6), ("dive", 7..=8)] {
        match vm.call_with_budget::<()>(f, (), 1_000_000).unwrap_err() {
            VmError::InstructionBudget { location, .. } => {
                let location = location.expect("where the budget ran out");
                let line: u32 = location.rsplit(':').next().unwrap().parse().unwrap();
                assert!(lines.contains(&line), "{f}: {location}");
            }
            other => panic!("{f}: {other:?}"),
        }
    }
}

/// The message handler of the budget's error runs to its end (within a grace of a million
/// instructions), and the code after the `xpcall` sees what it returned; the call still fails.
#[test]
fn an_xpcall_handler_runs_after_the_budget_is_spent() {
    let vm = Vm::builder().capacity(64 << 20).build().unwrap();
    vm.exec(
        "function spin() while true do end end
         function guarded()
           local ok, m = xpcall(spin, function(m)
             local n = 0
             for i = 1, 10 do n = n + i end
             return 'handled ' .. n
           end)
           seen = m
         end",
        "xpcall",
    )
    .unwrap();
    let e = vm
        .call_with_budget::<()>("guarded", (), 100_000)
        .unwrap_err();
    assert!(matches!(e, VmError::InstructionBudget { .. }), "{e:?}");
    assert_eq!(vm.get::<String>("seen").unwrap(), "handled 55");
}

/// A message handler that never ends is stopped too (under the count hook this replaced, and
/// before the handlers' grace, it ran forever: hooks were off in it).
#[test]
fn an_xpcall_handler_that_never_ends_is_stopped() {
    let vm = Vm::builder().capacity(64 << 20).build().unwrap();
    vm.exec(
        "function spin() while true do end end
         function guarded()
           xpcall(spin, function() while true do end end)
           after = true
         end",
        "xpcall",
    )
    .unwrap();
    let e = vm
        .call_with_budget::<()>("guarded", (), 100_000)
        .unwrap_err();
    assert!(matches!(e, VmError::InstructionBudget { .. }), "{e:?}");
    assert_eq!(vm.last_budget_used(), 100_000);
    // The VM is whole: more calls, budgeted or not, work.
    vm.exec("x = 1 + 1", "after").unwrap();
    assert_eq!(vm.get::<i64>("x").unwrap(), 2);
    vm.call_with_budget::<()>("spin", (), 1000).unwrap_err();
}

/// What a budgeted call charged grows with the work it did, and stays at most its budget.
#[test]
fn the_budget_used_follows_the_work() {
    let vm = Vm::builder().capacity(64 << 20).build().unwrap();
    vm.exec(
        "n = 0 function count(k) for _ = 1, k do n = n + 1 end end",
        "count",
    )
    .unwrap();
    vm.call_with_budget::<()>("count", 1000, 10_000_000)
        .unwrap();
    let small = vm.last_budget_used();
    vm.call_with_budget::<()>("count", 100_000, 10_000_000)
        .unwrap();
    let large = vm.last_budget_used();
    assert!((1000..10_000).contains(&small), "{small}");
    assert!(large > 90 * small && large < 110 * small, "{small} {large}");
    let _ = vm.call_with_budget::<()>("count", 100_000_000, 1000);
    assert_eq!(vm.last_budget_used(), 1000);
}

/// The budget belongs to the OS thread: a second budgeted call while one runs (here from a
/// native, into another VM) is refused, and Lua code of the other VM run meanwhile pays into
/// the running budget.
#[test]
fn one_budgeted_call_at_a_time_on_a_thread() {
    use std::rc::Rc;
    let other = Rc::new(Vm::builder().capacity(64 << 20).build().unwrap());
    other
        .exec("function spin() while true do end end", "other")
        .unwrap();
    let (nested, plain) = (other.clone(), other);
    let vm = Vm::builder()
        .capacity(64 << 20)
        .native("nested", move |_call| {
            nested
                .call_with_budget::<()>("spin", (), 1000)
                .map_err(|e| luasnap::NativeError::new(e.to_string()))
        })
        .native("plain", move |_call| {
            plain
                .call::<()>("spin", ())
                .map_err(|e| luasnap::NativeError::new(e.to_string()))
        })
        .build()
        .unwrap();
    vm.exec(
        "function try_nested() local ok, m = pcall(nested) refused = m end",
        "outer",
    )
    .unwrap();
    vm.call_with_budget::<()>("try_nested", (), 1_000_000)
        .unwrap();
    let refused = vm.get::<String>("refused").unwrap();
    assert!(
        refused.contains("another runs on the same thread"),
        "{refused}"
    );
    // The other VM's endless loop, called without a budget of its own, is stopped by ours.
    vm.exec("function try_plain() plain() end", "outer")
        .unwrap();
    assert!(matches!(
        vm.call_with_budget::<()>("try_plain", (), 1_000_000),
        Err(VmError::InstructionBudget { .. })
    ));
}

/// A finalizer that never ends, called at a collection point after a step (weak entries and
/// finalizers wait for those: docs/gc.md, "Collection points"), is stopped by a budget of the
/// step's size, and the frame fails with the budget's error.
#[test]
fn a_finalizer_at_a_collection_point_runs_under_the_budget() {
    let script = r#"
local G = { collect_every = 2 }
function G.init() end
function G.step(inputs)
  if inputs[1] == 99 then
    setmetatable({}, { __gc = function() while true do end end })
  end
end
return G
"#;
    let cfg = GameConfig {
        step_budget: Some(2_000_000),
        ..common::config("endless_gc", script, 1, 1)
    };
    let mut g: Game = Game::new(&cfg, Backend::ArenaFull).unwrap();
    g.step(&[99]).unwrap(); // frame 1: no point, the object waits
    match g.step(&[0]).unwrap_err() {
        GameError::StepBudget { frame: 1, .. } => {}
        other => panic!("expected GameError::StepBudget at frame 1, got {other:?}"),
    }
}
