-- A small game for tests: players move, a few NPCs wander with closures and a coroutine.
local G = {}
local world
local Mob = {} Mob.__index = Mob
function G.init(players, seed)
  world = { tick = 0, seed = seed, players = {}, mobs = {}, log = {} }
  for p = 1, players do world.players[p] = { x = p, y = 0, score = 0 } end
  for i = 1, 50 do
    local m = setmetatable({ id = i, x = i % 7, hp = 10 }, Mob)
    m.think = function() return m.x + world.tick end
    world.mobs[i] = m
  end
  world.ai = coroutine.create(function()
    local n = 0
    while true do n = n + 1; world.mobs[n % 50 + 1].hp = world.mobs[n % 50 + 1].hp + 1; coroutine.yield(n) end
  end)
end
function G.step(inputs)
  world.tick = world.tick + 1
  for p, input in ipairs(inputs) do
    local pl = world.players[p]
    pl.x = pl.x + (input & 3) - 1
    pl.y = pl.y + ((input >> 2) & 3) - 1
    if input & 16 ~= 0 then pl.score = pl.score + 1 end
  end
  for i = 1, #world.mobs, 5 do world.mobs[i].x = world.mobs[i].think() % 97 end
  coroutine.resume(world.ai)
  world.log[world.tick % 16 + 1] = "t" .. world.tick
end
function G.digest()
  local h = world.tick
  for _, p in ipairs(world.players) do h = h * 31 + p.x * 7 + p.y * 3 + p.score end
  for _, m in ipairs(world.mobs) do h = (h * 17 + m.x + m.hp) % 0x7fffffffffff end
  return h
end
return G
