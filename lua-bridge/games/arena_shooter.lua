-- Arena Shooter: 2,000 entities in a float-coordinate arena, written the way a Lua game usually
-- is: a class hierarchy with __index chains, a vector type with operators, math.random for
-- spawns and spread, string.format for the combat log and HUD, a sorted leaderboard.
--
-- G.init(players, seed), G.step(inputs), G.digest() -> a hex string.
local G = {}

local W, H = 512.0, 512.0
local ENEMIES = 2000

-- ---------------------------------------------------------------- vectors
local Vec = {}
Vec.__index = Vec
local function vec(x, y) return setmetatable({ x = x, y = y }, Vec) end
Vec.__add = function(a, b) return vec(a.x + b.x, a.y + b.y) end
Vec.__sub = function(a, b) return vec(a.x - b.x, a.y - b.y) end
Vec.__mul = function(a, k) return vec(a.x * k, a.y * k) end
Vec.__eq = function(a, b) return a.x == b.x and a.y == b.y end
Vec.__lt = function(a, b) return a:len2() < b:len2() end
Vec.__le = function(a, b) return a:len2() <= b:len2() end
Vec.__tostring = function(v) return string.format("(%.2f, %.2f)", v.x, v.y) end
Vec.__concat = function(a, b) return tostring(a) .. tostring(b) end
function Vec:len2() return self.x * self.x + self.y * self.y end
function Vec:wrap()
  self.x = self.x % W
  self.y = self.y % H
  return self
end

-- ---------------------------------------------------------------- classes
local Base = {}
Base.__index = Base
function Base:describe()
  return string.format("%s#%d hp=%d at %s", self.kind, self.id, self.hp, tostring(self.pos))
end
function Base:alive() return self.hp > 0 end

local Actor = setmetatable({}, { __index = Base })
Actor.__index = Actor
function Actor:hurt(n, by)
  self.hp = self.hp - n
  if self.hp <= 0 then self.hp = 0; return true end
  return false
end

local Enemy = setmetatable({}, { __index = Actor })
Enemy.__index = Enemy
Enemy.kind = "enemy"

local Player = setmetatable({}, { __index = Actor })
Player.__index = Player
Player.kind = "player"

local world

local function log(fmt, ...)
  local line = string.format("[%05d] " .. fmt, world.tick, ...)
  local logt = world.log
  logt[#logt + 1] = line
  if #logt > 64 then table.remove(logt, 1) end
end

local function spawn_enemy()
  local id = world.next_id
  world.next_id = id + 1
  local e = setmetatable({
    id = id,
    hp = math.random(10, 40),
    pos = vec(math.random() * W, math.random() * H),
    vel = vec(math.random(-100, 100) / 100, math.random(-100, 100) / 100),
    tag = string.format("E%04X", id),
    loot = math.random(3) == 1 and { gold = math.random(1, 9), gem = math.random(0, 1) } or nil,
  }, Enemy)
  return e
end

function G.init(players, seed)
  math.randomseed(seed)
  world = {
    tick = 0, next_id = 1, enemies = {}, players = {}, shots = {}, log = {},
    stats = { spawned = 0, killed = 0, shots = 0, misses = 0, gold = 0 },
    hud = "",
  }
  for p = 1, players do
    world.players[p] = setmetatable({
      id = p, hp = 100, score = 0, name = "P" .. p,
      pos = vec(W / (players + 1) * p, H / 2), aim = vec(1, 0), cooldown = 0,
    }, Player)
  end
  for _ = 1, ENEMIES do
    world.enemies[#world.enemies + 1] = spawn_enemy()
    world.stats.spawned = world.stats.spawned + 1
  end
  log("arena opened with %d players and %d enemies", players, ENEMIES)
end

local DIRS = { [0] = 0, -1, 1, 0 }

local function grid_key(v)
  return (v.x // 32) * 100 + (v.y // 32)
end

function G.step(inputs)
  world.tick = world.tick + 1
  local tick = world.tick
  -- players move and shoot
  for i, input in ipairs(inputs) do
    local p = world.players[i]
    local d = vec(DIRS[input & 3], DIRS[(input >> 2) & 3])
    if d ~= vec(0, 0) then p.aim = d end
    p.pos = (p.pos + d * 2.5):wrap()
    if p.cooldown > 0 then p.cooldown = p.cooldown - 1 end
    if input & 16 ~= 0 and p.cooldown == 0 then
      local spread = (math.random() - 0.5) * 0.2
      world.shots[#world.shots + 1] = {
        owner = i, pos = vec(p.pos.x, p.pos.y), vel = vec(p.aim.x * 6 + spread, p.aim.y * 6 - spread),
        ttl = 40,
      }
      world.stats.shots = world.stats.shots + 1
      p.cooldown = 3
    end
  end
  -- spatial grid of enemies
  local grid = {}
  for _, e in ipairs(world.enemies) do
    e.pos = (e.pos + e.vel):wrap()
    local k = grid_key(e.pos)
    local cell = grid[k]
    if cell then cell[#cell + 1] = e else grid[k] = { e } end
  end
  -- shots
  local live = {}
  for _, s in ipairs(world.shots) do
    s.pos = s.pos + s.vel
    s.ttl = s.ttl - 1
    local hit = false
    if s.pos.x >= 0 and s.pos.x < W and s.pos.y >= 0 and s.pos.y < H then
      local cell = grid[grid_key(s.pos)]
      if cell then
        for _, e in ipairs(cell) do
          if e:alive() and (e.pos - s.pos) <= vec(4, 4) then
            hit = true
            local p = world.players[s.owner]
            if e:hurt(math.random(5, 15), p) then
              p.score = p.score + 10
              world.stats.killed = world.stats.killed + 1
              if e.loot then world.stats.gold = world.stats.gold + e.loot.gold end
              log("%s killed %s (score %d)", p.name, e:describe(), p.score)
            end
            break
          end
        end
      end
    end
    if hit or s.ttl <= 0 then
      if not hit then world.stats.misses = world.stats.misses + 1 end
    else
      live[#live + 1] = s
    end
  end
  world.shots = live
  -- the dead are replaced
  for i, e in ipairs(world.enemies) do
    if not e:alive() then
      world.enemies[i] = spawn_enemy()
      world.stats.spawned = world.stats.spawned + 1
    end
  end
  -- enemies near a player bite
  for i = tick % 10 + 1, #world.enemies, 10 do
    local e = world.enemies[i]
    for _, p in ipairs(world.players) do
      if (e.pos - p.pos) < vec(6, 0) then
        p.hp = math.max(0, p.hp - 1)
        if p.hp == 0 then
          log("%s was overwhelmed at %s", p.name, "" .. p.pos)
          p.hp = 100
          p.score = p.score // 2
        end
      end
    end
  end
  -- leaderboard and HUD every 10 frames
  if tick % 10 == 0 then
    local board = {}
    for _, p in ipairs(world.players) do board[#board + 1] = p end
    table.sort(board, function(a, b)
      if a.score ~= b.score then return a.score > b.score end
      return a.id < b.id
    end)
    local parts = {}
    for rank, p in ipairs(board) do
      parts[#parts + 1] = string.format("%d.%s:%d(%d%%)", rank, p.name, p.score, p.hp)
    end
    local summary = {}
    for k, v in pairs(world.stats) do
      summary[#summary + 1] = k .. "=" .. tostring(v)
    end
    table.sort(summary)
    world.hud = table.concat(parts, " ") .. " | " .. table.concat(summary, ",")
      .. " | P1 at " .. world.players[1].pos
  end
end

function G.digest()
  local h = 0
  for _, e in ipairs(world.enemies) do
    h = (h * 31 + math.floor(e.pos.x * 16) + math.floor(e.pos.y * 16) * 7 + e.hp) % 0x7fffffff
  end
  for _, p in ipairs(world.players) do
    h = (h * 131 + p.score + p.hp) % 0x7fffffff
  end
  return string.format("%08x:%s", h, world.hud)
end

return G
