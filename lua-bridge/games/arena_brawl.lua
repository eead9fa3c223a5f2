-- Arena Brawl: luasnap's embedded default game.
--
-- Players steer avatars around a tiled arena and fire projectiles; thousands of NPCs wander
-- with per-entity closures, shared metatables and AI coroutines (suspended between frames);
-- the world keeps strings (names, an event log) and a tile map. About 10 MB of heap.
--
-- Contract: G.init(players, seed), G.step(inputs) with one integer 0..255 per player,
-- G.digest() -> a game-defined checksum. Deterministic: its only randomness is its own
-- generator, seeded by G.init.
local G = {}

local WIDTH, HEIGHT = 160, 160
local NPCS = 6500

local world

local function rand()
  -- xorshift32, kept in the world so it rolls back with everything else
  local x = world.rng
  x = x ~ ((x << 13) & 0xffffffff)
  x = x ~ (x >> 17)
  x = x ~ ((x << 5) & 0xffffffff)
  world.rng = x
  return x
end

local Entity = {}
Entity.__index = Entity

function Entity:move(dx, dy)
  self.x = (self.x + dx) % WIDTH
  self.y = (self.y + dy) % HEIGHT
end

function Entity:describe()
  return self.kind .. "#" .. self.id .. "@" .. self.x .. "," .. self.y
end

local Projectile = setmetatable({}, { __index = Entity })
Projectile.__index = Projectile

local function spawn_npc(id)
  local e = setmetatable({
    id = id, kind = "npc", x = rand() % WIDTH, y = rand() % HEIGHT, hp = 20 + rand() % 30,
    name = "npc-" .. id, mood = "calm", inventory = {}, memory = {},
  }, Entity)
  for i = 1, 1 + rand() % 4 do
    e.inventory[i] = { item = "item" .. (rand() % 40), qty = 1 + rand() % 5 }
  end
  -- every entity has its own closure over itself
  e.wants = function(tx, ty) return (tx - e.x) * (tx - e.x) + (ty - e.y) * (ty - e.y) < 400 end
  if id % 25 == 0 then
    -- an AI script: a coroutine suspended between frames
    e.brain = coroutine.create(function()
      local steps = 0
      while true do
        for _ = 1, 3 do e:move(1, 0); steps = steps + 1; coroutine.yield(steps) end
        for _ = 1, 3 do e:move(0, 1); steps = steps + 1; coroutine.yield(steps) end
        e.mood = (steps % 7 == 0) and "angry" or "calm"
      end
    end)
  end
  return e
end

function G.init(players, seed)
  world = {
    tick = 0, rng = (seed % 0x7fffffff) + 1, players = {}, npcs = {}, shots = {}, log = {},
    map = {}, next_id = 1, kills = 0,
  }
  for y = 1, HEIGHT do
    local row = {}
    for x = 1, WIDTH do
      row[x] = { kind = ((x * 7 + y * 13) % 11 == 0) and "wall" or "floor", height = (x * y) % 5 }
    end
    world.map[y] = row
  end
  for p = 1, players do
    world.players[p] = setmetatable({
      id = p, kind = "player", x = (p * 37) % WIDTH, y = (p * 53) % HEIGHT, hp = 100, score = 0,
      name = "player" .. p, inventory = {}, memory = {},
    }, Entity)
  end
  for i = 1, NPCS do
    world.npcs[i] = spawn_npc(world.next_id)
    world.next_id = world.next_id + 1
  end
end

-- Input bits: 0-1 horizontal (0 none, 1 left, 2 right), 2-3 vertical, 4 fire, 5-7 unused.
local DX = { [0] = 0, [1] = -1, [2] = 1, [3] = 0 }

function G.step(inputs)
  world.tick = world.tick + 1
  local tick = world.tick
  for p, input in ipairs(inputs) do
    local pl = world.players[p]
    pl:move(DX[input & 3], DX[(input >> 2) & 3])
    if input & 16 ~= 0 then
      local s = setmetatable({ id = world.next_id, kind = "shot", owner = p, x = pl.x, y = pl.y,
                               dx = DX[input & 3], dy = DX[(input >> 2) & 3], ttl = 12 }, Projectile)
      if s.dx == 0 and s.dy == 0 then s.dx = 1 end
      world.next_id = world.next_id + 1
      world.shots[#world.shots + 1] = s
    end
  end
  -- projectiles fly and hit NPCs on the same tile
  local alive = {}
  for _, s in ipairs(world.shots) do
    s:move(s.dx, s.dy)
    s.ttl = s.ttl - 1
    local hit = false
    for i = (tick % 40) + 1, #world.npcs, 40 do
      local n = world.npcs[i]
      if n.x == s.x and n.y == s.y then
        n.hp = n.hp - 10
        hit = true
        if n.hp <= 0 then
          world.kills = world.kills + 1
          world.players[s.owner].score = world.players[s.owner].score + 1
          world.log[#world.log + 1] = n:describe() .. " fell to player" .. s.owner .. " at " .. tick
          world.npcs[i] = spawn_npc(world.next_id)
          world.next_id = world.next_id + 1
        end
      end
    end
    if s.ttl > 0 and not hit then alive[#alive + 1] = s end
  end
  world.shots = alive
  -- a slice of NPCs acts each frame; the AI ones resume their coroutine
  local n = #world.npcs
  for k = 1, 120 do
    local e = world.npcs[(tick * 120 + k) % n + 1]
    if e.brain then
      coroutine.resume(e.brain)
    else
      e:move(rand() % 3 - 1, rand() % 3 - 1)
    end
    local target = world.players[(e.id % #world.players) + 1]
    if e.wants(target.x, target.y) then
      e.memory[#e.memory % 8 + 1] = "saw " .. target.name .. " at " .. tick
    end
  end
  if #world.log > 200 then
    table.remove(world.log, 1)
  end
end

function G.digest()
  local h = world.tick * 31 + world.kills
  for _, p in ipairs(world.players) do h = (h * 131 + p.x * 7 + p.y * 13 + p.hp + p.score * 17) % 0x7fffffffffff end
  for i = 1, #world.npcs, 7 do
    local e = world.npcs[i]
    h = (h * 31 + e.x * 3 + e.y * 5 + e.hp) % 0x7fffffffffff
  end
  return h + #world.shots
end

return G
