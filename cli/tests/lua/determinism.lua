-- Exercises every source of nondeterminism the deterministic profile must pin down.
local t = {}
for i = 1, 300 do t["key" .. i] = i end          -- string keys: hash seed
local objs = {}
for i = 1, 300 do objs[{ id = i }] = i end       -- table keys: addresses (fixed base)
local s_order, o_order = {}, {}
for k, v in pairs(t) do s_order[#s_order + 1] = v end
for k, v in pairs(objs) do o_order[#o_order + 1] = v end
print("strings", table.concat(s_order, ",", 1, 40))
print("objects", table.concat(o_order, ",", 1, 40))
print("random", math.random(1, 1 << 40), math.random())
local people = {}
for i = 1, 500 do people[i] = { age = i % 13, n = i } end
table.sort(people, function(a, b) return a.age < b.age end)  -- equal keys: stability
local ns = {}
for i = 1, 40 do ns[i] = people[i].n end
print("sort", table.concat(ns, ","))
print("address", tostring({}))
print("memory", collectgarbage("count"))
state = { t = t, people = people, order = s_order }
