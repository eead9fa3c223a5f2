local World = require "src.world"

local G = {}
local world

function G.init(players, seed)
  math.randomseed(seed)
  world = World.new(players, seed)
end

function G.step(inputs)
  world:step(inputs)
end

function G.digest()
  return world:digest()
end

return G
