-- Written by an outside tester of luasnap (2026-11-28): a table keyed by library C functions,
-- keys removed and set again; the digest is the order pairs() gave.
local G = {}
local world
local FNS = { math.floor, math.abs, math.max, math.min, string.format, string.rep, string.sub,
  string.upper, string.lower, table.insert, table.concat, table.unpack, math.sqrt, math.ceil,
  string.byte, string.char, string.len, string.reverse, math.fmod, math.tointeger }
function G.init(players, seed)
  world = { tick = 0, handlers = {}, order = {} }
  for i, f in ipairs(FNS) do world.handlers[f] = i end
end
function G.step(inputs)
  world.tick = world.tick + 1
  local i = (inputs[1] + world.tick) % #FNS + 1
  local f = FNS[i]
  if world.handlers[f] then world.handlers[f] = nil else world.handlers[f] = i end
  local seq = {}
  for _, idx in pairs(world.handlers) do seq[#seq + 1] = idx end
  world.order = seq                      -- the order pairs gave
end
function G.digest() return table.concat(world.order, ",") end
return G
