-- dkjson (vendor/dkjson.lua, MIT; pure Lua, without lpeg): encode a 200-record document and
-- decode it again, `rounds` times. `lua json_dkjson.lua [rounds]`.
local dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
package.path = dir .. "vendor/?.lua;" .. dir .. "?.lua;" .. package.path
local json = require("dkjson")
local doc = require("data")(200)
local rounds = tonumber((...)) or 60
local bytes, values = 0, 0
for _ = 1, rounds do
  local text = json.encode(doc, { indent = false })
  bytes = bytes + #text
  local back = json.decode(text)
  values = values + #back + #back[#back].phoneNumbers
end
print("dkjson", bytes, values)
