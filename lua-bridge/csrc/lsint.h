/*
** lsint.h: what every helper file that reaches into Lua's internals shares (not Rust's business:
** the interface is luasnap.h). Lua's internal headers, the release they are written for, and a
** few accessors and limits mirrored from Lua's sources.
**
** Compiled against the internal headers of exactly the Lua release vendored in csrc/lua-5.5.1;
** the #if below refuses any other. LUASNAP-PATCHES.md there lists, for a Lua update, every
** function copied from Lua's libraries and every place that mirrors Lua's internals.
*/
#ifndef LUASNAP_LSINT_H
#define LUASNAP_LSINT_H

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lobject.h"
#include "lstate.h"
#include "lfunc.h"
#include "lgc.h"
#include "ldo.h"
#include "ltable.h"

#include "luasnap.h"

#if LUA_VERSION_RELEASE_NUM != 50501
#error "luasnap's helpers are built for Lua 5.5.1 exactly; update csrc/lua-5.5.1 and the helpers together (LUASNAP-PATCHES.md)"
#endif

#if defined(__GNUC__)
#define LS_NOINLINE __attribute__((noinline))
#define LS_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define LS_NOINLINE
#define LS_ALWAYS_INLINE inline
#endif

/* The largest stack Lua lets a thread have (ldo.c: luaD_growstack refuses more). */
#if defined(LUAI_MAXSTACK)
#define LS_MAXSTACK LUAI_MAXSTACK
#else
#define LS_MAXSTACK 1000000  /* ldo.c's default */
#endif

/* lfunc.c's MAXDELTA: the largest distance between two entries of a to-be-closed list; a
** delta of 0 marks a dummy entry that many slots above the previous one. */
#define LS_MAXDELTA USHRT_MAX

/* The value at the valid stack index idx (positive: from the frame's function; negative: from
** the top), as lapi.c's index2value has it for those two cases (no pseudo-indices). */
static inline const TValue *ls_index2value(lua_State *L, int idx) {
  return (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
}

/* The table at idx, or NULL if the value there is not a table. */
static inline Table *ls_table_at(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  return ttistable(o) ? hvalue(o) : NULL;
}

#endif
