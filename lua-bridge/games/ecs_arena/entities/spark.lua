-- Sparks: short-lived particles from hits and deaths (no collision body).
local class = require("lib.middleclass")
local vec = require("util.vec")
local Entity = require("entities.entity")

local Spark = class("Spark", Entity)
Spark.kind = 6

function Spark:initialize(x, y, heat)
  Entity.initialize(self, x, y, 1, 1)
  self.vel = vec.polar(math.random() * 2 * math.pi, 1 + math.random() * heat)
  self.spark = { heat = heat }
  self.lifetime = math.random(6, 14)
end

return Spark
