-- The benchmarks-game binary-trees: allocation-heavy, short-lived tables.
local function bottom_up(depth)
  if depth == 0 then return {} end
  depth = depth - 1
  return { bottom_up(depth), bottom_up(depth) }
end
local function check(tree)
  if tree[1] then return 1 + check(tree[1]) + check(tree[2]) end
  return 1
end
local N = ... or 14
local long_lived = bottom_up(N)
local total = 0
for d = 4, N, 2 do
  local iters = 1 << (N - d + 4)
  for _ = 1, iters do total = total + check(bottom_up(d)) end
end
return total + check(long_lived)
