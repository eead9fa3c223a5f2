-- The players: each is the mayor of a ward (every players-th district). Input bits: 1 raise
-- the market tax, 2 lower it (while held), 4 hold a festival, 8 commission public works (on
-- the press), 16 subsidise the ward's bakers while bread is dear (while held).
local json = require("lib.json")
local goods = require("town.goods")

local mayor = {}

function mayor.new(p)
  return { player = p, hall = 1000 + p, tax = 0.05, treasury = 1000, prev = 0, festivals = 0,
    works = 0, subsidy = 0, stock = { wood = 0, tools = 0 } }
end

--- Applies player input `input` at frame `f`. `send(body, lib)` posts an order to the market.
function mayor.act(m, input, f, town, send)
  local pressed = input & ~m.prev
  m.prev = input
  if input & 1 ~= 0 then m.tax = math.min(0.25, m.tax + 0.002) end
  if input & 2 ~= 0 then m.tax = math.max(0, m.tax - 0.002) end
  if pressed & 4 ~= 0 and m.treasury >= 300 then
    m.treasury = m.treasury - 300
    m.festivals = m.festivals + 1
    for d = m.player, #town.by_district, town.players do
      for _, a in ipairs(town.by_district[d]) do a.mood = math.min(100, a.mood + 3); a.coins = a.coins + 1 end
    end
  end
  if pressed & 8 ~= 0 and m.treasury >= 200 then
    m.works = m.works + 1
    for _, g in ipairs({ "wood", "tools" }) do
      local price = town.market.last[g] * 1.1
      send(json.encode({ t = "order", id = m.hall, ward = m.player, side = "buy", good = g,
        qty = g == "wood" and 10 or 2, price = price, f = f }), "rxi")
    end
  end
  if input & 16 ~= 0 and town.market.last.bread > goods.base.bread then
    -- two coins to every baker in the ward while the treasury lasts
    for d = m.player, #town.by_district, town.players do
      for _, a in ipairs(town.by_district[d]) do
        if a.class.name == "Baker" and m.treasury >= 2 then
          a.coins = a.coins + 2
          m.treasury = m.treasury - 2
          m.subsidy = m.subsidy + 2
        end
      end
    end
  end
end

--- A fill or expiry for the town hall (JSON from the market).
function mayor.read(m, msg)
  if msg.t == "fill" and msg.side == "buy" then
    m.stock[msg.good] = m.stock[msg.good] + msg.qty
    m.treasury = m.treasury - math.floor(msg.qty * msg.price + 0.5)
  end
end

return mayor
