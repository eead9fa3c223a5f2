-- Bullets, sparks and scrap expire.
local tiny = require("lib.tiny")
local ctx = require("context")

return function()
  local system = tiny.processingSystem({ filter = tiny.requireAll("lifetime") })

  function system:process(e)
    e.lifetime = e.lifetime - 1
    if e.lifetime <= 0 then ctx.remove(e) end
  end

  return system
end
