-- String building: concatenation, buffers, formatting, interning.
local N = ... or 20000
local parts = {}
for i = 1, N do
  parts[#parts + 1] = string.format("%d:%s;", i, ("x"):rep(i % 17))
  if #parts > 200 then parts = { table.concat(parts) } end
end
local s = table.concat(parts)
local words = {}
for w in s:gmatch("%d+") do words[#words + 1] = w .. "!" end
local acc = ""
for i = 1, 2000 do acc = acc .. words[i] end
return #s + #words + #acc
