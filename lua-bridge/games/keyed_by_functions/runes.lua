-- Runes are the standard library's own functions: a spell is a chain of them applied to the
-- caster's incantation (a word) and power (a number). The rune table is keyed by the library
-- functions themselves, and the names for the combat log come from the libraries' tables, the
-- way modding and debugging code usually finds a function's name.
local runes = {}

--- What each rune does to (word, power). Keys are C functions.
local effect = {
  [string.upper] = function(w, p) return string.upper(w), p + 2 end,
  [string.lower] = function(w, p) return string.lower(w), p + 1 end,
  [string.reverse] = function(w, p) return string.reverse(w), p * 1.25 end,
  [string.rep] = function(w, p) return string.rep(w, 2):sub(1, 16), p * 1.5 end,
  [string.len] = function(w, p) return w, p + #w end,
  [string.byte] = function(w, p) return w, p + string.byte(w, 1) % 9 end,
  [string.sub] = function(w, p) return w:sub(2) .. w:sub(1, 1), p + 1 end,
  [string.char] = function(w, p) return (w .. string.char(97 + math.floor(p) % 26)):sub(-16), p end,
  [math.floor] = function(w, p) return w, math.floor(p) end,
  [math.ceil] = function(w, p) return w, math.ceil(p) + 1 end,
  [math.sqrt] = function(w, p) return w, math.sqrt(p) * 4 end,
  [math.abs] = function(w, p) return w, math.abs(p) + 3 end,
  [math.log] = function(w, p) return w, math.log(p + 1) * 6 end,
  [math.max] = function(w, p) return w, math.max(p, #w * 2) end,
  [math.min] = function(w, p) return w, math.min(p * 2, 64) end,
  [math.fmod] = function(w, p) return w, math.fmod(p, 17) + 5 end,
}

--- Builds the rune book: rune -> { name =, apply = }, and the list of runes a player can study
--- (in the book's own order).
function runes.build()
  local names = {}
  for k, v in pairs(string) do names[v] = "string." .. k end
  for k, v in pairs(math) do
    if type(v) == "function" then names[v] = "math." .. k end
  end
  local book, list = {}, {}
  for fn, name in pairs(names) do
    if effect[fn] then
      book[fn] = { name = name, apply = effect[fn] }
      list[#list + 1] = fn
    end
  end
  return book, list, names
end

--- Caps a power at 999 and keeps it finite.
function runes.clamp(p)
  if p ~= p or p < 1 then return 1 end
  return math.min(p, 999)
end

return runes
