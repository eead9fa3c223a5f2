-- Bullets from ships and tanks; tank shells set what they hit on fire.
local class = require("lib.middleclass")
local Entity = require("entities.entity")

local Bullet = class("Bullet", Entity)
Bullet.kind = 5

--- `shooter` is the ship or drone that fired, `vel` a fresh vector.
function Bullet:initialize(shooter, x, y, vel, amount, incendiary)
  Entity.initialize(self, x, y, 3, 3)
  self.vel = vel
  self.body = true
  self.faction = shooter.faction
  self.damage = { amount = amount, owner = shooter, incendiary = incendiary or false }
  self.lifetime = 60
end

return Bullet
