/*
** proto.h: prototypes, as the other helper files share them (proto.c defines them).
*/
#ifndef LUASNAP_PROTO_H
#define LUASNAP_PROTO_H

#include "lsint.h"

/* A prototype's constants are those the compiler made, plus, once chunks.c has registered its
** chunk, one trailing full userdata: the anchor to the chunk's record (see chunks.c). A
** compiled constant is nil, a boolean, a number or a string, never a full userdata, so a
** trailing full-userdata constant is that anchor. */
static inline int luasnap_has_anchor(const Proto *p) {
  return p->sizek > 0 && ttisfulluserdata(&p->k[p->sizek - 1]);
}

/* The number of constants the compiler produced (the anchor excluded). */
static inline int luasnap_nconsts(const Proto *p) {
  return p->sizek - (luasnap_has_anchor(p) ? 1 : 0);
}

/* Pushes a new closure of prototype p with fresh (nil) upvalues, as lundump does. Raises on
** L (memory). Inline: the loader's build steps make a closure each (tbuild.c). */
static inline void ls_push_closure(lua_State *L, Proto *p) {
  LClosure *cl = luaF_newLclosure(L, p->sizeupvalues);
  setclLvalue2s(L, L->top.p, cl);
  L->top.p++;
  cl->p = p;
  luaC_objbarrier(L, cl, p);
  luaF_initupvals(L, cl);
}

#endif
