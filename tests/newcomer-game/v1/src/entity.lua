local Class = require "lib.class"
local vector = require "lib.vector"
local beholder = require "lib.beholder"

local Entity = Class{}

function Entity:init(world, id, x, y, kind)
  self.world = world
  self.id = id
  self.pos = vector(x, y)
  self.vel = vector((id % 7) - 3, (id % 5) - 2)
  self.kind = kind
  self.hp = 10
  self.trail = {}
end

function Entity:update(dt)
  -- lots of short-lived garbage: vectors every frame
  self.pos = self.pos + self.vel * dt
  local w = self.world
  if self.pos.x < 0 or self.pos.x > w.size then self.vel.x = -self.vel.x end
  if self.pos.y < 0 or self.pos.y > w.size then self.vel.y = -self.vel.y end
  self.trail[#self.trail + 1] = string.format("%.1f,%.1f", self.pos.x, self.pos.y)
  if #self.trail > 4 then table.remove(self.trail, 1) end
end

function Entity:hurt(n)
  self.hp = self.hp - n
  if self.hp <= 0 then
    beholder.trigger("died", self)
  end
end

return Entity
