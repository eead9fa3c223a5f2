-- Player input: bits 1 up, 2 down, 4 left, 8 right, 16 fire.
local tiny = require("lib.tiny")
local vec = require("util.vec")
local ctx = require("context")
local combat = require("systems.combat")

return function()
  local system = tiny.processingSystem({ filter = tiny.requireAll("ship", "pos", "vel") })

  function system:process(e)
    local s = e.ship
    local input = ctx.inputs[s.player] or 0
    local dx = (input & 8 ~= 0 and 1 or 0) - (input & 4 ~= 0 and 1 or 0)
    local dy = (input & 2 ~= 0 and 1 or 0) - (input & 1 ~= 0 and 1 or 0)
    local dir = vec(dx, dy):normalized()
    if dx ~= 0 or dy ~= 0 then s.facing = dir end
    e.vel = dir * e.speed
    if s.cooldown > 0 then s.cooldown = s.cooldown - 1 end
    if input & 16 ~= 0 and s.cooldown == 0 and e:alive() then
      combat.fire(e, s.facing, 7, 6, false)
      s.cooldown = 5
    end
  end

  return system
end
