-- A game whose particles go back to a pool of globals when the collector finalizes them (a
-- pool refilled from __gc, as games that recycle objects write it), and which counts what
-- was finalized into its digest. A load into a VM that ran the game before (simulate's
-- serialize mode, a resynced client) replaces the state: the replaced state's particles
-- must not be finalized into the new state's globals. Used by tests/corpus.rs (every
-- backend).
local G = { collect_every = 3 }
local Particle = {}
Particle.__index = Particle
Particle.__gc = function(p)
  FINALIZED = FINALIZED + p.value
  POOL[#POOL + 1] = p          -- resurrected: reused, and marked again by setmetatable
end
local function particle(value)
  local p = table.remove(POOL)
  if p then p.value = value else p = { value = value } end
  return setmetatable(p, Particle)
end
local W
function G.init(players, seed)
  FINALIZED, POOL = 0, {}
  W = { tick = 0, live = {}, sum = 0 }
end
function G.step(inputs)
  W.tick = W.tick + 1
  for p = 1, #inputs do
    for i = 1, 4 + inputs[p] % 5 do
      W.live[#W.live + 1] = particle(W.tick * 10 + i + p)
    end
  end
  if #W.live > 40 then W.live = {} end     -- the particles become garbage
  W.sum = (W.sum * 31 + FINALIZED + #POOL) % 1000000007
end
function G.digest()
  return W.sum * 1000 + W.tick
end
return G
