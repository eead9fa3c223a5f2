-- Dungeon Crawl: a roguelike. A generated dungeon (math.random), monsters that path-find with
-- A* over a binary heap ordered by __lt/__le, sparks (particles) recycled through a pool that
-- their __gc finalizer refills, a message log rendered with gsub templates, and `goto continue`
-- loops, as roguelike code is often written.
--
-- G.init(players, seed), G.step(inputs), G.digest() -> a string.
local G = {}

local MW, MH = 80, 48
local MONSTERS = 120

local world

-- ---------------------------------------------------------------- A* nodes and heap
local Node = {}
Node.__index = Node
Node.__lt = function(a, b) return a.f < b.f or (a.f == b.f and a.id < b.id) end
Node.__le = function(a, b) return not (b < a) end
Node.__eq = function(a, b) return a.id == b.id end

local function heap_push(h, n)
  h[#h + 1] = n
  local i = #h
  while i > 1 do
    local p = i // 2
    if h[p] <= h[i] then break end
    h[p], h[i] = h[i], h[p]
    i = p
  end
end

local function heap_pop(h)
  local top = h[1]
  local last = h[#h]
  h[#h] = nil
  if #h > 0 then
    h[1] = last
    local i = 1
    while true do
      local l, r, m = i * 2, i * 2 + 1, i
      if h[l] and h[l] < h[m] then m = l end
      if h[r] and h[r] < h[m] then m = r end
      if m == i then break end
      h[m], h[i] = h[i], h[m]
      i = m
    end
  end
  return top
end

local function walkable(x, y)
  local row = world.map[y]
  return row ~= nil and row:sub(x, x) == "."
end

local function astar(sx, sy, tx, ty, budget)
  local open, seen = {}, {}
  local function id(x, y) return y * 1000 + x end
  heap_push(open, setmetatable({ x = sx, y = sy, g = 0, f = 0, id = id(sx, sy) }, Node))
  seen[id(sx, sy)] = true
  local steps = 0
  while #open > 0 do
    local n = heap_pop(open)
    steps = steps + 1
    if steps > budget then break end
    if n.x == tx and n.y == ty then
      local first = n
      while first.parent and first.parent.parent do first = first.parent end
      return first.x, first.y
    end
    for _, d in ipairs({ { 1, 0 }, { -1, 0 }, { 0, 1 }, { 0, -1 } }) do
      local x, y = n.x + d[1], n.y + d[2]
      if not walkable(x, y) or seen[id(x, y)] then goto continue end
      seen[id(x, y)] = true
      heap_push(open, setmetatable({
        x = x, y = y, g = n.g + 1, f = n.g + 1 + math.abs(tx - x) + math.abs(ty - y),
        id = id(x, y), parent = n,
      }, Node))
      ::continue::
    end
  end
  return nil
end

-- ---------------------------------------------------------------- sparks and their pool
-- Sparks that the game drops are finalized by the collector and put back in a weak pool;
-- new sparks come from the pool when it has one. A spark's fields are all reset on reuse, so
-- the game never depends on whether a spark was recycled.
local pool = setmetatable({}, { __mode = "k" })
local Spark = {}
Spark.__index = Spark
Spark.__gc = function(s) pool[s] = true end

local function spark(x, y, dx, dy, ttl)
  local s = next(pool)
  if s then pool[s] = nil else s = {} end
  s.x, s.y, s.dx, s.dy, s.ttl = x, y, dx, dy, ttl
  return setmetatable(s, Spark)
end

-- ---------------------------------------------------------------- messages
local TEMPLATES = {
  hit = "$who hits the $what for $n damage",
  kill = "$who slays the $what!",
  pick = "$who picks up $n gold",
  hurt = "the $what bites $who ($n hp left)",
}

local function say(kind, fields)
  local text = TEMPLATES[kind]:gsub("%$(%w+)", function(k) return tostring(fields[k]) end)
  local log = world.log
  log[#log + 1] = text
  if #log > 40 then table.remove(log, 1) end
end

-- ---------------------------------------------------------------- generation
local function carve(rows, x, y, w, h)
  for yy = y, y + h - 1 do
    local r = rows[yy]
    rows[yy] = r:sub(1, x - 1) .. string.rep(".", w) .. r:sub(x + w)
  end
end

local function generate()
  local rows = {}
  for y = 1, MH do rows[y] = string.rep("#", MW) end
  local rooms = {}
  for _ = 1, 14 do
    local w, h = math.random(5, 12), math.random(4, 8)
    local x, y = math.random(2, MW - w - 1), math.random(2, MH - h - 1)
    carve(rows, x, y, w, h)
    rooms[#rooms + 1] = { x = x + w // 2, y = y + h // 2 }
  end
  for i = 2, #rooms do
    local a, b = rooms[i - 1], rooms[i]
    carve(rows, math.min(a.x, b.x), a.y, math.abs(a.x - b.x) + 1, 1)
    carve(rows, b.x, math.min(a.y, b.y), 1, math.abs(a.y - b.y) + 1)
  end
  return rows, rooms
end

local MONSTER_KINDS = { "rat", "bat", "goblin", "slime", "orc" }

function G.init(players, seed)
  math.randomseed(seed)
  world = { tick = 0, log = {}, heroes = {}, monsters = {}, sparks = {}, gold = {}, depth = 1 }
  world.map, world.rooms = generate()
  for p = 1, players do
    local r = world.rooms[(p - 1) % #world.rooms + 1]
    world.heroes[p] = { name = "hero" .. p, x = r.x, y = r.y, hp = 30, gold = 0, kills = 0 }
  end
  for i = 1, MONSTERS do
    local r = world.rooms[math.random(#world.rooms)]
    world.monsters[i] = {
      id = i, kind = MONSTER_KINDS[math.random(#MONSTER_KINDS)], x = r.x, y = r.y,
      hp = math.random(3, 12), speed = math.random(1, 3),
    }
  end
  for _, r in ipairs(world.rooms) do world.gold[r.y * 1000 + r.x] = math.random(1, 50) end
end

local MOVES = { [0] = { 0, 0 }, { -1, 0 }, { 1, 0 }, { 0, -1 }, { 0, 1 } }

function G.step(inputs)
  world.tick = world.tick + 1
  local tick = world.tick
  for i, input in ipairs(inputs) do
    local h = world.heroes[i]
    local m = MOVES[input % 5]
    local nx, ny = h.x + m[1], h.y + m[2]
    if walkable(nx, ny) then h.x, h.y = nx, ny end
    local g = world.gold[h.y * 1000 + h.x]
    if g then
      h.gold = h.gold + g
      world.gold[h.y * 1000 + h.x] = nil
      say("pick", { who = h.name, n = g })
    end
    if input & 16 ~= 0 then
      for k = 1, 6 do
        world.sparks[#world.sparks + 1] = spark(h.x + 0.0, h.y + 0.0, math.cos(k) * 0.7, math.sin(k) * 0.7, 8)
      end
    end
  end
  -- monsters hunt the nearest hero every `speed` frames
  for _, mo in ipairs(world.monsters) do
    if mo.hp <= 0 or tick % mo.speed ~= 0 then goto next_monster end
    do
      local best, bd
      for _, h in ipairs(world.heroes) do
        local d = math.abs(h.x - mo.x) + math.abs(h.y - mo.y)
        if not bd or d < bd then best, bd = h, d end
      end
      if bd == 0 then
        best.hp = best.hp - 1
        say("hurt", { who = best.name, what = mo.kind, n = best.hp })
        if best.hp <= 0 then best.hp = 30; best.gold = best.gold // 2 end
      elseif bd < 20 then
        local x, y = astar(mo.x, mo.y, best.x, best.y, 200)
        if x then mo.x, mo.y = x, y end
      end
    end
    ::next_monster::
  end
  -- sparks fly and burn monsters; burnt-out sparks are dropped (their __gc refills the pool)
  local live = {}
  for _, s in ipairs(world.sparks) do
    s.x, s.y, s.ttl = s.x + s.dx, s.y + s.dy, s.ttl - 1
    local cx, cy = math.floor(s.x + 0.5), math.floor(s.y + 0.5)
    for _, mo in ipairs(world.monsters) do
      if mo.hp > 0 and mo.x == cx and mo.y == cy then
        mo.hp = mo.hp - 1
        s.ttl = 0
        local h = world.heroes[1]
        say(mo.hp > 0 and "hit" or "kill", { who = h.name, what = mo.kind, n = 1 })
        if mo.hp <= 0 then h.kills = h.kills + 1 end
      end
    end
    if s.ttl > 0 then live[#live + 1] = s end
  end
  world.sparks = live
  -- the dead respawn in a random room every 25 frames
  if tick % 25 == 0 then
    for _, mo in ipairs(world.monsters) do
      if mo.hp <= 0 then
        local r = world.rooms[math.random(#world.rooms)]
        mo.x, mo.y, mo.hp = r.x, r.y, math.random(3, 12)
      end
    end
  end
end

function G.digest()
  local parts = {}
  for _, h in ipairs(world.heroes) do
    parts[#parts + 1] = string.format("%s:%d,%d:%d:%d:%d", h.name, h.x, h.y, h.hp, h.gold, h.kills)
  end
  local alive = 0
  for _, mo in ipairs(world.monsters) do if mo.hp > 0 then alive = alive + 1 end end
  parts[#parts + 1] = "alive=" .. alive
  parts[#parts + 1] = "sparks=" .. #world.sparks
  return table.concat(parts, ";")
end

return G
