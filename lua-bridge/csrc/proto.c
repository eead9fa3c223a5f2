/*
** Prototypes: naming them, fingerprinting them, making closures of them.
**
** The public C API cannot name a function's prototype, compare prototypes, or create a
** closure from a prototype without loading bytecode. These helpers do, so that loading a
** save-game in safe mode never runs bytecode taken from the file: closures are rebuilt from
** prototypes the VM compiled itself, matched by a structural fingerprint.
*/
#include "proto.h"

/* The prototype of the Lua closure at idx, or NULL if it is not a Lua closure. */
const void *luasnap_proto(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  if (!ttisLclosure(o)) return NULL;
  return clLvalue(o)->p;
}

/* The light C function at idx (a C function without upvalues, not a closure), or NULL. */
lua_CFunction luasnap_light_cfunction(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  return ttislcf(o) ? fvalue(o) : NULL;
}

int luasnap_proto_nupvalues(const void *p) {
  return ((const Proto *)p)->sizeupvalues;
}

int luasnap_proto_nchildren(const void *p) {
  return ((const Proto *)p)->sizep;
}

/* Child i of p (0-based), or NULL when p has no such child. */
const void *luasnap_proto_child(const void *p, int i) {
  const Proto *q = (const Proto *)p;
  return (i >= 0 && i < q->sizep) ? q->p[i] : NULL;
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

void luasnap_push_closure(lua_State *L, const void *p) {
  ls_push_closure(L, (Proto *)p);
}

/* Calls f(p, ud) for every prototype alive in the VM (walks the collector's object lists).
** The collector must be stopped by the caller so the lists do not change meanwhile. */
void luasnap_each_proto(lua_State *L, luasnap_proto_fn f, void *ud) {
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

/* Calls f(q, ud) for p and every prototype nested in it. */
void luasnap_proto_tree(const void *p, luasnap_proto_fn f, void *ud) {
  const Proto *proto = (const Proto *)p;
  int i;
  f(p, ud);
  for (i = 0; i < proto->sizep; i++) luasnap_proto_tree(proto->p[i], f, ud);
}
