-- 2D vectors as small tables with operators. Every operation returns a fresh table, as in
-- most Lua game code (hump.vector, brinevector...): cheap to write, and the garbage it makes
-- is the collector's business.
local lume = require("lib.lume")

local Vec = {}
Vec.__index = Vec

local function new(x, y)
  return setmetatable({ x = x, y = y }, Vec)
end

local function isvec(v) return getmetatable(v) == Vec end

Vec.__add = function(a, b) return new(a.x + b.x, a.y + b.y) end
Vec.__sub = function(a, b) return new(a.x - b.x, a.y - b.y) end
Vec.__unm = function(a) return new(-a.x, -a.y) end
Vec.__mul = function(a, b)
  if type(a) == "number" then return new(b.x * a, b.y * a) end
  if type(b) == "number" then return new(a.x * b, a.y * b) end
  return a.x * b.x + a.y * b.y -- dot product
end
Vec.__div = function(a, k) return new(a.x / k, a.y / k) end
Vec.__eq = function(a, b) return a.x == b.x and a.y == b.y end
Vec.__tostring = function(a) return ("(%.2f, %.2f)"):format(a.x, a.y) end

function Vec:len2() return self.x * self.x + self.y * self.y end
function Vec:len() return math.sqrt(self.x * self.x + self.y * self.y) end
function Vec:clone() return new(self.x, self.y) end

function Vec:normalized()
  local l = self:len()
  if l == 0 then return new(0, 0) end
  return new(self.x / l, self.y / l)
end

function Vec:limited(max)
  local l2 = self:len2()
  if l2 > max * max then return self:normalized() * max end
  return self:clone()
end

function Vec:rotated(a)
  local c, s = math.cos(a), math.sin(a)
  return new(c * self.x - s * self.y, s * self.x + c * self.y)
end

function Vec:dist(b) return lume.distance(self.x, self.y, b.x, b.y) end
function Vec:angle() return lume.angle(0, 0, self.x, self.y) end

--- A vector of length `len` pointing at `angle` (radians).
local function polar(angle, len)
  return new(lume.vector(angle, len))
end

return setmetatable({ new = new, isvec = isvec, polar = polar, zero = function() return new(0, 0) end },
  { __call = function(_, x, y) return new(x, y) end })
