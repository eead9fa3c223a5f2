/*
** luasnap's window into Lua 5.5.1's internals, for the graph serializer.
**
** The public C API cannot name a function's prototype, compare prototypes, or create a
** closure from a prototype without loading bytecode. These few helpers do, so that loading a
** save-game in safe mode never runs bytecode taken from the file: closures are rebuilt from
** prototypes the VM compiled itself, matched by a structural fingerprint.
**
** Compiled against the internal headers of exactly the Lua release mlua vendors (csrc/lua-5.5.1,
** with lua-src pinned in Cargo.toml); the #if below refuses any other.
*/
#include <stdint.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lobject.h"
#include "lstate.h"
#include "lfunc.h"
#include "lgc.h"
#include "ldo.h"
#include "ltable.h"
#include "chunks.h"

#if LUA_VERSION_RELEASE_NUM != 50501
#error "luasnap's serializer is built for Lua 5.5.1 exactly; update csrc/lua-5.5.1 and the pinned lua-src together"
#endif

/* The prototype of the Lua closure at idx, or NULL if it is not a Lua closure. */
const void *luasnap_proto(lua_State *L, int idx) {
  const TValue *o;

  o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);

  if (!ttisLclosure(o)) return NULL;
  return clLvalue(o)->p;
}

int luasnap_proto_nupvalues(const void *p) {
  return ((const Proto *)p)->sizeupvalues;
}

/* 64-bit FNV-1a with a final avalanche, over everything that makes a prototype behave as it
** does: code, constants, upvalue descriptors, parameters, nested prototypes (recursively),
** and where it was defined. */
typedef struct { uint64_t h; } Hash;

static void hbytes(Hash *h, const void *data, size_t n) {
  const unsigned char *b = (const unsigned char *)data;
  size_t i;
  for (i = 0; i < n; i++) { h->h ^= b[i]; h->h *= 0x100000001b3ULL; }
}

static void hu64(Hash *h, uint64_t v) { hbytes(h, &v, sizeof v); }

static uint64_t finish(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Everything of p that its fingerprint covers but its nested prototypes. */
static void proto_hash_fields(Hash *h, const Proto *p) {
  int i;
  hu64(h, (uint64_t)p->numparams); hu64(h, (uint64_t)p->flag); hu64(h, (uint64_t)p->maxstacksize);
  hu64(h, (uint64_t)p->linedefined); hu64(h, (uint64_t)p->lastlinedefined);
  if (p->source) hbytes(h, getstr(p->source), tsslen(p->source));
  hu64(h, (uint64_t)p->sizecode);
  hbytes(h, p->code, sizeof(Instruction) * (size_t)p->sizecode);
  hu64(h, (uint64_t)luasnap_nconsts(p));  /* the chunk record's anchor is not code */
  for (i = 0; i < luasnap_nconsts(p); i++) {
    const TValue *k = &p->k[i];
    hu64(h, (uint64_t)ttypetag(k));
    if (ttisstring(k)) hbytes(h, getstr(tsvalue(k)), tsslen(tsvalue(k)));
    else if (ttisinteger(k)) hu64(h, (uint64_t)ivalue(k));
    else if (ttisfloat(k)) { lua_Number n = fltvalue(k); hbytes(h, &n, sizeof n); }
  }
  hu64(h, (uint64_t)p->sizeupvalues);
  for (i = 0; i < p->sizeupvalues; i++) {
    hu64(h, (uint64_t)p->upvalues[i].instack);
    hu64(h, (uint64_t)p->upvalues[i].idx);
    hu64(h, (uint64_t)p->upvalues[i].kind);
  }
  hu64(h, (uint64_t)p->sizep);
}

static uint64_t proto_hash(const Proto *p, int depth) {
  Hash h = { 0xcbf29ce484222325ULL };
  int i;
  proto_hash_fields(&h, p);
  for (i = 0; i < p->sizep; i++)
    hu64(&h, depth < 200 ? proto_hash(p->p[i], depth + 1) : 0);
  return finish(h.h);
}

uint64_t luasnap_proto_hash(const void *p) {
  return proto_hash((const Proto *)p, 0);
}

/* Deepest nesting below a prototype for which luasnap_proto_tree_hashes answers (far inside
** proto_hash's cut at 200: a prototype's fingerprint then equals the contribution it makes
** to its parent's). */
#define LS_TREE_HASH_DEPTH 100

static uint64_t tree_hashes(const Proto *p, int depth, uint64_t *hs, int max, int *n, int *deep) {
  Hash h = { 0xcbf29ce484222325ULL };
  int i, at = (*n)++;
  if (depth > LS_TREE_HASH_DEPTH) { *deep = 1; return 0; }
  proto_hash_fields(&h, p);
  for (i = 0; i < p->sizep; i++) hu64(&h, tree_hashes(p->p[i], depth + 1, hs, max, n, deep));
  h.h = finish(h.h);
  if (at < max) hs[at] = h.h;
  return h.h;
}

/* The fingerprints (luasnap_proto_hash) of the prototype p and of every prototype nested in
** it, in pre-order (p, then each child's tree in turn) into hs[0..max), each prototype hashed
** once (where hashing each alone hashes a prototype again for every one it is nested in).
** Returns how many prototypes the tree has, or -1 if it nests deeper than
** LS_TREE_HASH_DEPTH (then hash each alone). */
int luasnap_proto_tree_hashes(const void *p, uint64_t *hs, int max) {
  int n = 0, deep = 0;
  tree_hashes((const Proto *)p, 0, hs, max, &n, &deep);
  return deep ? -1 : n;
}

/* Pushes a new closure of prototype p with fresh (nil) upvalues, as lundump does. */
static void push_closure(lua_State *L, Proto *p) {
  LClosure *cl = luaF_newLclosure(L, p->sizeupvalues);
  setclLvalue2s(L, L->top.p, cl);
  L->top.p++;
  cl->p = p;
  luaC_objbarrier(L, cl, p);
  luaF_initupvals(L, cl);
}

void luasnap_push_closure(lua_State *L, const void *p) {
  push_closure(L, (Proto *)p);
}

/* Calls f(p, ud) for every prototype alive in the VM (walks the collector's object lists).
** The collector must be stopped by the caller so the lists do not change meanwhile. */
void luasnap_each_proto(lua_State *L, void (*f)(const void *, void *), void *ud) {
  global_State *g = G(L);
  GCObject *lists[4];
  int i;
  lists[0] = g->allgc; lists[1] = g->finobj; lists[2] = g->tobefnz; lists[3] = g->fixedgc;
  for (i = 0; i < 4; i++) {
    GCObject *o;
    for (o = lists[i]; o != NULL; o = o->next)
      /* A dead prototype (garbage the sweep has not freed yet) is about to be freed:
      ** anchoring it now would not save it. */
      if (o->tt == LUA_VPROTO && !isdead(g, o)) f(o, ud);
  }
}

/* ===================== coroutines ===================== */

#include "lopcodes.h"

/* One call frame of a suspended coroutine, in stack-slot offsets. */
typedef struct luasnap_ci {
  int32_t func, top;         /* slot offsets from the stack base */
  uint32_t callstatus;
  int32_t u2;                /* nyield / nres / funcidx */
  int32_t pc;                /* Lua: index of the next instruction */
  int32_t nextraargs;        /* Lua: extra arguments of a vararg function */
  int64_t old_errfunc;       /* C: saved error function, slot offset (or -1) */
  int64_t ctx;               /* C: continuation context */
  const void *k;             /* C: continuation (a C function pointer) or NULL */
} luasnap_ci;

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

static void thread_ci(lua_State *co, CallInfo *ci, luasnap_ci *out);

/* The first n frames above base_ci, in one walk (a function returning frame `level` walked
** to it: the writer's loop over the frames was quadratic in their number). */
void luasnap_thread_cis(lua_State *co, luasnap_ci *out, int n) {
  CallInfo *ci = co->base_ci.next;
  int i;
  for (i = 0; i < n && ci != NULL && ci != co->ci->next; i++, ci = ci->next)
    thread_ci(co, ci, &out[i]);
}

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

/* If upvalue n (1-based) of the Lua closure at idx is open, returns 1 and its thread and
** stack level. Threads are found through the collector's list of threads with open
** upvalues, plus the main thread. */
int luasnap_upval_open(lua_State *L, int idx, int n, lua_State **owner, int *level) {
  const TValue *o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
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

/* ===================== building loaded coroutines without raising on them =====================
** A coroutine the loader builds has no error handler of its own: an error raised with L = co
** (luaL_checkstack on co, a memory error while allocating through co) finds co->errorJmp NULL,
** and luaD_throw then resets co and rethrows on the *main thread's* handler, past the load's
** protected call when the load itself runs inside a coroutine (the collector stays stopped,
** the load's marks stay set). Invariant kept by the helpers below: nothing they do on co
** raises on co. They grow co's stack with luaD_reallocstack(co, n, 0) (reports failure,
** never raises) and allocate objects through the loading thread L, whose errors the load's
** protected call catches (luaC_newobj only uses L to reach the global state and to raise). */

#if defined(LUAI_MAXSTACK)
#define LS_MAXSTACK LUAI_MAXSTACK
#else
#define LS_MAXSTACK 1000000  /* ldo.c's default */
#endif

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
  const TValue *o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
  LClosure *cl;
  UpVal *uv, *up = NULL, **pp, *next;
  GCObject *g;
  StkId at;
  if (aidx != 0) {
    const TValue *ao = (aidx > 0) ? s2v(L->ci->func.p + aidx) : s2v(L->top.p + aidx);
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

/* Whether upvalue n of the Lua closure at idx may be shared by reference (lua_upvaluejoin,
** LS_JOINUPVAL): 1 if it exists and is closed, 0 if it is open (in any thread's stack: a
** loaded closure that shared it would reach that stack slot without the checks of
** luasnap_open_upval_check; saves name an open upvalue by its coroutine and slot, never by
** reference) or absent. */
int luasnap_upval_shareable(lua_State *L, int idx, int n) {
  const TValue *o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
  const LClosure *cl;
  if (!ttisLclosure(o)) return 0;
  cl = clLvalue(o);
  if (n < 1 || n > cl->nupvalues || cl->upvals[n - 1] == NULL) return 0;
  return !upisopen(cl->upvals[n - 1]);
}

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

const char *luasnap_check_call_sites(lua_State *co, const luasnap_ci *cis, int nci,
                                     int64_t errfunc, const void *pcall_k, void *memo);
static int virtual_func(lua_State *co, const luasnap_ci *r);

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
    vf = (!(r->callstatus & CIST_C) && ttisLclosure(f)) ? virtual_func(co, r) : r->func;
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
    const char *bad = luasnap_check_call_sites(co, cis, nci, errfunc, pcall_k, memo);
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

/* The continuation of the frame above base_ci+level of co (for discovering pcall's). */
const void *luasnap_thread_k(lua_State *co, int level) {
  CallInfo *ci = co->base_ci.next;
  while (ci != NULL && level-- > 0) ci = ci->next;
  if (ci == NULL || isLua(ci)) return NULL;
  return (const void *)ci->u.c.k;
}

/* Table traversal by position, for the persister: positions number the array part, then the
** hash nodes, as luaH_next numbers them, but resuming needs no lookup of the previous key.
** Neither function allocates or raises; both check bounds, so a table changed during a
** traversal (by a __persist function) cannot make them read outside it. */
static const Table *luasnap_table_at(lua_State *L, int idx) {
  const TValue *o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
  return ttistable(o) ? hvalue(o) : NULL;
}

/* Pushes the value, then the key, of the first non-empty entry at position >= *pos of the
** table tp (alive: anchored or reachable), and sets *pos past it. Returns 0, pushing nothing,
** after the last entry. The caller guarantees stack room for 2 values. */
int luasnap_table_next(lua_State *L, const void *tp, unsigned int *pos) {
  const Table *t = (const Table *)tp;
  unsigned int asize, i;
  if (t == NULL) return 0;
  asize = t->asize;
  for (i = *pos; i < asize; i++) {
    lu_byte tag = *getArrTag(t, i);
    if (!tagisempty(tag)) {
      farr2val(t, i, tag, s2v(L->top.p));
      setivalue(s2v(L->top.p + 1), cast(lua_Integer, i) + 1);
      L->top.p += 2;
      *pos = i + 1;
      return 1;
    }
  }
  for (i -= asize; i < sizenode(t); i++) {  /* i >= asize here */
    Node *n = gnode(t, i);
    if (!isempty(gval(n))) {
      setobj2s(L, L->top.p, gval(n));
      getnodekey(L, s2v(L->top.p + 1), n);
      L->top.p += 2;
      *pos = asize + i + 1;
      return 1;
    }
  }
  *pos = asize + sizenode(t);
  return 0;
}

/* Pushes the key (what == 0) or the value (what == 1) of the entry at position pos of the
** table tp. Returns 0, pushing nothing, if there is no such entry (any more). */
int luasnap_table_entry(lua_State *L, const void *tp, unsigned int pos, int what) {
  const Table *t = (const Table *)tp;
  if (t == NULL) return 0;
  if (pos < t->asize) {
    lu_byte tag = *getArrTag(t, pos);
    if (tagisempty(tag)) return 0;
    if (what == 0) {
      setivalue(s2v(L->top.p), cast(lua_Integer, pos) + 1);
    } else {
      farr2val(t, pos, tag, s2v(L->top.p));
    }
  } else {
    Node *n;
    if (pos - t->asize >= (unsigned int)sizenode(t)) return 0;
    n = gnode(t, pos - t->asize);
    if (isempty(gval(n))) return 0;
    if (what == 0) {
      getnodekey(L, s2v(L->top.p), n);
    } else {
      setobj2s(L, L->top.p, gval(n));
    }
  }
  L->top.p++;
  return 1;
}

/* Calls f(q, ud) for p and every prototype nested in it. */
void luasnap_proto_tree(const void *p, void (*f)(const void *, void *), void *ud) {
  const Proto *proto = (const Proto *)p;
  int i;
  f(p, ud);
  for (i = 0; i < proto->sizep; i++) luasnap_proto_tree(proto->p[i], f, ud);
}

/* Sets every stack slot above the top to nil. Dead slots keep whatever was last pushed there
** (the library setup leaves a clock-derived seed in one), and they are arena bytes too. */
void luasnap_clear_dead_stack(lua_State *L) {
  StkId p;
  for (p = L->top.p; p < L->stack_last.p + EXTRA_STACK; p++) setnilvalue(s2v(p));
}

/* Refills the API string cache with the fixed string Lua starts it with. luaS_new (behind
** lua_pushstring, lua_getfield, lua_setfield, chunk names...) picks a cache slot from the
** *address* of the C string it is given, so a host string on the Rust heap lands in a slot
** that depends on malloc's history: the cache is arena bytes, and two runs with identical Lua
** state would differ in them. The cache only saves lookups, so resetting it between host calls
** changes no behaviour and makes the idle arena a function of Lua's state alone. */
void luasnap_reset_strcache(lua_State *L) {
  global_State *g = G(L);
  int i, j;
  for (i = 0; i < STRCACHE_N; i++)
    for (j = 0; j < STRCACHE_M; j++)
      if (g->strcache[i][j] != g->memerrmsg)  /* unchanged bytes: no page written */
        g->strcache[i][j] = g->memerrmsg;
}

/* Sets the n slots just above the top to nil (cheap: host calls leave a light userdata with a
** Rust stack address there). */
void luasnap_clear_slots_above_top(lua_State *L, int n) {
  StkId p;
  for (p = L->top.p; p < L->top.p + n && p < L->stack_last.p + EXTRA_STACK; p++) setnilvalue(s2v(p));
}

/* ===================== batched table entries ===================== */

#include "lstring.h"

/* Kinds of a value handed between these helpers and the serializer (mirrored in
** src/persist/mod.rs as the constants of `kind`). */
#define LS_FALSE 1
#define LS_TRUE 2
#define LS_INT 3      /* bits: the integer */
#define LS_FLOAT 4    /* bits: the IEEE-754 bits */
#define LS_STR 5      /* s, len: the bytes; bits: (scan) identity, (build) string id + 1 or 0 */
#define LS_STRREF 6   /* build only; bits: string id + 1 */
#define LS_REF 7      /* build only; bits: object id */
#define LS_OBJ 8      /* scan only; bits: identity, as lua_topointer gives it */
#define LS_OTHER 9    /* scan only: a value the general path must handle (light userdata) */
#define LS_NIL 10     /* build only: the steps of luasnap_table_build */
#define LS_NEWTABLE 11
#define LS_META 12
#define LS_SET 13
#define LS_TABLE 14   /* scan only: a table, bits its identity (the Table itself) */
#define LS_NEWCLOSURE 15  /* build only */
#define LS_SETUPVAL 16
#define LS_JOINUPVAL 17
#define LS_LCLOSURE 18    /* scan only: a Lua closure, bits its identity */
#define LS_LAYOUT 19      /* build only */
#define LS_NEWTABLE_PLACED 20  /* build only */
#define LS_SETKV 21       /* build only; with a key and a value kind in the upper bits */

typedef struct luasnap_val {
  uint64_t kind;
  uint64_t len;
  uint64_t bits;
  const char *s;
} luasnap_val;

/* Inlined: the scan's hot loop calls it twice an entry. */
static inline __attribute__((always_inline)) void describe(const TValue *o, luasnap_val *out) {
  out->len = 0; out->bits = 0; out->s = NULL;
  switch (ttypetag(o)) {
    case LUA_VFALSE: out->kind = LS_FALSE; break;
    case LUA_VTRUE: out->kind = LS_TRUE; break;
    case LUA_VNUMINT: out->kind = LS_INT; out->bits = (uint64_t)ivalue(o); break;
    case LUA_VNUMFLT: {
      lua_Number d = fltvalue(o);
      out->kind = LS_FLOAT; memcpy(&out->bits, &d, sizeof d);
      break;
    }
    case LUA_VSHRSTR: case LUA_VLNGSTR: {
      TString *ts = tsvalue(o);
      out->kind = LS_STR; out->bits = (uint64_t)(uintptr_t)ts;
      out->s = getstr(ts); out->len = (uint64_t)tsslen(ts);
      break;
    }
    case LUA_VLCF: out->kind = LS_OBJ; out->bits = (uint64_t)(uintptr_t)fvalue(o); break;
    case LUA_VUSERDATA: out->kind = LS_OBJ; out->bits = (uint64_t)(uintptr_t)getudatamem(uvalue(o)); break;
    case LUA_VTABLE: out->kind = LS_TABLE; out->bits = (uint64_t)(uintptr_t)hvalue(o); break;
    case LUA_VLCL: out->kind = LS_LCLOSURE; out->bits = (uint64_t)(uintptr_t)clLvalue(o); break;
    case LUA_VNIL: out->kind = LS_NIL; break;
    default:
      if (iscollectable(o)) { out->kind = LS_OBJ; out->bits = (uint64_t)(uintptr_t)gcvalue(o); }
      else out->kind = LS_OTHER;
      break;
  }
}

/* A table entry for the persister's scan: each side's kind (an LS_* scan kind) and bits (the
** integer, the float's bits, or the identity: a string's TString, as for describe; 0 for
** nil and booleans). No string bytes: the persister refers to a string written before by its
** identity alone, and asks luasnap_string_bytes for the few it writes whole. */
typedef struct luasnap_sentry {
  uint64_t kbits, vbits;
  uint32_t pos;   /* the position just after this entry */
  uint8_t kkind, vkind;
} luasnap_sentry;
/* The persister's mirror (ScanEntry in persist/write.rs) has this size too. */
_Static_assert(sizeof(luasnap_sentry) == 24, "luasnap_sentry changed: update ScanEntry");

/* The scan kind of o, its bits in *bits. */
static inline __attribute__((always_inline)) uint8_t scan_val(const TValue *o, uint64_t *bits) {
  switch (ttypetag(o)) {
    case LUA_VFALSE: *bits = 0; return LS_FALSE;
    case LUA_VTRUE: *bits = 0; return LS_TRUE;
    case LUA_VNUMINT: *bits = (uint64_t)ivalue(o); return LS_INT;
    case LUA_VNUMFLT: {
      lua_Number d = fltvalue(o);
      memcpy(bits, &d, sizeof d);
      return LS_FLOAT;
    }
    case LUA_VSHRSTR: case LUA_VLNGSTR: *bits = (uint64_t)(uintptr_t)tsvalue(o); return LS_STR;
    case LUA_VLCF: *bits = (uint64_t)(uintptr_t)fvalue(o); return LS_OBJ;
    case LUA_VUSERDATA: *bits = (uint64_t)(uintptr_t)getudatamem(uvalue(o)); return LS_OBJ;
    case LUA_VTABLE: *bits = (uint64_t)(uintptr_t)hvalue(o); return LS_TABLE;
    case LUA_VLCL: *bits = (uint64_t)(uintptr_t)clLvalue(o); return LS_LCLOSURE;
    case LUA_VNIL: *bits = 0; return LS_NIL;
    default:
      if (iscollectable(o)) { *bits = (uint64_t)(uintptr_t)gcvalue(o); return LS_OBJ; }
      *bits = 0;
      return LS_OTHER;
  }
}

/* The bytes and length of the string ts (a live TString, as a scan gave its identity). */
const char *luasnap_string_bytes(const void *ts, size_t *len) {
  TString *s = (TString *)ts;
  *len = tsslen(s);
  return getstr(s);
}

/* Describes up to `max` entries of the table tp from position `pos` on (positions as in
** luasnap_table_next), for the persister to write without pushing them (objects by
** identity: the persister keeps a batch while no Lua code runs, so what it describes stays
** as it is). Returns the number described: fewer than max only when it reached the last entry,
** 0 after it. Reads only, and checks bounds like luasnap_table_next. */
/* The writer reads a table or Lua closure met in a batch (its header) soon after the scan:
** started now, the loads of a batch's objects overlap instead of each stalling in turn. */
#define LS_PREFETCH_OBJ(e) \
  do { if ((e)->vkind == LS_TABLE || (e)->vkind == LS_LCLOSURE) \
         __builtin_prefetch((const void *)(uintptr_t)(e)->vbits); } while (0)

int luasnap_table_scan(lua_State *L, const void *tp, unsigned int pos, luasnap_sentry *out, int max) {
  const Table *t = (const Table *)tp;
  unsigned int asize, nsize, i;
  const Node *node;
  int n = 0;
  (void)L;
  if (t == NULL) return 0;
  asize = t->asize;
  /* Read once: the stores into out below could alias them for the compiler. */
  nsize = (unsigned int)sizenode(t);
  node = t->node;
  for (i = pos; i < asize; i++) {
    lu_byte tag = *getArrTag(t, i);
    if (!tagisempty(tag)) {
      TValue v;
      luasnap_sentry *e = &out[n++];
      farr2val(t, i, tag, &v);
      e->kkind = LS_INT; e->kbits = (uint64_t)i + 1;
      e->vkind = scan_val(&v, &e->vbits);
      LS_PREFETCH_OBJ(e);
      e->pos = i + 1;
      if (n == max) return n;
    }
  }
  for (i -= asize; i < nsize; i++) {  /* i >= asize here */
    const Node *nd = &node[i];
    if (!isempty(gval(nd))) {
      TValue k;
      luasnap_sentry *e = &out[n++];
      getnodekey(L, &k, nd);
      e->kkind = scan_val(&k, &e->kbits);
      e->vkind = scan_val(gval(nd), &e->vbits);
      LS_PREFETCH_OBJ(e);
      e->pos = asize + i + 1;
      if (n == max) return n;
    }
  }
  return n;
}

#if defined(__GNUC__)
#define LS_NOINLINE __attribute__((noinline))
#define LS_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define LS_NOINLINE
#define LS_ALWAYS_INLINE inline
#endif

/* The last layout relayout applied, for the next table laid out alike (objects made by one
** constructor: same sizes, same keys arriving in the same order, same layout). Where a table
** matches it, relayout's result is known without sorting or checking again: where the layout
** puts each entry and that every lookup finds its key there depend on nothing else than what
** the memo compares (see ls_rmemo_apply). Only layouts without removed entries' keys, of at
** most LS_RM_NODES nodes, whose live keys are numbers, booleans or short strings. */
#define LS_RM_NODES 32
typedef struct ls_rmemo {
  unsigned int size;  /* 0: empty */
  unsigned int lastfree, m, asize;
  uint32_t codes[LS_RM_NODES];
  int32_t nexts[LS_RM_NODES];
  /* The live keys in node order, as relayout collects them: tag, value bits, and for a short
  ** string its hash (its address is its identity; the hash places it). */
  lu_byte tags[LS_RM_NODES];
  uint64_t bits[LS_RM_NODES];
  unsigned int hashes[LS_RM_NODES];
  lu_byte perm[LS_RM_NODES];  /* rank r (code 3 + r) -> the index of its key above */
  /* Collision-chain nodes the load walked (ls_chain_charge) and its limit (0: none); over:
  ** the limit was passed. */
  uint64_t steps, limit;
  int over;
} ls_rmemo;

/* Charges the walk of the collision chain the key k goes into in t (every node of it: what a
** lookup or an insertion may walk) to the load's limit in the memo m (NULL or no limit: free).
** Returns -1 once the limit is passed (m->over set). Only keys whose position a file chooses
** by value count: integers outside the array part, floats, strings (an object key's position
** is its address). Invariant relied on: t's chains are Lua's (or checked by relayout) paths,
** so the walk ends; it is also bounded by the node count. */
/* (Out of line: the build steps call it only when a limit is set, foreign loads.) */
static LS_NOINLINE int ls_chain_charge(ls_rmemo *m, const Table *t, const TValue *k) {
  const Node *n;
  unsigned int count = 1, size;
  if (m == NULL || m->limit == 0 || isdummy(t)) return 0;
  if (ttisinteger(k)) {
    if (l_castS2U(ivalue(k)) - 1u < t->asize) return 0;
  }
  else if (ttisfloat(k)) {
    if (luai_numisnan(fltvalue(k))) return 0;
  }
  else if (!ttisstring(k)) return 0;
  size = sizenode(t);
  n = luaH_mainposition(t, k);
  while (gnext(n) != 0 && count < size) {
    n += gnext(n);
    count++;
  }
  m->steps += count;
  if (m->steps > m->limit) {
    m->over = 1;
    return -1;
  }
  return 0;
}

/* Sets the collision-chain limit of a load's memo (see ls_chain_charge; 0: none). */
void luasnap_relayout_memo_limit(void *memo, uint64_t limit) {
  ((ls_rmemo *)memo)->limit = limit;
}

/* Whether the load passed its collision-chain limit. */
int luasnap_relayout_memo_over(const void *memo) {
  return ((const ls_rmemo *)memo)->over;
}

/* lua_rawset(L, idx) for the loader's general path (the key and value on top), with the key's
** chain charged to the memo's limit first: returns -1 (nothing set, the stack as it was) once
** the limit is passed, else 0. Raises like lua_rawset. */
int luasnap_rawset_charged(lua_State *L, int idx, void *memo) {
  if (lua_type(L, idx) == LUA_TTABLE
      && ls_chain_charge((ls_rmemo *)memo, (const Table *)lua_topointer(L, idx),
                         s2v(L->top.p - 2)) < 0)
    return -1;
  lua_rawset(L, idx);
  return 0;
}
/* Runs n building steps for the loader: a small stack machine working on the table on top
** of the stack, whose program the loader decoded and checked (every id below what it has
** read). The steps are
**   a value kind (LS_FALSE .. LS_REF) or LS_NIL: push it. An LS_STR with bits != 0 is also
**     stored at strs[bits]; LS_STRREF pushes strs[bits], LS_REF objs[bits];
**   LS_NEWTABLE: push a new table presized to len >> 32 array and len & 0xffffffff hash
**     slots, and store it at objs[bits];
**   LS_NEWTABLE_PLACED: as LS_NEWTABLE, for a table whose LS_LAYOUT step follows in this
**     program (the loader checked that the layout's node count and hash seed are the
**     table's): its LS_SET steps put each entry whose key is not in the array part into the
**     next node in order, without hashing; the LS_LAYOUT step then places them (its checks,
**     a lookup of every key included, run as for any table), and fails rather than leave
**     the nodes as they are;
**   LS_META: [t, mt] -> setmetatable(t, mt) (mt nil or a table), popping mt;
**   LS_SET: [t, k, v] -> t[k] = v (raw), popping k and v;
**   LS_SETKV | vkind << 8 | kkind << 16 | kval << 32: [t] -> t[k] = v (as LS_SET) for the key
**     k of kind kkind (LS_INT: the integer kval; LS_STRREF: strs[kval]) and the value v of
**     kind vkind (LS_FALSE, LS_TRUE, LS_INT, LS_FLOAT, LS_STR or LS_STRREF, with bits, len
**     and s as that kind's own step has them): one step instead of three;
**   LS_NEWCLOSURE: push a new Lua closure of the prototype bits (one the loader found among
**     the VM's own, with fresh upvalues), and store it at objs[len];
**   LS_SETUPVAL: [f, v] -> upvalue bits of the Lua closure f = v, popping v;
**   LS_JOINUPVAL: [f] -> upvalue len >> 32 of f becomes upvalue len & 0xffffffff of the Lua
**     closure objs[bits] (shared, as lua_upvaluejoin);
**   LS_LAYOUT: [t] -> the hash part of t (complete) takes the layout at lay[bits]: the node
**     count, lastfree and the hash seed, then the node codes, with the chain links at
**     laynx[bits + 3] (a layout without removed keys; see luasnap_table_relayout, whose checks
**     all run), using scratch (luasnap_relayout_scratch bytes for the largest) and memo (a
**     relayout memo, luasnap_relayout_memo_size bytes the caller keeps for a whole load: a
**     table laid out like the last one placed skips the sort and checks, see ls_rmemo).
** Tables and keys whose values are still to come stay on the stack, for the loader's general
** path. Returns -1, or the index of the step that failed (an LS_REF to an absent object, an
** LS_META whose metatable is not a table, an LS_JOINUPVAL to something else than a Lua
** closure with that upvalue, an LS_LAYOUT that does not match its table or, for a placed table,
** does not apply; an LS_SET or LS_SETKV into a placed table with a NaN key or more keys than
** nodes; an LS_SET, LS_SETKV or LS_LAYOUT past the collision-chain limit the memo holds,
** memo->over then set: see ls_chain_charge). Raises like lua_rawset (memory, NaN key). The
** caller guarantees stack room for 2 + 2 * (the tables the program leaves open) values;
** strs and objs are absolute indices. */
static int relayout(lua_State *L, Table *t, const uint32_t *codes, const int32_t *nexts,
                    unsigned int size, unsigned int lastfree, unsigned int seed, Table *kt,
                    char *scratch, ls_rmemo *memo);

/* Bytes of a relayout memo (see ls_rmemo); zeroed bytes are an empty memo. */
size_t luasnap_relayout_memo_size(void) { return sizeof(ls_rmemo); }
static void new_sized_table(lua_State *L, unsigned int na, unsigned int nh);

/* t[k] = v for a placed table (see LS_NEWTABLE_PLACED): a key in the array part goes there
** (as luaH_setint, which touches no node); any other key takes node *cursor (the next one),
** key and value as they are, with no chain: the layout step that follows moves every entry
** to its node and checks, by a lookup of each key, that it is found there (which refuses a
** duplicate key, and a float key with an integer value: no lookup finds it). A nil value
** adds nothing (as luaH_set). Returns -1 for a nil or NaN key, or more keys than nodes;
** neither allocates nor raises. Nodes keep valid keys and values throughout (the collector
** may traverse t). */
static LS_ALWAYS_INLINE int place_entry(lua_State *L, Table *t, const TValue *k,
                                        const TValue *v, unsigned int *cursor) {
  Node *n;
  if (ttisnil(v)) return 0;
  if (ttisinteger(k) && l_castS2U(ivalue(k)) - 1u < t->asize) {
    luaH_setint(L, t, ivalue(k), (TValue *)v);
    return 0;
  }
  if (ttisnil(k) || (ttisfloat(k) && luai_numisnan(fltvalue(k)))) return -1;
  if (isextstr(k)) return -1;  /* the loader makes none: defensive */
  if (isdummy(t) || *cursor >= sizenode(t)) return -1;
  n = gnode(t, (*cursor)++);
  setnodekey(n, k);
  setobj2t(L, gval(n), v);
  luaC_barrierback(L, obj2gco(t), k);
  return 0;
}

/* The VM's hash seed (a table layout applies only under the seed it was saved with). */
unsigned int luasnap_hash_seed(lua_State *L) {
  return G(L)->seed;
}

/* How deep tables nest in one luasnap_table_build program (the loader's PLAIN_DEPTH is 16),
** counting the table it starts on. */
#define LS_BUILD_DEPTH 18

/* luaH_getint and luaH_setint with the array part's case inline, as theirs (the same
** results): the build helper looks up and stores every object and string by its id in the
** load's id tables, which the loader presizes, so nearly every id is in their array parts. */
static l_inline lu_byte ls_getint(Table *t, lua_Integer k, TValue *res) {
  lua_Unsigned i = l_castS2U(k) - 1u;
  if (i < t->asize) {
    lu_byte tag = *getArrTag(t, i);
    if (!tagisempty(tag)) farr2val(t, i, tag, res);
    return tag;
  }
  return luaH_getint(t, k, res);
}

static l_inline void ls_setint(lua_State *L, Table *t, lua_Integer k, TValue *v) {
  lua_Unsigned i = l_castS2U(k) - 1u;
  if (i < t->asize) obj2arr(t, i, v);
  else luaH_setint(L, t, k, v);
}

/* Writes the plain value of build step x, of kind `kind` (false, true, an integer, a float, a
** new string, a string reference), into slot, the free slot at the top of L's stack; returns
** 0 for another kind or a string reference that strs does not hold. A new string the file
** numbers (x->bits != 0) is recorded in strs, anchored above the top while strs may grow. */
static l_inline int ls_plain_value(lua_State *L, Table *st, unsigned int kind,
                                   const luasnap_val *x, TValue *slot) {
  switch (kind) {
    case LS_FALSE: setbfvalue(slot); return 1;
    case LS_TRUE: setbtvalue(slot); return 1;
    case LS_INT: setivalue(slot, (lua_Integer)x->bits); return 1;
    case LS_FLOAT: {
      lua_Number d;
      memcpy(&d, &x->bits, sizeof d);
      setfltvalue(slot, d);
      return 1;
    }
    case LS_STR: {
      TString *ts = luaS_newlstr(L, x->s, (size_t)x->len);
      setsvalue(L, slot, ts);
      if (x->bits != 0) {
        L->top.p++;  /* anchored while strs may grow */
        ls_setint(L, st, (lua_Integer)x->bits, slot);
        luaC_barrierback(L, obj2gco(st), slot);
        L->top.p--;
      }
      return 1;
    }
    case LS_STRREF: return !tagisempty(ls_getint(st, (lua_Integer)x->bits, slot));
    default: return 0;
  }
}

/* t[k] = v (raw) for a build step, with t the table at depth d of the program (see
** luasnap_table_build: placed[d] and cursor[d] for a placed table). Returns -1 when a placed
** table refuses the entry (see place_entry). Raises like lua_rawset (memory, NaN key). */
static LS_ALWAYS_INLINE int ls_set(lua_State *L, Table *t, const TValue *k, const TValue *v,
                                   ptrdiff_t d, const lu_byte *placed, unsigned int *cursor,
                                   ls_rmemo *memo) {
  if (d >= 1 && d < LS_BUILD_DEPTH && placed[d]) {
    if (place_entry(L, t, k, v, &cursor[d]) < 0) return -1;
  }
  else if (ttisinteger(k) && l_castS2U(ivalue(k)) - 1u < t->asize) {
    /* In the array part: as luaH_set does there (luaH_setint's case), which touches neither
    ** a node nor the metamethod cache (integers name no metamethod). */
    obj2arr(t, l_castS2U(ivalue(k)) - 1u, v);
    luaC_barrierback(L, obj2gco(t), v);
    return 0;
  }
  else if (ttisshrstring(k) && !isdummy(t) && !ttisnil(v)
           && keyisnil(gnode(t, lmod(tsvalue(k)->hash, sizenode(t))))) {
    /* A short string whose main position is a free node: luaH_set would find it absent
    ** (its chain starts there and is empty) and insert it there (insertkey's case without a
    ** collision); a raw set ignores __newindex. Invariant relied on: a node with a nil key
    ** has never held one, so it heads no chain and links to no other (Lua never clears a
    ** key; relayout makes its free nodes so, checked). */
    Node *mp = gnode(t, lmod(tsvalue(k)->hash, sizenode(t)));
    setnodekey(mp, k);
    setobj2t(L, gval(mp), v);
    luaC_barrierback(L, obj2gco(t), k);
  }
  else {
    if (memo != NULL && memo->limit != 0 && ls_chain_charge(memo, t, k) < 0) return -1;
    luaH_set(L, t, k, (TValue *)v);
  }
  invalidateTMcache(t);
  luaC_barrierback(L, obj2gco(t), v);
  return 0;
}

int luasnap_table_build(lua_State *L, int strs, int objs, const luasnap_val *ops, int n,
                        int nofinal, const uint32_t *lay, const int32_t *laynx, char *scratch,
                        void *memo) {
  Table *st = (Table *)luasnap_table_at(L, strs);
  Table *ot = (Table *)luasnap_table_at(L, objs);
  int i;
  /* The tables the program opens sit at base + 2d (d = 1, 2, ...: each after its key), the
  ** one it starts on at base; an offset, since a collection may move the stack. For each
  ** depth: whether its table is placed (LS_NEWTABLE_PLACED) and its next free node. */
  ptrdiff_t base = (L->top.p - 1) - L->stack.p;
  lu_byte placed[LS_BUILD_DEPTH] = {0};
  unsigned int cursor[LS_BUILD_DEPTH];
#define LS_DEPTH(sp) (((sp) - L->stack.p - base) / 2)
  if (st == NULL || ot == NULL || !ttistable(s2v(L->top.p - 1))) return 0;
  for (i = 0; i < n; i++) {
    const luasnap_val *x = &ops[i];
    TValue *slot = s2v(L->top.p);
    Table *t;
    switch (x->kind & 0xff) {
      case LS_NIL: setnilvalue(slot); break;
      case LS_FALSE: case LS_TRUE: case LS_INT: case LS_FLOAT: case LS_STR: case LS_STRREF:
        if (!ls_plain_value(L, st, (unsigned int)(x->kind & 0xff), x, slot)) goto fail;
        break;
      case LS_REF:
        if (tagisempty(ls_getint(ot, (lua_Integer)x->bits, slot))) goto fail;
        break;
      case LS_NEWTABLE: case LS_NEWTABLE_PLACED: {
        ptrdiff_t d;
        new_sized_table(L, (unsigned int)(x->len >> 32), (unsigned int)(x->len & 0xffffffffu));
        ls_setint(L, ot, (lua_Integer)x->bits, s2v(L->top.p - 1));
        luaC_barrierback(L, obj2gco(ot), s2v(L->top.p - 1));
        d = LS_DEPTH(L->top.p - 1);
        if (d < 1 || d >= LS_BUILD_DEPTH) {
          if (x->kind == LS_NEWTABLE_PLACED) goto fail;  /* cannot happen: defensive */
        }
        else {
          placed[d] = x->kind == LS_NEWTABLE_PLACED;
          cursor[d] = 0;
        }
        continue;  /* already pushed */
      }
      case LS_META: {
        const TValue *mt = s2v(L->top.p - 1);
        if (!ttistable(s2v(L->top.p - 2))) goto fail;  /* cannot happen: defensive */
        t = hvalue(s2v(L->top.p - 2));
        if (ttisnil(mt)) t->metatable = NULL;
        else if (ttistable(mt)) {
          /* Invariant checked: with nofinal (foreign loads), no loaded object is marked for
          ** finalization. Lua marks an object only if its metatable has __gc when it is set
          ** (luaC_checkfinalizer), so refusing such a metatable here is exact. */
          if (nofinal && !isabstkey(luaH_Hgetshortstr(hvalue(mt), G(L)->tmname[TM_GC])))
            return -2 - i;
          t->metatable = hvalue(mt);
          luaC_objbarrier(L, t, hvalue(mt));
          luaC_checkfinalizer(L, obj2gco(t), hvalue(mt));
        }
        else goto fail;
        L->top.p--;
        continue;
      }
      case LS_SETKV: {
        unsigned int vk = (unsigned int)((x->kind >> 8) & 0xff);
        unsigned int kk = (unsigned int)((x->kind >> 16) & 0xff);
        lua_Integer kv = (lua_Integer)(x->kind >> 32);
        TValue k, v;
        StkId top = L->top.p;
        if (kk == LS_INT) { setivalue(&k, kv); }
        else if (kk != LS_STRREF || tagisempty(ls_getint(st, kv, &k))) goto fail;
        if (vk == LS_STR) {
          /* A new string: made on the stack, the key anchored below it (see ls_plain_value). */
          setobj2s(L, top, &k);
          L->top.p++;
          if (!ls_plain_value(L, st, vk, x, s2v(L->top.p))) goto fail;
          L->top.p++;
          goto set;
        }
        /* The other kinds allocate nothing, so key and value need no anchor: the key is an
        ** integer or a string strs holds, the value a plain one or a string strs holds.
        ** Another kind cannot happen (the loader fuses only these): defensive. */
        if (!ls_plain_value(L, st, vk, x, &v)) goto fail;
        if (!ttistable(s2v(top - 1))) goto fail;  /* cannot happen: defensive */
        if (ls_set(L, hvalue(s2v(top - 1)), &k, &v, LS_DEPTH(top - 1), placed, cursor,
                   (ls_rmemo *)memo) < 0)
          goto fail;
        continue;
      }
      case LS_SET: set: {
        if (!ttistable(s2v(L->top.p - 3))) goto fail;  /* cannot happen: defensive */
        if (ls_set(L, hvalue(s2v(L->top.p - 3)), s2v(L->top.p - 2), s2v(L->top.p - 1),
                   LS_DEPTH(L->top.p - 3), placed, cursor, (ls_rmemo *)memo) < 0)
          goto fail;
        L->top.p -= 2;
        continue;
      }
      case LS_NEWCLOSURE: {
        push_closure(L, (Proto *)(uintptr_t)x->bits);
        ls_setint(L, ot, (lua_Integer)x->len, s2v(L->top.p - 1));
        luaC_barrierback(L, obj2gco(ot), s2v(L->top.p - 1));
        continue;
      }
      case LS_SETUPVAL: {
        const TValue *f = s2v(L->top.p - 2);
        LClosure *cl;
        UpVal *uv;
        if (!ttisLclosure(f)) goto fail;  /* cannot happen: defensive */
        cl = clLvalue(f);
        if (x->bits < 1 || x->bits > (uint64_t)cl->nupvalues) goto fail;
        uv = cl->upvals[x->bits - 1];
        setobj(L, uv->v.p, s2v(L->top.p - 1));
        luaC_barrier(L, uv, s2v(L->top.p - 1));
        L->top.p--;
        continue;
      }
      case LS_JOINUPVAL: {
        const TValue *f = s2v(L->top.p - 1);
        unsigned int n1 = (unsigned int)(x->len >> 32), n2 = (unsigned int)(x->len & 0xffffffffu);
        LClosure *cl, *other;
        TValue o;
        if (!ttisLclosure(f)) goto fail;  /* cannot happen: defensive */
        cl = clLvalue(f);
        if (tagisempty(ls_getint(ot, (lua_Integer)x->bits, &o)) || !ttisLclosure(&o)) goto fail;
        other = clLvalue(&o);
        if (n1 < 1 || n1 > (unsigned int)cl->nupvalues || n2 < 1 || n2 > (unsigned int)other->nupvalues)
          goto fail;
        /* Invariant checked: only closed upvalues are shared by reference (see
        ** luasnap_upval_shareable). */
        if (other->upvals[n2 - 1] == NULL || upisopen(other->upvals[n2 - 1])) goto fail;
        cl->upvals[n1 - 1] = other->upvals[n2 - 1];
        luaC_objbarrier(L, cl, cl->upvals[n1 - 1]);
        continue;
      }
      case LS_LAYOUT: {
        const uint32_t *h = lay + x->bits;
        ptrdiff_t d = LS_DEPTH(L->top.p - 1);
        int was_placed = d >= 1 && d < LS_BUILD_DEPTH && placed[d];
        int rc;
        if (!ttistable(s2v(L->top.p - 1))) goto fail;  /* cannot happen: defensive */
        rc = relayout(L, hvalue(s2v(L->top.p - 1)), h + 3, laynx + x->bits + 3, h[0], h[1], h[2],
                      NULL, scratch, (ls_rmemo *)memo);
        /* Invariant checked: a placed table's nodes hold its entries in arrival order, with no
        ** chains, until its layout places them; a layout that does not apply (1: another
        ** seed or size, which the loader ruled out) would leave them unfindable. */
        if (rc < 0 || (rc != 0 && was_placed)) goto fail;
        if (was_placed) placed[d] = 0;
        continue;
      }
      default:
        goto fail;
    }
    L->top.p++;
  }
  return -1;
fail:
  return i;
#undef LS_DEPTH
}

/* Stores the objects ps[0..n) at tbl[keys[i]] (or tbl[first + i] if keys is NULL), tbl
** being the table at the absolute index idx. For the persister, which records strings,
** tables and closures by identity without pushing them and anchors them only before Lua code
** can run: until then every one of them is reachable from the graph being written, which
** nothing changes. */
void luasnap_anchor(lua_State *L, int idx, const void *const *ps, const lua_Integer *keys, int n,
                    lua_Integer first) {
  Table *tbl = (Table *)luasnap_table_at(L, idx);
  int i;
  if (tbl == NULL) return;
  for (i = 0; i < n; i++) {
    TValue v;
    setgcovalue(L, &v, (GCObject *)ps[i]);
    luaH_setint(L, tbl, keys != NULL ? keys[i] : first + i, &v);
    luaC_barrierback(L, obj2gco(tbl), &v);
  }
}

/* Whether the table mt (a metatable) has a non-nil field `key` (a live string). Reads only. */
int luasnap_meta_has(const void *mt, const void *key) {
  TValue tmp;
  return !tagisempty(luaH_getstr((Table *)mt, (TString *)key, &tmp));
}

/* Pushes the metatable of the table tp, or nil. */
void luasnap_push_metatable(lua_State *L, const void *tp) {
  const Table *t = (const Table *)tp;
  if (t->metatable != NULL) { sethvalue2s(L, L->top.p, t->metatable); }
  else { setnilvalue(s2v(L->top.p)); }
  L->top.p++;
}

/* Sizes of the array and hash parts of the table tp, and its metatable (NULL if none).
** Returns whether that metatable has a non-nil field `key` (the persister's spkey, a string
** it keeps alive; NULL: 0, no lookup). Reads only. */
int luasnap_table_info(const void *tp, const void *key, unsigned int *narr, unsigned int *nhash,
                       const void **mt) {
  const Table *t = (const Table *)tp;
  *narr = t->asize;
  *nhash = isdummy(t) ? 0 : (1u << t->lsizenode);
  *mt = t->metatable;
  if (t->metatable == NULL || key == NULL) return 0;
  return luasnap_meta_has(t->metatable, key);
}

/* For the persister: the prototype of the Lua closure f (alive) and, for each of its n
** upvalues (n <= max), the upvalue's identity (as lua_upvalueid gives it) in uids[i] and a
** description of its value in vals[i]. Returns n, or -1 if f has more than max upvalues or
** one of them is still open (in a coroutine's stack: the general path keeps that link).
** Reads only. */
int luasnap_closure_scan(const void *f, const void **proto, const void **uids, luasnap_val *vals,
                         int max) {
  const LClosure *cl = (const LClosure *)f;
  int i;
  if (cl->nupvalues > max) return -1;
  *proto = cl->p;
  for (i = 0; i < cl->nupvalues; i++) {
    const UpVal *uv = cl->upvals[i];
    if (uv == NULL || upisopen(uv)) return -1;
    uids[i] = uv;
    describe(uv->v.p, &vals[i]);
  }
  return cl->nupvalues;
}

/* ===================== canonical stacks (arena bytes independent of the host) =====================
** After Lua returns to the host, the bytes of the arena must depend on the Lua state alone. Two
** things in a thread's lua_State break that:
** - dead stack slots (at or above the top) keep the last values stored there, among them the
**   light userdata luaL_buffinit pushes as a placeholder: the address of a luaL_Buffer on the
**   *C stack*, which moves with the depth of the host's call chain (string.format, rep, gsub,
**   upper, table.concat, tostring... all use one);
** - a coroutine's nCcalls keeps the C-call depth of whoever resumed it last.
** luasnap_settle_thread resets both; the host calls it on the main thread after every call into
** Lua, and the coroutine functions below call it on a coroutine each time it stops running. */

#include "lauxlib.h"

/* Zeroes every stack slot of th at or above its top that is not all-zero bytes already, and
** returns how many it wrote. Comparing first keeps pages whose dead slots are clean unwritten
** (no tracking fault, no dirty page for incremental snapshots).
** Invariant relied on: th is not running (idle main thread, or a coroutine that has just
** yielded, returned or failed; checked below for coroutines), so slots from th->top.p to stack_last + EXTRA_STACK are dead:
** Lua never reads a slot above the top before writing it, and its collector treats that slice
** as dead too (traversethread clears it). All-zero bytes are a nil (LUA_VNIL == 0). */
int luasnap_settle_thread(lua_State *th) {
  static const StackValue zero;
  StkId p = th->top.p, end = th->stack_last.p + EXTRA_STACK;
  int n = 0;
  lua_assert(LUA_VNIL == 0);
  /* Checked, not assumed: a coroutine that is running or normal (status LUA_OK with a call in
  ** progress: ci above base_ci) is left alone. coroutine.resume of such a coroutine fails
  ** ("cannot resume non-suspended coroutine") without running it, and resetting its nCcalls
  ** would erase its non-yieldable count and C-call depth while it is still active (a yield
  ** across table.sort's C frame, unbounded C recursion). It is settled when it stops. */
  if (th != mainthread(G(th)) && th->status == LUA_OK && th->ci != &th->base_ci) return 0;
  for (; p < end; p++) {
    if (memcmp(p, &zero, sizeof zero) != 0) {
      memset(p, 0, sizeof zero);
      n++;
    }
  }
  /* A thread that is not running has no C calls in progress; lua_resume and lua_closethread
  ** set nCcalls from the resumer before running it again, and lua_newthread starts at 0. */
  if (th != mainthread(G(th)) && th->nCcalls != 0) th->nCcalls = 0;
  return n;
}

/* The host's instruction-budget hook (the runtime's G.step budget), registered once by the
** host; NULL until then. */
static lua_Hook step_hook;

void luasnap_register_step_hook(lua_Hook h) {
  __atomic_store_n(&step_hook, h, __ATOMIC_RELAXED);
}

/* A count hook belongs to one thread (lua_sethook), and a coroutine created before the host set
** it does not inherit it: so the resumer passes the budget hook on at each resume, with its own
** period (1 once the budget is spent, so the coroutine fails at its first instruction). A
** coroutine resumed by a thread without it drops a budget hook left from an earlier call, so
** the hook fields of every thread are a function of the calls that ran under the budget. A
** coroutine with another hook of its own (debug.sethook) keeps it. */
static void ls_pass_step_hook(lua_State *L, lua_State *co) {
  lua_Hook h = __atomic_load_n(&step_hook, __ATOMIC_RELAXED);
  if (h == NULL) return;
  if (L->hook == h) {
    if (co->hook == NULL || co->hook == h)
      lua_sethook(co, h, LUA_MASKCOUNT, L->basehookcount);
  }
  else if (co->hook == h)
    lua_sethook(co, NULL, 0, 0);
}

/* The coroutine library's resume, wrap and close (lcorolib.c, Lua 5.5.1), unchanged except
** that each settles the coroutine once it stops running and passes the host's instruction
** budget on to it. */
static int ls_auxresume(lua_State *L, lua_State *co, int narg) {
  int status, nres;
  /* Checked here, before co's stack is touched: a coroutine dead by an error, or one a load is
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
  ls_pass_step_hook(L, co);
  status = lua_resume(co, L, narg, &nres);
  if (l_likely(status == LUA_OK || status == LUA_YIELD)) {
    if (l_unlikely(!lua_checkstack(L, nres + 1))) {
      lua_pop(co, nres);
      luasnap_settle_thread(co);
      lua_pushliteral(L, "too many results to resume");
      return -1;
    }
    lua_xmove(co, L, nres);
    luasnap_settle_thread(co);
    return nres;
  } else {
    lua_xmove(co, L, 1);
    luasnap_settle_thread(co);
    return -1;
  }
}

static lua_State *ls_getco(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  luaL_argexpected(L, co, 1, "thread");
  return co;
}

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

int luasnap_co_auxwrap(lua_State *L) {
  lua_State *co = lua_tothread(L, lua_upvalueindex(1));
  int r = ls_auxresume(L, co, lua_gettop(L));
  if (l_unlikely(r < 0)) {
    int stat = lua_status(co);
    if (stat != LUA_OK && stat != LUA_YIELD) {
      stat = lua_closethread(co, L);
      lua_assert(stat != LUA_OK);
      lua_xmove(co, L, 1);
      luasnap_settle_thread(co);
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

int luasnap_co_wrap(lua_State *L) {
  lua_State *NL;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  NL = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, NL, 1);
  lua_pushcclosure(L, luasnap_co_auxwrap, 1);
  return 1;
}

#define LS_COS_RUN 0
#define LS_COS_DEAD 1
#define LS_COS_YIELD 2
#define LS_COS_NORM 3

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

int luasnap_co_close(lua_State *L) {
  lua_State *co = lua_isnone(L, 1) ? L : ls_getco(L);
  static const char *const statname[] = {"running", "dead", "suspended", "normal"};
  int status = ls_auxstatus(L, co);
  switch (status) {
    case LS_COS_DEAD: case LS_COS_YIELD: {
      ls_pass_step_hook(L, co);  /* its __close handlers run under the budget too */
      status = lua_closethread(co, L);
      if (status == LUA_OK) {
        luasnap_settle_thread(co);
        lua_pushboolean(L, 1);
        return 1;
      } else {
        lua_pushboolean(L, 0);
        lua_xmove(co, L, 1);
        luasnap_settle_thread(co);
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

/* Whether the value at idx is an object the collector can remove from a weak table: not a
** string (Lua keeps strings in weak tables), not a light C function, light userdata, number,
** boolean or nil. */
int luasnap_is_weak_removable(lua_State *L, int idx) {
  const TValue *o = s2v(L->ci->func.p + idx);
  lua_assert(idx > 0 && L->ci->func.p + idx < L->top.p);
  return iscollectable(o) && !ttisstring(o);
}

/* Freed stacks. A thread's stack is reallocated while it runs (growing for a deep call,
** shrinking in the collector's atomic phase or when coroutine.close resets it), and the old
** block goes back to the allocator with whatever its slots held, live or dead: a luaL_Buffer
** placeholder, or the light userdata a host call pushes, would stay in freed arena memory.
** The allocator layer in lua-bridge/src/bridge/canonical.rs (scrubbing_alloc) sits in front of the
** arena's: a block that may be a stack (at least the smallest stack Lua makes) is scrubbed of
** light userdata when it is freed, and is resized by allocate-copy-scrub-free so the old block
** is scrubbed too. The two helpers below are its C half. Scrubbing zeroes only slots
** tagged as light userdata, reading the rest (no page is written unless one is found); a
** freed block is dead, so changing its bytes changes no behaviour. */
#define LS_MIN_STACK_BYTES (((size_t)BASIC_STACK_SIZE + EXTRA_STACK) * sizeof(StackValue))

/* The smallest block that can be a stack (the allocator layer lives in canonical.rs). */
const size_t luasnap_min_stack_bytes = LS_MIN_STACK_BYTES;

/* Whether any stack-value-sized slot of the block is tagged as a light userdata (reads only). */
int luasnap_has_light(const void *p, size_t size) {
  const StackValue *s = (const StackValue *)p;
  size_t i, n = size / sizeof(StackValue);
  for (i = 0; i < n; i++)
    if (rawtt(s2v(s + i)) == LUA_VLIGHTUSERDATA) return 1;
  return 0;
}

/* Zeroes every StackValue-sized slot of the dead block [p, p + size) tagged as a light
** userdata; reads the rest. Invariant: the block is freed or about to be (nothing reads it). */
void luasnap_scrub_light(void *p, size_t size) {
  StackValue *s = (StackValue *)p;
  size_t i, n = size / sizeof(StackValue);
  for (i = 0; i < n; i++)
    if (rawtt(s2v(s + i)) == LUA_VLIGHTUSERDATA) memset(s + i, 0, sizeof(StackValue));
}

/* ===================== idle-state scrubbing ===================== */

static int luasnap_all_zero(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i;
  for (i = 0; i < n; i++)
    if (b[i] != 0) return 0;
  return 1;
}

/* After a host call, the main thread's dead stack slots and its free CallInfo records still
** hold what the last call left there (setnilvalue rewrites only the tag, and a free CallInfo
** keeps its old function, top and pc). They are arena bytes: a host read between two frames
** (a renderer calling G.digest) would leave the arena different from a run without the read,
** and byte-level checksums (GGRS SyncTest with the arena digest) would mismatch. Zero them:
** dead slots become nil with a zero payload, free CallInfo records all zero but their links.
** Invariant relied on: the thread is idle, so slots at or above L->top and the records after
** L->ci are unused (Lua initializes a record's fields when it takes it for a call). */
void luasnap_scrub_idle_state(lua_State *L) {
  CallInfo *ci;
  /* Dead slots: see luasnap_settle_thread (bytes already zero are not written again, so
  ** untouched pages stay clean for the page tracker). */
  luasnap_settle_thread(L);
  for (ci = L->ci->next; ci != NULL; ci = ci->next) {
    CallInfo *next = ci->next, *previous = ci->previous;
    ci->next = NULL;
    ci->previous = NULL;
    if (!luasnap_all_zero(ci, sizeof(*ci))) memset(ci, 0, sizeof(*ci));
    ci->next = next;
    ci->previous = previous;
  }
}

/* ===================== hostile-file checks for the loader ===================== */

/* The function slot a frame's caller put the function in: for a function with hidden
** varargs (PF_VAHID), 'luaT_adjustvarargs' moved 'func' up past the arguments. */
static int virtual_func(lua_State *co, const luasnap_ci *r) {
  const TValue *f = s2v(co->stack.p + r->func);
  if (!(r->callstatus & CIST_C) && ttisLclosure(f)) {
    const Proto *p = clLvalue(f)->p;
    if (p->flag & PF_VAHID) return r->func - (r->nextraargs + p->numparams + 1);
  }
  return r->func;
}

typedef struct ls_siteidx ls_siteidx;
static const ls_siteidx *ls_sites_of(void *memo, const Proto *p);
static void ls_count_reads(void *memo, size_t n);
static const char *ls_sites_check(const ls_siteidx *x, lua_State *co, const luasnap_ci *r,
                                  const Proto *p);

/* The registers a resumed Lua frame trusts to hold a table: OP_SETLIST writes into R[A]'s
** array without checking its type (the compiler made it with OP_NEWTABLE at the start of the
** constructor). A constructor is straight-line code from its OP_NEWTABLE to its last
** OP_SETLIST, so a SETLIST at or after the resume point whose OP_NEWTABLE for the same
** register is not between the two belongs to a constructor the frame is suspended in: its
** register must hold a table. Returns NULL or a static message. */
static const char *check_constructor_tables(lua_State *co, const luasnap_ci *r) {
  const Proto *p = clLvalue(s2v(co->stack.p + r->func))->p;
  unsigned char made[256];
  int q;
  memset(made, 0, sizeof made);
  for (q = r->pc - 1; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    int a = GETARG_A(ins);
    if (GET_OPCODE(ins) == OP_NEWTABLE) made[a & 0xff] = 1;
    else if (GET_OPCODE(ins) == OP_SETLIST && !made[a & 0xff]) {
      if (r->func + 1 + a >= r->top || !ttistable(s2v(co->stack.p + r->func + 1 + a)))
        return "a table constructor whose table is not a table";
    }
  }
  return NULL;
}

/* The other registers a resumed Lua frame trusts without checking their types:
**   - the control registers of every numeric for loop the frame is suspended inside (the
**     loop's OP_FORLOOP at q jumps back to q + 1 - Bx, so its body is [q + 1 - Bx, q]):
**     OP_FORLOOP updates R[A] and R[A+2] in place with chgivalue/chgfltvalue, which keep the
**     tag (a table there would get a counter as its pointer). Invariant checked: what
**     OP_FORPREP leaves (lvm.c, forprep): with an integer step R[A+1], the count R[A] and the
**     control variable R[A+2] are integers; otherwise all three are floats;
**   - the vararg table of a function that has one (PF_VATAB): OP_VARARG reads register
**     'numparams' with hvalue (luaT_getvarargs). Invariant checked: it holds a table, as
**     OP_VARARGPREP (the first instruction, before any yield) leaves it; the parameter is
**     read-only, so the function's code never changes it.
** Returns NULL or a static message. */
static const char *check_trusted_registers(lua_State *co, const luasnap_ci *r) {
  const Proto *p = clLvalue(s2v(co->stack.p + r->func))->p;
  StkId base = co->stack.p + r->func + 1;
  int at = r->pc - 1;  /* the instruction the frame is suspended in (pc checked >= 1) */
  int q;
  if ((p->flag & PF_VATAB)
      && (r->func + 1 + p->numparams >= r->top || !ttistable(s2v(base + p->numparams))))
    return "a vararg function whose vararg table is not a table";
  for (q = at; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    if (GET_OPCODE(ins) == OP_FORLOOP && q + 1 - GETARG_Bx(ins) <= at) {
      int a = GETARG_A(ins);
      const TValue *count, *step, *ctl;
      if (r->func + 1 + a + 2 >= r->top) return "a numeric for loop outside its frame";
      count = s2v(base + a);
      step = s2v(base + a + 1);
      ctl = s2v(base + a + 2);
      if (ttisinteger(step) ? !(ttisinteger(count) && ttisinteger(ctl))
                            : !(ttisfloat(step) && ttisfloat(count) && ttisfloat(ctl)))
        return "a numeric for loop whose control registers are not the numbers it keeps there";
    }
  }
  return NULL;
}

/* Checks every frame of a suspended coroutine against the instruction (or the C function)
** its caller is suspended in: the callee's function slot and the results it was asked for
** must be exactly those the VM would have used, so that returning, 'luaV_finishOp' and
** 'finishpcall' find the stack as they expect. Invariants, from lvm.c/ldo.c/lbaselib.c of
** 5.5.1:
**   - the first frame is the coroutine's body, at slot 1, called for all results (resume);
**   - a Lua caller at OP_CALL A B C called slot base+A for C-1 results; a Lua callee there
**     runs in the caller's luaV_execute (not fresh);
**   - at OP_TAILCALL A (a C callee: a Lua one replaces the frame) slot base+A, all results;
**   - at OP_TFORCALL A C slot base+A+3 for C results (luaD_call: a fresh Lua callee);
**   - at an instruction that calls a metamethod, the slot at the caller's top ('savestate'
**     sets L->top to ci->top before it), for 1 result (0 for __newindex: luaT_callTM), or for
**     OP_CONCAT A B a slot in base+A+2 .. base+A+B (luaV_concat works down from base+A+B);
**     a Lua callee is fresh;
**   - a C caller is pcall (ctx 0) or xpcall (ctx 2), which call slot func+2 or func+4 for all
**     results and record that slot in u2 (lua_pcallk), and chain the error handler: each
**     saves the previous one and installs none (pcall) or its argument 2 (xpcall);
**   - OP_MMBIN* resumes two instructions in (finishOp reads the one before it).
** Returns NULL or a static message. */
const char *luasnap_check_call_sites(lua_State *co, const luasnap_ci *cis, int nci,
                                     int64_t errfunc, const void *pcall_k, void *memo) {
  int i;
  int64_t handler = -1;  /* the error handler installed by the frames so far */
  int sz = (int)sizeof(StackValue);
  for (i = 0; i < nci; i++) {
    const luasnap_ci *r = &cis[i];
    int wanted = get_nresults(r->callstatus);
    int vf = virtual_func(co, r);
    int callee_lua = !(r->callstatus & CIST_C);
    int fresh = (r->callstatus & CIST_FRESH) != 0;
    if (callee_lua) {
      /* With the load's memo, from the prototype's index (built once per load: linear in
      ** the code and the frames); without one, or for code not as the compiler makes it, by
      ** scanning the code after the resume point (the same answers). */
      const Proto *fp = clLvalue(s2v(co->stack.p + r->func))->p;
      const ls_siteidx *x = memo != NULL ? ls_sites_of(memo, fp) : NULL;
      const char *bad = x != NULL ? ls_sites_check(x, co, r, fp) : NULL;
      if (x == NULL) {
        if (memo != NULL) ls_count_reads(memo, (size_t)(fp->sizecode - r->pc + 1) * 2);
        bad = check_constructor_tables(co, r);
        if (bad == NULL) bad = check_trusted_registers(co, r);
      }
#if defined(LUAI_ASSERT)
      else {  /* the index answers as the scan (builds with Lua's assertions: CI) */
        const char *scan = check_constructor_tables(co, r);
        if (scan == NULL) scan = check_trusted_registers(co, r);
        lua_assert((scan == NULL) == (bad == NULL) && (scan == NULL || strcmp(scan, bad) == 0));
      }
#endif
      if (bad != NULL) return bad;
    }
    if (i == 0) {
      if (vf != 1 || wanted != LUA_MULTRET) return "the first frame is not the coroutine's body";
    }
    else {
      const luasnap_ci *c = &cis[i - 1];
      if (!(c->callstatus & CIST_C)) {
        const Proto *p = clLvalue(s2v(co->stack.p + c->func))->p;
        Instruction ins;
        int ra;
        if (c->pc < 1 || c->pc > p->sizecode) return "a Lua frame resumes outside its code";
        ins = p->code[c->pc - 1];
        ra = c->func + 1 + GETARG_A(ins);
        switch (GET_OPCODE(ins)) {
          case OP_CALL:
            if (vf != ra || wanted != GETARG_C(ins) - 1 || (callee_lua && fresh))
              return "a frame does not match the call its caller is suspended at";
            break;
          case OP_TAILCALL:
            if (vf != ra || wanted != LUA_MULTRET || callee_lua)
              return "a frame does not match the tail call its caller is suspended at";
            break;
          case OP_TFORCALL:
            if (vf != ra + 3 || wanted != GETARG_C(ins) || (callee_lua && !fresh))
              return "a frame does not match the generic-for call its caller is suspended at";
            break;
          case OP_CONCAT:
            if (vf < ra + 2 || vf > ra + GETARG_B(ins) || wanted != 1 || (callee_lua && !fresh))
              return "a frame does not match the concatenation its caller is suspended at";
            break;
          case OP_SETTABUP: case OP_SETTABLE: case OP_SETI: case OP_SETFIELD:
            if (vf != c->top || wanted != 0 || (callee_lua && !fresh))
              return "a frame does not match the metamethod call its caller is suspended at";
            break;
          case OP_LT: case OP_LE: case OP_LTI: case OP_LEI: case OP_GTI: case OP_GEI: case OP_EQ:
            /* finishOp skips or takes the jump that follows */
            if (c->pc >= p->sizecode || GET_OPCODE(p->code[c->pc]) != OP_JMP)
              return "a comparison not followed by its jump";
            goto one_result;
          case OP_MMBIN: case OP_MMBINI: case OP_MMBINK:
            if (c->pc < 2) return "a Lua frame resumes outside its code";
            goto one_result;
          case OP_UNM: case OP_BNOT: case OP_LEN:
          case OP_GETTABUP: case OP_GETTABLE: case OP_GETI: case OP_GETFIELD: case OP_SELF:
          one_result:
            if (vf != c->top || wanted != 1 || (callee_lua && !fresh))
              return "a frame does not match the metamethod call its caller is suspended at";
            break;
          case OP_CLOSE:
            /* luaF_close calls __close of a pending variable at level >= ra with its function
            ** at level + 1 and no results; finishOp repeats OP_CLOSE for the rest. */
            if (vf <= ra || vf > c->top || wanted != 0 || (callee_lua && !fresh))
              return "a frame does not match the __close call its caller is suspended at";
            break;
          case OP_RETURN: {
            /* A return closing variables (k): __close runs above max(frame top, ra + nres);
            ** finishOp sets the top to ra + nres (the saved result count) and repeats the
            ** return. */
            int nres = c->u2;
            int above = ra + nres > c->top ? ra + nres : c->top;
            if (!TESTARG_k(ins) || nres < 0 || vf != above || wanted != 0
                || (callee_lua && !fresh))
              return "a frame does not match the __close call its caller is suspended at";
            break;
          }
          default:
            return "a Lua frame resumes after an instruction that cannot yield";
        }
      }
      else {
        /* A C caller in the middle of the stack: pcall or xpcall (checked by the caller to
        ** have pcall's continuation and CIST_YPCALL). */
        int off = c->ctx == 0 ? 2 : 4;
        if (!(c->callstatus & CIST_YPCALL) || c->k != pcall_k)
          return "an interrupted C frame that is not pcall/xpcall";
        if (vf != c->func + off || wanted != LUA_MULTRET || (callee_lua && !fresh)
            || c->u2 != vf * sz)
          return "a frame does not match the protected call its caller is suspended in";
      }
    }
    if (r->callstatus & CIST_C) {
      if (i < nci - 1) {
        if (!(r->callstatus & CIST_YPCALL) || r->k != pcall_k || (r->ctx != 0 && r->ctx != 2))
          return "an interrupted C frame that is not pcall/xpcall";
        if (r->old_errfunc != handler) return "a protected call saved the wrong error handler";
        handler = r->ctx == 2 ? (int64_t)r->func + 2 : -1;
      }
      else if (r->k != NULL || (r->callstatus & CIST_YPCALL))
        return "the suspended C frame has a continuation";
    }
  }
  if (errfunc != handler) return "the error handler is not the one the frames installed";
  return NULL;
}

/* ----- open upvalues of loaded coroutines -----
** An open upvalue is a pointer into a coroutine's stack that its closures read and write
** without any check. In an honest state it is a local variable of the frame of the function
** that declared it, shared only by closures that function made for that variable; the VM
** trusts that nothing else writes the registers it keeps for itself (table constructors'
** temporaries, a frame's function slot) and that nothing writes the locals the compiler
** refuses assignment to (a numeric for loop's control variable, which OP_FORLOOP updates in
** place with chgivalue; a named vararg table, which OP_VARARG reads as a Table*). The
** loader's rule (luasnap_open_upval_check) rebuilds that invariant for each closure an open
** upvalue of a loaded coroutine is joined to:
**   1. the slot is a register of the Lua frame with the highest function slot below it, and
**      that register holds a local variable active where the frame is suspended (debug
**      information: locvars with startpc <= pc < endpc; the n-th active one is register
**      n - 1, as luaF_getlocalname counts them);
**   2. the frame is not suspended where its upvalues are already closed (a __close call of
**      OP_CLOSE A for r >= A, of a closing OP_RETURN, or a closing OP_TAILCALL), and its
**      function closes its upvalues when it returns (proto_closes: otherwise the upvalue
**      stays open above the stack once the frame returns, and a collection shrinking the
**      stack leaves it dangling);
**   3. the closure's prototype is nested in the frame's function, and its upvalue's
**      descriptor chain (instack = 0 with the index of the enclosing function's upvalue, up
**      to the frame's function's child, with instack = 1) names that register;
**   4. that child (OP_CLOSURE at pc_c in the frame's function) was made while that same
**      variable was active (startpc <= pc_c < endpc), or it is the variable's own recursive
**      local function (localfunc sets startpc just after the OP_CLOSURE storing into it).
** With 3 and 4 the closure's code was compiled for that very variable, so it writes it only
** if the language lets it (lparser.c's check_readonly refuses assignment to const, for-loop
** control and vararg-table variables, in nested functions too: their upvalue descriptors
** carry the variable's kind). Registers that hold no active local (constructor temporaries,
** function slots, arguments being passed) pass neither 1 nor 3. A prototype without debug
** information (a stripped binary chunk) has no locvars: foreign loads refuse open upvalues
** into its frames; own loads check 2 and 3 only. Prototypes are the VM's own (foreign loads
** find them among its live ones), so their code is what Lua's compiler produced. */

/* Whether every return of p closes the upvalues still open in its frame. With a captured
** local (lparser.c: 'needclose'), luaK_finish gives OP_RETURN and OP_TAILCALL the k flag and
** turns OP_RETURN0/OP_RETURN1 into OP_RETURN; without one, a return leaves them open. */
static int proto_closes(const Proto *p) {
  int q;
  for (q = 0; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    switch (GET_OPCODE(ins)) {
      case OP_RETURN0: case OP_RETURN1: return 0;
      case OP_RETURN: case OP_TAILCALL: if (!TESTARG_k(ins)) return 0; break;
      default: break;
    }
  }
  return 1;
}

/* The check's answers, per load, keyed by the full question (kind, two prototypes, two ints):
** each distinct question is computed once per load, whatever order the file asks them in.
** Questions (every key is made of the game's code, never of the file's data):
**   LS_Q_CLOSES   (p)              proto_closes(p): one per prototype;
**   LS_Q_VAR      (p, pc, r)       active_var: at most sizecode * maxstacksize per prototype;
**   LS_Q_CAPTURES (fp, xp, n, r)   captures: xp nested in fp (else not cached: see captures),
**                                  n <= xp's upvalues (<= 255), r < fp's maxstacksize (<= 255);
**   LS_Q_CLOSURE  (p, k)           closure_pc: k < p's sizep;
**   LS_Q_VARTAB   (p)              p's locals index (locals_index; O(p's locvars) memory);
**   LS_Q_CLOSURES (p)              closure_pc's scans of p's code (-1: all its LS_Q_CLOSURE
**                                  answers are in, one per child);
**   LS_Q_PARENT   (x)              x's parent prototype (v) and x's index in its p (val);
**   LS_Q_MAPPED   (x)              the parents of x's whole subtree are in (map_tree);
**   LS_Q_WALKS    (fp)             captures' walks of fp's tree so far (LS_WALKS_BEFORE_MAP);
**   LS_Q_SITES    (p)              the index of p's frame-check registers in m->sites, or -1
**                                  (p's loops are not as the compiler makes them: scan).
** So the number of entries is bounded by the code of the prototypes the load's coroutines run
** (a few per instruction, local and nested prototype; the question kinds also by the calls);
** each prototype's code and locvars are scanned once and each frame function's tree walked
** once per load (the fallbacks for prototypes not as the compiler makes them: once per
** distinct question). The table is
** malloc'd (not the Lua arena: it is the loader's, gone when the load ends:
** luasnap_upmemo_free), open addressing with linear probing, at most half full. Invariant
** the keys rely on: every prototype in them is a loaded frame's function or nested in one,
** or a joined closure's, and the load's object table keeps those closures until the load
** ends, so no key's address is reused for another prototype while the table lives. */
enum {
  LS_Q_NONE, LS_Q_CLOSES, LS_Q_VAR, LS_Q_CAPTURES, LS_Q_CLOSURE, LS_Q_VARTAB,
  LS_Q_CLOSURES, LS_Q_PARENT, LS_Q_MAPPED, LS_Q_WALKS, LS_Q_SITES
};

typedef struct ls_upent {
  const void *a, *b;
  int c, d;
  int kind;  /* LS_Q_NONE: empty slot */
  int val;
  const void *v;  /* LS_Q_PARENT's parent */
} ls_upent;

/* A prototype's locals by register (see locals_index): its locvars indices sorted by register
** (depth: how many locals contain each), then by startpc; off[d] .. off[d + 1] are those of
** register d. NULL in the memo's list: its locvars are not nested that way (checked). */
typedef struct ls_vartab {
  int ndepth;  /* registers with locals: off has ndepth + 1 entries */
  int *off;
  int *byd;
} ls_vartab;

typedef struct ls_upmemo {
  ls_upent *ent;  /* NULL or mask + 1 entries */
  size_t mask, used;
  size_t walks;   /* prototype-tree walks (captures' misses), for tests */
  size_t reads;   /* instructions the frame checks read (index builds, scans), for tests */
  ls_vartab **tabs;  /* locals indexes (LS_Q_VARTAB answers index it), one per prototype */
  size_t ntabs, captabs;
  ls_siteidx **sites;  /* frame-check indexes (LS_Q_SITES answers index it), one per prototype */
  size_t nsites, capsites;
  int nomap;  /* a prototype tree is not a tree (map_tree): captures walks it each time */
} ls_upmemo;

/* Size of the memo luasnap_open_upval_check takes (zeroed by the caller). */
size_t luasnap_upmemo_size(void) { return sizeof(ls_upmemo); }

/* Frees the memo's table (memo zeroed or used by luasnap_open_upval_check) and zeroes it. */
void luasnap_upmemo_free(void *memo) {
  ls_upmemo *m = (ls_upmemo *)memo;
  size_t i;
  free(m->ent);
  for (i = 0; i < m->ntabs; i++) free(m->tabs[i]);
  free(m->tabs);
  for (i = 0; i < m->nsites; i++) free(m->sites[i]);
  free(m->sites);
  memset(m, 0, sizeof(*m));
}

/* Prototype-tree walks the memo's load made so far (a test's work counter). */
size_t luasnap_upmemo_walks(const void *memo) { return ((const ls_upmemo *)memo)->walks; }

/* Instructions the frame checks of the memo's load read so far (a test's work counter). */
size_t luasnap_upmemo_reads(const void *memo) { return ((const ls_upmemo *)memo)->reads; }

static size_t ls_uphash(int kind, const void *a, const void *b, int c, int d) {
  uint64_t h = (uint64_t)(uintptr_t)a * 0x9E3779B97F4A7C15u;
  h ^= (uint64_t)(uintptr_t)b + 0x632BE59BD9B4E019u + (h << 6) + (h >> 2);
  h ^= ((uint64_t)(unsigned)c << 32 | (unsigned)d) + (uint64_t)kind * 0xBF58476D1CE4E5B9u;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBu;
  h ^= h >> 29;
  return (size_t)h;
}

/* The slot of the question (its entry, or the empty slot where it goes); m->ent non-NULL. */
static ls_upent *ls_upslot(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d) {
  size_t i = ls_uphash(kind, a, b, c, d) & m->mask;
  for (;; i = (i + 1) & m->mask) {
    ls_upent *e = &m->ent[i];
    if (e->kind == LS_Q_NONE
        || (e->kind == kind && e->a == a && e->b == b && e->c == c && e->d == d))
      return e;
  }
}

/* Whether the answer is known (then *val is it). */
static int ls_upget(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d,
                    int *val) {
  ls_upent *e;
  if (m->ent == NULL) return 0;
  e = ls_upslot(m, kind, a, b, c, d);
  if (e->kind == LS_Q_NONE) return 0;
  *val = e->val;
  return 1;
}

/* Records an answer not yet known; 0 if the table cannot grow (out of memory). Invariant
** kept: used <= (mask + 1) / 2, so probes end at an empty slot. */
static int ls_upput(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d,
                    int val) {
  ls_upent *e;
  if (m->ent == NULL || 2 * (m->used + 1) > m->mask + 1) {
    size_t n = (m->ent == NULL) ? 64 : 2 * (m->mask + 1), i;
    ls_upmemo g;
    if (n > SIZE_MAX / 2 / sizeof(ls_upent)) return 0;
    g.ent = (ls_upent *)calloc(n, sizeof(ls_upent));  /* kind 0: LS_Q_NONE */
    if (g.ent == NULL) return 0;
    g.mask = n - 1;
    g.used = m->used;
    g.walks = m->walks;
    g.reads = m->reads;
    g.tabs = m->tabs;
    g.ntabs = m->ntabs;
    g.captabs = m->captabs;
    g.sites = m->sites;
    g.nsites = m->nsites;
    g.capsites = m->capsites;
    g.nomap = m->nomap;
    for (i = 0; m->ent != NULL && i <= m->mask; i++) {
      ls_upent *o = &m->ent[i];
      if (o->kind != LS_Q_NONE) *ls_upslot(&g, o->kind, o->a, o->b, o->c, o->d) = *o;
    }
    free(m->ent);
    *m = g;
  }
  e = ls_upslot(m, kind, a, b, c, d);
  e->kind = kind; e->a = a; e->b = b; e->c = c; e->d = d; e->val = val; e->v = NULL;
  m->used++;
  return 1;
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

/* Finds the path from root down to the nested prototype target (path[0] = root); returns its
** length, or 0 if target is not nested in root. Lua nests functions at most LUAI_MAXCCALLS
** (200) deep; deeper paths (none) are not followed. */
static int proto_path(const Proto *root, const Proto *target, const Proto **path, int depth) {
  int i;
  if (depth >= 250) return 0;
  path[depth] = root;
  if (root == target) return depth + 1;
  for (i = 0; i < root->sizep; i++) {
    int len = proto_path(root->p[i], target, path, depth + 1);
    if (len > 0) return len;
  }
  return 0;
}

/* Records the parent and index of every prototype in x's subtree (x at depth `depth` of the
** walk), once per load for each subtree. Sets m->nomap if the prototypes do not form a tree
** (a prototype in two places) or nest 250 deep (Lua nests functions at most 200 deep), so
** captures keeps proto_path's answers exactly. Returns 0 if out of memory. */
static int map_tree(ls_upmemo *m, const Proto *x, int depth) {
  int i, val;
  if (m->nomap || ls_upget(m, LS_Q_MAPPED, x, NULL, 0, 0, &val)) return 1;
  if (depth >= 250) {
    m->nomap = 1;
    return 1;
  }
  for (i = 0; i < x->sizep; i++) {
    const Proto *c = x->p[i];
    if (ls_upget(m, LS_Q_PARENT, c, NULL, 0, 0, &val)) {
      if (val != i || ls_upslot(m, LS_Q_PARENT, c, NULL, 0, 0)->v != (const void *)x) {
        m->nomap = 1;  /* c is in two places */
        return 1;
      }
    } else {
      if (!ls_upput(m, LS_Q_PARENT, c, NULL, 0, 0, i)) return 0;
      ls_upslot(m, LS_Q_PARENT, c, NULL, 0, 0)->v = x;
    }
    if (!map_tree(m, c, depth + 1)) return 0;
  }
  return ls_upput(m, LS_Q_MAPPED, x, NULL, 0, 0, 0);
}

/* proto_path by the parents map_tree recorded: the path from root down to target, or 0. Its
** answer is proto_path's when the prototypes form a tree (m->nomap unset): the one path, if
** target is at most 249 levels under root. */
static int proto_path_mapped(ls_upmemo *m, const Proto *root, const Proto *target,
                             const Proto **path) {
  const Proto *up[250];
  const Proto *x = target;
  int n = 0, j, val;
  while (x != root) {
    if (n >= 249 || !ls_upget(m, LS_Q_PARENT, x, NULL, 0, 0, &val)) return 0;
    up[n++] = x;
    x = (const Proto *)ls_upslot(m, LS_Q_PARENT, x, NULL, 0, 0)->v;
  }
  path[0] = root;
  for (j = 0; j < n; j++) path[j + 1] = up[n - 1 - j];
  return n + 1;
}

/* captures walks fp's tree (proto_path) for its first LS_WALKS_BEFORE_MAP distinct questions
** (a few: honest coroutines ask one or two per frame function), then maps it (map_tree: more
** memory and time than one walk, less than many). */
#define LS_WALKS_BEFORE_MAP 4

/* Rule 3: the index of fp's child through which upvalue n of a closure of xp names register
** r of fp's frame, or -1; -2 if out of memory. Answers for xp nested in fp are kept (their
** number is bounded by the code); a refusal for xp not nested in fp is not (the pair would be
** the file's choice, and the load ends with that refusal anyway). The path from fp to xp
** comes from the parents map_tree records (fp's tree walked once per load), or from a walk
** (proto_path) if the prototypes are not a tree. */
static int captures(ls_upmemo *m, const Proto *fp, const Proto *xp, int n, int r) {
  const Proto *path[256];
  int len, j, k = -1, mapped;
  const Upvaldesc *d;
  if (ls_upget(m, LS_Q_CAPTURES, fp, xp, n, r, &k)) return k;
  mapped = ls_upget(m, LS_Q_MAPPED, fp, NULL, 0, 0, &j);
  if (!mapped && !m->nomap) {
    int walked = 0;
    if (!ls_upget(m, LS_Q_WALKS, fp, NULL, 0, 0, &walked)
        && !ls_upput(m, LS_Q_WALKS, fp, NULL, 0, 0, 0))
      return -2;
    if (walked < LS_WALKS_BEFORE_MAP) {
      ls_upslot(m, LS_Q_WALKS, fp, NULL, 0, 0)->val = walked + 1;
      mapped = -1;  /* walk this time */
    } else {
      m->walks++;
      if (!map_tree(m, fp, 0)) return -2;
    }
  }
  if (m->nomap || mapped == -1) {
    m->walks++;
    len = proto_path(fp, xp, path, 0);
  } else {
    len = proto_path_mapped(m, fp, xp, path);
  }
  if (len >= 2 && n >= 1 && n <= xp->sizeupvalues) {
    d = &xp->upvalues[n - 1];
    for (j = len - 1; j > 1 && !d->instack && d->idx < path[j - 1]->sizeupvalues; j--)
      d = &path[j - 1]->upvalues[d->idx];
    if (j == 1 && d->instack && d->idx == r) {
      if (!m->nomap && mapped != -1) {  /* path[1], fp's child in one place: index recorded */
        if (!ls_upget(m, LS_Q_PARENT, path[1], NULL, 0, 0, &k)) k = -1;
      } else {
        for (k = 0; k < fp->sizep && fp->p[k] != path[1]; k++) {}
        if (k == fp->sizep) k = -1;
      }
    }
  }
  if (len >= 2 && !ls_upput(m, LS_Q_CAPTURES, fp, xp, n, r, k)) return -2;
  return k;
}

/* The pc of the first OP_CLOSURE that makes child k of p, or -1; -2 if out of memory. The
** first LS_WALKS_BEFORE_MAP distinct questions about p scan its code up to the answer; the
** next one records the first OP_CLOSURE of every child in one scan (LS_Q_CLOSURES: the scans
** so far, -1 once all are recorded). */
static int closure_pc(ls_upmemo *m, const Proto *p, int k) {
  int q, at = -1, done = 0;
  if (ls_upget(m, LS_Q_CLOSURE, p, NULL, k, 0, &at)) return at;
  if (!ls_upget(m, LS_Q_CLOSURES, p, NULL, 0, 0, &done)
      && !ls_upput(m, LS_Q_CLOSURES, p, NULL, 0, 0, 0))
    return -2;
  if (done < 0) return -1;
  if (done < LS_WALKS_BEFORE_MAP) {
    ls_upslot(m, LS_Q_CLOSURES, p, NULL, 0, 0)->val = done + 1;
    for (q = 0; q < p->sizecode; q++)
      if (GET_OPCODE(p->code[q]) == OP_CLOSURE && GETARG_Bx(p->code[q]) == k) {
        at = q;
        break;
      }
    return ls_upput(m, LS_Q_CLOSURE, p, NULL, k, 0, at) ? at : -2;
  }
  for (q = 0; q < p->sizecode; q++)
    if (GET_OPCODE(p->code[q]) == OP_CLOSURE) {
      int c = GETARG_Bx(p->code[q]);
      if (!ls_upget(m, LS_Q_CLOSURE, p, NULL, c, 0, &done)
          && !ls_upput(m, LS_Q_CLOSURE, p, NULL, c, 0, q))
        return -2;
    }
  ls_upslot(m, LS_Q_CLOSURES, p, NULL, 0, 0)->val = -1;
  return ls_upget(m, LS_Q_CLOSURE, p, NULL, k, 0, &at) ? at : -1;
}

/* Rule 1 by a scan: the locvar active in register r of p at pc, or -1: the (r + 1)-th of
** p's locvars (in order, stopping at the first with startpc > pc) with startpc <= pc < endpc,
** as luaF_getlocalname counts them (see tbc_in_scope). 0 <= r < 256. */
static int active_var_scan(const Proto *p, int pc, int r) {
  int i, n = 0;
  for (i = 0; i < p->sizelocvars && p->locvars[i].startpc <= pc; i++)
    if (pc < p->locvars[i].endpc) {
      if (n == r) return i;
      n++;
    }
  return -1;
}

/* Builds p's locals index, or NULL (*oom set if out of memory) when p's locvars are not
** nested as Lua's compiler makes them: startpc never decreasing, and each nonempty one either
** inside every earlier one that is still open at its startpc (startpc < endpc) or after it.
** Then the locals active at any pc are a chain, each inside the ones before it, so the one in
** register d (the (d + 1)-th active, active_var_scan) is the one with d earlier locals
** containing it (its depth) whose range holds pc; those of one depth do not overlap and are
** sorted by startpc. O(p's locvars). */
static ls_vartab *locals_index(const Proto *p, int *oom) {
  int L = p->sizelocvars, i, top = 0, ndepth = 0;
  int *depth, *stack, *fill;
  ls_vartab *t = NULL;
  *oom = 0;
  for (i = 1; i < L; i++)
    if (p->locvars[i].startpc < p->locvars[i - 1].startpc) return NULL;
  depth = (int *)malloc(2 * (size_t)(L > 0 ? L : 1) * sizeof(int));
  if (depth == NULL) {
    *oom = 1;
    return NULL;
  }
  stack = depth + L;
  for (i = 0; i < L; i++) {
    const LocVar *v = &p->locvars[i];
    depth[i] = -1;  /* empty: never active */
    if (v->startpc >= v->endpc) continue;
    while (top > 0 && p->locvars[stack[top - 1]].endpc <= v->startpc) top--;
    if (top > 0 && v->endpc > p->locvars[stack[top - 1]].endpc) {
      free(depth);
      return NULL;  /* overlaps an earlier one without being inside it */
    }
    if (top < 256) {  /* registers above 255 are never asked */
      depth[i] = top;
      if (top + 1 > ndepth) ndepth = top + 1;
    }
    stack[top++] = i;
  }
  t = (ls_vartab *)malloc(sizeof(ls_vartab) + ((size_t)ndepth + 1 + (size_t)L) * sizeof(int));
  if (t == NULL) {
    free(depth);
    *oom = 1;
    return NULL;
  }
  t->ndepth = ndepth;
  t->off = (int *)(t + 1);
  t->byd = t->off + ndepth + 1;
  for (i = 0; i <= ndepth; i++) t->off[i] = 0;
  for (i = 0; i < L; i++)
    if (depth[i] >= 0) t->off[depth[i] + 1]++;
  for (i = 0; i < ndepth; i++) t->off[i + 1] += t->off[i];
  fill = stack;  /* reused: next free place per depth */
  for (i = 0; i < ndepth; i++) fill[i] = t->off[i];
  for (i = 0; i < L; i++)
    if (depth[i] >= 0) t->byd[fill[depth[i]]++] = i;
  free(depth);
  return t;
}

/* Rule 1: the locvar active in register r of p at pc, or -1 (active_var_scan's answer);
** -2 if out of memory. 0 <= r < 256. O(log locvars) with p's locals index, built on p's first
** question; a prototype whose locvars are not nested as the compiler makes them (a binary
** chunk's) answers each distinct question by a scan, once. */
static int active_var(ls_upmemo *m, const Proto *p, int pc, int r) {
  int ti, var = -1, oom;
  const ls_vartab *t;
  if (!ls_upget(m, LS_Q_VARTAB, p, NULL, 0, 0, &ti)) {
    ls_vartab *nt = locals_index(p, &oom);
    if (oom) return -2;
    ti = -1;
    if (nt != NULL) {
      if (m->ntabs == m->captabs) {
        size_t cap = m->captabs ? 2 * m->captabs : 16;
        ls_vartab **g = (cap <= SIZE_MAX / sizeof(*g) && cap <= INT_MAX)
                            ? (ls_vartab **)realloc(m->tabs, cap * sizeof(*g)) : NULL;
        if (g == NULL) {
          free(nt);
          return -2;
        }
        m->tabs = g;
        m->captabs = cap;
      }
      ti = (int)m->ntabs;
      m->tabs[m->ntabs++] = nt;
    }
    if (!ls_upput(m, LS_Q_VARTAB, p, NULL, 0, 0, ti)) return -2;
  }
  if (ti < 0) {  /* not nested as compiled: the scan, once per question */
    if (ls_upget(m, LS_Q_VAR, p, NULL, pc, r, &var)) return var;
    var = active_var_scan(p, pc, r);
    if (!ls_upput(m, LS_Q_VAR, p, NULL, pc, r, var)) return -2;
    return var;
  }
  t = m->tabs[ti];
  if (r < t->ndepth) {
    int lo = t->off[r], hi = t->off[r + 1];  /* last one of depth r starting at or before pc */
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (p->locvars[t->byd[mid]].startpc <= pc) lo = mid;
      else hi = mid;
    }
    if (lo < t->off[r + 1]) {
      const LocVar *v = &p->locvars[t->byd[lo]];
      if (v->startpc <= pc && pc < v->endpc) var = t->byd[lo];
    }
  }
  /* Invariant the index relies on (checked by locals_index), tested in assertion builds. */
  lua_assert(var == active_var_scan(p, pc, r));
  return var;
}

/* ----- frame checks by index -----
** check_constructor_tables and check_trusted_registers scan a frame's function from where it
** is suspended to its end: frames x code size per load, which a forged save with thousands of
** frames in one large function (or thousands of coroutines suspended in it) turns into
** seconds. The index answers the same questions per frame in O(registers x log code), built
** once per prototype per load in O(code):
**   - constructors: for each register that some OP_SETLIST writes, the positions of the
**     OP_NEWTABLE and OP_SETLIST instructions with that register (ascending; bit 0 set for a
**     SETLIST). A frame suspended at `at` must hold a table in register a iff the first such
**     instruction at or after `at` is a SETLIST: exactly the scan's rule (a SETLIST whose
**     NEWTABLE for the register is not between `at` and it);
**   - loops: for each register, the bodies [s, q] of the OP_FORLOOPs at q with that register
**     (s = q + 1 - Bx), sorted by s. The compiler gives loops at one level the same register
**     one after another and nested loops other registers, so one register's bodies never
**     overlap; then the loop enclosing `at` for register a, if any, is the last body starting
**     at or before `at`. Invariant checked when building: the bodies of each register are
**     disjoint; otherwise (a binary chunk's code) the index is not used and the frame scan
**     runs, with the same answers. */
struct ls_siteidx {
  int ncreg, nlreg;
  lu_byte creg[256], lreg[256];
  int coff[257], loff[257];
  int *cev;         /* constructors' events: position << 1 | (1 for OP_SETLIST) */
  int64_t *lev;     /* loops: s * 2^32 + q, sorted (s may be negative, q < 2^31) */
};

static int ls_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Builds p's index (malloc'd); NULL and *oom = 0 when a register's loop bodies overlap, NULL
** and *oom = 1 when out of memory. */
static ls_siteidx *ls_sites_build(const Proto *p, int *oom) {
  int ncnt[256], lcnt[256], fill[256];
  lu_byte setl[256];
  int q, i, nc = 0, nl = 0;
  ls_siteidx *x;
  *oom = 0;
  memset(ncnt, 0, sizeof ncnt);
  memset(lcnt, 0, sizeof lcnt);
  memset(setl, 0, sizeof setl);
  for (q = 0; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    int a = GETARG_A(ins) & 0xff;
    switch (GET_OPCODE(ins)) {
      case OP_NEWTABLE: ncnt[a]++; break;
      case OP_SETLIST: ncnt[a]++; setl[a] = 1; break;
      case OP_FORLOOP:
        if ((int64_t)q + 1 - (int64_t)GETARG_Bx(ins) <= q) { lcnt[a]++; nl++; }  /* a body */
        break;
      default: break;
    }
  }
  for (i = 0; i < 256; i++)
    if (setl[i]) nc += ncnt[i];
  x = (ls_siteidx *)malloc(sizeof *x + (size_t)nl * sizeof(int64_t) + (size_t)nc * sizeof(int));
  if (x == NULL) { *oom = 1; return NULL; }
  x->lev = (int64_t *)(x + 1);
  x->cev = (int *)(x->lev + nl);
  x->ncreg = x->nlreg = 0;
  x->coff[0] = x->loff[0] = 0;
  for (i = 0; i < 256; i++) {
    fill[i] = -1;
    if (setl[i]) {
      x->creg[x->ncreg] = (lu_byte)i;
      x->coff[x->ncreg + 1] = x->coff[x->ncreg] + ncnt[i];
      fill[i] = x->coff[x->ncreg++];
    }
  }
  for (q = 0; q < p->sizecode; q++) {  /* in code order: each register's events ascending */
    Instruction ins = p->code[q];
    OpCode op = GET_OPCODE(ins);
    int a = GETARG_A(ins) & 0xff;
    if ((op == OP_NEWTABLE || op == OP_SETLIST) && fill[a] >= 0)
      x->cev[fill[a]++] = q << 1 | (op == OP_SETLIST);
  }
  for (i = 0; i < 256; i++) {
    fill[i] = -1;
    if (lcnt[i]) {
      x->lreg[x->nlreg] = (lu_byte)i;
      x->loff[x->nlreg + 1] = x->loff[x->nlreg] + lcnt[i];
      fill[i] = x->loff[x->nlreg++];
    }
  }
  for (q = 0; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    if (GET_OPCODE(ins) == OP_FORLOOP) {
      int64_t start = (int64_t)q + 1 - (int64_t)GETARG_Bx(ins);
      if (start <= q) x->lev[fill[GETARG_A(ins) & 0xff]++] = start * ((int64_t)1 << 32) + q;
    }
  }
  for (i = 0; i < x->nlreg; i++) {
    int64_t *e = x->lev + x->loff[i];
    int j, n = x->loff[i + 1] - x->loff[i];
    qsort(e, (size_t)n, sizeof *e, ls_cmp_i64);
    for (j = 1; j < n; j++)  /* s of the next body after q of this one */
      if ((e[j] >> 32) <= (int32_t)(e[j - 1] & 0xffffffff)) { free(x); return NULL; }
  }
  return x;
}

static void ls_count_reads(void *memo, size_t n) { ((ls_upmemo *)memo)->reads += n; }

/* p's index from the load's memo (built on first use), or NULL: out of memory, or p's loops
** not as the compiler makes them (the caller then scans). */
static const ls_siteidx *ls_sites_of(void *memo, const Proto *p) {
  ls_upmemo *m = (ls_upmemo *)memo;
  int xi, oom;
  if (!ls_upget(m, LS_Q_SITES, p, NULL, 0, 0, &xi)) {
    ls_siteidx *nx = ls_sites_build(p, &oom);
    m->reads += (size_t)p->sizecode;
    if (oom) return NULL;
    xi = -1;
    if (nx != NULL) {
      if (m->nsites == m->capsites) {
        size_t cap = m->capsites ? 2 * m->capsites : 16;
        ls_siteidx **g = (cap <= SIZE_MAX / sizeof(*g) && cap <= INT_MAX)
                             ? (ls_siteidx **)realloc(m->sites, cap * sizeof(*g)) : NULL;
        if (g == NULL) {
          free(nx);
          return NULL;
        }
        m->sites = g;
        m->capsites = cap;
      }
      xi = (int)m->nsites;
      m->sites[m->nsites++] = nx;
    }
    if (!ls_upput(m, LS_Q_SITES, p, NULL, 0, 0, xi)) return NULL;
  }
  return xi < 0 ? NULL : m->sites[xi];
}

/* check_constructor_tables, then check_trusted_registers, for the frame r of the function p
** (the same answers, the same message when several apply: for loops, the one of the first
** failing loop in code order, as the scan finds it). */
static const char *ls_sites_check(const ls_siteidx *x, lua_State *co, const luasnap_ci *r,
                                  const Proto *p) {
  StkId base = co->stack.p + r->func + 1;
  int at = r->pc - 1;  /* the instruction the frame is suspended in (pc checked >= 1) */
  int i, bestq = INT_MAX;
  const char *best = NULL;
  for (i = 0; i < x->ncreg; i++) {
    const int *e = x->cev + x->coff[i];
    int lo = 0, hi = x->coff[i + 1] - x->coff[i];
    int n = hi, a = x->creg[i];
    while (lo < hi) {  /* the first event at or after at */
      int mid = lo + (hi - lo) / 2;
      if ((e[mid] >> 1) < at) lo = mid + 1;
      else hi = mid;
    }
    if (lo < n && (e[lo] & 1)
        && (r->func + 1 + a >= r->top || !ttistable(s2v(base + a))))
      return "a table constructor whose table is not a table";
  }
  if ((p->flag & PF_VATAB)
      && (r->func + 1 + p->numparams >= r->top || !ttistable(s2v(base + p->numparams))))
    return "a vararg function whose vararg table is not a table";
  for (i = 0; i < x->nlreg; i++) {
    const int64_t *e = x->lev + x->loff[i];
    int lo = 0, hi = x->loff[i + 1] - x->loff[i];
    int a = x->lreg[i], q;
    const char *bad = NULL;
    while (lo < hi) {  /* the first body starting after at */
      int mid = lo + (hi - lo) / 2;
      if ((e[mid] >> 32) <= at) lo = mid + 1;
      else hi = mid;
    }
    if (lo == 0) continue;
    q = (int)(e[lo - 1] & 0xffffffff);
    if (q < at) continue;  /* the last body starting at or before at ends before it */
    if (r->func + 1 + a + 2 >= r->top) bad = "a numeric for loop outside its frame";
    else {
      const TValue *count = s2v(base + a), *step = s2v(base + a + 1), *ctl = s2v(base + a + 2);
      if (ttisinteger(step) ? !(ttisinteger(count) && ttisinteger(ctl))
                            : !(ttisfloat(step) && ttisfloat(count) && ttisfloat(ctl)))
        bad = "a numeric for loop whose control registers are not the numbers it keeps there";
    }
    if (bad != NULL && q < bestq) { bestq = q; best = bad; }
  }
  return best;
}

/* Checks that the Lua closure at idx may have its upvalue n open at slot `level` of the loaded
** coroutine co (rules 1-4 above), co's frames being frames[0..nframes) (luasnap_thread_frames,
** taken when its frames were restored; co has not run since: the loader keeps it unresumable
** until the load ends, and this checks it was not reset). `strict` (foreign loads) refuses
** frames without debug information. `memo` is luasnap_upmemo_size() bytes, zeroed before the
** first call for a load and given to luasnap_upmemo_free when the load ends. O(log frames)
** + log locals per call, plus, the first time the load asks about a prototype (see
** ls_upmemo), a scan of the frame's function (its locals or code) or a walk of its nested
** prototypes. Reads only Lua's
** state. Returns NULL or why the upvalue is refused (LS_UPMEMO_OOM: the memo's table could
** not grow). */
#define LS_UPMEMO_OOM \
  "out of memory for the open-upvalue check's tables (the process cannot allocate; free memory and load again)"
const char *luasnap_open_upval_check(lua_State *L, int idx, int n, lua_State *co, int level,
                                     const void *const *frames, int nframes, int strict,
                                     void *memo) {
  ls_upmemo *m = (ls_upmemo *)memo;
  const TValue *o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
  const LClosure *cl;
  const CallInfo *ci;
  const Proto *p;
  int lo = 0, hi = nframes, r, pc, var, k, closes;
  Instruction ins;
  if (!ttisLclosure(o)) return "internal: an open upvalue of something else than a Lua closure";
  cl = clLvalue(o);
  if (n < 1 || n > cl->nupvalues) return "internal: no such upvalue";
  if (co->status != LUA_ERRERR || nframes < 1 || co->ci != (const CallInfo *)frames[nframes - 1])
    return "an open upvalue into a coroutine that load-time code reset";
  if (level < 1 || level >= (int)(co->top.p - co->stack.p))
    return "an open upvalue outside its coroutine's stack";
  /* The frame with the highest function slot below level (frames ascend: restore checks). */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (((const CallInfo *)frames[mid])->func.p - co->stack.p < level) lo = mid;
    else hi = mid;
  }
  ci = (const CallInfo *)frames[lo];
  if (ci->func.p - co->stack.p >= level || !isLua(ci))
    return "an open upvalue outside the local variables of its coroutine's Lua frames";
  p = clLvalue(s2v(ci->func.p))->p;
  r = level - (int)(ci->func.p - co->stack.p) - 1;
  if (r >= p->maxstacksize)
    return "an open upvalue outside the local variables of its coroutine's Lua frames";
  pc = (int)(ci->u.l.savedpc - p->code) - 1;  /* restored: 0 <= pc < sizecode */
  ins = p->code[pc];
  if ((GET_OPCODE(ins) == OP_CLOSE && r >= GETARG_A(ins))
      || ((GET_OPCODE(ins) == OP_RETURN || GET_OPCODE(ins) == OP_TAILCALL) && TESTARG_k(ins)))
    return "an open upvalue in a frame suspended where it has closed its upvalues";
  if (!ls_upget(m, LS_Q_CLOSES, p, NULL, 0, 0, &closes)) {
    closes = proto_closes(p);
    if (!ls_upput(m, LS_Q_CLOSES, p, NULL, 0, 0, closes)) return LS_UPMEMO_OOM;
  }
  if (!closes)
    return "an open upvalue in a frame whose function does not close its upvalues when it returns";
  var = -1;
  if (p->sizelocvars == 0) {
    if (strict)
      return "an open upvalue into a frame of a function without debug information (stripped): foreign loads cannot check which local it is";
  } else {
    var = active_var(m, p, pc, r);
    if (var == -2) return LS_UPMEMO_OOM;
    if (var < 0)
      return "an open upvalue on a register that holds no local variable where its frame is suspended";
  }
  k = captures(m, p, cl->p, n, r);
  if (k == -2) return LS_UPMEMO_OOM;
  if (k < 0)
    return "an open upvalue shared by a closure whose function cannot capture that local (not nested in the frame's function with an upvalue for it)";
  if (var >= 0) {
    const LocVar *v = &p->locvars[var];
    int at = closure_pc(m, p, k);
    if (at == -2) return LS_UPMEMO_OOM;
    if (at < 0 || !((v->startpc <= at && at < v->endpc)
                    || (at + 1 == v->startpc && GETARG_A(p->code[at]) == r)))
      return "an open upvalue shared by a closure made for another variable of that register";
  }
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

/* Stops (on > 0) or allows (on == 0) emergency collections, or only asks (on < 0); returns
** whether they were stopped. While a load resolves prototypes through raw pointers, no
** collection may run behind its back; it re-allows them at the end, and stops them again after
** any Lua code it called (a collection there invalidates what it looked up, and resets the
** flag). A persist stops them too: it keeps objects' addresses (ids, scanned batches) that a
** collection clearing a weak table could free. */
int luasnap_gc_stopem(lua_State *L, int on) {
  int old = G(L)->gcstopem;
  if (on >= 0) G(L)->gcstopem = on ? 1 : 0;
  return old;
}

/* Marks (on != 0) or unmarks the state as one where no object may be marked for finalization,
** returning whether it was marked. A foreign load without finalizers marks it for the whole
** load: luaC_checkfinalizer marks nothing while GCSTPCLS is set (lgc.c: "no extra finalizers
** after here", as when a state closes), so a metatable with __gc that a registered
** constructor sets (setmetatable with a class from the file's upvalues) gives no finalizer
** either, not only those the loader sets and refuses. Invariant kept: nothing else runs with
** the bit: lua_gc ignores every call while it is set (the load has stopped the collector
** before, and restarts it after unmarking). */
int luasnap_gc_nofinal(lua_State *L, int on) {
  global_State *g = G(L);
  int was = (g->gcstp & GCSTPCLS) != 0;
  if (on) g->gcstp |= GCSTPCLS;
  else g->gcstp &= (lu_byte)~GCSTPCLS;
  return was;
}

/* Marks the table or full userdata on top for finalization if its metatable has __gc now,
** as setmetatable would have with that metatable (luaC_checkfinalizer: nothing for an object
** already marked, a metatable without __gc, or while GCSTPCLS is set, as in loads without
** finalizers). For the loader: an object whose metatable was still being built when it was
** set (a class that is its own metatable gets its __gc after). */
void luasnap_recheck_finalizer(lua_State *L) {
  const TValue *o = s2v(L->top.p - 1);
  Table *mt;
  if (ttistable(o)) mt = hvalue(o)->metatable;
  else if (ttisfulluserdata(o)) mt = uvalue(o)->metatable;
  else return;
  if (mt != NULL) luaC_checkfinalizer(L, gcvalue(o), mt);
}

/* luaL_checkstack for the serializer: room for n more values, else an error that says why.
** luaL_checkstack reports "stack overflow (msg)" whether the stack is at Lua's limit or its
** growth failed for want of memory; a load or save under a memory cap then reads as a stack
** overflow. Invariant used: below LUAI_MAXSTACK slots a failed growth is a memory failure
** (LS_MAXSTACK: luaD_growstack refuses only sizes over it, and fails otherwise only when the
** reallocation does). */
void luasnap_checkstack(lua_State *L, int n, const char *msg) {
  if (lua_checkstack(L, n)) return;
  if ((L->top.p - L->stack.p) + n + EXTRA_STACK <= LS_MAXSTACK) luaM_error(L);
  luaL_error(L, "stack overflow (%s)", msg);
}

/* Raises Lua's memory error, as an allocation failing would (for the loader, when restoring
** a coroutine's stack or frames ran out of memory). */
l_noret luasnap_raise_memerr(lua_State *L) {
  luaM_error(L);
}

/* Bytes the VM has allocated (for a load's heap-growth cap). */
uint64_t luasnap_heap_bytes(lua_State *L) {
  return (uint64_t)gettotalbytes(G(L));
}

/* Whether the function at idx is a C function (light or closure) with this pointer. */
int luasnap_is_cfunction(lua_State *L, int idx, const void *f) {
  const TValue *o = (idx > 0) ? s2v(L->ci->func.p + idx) : s2v(L->top.p + idx);
  if (ttislcf(o)) return (const void *)fvalue(o) == f;
  if (ttisCclosure(o)) return (const void *)clCvalue(o)->f == f;
  return 0;
}

/* ===================== pending to-be-closed variables of a suspended coroutine =====================
** A coroutine's pending <close> variables are a list threaded through its stack (lfunc.c):
** L->tbclist.p is the newest; each entry's tbclist.delta is the distance to the previous one
** (0 marks a dummy node, for distances beyond MAXDELTA); the list ends at L->stack.p. Saves
** record the entries as stack offsets; loads rebuild the list as luaF_newtbcupval does. */

#include <limits.h>
#include "ltm.h"

#define LS_MAXDELTA USHRT_MAX  /* lfunc.c's MAXDELTA */

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

/* ------------------------------------------------------------------------------------------
** Iteration order across save and load (docs/save-games.md, "Iteration order").
** `next` visits a table's array part, then its nodes by index. A hash part's layout (which
** node each key sits in, the collision chains, and where insertions look for free nodes next)
** depends on the table's history, not only on its keys, so a loader that inserts the keys
** anew may order them differently. For tables whose keys are numbers, booleans and strings
** (positions that depend on the key's contents and the VM's hash seed, not on addresses) the
** save records the layout and the loader puts every entry back in its node.
**
** A live key's identity in the layout is its rank r among the table's live hash keys in
** `keycmp` order, which saver and loader compute alike: the loader needs no key twice.
** ------------------------------------------------------------------------------------------ */

/* Mirrors ltable.c (5.5.1): hash parts of 2^LIMFORLAST nodes or more keep 'lastfree' (where
** insertions look for a free node next, downwards) in a Limbox just before the node array;
** smaller ones search from the end. */
#define LS_LIMFORLAST 3
typedef struct { Node *dummy; Node follows_pNode; } ls_Limbox_aux;
typedef union {
  Node *lastfree;
  char padding[offsetof(ls_Limbox_aux, follows_pNode)];
} ls_Limbox;
#define ls_haslastfree(t) ((t)->lsizenode >= LS_LIMFORLAST)
#define ls_getlastfree(t) ((cast(ls_Limbox *, (t)->node) - 1)->lastfree)

#include "lmem.h"

/* Sizes up to which new_sized_table builds the parts itself; bigger ones (the loader caps
** size hints by what the rest of the file can hold: only files over 32 MB ask for them) go
** through luaH_resize, which refuses what Lua refuses. */
#define LS_DIRECT_MAX (1u << 24)

/* Pushes a new table with na array slots and room for nh hash entries (rounded up to a power
** of 2), as lua_createtable(L, na, nh) makes it, but without luaH_resize's general path: a new
** table has no entries to move, so its parts are allocated at their final sizes and cleared
** once (mirrors setnodevector and resizearray of ltable.c, 5.5.1). For the loader's build
** helper, which makes a table per LS_NEWTABLE step. Raises like lua_createtable (memory).
** Invariant kept: the table is valid before each allocation that may raise or collect (it is
** anchored on the stack; first with the dummy hash part and no array, then with its cleared
** hash part), and every node is empty with no chain, lastfree at the end, when it is linked. */
static void new_sized_table(lua_State *L, unsigned int na, unsigned int nh) {
  Table *t = luaH_new(L);
  sethvalue2s(L, L->top.p, t);
  L->top.p++;
  if (na > LS_DIRECT_MAX || nh > LS_DIRECT_MAX) {
    luaH_resize(L, t, na, nh);
  }
  else {
    if (nh > 0) {
      int lsize = luaO_ceillog2(nh);
      unsigned int size = 1u << lsize, j;
      Node *node;
      if (lsize < LS_LIMFORLAST) node = luaM_newvector(L, size, Node);
      else {
        char *b = luaM_newblock(L, size * sizeof(Node) + sizeof(ls_Limbox));
        node = cast(Node *, b + sizeof(ls_Limbox));
      }
      for (j = 0; j < size; j++) {
        Node *n = &node[j];
        gnext(n) = 0;
        setnilkey(n);
        setempty(gval(n));
      }
      t->node = node;
      t->lsizenode = cast_byte(lsize);
      if (lsize >= LS_LIMFORLAST) ls_getlastfree(t) = gnode(t, size);  /* all free */
      setnodummy(t);
    }
    if (na > 0) {
      /* The values below the pointer, then the length hint, then one tag per slot. */
      size_t bytes = (size_t)na * (sizeof(Value) + 1) + sizeof(unsigned);
      Value *np = cast(Value *, luaM_newblock(L, bytes)) + na;
      lu_byte *tags = cast(lu_byte *, np) + sizeof(unsigned);
      unsigned int j;
      for (j = 0; j < na; j++) tags[j] = LUA_VEMPTY;
      *cast(unsigned *, np) = na / 2u;  /* the initial length hint, as luaH_resize sets it */
      t->array = np;
      t->asize = na;
      lua_assert(getArrTag(t, na - 1) == &tags[na - 1] && lenhint(t) == cast(unsigned *, np));
    }
  }
  luaC_checkGC(L);
}

/* Whether node n's key has a position independent of addresses. */
static int layout_key(const Node *n) {
  switch (keytt(n)) {
    case LUA_VNUMINT: case LUA_VNUMFLT: case LUA_VFALSE: case LUA_VTRUE:
    case ctb(LUA_VSHRSTR): case ctb(LUA_VLNGSTR):
      return 1;
    default:
      return 0;
  }
}

/* A total order on layout keys (tag, then value; strings by length, then bytes). */
static int keycmp(const Node *a, const Node *b) {
  int ta = keytt(a), tb = keytt(b);
  if (ta != tb) return ta < tb ? -1 : 1;
  switch (ta) {
    case LUA_VNUMINT: {
      lua_Integer x = keyival(a), y = keyival(b);
      return x < y ? -1 : x > y;
    }
    case LUA_VNUMFLT: {
      lua_Number x = fltvalueraw(keyval(a)), y = fltvalueraw(keyval(b));
      return x < y ? -1 : x > y;  /* never NaN: NaN is not a key */
    }
    case ctb(LUA_VSHRSTR): case ctb(LUA_VLNGSTR): {
      TString *x = keystrval(a), *y = keystrval(b);
      size_t lx = tsslen(x), ly = tsslen(y);
      if (lx != ly) return lx < ly ? -1 : 1;
      return memcmp(getstr(x), getstr(y), lx);
    }
    default:
      return 0;  /* booleans: the tag decides */
  }
}

/* Sorts idx[0..n) (node indices of t) by keycmp: insertion sort for a few, else heap sort
** (no recursion, no allocation). The live keys of a table are distinct, so every correct sort
** gives the same order: saver and loader need not sort alike. */
static void sort_nodes(const Table *t, uint32_t *idx, unsigned int n) {
  unsigned int i, end;
#define NLT(a, b) (keycmp(gnode(t, idx[a]), gnode(t, idx[b])) < 0)
#define SIFT(start, stop) do { \
    unsigned int r_ = (start); \
    for (;;) { \
      unsigned int c_ = 2 * r_ + 1; \
      uint32_t tmp_; \
      if (c_ >= (stop)) break; \
      if (c_ + 1 < (stop) && NLT(c_, c_ + 1)) c_++; \
      if (!NLT(r_, c_)) break; \
      tmp_ = idx[r_]; idx[r_] = idx[c_]; idx[c_] = tmp_; r_ = c_; \
    } } while (0)
  if (n < 2) return;
  if (n <= 16) {  /* small (most tables): insertion sort makes fewer comparisons */
    for (i = 1; i < n; i++) {
      uint32_t x = idx[i];
      unsigned int j = i;
      while (j > 0 && keycmp(gnode(t, x), gnode(t, idx[j - 1])) < 0) {
        idx[j] = idx[j - 1];
        j--;
      }
      idx[j] = x;
    }
    return;
  }
  for (i = n / 2; i-- > 0;) SIFT(i, n);
  for (end = n - 1; end > 0; end--) {
    uint32_t tmp = idx[0]; idx[0] = idx[end]; idx[end] = tmp;
    SIFT(0, end);
  }
#undef SIFT
#undef NLT
}

/* Layouts of recent tables, for the saver: objects built alike (by one constructor) have
** hash parts alike, the same keys in the same nodes, and their ranks need sorting once.
** A table takes the codes of an entry whose node count, lastfree, chain links and node
** classes (free, removed, live) are its own and whose live keys are the same values (a string
** by identity) in the same nodes: live ranks depend on those keys alone. Direct-mapped, by
** the first live key. Invariant: an entry is valid only in the epoch it was made in; the
** saver starts a new epoch (luasnap_layout_cache_reset) for each persist and before Lua code
** runs, after which a string could be freed and another take its address. */
#define LS_LC_WAYS 64
#define LS_LC_NODES 32
typedef struct {
  uint32_t epoch, size, m, lastfree;
  uint32_t codes[LS_LC_NODES];
  int32_t nexts[LS_LC_NODES];
  uint64_t bits[LS_LC_NODES];
  lu_byte tags[LS_LC_NODES];
} ls_lcentry;
typedef struct {
  uint32_t epoch;
  ls_lcentry e[LS_LC_WAYS];
} ls_lcache;

/* Bytes of a layout cache; zeroed bytes are an empty cache. */
size_t luasnap_layout_cache_size(void) { return sizeof(ls_lcache); }

/* Forgets every layout of the cache c (luasnap_layout_cache_size bytes). */
void luasnap_layout_cache_reset(void *c) {
  ls_lcache *lc = (ls_lcache *)c;
  if (++lc->epoch == 0) {  /* wrapped: entries of an old epoch 1 must not come back */
    memset(lc, 0, sizeof *lc);
    lc->epoch = 1;
  }
}

/* A live key's value bits (every layout key but a boolean, whose tag says all). */
static uint64_t ls_keybits(const Node *n) {
  uint64_t b = 0;
  if (keytt(n) != LUA_VFALSE && keytt(n) != LUA_VTRUE) memcpy(&b, &keyval(n), sizeof b);
  return b;
}

/* Whether the cached entry e (of the table's size) describes the table t, read straight from
** its nodes: each node's class (free, removed with a dead or object key: 1, removed with a
** number, boolean or string key: 2, live), chain link and, for a live node, key (tag and
** bits; the entry's live keys are all layout keys, so equal keys are too). */
static int ls_lc_match(const Table *t, const ls_lcentry *e, unsigned int size) {
  unsigned int i;
  for (i = 0; i < size; i++) {
    const Node *n = gnode(t, i);
    uint32_t c = e->codes[i];
    if (gnext(n) != e->nexts[i]) return 0;
    if (keyisnil(n)) { if (c != 0) return 0; }
    else if (isempty(gval(n))) { if (c != (uint32_t)(layout_key(n) ? 2 : 1)) return 0; }
    else if (c < 3 || e->tags[i] != keytt(n) || e->bits[i] != ls_keybits(n)) return 0;
  }
  return 1;
}

/* The cache entry for a table of `size` nodes and that lastfree whose first live node is f
** (size if none). */
static ls_lcentry *ls_lc_slot(ls_lcache *lc, const Table *t, unsigned int size,
                              unsigned int lastfree, unsigned int f) {
  uint64_t h = (f < size ? ls_keybits(gnode(t, f)) : 0) ^ ((uint64_t)size << 40)
               ^ ((uint64_t)lastfree << 48) ^ f;
  return &lc->e[(h * 0x9E3779B97F4A7C15ull) >> 58];  /* one of LS_LC_WAYS (2^6) */
}

/* The layout of the hash part of the table tp, for the saver. Returns 0 (no layout to save)
** if the hash part has fewer than 2 nodes, a live key whose position depends on an address
** (a table, function, userdata or light userdata as key), or the layout that inserting its
** keys into a fresh table gives anyway (see below). Else, with size = the node count
** (<= cap, the length of codes, nexts and idx; else returns 0), fills for each node i:
** codes[i] = 0 free (nil key), 1 a removed entry whose key is dead (collected, or an object:
** it stays in its chain and matches nothing), 2 a removed entry whose key is a number,
** boolean or string (a later t[k] = v reuses its node: the saver writes the key, see
** luasnap_node_key), 3 + r a live entry whose key has rank r (keycmp order) among the live
** keys; nexts[i] = its
** chain offset; *lastfree = the index below which insertions look for free nodes (size if
** the table keeps no such pointer), *seed = the VM's hash seed; returns size. cache: NULL,
** or a layout cache (see ls_lcache) that saves the sort for tables laid out like one before.
** Always sets *nodes = the node count (0 for the dummy node: when it exceeds cap, the caller
** grows its buffers and asks again) and *way = -1 when the cache took no part, w when the
** layout was computed and stored in entry w of the cache (LS_LC_WAYS of them), LS_LC_WAYS + w
** when it was copied from entry w: within one epoch, a table that hits entry w has the size,
** lastfree, chain links and codes of the table that filled it last (and, for codes other
** than 2, the same saved layout: a caller may keep what it wrote for the fill and reuse it).
** kept: a bit set for each entry w whose layout the caller kept so: a hit on it leaves codes
** and nexts unwritten.
** Reads only (the table). */
unsigned int luasnap_table_layout(lua_State *L, const void *tp, uint32_t *codes, int32_t *nexts,
                                  uint32_t *idx, unsigned int cap, unsigned int *lastfree,
                                  unsigned int *seed, void *cache, unsigned int *nodes,
                                  int *way, uint64_t kept) {
  const Table *t = (const Table *)tp;
  ls_lcache *lc = (ls_lcache *)cache;
  ls_lcentry *e = NULL;
  unsigned int size, i, m = 0;
  uint32_t irregular = 0;  /* nonzero once a removed entry or a chain link is seen */
  *way = -1;
  *nodes = (t == NULL || isdummy(t)) ? 0 : sizenode(t);
  if (t == NULL || isdummy(t)) return 0;
  size = sizenode(t);
  if (size < 2 || size > cap) return 0;
  *lastfree = ls_haslastfree(t) ? (unsigned int)(ls_getlastfree(t) - t->node) : size;
  if (lc != NULL && size <= LS_LC_NODES && lc->epoch != 0) {
    /* Tables built alike first: one pass comparing the nodes with the cached entry. */
    unsigned int f = 0;
    while (f < size && isempty(gval(gnode(t, f)))) f++;
    e = ls_lc_slot(lc, t, size, *lastfree, f);
    if (e->epoch == lc->epoch && e->size == size && e->lastfree == *lastfree
        && ls_lc_match(t, e, size)) {
      int w = (int)(e - lc->e);
      if (!((kept >> w) & 1)) {
        memcpy(codes, e->codes, size * sizeof *codes);
        memcpy(nexts, e->nexts, size * sizeof *nexts);
      }
      *seed = G(L)->seed;
      *way = LS_LC_WAYS + w;
      return size;
    }
  }
  for (i = 0; i < size; i++) {
    const Node *n = gnode(t, i);
    nexts[i] = gnext(n);
    irregular |= (uint32_t)gnext(n);
    if (keyisnil(n)) codes[i] = 0;
    else if (isempty(gval(n))) { codes[i] = layout_key(n) ? 2 : 1; irregular = 1; }
    else {
      if (!layout_key(n)) return 0;
      codes[i] = 3;  /* its rank comes after the sort */
      idx[m++] = i;
    }
  }
  /* No layout needed when inserting the keys into a fresh table of this size gives this one:
  ** no chain, no removed entry, lastfree untouched (no collision since the last resize).
  ** Every key then sits in its main position, whatever the order of insertion. */
  if (*lastfree == size && irregular == 0) return 0;
  *seed = G(L)->seed;
  sort_nodes(t, idx, m);
  for (i = 0; i < m; i++) codes[idx[i]] = 3 + i;
  if (e != NULL) {
    *way = (int)(e - lc->e);
    e->epoch = lc->epoch; e->size = size; e->m = m; e->lastfree = *lastfree;
    for (i = 0; i < size; i++) {
      const Node *n = gnode(t, i);
      e->codes[i] = codes[i];
      e->nexts[i] = nexts[i];
      e->tags[i] = codes[i] >= 3 ? keytt(n) : 0;
      e->bits[i] = codes[i] >= 3 ? ls_keybits(n) : 0;
    }
  }
  return size;
}

/* Scratch bytes relayout needs for a hash part of `size` nodes (the loader provides them, so
** a load allocates no scratch per table). */
size_t luasnap_relayout_scratch(unsigned int size) {
  return (size_t)size * (2 * sizeof(Node) + sizeof(uint32_t) + 2);
}

/* Applies the memo mm to the table t (whose node count is size and hash seed the layout's) if
** t matches it: the same layout (codes, chain links, lastfree), the same array size, and the
** same live keys in node order (tag and value bits; a short string's hash too). Returns 1 when
** applied, 0 (t untouched) otherwise; nw: scratch for size nodes. Neither allocates nor raises.
** Invariant relied on: relayout succeeded on the memo's table, so its checks hold here too.
** Those on the layout alone (ranks, chains) read only what is compared. The lookup check
** depends on the final nodes' keys and chain links, the node count and the array size only: a
** key's main position comes from its value (an integer, a float's bits, a boolean) or its
** hash (a short string), and a short string compares by address; an address reused by another
** string of the same hash would place and compare alike. So every key is found where the memo's
** was, and the result is the one relayout's full run would give. */
static int ls_rmemo_apply(Table *t, const ls_rmemo *mm, const uint32_t *codes,
                          const int32_t *nexts, unsigned int size, unsigned int lastfree,
                          Node *nw) {
  uint32_t livecur[LS_RM_NODES];
  unsigned int i, m = 0;
  if (mm->size != size || mm->lastfree != lastfree || mm->asize != t->asize) return 0;
  if (memcmp(mm->codes, codes, size * sizeof *codes) != 0
      || memcmp(mm->nexts, nexts, size * sizeof *nexts) != 0)
    return 0;
  for (i = 0; i < size; i++) {
    const Node *n = gnode(t, i);
    if (isempty(gval(n))) continue;
    if (m >= mm->m || keytt(n) != mm->tags[m] || ls_keybits(n) != mm->bits[m]) return 0;
    if (keytt(n) == ctb(LUA_VSHRSTR) && keystrval(n)->hash != mm->hashes[m]) return 0;
    livecur[m++] = i;
  }
  if (m != mm->m) return 0;
  for (i = 0; i < size; i++) {
    Node *d = &nw[i];
    uint32_t c = codes[i];
    if (c >= 3) *d = *gnode(t, livecur[mm->perm[c - 3]]);
    else {  /* c is 0 or 1: the memo's layout had no removed entry's key (code 2) */
      setempty(gval(d));
      if (c == 0) setnilkey(d);
      else { keytt(d) = LUA_TDEADKEY; keyval(d).gc = NULL; }
    }
    gnext(d) = nexts[i];
  }
  memcpy(t->node, nw, (size_t)size * sizeof(Node));
  if (ls_haslastfree(t)) ls_getlastfree(t) = gnode(t, lastfree);
  invalidateTMcache(t);
  return 1;
}

/* The work of luasnap_table_relayout on the table t, with kt the table of removed entries'
** keys (NULL: the layout may have none) and scratch of luasnap_relayout_scratch(size) bytes.
** memo: NULL, or the memo of the last layout applied (see ls_rmemo), used and updated.
** Neither allocates nor raises. */
static int relayout(lua_State *L, Table *t, const uint32_t *codes, const int32_t *nexts,
                    unsigned int size, unsigned int lastfree, unsigned int seed, Table *kt,
                    char *scratch, ls_rmemo *memo) {
  unsigned int i, m = 0, used = 0, visited = 0, nkeys = 0;
  uint32_t *live;
  lu_byte *indeg, *seen;
  Node *nw, *bk;
  Node *oldlf = NULL;
  int ok = 1;
  if (seed != G(L)->seed) return 1;
  if (isdummy(t) || sizenode(t) != size) return 1;
  /* lastfree: a node index, or size (all below it may be searched). */
  if (lastfree > size) return -1;
  ls_rmemo *charge = memo;  /* the load's chain limit, whatever the memo's use below */
  nw = (Node *)scratch;
  if (memo != NULL && kt == NULL && ls_rmemo_apply(t, memo, codes, nexts, size, lastfree, nw))
    return 0;
  /* Memoizable: no removed entries' keys, a small hash part (and only short strings among
  ** the keys, checked below). The memo is filled as the work goes and valid only at the end. */
  if (memo != NULL) {
    memo->size = 0;
    if (kt != NULL || size > LS_RM_NODES) memo = NULL;
  }
  bk = nw + size;
  live = (uint32_t *)(bk + size);
  indeg = (lu_byte *)(live + size);
  seen = indeg + size;
  memset(indeg, 0, size);
  memset(seen, 0, size);
  /* The table's live entries, all with keys whose position depends on no address. */
  for (i = 0; i < size; i++) {
    const Node *n = gnode(t, i);
    if (!isempty(gval(n))) {
      if (!layout_key(n)) return -1;
      if (memo != NULL) {
        if (keytt(n) == ctb(LUA_VLNGSTR)) memo = NULL;
        else {
          memo->tags[m] = keytt(n);
          memo->bits[m] = ls_keybits(n);
          memo->hashes[m] = keytt(n) == ctb(LUA_VSHRSTR) ? keystrval(n)->hash : 0;
          indeg[i] = (lu_byte)m;  /* node -> its index among the live, until the sort */
        }
      }
      live[m++] = i;
    }
  }
  sort_nodes(t, live, m);
  if (memo != NULL) {
    for (i = 0; i < m; i++) seen[i] = indeg[live[i]];  /* rank -> index among the live */
    memcpy(memo->perm, seen, m);
  }
  memset(indeg, 0, size);
  memset(seen, 0, size);
  /* The layout on its own: every rank names a distinct live entry, every live entry is named;
  ** free nodes (nil key) are in no chain (insertkey relies on a free node's next being 0);
  ** a chain link stays inside the array and leads to a node in use, and no node has two
  ** predecessors. */
  for (i = 0; i < size; i++) {
    uint32_t c = codes[i];
    if (c == 0) {
      if (nexts[i] != 0) return -1;
      continue;
    }
    used++;
    if (c >= 3) {
      if (c - 3 >= m || seen[c - 3]) return -1;
      seen[c - 3] = 1;
    }
    if (nexts[i] != 0) {
      int64_t j = (int64_t)i + nexts[i];
      if (j < 0 || j >= (int64_t)size || codes[j] == 0 || indeg[j]) return -1;
      indeg[j] = 1;
    }
  }
  for (i = 0; i < m; i++)
    if (!seen[i]) return -1;
  /* No loops: with at most one successor and one predecessor per node, the chains are paths
  ** or cycles; walking the paths from their heads must reach every node in use. */
  for (i = 0; i < size; i++) {
    unsigned int j = i, steps = 0;
    if (codes[i] == 0 || indeg[i]) continue;
    for (;;) {
      visited++;
      if (nexts[j] == 0 || ++steps > size) break;
      j = (unsigned int)((int64_t)j + nexts[j]);
    }
  }
  if (visited != used) return -1;
  /* The new node array: removed entries become dead keys (they keep their place in their
  ** chain, match no key, and are never freed: as Lua's own after a collection). */
  for (i = 0; i < size; i++) {
    Node *d = &nw[i];
    uint32_t c = codes[i];
    if (c >= 3) *d = *gnode(t, live[c - 3]);
    else if (c == 2) {
      /* A removed entry's key: a number, boolean or string (as the saver only writes),
      ** kept alive by the keys table until the collector clears it, as Lua does. */
      TValue k;
      if (kt == NULL || tagisempty(luaH_getint(kt, (lua_Integer)++nkeys, &k))) return -1;
      switch (ttypetag(&k)) {
        case LUA_VNUMINT: case LUA_VFALSE: case LUA_VTRUE: case LUA_VSHRSTR: case LUA_VLNGSTR:
          break;
        case LUA_VNUMFLT:
          if (luai_numisnan(fltvalue(&k))) return -1;
          break;
        default:
          return -1;
      }
      setnodekey(d, &k);
      setempty(gval(d));
    }
    else {
      setempty(gval(d));
      if (c == 0) setnilkey(d);
      else { keytt(d) = LUA_TDEADKEY; keyval(d).gc = NULL; }
    }
    gnext(d) = nexts[i];
  }
  if (kt != NULL && nkeys != luaH_getn(L, kt)) return -1;
  memcpy(bk, t->node, (size_t)size * sizeof(Node));
  memcpy(t->node, nw, (size_t)size * sizeof(Node));
  if (ls_haslastfree(t)) {
    oldlf = ls_getlastfree(t);
    ls_getlastfree(t) = gnode(t, lastfree);
  }
  /* Every key is found where it was put: each value is replaced by its node index for the
  ** lookups (which neither allocate nor raise), then put back. This proves every key sits in
  ** the chain of its main position, ahead of any equal key, and outside the array part. */
  for (i = 0; i < size; i++)
    if (codes[i] >= 3) setivalue(gval(gnode(t, i)), (lua_Integer)i);
  for (i = 0; i < size && ok; i++) {
    TValue k, res;
    if (codes[i] < 3) continue;
    getnodekey(L, &k, gnode(t, i));
    if (ls_chain_charge(charge, t, &k) < 0) ok = 0;  /* chains forged to be walked long */
    else if (luaH_get(t, &k, &res) != LUA_VNUMINT || ivalue(&res) != (lua_Integer)i) ok = 0;
  }
  if (!ok) {
    memcpy(t->node, bk, (size_t)size * sizeof(Node));
    if (ls_haslastfree(t)) ls_getlastfree(t) = oldlf;
    return -1;
  }
  for (i = 0; i < size; i++)
    if (codes[i] >= 3) setobj(L, gval(gnode(t, i)), gval(&nw[i]));
  /* A removed entry's string key is new to t: if t was traversed already in this cycle, it
  ** must be traversed again (which marks the key dead before the string can be swept, as
  ** for Lua's own removed entries). */
  for (i = 0; i < size; i++) {
    if (codes[i] == 2) {
      TValue k;
      getnodekey(L, &k, gnode(t, i));
      luaC_barrierback(L, obj2gco(t), &k);
    }
  }
  invalidateTMcache(t);
  if (memo != NULL) {  /* every check passed: the next table laid out alike can skip them */
    memo->lastfree = lastfree;
    memo->m = m;
    memo->asize = t->asize;
    memcpy(memo->codes, codes, size * sizeof *codes);
    memcpy(memo->nexts, nexts, size * sizeof *nexts);
    memo->size = size;
  }
  return 0;
}

/* The node count of the table at idx (0 for the dummy node), for the loader to check a
** layout's declared size against before it reads the layout into host memory. Reads only. */
unsigned int luasnap_table_nodes(lua_State *L, int idx) {
  const Table *t = (const Table *)lua_topointer(L, idx);
  return isdummy(t) ? 0 : sizenode(t);
}

/* For the loader: moves the entries of the table at idx (just built by inserting the saved
** entries into a table of the saved sizes) into the nodes of a layout read from the file
** (codes, nexts: size entries each; lastfree; seed: as luasnap_table_layout wrote them; the
** keys of the removed entries of code 2, in node order, at keys[1..] of the table at keys, or
** keys == 0 when there are none). scratch holds luasnap_relayout_scratch(size) bytes.
** Returns 0 when done; 1 when the layout does not apply and the table keeps the layout its
** insertions gave (written under another hash seed, where every key's position differs, or
** for a hash part of another size: the loader capped the file's size hint); -1 when the
** layout is inconsistent with the table or with itself (a damaged or forged file), the table
** left as it was. Changes the table only once every check above passed, so no layout from a
** file can leave a chain that loops, leaves the node array or hides a key. Neither allocates
** nor raises. */
int luasnap_table_relayout(lua_State *L, int idx, const uint32_t *codes, const int32_t *nexts,
                           unsigned int size, unsigned int lastfree, unsigned int seed,
                           int keys, char *scratch, void *memo) {
  Table *t = (Table *)luasnap_table_at(L, idx), *kt = NULL;
  if (t == NULL) return -1;
  if (keys != 0) {
    kt = (Table *)luasnap_table_at(L, keys);
    if (kt == NULL) return -1;
  }
  return relayout(L, t, codes, nexts, size, lastfree, seed, kt, scratch, (ls_rmemo *)memo);
}

/* For the saver: describes the key of node i of the table tp (i < its node count), a removed
** entry's (code 2 of luasnap_table_layout). Reads only. */
void luasnap_node_key(lua_State *L, const void *tp, unsigned int i, luasnap_val *out) {
  const Table *t = (const Table *)tp;
  TValue k;
  getnodekey(L, &k, gnode(t, i));
  describe(&k, out);
}
