-- stock_driver.lua: runs a luasnap game under a plain `lua` (stock Lua 5.5.1, or `luasnap run`)
-- with the same inputs as luasnap's runtime, to compare G.digest() with what luasnap computes.
--
--   lua stock_driver.lua GAME [--players P] [--seed S] [--frames N] [--at F1,F2,...]
--                             [--every K] [--measure] [--bundle OUT.lua [--print-at F1,...]]
--
-- GAME is a game folder (main.lua returning G, modules loaded with require relative to the
-- folder: dots as folders, name.lua or name/init.lua) or a single-file game script.
-- Inputs are luasnap's scripted_input(seed, frame, player) (lua-bridge/src/runtime/mod.rs),
-- ported with Lua's wrapping 64-bit integers; inputs[p] is player p's input, players counted
-- from 1 as the runtime's table is (its player index p - 1 feeds the input schedule), a fresh
-- table every frame. The defaults are `luasnap simulate`'s: 2 players, seed 1, 600 frames.
--
-- Output: G.digest() after each frame listed in --at (default 100,300; frames counted as
-- G.step calls made, so "after 300" is the state `simulate --frames 300` ends in), every K
-- frames with --every, and at the end; then the live heap after G.init and step times.
-- --measure also reports the garbage a frame makes and the live heap each frame: it stops the
-- collector during G.step (the growth of collectgarbage("count") is what the frame allocated,
-- less what it freed explicitly, e.g. tables it resized) and runs a full collection after
-- every frame. That changes when the collector runs, so weak tables and finalizers see other
-- timings than in a plain run; step times are measured in plain runs only.
--
-- --bundle OUT.lua writes the game as one script (`luasnap simulate` runs a game's folder with
-- the deterministic profile's `require` now; the bundle stays for other hosts): every .lua file
-- of the folder becomes a function in a local table, loaded by a local `require` that finds
-- only those (as that profile's folder-only require does; a single-file game gets no modules); --print-at makes the bundle print
-- G.digest() after those frames (it reads the runtime's `luasnap_frame`). Each run of
-- `simulate` prints, and predicted frames print too: `simulate --delay 0 --mode full` prints
-- each frame twice, once from the lockstep reference and once from the full-copy run.

local usage = "usage: lua stock_driver.lua GAME [--players P] [--seed S] [--frames N] " ..
  "[--at F1,F2] [--every K] [--measure] [--bundle OUT.lua [--print-at F1,F2]]"

-- ---------------------------------------------------------------- the runtime's input schedule

-- splitmix-style finalizer (MurmurHash3's fmix64), on wrapping 64-bit integers: `>>` is a
-- logical shift in Lua, as on Rust's u64.
local function mix(x)
  x = x ~ (x >> 33)
  x = x * 0xff51afd7ed558ccd
  x = x ~ (x >> 33)
  x = x * 0xc4ceb9fe1a85ec53
  return x ~ (x >> 33)
end

--- Player `player`'s input (0..31) at `frame` (from 0); `player` counts from 0 as in Rust.
local function scripted_input(seed, frame, player)
  local hold = 4 + (mix(seed ~ (player << 32) ~ 0xA5A5) & 15) -- u64 % 16
  return mix((seed * 31) ~ (player << 40) ~ (frame // hold)) & 0x1f
end

-- ---------------------------------------------------------------- arguments

local function die(msg)
  io.stderr:write("stock_driver: ", msg, "\n", usage, "\n")
  os.exit(2)
end

local function frame_list(s)
  local t = {}
  for n in s:gmatch("[^,]+") do
    local f = math.tointeger(tonumber(n))
    if not f or f < 0 then die("not a frame count: " .. n) end
    t[#t + 1] = f
  end
  return t
end

local opts = { players = 2, seed = 1, frames = 600, at = { 100, 300 } }
do
  local i = 1
  local function value(name)
    i = i + 1
    local v = arg[i]
    if v == nil then die(name .. " needs a value") end
    return v
  end
  local function int(name, lo)
    local v = math.tointeger(tonumber(value(name)))
    if not v or v < lo then die(name .. " needs an integer of at least " .. lo) end
    return v
  end
  while arg[i] do
    local a = arg[i]
    if a == "--players" then opts.players = int(a, 1)
    elseif a == "--seed" then opts.seed = int(a, 0)
    elseif a == "--frames" then opts.frames = int(a, 0)
    elseif a == "--every" then opts.every = int(a, 1)
    elseif a == "--at" then opts.at = frame_list(value(a))
    elseif a == "--measure" then opts.measure = true
    elseif a == "--bundle" then opts.bundle = value(a)
    elseif a == "--print-at" then opts.print_at = frame_list(value(a))
    elseif a:sub(1, 2) == "--" then die("unknown option " .. a)
    elseif opts.game then die("one game only (got " .. opts.game .. " and " .. a .. ")")
    else opts.game = a end
    i = i + 1
  end
  if not opts.game then die("which game?") end
end

-- ---------------------------------------------------------------- finding the game

local function readable(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local dir, main_path
if opts.game:sub(-4) == ".lua" and readable(opts.game) then
  main_path = opts.game
  dir = opts.game:match("^(.*)/[^/]*$") or "."
else
  dir = opts.game:gsub("/+$", "")
  main_path = dir .. "/main.lua"
  if not readable(main_path) then die("no " .. main_path) end
end

-- ---------------------------------------------------------------- --bundle

local function bundle(out_path)
  local files = {}
  -- A folder game bundles every module of its folder; a single-file game none.
  local quoted = "'" .. dir:gsub("'", "'\\''") .. "'"
  local list = "cd " .. quoted .. " && find . -name '*.lua' | LC_ALL=C sort"
  local p = io.popen(main_path == dir .. "/main.lua" and list or "true")
  for line in p:lines() do
    local rel = line:gsub("^%./", "")
    if dir .. "/" .. rel ~= main_path and rel ~= "stock_driver.lua" then files[#files + 1] = rel end
  end
  p:close()
  local function slurp(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("a")
    f:close()
    return (s:gsub("^#![^\n]*", ""))
  end
  local out = {
    "-- Generated by stock_driver.lua --bundle from " .. main_path .. ": the game's modules as\n",
    "-- functions and a require that loads only them (as the deterministic profile's does).\n",
    "local __modules, __loaded = {}, {}\n",
    "local function require(name)\n",
    "  local v = __loaded[name]\n",
    "  if v ~= nil then return v end\n",
    "  local f = __modules[name]\n",
    "  if not f then error(\"module '\" .. tostring(name) .. \"' not found in the game folder\", 2) end\n",
    "  v = f(name)\n",
    "  if v == nil then v = true end\n",
    "  __loaded[name] = v\n",
    "  return v\n",
    "end\n",
  }
  for _, rel in ipairs(files) do
    local name = rel:gsub("%.lua$", ""):gsub("/", ".")
    out[#out + 1] = ("-- %s\n__modules[%q] = function(...)\n"):format(rel, name)
    out[#out + 1] = slurp(dir .. "/" .. rel)
    out[#out + 1] = "\nend\n"
    local pkg = name:match("^(.*)%.init$")
    if pkg then out[#out + 1] = ("__modules[%q] = __modules[%q]\n"):format(pkg, name) end
  end
  out[#out + 1] = "-- " .. main_path .. "\nlocal __G = (function(...)\n"
  out[#out + 1] = slurp(main_path)
  out[#out + 1] = "\nend)()\n"
  if opts.print_at then
    local keys = {}
    for _, f in ipairs(opts.print_at) do keys[#keys + 1] = ("[%d] = true"):format(f) end
    out[#out + 1] = "local __print_at, __step = { " .. table.concat(keys, ", ") .. " }, __G.step\n"
    out[#out + 1] = [[
__G.step = function(inputs)
  __step(inputs)
  local f = luasnap_frame + 1
  if __print_at[f] then
    print(("digest after %d frames: %s"):format(f, __G.digest and tostring(__G.digest()) or "(no G.digest)"))
  end
end
]]
  end
  out[#out + 1] = "return __G\n"
  local f = assert(io.open(out_path, "wb"))
  f:write(table.concat(out))
  f:close()
  io.stderr:write(("stock_driver: wrote %s (%d modules and %s)\n"):format(out_path, #files, main_path))
end

if opts.bundle then
  bundle(opts.bundle)
  return
end

-- ---------------------------------------------------------------- running it

-- Modules load from the game's folder only (no system paths, no C modules), as the
-- deterministic profile's require does.
package.path = dir .. "/?.lua;" .. dir .. "/?/init.lua"
package.cpath = ""

local chunk = assert(loadfile(main_path))
local G = chunk()
assert(type(G) == "table" and type(G.init) == "function" and type(G.step) == "function",
  main_path .. " must return a table G with G.init and G.step")

local function digest()
  if not G.digest then return "(no G.digest)" end
  local d = G.digest()
  if math.type(d) == "integer" then return ("%d (0x%016x)"):format(d, d) end
  return tostring(d)
end

local clock, count, gc = os.clock, collectgarbage, collectgarbage
local at = {}
for _, f in ipairs(opts.at) do at[f] = true end

local function kib(x) return ("%.1f KiB"):format(x) end

print(("game %s: players %d, seed %d, frames %d%s"):format(main_path, opts.players, opts.seed,
  opts.frames, opts.measure and ", measuring garbage (collector stopped in G.step)" or ""))

G.init(opts.players, opts.seed)
gc("collect")
local live0 = count("count")
print(("live heap after G.init: %s"):format(kib(live0)))
print(("digest after 0 frames: %s"):format(digest()))

local times, garbage, live = {}, {}, {}
if opts.measure then gc("stop") end
for frame = 0, opts.frames - 1 do
  local inputs = {}
  for p = 1, opts.players do inputs[p] = scripted_input(opts.seed, frame, p - 1) end
  if opts.measure then
    local before = count("count")
    G.step(inputs)
    garbage[#garbage + 1] = count("count") - before
    gc("collect")
    gc("stop")
    live[#live + 1] = count("count")
  else
    local t0 = clock()
    G.step(inputs)
    times[#times + 1] = clock() - t0
  end
  local n = frame + 1
  if at[n] or (opts.every and n % opts.every == 0) or n == opts.frames then
    print(("digest after %d frames: %s"):format(n, digest()))
  end
end

local function stats(t)
  if #t == 0 then return 0, 0, 0 end
  local s, sorted = 0, {}
  for i, v in ipairs(t) do s = s + v; sorted[i] = v end
  table.sort(sorted)
  return s / #t, sorted[(#sorted + 1) // 2], sorted[#sorted]
end

if opts.measure then
  local gm, gmed, gmax = stats(garbage)
  local lm, lmed, lmax = stats(live)
  print(("garbage per frame: mean %s, median %s, max %s"):format(kib(gm), kib(gmed), kib(gmax)))
  print(("live heap after each frame: mean %s, median %s, max %s"):format(kib(lm), kib(lmed), kib(lmax)))
else
  local tm, tmed, tmax = stats(times)
  print(("G.step: mean %.3f ms, median %.3f ms, max %.3f ms (os.clock, collector as configured)")
    :format(tm * 1e3, tmed * 1e3, tmax * 1e3))
  gc("collect")
  print(("live heap at the end: %s"):format(kib(count("count"))))
end
