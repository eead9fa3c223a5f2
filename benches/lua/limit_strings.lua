-- Under a memory cap: how many entries fit before "not enough memory" (README, "Memory limits").
local t, i = {}, 0
local ok = pcall(function()
  while true do i = i + 1; t[i] = string.rep("x", 1 + (i * 7919) % 3000) end
end)
print(i)
