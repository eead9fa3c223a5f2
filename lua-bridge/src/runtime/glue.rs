//! The runtime's glue: the Lua chunk that ties a game script to the runtime, and its name
//! (the value digest leaves the glue's bookkeeping out, so it needs the name too).

/// The chunk name of the runtime's glue (what tracebacks show for `luasnap_step`).
pub const RUNTIME_CHUNK: &str = "=[luasnap runtime]";

/// The runtime's glue, run as its own chunk ([`RUNTIME_CHUNK`]) after the game's script ran
/// as its own: it returns the function that checks the game contract on the script's result
/// and installs `luasnap_game`, `luasnap_frame` and `luasnap_step`.
///
/// `luasnap_step` also runs the collector when the runtime manages it (see
/// `Game::manage_collector` and docs/gc.md, "When the collector runs"): while automatic
/// collection is stopped, it runs a full collection right after `G.step` whenever the heap has
/// grown by `max(live, growth_kib)` since the last one (`live`: the heap after it). The
/// bookkeeping (`gc_live`) is an upvalue, in the arena: it rolls back with the game, so the
/// reference and every re-simulation collect at the same frames. The value digest leaves it
/// out (it depends on the garbage in the heap, not on the game).
pub(crate) const DRIVER: &str = r#"return function(G, growth_kib)
  if type(G) ~= "table" then return "returned " .. type(G) .. ", not a table" end
  if type(G.init) ~= "function" then return "has no function G.init" end
  if type(G.step) ~= "function" then return "has no function G.step" end
  luasnap_game = G
  luasnap_frame = 0
  local step = G.step
  local gc_live
  function luasnap_step(inputs)
    -- The global, not an upvalue: save-games would refer to it, and foreign loads (`luasnap
    -- diff`) refuse the collector's controls.
    local gc = collectgarbage
    local managed = type(gc) == "function" and not gc("isrunning")
    if managed and gc_live == nil then gc_live = gc("count") end
    step(inputs)
    luasnap_frame = luasnap_frame + 1
    if managed then
      local growth = gc_live > growth_kib and gc_live or growth_kib
      if gc("count") >= gc_live + growth then
        gc("collect")
        gc_live = gc("count")
      end
    end
  end
  return nil
end
"#;
