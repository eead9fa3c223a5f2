-- JSON Town: a market town whose 320 townsfolk (middleclass classes) trade through a market
-- hall by mail. Every message is JSON text: townsfolk write orders with json.lua, the market
-- reads them with dkjson and answers with dkjson, gossip goes either way; each side decodes
-- with the other library. One district's books a frame go into the ledger with serpent, the
-- newspaper reads old entries back (serpent.load) and prints the biggest price move; a few
-- townsfolk a frame are described with inspect for the debug log. The players are mayors.
--
-- G.init(players, seed), G.step(inputs) with inputs[p] in 0..31 (see town/mayor.lua),
-- G.digest() -> an integer.
local json = require("lib.json")
local dkjson = require("lib.dkjson")
local Agent = require("town.agent")
local goods = require("town.goods")
local names = require("town.names")
local post = require("town.post")
local market = require("town.market")
local ledger = require("town.ledger")
local crier = require("town.crier")
local mayor = require("town.mayor")
local hash = require("util.hash")

local G = {}

local DISTRICTS = 8
local PER_DISTRICT = 40
local TURN = 12      -- each townsperson acts every TURN frames
local DESCRIBED = 3   -- inspect strings a frame

local town

local function ward_of(d) return (d - 1) % town.players + 1 end

local function send(to, body, lib) post.send(town.post, to, body, lib) end

local function deliver(to, body, lib)
  if to == "market" then
    market.receive(town.market, body)
  elseif to > 1000 then
    mayor.read(town.mayors[to - 1000], json.decode(body))
  else
    local inbox = town.agents[to].inbox
    inbox[#inbox + 1] = { body = body, lib = lib }
  end
end

local function turn(a, f)
  a:read_mail()
  a:eat()
  a:work()
  a:spoil()
  local ward = ward_of(a.district)
  for _, o in ipairs(a:plan()) do
    o.t, o.id, o.ward, o.f = "order", a.id, ward, f
    send("market", json.encode(o), "rxi")
    a.orders = a.orders + 1
  end
  if (f // TURN + a.id) % 2 == 0 then
    local folk = town.by_district[a.district]
    local friend = folk[math.random(#folk)]
    local good = goods.list[math.random(#goods.list)]
    local msg = { t = "gossip", from = a.id, good = good, price = a.belief[good], mood = a.mood }
    if a.id % 2 == 0 then send(friend.id, dkjson.encode(msg), "dk")
    else send(friend.id, json.encode(msg), "rxi") end
  end
end

function G.init(players, seed)
  math.randomseed(seed)
  town = { players = players, frame = 0, agents = {}, by_district = {}, mayors = {},
    post = post.new(), market = market.new(), ledger = ledger.new(DISTRICTS), crier = crier.new() }
  for d = 1, DISTRICTS do town.by_district[d] = {} end
  for i = 1, DISTRICTS * PER_DISTRICT do
    local d = (i - 1) % DISTRICTS + 1
    local class = Agent.professions[math.random(#Agent.professions)]
    local a = class:new(i, d, names.person())
    town.agents[i] = a
    local folk = town.by_district[d]
    folk[#folk + 1] = a
  end
  for p = 1, players do town.mayors[p] = mayor.new(p) end
end

function G.step(inputs)
  local f = town.frame
  post.flush(town.post, deliver) -- yesterday's answers and news
  for p = 1, town.players do
    mayor.act(town.mayors[p], inputs[p] or 0, f, town, function(body, lib) send("market", body, lib) end)
  end
  local agents = town.agents
  for i = f % TURN + 1, #agents, TURN do turn(agents[i], f) end
  post.flush(town.post, deliver) -- orders to the market, gossip to inboxes
  market.match(town.market, f, function(ward) return town.mayors[ward].tax end, send,
    function(ward, amount) local m = town.mayors[ward]; m.treasury = m.treasury + amount end)
  -- the ledger and the newspaper
  local d = f % DISTRICTS + 1
  local old, now = ledger.write(town.ledger, town, d, f)
  if old then
    local good, change = ledger.headline(town.ledger, old, now)
    if good then
      local body = json.encode({ t = "news", good = good, change = change, f = f })
      -- posted to the townsfolk whose turn comes next (the others hear it as gossip)
      for _, a in ipairs(town.by_district[d]) do
        if a.id % TURN == (f + 1) % TURN then send(a.id, body, "rxi") end
      end
    end
  end
  for k = 1, DESCRIBED do
    crier.describe(town.crier, agents[(f * 37 + k * 101) % #agents + 1], f)
  end
  town.frame = f + 1
end

function G.digest()
  local h = hash.int(hash.SEED, town.frame)
  for _, a in ipairs(town.agents) do
    h = hash.int(h, a.coins)
    h = hash.num(h, a.mood)
    h = hash.int(h, a.hunger)
    for _, g in ipairs(goods.list) do
      h = hash.int(h, a.stock[g])
      h = hash.num(h, a.belief[g])
    end
    h = hash.int(h, #a.trades)
    h = hash.int(h, #a.inbox)
  end
  local m = town.market
  for _, g in ipairs(goods.list) do
    h = hash.num(h, m.last[g])
    h = hash.int(h, m.volume[g])
    h = hash.int(h, #m.books[g].bids)
    h = hash.int(h, #m.books[g].asks)
  end
  h = hash.int(hash.int(h, m.fills), m.expired)
  for _, my in ipairs(town.mayors) do
    h = hash.int(h, my.treasury)
    h = hash.num(h, my.tax)
    h = hash.int(hash.int(hash.int(h, my.festivals), my.works), my.subsidy)
  end
  local p = town.post
  h = hash.int(hash.int(h, p.sent), p.bytes)
  for _, line in ipairs(town.ledger.headlines) do h = hash.str(h, line) end
  for _, shelf in ipairs(town.ledger.archive) do
    for _, text in ipairs(shelf) do h = hash.str(h, text) end
  end
  for _, line in ipairs(town.crier.lines) do h = hash.str(h, line) end
  return h
end

return G
