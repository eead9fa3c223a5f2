/*
** stephook.h: the host's instruction-budget hook, as the coroutine library passes it on
** (stephook.c holds it; corolib.c passes it).
*/
#ifndef LUASNAP_STEPHOOK_H
#define LUASNAP_STEPHOOK_H

#include "lsint.h"

/* The host's instruction-budget hook (the runtime's G.step budget), registered once by the
** host (luasnap_register_step_hook); NULL until then. Read with relaxed atomics: written once,
** before any Lua code runs under it. */
extern lua_Hook ls_step_hook;

/* A count hook belongs to one thread (lua_sethook), and a coroutine created before the host set
** it does not inherit it: so the resumer passes the budget hook on at each resume, with its own
** period (1 once the budget is spent, so the coroutine fails at its first instruction). A
** coroutine resumed by a thread without it drops a budget hook left from an earlier call, so
** the hook fields of every thread are a function of the calls that ran under the budget. A
** coroutine with another hook of its own (debug.sethook) keeps it. */
static inline void ls_pass_step_hook(lua_State *L, lua_State *co) {
  lua_Hook h = __atomic_load_n(&ls_step_hook, __ATOMIC_RELAXED);
  if (h == NULL) return;
  if (L->hook == h) {
    if (co->hook == NULL || co->hook == h)
      lua_sethook(co, h, LUA_MASKCOUNT, L->basehookcount);
  }
  else if (co->hook == h)
    lua_sethook(co, NULL, 0, 0);
}

#endif
