-- Waves: every 10 frames, drones spawn at their faction's gate until the arena holds its
-- quota again.
local tiny = require("lib.tiny")
local lume = require("lib.lume")
local ctx = require("context")
local E = require("entities")

local KINDS = { "grunt", "grunt", "grunt", "grunt", "runner", "runner", "runner", "tank" }
local FACTIONS = { "red", "green", "blue" }
local WAVE = 48

local spawner = {}

--- Spawns a drone of `faction` near (x, y) if there is room; returns it or nil.
function spawner.spawn_at(faction, x, y)
  local class = E.Drone.kinds[lume.randomchoice(KINDS)]
  local w, h = class.w, class.h
  if x < 40 or y < 40 or x > ctx.W - 40 - w or y > ctx.H - 40 - h then return nil end
  local _, len = ctx.bump:queryRect(x, y, w, h)
  if len > 0 then return nil end
  local d = ctx.add(class:new(faction, x, y))
  ctx.drones = ctx.drones + 1
  ctx.spawned = ctx.spawned + 1
  return d
end

function spawner.gate(faction)
  if faction == "red" then return 120, 120
  elseif faction == "green" then return ctx.W - 140, 120
  else return ctx.W / 2, ctx.H - 140 end
end

function spawner.system(quota)
  local system = tiny.system({ interval = 10 })

  function system:update()
    local missing = math.min(quota - ctx.drones, WAVE)
    for i = 1, missing do
      local faction = FACTIONS[i % 3 + 1]
      local gx, gy = spawner.gate(faction)
      for _ = 1, 3 do
        if spawner.spawn_at(faction, gx + math.random(-160, 160), gy + math.random(-160, 160)) then break end
      end
    end
  end

  return system
end

return spawner
