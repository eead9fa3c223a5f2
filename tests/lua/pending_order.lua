-- objects dropped between collection points, finalized at the next one in the reverse order of
-- marking; some hold one another, some are held by nothing but another dropped one
local G = {}
local world
G.collect_every = 10
function G.init(players, seed)
  world = { tick = 0, log = 0, n = 0, keep = {} }
end
local mt = { __gc = function(o)
  world.log = (world.log * 31 + o.id) % 1000000007
  world.n = world.n + 1
end }
function G.step(inputs)
  world.tick = world.tick + 1
  local prev
  for i = 1, 2 + inputs[1] % 3 do
    local o = setmetatable({ id = world.tick * 10 + i, held = prev, data = { i } }, mt)
    prev = (i % 2 == 0) and o or nil
  end
  if world.tick % 3 == 0 then world.keep[#world.keep + 1] = prev end
  if #world.keep > 4 then table.remove(world.keep, 1) end
end
function G.digest() return world.log * 1000 + world.n end
return G
