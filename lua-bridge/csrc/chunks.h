/*
** Shared between chunks.c and internals.c: how a prototype's anchor to its chunk record is
** recognized. See chunks.c for the design.
*/
#ifndef LUASNAP_CHUNKS_H
#define LUASNAP_CHUNKS_H

#include "lobject.h"

/* A compiled constant is nil, a boolean, a number or a string, never a full userdata; so a
** trailing full-userdata constant is the chunk record chunks.c appended. */
static inline int luasnap_has_anchor(const Proto *p) {
  return p->sizek > 0 && ttisfulluserdata(&p->k[p->sizek - 1]);
}

/* The number of constants the compiler produced (the anchor excluded). */
static inline int luasnap_nconsts(const Proto *p) {
  return p->sizek - (luasnap_has_anchor(p) ? 1 : 0);
}

#endif
