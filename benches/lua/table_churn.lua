-- Entity-like tables created, grown, mutated and dropped at a steady live size.
local N = ... or 200
local live = {}
local mt = { __index = { speed = 1 } }
local sum = 0
for frame = 1, N do
  for i = 1, 200 do
    local e = setmetatable({ x = i, y = frame, name = "e" .. i, tags = {} }, mt)
    for j = 1, i % 9 do e.tags[j] = j end
    live[(frame * 200 + i) % 5000 + 1] = e
  end
  for _, e in pairs(live) do sum = sum + e.x * e.speed end
end
return sum
