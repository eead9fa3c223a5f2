/*
** framecheck.h: the frame checks of a loaded coroutine (framecheck.c), for coload.c.
*/
#ifndef LUASNAP_FRAMECHECK_H
#define LUASNAP_FRAMECHECK_H

#include "lsint.h"

/* The function slot a frame's caller put the function in: for a function with hidden
** varargs (PF_VAHID), 'luaT_adjustvarargs' moved 'func' up past the arguments. */
static inline int ls_virtual_func(lua_State *co, const luasnap_ci *r) {
  const TValue *f = s2v(co->stack.p + r->func);
  if (!(r->callstatus & CIST_C) && ttisLclosure(f)) {
    const Proto *p = clLvalue(f)->p;
    if (p->flag & PF_VAHID) return r->func - (r->nextraargs + p->numparams + 1);
  }
  return r->func;
}

/* Checks every frame cis[0..nci) of the suspended coroutine co (its stack values in place,
** each frame's own fields checked by the caller) against the instruction or C function its
** caller is suspended in, and errfunc against the handlers the frames installed. memo: NULL or
** the load's (loadmemo.h). Returns NULL or a static message. */
const char *ls_check_call_sites(lua_State *co, const luasnap_ci *cis, int nci, int64_t errfunc,
                                const void *pcall_k, void *memo);

#endif
