-- FNV-1a-style hashing on wrapping 64-bit integers, for G.digest(). Strings are hashed eight
-- bytes at a time (string.unpack), so hashing the town's archives stays cheap.
local hash = {}

local PRIME = 0x100000001b3
hash.SEED = 0xcbf29ce484222325

function hash.int(h, v)
  return (h ~ v) * PRIME
end

--- A float, to 1/1000.
function hash.num(h, x)
  return (h ~ math.floor(x * 1000 + 0.5)) * PRIME
end

function hash.str(h, s)
  local n = #s
  local i = 1
  while i + 7 <= n do
    h = (h ~ string.unpack("<i8", s, i)) * PRIME
    i = i + 8
  end
  if i <= n then
    h = (h ~ string.unpack("<i" .. (n - i + 1), s, i)) * PRIME
  end
  return (h ~ n) * PRIME
end

return hash
