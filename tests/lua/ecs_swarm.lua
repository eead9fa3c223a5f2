-- A swarm on tiny-ecs (lib/tiny.lua, unchanged): its filters are Lua functions tiny-ecs compiles
-- at run time with `load` from source text it generates, in G.init and every 25 frames (a
-- filter over a tag made from the frame), so a process that loads a save of it has none of
-- them until it compiles the text the save carries. No bump.lua, no weak tables.
--
-- G.init(players, seed), G.step(inputs) with inputs[p] in 0..255, G.digest() -> an integer.
local tiny = require("lib.tiny")

local G = { permanents = { "load" } }
local world, state

local function mover()
  local s = tiny.processingSystem()
  s.filter = tiny.requireAll("pos", "vel")
  function s:process(e)
    e.pos = e.pos + e.vel
    if e.pos > 1000 or e.pos < 0 then e.vel = -e.vel end
  end
  return s
end

local function ager()
  local s = tiny.processingSystem()
  s.filter = tiny.filter("age&!dead")
  function s:process(e)
    e.age = e.age + 1
    if e.age > e.life then
      e.dead = true
      world:removeEntity(e)
    end
  end
  return s
end

local function spawn(pos, vel, life, tag)
  local e = { pos = pos, vel = vel, age = 0, life = life }
  if tag then e[tag] = true end
  world:addEntity(e)
end

function G.init(players, seed)
  math.randomseed(seed)
  world = tiny.world(mover(), ager())
  state = { tick = 0, sum = 0, tagged = 0 }
  for _ = 1, 40 do
    spawn(math.random(0, 1000), math.random(-5, 5), math.random(20, 200))
  end
  world:refresh()
end

function G.step(inputs)
  state.tick = state.tick + 1
  for p = 1, #inputs do
    local b = inputs[p]
    if b & 1 ~= 0 then spawn(p * 100, (b >> 1) % 7 - 3, 50 + b) end
  end
  if state.tick % 25 == 0 then
    -- A filter over a tag made from the frame: source text no process has compiled before.
    local tag = "tag" .. (state.tick // 25)
    local s = tiny.processingSystem()
    s.filter = tiny.requireAny(tag, "boost")
    function s:process(e)
      state.tagged = state.tagged + 1
      state.sum = state.sum + e.pos
    end
    world:addSystem(s)
    spawn(state.tick, 1, 30, tag)
  end
  world:update(1)
end

function G.digest()
  local h = state.tick * 1000003 + state.sum * 31 + state.tagged
  local entities = world.entities
  for i = 1, #entities do
    local e = entities[i]
    h = (h * 31 + e.pos * 7 + e.age) & 0xffffffffffff
  end
  return h + world:getSystemCount()
end

return G
