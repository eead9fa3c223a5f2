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
#include <string.h>

#include "lua.h"
#include "lobject.h"
#include "lstate.h"
#include "lfunc.h"
#include "lgc.h"
#include "ldo.h"

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

static uint64_t proto_hash(const Proto *p, int depth) {
  Hash h = { 0xcbf29ce484222325ULL };
  int i;
  hu64(&h, (uint64_t)p->numparams); hu64(&h, (uint64_t)p->flag); hu64(&h, (uint64_t)p->maxstacksize);
  hu64(&h, (uint64_t)p->linedefined); hu64(&h, (uint64_t)p->lastlinedefined);
  if (p->source) hbytes(&h, getstr(p->source), tsslen(p->source));
  hu64(&h, (uint64_t)p->sizecode);
  hbytes(&h, p->code, sizeof(Instruction) * (size_t)p->sizecode);
  hu64(&h, (uint64_t)p->sizek);
  for (i = 0; i < p->sizek; i++) {
    const TValue *k = &p->k[i];
    hu64(&h, (uint64_t)ttypetag(k));
    if (ttisstring(k)) hbytes(&h, getstr(tsvalue(k)), tsslen(tsvalue(k)));
    else if (ttisinteger(k)) hu64(&h, (uint64_t)ivalue(k));
    else if (ttisfloat(k)) { lua_Number n = fltvalue(k); hbytes(&h, &n, sizeof n); }
  }
  hu64(&h, (uint64_t)p->sizeupvalues);
  for (i = 0; i < p->sizeupvalues; i++) {
    hu64(&h, (uint64_t)p->upvalues[i].instack);
    hu64(&h, (uint64_t)p->upvalues[i].idx);
    hu64(&h, (uint64_t)p->upvalues[i].kind);
  }
  hu64(&h, (uint64_t)p->sizep);
  for (i = 0; i < p->sizep; i++)
    hu64(&h, depth < 200 ? proto_hash(p->p[i], depth + 1) : 0);
  return finish(h.h);
}

uint64_t luasnap_proto_hash(const void *p) {
  return proto_hash((const Proto *)p, 0);
}

/* Pushes a new closure of prototype p with fresh (nil) upvalues, as lundump does. */
void luasnap_push_closure(lua_State *L, const void *p) {
  Proto *proto = (Proto *)p;
  LClosure *cl;

  cl = luaF_newLclosure(L, proto->sizeupvalues);
  setclLvalue2s(L, L->top.p, cl);
  L->top.p++;
  cl->p = proto;
  luaC_objbarrier(L, cl, proto);
  luaF_initupvals(L, cl);

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
      if (o->tt == LUA_VPROTO) f(o, ud);
  }
}
