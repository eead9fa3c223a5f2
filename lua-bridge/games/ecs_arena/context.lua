-- The arena's shared state: one table that every system reaches with require("context").
-- G.init fills it; everything the game is lives under it (the runtime snapshots the whole
-- heap anyway, this is just where the code finds things).
local bump = require("lib.bump")
local tiny = require("lib.tiny")

local ctx = {}

ctx.W, ctx.H = 1536, 1536
ctx.CELL = 32

function ctx.reset(players, seed)
  ctx.players = players
  ctx.seed = seed
  ctx.tick = 0
  ctx.ids = 0
  ctx.inputs = {}
  ctx.bump = bump.newWorld(ctx.CELL)
  ctx.world = tiny.world()
  ctx.ships = {}        -- array, player order
  ctx.burning = {}      -- set: entity -> frames left to burn
  ctx.pickups = {}      -- set: pickup entity -> true
  ctx.drones = 0        -- live drones
  ctx.kills = { red = 0, green = 0, blue = 0, crew = 0 }
  ctx.spawned = 0
  ctx.despawned = 0
  ctx.shots = 0
  ctx.fires = 0
end

function ctx.next_id()
  ctx.ids = ctx.ids + 1
  return ctx.ids
end

--- Where player `p`'s ship starts and respawns.
function ctx.dock(p)
  local a = (p - 1) / math.max(ctx.players, 1) * 2 * math.pi
  return math.floor(ctx.W / 2 + math.cos(a) * 60), math.floor(ctx.H / 2 + math.sin(a) * 60)
end

function ctx.add(e)
  ctx.world:addEntity(e)
  return e
end

function ctx.remove(e)
  if not e.removed then
    e.removed = true
    ctx.world:removeEntity(e)
  end
end

return ctx
