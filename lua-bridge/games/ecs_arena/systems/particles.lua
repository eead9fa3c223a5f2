-- Sparks drift and slow down (no collision).
local tiny = require("lib.tiny")

return function()
  local system = tiny.processingSystem({ filter = tiny.requireAll("spark", "pos", "vel") })

  function system:process(e)
    e.pos = e.pos + e.vel
    e.vel = e.vel * 0.85
  end

  return system
end
