/*
** A suspended (or dead, or not started) coroutine, read for the save-game writer: its stack,
** its call frames as stack offsets (luasnap_ci), its open upvalues and its pending
** to-be-closed variables. Reads only.
**
** Invariant relied on throughout: the coroutine is not running while these read it (the
** writer persists a coroutine only when it is suspended, dead or not started; the main thread
** is idle), so its frames are the CallInfo list from base_ci to co->ci and its stack does not
** move meanwhile.
*/
#include "lsint.h"

/* Stack size (slots, including slot 0), number of frames above base_ci, whether any
** to-be-closed variable is pending, and errfunc as a slot offset. */
void luasnap_thread_info(lua_State *co, int *stacksize, int *nci, int *tbc, int64_t *errfunc) {
  CallInfo *ci;
  int n = 0;
  for (ci = co->base_ci.next; ci != NULL && ci != co->ci->next; ci = ci->next) n++;
  *stacksize = (int)(co->top.p - co->stack.p);
  *nci = n;
  *tbc = co->tbclist.p != co->stack.p;
  *errfunc = co->errfunc == 0 ? -1 : (int64_t)(co->errfunc / (ptrdiff_t)sizeof(StackValue));
}

/* Pushes slot i of co's stack onto L. */
void luasnap_thread_push_slot(lua_State *L, lua_State *co, int i) {
  setobj2s(L, L->top.p, s2v(co->stack.p + i));
  L->top.p++;
}

/* The frame ci of co as a record. */
static void thread_ci(lua_State *co, CallInfo *ci, luasnap_ci *out) {
  memset(out, 0, sizeof *out);
  out->func = (int32_t)(ci->func.p - co->stack.p);
  out->top = (int32_t)(ci->top.p - co->stack.p);
  out->callstatus = ci->callstatus;
  out->u2 = ci->u2.nres;
  if (isLua(ci)) {
    const Proto *p = clLvalue(s2v(ci->func.p))->p;
    out->pc = (int32_t)(ci->u.l.savedpc - p->code);
    out->nextraargs = (p->flag & PF_VAHID) ? ci->u.l.nextraargs : 0;
    out->old_errfunc = -1;
  } else {
    out->k = (const void *)ci->u.c.k;
    /* Only lua_pcallk sets old_errfunc (with CIST_YPCALL); in any other C frame (the one
    ** suspended in coroutine.yield) the field holds what an earlier frame left in this
    ** CallInfo, such as a Lua frame's savedpc: written as is, it made saves of one state
    ** differ with its history and put an arena address in the file. */
    out->old_errfunc = !(ci->callstatus & CIST_YPCALL) || ci->u.c.old_errfunc == 0
                           ? -1
                           : (int64_t)(ci->u.c.old_errfunc / (ptrdiff_t)sizeof(StackValue));
    out->ctx = (int64_t)ci->u.c.ctx;
  }
}

/* The first n frames above base_ci, in one walk (a function returning frame `level` walked
** to it: the writer's loop over the frames was quadratic in their number). */
void luasnap_thread_cis(lua_State *co, luasnap_ci *out, int n) {
  CallInfo *ci = co->base_ci.next;
  int i;
  for (i = 0; i < n && ci != NULL && ci != co->ci->next; i++, ci = ci->next)
    thread_ci(co, ci, &out[i]);
}

/* If upvalue n (1-based) of the Lua closure at idx is open, returns 1 and its thread and
** stack level. Threads are found through the collector's list of threads with open
** upvalues, plus the main thread. Invariant relied on: an open upvalue points into the stack
** of the thread whose list holds it, and every thread but the main one that has open
** upvalues is in g->twups (lfunc.c's newupval puts it there; the collector's remarkupvals
** takes a thread out only once it has none, or is garbage). */
int luasnap_upval_open(lua_State *L, int idx, int n, lua_State **owner, int *level) {
  const TValue *o = ls_index2value(L, idx);
  LClosure *cl;
  UpVal *uv;
  lua_State *th;
  global_State *g = G(L);
  if (!ttisLclosure(o)) return 0;
  cl = clLvalue(o);
  if (n < 1 || n > cl->nupvalues) return 0;
  uv = cl->upvals[n - 1];
  if (uv == NULL || !upisopen(uv)) return 0;
  th = mainthread(g);
  if (uplevel(uv) >= th->stack.p && uplevel(uv) < th->stack_last.p) {
    *owner = th; *level = (int)(uplevel(uv) - th->stack.p); return 1;
  }
  for (th = g->twups; th != NULL; th = (th->twups == th) ? NULL : th->twups) {
    if (uplevel(uv) >= th->stack.p && uplevel(uv) < th->stack_last.p) {
      *owner = th; *level = (int)(uplevel(uv) - th->stack.p); return 1;
    }
  }
  return 0;
}

/* The continuation of the frame above base_ci+level of co (for discovering pcall's). */
const void *luasnap_thread_k(lua_State *co, int level) {
  CallInfo *ci = co->base_ci.next;
  while (ci != NULL && level-- > 0) ci = ci->next;
  if (ci == NULL || isLua(ci)) return NULL;
  return (const void *)ci->u.c.k;
}

/* A coroutine's pending <close> variables are a list threaded through its stack (lfunc.c):
** L->tbclist.p is the newest; each entry's tbclist.delta is the distance to the previous one
** (0 marks a dummy node, for distances beyond LS_MAXDELTA); the list ends at L->stack.p.
** Saves record the entries as stack offsets; loads rebuild the list as luaF_newtbcupval does
** (coload.c). */

/* Stores up to `max` stack offsets of co's pending to-be-closed variables in `out`, oldest
** first; returns how many there are (all of them, even beyond max). */
int luasnap_thread_tbc(lua_State *co, int32_t *out, int max) {
  int n = 0, i;
  StkId t = co->tbclist.p;
  while (t > co->stack.p) {
    if (t->tbclist.delta == 0) {  /* a dummy node */
      t -= LS_MAXDELTA;
      continue;
    }
    if (n < max) out[n] = (int32_t)(t - co->stack.p);
    n++;
    t -= t->tbclist.delta;
  }
  /* Newest first so far: reverse what was stored. */
  for (i = 0; i < (n < max ? n : max) / 2; i++) {
    int m = (n < max ? n : max);
    int32_t x = out[i];
    out[i] = out[m - 1 - i];
    out[m - 1 - i] = x;
  }
  return n;
}

/* Stores co's frames (CallInfo pointers, the first above base_ci first) in out (at most max);
** returns their number. For luasnap_open_upval_check, while co cannot run. */
int luasnap_thread_frames(lua_State *co, const void **out, int max) {
  CallInfo *ci;
  int n = 0;
  for (ci = co->base_ci.next; ci != NULL && ci != co->ci->next; ci = ci->next) {
    if (n < max) out[n] = ci;
    n++;
  }
  return n;
}
