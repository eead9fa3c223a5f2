//! The runtime's glue: the Lua chunk that ties a game script to the runtime, and its name.

/// The chunk name of the runtime's glue (what tracebacks show for `luasnap_step`).
pub const RUNTIME_CHUNK: &str = "=[luasnap runtime]";

/// The runtime's glue, run as its own chunk ([`RUNTIME_CHUNK`]) after the game's script ran
/// as its own: it returns the function that checks the game contract on the script's result
/// and installs `luasnap_game`, `luasnap_frame` and `luasnap_step`.
pub(crate) const DRIVER: &str = r#"return function(G)
  if type(G) ~= "table" then return "returned " .. type(G) .. ", not a table" end
  if type(G.init) ~= "function" then return "has no function G.init" end
  if type(G.step) ~= "function" then return "has no function G.step" end
  luasnap_game = G
  luasnap_frame = 0
  local step = G.step
  function luasnap_step(inputs)
    step(inputs)
    luasnap_frame = luasnap_frame + 1
  end
  return nil
end
"#;
