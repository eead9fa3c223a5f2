local M = {}

function M.spark(world, e)
  world.sparks[#world.sparks + 1] = { x = e.pos.x, y = e.pos.y, life = 10 }
end

function M.update(world)
  local keep = {}
  for _, s in ipairs(world.sparks) do
    s.life = s.life - 1
    if s.life > 0 then keep[#keep + 1] = s end
  end
  world.sparks = keep
end

return M
