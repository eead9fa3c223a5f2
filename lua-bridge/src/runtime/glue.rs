//! The runtime's glue: the Lua chunk that ties a game script to the runtime, and its name.

/// The chunk name of the runtime's glue (what tracebacks show for `luasnap_step`).
pub const RUNTIME_CHUNK: &str = "=[luasnap runtime]";

/// The runtime's glue, run as its own chunk ([`RUNTIME_CHUNK`]) after the game's script ran
/// as its own: it returns the function that checks the game contract on the script's result
/// and installs `luasnap_game`, `luasnap_frame` and `luasnap_step`.
///
/// Its arguments: `G` and the host's frames between collection points (`nil`: the game's
/// `G.collect_every`, else the default, [`DEFAULT_COLLECT_EVERY`](super::DEFAULT_COLLECT_EVERY)).
/// `luasnap_step` returns whether the frame it ended is a collection point; the count is an
/// upvalue of it, in the state, so a game continued from a save keeps its points.
pub(crate) const DRIVER: &str = r#"return function(G, every, default)
  if type(G) ~= "table" then return "returned " .. type(G) .. ", not a table" end
  if type(G.init) ~= "function" then return "has no function G.init" end
  if type(G.step) ~= "function" then return "has no function G.step" end
  if every == nil then every = G.collect_every end
  if every == nil then every = default end
  if type(every) ~= "number" or every < 0 or every % 1 ~= 0 or every >= 2^53 then
    return "has G.collect_every = " .. tostring(every) .. "; it must be an integer from 0 to 2^53 "
      .. "(frames between collection points; 0: only where the game calls collectgarbage())"
  end
  luasnap_game = G
  luasnap_frame = 0
  local step = G.step
  function luasnap_step(inputs)
    step(inputs)
    local frame = luasnap_frame + 1
    luasnap_frame = frame
    return every > 0 and frame % every == 0
  end
  return nil
end
"#;

#[cfg(test)]
mod tests {
    /// The glue's name is one an update load never binds by place.
    #[test]
    fn the_glue_is_named_as_luasnap_chunks_are() {
        assert!(super::RUNTIME_CHUNK.starts_with(crate::persist::LUASNAP_CHUNK_PREFIX));
    }
}
