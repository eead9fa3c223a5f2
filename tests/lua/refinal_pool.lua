-- particles recycled by their finalizer into a pool (resurrection); Lua finalizes an object once
local G = {}
local world
G.collect_every = 10
function G.init(players, seed)
  world = { tick = 0, pool = {}, live = {}, recycled = 0, made = 0 }
end
local mt = { __gc = function(p) world.recycled = world.recycled + 1; world.pool[#world.pool + 1] = p end }
local function particle()
  local p = table.remove(world.pool)
  if not p then world.made = world.made + 1; p = setmetatable({}, mt) end
  p.t = world.tick
  return p
end
function G.step(inputs)
  world.tick = world.tick + 1
  world.live = {}
  for i = 1, 3 + inputs[1] % 3 do world.live[i] = particle() end
end
function G.digest() return world.made * 100000 + world.recycled end
return G
