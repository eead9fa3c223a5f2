-- Deaths: drones drop scrap and sparks and are despawned, with credit to their killer; ships
-- respawn at their dock.
local tiny = require("lib.tiny")
local lume = require("lib.lume")
local vec = require("util.vec")
local ctx = require("context")
local E = require("entities")
local combat = require("systems.combat")

local function respawn(ship)
  local s = ship.ship
  s.deaths = s.deaths + 1
  ship.score = math.max(0, ship.score - 50)
  ship.health.hp = ship.health.max
  local x, y = ctx.dock(s.player)
  ship.pos = vec(x, y)
  ctx.bump:update(ship, x, y)
end

return function()
  local system = tiny.processingSystem({ filter = tiny.requireAll("health") })

  function system:process(e)
    if e.health.hp > 0 or e.removed then return end
    if e.ship then return respawn(e) end
    local killer = e.last_hit
    if killer then
      if killer.ship then killer.score = killer.score + e.bounty end
      ctx.kills[killer.faction] = ctx.kills[killer.faction] + 1
    end
    local c = e:center()
    combat.sparks(c.x, c.y, 4, 3)
    if math.random(3) == 1 then
      local p = ctx.add(E.Pickup:new(c.x - 3, c.y - 3, lume.round(e.bounty / 2)))
      ctx.pickups[p] = true
    end
    ctx.drones = ctx.drones - 1
    ctx.despawned = ctx.despawned + 1
    ctx.remove(e)
  end

  return system
end
