-- What the town trades, in a fixed order (everything that walks over goods uses this list,
-- never pairs() over a stock table).
local goods = {
  list = { "grain", "flour", "bread", "fish", "wood", "tools" },
  base = { grain = 4, flour = 9, bread = 14, fish = 11, wood = 6, tools = 40 },
  food = { bread = 3, fish = 2 }, -- hunger each unit takes away
  eat_order = { "bread", "fish" },
}
return goods
