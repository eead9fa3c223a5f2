-- __gc added to a metatable after setmetatable: Lua never finalizes such objects
local G = {}
G.collect_every = 5
local world
local mt = {}
function G.init(players, seed)
  world = { tick = 0, fin = 0 }
  mt.__gc = nil
end
function G.step(inputs)
  world.tick = world.tick + 1
  if world.tick == 1 then
    world.obj = setmetatable({}, mt)
    world.mt = mt
    mt.__gc = function() world.fin = world.fin + 1 end   -- too late: not marked for finalization
  end
  if world.tick == 8 then world.obj = nil end
end
function G.digest() return world.fin end
return G
