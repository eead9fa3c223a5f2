-- Fire: what burns loses health every third frame and, half-way through, sets a neighbour
-- alight (the first one bump's query turns up).
local tiny = require("lib.tiny")
local ctx = require("context")

local function flammable(item)
  return item.ai ~= nil and not item.removed and not ctx.burning[item]
end

return function()
  local system = tiny.system({})

  function system:update()
    local spread = {}
    for e, left in pairs(ctx.burning) do
      if not e:alive() then
        ctx.burning[e] = nil
      else
        if left % 3 == 0 then e.health.hp = e.health.hp - 1 end
        if left == 12 then
          local c = e:center()
          local items = ctx.bump:queryRect(c.x - 24, c.y - 24, 48, 48, flammable)
          if items[1] then spread[#spread + 1] = items[1] end
        end
        ctx.burning[e] = left > 1 and left - 1 or nil
      end
    end
    for _, v in ipairs(spread) do
      if not ctx.burning[v] then
        ctx.burning[v] = 24
        ctx.fires = ctx.fires + 1
      end
    end
  end

  return system
end
