-- Arena Brawl: luasnap's embedded default game.
--
-- Players steer avatars around a tiled arena and fire projectiles; thousands of NPCs wander
-- with per-entity closures, shared metatables and AI coroutines (suspended between frames);
-- the world keeps strings (names, an event log built with string.format, a HUD built with
-- table.concat), a tile map, a leaderboard sorted every few frames and a weak cache of
-- formatted labels. About 10 MB of heap. It uses the standard library the way game code
-- does: math.random seeded in G.init, string.format/rep/gsub/find, tostring of numbers,
-- table.sort with a comparator, coroutine.wrap generators, metatables with __eq/__lt.
--
-- Contract: G.init(players, seed), G.step(inputs) with one integer 0..255 per player,
-- G.digest() -> a game-defined checksum (a hex string).
local G = {}

local WIDTH, HEIGHT = 160, 160
local NPCS = 6500

local world

local function rand()
  return math.random(0, 0x7fffffff)
end

-- Labels are formatted on demand and cached weakly: a label nobody shows is collected.
local label_cache = setmetatable({}, { __mode = "v" })
local function label(e)
  local key = e.kind .. e.id
  local l = label_cache[key]
  if not l then
    l = { text = string.format("%s #%05d (%s)", e.name, e.id, e.mood or "-") }
    label_cache[key] = l
  end
  return l
end

-- Scores compare by points, then by id.
local Score = {}
Score.__index = Score
Score.__eq = function(a, b) return a.points == b.points and a.id == b.id end
Score.__lt = function(a, b)
  if a.points ~= b.points then return a.points > b.points end
  return a.id < b.id
end

local Entity = {}
Entity.__index = Entity

function Entity:move(dx, dy)
  self.x = (self.x + dx) % WIDTH
  self.y = (self.y + dy) % HEIGHT
end

function Entity:describe()
  return string.format("%s#%d@%d,%d", self.kind, self.id, self.x, self.y)
end

-- The tiles within `r` of (x, y), generated lazily.
local function around(x, y, r)
  return coroutine.wrap(function()
    for dy = -r, r do
      for dx = -r, r do
        coroutine.yield((x + dx) % WIDTH + 1, (y + dy) % HEIGHT + 1)
      end
    end
  end)
end

local Projectile = setmetatable({}, { __index = Entity })
Projectile.__index = Projectile

local function spawn_npc(id)
  local e = setmetatable({
    id = id, kind = "npc", x = rand() % WIDTH, y = rand() % HEIGHT, hp = 20 + rand() % 30,
    name = string.format("npc-%04d", id), mood = "calm", inventory = {}, memory = {},
  }, Entity)
  for i = 1, 1 + rand() % 4 do
    e.inventory[i] = { item = "item" .. tostring(rand() % 40), qty = 1 + rand() % 5 }
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
  math.randomseed(seed)
  world = {
    tick = 0, players = {}, npcs = {}, shots = {}, log = {},
    map = {}, next_id = 1, kills = 0, board = {}, hud = "", stats = { shots = 0, hits = 0, seen = 0 },
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
    world.board[p] = setmetatable({ id = p, points = 0 }, Score)
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
      world.stats.shots = world.stats.shots + 1
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
        world.stats.hits = world.stats.hits + 1
        if n.hp <= 0 then
          world.kills = world.kills + 1
          world.players[s.owner].score = world.players[s.owner].score + 1
          world.log[#world.log + 1] = string.format("[%06d] %s fell to %s (%s)", tick, n:describe(),
            world.players[s.owner].name, label(n).text)
          world.board[s.owner].points = world.players[s.owner].score
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
      world.stats.seen = world.stats.seen + 1
    end
  end
  if #world.log > 200 then
    table.remove(world.log, 1)
  end
  -- every 8 frames: walls near player 1 (a generator), the leaderboard and the HUD
  if tick % 8 == 0 then
    local p1 = world.players[1]
    local walls = 0
    for x, y in around(p1.x, p1.y, 3) do
      if world.map[y][x].kind == "wall" then walls = walls + 1 end
    end
    local order = {}
    for i, sc in ipairs(world.board) do order[i] = sc end
    table.sort(order, function(a, b) return a < b end)
    local parts = {}
    for rank, sc in ipairs(order) do
      parts[#parts + 1] = string.format("%d:%s=%d", rank, world.players[sc.id].name, sc.points)
    end
    local stats = {}
    for k, v in pairs(world.stats) do stats[#stats + 1] = k .. "=" .. tostring(v) end
    table.sort(stats)
    world.hud = (table.concat(parts, " ") .. " | " .. table.concat(stats, " ") .. " | walls " .. walls)
      :gsub("player(%d+)", "P%1")
    world.last_event = world.log[#world.log] and world.log[#world.log]:find("fell", 1, true) and world.log[#world.log] or string.rep("-", 8)
  end
end

function G.digest()
  local h = world.tick * 31 + world.kills
  for _, p in ipairs(world.players) do h = (h * 131 + p.x * 7 + p.y * 13 + p.hp + p.score * 17) % 0x7fffffffffff end
  for i = 1, #world.npcs, 7 do
    local e = world.npcs[i]
    h = (h * 31 + e.x * 3 + e.y * 5 + e.hp) % 0x7fffffffffff
  end
  return string.format("%012x/%d", h + #world.shots, #world.hud)
end

return G
