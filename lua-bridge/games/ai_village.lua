-- AI Village: 300 villagers, each driven by a behaviour coroutine that stays suspended between
-- frames. Paths come from coroutine.wrap generators, plans from a small command language parsed
-- with string.find/gsub, results are memoized in weak caches, and failures inside behaviours
-- are caught with pcall and logged, as game AI code usually does.
--
-- G.init(players, seed), G.step(inputs), G.digest() -> an integer.
local G = {}

local VILLAGERS = 300
local SIZE = 64

local world

-- ---------------------------------------------------------------- helpers
-- A queue with a length operator.
local Queue = {}
Queue.__index = Queue
Queue.__len = function(q) return q.last - q.first + 1 end
local function queue() return setmetatable({ first = 1, last = 0, items = {} }, Queue) end
function Queue:push(v) self.last = self.last + 1; self.items[self.last] = v end
function Queue:pop()
  if self.first > self.last then return nil end
  local v = self.items[self.first]
  self.items[self.first] = nil
  self.first = self.first + 1
  return v
end

-- A blackboard that records which keys were written this frame (__newindex on a proxy).
local function blackboard()
  local data, dirty = {}, {}
  return setmetatable({}, {
    __index = data,
    __newindex = function(_, k, v)
      if data[k] ~= v then dirty[#dirty + 1] = k end
      data[k] = v
    end,
    __len = function() return #dirty end,
    __call = function(self, reset)
      local n = #dirty
      if reset then dirty = {} end
      return n
    end,
  })
end

-- A to-be-closed "reservation" of a map cell: released when the scope ends, error or not.
local function reserve(cell, who)
  cell.holder = who
  return setmetatable({}, { __close = function() cell.holder = nil; world.released = world.released + 1 end })
end

-- Counters sharing one upvalue.
local function counter_pair()
  local n = 0
  local function inc(k) n = n + (k or 1); return n end
  local function get() return n end
  return inc, get
end

-- Weak caches: paths by "x,y>x,y" key (weak values), and per-villager annotations (weak keys).
local path_cache = setmetatable({}, { __mode = "v" })
local notes = setmetatable({}, { __mode = "k" })

local function walk(x0, y0, x1, y1)
  -- a generator of the cells from (x0,y0) to (x1,y1), one axis then the other
  return coroutine.wrap(function()
    local x, y = x0, y0
    while x ~= x1 do x = x + (x1 > x and 1 or -1); coroutine.yield(x, y) end
    while y ~= y1 do y = y + (y1 > y and 1 or -1); coroutine.yield(x, y) end
  end)
end

local function path(x0, y0, x1, y1)
  local key = string.format("%d,%d>%d,%d", x0, y0, x1, y1)
  local p = path_cache[key]
  if p then return p end
  p = {}
  for x, y in walk(x0, y0, x1, y1) do p[#p + 1] = { x, y } end
  path_cache[key] = p
  return p
end

-- ---------------------------------------------------------------- plans
-- A plan is text like "goto 12 40; work 3; say héllo wörld; goto 1 1; rest 2".
local PLANS = {
  "goto %d %d; work %d; say bonjour à tous; goto %d %d; rest 2",
  "gather %d; goto %d %d; say ¡hola!; work %d",
  "rest %d; goto %d %d; say 你好; fail now",
  "goto %d %d; goto %d %d; work %d; say ok",
}

local function parse(plan)
  local steps = {}
  for raw in plan:gmatch("[^;]+") do
    local cmd = raw:gsub("^%s+", ""):gsub("%s+$", "")
    local s, e, verb = cmd:find("^(%a+)")
    if not s then error("bad command '" .. cmd .. "'") end
    local args = {}
    for a in cmd:sub(e + 1):gmatch("%S+") do args[#args + 1] = tonumber(a) or a end
    steps[#steps + 1] = { verb = verb, args = args }
  end
  return steps
end

local function make_plan()
  local fmt = PLANS[math.random(#PLANS)]
  local n = select(2, fmt:gsub("%%d", "%%d"))
  local args = {}
  for i = 1, n do args[i] = math.random(1, SIZE) end
  return string.format(fmt, table.unpack(args))
end

-- ---------------------------------------------------------------- behaviours
local function behaviour(v)
  return coroutine.create(function()
    while true do
      local plan = make_plan()
      local ok, err = pcall(function()
        for _, step in ipairs(parse(plan)) do
          if step.verb == "goto" then
            local p = path(v.x, v.y, step.args[1], step.args[2])
            for i = 1, #p, 2 do
              local cell = world.map[p[i][2]][p[i][1]]
              do
                local r <close> = reserve(cell, v.id)
                v.x, v.y = p[i][1], p[i][2]
                coroutine.yield()
              end
            end
            v.x, v.y = step.args[1], step.args[2]
          elseif step.verb == "work" or step.verb == "gather" then
            for _ = 1, step.args[1] do
              v.goods = v.goods + 1
              world.produced(1)
              coroutine.yield()
            end
          elseif step.verb == "rest" then
            for _ = 1, step.args[1] do v.energy = math.min(100, v.energy + 5); coroutine.yield() end
          elseif step.verb == "say" then
            local text = table.concat(step.args, " ")
            v.said = text
            v.said_len = utf8.len(text)
            world.board["last_words_" .. (v.id % 8)] = text
            coroutine.yield()
          elseif step.verb == "fail" then
            error(string.format("villager %d gave up at (%d,%d)", v.id, v.x, v.y))
          end
          v.energy = v.energy - 1
        end
      end)
      if not ok then
        world.failures:push((tostring(err):gsub("^.-:%d+: ", "")))
        if #world.failures > 20 then world.failures:pop() end
        coroutine.yield()
      end
    end
  end)
end

function G.init(players, seed)
  math.randomseed(seed)
  local inc, get = counter_pair()
  world = {
    tick = 0, villagers = {}, map = {}, released = 0,
    produced = inc, total_produced = get,
    failures = queue(), board = blackboard(), players = {},
  }
  for y = 1, SIZE do
    local row = {}
    for x = 1, SIZE do row[x] = { x = x, y = y, crop = (x * y) % 7 } end
    world.map[y] = row
  end
  for i = 1, VILLAGERS do
    local v = {
      id = i, x = math.random(SIZE), y = math.random(SIZE), goods = 0, energy = 50,
      name = utf8.char(0x41 + i % 26, 0xE9, 0x4E00 + i),
    }
    v.brain = behaviour(v)
    world.villagers[i] = v
    notes[v] = { met = 0 }
  end
  for p = 1, players do
    world.players[p] = { x = SIZE // 2, y = SIZE // 2, traded = 0 }
  end
end

function G.step(inputs)
  world.tick = world.tick + 1
  for i, input in ipairs(inputs) do
    local p = world.players[i]
    p.x = (p.x + ((input & 3) == 1 and -1 or (input & 3) == 2 and 1 or 0) - 1) % SIZE + 1
    p.y = (p.y + ((input >> 2 & 3) == 1 and -1 or (input >> 2 & 3) == 2 and 1 or 0) - 1) % SIZE + 1
    if input & 16 ~= 0 then
      for _, v in ipairs(world.villagers) do
        if v.x == p.x and v.y == p.y and v.goods > 0 then
          v.goods = v.goods - 1
          p.traded = p.traded + 1
          local n = notes[v]
          if n then n.met = n.met + 1 end
        end
      end
    end
  end
  for _, v in ipairs(world.villagers) do
    local ok, err = coroutine.resume(v.brain)
    if not ok then error(err) end
  end
  world.board.frame = world.tick
  world.board.dirty = world.board(true)
  -- names in codepoints, every 50 frames
  if world.tick % 50 == 0 then
    local cps = 0
    for _, v in ipairs(world.villagers) do
      for _, c in utf8.codes(v.name) do cps = cps + c % 7 end
    end
    world.board.codepoints = cps
  end
end

function G.digest()
  local h = world.tick
  for _, v in ipairs(world.villagers) do
    h = (h * 33 + v.x * 3 + v.y * 5 + v.goods + v.energy) % 2147483647
  end
  for _, p in ipairs(world.players) do h = (h * 7 + p.traded) % 2147483647 end
  return h + world.total_produced() + #world.failures + world.released
end

return G
