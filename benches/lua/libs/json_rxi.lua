-- rxi's json.lua (vendor/json.lua, MIT): encode a 200-record document and decode it again,
-- `rounds` times. `lua json_rxi.lua [rounds]`; prints the bytes encoded and values decoded.
local dir = (arg and arg[0] or ""):match("^(.*/)") or "./"
package.path = dir .. "vendor/?.lua;" .. dir .. "?.lua;" .. package.path
local json = require("json")
local doc = require("data")(200)
local rounds = tonumber((...)) or 60
local bytes, values = 0, 0
for _ = 1, rounds do
  local text = json.encode(doc)
  bytes = bytes + #text
  local back = json.decode(text)
  values = values + #back + #back[#back].phoneNumbers
end
print("json.lua", bytes, values)
