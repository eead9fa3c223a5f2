-- A game whose host registers natives (host.vec2, host.clamp, host.roll) and a plain-data
-- userdata type (Vec2): run it with the host binary, examples/host_game.rs.
local G, world = {}, nil
-- The top level reads a native: `luasnap diff --game` compiles this script but never runs it,
-- so it reads saves of this game without the natives.
local clamp = host.clamp

function G.init(players, seed)
  -- A native kept in the state: saves name it; a VM without it loads a stand-in.
  world = { tick = 0, seed = seed, ships = {}, roll = host.roll }
  for p = 1, players do
    world.ships[p] = { name = "ship" .. p, pos = host.vec2(p * 10, 0), score = 0 }
  end
end

function G.step(inputs)
  world.tick = world.tick + 1
  for p, b in ipairs(inputs) do
    local ship = world.ships[p]
    ship.pos.x = clamp(ship.pos.x + (b & 3) - 1, -50, 50)
    ship.pos.y = clamp(ship.pos.y + ((b >> 2) & 3) - 1, -50, 50)
    if b & 16 ~= 0 then
      ship.score = ship.score + world.roll(world.seed, world.tick, p)
    end
  end
end

function G.digest()
  local h = world.tick
  for _, s in ipairs(world.ships) do
    h = (h * 31 + math.floor(s.pos.x) * 7 + math.floor(s.pos.y) * 3 + s.score) % 0x7fffffff
  end
  return h
end

return G
