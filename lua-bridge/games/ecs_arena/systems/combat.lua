-- Shared combat rules: hits, sparks, shots. Used by several systems.
local lume = require("lib.lume")
local ctx = require("context")
local E = require("entities")

local combat = {}

function combat.sparks(x, y, n, heat)
  for _ = 1, n do ctx.add(E.Spark:new(x, y, heat)) end
end

--- `target` takes `amount` damage from `source` (a bullet or a drone).
function combat.hit(target, amount, source, incendiary)
  local h = target.health
  if h.hp <= 0 then return end
  h.hp = h.hp - amount
  -- credit goes to whoever fired the bullet, or to the biting drone
  target.last_hit = source.damage and source.damage.owner or source
  if incendiary and target.ai and not ctx.burning[target] then
    ctx.burning[target] = 24
    ctx.fires = ctx.fires + 1
  end
  local c = target:center()
  combat.sparks(c.x, c.y, amount >= 4 and 3 or 1, lume.clamp(amount, 1, 4))
end

--- `shooter` fires along `dir` (a unit vector) from its center.
function combat.fire(shooter, dir, speed, amount, incendiary)
  local c = shooter:center()
  local muzzle = c + dir * (shooter.size.w / 2 + 3)
  ctx.add(E.Bullet:new(shooter, muzzle.x - 1, muzzle.y - 1, dir * speed, amount, incendiary))
  ctx.shots = ctx.shots + 1
end

return combat
