-- Keyed by Functions: wizards defend a tower against a swarm of motes with spells made of the
-- standard library's functions (runes.lua). A wizard's charges are a table keyed by those
-- functions; casting uses the first charged rune the table yields, studying picks from the
-- rune list in the rune book's order, and a spell strikes the first mote the swarm set yields
-- in range. The game is deterministic given (players, seed, inputs) and the iteration order
-- of those tables, which pairs() takes from the keys' identities.
--
-- G.init(players, seed), G.step(inputs) with inputs[p] in 0..31 (bits 1-8: which rune to
-- study, on change; 16: cast while held), G.digest() -> an integer.
local runes = require("runes")
local motes = require("motes")

local G = {}

local SWARM = 2500      -- motes kept on the field
local RANGE = 90
local LOG = 16

local S

local function log(line)
  local l = S.log
  l[#l + 1] = line
  if #l > LOG then table.remove(l, 1) end
end

local function first_charged(w)
  for fn, n in pairs(w.charges) do
    if n > 0 then return fn end
  end
  return nil
end

local function cast(w)
  local fn = first_charged(w)
  if not fn then return end
  local rune = S.book[fn]
  w.charges[fn] = w.charges[fn] - 1
  local word, power = rune.apply(w.word, w.power)
  w.word, w.power = word, runes.clamp(power)
  w.casts = w.casts + 1
  local target = motes.first_near(S, w.x, w.y, RANGE + #w.word * 4)
  if target then
    target.hp = target.hp - math.floor(w.power / 4 + 1)
    if target.hp <= 0 then
      S.motes[target] = nil
      S.count = S.count - 1
      w.score = w.score + 10 + #target.glyph
      w.word = (w.word .. target.glyph):sub(-16)
    end
    log(("[%d] wizard %d casts %s: %q, power %.2f, at mote %d (hp %d)"):format(S.frame, w.id,
      rune.name, w.word, w.power, target.id, target.hp))
  else
    log(("[%d] wizard %d casts %s into the air"):format(S.frame, w.id, rune.name))
  end
end

local function study(w, index)
  local fn = S.runes[index % #S.runes + 1]
  if w.mana >= 5 then
    w.mana = w.mana - 5
    w.charges[fn] = (w.charges[fn] or 0) + 3
    w.studied = w.studied + 1
  end
end

function G.init(players, seed)
  math.randomseed(seed)
  local book, list, names = runes.build()
  S = { players = players, frame = 0, book = book, runes = list, motes = {}, count = 0,
    next_mote = 0, breaches = 0, wizards = {}, log = {}, rune_names = {} }
  -- the names, sorted once, for the digest
  for _, fn in ipairs(list) do S.rune_names[#S.rune_names + 1] = book[fn].name end
  table.sort(S.rune_names)
  S.by_name = {}
  for fn, r in pairs(book) do S.by_name[r.name] = fn end
  -- every wizard starts with a few charges of the first rune the library names
  local first
  for fn in pairs(names) do
    if book[fn] then first = fn; break end
  end
  for p = 1, players do
    local a = (p - 1) / players * 2 * math.pi
    S.wizards[p] = { id = p, x = motes.W / 2 + math.cos(a) * 40, y = motes.H / 2 + math.sin(a) * 40,
      word = "ember", power = 3, charges = { [first] = 5 }, mana = 20, score = 0, casts = 0,
      studied = 0, cooldown = 0, prev = 0 }
  end
  motes.spawn(S, SWARM)
end

function G.step(inputs)
  S.frame = S.frame + 1
  for p, w in ipairs(S.wizards) do
    local input = inputs[p] or 0
    if input & 15 ~= w.prev & 15 then study(w, input & 15) end
    w.prev = input
    if w.cooldown > 0 then w.cooldown = w.cooldown - 1 end
    if input & 16 ~= 0 and w.cooldown == 0 then
      cast(w)
      w.cooldown = 2
    end
    if S.frame % 10 == 0 then w.mana = math.min(50, w.mana + 1) end
  end
  motes.advance(S)
  if S.count < SWARM then motes.spawn(S, math.min(SWARM - S.count, 40)) end
end

local PRIME = 0x100000001b3
local function mix(h, v) return (h ~ v) * PRIME end
local function mix_str(h, s)
  for i = 1, #s do h = mix(h, s:byte(i)) end
  return mix(h, #s)
end

function G.digest()
  local h = mix(mix(mix(0xcbf29ce484222325, S.frame), S.breaches), S.count)
  h = mix(h, S.next_mote)
  for _, w in ipairs(S.wizards) do
    h = mix(mix(mix(mix(h, w.score), w.mana), w.casts), w.studied)
    h = mix(mix_str(h, w.word), math.floor(w.power * 1000))
    for _, name in ipairs(S.rune_names) do h = mix(h, w.charges[S.by_name[name]] or -1) end
  end
  -- the swarm is a set: combine its motes in an order-free way
  local swarm = 0
  for m in pairs(S.motes) do
    swarm = swarm + mix(mix(mix(mix(0, m.id), m.hp), math.floor(m.pos.x * 64)), math.floor(m.pos.y * 64))
  end
  h = mix(h, swarm)
  for _, line in ipairs(S.log) do h = mix_str(h, line) end
  return h
end

return G
