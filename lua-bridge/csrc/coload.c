/*
** Building a loaded coroutine: its stack values one by one, its open upvalues, then its frames
** (checked against the instructions they are suspended at: framecheck.c) and its pending
** to-be-closed variables; marks that keep it from running while the load builds and checks it.
**
** Building without raising on the coroutine. A coroutine the loader builds has no error handler
** of its own: an error raised with L = co (luaL_checkstack on co, a memory error while
** allocating through co) finds co->errorJmp NULL, and luaD_throw then resets co and rethrows on
** the *main thread's* handler, past the load's protected call when the load itself runs inside
** a coroutine (the collector stays stopped, the load's marks stay set). Invariant kept by the
** helpers below: nothing they do on co raises on co. They grow co's stack with
** luaD_reallocstack(co, n, 0) (reports failure, never raises) and allocate objects through the
** loading thread L, whose errors the load's protected call catches (luaC_newobj only uses L to
** reach the global state and to raise).
*/
#include "framecheck.h"
#include "lopcodes.h"
#include "ltm.h"

/* Makes slots [0, upto] of co's stack exist (nil from its top up), so its top is at least
** upto + 1. Returns 0, or -1 if that is larger than Lua lets a stack grow (LUAI_MAXSTACK:
** a file cannot hold such a coroutine, luaD_growstack refuses one); raises a memory error
** on L, never on co. */
static int ls_extend(lua_State *L, lua_State *co, int upto) {
  int used = (int)(co->top.p - co->stack.p);
  if (upto < used) return 0;
  if (upto + 1 > LS_MAXSTACK) return -1;
  if (upto + 1 > stacksize(co)) {
    int newsize = stacksize(co) + (stacksize(co) >> 1);
    if (newsize > LS_MAXSTACK) newsize = LS_MAXSTACK;
    if (newsize < upto + 1) newsize = upto + 1;
    if (!luaD_reallocstack(co, newsize, 0)) luaD_throw(L, LUA_ERRMEM);
  }
  for (; used <= upto; used++) setnilvalue(s2v(co->stack.p + used));
  co->top.p = co->stack.p + upto + 1;
  /* As lua_checkstack: the (base) frame's top covers the slots in use. */
  if (co->ci->top.p < co->top.p) co->ci->top.p = co->top.p;
  return 0;
}

/* Pops the value on top of L into slot i (>= 1) of the coroutine co, extending co's stack to
** it if needed. Returns 0, or -1 if slot i is beyond the largest stack Lua allows. Raises a
** memory error on L, never on co. */
int luasnap_thread_put(lua_State *L, lua_State *co, int i) {
  if (i < 1 || ls_extend(L, co, i) != 0) return -1;
  setobj2s(co, co->stack.p + i, s2v(L->top.p - 1));
  L->top.p--;
  return 0;
}

/* Makes upvalue n of the Lua closure at idx the (open) upvalue of co's stack slot `level`,
** extending co's stack (nil) to that slot if its values have not all arrived yet (the loader
** bounds level by the stack size the file declares, and checks the upvalue against co's
** frames: luasnap_open_upval_check). The loader keeps co's open upvalues by level, each as a
** closure joined to it, so a file listing them in any order costs O(log n) each, not a walk
** down co's list: upvalue an of the Lua closure at aidx (aidx 0: none) is the open upvalue of
** co with the lowest level above `level`. Returns the upvalue, or NULL if the arguments are
** invalid (that one included: it must be open in co above level with nothing in between;
** taking it from a live closure keeps it alive even if Lua code swapped it out meanwhile).
** Raises a memory error on L, never on co. */
void *luasnap_upval_join_at(lua_State *L, int idx, int n, lua_State *co, int level, int aidx,
                            int an) {
  const TValue *o = ls_index2value(L, idx);
  LClosure *cl;
  UpVal *uv, *up = NULL, **pp, *next;
  GCObject *g;
  StkId at;
  if (aidx != 0) {
    const TValue *ao = ls_index2value(L, aidx);
    if (!ttisLclosure(ao) || an < 1 || an > clLvalue(ao)->nupvalues) return NULL;
    up = clLvalue(ao)->upvals[an - 1];
    if (up == NULL) return NULL;
  }
  if (!ttisLclosure(o)) return NULL;
  cl = clLvalue(o);
  if (n < 1 || n > cl->nupvalues || level < 1 || ls_extend(L, co, level) != 0) return NULL;
  at = co->stack.p + level;
  if (up != NULL && (!upisopen(up) || uplevel(up) <= at || uplevel(up) >= co->top.p))
    return NULL;
  pp = up == NULL ? &co->openupval : &up->u.open.next;
  next = *pp;
  /* Invariant checked: the list stays sorted by decreasing level (luaF_findupval's search
  ** and luaF_closeupval rely on it). */
  if (next != NULL && uplevel(next) > at) return NULL;
  if (next != NULL && uplevel(next) == at) {
    uv = next;
  } else {
    g = luaC_newobj(L, LUA_VUPVAL, sizeof(UpVal));
    uv = gco2upv(g);
    /* No collection ran meanwhile (emergency ones neither move stacks nor touch open
    ** upvalues), so pp and next still hold. */
    uv->v.p = s2v(co->stack.p + level);
    uv->u.open.next = next;
    uv->u.open.previous = pp;
    if (next) next->u.open.previous = &uv->u.open.next;
    *pp = uv;
    if (!isintwups(co)) {  /* as newupval: co joins the threads with open upvalues */
      co->twups = G(co)->twups;
      G(co)->twups = co;
    }
  }
  cl->upvals[n - 1] = uv;
  luaC_objbarrier(L, cl, uv);
  return uv;
}

/* The Lua closure in stack slot `slot` of co (counted from its stack's base, as a frame
** record's func), or NULL if that slot is outside its values or holds something else. */
const void *luasnap_thread_slot_lclosure(lua_State *co, int slot) {
  const TValue *o;
  if (slot < 0 || slot >= cast_int(co->top.p - co->stack.p)) return NULL;
  o = s2v(co->stack.p + slot);
  return ttisLclosure(o) ? (const void *)clLvalue(o) : NULL;
}

/* Whether upvalue n of the Lua closure at idx may be shared by reference (lua_upvaluejoin,
** LS_JOINUPVAL): 1 if it exists and is closed, 0 if it is open (in any thread's stack: a
** loaded closure that shared it would reach that stack slot without the checks of
** luasnap_open_upval_check; saves name an open upvalue by its coroutine and slot, never by
** reference) or absent. */
int luasnap_upval_shareable(lua_State *L, int idx, int n) {
  const TValue *o = ls_index2value(L, idx);
  const LClosure *cl;
  if (!ttisLclosure(o)) return 0;
  cl = clLvalue(o);
  if (n < 1 || n > cl->nupvalues || cl->upvals[n - 1] == NULL) return 0;
  return !upisopen(cl->upvals[n - 1]);
}

/* Whether a Lua frame can be suspended just after op (its savedpc one past it). Invariant
** checked: these are exactly the instructions luaV_finishOp (lvm.c) knows how to finish after
** a yield: its cases, and those its default case asserts ("only these other opcodes can
** yield"); any other instruction never leaves luaV_execute mid-way. */
static int yieldable_op(OpCode op) {
  switch (op) {
    case OP_CALL: case OP_TAILCALL: case OP_TFORCALL:
    case OP_MMBIN: case OP_MMBINI: case OP_MMBINK:
    case OP_UNM: case OP_BNOT: case OP_LEN:
    case OP_GETTABUP: case OP_GETTABLE: case OP_GETI: case OP_GETFIELD: case OP_SELF:
    case OP_SETTABUP: case OP_SETTABLE: case OP_SETI: case OP_SETFIELD:
    case OP_LT: case OP_LE: case OP_LTI: case OP_LEI: case OP_GTI: case OP_GEI: case OP_EQ:
    case OP_CONCAT:
    case OP_CLOSE: case OP_RETURN:  /* a __close metamethod (checked by the call sites) */
      return 1;
    default:
      return 0;
  }
}

/* Rebuilds the frames of a suspended coroutine whose stack values are already in place
** (co->top = stack + stacksize). Every frame is checked against the invariants 'resume',
** 'unroll', 'finishCcall' and 'luaV_finishOp' rely on; `known_k` lists the continuation
** functions allowed (the permanents), `pcall_k` the one of pcall/xpcall; `memo` NULL or the
** load's memo (see ls_upmemo: per-prototype indexes for the frame checks). Returns NULL on
** success or a static message. */
const char *luasnap_thread_restore(lua_State *L, lua_State *co, const luasnap_ci *cis, int nci,
                                   int64_t errfunc, const void *const *known_k, int nknown,
                                   const void *pcall_k, void *memo) {
  int stacksize = (int)(co->top.p - co->stack.p);
  int i, prev_func = 0;
  /* No CIST_RECST: a nonzero recovery status only exists while an error unwinds through
  ** to-be-closed variables, and coroutines with those pending are not persisted. */
  const uint32_t allowed = CIST_NRESULTS | CIST_C | CIST_FRESH | CIST_YPCALL | CIST_TAIL | CIST_OAH
                         | (0xfu << CIST_CCMT);
  int need = 0;
  (void)L;
  if (nci < 1) return "a suspended coroutine has no frames";
  if (nci > 100000) return "too many frames";
  if (co->ci != &co->base_ci || co->status != LUA_OK) return "internal: thread not fresh";
  for (i = 0; i < nci; i++) {
    if (cis[i].top < 0 || cis[i].top > stacksize + 100000) return "frame top too high";
    if (cis[i].top > need) need = cis[i].top;
  }
  /* Invariant checked: no stack grows past LUAI_MAXSTACK (luaD_growstack), so no frame's top
  ** is beyond it (a larger stack reads to luaD_growstack as one handling an overflow). */
  if (need > LS_MAXSTACK) return "frames above the largest stack Lua allows";
  for (i = 0; i < nci; i++) {
    const luasnap_ci *r = &cis[i];
    const TValue *f;
    int last = (i == nci - 1);
    int wanted = get_nresults(r->callstatus);  /* results its caller expects; -1: all */
    int vf;
    if (r->func <= prev_func || r->func >= stacksize) return "frame function outside the stack";
    if (r->callstatus & ~allowed) return "unsupported frame flags";
    /* Returning moves 'wanted' results to the frame's function slot: they must land inside
    ** the caller's frame (plus the slack metamethod calls use) and the stack. */
    f = s2v(co->stack.p + r->func);
    /* Returning moves 'wanted' results to the slot the caller put the function in. */
    vf = (!(r->callstatus & CIST_C) && ttisLclosure(f)) ? ls_virtual_func(co, r) : r->func;
    if (wanted > 0 && (vf + wanted > need + EXTRA_STACK
                       || (i > 0 && vf + wanted > cis[i - 1].top + EXTRA_STACK)))
      return "a frame expects more results than its caller has room for";
    if (i > 0 && vf > cis[i - 1].top + EXTRA_STACK) return "a frame outside its caller's";
    if (!(r->callstatus & CIST_C)) {
      const Proto *p;
      if (!ttisLclosure(f)) return "a Lua frame whose function is not a Lua closure";
      p = clLvalue(f)->p;
      if (r->top != r->func + 1 + p->maxstacksize) return "a Lua frame of the wrong size";
      if (r->pc < 1 || r->pc > p->sizecode) return "a Lua frame resumes outside its code";
      if (!yieldable_op(GET_OPCODE(p->code[r->pc - 1]))) return "a Lua frame resumes after an instruction that cannot yield";
      /* 'nextraargs' is meaningful (and set) only for vararg functions; returning moves the
      ** function slot down by it plus the fixed parameters, back into the caller's frame. */
      if ((p->flag & PF_VAHID) && (r->nextraargs < 0
                          || r->func - r->nextraargs - (p->numparams + 1) <= prev_func))
        return "bad vararg count";
      /* A Lua frame that was not entered by a fresh luaV_execute returns by going on with the
      ** previous frame in the same loop: that one must be a Lua frame. */
      if (!(r->callstatus & CIST_FRESH) && (i == 0 || (cis[i - 1].callstatus & CIST_C)))
        return "a Lua frame returns into a frame that did not call it";
      if (last) return "a coroutine can only be suspended in a C function (coroutine.yield)";
    } else {
      int j, known = (r->k == NULL);
      if (!ttisfunction(f) || ttisLclosure(f)) return "a C frame whose function is not a C function";
      if (r->top < r->func + 1) return "a C frame of the wrong size";
      for (j = 0; j < nknown && !known; j++) known = (known_k[j] == r->k);
      if (!known) return "a C frame with an unknown continuation";
      if (!last && r->k == NULL) return "an interrupted C frame without a continuation";
      if (r->callstatus & CIST_YPCALL) {
        if (r->k != pcall_k || (r->ctx != 0 && r->ctx != 2)) return "a protected call frame that is not pcall/xpcall";
        if (r->old_errfunc < -1 || r->old_errfunc >= r->func) return "bad saved error handler";
      }
      if (r->callstatus & CIST_YPCALL) {
        /* 'finishpcallk' restores the called function's slot from u2 (a byte offset). */
        int32_t sz = (int32_t)sizeof(StackValue);
        if (r->u2 < 0 || r->u2 % sz != 0 || r->u2 / sz <= r->func || r->u2 / sz >= stacksize)
          return "bad protected-call function slot";
      }
    }
    prev_func = r->func;
  }
  if (errfunc < -1 || errfunc >= stacksize) return "bad error handler";
  {
    /* Each frame against the instruction or C function its caller is suspended in. */
    const char *bad = ls_check_call_sites(co, cis, nci, errfunc, pcall_k, memo);
    if (bad != NULL) return bad;
  }
  /* Make room for the highest frame top. */
  {
    if (need + EXTRA_STACK > stacksize(co)) {
      int newsize = need + EXTRA_STACK > LS_MAXSTACK ? LS_MAXSTACK : need + EXTRA_STACK;
      if (!luaD_reallocstack(co, newsize, 0)) return "not enough memory for the coroutine's stack";
    }
    for (i = stacksize; i < need; i++) setnilvalue(s2v(co->stack.p + i));
  }
  for (i = 0; i < nci; i++) {
    const luasnap_ci *r = &cis[i];
    CallInfo *ci = luaE_extendCI(co, 0);
    if (ci == NULL) return "not enough memory for the coroutine's frames";
    co->ci = ci;
    ci->func.p = co->stack.p + r->func;
    ci->top.p = co->stack.p + r->top;
    ci->callstatus = r->callstatus;
    ci->u2.nres = r->u2;
    if (!(r->callstatus & CIST_C)) {
      ci->u.l.savedpc = clLvalue(s2v(ci->func.p))->p->code + r->pc;
      ci->u.l.trap = 0;
      ci->u.l.nextraargs = (clLvalue(s2v(ci->func.p))->p->flag & PF_VAHID) ? r->nextraargs : 0;
    } else {
      ci->u.c.k = (lua_KFunction)r->k;
      ci->u.c.old_errfunc = r->old_errfunc < 0 ? 0 : (ptrdiff_t)r->old_errfunc * (ptrdiff_t)sizeof(StackValue);
      ci->u.c.ctx = (lua_KContext)r->ctx;
    }
  }
  co->errfunc = errfunc < 0 ? 0 : (ptrdiff_t)errfunc * (ptrdiff_t)sizeof(StackValue);
  co->status = LUA_YIELD;
  return NULL;
}

/* Marks (on != 0) a coroutine the loader is still building (its stack values arrive one by
** one, interleaved with Lua code the load runs, such as rebuild functions; its frames and
** open upvalues are checked when it is complete), or ends the mark. Invariant kept: nothing
** resumes it meanwhile: lua_resume refuses every status but LUA_OK and LUA_YIELD ("cannot
** resume dead coroutine"). Ending it returns -1 if Lua code reset the coroutine meanwhile
** (coroutine.close or a coroutine.wrap call, through luaE_resetthread), else 0. */
int luasnap_thread_building(lua_State *co, int on) {
  if (on) {
    co->status = LUA_ERRERR;
    return 0;
  }
  if (co->status != LUA_ERRERR || co->ci != &co->base_ci) return -1;
  co->status = LUA_OK;
  return 0;
}

/* Holds (on != 0) a suspended coroutine whose frames the loader restored, or releases it
** (on == 0) when the load ends. Held, it cannot run (status LUA_ERRERR, as while building),
** so its frames stay those the loader checked and indexed (luasnap_thread_frames) while the
** load runs Lua code (rebuild functions) and joins later closures' open upvalues into it.
** Releasing returns -1 if Lua code reset the coroutine meanwhile (luaE_resetthread: status
** LUA_OK, frames gone; a reset coroutine cannot run again), else makes it suspended
** (LUA_YIELD) and returns 0. */
int luasnap_thread_hold(lua_State *co, int on) {
  if (on) {
    co->status = LUA_ERRERR;
    return 0;
  }
  if (co->status != LUA_ERRERR || co->ci == &co->base_ci) return -1;
  co->status = LUA_YIELD;
  return 0;
}

/* Whether register r of the Lua frame ci may be a pending to-be-closed variable where the
** frame is suspended (the instruction before savedpc), as lparser.c makes them:
**   - the frame is suspended in a __close call of OP_CLOSE A with r >= A, or of a return that
**     closes (OP_RETURN k): finishOp repeats the instruction, which closes every entry at or
**     above A (the frame's base for a return) before anything else runs;
**   - or r is a local variable in scope there (the debug information's locvars, as
**     luaF_getlocalname counts them: the n-th local in scope is register n - 1) whose first
**     instruction marks it to be closed: OP_TBC r (localstat: adjustlocalvars, then
**     checktoclose) or OP_TFORPREP r - 2 (forlist: the closing variable of a generic for).
**     Locals leave scope (endpc) at the OP_CLOSE of their block, which pops them.
** A function without debug information (a stripped binary chunk) has no such record: its
** frames cannot have pending to-be-closed variables restored. */
static int tbc_in_scope(CallInfo *ci, int r) {
  const Proto *p = clLvalue(s2v(ci->func.p))->p;
  int pc = (int)(ci->u.l.savedpc - p->code) - 1;  /* restored: 0 <= pc < sizecode */
  Instruction ins = p->code[pc];
  int i, n = r + 1;
  if (GET_OPCODE(ins) == OP_CLOSE && r >= GETARG_A(ins)) return 1;
  if (GET_OPCODE(ins) == OP_RETURN && TESTARG_k(ins)) return 1;
  for (i = 0; i < p->sizelocvars && p->locvars[i].startpc <= pc; i++) {
    if (pc < p->locvars[i].endpc && --n == 0) {
      int start = p->locvars[i].startpc;
      Instruction mark;
      if (start < 0 || start >= p->sizecode) return 0;
      mark = p->code[start];
      return (GET_OPCODE(mark) == OP_TBC && GETARG_A(mark) == r)
          || (GET_OPCODE(mark) == OP_TFORPREP && GETARG_A(mark) + 2 == r);
    }
  }
  return 0;
}

/* Rebuilds the to-be-closed list of a coroutine restored by luasnap_thread_restore (frames in
** place, list empty) from `n` stack offsets, oldest first. Returns NULL, or why the offsets
** are refused (nothing changed then). */
const char *luasnap_thread_set_tbc(lua_State *co, const int32_t *slots, int n) {
  int i;
  int32_t prev = 0;
  /* Invariant checked: a fresh list (the restore left it empty). */
  if (co->tbclist.p != co->stack.p) return "internal: to-be-closed list not empty";
  for (i = 0; i < n; i++) {
    StkId level;
    CallInfo *ci;
    int inframe = 0;
    /* Invariant checked: strictly ascending, above the list's end, below the stack top
    ** (luaF_newtbcupval asserts level > L->tbclist.p). */
    if (slots[i] <= prev || slots[i] >= (int32_t)(co->top.p - co->stack.p))
      return "to-be-closed variables out of order or outside the stack";
    prev = slots[i];
    level = co->stack.p + slots[i];
    /* Invariant checked: a register of a Lua frame (a local variable), as OP_TBC makes
    ** them, so closing it calls __close where the frame's locals are. */
    for (ci = co->ci; ci != &co->base_ci; ci = ci->previous)
      if (isLua(ci) && level > ci->func.p && level < ci->top.p) {
        inframe = 1;
        break;
      }
    if (!inframe) return "a to-be-closed variable outside the locals of a Lua frame";
    /* Invariant checked: the innermost Lua frame holding it declared it to be closed and it
    ** is in scope where the frame is suspended (see tbc_in_scope). luaF_newtbcupval trusts
    ** that every later OP_TBC is above the newest entry: one below it (or at it) made the
    ** loop that adds dummy nodes run on past the stack. */
    if (!tbc_in_scope(ci, (int)(level - (ci->func.p + 1))))
      return "a to-be-closed variable that its frame did not declare or that is out of scope";
    /* Invariant checked: the value has a __close metamethod (false and nil never enter the
    ** list; other values are refused by OP_TBC). */
    if (l_isfalse(s2v(level)) || notm(luaT_gettmbyobj(co, s2v(level), TM_CLOSE)))
      return "a to-be-closed variable without a __close metamethod";
  }
  /* The list, as luaF_newtbcupval (lfunc.c) links each new entry. */
  for (i = 0; i < n; i++) {
    StkId level = co->stack.p + slots[i];
    while ((unsigned)(level - co->tbclist.p) > LS_MAXDELTA) {
      co->tbclist.p += LS_MAXDELTA;  /* a dummy node at maximum delta */
      co->tbclist.p->tbclist.delta = 0;
    }
    level->tbclist.delta = (unsigned short)(level - co->tbclist.p);
    co->tbclist.p = level;
  }
  return NULL;
}
