-- Under a memory cap: a stack overflow first (Lua then frees its spare CallInfo records every
-- other one), then how many entries a growing array reaches (README, "Memory limits").
local function f(n) return 1 + f(n + 1) end
print(select(2, pcall(f, 1)))
collectgarbage()
local t, i = {}, 0
pcall(function() while true do i = i + 1; t[i] = i end end)
print(i)
