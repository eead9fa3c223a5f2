#!/usr/bin/env bash
# The library workloads under luasnap and under stock Lua 5.5.1, as ratios luasnap / stock.
#   benches/lua/libs/compare.sh LUASNAP STOCK_LUA [time|instructions] [WORKLOAD ...]
# time: `farm-bench -n 5 --vs` (A = luasnap run, B = stock, alternating; the A/B user-time
# median); instructions: valgrind --tool=callgrind at a tenth of the default size (the
# arena reserves 4G there: valgrind refuses the default 1T reservation).
set -euo pipefail
luasnap=$(realpath "$1"); stock=$(realpath "$2"); how=${3:-time}; shift 3 || shift $#
cd "$(dirname "$0")"
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(json_rxi json_dkjson serpent_dump inspect_print tiny_ecs)
declare -A small=([json_rxi]=6 [json_dkjson]=6 [serpent_dump]=3 [inspect_print]=6 [tiny_ecs]=30)
irefs() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null \
  | sed -n 's/.*I *refs: *//p' | tr -d ,; }
echo "| workload | luasnap / stock |"
echo "|---|---|"
for w in "${workloads[@]}"; do
  if [ "$how" = instructions ]; then
    a=$(irefs "$luasnap" run --capacity 4G "$w.lua" "${small[$w]}")
    b=$(irefs "$stock" "$w.lua" "${small[$w]}")
    echo "| $w | $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f (%d / %d M)", a/b, a/1e6, b/1e6}') |"
  else
    r=$(farm-bench -n 5 --timeout 300 --vs "$stock $w.lua" -- "$luasnap" run "$w.lua" 2>&1 \
      | awk '/^A\/B user/{print $3}')
    echo "| $w | $r |"
  fi
done
