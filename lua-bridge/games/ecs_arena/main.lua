-- ECS Arena: a top-down arena shooter on tiny-ecs (entities and systems), bump.lua (collision),
-- middleclass (entity classes) and lume (math helpers). Three drone factions fight each other
-- and the players' ships; drones lock on to the first hostile bump's queryRect returns, fire
-- spreads to the first neighbour it finds, magnets pull scrap in the order the scrap set
-- yields it. Vectors are fresh tables on every operation.
--
-- G.init(players, seed), G.step(inputs) with inputs[p] in 0..31 (1 up, 2 down, 4 left,
-- 8 right, 16 fire), G.digest() -> an integer.
local ctx = require("context")
local E = require("entities")
local spawner = require("systems.spawner")

-- tiny-ecs compiles its filters with `load` (`local loadstring = loadstring or load`), so the
-- state holds `load`: declared, a foreign load accepts it and compiles the filters from the
-- text the save carries (docs/save-games.md, "Code in the save").
local G = { permanents = { "load" } }

local QUOTA = 300  -- drones the spawner keeps in the arena
local PILLARS = 48

local function build_walls()
  local W, H = ctx.W, ctx.H
  ctx.add(E.Wall:new(0, 0, W, 16))
  ctx.add(E.Wall:new(0, H - 16, W, 16))
  ctx.add(E.Wall:new(0, 16, 16, H - 32))
  ctx.add(E.Wall:new(W - 16, 16, 16, H - 32))
  local placed = 0
  while placed < PILLARS do
    local w, h = math.random(2, 6) * 8, math.random(2, 6) * 8
    local x, y = math.random(60, W - 60 - w), math.random(60, H - 60 - h)
    -- keep the middle free for the docks
    if math.abs(x + w / 2 - W / 2) > 140 or math.abs(y + h / 2 - H / 2) > 140 then
      ctx.add(E.Wall:new(x, y, w, h))
      placed = placed + 1
    end
  end
end

function G.init(players, seed)
  math.randomseed(seed)
  ctx.reset(players, seed)
  local world = ctx.world
  world:addSystem(require("systems.body")())
  world:addSystem(require("systems.input")())
  world:addSystem(require("systems.ai")())
  world:addSystem(require("systems.movement")())
  world:addSystem(require("systems.particles")())
  world:addSystem(require("systems.burning")())
  world:addSystem(require("systems.pickups")())
  world:addSystem(require("systems.health")())
  world:addSystem(require("systems.lifetime")())
  world:addSystem(spawner.system(QUOTA))
  build_walls()
  world:refresh() -- walls into bump before drones look for room
  for p = 1, players do
    local x, y = ctx.dock(p)
    ctx.ships[p] = ctx.add(E.Ship:new(p, x, y))
  end
  local factions = { "red", "green", "blue" }
  local tries = 0
  while ctx.drones < QUOTA and tries < QUOTA * 20 do
    tries = tries + 1
    spawner.spawn_at(factions[tries % 3 + 1], math.random(40, ctx.W - 60), math.random(40, ctx.H - 60))
    if tries % 64 == 0 then world:refresh() end
  end
  world:refresh()
end

function G.step(inputs)
  ctx.inputs = inputs
  ctx.tick = ctx.tick + 1
  ctx.world:update(1)
end

-- FNV-1a over 64-bit integers (wrapping), mixing whole values.
local PRIME = 0x100000001b3
local function mix(h, v) return (h ~ v) * PRIME end

function G.digest()
  local h = mix(0xcbf29ce484222325, ctx.tick)
  local entities = ctx.world.entities
  for i = 1, #entities do
    local e = entities[i]
    h = mix(h, e.id)
    h = mix(h, e.kind)
    h = mix(h, math.floor(e.pos.x * 16))
    h = mix(h, math.floor(e.pos.y * 16))
    if e.health then h = mix(h, math.floor(e.health.hp * 16)) end
  end
  for _, s in ipairs(ctx.ships) do
    h = mix(mix(mix(h, s.score), s.ship.deaths), s.health.hp)
  end
  local k = ctx.kills
  for _, v in ipairs({ k.red, k.green, k.blue, k.crew, ctx.drones, ctx.spawned, ctx.despawned,
    ctx.shots, ctx.fires, #entities }) do
    h = mix(h, v)
  end
  return h
end

return G
