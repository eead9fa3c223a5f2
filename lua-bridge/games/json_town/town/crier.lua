-- Debug strings: a few townsfolk a frame through inspect (no class or metatable, no mail, two
-- levels deep), kept in a ring the way a game keeps its last log lines for a bug report.
local inspect = require("lib.inspect")

local crier = {}
local RING = 24

local function plain(item, path)
  local last = path[#path]
  -- (the class goes too: inspect reuses a table it has seen by another path without asking
  -- again, so the metatable would come back through agent.class.__instanceDict)
  if last == inspect.METATABLE or last == "inbox" or last == "class" then return nil end
  return item
end

function crier.new()
  return { lines = {}, total = 0 }
end

function crier.describe(c, agent, f)
  local text = ("[%d] %s the %s: %s"):format(f, agent.name, agent:profession(),
    inspect(agent, { depth = 2, process = plain, newline = " ", indent = "" }))
  local lines = c.lines
  lines[#lines + 1] = text
  c.total = c.total + 1
  if #lines > RING then table.remove(lines, 1) end
  return text
end

return crier
