-- The market hall: reads orders (json.lua's JSON, decoded here with dkjson), keeps an order
-- book per good, matches bids and asks, and answers with fills and expiries encoded by
-- dkjson with a fixed key order.
local dkjson = require("lib.dkjson")
local goods = require("town.goods")

local GOODS = goods.list
local TTL = 6 -- frames an order waits for a match
local FILL_KEYS = { "t", "good", "side", "qty", "price", "tax", "f" }

local market = {}

function market.new()
  local m = { books = {}, seq = 0, last = {}, volume = {}, fills = 0, expired = 0 }
  for _, g in ipairs(GOODS) do
    m.books[g] = { bids = {}, asks = {} }
    m.last[g] = goods.base[g]
    m.volume[g] = 0
  end
  return m
end

--- One order from the post, as JSON text.
function market.receive(m, body)
  local o, _, err = dkjson.decode(body)
  if not o then error("market got a bad order: " .. tostring(err)) end
  m.seq = m.seq + 1
  local book = m.books[o.good]
  local side = o.side == "buy" and book.bids or book.asks
  side[#side + 1] = { id = o.id, qty = o.qty, price = o.price, f = o.f, seq = m.seq, ward = o.ward }
end

-- total orders: best price first, then the earlier order
local function better_bid(a, b)
  if a.price ~= b.price then return a.price > b.price end
  return a.seq < b.seq
end
local function better_ask(a, b)
  if a.price ~= b.price then return a.price < b.price end
  return a.seq < b.seq
end

local function answer(reply, to, msg)
  reply(to, dkjson.encode(msg, { keyorder = FILL_KEYS }), "dk")
end

--- Matches every book at frame `f`. `tax(ward)` is the rate a ward's mayor charges on a
--- sale; `reply(to, body, "dk")` posts an answer; `collect(ward, amount)` credits the tax.
function market.match(m, f, tax, reply, collect)
  for _, g in ipairs(GOODS) do
    local book = m.books[g]
    local bids, asks = book.bids, book.asks
    table.sort(bids, better_bid)
    table.sort(asks, better_ask)
    local bi, ai = 1, 1
    while bids[bi] and asks[ai] and bids[bi].price >= asks[ai].price do
      local b, a = bids[bi], asks[ai]
      local qty = math.min(b.qty, a.qty)
      local price = math.floor((b.price + a.price) * 50 + 0.5) / 100
      local t = math.floor(qty * price * tax(a.ward) + 0.5)
      answer(reply, b.id, { t = "fill", good = g, side = "buy", qty = qty, price = price, tax = 0, f = f })
      answer(reply, a.id, { t = "fill", good = g, side = "sell", qty = qty, price = price, tax = t, f = f })
      collect(a.ward, t)
      m.last[g] = price
      m.volume[g] = m.volume[g] + qty
      m.fills = m.fills + 1
      b.qty, a.qty = b.qty - qty, a.qty - qty
      if b.qty == 0 then bi = bi + 1 end
      if a.qty == 0 then ai = ai + 1 end
    end
    -- keep what is left and young enough; tell the others their order lapsed
    for _, pair in ipairs({ { bids, bi, "buy" }, { asks, ai, "sell" } }) do
      local list, first, side = pair[1], pair[2], pair[3]
      local kept = {}
      for i = first, #list do
        local o = list[i]
        if f - o.f < TTL then kept[#kept + 1] = o
        else
          m.expired = m.expired + 1
          answer(reply, o.id, { t = "expired", good = g, side = side, qty = o.qty, price = o.price, tax = 0, f = f })
        end
      end
      if side == "buy" then book.bids = kept else book.asks = kept end
    end
  end
end

return market
