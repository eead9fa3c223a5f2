-- Drone brains: lock on to something hostile nearby, chase it, tanks shoot at it; wander
-- otherwise.
local tiny = require("lib.tiny")
local ctx = require("context")
local combat = require("systems.combat")

local RANGE = 120
local GUN_RANGE2 = 220 * 220

-- what a drone of each faction may target (bump query filters)
local hostile = {}
for _, f in ipairs({ "red", "green", "blue" }) do
  hostile[f] = function(item)
    return item.health ~= nil and item.faction ~= f and not item.removed and item.health.hp > 0
  end
end

return function()
  local system = tiny.processingSystem({ filter = tiny.requireAll("ai", "pos", "vel") })

  function system:process(e)
    local a = e.ai
    local t = a.target
    if t and not t:alive() then t = nil; a.target = nil end
    a.retarget = a.retarget - 1
    if a.retarget <= 0 then
      local c = e:center()
      local items = ctx.bump:queryRect(c.x - RANGE, c.y - RANGE, 2 * RANGE, 2 * RANGE, hostile[e.faction])
      -- lock on to whatever the query finds first: anything in range will do for a drone
      t = items[1]
      a.target = t
      a.retarget = 15 + e.id % 16
    end
    if t then
      local to = t:center() - e:center()
      local desired = to:normalized() * e.speed
      e.vel = (e.vel + (desired - e.vel) * 0.25):limited(e.speed)
      if e.gun then
        a.cooldown = a.cooldown - 1
        if a.cooldown <= 0 and to:len2() < GUN_RANGE2 then
          combat.fire(e, to:normalized(), 4, 5, true)
          a.cooldown = e.gun
        end
      end
    else
      e.vel = e.vel:rotated((math.random() - 0.5) * 0.4)
    end
  end

  return system
end
