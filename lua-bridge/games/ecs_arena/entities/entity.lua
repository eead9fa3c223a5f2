-- The base class of everything in the arena. Components are plain fields: tiny-ecs systems
-- pick entities by which fields they have (pos, vel, body, ai, health, lifetime...).
local class = require("lib.middleclass")
local vec = require("util.vec")
local ctx = require("context")

local Entity = class("Entity")
Entity.kind = 0

function Entity:initialize(x, y, w, h)
  self.id = ctx.next_id()
  self.pos = vec(x, y)
  self.size = { w = w, h = h }
end

function Entity:center()
  return vec(self.pos.x + self.size.w / 2, self.pos.y + self.size.h / 2)
end

function Entity:alive()
  return not self.removed and (self.health == nil or self.health.hp > 0)
end

function Entity:__tostring()
  return ("%s#%d"):format(self.class.name, self.id)
end

return Entity
