-- A game that acts on the first key of pairs() over a set of tables (as bump.lua's queryRect
-- does), over a table keyed by closures and over one keyed by C functions; entities are made
-- and dropped each frame, so new identities are handed out after a load too. Used by
-- tests/join.rs (a save loaded in a new process) and tests/corpus.rs (every backend).
local G = {} local W
function G.init(players, seed)
  W = { set = {}, fns = {}, picked = {}, n = 0, names = {}, runes = {} }
  for k, v in pairs(string) do if k ~= 'dump' then W.names[v] = k end end
  for i = 1, 60 do W.set[{ id = i }] = i end
  for i = 1, 20 do W.fns[function() return i end] = i end
end
function G.step(inputs)
  for p = 1, #inputs do
    local first = next(W.set)
    W.picked[#W.picked + 1] = first.id
    W.set[first] = nil
    W.n = W.n + 1
    W.set[{ id = 1000 + W.n, hp = inputs[p] }] = W.n
    local f = next(W.fns)
    W.picked[#W.picked + 1] = f()
    W.fns[f] = nil
    local n = W.n
    W.fns[function() return 100 + n end] = n
    local c = next(W.names, W.runes[p])
    W.runes[p] = c
    if c then W.picked[#W.picked + 1] = W.names[c] end
  end
end
function G.digest()
  local s = 0
  for _, v in ipairs(W.picked) do
    local x = type(v) == 'string' and #v * 7 + v:byte(1) or v
    s = (s * 31 + x) % 1000000007
  end
  return s
end
return G
