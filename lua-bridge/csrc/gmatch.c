/*
** string.gmatch's iterator state read as positions in its subject, for the value digest: the
** state (lstrlib.c's GMatchState, private to it and mirrored below) holds raw pointers into
** the subject and the pattern, so hashing its bytes hashed addresses, and two processes (a
** server and its client, a game and its continuation) disagreed while a game held one.
*/
#include "lsint.h"
#include "lauxlib.h"

/* Mirrors lstrlib.c's MatchState and GMatchState (Lua 5.5.1, lsint.h checks the release). */
#if !defined(LUA_MAXCAPTURES)
#define LUA_MAXCAPTURES 32
#endif

typedef struct LsMatchState {
  const char *src_init;
  const char *src_end;
  const char *p_end;
  lua_State *L;
  int matchdepth;
  int level;
  struct {
    const char *init;
    ptrdiff_t len;
  } capture[LUA_MAXCAPTURES];
} LsMatchState;

typedef struct LsGMatchState {
  const char *src;
  const char *p;
  const char *lastmatch;
  LsMatchState ms;
} LsGMatchState;

/* Whether `q` lies in [lo, hi]. */
static int ls_within(const char *q, const char *lo, const char *hi) {
  return (uintptr_t)q >= (uintptr_t)lo && (uintptr_t)q <= (uintptr_t)hi;
}

/* The positions of the gmatch iterator at `idx` (a C closure of string.gmatch's helper: the
** caller checked its function): out[0] the next search's start, out[1] the end of the last
** match or -1, both as offsets into the subject. The rest of the state is the subject and the
** pattern themselves (upvalues 1 and 2, hashed as values), the lua_State of the last call and
** scratch each call rewrites before reading (reprepstate: level, matchdepth; the captures).
** Returns 0, reading nothing, unless the upvalues are as gmatch makes them; the invariant
** checked: upvalue 3 is a full userdata of exactly GMatchState's size whose pointers lie in
** the subject (src in [s, s + len + 1], gmatch's own clamp; lastmatch NULL or in [s, s + len])
** and the pattern (p its start, p_end its end), src_init and src_end the subject's bounds.
** `out` holds two values. Two free stack slots; pushes nothing in the end. */
int luasnap_gmatch_positions(lua_State *L, int idx, int64_t *out) {
  const char *s, *p;
  size_t ls = 0, lp = 0;
  const LsGMatchState *gm;
  int ok;
  idx = lua_absindex(L, idx);
  if (lua_getupvalue(L, idx, 1) == NULL) return 0;
  if (lua_getupvalue(L, idx, 2) == NULL) { lua_pop(L, 1); return 0; }
  if (lua_getupvalue(L, idx, 3) == NULL) { lua_pop(L, 2); return 0; }
  ok = lua_type(L, -3) == LUA_TSTRING && lua_type(L, -2) == LUA_TSTRING
       && lua_type(L, -1) == LUA_TUSERDATA && lua_rawlen(L, -1) == sizeof(LsGMatchState);
  if (ok) {
    s = lua_tolstring(L, -3, &ls);
    p = lua_tolstring(L, -2, &lp);
    gm = (const LsGMatchState *)lua_touserdata(L, -1);
    ok = gm->ms.src_init == s && gm->ms.src_end == s + ls && gm->p == p
         && gm->ms.p_end == p + lp && ls_within(gm->src, s, s + ls + 1)
         && (gm->lastmatch == NULL || ls_within(gm->lastmatch, s, s + ls));
    if (ok) {
      out[0] = (int64_t)(gm->src - s);
      out[1] = gm->lastmatch == NULL ? -1 : (int64_t)(gm->lastmatch - s);
    }
  }
  lua_pop(L, 3);
  return ok;
}
