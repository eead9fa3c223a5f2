-- Drones: three kinds, three factions that fight each other and the crew.
local class = require("lib.middleclass")
local vec = require("util.vec")
local Entity = require("entities.entity")

local Drone = class("Drone", Entity)

function Drone:initialize(faction, x, y)
  Entity.initialize(self, x, y, self.w, self.h)
  self.faction = faction
  self.body = true
  self.vel = vec.polar(math.random() * 2 * math.pi, self.speed)
  self.health = { hp = self.hp, max = self.hp }
  self.ai = { target = nil, retarget = math.random(1, 20), cooldown = self.gun or 0, bite = 0 }
end

local Grunt = class("Grunt", Drone)
Grunt.kind, Grunt.w, Grunt.h, Grunt.hp, Grunt.speed, Grunt.bite, Grunt.bounty = 2, 10, 10, 12, 1.6, 2, 10

local Runner = class("Runner", Drone)
Runner.kind, Runner.w, Runner.h, Runner.hp, Runner.speed, Runner.bite, Runner.bounty = 3, 8, 8, 6, 2.8, 1, 15

local Tank = class("Tank", Drone)
Tank.kind, Tank.w, Tank.h, Tank.hp, Tank.speed, Tank.bite, Tank.bounty = 4, 16, 16, 40, 0.8, 4, 40
Tank.gun = 45

Drone.kinds = { grunt = Grunt, runner = Runner, tank = Tank }

return Drone
