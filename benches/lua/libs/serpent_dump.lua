-- serpent (vendor/serpent.lua, MIT): serialize a 200-record document (serpent.dump, keys
-- sorted, and serpent.line) and load the dump back, `rounds` times.
local dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
package.path = dir .. "vendor/?.lua;" .. dir .. "?.lua;" .. package.path
local serpent = require("serpent")
local doc = require("data")(200)
local rounds = tonumber((...)) or 25
local bytes, values = 0, 0
for _ = 1, rounds do
  local dump = serpent.dump(doc, { sortkeys = true })
  local line = serpent.line(doc, { comment = false })
  bytes = bytes + #dump + #line
  local ok, back = serpent.load(dump)
  assert(ok, back)
  values = values + #back
end
print("serpent", bytes, values)
