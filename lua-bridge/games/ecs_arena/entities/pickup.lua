-- Scrap that drones drop: ships collect it for score, and their magnets pull it in.
local class = require("lib.middleclass")
local Entity = require("entities.entity")

local Pickup = class("Pickup", Entity)
Pickup.kind = 7

function Pickup:initialize(x, y, value)
  Entity.initialize(self, x, y, 6, 6)
  self.body = true
  self.pickup = { value = value }
  self.lifetime = 300
end

return Pickup
