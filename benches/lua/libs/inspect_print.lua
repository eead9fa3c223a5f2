-- inspect.lua (vendor/inspect.lua, MIT): pretty-print a 200-record document, with metatables
-- and shared subtables, `rounds` times.
local dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
package.path = dir .. "vendor/?.lua;" .. dir .. "?.lua;" .. package.path
local inspect = require("inspect")
local doc = require("data")(200)
local shared = { kind = "shared" }
for i, r in ipairs(doc) do
  r.group = shared
  if i % 10 == 0 then setmetatable(r, { __name = "Person" }) end
end
local rounds = tonumber((...)) or 60
local bytes = 0
for _ = 1, rounds do
  bytes = bytes + #inspect(doc) + #inspect(doc, { depth = 2 })
end
print("inspect", bytes)
