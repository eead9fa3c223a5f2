-- A player's ship: steered by the player's input bits, fires along its facing.
local class = require("lib.middleclass")
local vec = require("util.vec")
local Entity = require("entities.entity")

local Ship = class("Ship", Entity)
Ship.kind = 1
Ship.speed = 3.2

function Ship:initialize(player, x, y)
  Entity.initialize(self, x, y, 14, 14)
  self.vel = vec.zero()
  self.body = true
  self.faction = "crew"
  self.ship = { player = player, cooldown = 0, facing = vec(1, 0), magnet = 0, deaths = 0 }
  self.health = { hp = 100, max = 100 }
  self.score = 0
end

return Ship
