-- The town ledger: every frame one district's books are written down with serpent (sorted
-- keys, no code), four entries kept per district. The newspaper reads an old entry back
-- with serpent.load and reports the biggest price move since.
local serpent = require("lib.serpent")
local goods = require("town.goods")
local names = require("town.names")

local GOODS = goods.list
local KEEP = 4

local ledger = {}

function ledger.new(districts)
  local l = { archive = {}, headlines = {}, written = 0, read = 0 }
  for d = 1, districts do l.archive[d] = {} end
  return l
end

--- A plain summary of district `d`: counts, averages, every agent's purse and stock.
local function summary(town, d, f)
  local s = { district = names.districts[d], frame = f, people = 0, coins = 0, mood = 0,
    price = {}, stock = {}, folk = {} }
  for _, g in ipairs(GOODS) do s.price[g] = 0; s.stock[g] = 0 end
  for _, a in ipairs(town.by_district[d]) do
    s.people = s.people + 1
    s.coins = s.coins + a.coins
    s.mood = s.mood + a.mood
    for _, g in ipairs(GOODS) do
      s.price[g] = s.price[g] + a.belief[g]
      s.stock[g] = s.stock[g] + a.stock[g]
    end
    s.folk[#s.folk + 1] = { id = a.id, name = a.name, job = a:profession(), coins = a.coins,
      hunger = a.hunger, stock = { a.stock.grain, a.stock.flour, a.stock.bread, a.stock.fish,
      a.stock.wood, a.stock.tools } }
  end
  for _, g in ipairs(GOODS) do
    s.price[g] = math.floor(s.price[g] / s.people * 100 + 0.5) / 100
  end
  s.mood = math.floor(s.mood / s.people * 10 + 0.5) / 10
  return s
end

--- Writes district `d`'s entry for frame `f`; returns the oldest entry's text if the archive
--- holds four.
function ledger.write(l, town, d, f)
  local text = serpent.dump(summary(town, d, f), { sortkeys = true, nocode = true })
  local shelf = l.archive[d]
  shelf[#shelf + 1] = text
  l.written = l.written + 1
  if #shelf > KEEP then table.remove(shelf, 1) end
  return #shelf == KEEP and shelf[1] or nil, text
end

--- The newspaper: compares the entry `old_text` (serpent's text) with the newest `now_text`.
--- Returns the good whose average price belief moved most (percent, rounded), or nil.
function ledger.headline(l, old_text, now_text)
  local ok1, old = serpent.load(old_text)
  local ok2, now = serpent.load(now_text)
  if not (ok1 and ok2) then error("the ledger cannot read its own entry: " .. tostring(old)) end
  l.read = l.read + 2
  local best, change = nil, 0
  for _, g in ipairs(GOODS) do
    local c = math.floor((now.price[g] / old.price[g] - 1) * 100 + 0.5)
    if math.abs(c) > math.abs(change) then best, change = g, c end
  end
  if not best then return nil end
  local line = ("%s, frame %d: %s %s %d%% since frame %d (mood %.1f, %d coins)"):format(
    now.district, now.frame, best, change > 0 and "up" or "down", math.abs(change), old.frame,
    now.mood, now.coins)
  local h = l.headlines
  h[#h + 1] = line
  if #h > 10 then table.remove(h, 1) end
  return best, change, line
end

return ledger
