-- tiny-ecs (vendor/tiny.lua, MIT): a world of 2000 entities and four processing systems
-- (movement, bounds, ageing that removes and respawns, a sorted draw pass), `frames` updates.
local dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
package.path = dir .. "vendor/?.lua;" .. dir .. "?.lua;" .. package.path
local tiny = require("tiny")
local frames = tonumber((...)) or 300

local world = tiny.world()
local seed = 1
local function rand(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
local function spawn()
  world:addEntity({ x = rand(800), y = rand(600), vx = rand(9) - 4, vy = rand(9) - 4,
    life = 50 + rand(200), z = rand(16), name = "e" .. rand(1000) })
end

local move = tiny.processingSystem()
move.filter = tiny.requireAll("x", "y", "vx", "vy")
function move:process(e, dt) e.x = e.x + e.vx * dt; e.y = e.y + e.vy * dt end

local bounds = tiny.processingSystem()
bounds.filter = tiny.requireAll("x", "y", "vx", "vy")
function bounds:process(e)
  if e.x < 0 or e.x > 800 then e.vx = -e.vx end
  if e.y < 0 or e.y > 600 then e.vy = -e.vy end
end

local age = tiny.processingSystem()
age.filter = tiny.requireAll("life")
function age:process(e)
  e.life = e.life - 1
  if e.life <= 0 then world:removeEntity(e); spawn() end
end

local drawn = 0
local draw = tiny.sortedProcessingSystem()
draw.filter = tiny.requireAll("x", "y", "z", tiny.rejectAny("hidden"))
function draw:compare(a, b) return a.z < b.z end
function draw:process(e) drawn = drawn + (e.x > 400 and 1 or 0) end

world:addSystem(move); world:addSystem(bounds); world:addSystem(age); world:addSystem(draw)
for _ = 1, 2000 do spawn() end
for _ = 1, frames do world:update(1) end
print("tiny-ecs", drawn, world:getEntityCount())
