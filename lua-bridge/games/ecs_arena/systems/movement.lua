-- Moves every body through bump's world and resolves what it ran into: bullets hit the first
-- thing in their way, drones bounce off walls and bite hostiles they push against.
local tiny = require("lib.tiny")
local vec = require("util.vec")
local ctx = require("context")
local combat = require("systems.combat")

local function collide(item, other)
  if other.removed then return nil end
  if item.damage then -- a bullet
    if other.wall then return "touch" end
    if other.health and other.faction ~= item.faction and other.health.hp > 0 then return "cross" end
    return nil
  end
  if other.wall then return item.ship and "slide" or "bounce" end
  if other.pickup then return item.ship and "cross" or nil end
  if other.damage then return nil end
  if other.health then return "slide" end
  return nil
end

local function bullet_hits(e, cols, len)
  for i = 1, len do
    local c = cols[i]
    local other = c.other
    if other.wall then
      combat.sparks(c.touch.x, c.touch.y, 2, 1)
      ctx.remove(e)
      return
    elseif other.health then
      combat.hit(other, e.damage.amount, e, e.damage.incendiary)
      ctx.remove(e)
      return
    end
  end
end

local function body_hits(e, cols, len)
  for i = 1, len do
    local c = cols[i]
    local other = c.other
    if c.type == "bounce" then
      local n = c.normal
      e.vel = vec(n.x ~= 0 and -e.vel.x or e.vel.x, n.y ~= 0 and -e.vel.y or e.vel.y)
    elseif e.ai and e.ai.bite == 0 and other.health and other.faction ~= e.faction then
      combat.hit(other, e.bite, e)
      e.ai.bite = 12
    end
  end
end

return function()
  local system = tiny.processingSystem({ filter = tiny.requireAll("pos", "vel", "body") })

  function system:process(e)
    if e.removed then return end
    local a = e.ai
    if a and a.bite > 0 then a.bite = a.bite - 1 end
    local goal = e.pos + e.vel
    local ax, ay, cols, len = ctx.bump:move(e, goal.x, goal.y, collide)
    e.pos = vec(ax, ay)
    if e.damage then bullet_hits(e, cols, len) else body_hits(e, cols, len) end
  end

  return system
end
