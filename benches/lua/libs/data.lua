-- The document the library workloads encode, serialize and print: the Wikipedia example record
-- of json.lua's own benchmark (bench/bench_encode.lua), `n` times, with numbers that vary.
return function(n)
  local data = {}
  for i = 1, n do
    data[i] = {
      firstName = "John", lastName = "Smith", isAlive = i % 2 == 0, age = 20 + i % 50,
      height = 1.5 + (i % 40) / 100,
      address = {
        streetAddress = i .. " 2nd Street", city = "New York", state = "NY",
        postalCode = "10021-" .. (3100 + i % 900),
      },
      phoneNumbers = {
        { type = "home", number = "212 555-" .. (1000 + i % 9000) },
        { type = "office", number = "646 555-4567" },
      },
      children = {}, spouse = false,
      tags = { "a", "bb", "ccc", "dddd\n\"quoted\"" },
    }
  end
  return data
end
