-- Under a memory cap: how many entries fit before "not enough memory" (README, "Memory limits").
local t, i = {}, 0
pcall(function() while true do i = i + 1; t[i] = i end end)
print(i)
