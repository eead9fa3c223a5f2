-- Builds a game-like Lua heap of a requested size, for benchmarks and measurements.
-- Entities are tables with a metatable, a closure each, strings, small inventories, and every
-- 50th has a coroutine. Deterministic: no math.random, no clock.
local H = { tick = 0, entities = {} }

local Entity = {}
Entity.__index = Entity
function Entity:move(dx, dy) self.x = self.x + dx; self.y = self.y + dy end

local seed = 12345
local function rng()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed
end

local function new_entity(id)
  local e = setmetatable({
    id = id, x = rng() % 1000, y = rng() % 1000, hp = 100,
    name = "entity#" .. id, tags = { "npc", "zone" .. (id % 16) }, inventory = {},
  }, Entity)
  e.think = function(target) return (e.x - target.x) + (e.y - target.y) end
  for i = 1, id % 5 do e.inventory[i] = { kind = "item" .. (i % 7), qty = i } end
  if id % 50 == 0 then
    e.ai = coroutine.create(function()
      while true do e:move(1, 0); coroutine.yield(e.x) end
    end)
  end
  return e
end

-- Grows the heap to about `bytes` bytes of live Lua objects.
function H.build(bytes)
  local es = H.entities
  while collectgarbage("count") * 1024 < bytes do
    for _ = 1, 100 do es[#es + 1] = new_entity(#es + 1) end
  end
  collectgarbage()
  collectgarbage()
  return #es
end

-- Writes one field of `n` entities spread over the heap; allocates nothing.
function H.touch(n)
  local es = H.entities
  local count = #es
  local stride = count // n
  for i = 0, n - 1 do
    local e = es[(i * stride + H.tick) % count + 1]
    e.hp = e.hp - 1
  end
  H.tick = H.tick + 1
end

-- A light game frame: 1% of entities move and think, AIs resume, and about `garbage` bytes
-- (default 64 KiB) of short-lived tables and strings are made.
function H.frame(garbage)
  local es = H.entities
  local count = #es
  H.tick = H.tick + 1
  for i = 1, count // 100 do
    local e = es[(i * 97 + H.tick * 31) % count + 1]
    e:move(1, -1)
    e.hp = e.think(es[1])
    if e.ai then coroutine.resume(e.ai) end
  end
  local log = {}
  for i = 1, (garbage or 65536) // 128 do
    log[i] = { "event " .. i .. " at " .. H.tick, i }
  end
  H.last = log[#log][1]
end

return H
