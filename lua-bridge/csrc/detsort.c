/*
** table.sort for the deterministic profile: Lua 5.5.1's own quicksort (ltablib.c, MIT license,
** Copyright (C) 1994-2025 Lua.org, PUC-Rio), unchanged except for one macro: when a partition
** comes out badly imbalanced, stock Lua re-randomizes the pivot choice with luaL_makeseed
** (time and addresses), so the order of equal elements can differ between processes. Here the
** new "random" value is a hash of the interval itself (never 0): the same input and comparator
** give the same result in every process, while the defence against adversarial inputs stays.
** Everything else (a C function: comparators cannot yield; messages such as "invalid order
** function for sorting" and "array too big"; metamethod access through lua_geti/lua_seti) is
** stock behaviour.
*/
/* Lua's own ltablib.c, compiled a second time through the hook it provides for exactly this
** (l_randomizePivot): the one use is inside auxsort, where lo and up are in scope. Its
** luaopen_table is renamed so it does not clash with the library's; only sort is used. */
#define l_randomizePivot(L) \
  ((((unsigned)(lo) * 2654435761u) ^ ((unsigned)(up) * 40503u)) | 1u)
#define luaopen_table luasnap_detsort_luaopen_table_unused
#include "ltablib.c"
#undef luaopen_table

#include "luasnap.h"

/* table.sort(list [, comp]) with a deterministic pivot (see the top of this file). */
int luasnap_det_sort (lua_State *L) {
  return sort(L);
}

/* math.randomseed for the deterministic profile. With no argument, Lua 5.5's randomseed seeds
** from the clock and an address (luai_makeseed), which differs between runs and peers; here it
** is an error saying what to do. With arguments it is the library's own function (upvalue 1),
** called with the same arguments, so its results and the generator state are unchanged. */
int luasnap_det_randomseed (lua_State *L) {
  if (lua_isnone(L, 1))
    return luaL_error(L, "math.randomseed() without a seed reads the clock, which the "
                         "deterministic profile leaves out; pass a seed, e.g. the one G.init "
                         "gets: math.randomseed(seed)");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}
