local Timer = require "lib.timer"
local beholder = require "lib.beholder"
local Entity = require "src.entity"
local effects = require "src.effects"

local World = {}
World.__index = World

local DAMAGE = 4  -- v2 balance: enemies die faster

-- v2: creates the world and starts the wave script
function World.new(players, seed)
  local w = setmetatable({}, World)
  w.size = 200
  w.tick = 0
  w.next_id = 1
  w.all = {}          -- set keyed by entity tables
  w.enemies = {}      -- another set
  w.score = {}
  w.kills = 0
  w.log = {}
  w.version = 3
  w.sparks = {}
  w.timer = Timer.new()
  w.rng = math.random
  for p = 1, players do w.score[p] = 0 end
  for i = 1, 150 do w:spawn(math.random(0, 200), math.random(0, 200), i % 3 == 0 and "enemy" or "critter") end
  -- observers: order of callbacks for one event comes from pairs() over id tables
  beholder.observe("died", function(e) w:remove(e); w.kills = w.kills + 1 end)
  beholder.observe("died", function(e) w.log[#w.log + 1] = "died " .. e.id .. " at " .. w.tick end)
  -- a wave script living in a coroutine (hump timer script)
  w.timer:script(function(wait)
    while true do
      wait(1.0)
      for i = 1, 5 do w:spawn(math.random(0, 200), math.random(0, 200), "enemy") end
      wait(0.5)
      w:damage_all()
    end
  end)
  w.timer:every(0.25, function() w:scoreboard() end)
  return w
end

function World:spawn(x, y, kind)
  local e = Entity(self, self.next_id, x, y, kind)
  self.next_id = self.next_id + 1
  self.all[e] = true
  if kind == "enemy" then self.enemies[e] = true end
  return e
end

function World:remove(e)
  self.all[e] = nil
  self.enemies[e] = nil
end

function World:damage_all()
  local victims = {}
  for e in pairs(self.enemies) do victims[#victims + 1] = e end
  table.sort(victims, function(a, b) return a.id < b.id end)
  for _, e in ipairs(victims) do e:take_damage(DAMAGE) end
end

function World:scoreboard()
  local n = 0
  for e in pairs(self.all) do n = n + 1 end
  self.log[#self.log + 1] = "count " .. n
  if #self.log > 50 then table.remove(self.log, 1) end
end

-- v2: one frame
function World:migrate()
  if (self.version or 1) < 3 then
    for e in pairs(self.all) do e.armor = e.armor or 1 end
    self.sparks = self.sparks or {}
    self.version = 3
  end
end

function World:step(inputs)
  self:migrate()
  self.tick = self.tick + 1
  local dt = 1 / 30
  for p, input in ipairs(inputs) do
    self.score[p] = self.score[p] + (input % 4)
    if input % 16 == 0 then
      -- a player attack: hurts the enemy closest to the middle, by id order
      local best
      for e in pairs(self.enemies) do
        if not best or e.id < best.id then best = e end
      end
      if best then best:take_damage(5); effects.spark(self, best) ; self.score[p] = self.score[p] + 10 end
    end
  end
  for e in pairs(self.all) do e:update(dt) end
  self.timer:update(dt)
  effects.update(self)
end

function World:digest()
  local ids = {}
  for e in pairs(self.all) do ids[#ids + 1] = e end
  table.sort(ids, function(a, b) return a.id < b.id end)
  local h = self.tick * 7 + self.kills * 131
  for _, e in ipairs(ids) do
    h = (h * 31 + e.id * 1000 + math.floor(e.pos.x * 10) + math.floor(e.pos.y * 10) * 3 + e.hp) % 2147483647
  end
  for p, s in ipairs(self.score) do h = (h * 17 + s) % 2147483647 end
  -- the log's last line reflects the callback order within one event
  return string.format("%d:%s", h, self.log[#self.log] or "")
end

return World
