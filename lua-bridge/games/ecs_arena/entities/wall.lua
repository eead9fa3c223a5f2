-- Static blocks: the arena's border and pillars.
local class = require("lib.middleclass")
local Entity = require("entities.entity")

local Wall = class("Wall", Entity)
Wall.kind = 8

function Wall:initialize(x, y, w, h)
  Entity.initialize(self, x, y, w, h)
  self.body = true
  self.wall = true
end

return Wall
