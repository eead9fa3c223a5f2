-- Under a memory cap: how many entries fit before "not enough memory" (README, "Memory limits").
local keep, i = {}, 0
local ok = pcall(function()
  while true do
    i = i + 1
    keep[i] = {i, i}
    for j = 1, 3 do local tmp = {j, tostring(j)} end
  end
end)
print(i)
