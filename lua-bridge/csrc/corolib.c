/*
** The coroutine library's resume, wrap and close: copies of lcorolib.c's (Lua 5.5.1), changed
** only where marked "luasnap:" (LUASNAP-PATCHES.md lists each function with what differs):
**   - each settles the coroutine once it stops running (canonical.c: luasnap_settle_thread),
**     so its dead stack slots and C-call count do not depend on who resumed it;
**   - resume refuses, before touching the coroutine's stack, one that cannot run (dead by an
**     error, or one a load is building or holding), with the message lua_resume gives.
** Installed over the library's own by lua-bridge/src/bridge/canonical.rs.
*/
#include "lsint.h"
#include "lauxlib.h"

/* lcorolib.c: auxresume. */
static int ls_auxresume(lua_State *L, lua_State *co, int narg) {
  int status, nres;
  /* luasnap: checked here, before co's stack is touched: a coroutine dead by an error, or one a load is
  ** building or holding (luasnap_thread_building, luasnap_thread_hold: status LUA_ERRERR),
  ** cannot run. lua_resume would say the same ("cannot resume dead coroutine") but push the
  ** message on co's stack, whose top a held coroutine may have at its frame's limit (Lua's
  ** api_incr_top asserts against that). */
  if (l_unlikely(co->status != LUA_OK && co->status != LUA_YIELD)) {
    lua_pushliteral(L, "cannot resume dead coroutine");
    return -1;
  }
  if (l_unlikely(!lua_checkstack(co, narg))) {
    lua_pushliteral(L, "too many arguments to resume");
    return -1;
  }
  lua_xmove(L, co, narg);
  status = lua_resume(co, L, narg, &nres);
  if (l_likely(status == LUA_OK || status == LUA_YIELD)) {
    if (l_unlikely(!lua_checkstack(L, nres + 1))) {
      lua_pop(co, nres);
      luasnap_settle_thread(co);  /* luasnap */
      lua_pushliteral(L, "too many results to resume");
      return -1;
    }
    lua_xmove(co, L, nres);
    luasnap_settle_thread(co);  /* luasnap */
    return nres;
  } else {
    lua_xmove(co, L, 1);
    luasnap_settle_thread(co);  /* luasnap */
    return -1;
  }
}

/* lcorolib.c: getco. */
static lua_State *ls_getco(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co, 1, "thread");
  return co;
}

/* lcorolib.c: luaB_coresume. */
int luasnap_co_resume(lua_State *L) {
  lua_State *co = ls_getco(L);
  int r = ls_auxresume(L, co, lua_gettop(L) - 1);
  if (l_unlikely(r < 0)) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  } else {
    lua_pushboolean(L, 1);
    lua_insert(L, -(r + 1));
    return r + 1;
  }
}

/* lcorolib.c: luaB_auxwrap. */
static int ls_co_auxwrap(lua_State *L) {
  lua_State *co = lua_tothread(L, lua_upvalueindex(1));
  int r = ls_auxresume(L, co, lua_gettop(L));
  if (l_unlikely(r < 0)) {
    int stat = lua_status(co);
    if (stat != LUA_OK && stat != LUA_YIELD) {
      stat = lua_closethread(co, L);
      lua_assert(stat != LUA_OK);
      lua_xmove(co, L, 1);
      luasnap_settle_thread(co);  /* luasnap */
    }
    if (stat != LUA_ERRMEM && lua_type(L, -1) == LUA_TSTRING) {
      luaL_where(L, 1);
      lua_insert(L, -2);
      lua_concat(L, 2);
    }
    return lua_error(L);
  }
  return r;
}

/* lcorolib.c: luaB_cowrap, with luaB_cocreate inline. */
int luasnap_co_wrap(lua_State *L) {
  lua_State *NL;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  NL = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, NL, 1);
  lua_pushcclosure(L, ls_co_auxwrap, 1);
  return 1;
}

#define LS_COS_RUN 0
#define LS_COS_DEAD 1
#define LS_COS_YIELD 2
#define LS_COS_NORM 3

/* lcorolib.c: auxstatus. */
static int ls_auxstatus(lua_State *L, lua_State *co) {
  if (L == co) return LS_COS_RUN;
  switch (lua_status(co)) {
    case LUA_YIELD: return LS_COS_YIELD;
    case LUA_OK: {
      lua_Debug ar;
      if (lua_getstack(co, 0, &ar)) return LS_COS_NORM;
      else if (lua_gettop(co) == 0) return LS_COS_DEAD;
      else return LS_COS_YIELD;
    }
    default: return LS_COS_DEAD;
  }
}

/* lcorolib.c: luaB_close, with getoptco inline. */
int luasnap_co_close(lua_State *L) {
  lua_State *co = lua_isnone(L, 1) ? L : ls_getco(L);
  static const char *const statname[] = {"running", "dead", "suspended", "normal"};
  int status = ls_auxstatus(L, co);
  switch (status) {
    case LS_COS_DEAD: case LS_COS_YIELD: {
      status = lua_closethread(co, L);
      if (status == LUA_OK) {
        luasnap_settle_thread(co);  /* luasnap */
        lua_pushboolean(L, 1);
        return 1;
      } else {
        lua_pushboolean(L, 0);
        lua_xmove(co, L, 1);
        luasnap_settle_thread(co);  /* luasnap */
        return 2;
      }
    }
    case LS_COS_NORM:
      return luaL_error(L, "cannot close a %s coroutine", statname[status]);
    case LS_COS_RUN:
      lua_geti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
      if (lua_tothread(L, -1) == co) return luaL_error(L, "cannot close main thread");
      lua_closethread(co, L); /* closes itself: does not return */
      /* FALLTHROUGH */
    default:
      lua_assert(0);
      return 0;
  }
}
