-- A game whose state depends on the collector under stock Lua: a weak-valued cache of
-- "paths" (a hit reuses the cached table, a miss makes a new one and counts it), objects
-- with a finalizer that counts, and garbage every frame so that automatic collections run.
-- Whether an entry is still cached, and when a dropped object is finalized, depends on when
-- the collector ran: under luasnap's runtime, only at its collection points (every 10 frames
-- here, so a save after frame 50 follows a point) and where the game calls collectgarbage().
local G = { collect_every = 10 }

local cache = setmetatable({}, { __mode = "v" })
local held = {}             -- a few cached values held strongly, replaced over time
local hits, misses, finalized = 0, 0, 0
local Tracked = { __gc = function() finalized = finalized + 1 end }

function G.init(players, seed)
  math.randomseed(seed)
end

function G.step(inputs)
  for p = 1, #inputs do
    for _ = 1, 40 do
      local k = math.random(1, 300) + inputs[p] % 4
      local v = cache[k]
      if v then
        hits = hits + 1
        v.uses = v.uses + 1
      else
        misses = misses + 1
        v = { k = k, uses = 1, steps = { k, k * 2, k * 3 } }
        cache[k] = v
      end
      if math.random() < 0.1 then held[math.random(1, 16)] = v end
    end
  end
  for i = 1, 8 do setmetatable({ i }, Tracked) end  -- dropped at once
  local junk = {}
  for i = 1, 400 do junk[i % 50 + 1] = { i, tostring(i) } end
end

function G.digest()
  return hits * 1000000 + misses * 1000 + finalized
end

return G
