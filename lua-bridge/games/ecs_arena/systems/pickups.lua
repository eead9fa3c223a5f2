-- Ships collect scrap they touch; each ship's magnet pulls up to three pieces a frame, the
-- first ones in range as the scrap set lists them.
local tiny = require("lib.tiny")
local ctx = require("context")

local MAGNET_RANGE = 160
local PULLS = 3

local function is_pickup(item) return item.pickup ~= nil and not item.removed end

return function()
  local system = tiny.system({})

  function system:update()
    for _, s in ipairs(ctx.ships) do
      s.ship.magnet = PULLS
      local c = s:center()
      local items, len = ctx.bump:queryRect(c.x - 12, c.y - 12, 24, 24, is_pickup)
      for i = 1, len do
        local p = items[i]
        s.score = s.score + p.pickup.value
        ctx.pickups[p] = nil
        ctx.remove(p)
      end
    end
    for p in pairs(ctx.pickups) do
      if p.removed then
        ctx.pickups[p] = nil
      else
        local pc = p:center()
        for _, s in ipairs(ctx.ships) do
          if s.ship.magnet > 0 and pc:dist(s:center()) < MAGNET_RANGE then
            s.ship.magnet = s.ship.magnet - 1
            p.pos = p.pos + (s:center() - pc):normalized() * 4
            ctx.bump:update(p, p.pos.x, p.pos.y)
            break
          end
        end
      end
    end
  end

  return system
end
