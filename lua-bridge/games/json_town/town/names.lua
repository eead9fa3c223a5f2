-- Townsfolk names from syllables (math.random, seeded in G.init).
local FIRST = { "Al", "Bren", "Cor", "Da", "El", "Fen", "Gil", "Har", "Is", "Jo", "Kel", "Lin",
  "Mor", "Ned", "Os", "Pell", "Quin", "Ros", "Sam", "Tib", "Ul", "Ves", "Wil", "Yar" }
local MID = { "a", "e", "i", "o", "u", "ar", "en", "or", "wy" }
local LAST = { "ric", "da", "ton", "wen", "mar", "beth", "ley", "dric", "mund", "ra", "win", "son" }

local names = {}

function names.person()
  return FIRST[math.random(#FIRST)] .. MID[math.random(#MID)] .. LAST[math.random(#LAST)]
end

names.districts = { "Millbrook", "Oakhollow", "Fishgate", "Tannery Row", "Old Quay", "Hilltop",
  "Smithy Lane", "Market Cross" }

return names
