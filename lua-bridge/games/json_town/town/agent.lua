-- Townsfolk: a middleclass hierarchy of professions. Each agent keeps its own beliefs about
-- prices, reads its mail (JSON, both libraries), eats, works and posts orders to the market.
local class = require("lib.middleclass")
local json = require("lib.json")
local dkjson = require("lib.dkjson")
local goods = require("town.goods")

local GOODS, BASE = goods.list, goods.base

local Agent = class("Agent")
Agent.keep = {}    -- units of a good an agent holds back from selling
Agent.inputs = {}  -- goods its work consumes, and how many it wants on hand

function Agent:initialize(id, district, name)
  self.id = id
  self.district = district
  self.name = name
  self.coins = 400 + math.random(0, 200)
  self.stock = {}
  self.belief = {}
  for _, g in ipairs(GOODS) do
    self.stock[g] = 0
    self.belief[g] = BASE[g] * (0.8 + 0.4 * math.random())
  end
  self.stock.bread = 2
  self.stock.tools = 1
  self.hunger = 0
  self.mood = 50
  self.trades = {}  -- the last few fills, newest last
  self.inbox = {}   -- raw JSON messages, read on the agent's next turn
  self.orders = 0
end

function Agent:profession() return self.class.name end

--- Adjusts belief in `good`'s price toward `price` with weight `w`.
function Agent:learn(good, price, w)
  local b = self.belief[good]
  local base = BASE[good]
  self.belief[good] = math.max(base * 0.2, math.min(base * 5, b + (price - b) * w))
end

local function remember(self, fill)
  local t = self.trades
  t[#t + 1] = { good = fill.good, qty = fill.qty, price = fill.price, side = fill.side, f = fill.f }
  if #t > 3 then table.remove(t, 1) end
end

--- Applies one message from the inbox. Fills and expiries come from the market (dkjson), gossip
--- from other agents (either library); this side decodes with json.lua or dkjson accordingly.
function Agent:read(raw, decoder)
  local msg = decoder(raw)
  local kind = msg.t
  if kind == "fill" then
    local cost = msg.qty * msg.price
    if msg.side == "buy" then
      self.stock[msg.good] = self.stock[msg.good] + msg.qty
      self.coins = self.coins - math.floor(cost + msg.tax + 0.5)
    else
      self.stock[msg.good] = math.max(0, self.stock[msg.good] - msg.qty)
      self.coins = self.coins + math.floor(cost - msg.tax + 0.5)
    end
    self:learn(msg.good, msg.price, 0.3)
    remember(self, msg)
  elseif kind == "expired" then
    -- nobody took it: buyers offer more next time, sellers ask less
    self:learn(msg.good, self.belief[msg.good] * (msg.side == "buy" and 1.08 or 0.93), 1)
  elseif kind == "gossip" then
    self:learn(msg.good, msg.price, 0.1)
    if msg.mood then self.mood = self.mood + (msg.mood - self.mood) * 0.05 end
  elseif kind == "news" then
    self:learn(msg.good, self.belief[msg.good] * (1 + msg.change / 400), 1)
  end
end

function Agent:read_mail()
  local inbox = self.inbox
  for i = 1, #inbox do
    local m = inbox[i]
    -- market mail is dkjson's; gossip says which library wrote it in its first byte
    if m.lib == "dk" then self:read(m.body, json.decode)
    else self:read(m.body, function(s) return (dkjson.decode(s)) end) end
  end
  self.inbox = {}
end

function Agent:eat()
  self.hunger = self.hunger + 1
  if self.hunger >= 3 then
    for _, food in ipairs(goods.eat_order) do
      local fills = goods.food[food]
      if self.stock[food] > 0 and self.hunger >= 3 then
        self.stock[food] = self.stock[food] - 1
        self.hunger = math.max(0, self.hunger - fills)
      end
    end
  end
  if self.hunger > 6 then self.mood = math.max(0, self.mood - 2)
  elseif self.hunger == 0 then self.mood = math.min(100, self.mood + 1) end
end

function Agent:work() end

--- Stores rot: a tenth of any pile over 20 (tools keep).
function Agent:spoil()
  for _, g in ipairs(GOODS) do
    local n = self.stock[g]
    if n > 20 and g ~= "tools" then self.stock[g] = n - n // 10 end
  end
end

--- The orders this agent wants to post this turn: { side, good, qty, price } tables.
function Agent:plan()
  local out = {}
  local food = self.stock.bread + self.stock.fish
  if food < 2 then
    local want = self.belief.bread <= self.belief.fish * 1.2 and "bread" or "fish"
    out[#out + 1] = { side = "buy", good = want, qty = 2, price = self.belief[want] * 1.05 }
  end
  for _, g in ipairs(GOODS) do
    local need = self.inputs[g]
    if need and self.stock[g] < need then
      out[#out + 1] = { side = "buy", good = g, qty = need - self.stock[g], price = self.belief[g] * 1.02 }
    end
    local keep = self.keep[g] or (need or 0)
    if (goods.food[g] and 2 or 0) > keep then keep = 2 end
    local surplus = self.stock[g] - keep
    if surplus > 0 then
      out[#out + 1] = { side = "sell", good = g, qty = math.min(surplus, 6), price = self.belief[g] * 0.98 }
    end
  end
  return out
end

-- ---------------------------------------------------------------- professions

local Farmer = class("Farmer", Agent)
function Farmer:work()
  local yield = self.stock.tools > 0 and 2 or 1
  self.stock.grain = self.stock.grain + yield
  if math.random(25) == 1 then self.stock.tools = math.max(0, self.stock.tools - 1) end
end
Farmer.inputs = { tools = 1 }

local Fisher = class("Fisher", Agent)
function Fisher:work()
  self.stock.fish = self.stock.fish + (math.random(3) == 1 and 3 or 1)
end

local Miller = class("Miller", Agent)
Miller.inputs = { grain = 4 }
function Miller:work()
  local n = math.min(self.stock.grain // 2, 2)
  self.stock.grain = self.stock.grain - 2 * n
  self.stock.flour = self.stock.flour + n
end

local Baker = class("Baker", Agent)
Baker.inputs = { flour = 2 }
Baker.keep = { bread = 3 }
function Baker:work()
  local n = math.min(self.stock.flour, 2)
  self.stock.flour = self.stock.flour - n
  self.stock.bread = self.stock.bread + 2 * n
end

local Woodcutter = class("Woodcutter", Agent)
Woodcutter.inputs = { tools = 1 }
function Woodcutter:work()
  self.stock.wood = self.stock.wood + (self.stock.tools > 0 and 3 or 1)
  if math.random(30) == 1 then self.stock.tools = math.max(0, self.stock.tools - 1) end
end

local Smith = class("Smith", Agent)
Smith.inputs = { wood = 4 }
Smith.keep = { tools = 0 }
function Smith:work()
  if self.stock.wood >= 2 then
    self.stock.wood = self.stock.wood - 2
    self.stock.tools = self.stock.tools + 1
  end
end

Agent.professions = { Farmer, Farmer, Farmer, Miller, Miller, Baker, Fisher, Fisher, Woodcutter, Smith }

return Agent
