-- Iteration over keys that are C functions, tables, closures and coroutines, acted upon as a
-- game would (the first key of pairs() picks what happens next): the same in every process.
local names = {}
for k, v in pairs(string) do if type(v) == "function" then names[v] = "string." .. k end end
for k, v in pairs(math) do if type(v) == "function" then names[v] = "math." .. k end end
names[print], names[pairs], names[ipairs({})] = "print", "pairs", "ipairs#aux"
local order = {}
for _, name in pairs(names) do order[#order + 1] = name end
print("c functions", table.concat(order, " "))

local set = {}
for i = 1, 200 do
  local k
  if i % 3 == 0 then k = { id = i }
  elseif i % 3 == 1 then k = function() return i end
  else k = coroutine.create(function() return i end) end
  set[k] = i
end
local picked = {}
for round = 1, 100 do
  local k, i = next(set)
  picked[#picked + 1] = i
  set[k] = nil
  set[{ id = 1000 + round }] = 1000 + round
end
print("picked", table.concat(picked, " "))
print("memory", collectgarbage("count"))
state = { names = names, set = set, picked = picked }
-- What tests/determinism.rs compares between two VMs of one process (`lua` ignores it).
return table.concat(order, " ") .. " | " .. table.concat(picked, " ")
