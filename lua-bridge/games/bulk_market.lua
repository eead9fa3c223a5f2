-- Bulk Market: a trading economy with a large heap (about 20 MB): 60 towns, each with a
-- string-keyed market of goods, order books, price histories and ledgers. Traders move goods
-- between towns; prices follow supply and demand. Ledger lines are encoded with
-- string.byte/char, reports are built with string.rep and table.concat, order books are
-- sorted with and without comparators.
--
-- G.init(players, seed), G.step(inputs). No G.digest: the value digest is the checksum.
local G = {}

local TOWNS = 60
local GOODS = { "grain", "wood", "iron", "salt", "wool", "wine", "fish", "spice", "silk", "tea",
  "coal", "glass", "paper", "dye", "oil", "copper" }
local HISTORY = 1024
local TRADERS = 1500

local world

local function checksum(s)
  local c = 0
  for i = 1, #s do c = (c * 31 + s:byte(i)) & 0xffffffff end
  return c
end

local function encode(n)
  -- a compact base-64-ish encoding of a non-negative integer, the way save formats do it
  local out = {}
  repeat
    out[#out + 1] = string.char(48 + n % 64)
    n = n // 64
  until n == 0
  return table.concat(out)
end

local function new_town(i)
  local t = { id = i, name = string.format("Town%02d", i), market = {}, ledger = {}, report = "" }
  for gi, g in ipairs(GOODS) do
    local hist = {}
    local base = 5 + math.random() * 20 + gi
    for h = 1, HISTORY do hist[h] = base + math.sin(h / 9 + i) * 2 end
    t.market[g] = {
      stock = math.random(50, 500),
      price = base,
      history = hist,
      bids = {},
      asks = {},
    }
    for b = 1, 24 do
      t.market[g].bids[b] = { qty = math.random(1, 20), price = base * (0.8 + math.random() * 0.2), who = math.random(TRADERS) }
      t.market[g].asks[b] = { qty = math.random(1, 20), price = base * (1.0 + math.random() * 0.2), who = math.random(TRADERS) }
    end
  end
  -- a padded banner string, as a UI would keep
  t.banner = string.rep("=", 8) .. " " .. t.name .. " " .. string.rep("=", 8)
  return t
end

function G.init(players, seed)
  math.randomseed(seed)
  world = { tick = 0, towns = {}, traders = {}, players = {}, volume = 0, tax = 0 }
  for i = 1, TOWNS do world.towns[i] = new_town(i) end
  for i = 1, TRADERS do
    local cargo = {}
    for _ = 1, math.random(1, 4) do cargo[GOODS[math.random(#GOODS)]] = math.random(1, 30) end
    world.traders[i] = {
      id = i, town = math.random(TOWNS), dest = math.random(TOWNS), eta = math.random(1, 10),
      gold = math.random(100, 1000), cargo = cargo,
      journal = {},
    }
  end
  for p = 1, players do
    world.players[p] = { gold = 1000, town = p, holdings = {} }
  end
end

local function trade(t, trader, good, qty)
  local m = t.market[good]
  local cost = math.floor(m.price * qty + 0.5)
  if qty > 0 and trader.gold >= cost and m.stock >= qty then
    m.stock = m.stock - qty
    trader.gold = trader.gold - cost
    trader.cargo[good] = (trader.cargo[good] or 0) + qty
  elseif qty < 0 and (trader.cargo[good] or 0) >= -qty then
    m.stock = m.stock - qty
    trader.gold = trader.gold - cost
    trader.cargo[good] = trader.cargo[good] + qty
    if trader.cargo[good] == 0 then trader.cargo[good] = nil end
  else
    return false
  end
  world.volume = world.volume + math.abs(qty)
  local line = string.char(65 + t.id % 26) .. encode(trader.id) .. ":" .. good .. ":" .. encode(math.abs(cost))
  t.ledger[#t.ledger + 1] = line
  if #t.ledger > 200 then table.remove(t.ledger, 1) end
  return true
end

function G.step(inputs)
  world.tick = world.tick + 1
  local tick = world.tick
  -- players buy (bit 4) or sell (bit 5) the good picked by bits 0-3 in their town
  for i, input in ipairs(inputs) do
    local p = world.players[i]
    local good = GOODS[(input & 15) + 1]
    local holder = { id = 10000 + i, gold = p.gold, cargo = p.holdings }
    if input & 16 ~= 0 then trade(world.towns[p.town], holder, good, 5) end
    if input & 32 ~= 0 then trade(world.towns[p.town], holder, good, -5) end
    p.gold = holder.gold
    if tick % 30 == 0 then p.town = p.town % TOWNS + 1 end
  end
  -- a slice of traders arrives and trades each frame
  for k = 1, 150 do
    local tr = world.traders[(tick * 150 + k) % TRADERS + 1]
    tr.eta = tr.eta - 1
    if tr.eta <= 0 then
      tr.town = tr.dest
      tr.dest = math.random(TOWNS)
      tr.eta = math.random(3, 12)
      local t = world.towns[tr.town]
      -- sell everything the town pays well for, in name order
      local goods = {}
      for g in pairs(tr.cargo) do goods[#goods + 1] = g end
      table.sort(goods)
      for _, g in ipairs(goods) do
        if t.market[g].price > 12 then trade(t, tr, g, -tr.cargo[g]) end
      end
      local want = GOODS[math.random(#GOODS)]
      trade(t, tr, want, math.random(1, 10))
      tr.journal[#tr.journal % 16 + 1] = string.format("%s@%d:%.1f", t.name, tick, tr.gold)
    end
  end
  -- prices of one town per frame follow supply; order books are re-sorted
  local t = world.towns[tick % TOWNS + 1]
  for _, g in ipairs(GOODS) do
    local m = t.market[g]
    m.price = math.max(1.0, m.price * (1 + (250 - m.stock) / 25000))
    m.stock = m.stock + math.random(-3, 5)
    if m.stock < 0 then m.stock = 0 end
    table.remove(m.history, 1)
    m.history[#m.history + 1] = m.price
    table.sort(m.bids, function(a, b) return a.price > b.price end)
    table.sort(m.asks, function(a, b) return a.price < b.price end)
    local prices = {}
    for i = 1, 16 do prices[i] = math.floor(m.history[#m.history - i + 1] * 100) end
    table.sort(prices)
    m.median = prices[8]
  end
  -- every 20 frames the town writes its report: one line per good, name-sorted
  if tick % 20 == 0 then
    local names = {}
    for g in pairs(t.market) do names[#names + 1] = g end
    table.sort(names)
    local lines = { t.banner }
    for _, g in ipairs(names) do
      local m = t.market[g]
      lines[#lines + 1] = g .. string.rep(".", 10 - #g) .. string.format("%8.2f %5d", m.price, m.stock)
    end
    t.report = table.concat(lines, "\n")
    t.report_sum = checksum(t.report)
    world.tax = world.tax + #t.ledger // 10
  end
end

return G
