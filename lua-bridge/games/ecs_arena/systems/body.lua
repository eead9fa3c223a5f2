-- Keeps bump's world in step with tiny's: every entity with a body is a bump item while it is
-- in the tiny world.
local tiny = require("lib.tiny")
local ctx = require("context")

return function()
  local system = tiny.system({ filter = tiny.requireAll("pos", "body", "size") })

  function system:onAdd(e)
    ctx.bump:add(e, e.pos.x, e.pos.y, e.size.w, e.size.h)
  end

  function system:onRemove(e)
    if ctx.bump:hasItem(e) then ctx.bump:remove(e) end
  end

  return system
end
