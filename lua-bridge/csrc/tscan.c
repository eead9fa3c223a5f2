/*
** Tables and closures, read for the save-game writer: traversal by position, batched scans of
** entries described without pushing them, a table's sizes and metatable, a closure's upvalues,
** and the layout of a hash part (tlayout.h) with a cache for tables laid out alike.
** Everything here reads only, but luasnap_anchor (which stores into the writer's anchor table).
**
** Table traversal by position: positions number the array part, then the hash nodes, as
** luaH_next numbers them, but resuming needs no lookup of the previous key. The traversals
** neither allocate nor raise; they check bounds, so a table changed during a traversal (by a
** __persist function) cannot make them read outside it.
*/
#include "tlayout.h"
#include "lstring.h"

/* Pushes the value, then the key, of the first non-empty entry at position >= *pos of the
** table tp (alive: anchored or reachable), and sets *pos past it. Returns 0, pushing nothing,
** after the last entry. The caller guarantees stack room for 2 values. */
int luasnap_table_next(lua_State *L, const void *tp, uint32_t *pos) {
  const Table *t = (const Table *)tp;
  unsigned int asize, i;
  if (t == NULL) return 0;
  asize = luaH_asize(t);
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
int luasnap_table_entry(lua_State *L, const void *tp, uint32_t pos, int what) {
  const Table *t = (const Table *)tp;
  if (t == NULL) return 0;
  if (pos < luaH_asize(t)) {
    lu_byte tag = *getArrTag(t, pos);
    if (tagisempty(tag)) return 0;
    if (what == 0) {
      setivalue(s2v(L->top.p), cast(lua_Integer, pos) + 1);
    } else {
      farr2val(t, pos, tag, s2v(L->top.p));
    }
  } else {
    Node *n;
    if (pos - luaH_asize(t) >= (unsigned int)sizenode(t)) return 0;
    n = gnode(t, pos - luaH_asize(t));
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

/* ----- batched table entries ----- */

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

int luasnap_table_scan(lua_State *L, const void *tp, uint32_t pos, luasnap_sentry *out, int max) {
  const Table *t = (const Table *)tp;
  unsigned int asize, nsize, i;
  const Node *node;
  int n = 0;
  (void)L;
  if (t == NULL) return 0;
  asize = luaH_asize(t);
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

/* Stores the objects ps[0..n) at tbl[keys[i]] (or tbl[first + i] if keys is NULL), tbl
** being the table at the absolute index idx. For the persister, which records strings,
** tables and closures by identity without pushing them and anchors them only before Lua code
** can run: until then every one of them is reachable from the graph being written, which
** nothing changes. */
void luasnap_anchor(lua_State *L, int idx, const void *const *ps, const lua_Integer *keys, int n,
                    lua_Integer first) {
  Table *tbl = ls_table_at(L, idx);
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
int luasnap_table_info(const void *tp, const void *key, uint32_t *narr, uint32_t *nhash,
                       const void **mt) {
  const Table *t = (const Table *)tp;
  *narr = luaH_asize(t);
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
  /* A closure bound to a newer version of its function may have more slots than its
  ** prototype has upvalues (proto.c); Lua reads the prototype's count only, and so do saves. */
  int i, n = cl->p->sizeupvalues < cl->nupvalues ? cl->p->sizeupvalues : cl->nupvalues;
  if (n > max) return -1;
  *proto = cl->p;
  for (i = 0; i < n; i++) {
    const UpVal *uv = cl->upvals[i];
    if (uv == NULL || upisopen(uv)) return -1;
    uids[i] = uv;
    describe(uv->v.p, &vals[i]);
  }
  return n;
}

/* Layouts of recent tables, for the saver: objects built alike (by one constructor) have
** hash parts alike, the same keys in the same nodes, and their ranks need sorting once.
** A table takes the codes of an entry whose node count, lastfree, chain links and node
** classes (free, removed, live) are its own and whose live keys are the same values (a string
** by identity) in the same nodes: live ranks depend on those keys alone. Direct-mapped, by
** the first live key. Invariant: an entry is valid only in the epoch it was made in; the
** saver starts a new epoch (luasnap_layout_cache_reset) for each persist and before Lua code
** runs, after which a string could be freed and another take its address. */
#define LS_LC_WAYS LUASNAP_LAYOUT_WAYS
_Static_assert(LS_LC_WAYS == 64, "ls_lc_slot picks a way by the top 6 bits of a hash");
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
    else if (isempty(gval(n))) { if (c != (uint32_t)(ls_inline_key(n) ? 2 : 1)) return 0; }
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
uint32_t luasnap_table_layout(lua_State *L, const void *tp, uint32_t *codes, int32_t *nexts,
                              uint32_t *idx, uint32_t cap, uint32_t *lastfree, uint32_t *seed,
                              void *cache, uint32_t *nodes, int *way, uint64_t kept) {
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
    else if (isempty(gval(n))) { codes[i] = ls_inline_key(n) ? 2 : 1; irregular = 1; }
    else {
      if (!ls_layout_key(n)) return 0;
      codes[i] = 3;  /* its rank comes after the sort */
      idx[m++] = i;
    }
  }
  /* No layout needed when inserting the keys into a fresh table of this size gives this one:
  ** no chain, no removed entry, lastfree untouched (no collision since the last resize).
  ** Every key then sits in its main position, whatever the order of insertion. */
  if (*lastfree == size && irregular == 0) return 0;
  *seed = G(L)->seed;
  ls_sort_nodes(t, idx, m);
  if (ls_ties(t, idx, m)) return 0;  /* two keys share an identity: no rank for each */
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

/* For the saver: describes the key of node i of the table tp (i < its node count), a removed
** entry's (code 2 of luasnap_table_layout). Reads only. */
void luasnap_node_key(lua_State *L, const void *tp, uint32_t i, luasnap_val *out) {
  const Table *t = (const Table *)tp;
  TValue k;
  getnodekey(L, &k, gnode(t, i));
  describe(&k, out);
}

/* For the saver: the removed entries of the table tp whose key a layout writes as code 1
** (luasnap_table_layout), so that a load can give each its key again (format 10: a
** coroutine suspended in a pairs() loop after t[k] = nil resumes with `next(t, k)`, which
** finds the node by that key). For each such node, in node order: its index in nodes[],
** its key's identity in ptrs[] and its kind in kinds[]: LS_RK_DEAD, a dead key (cleared by
** the collector: the identity is an address only, perhaps of an object freed since: the
** saver looks it up among the objects it wrote and never reads through it); LS_RK_OBJ, an
** object key not cleared yet (a live object); LS_RK_CFUNC, a light C function (never
** cleared). Fills at most cap and returns the count (a larger count: the caller grows its
** buffers and asks again). Reads only. */
uint32_t luasnap_table_removed_keys(const void *tp, uint32_t *nodes, const void **ptrs,
                                    uint8_t *kinds, uint32_t cap) {
  const Table *t = (const Table *)tp;
  unsigned int i, size;
  uint32_t n = 0;
  if (t == NULL || isdummy(t)) return 0;
  size = sizenode(t);
  for (i = 0; i < size; i++) {
    const Node *nd = gnode(t, i);
    const void *p;
    uint8_t k;
    if (keyisnil(nd) || !isempty(gval(nd)) || ls_inline_key(nd)) continue;
    if (keyisdead(nd)) { k = LS_RK_DEAD; p = keyval(nd).gc; }
    else if (keytt(nd) == LUA_VLCF) { k = LS_RK_CFUNC; p = (const void *)fvalueraw(keyval(nd)); }
    else if (keyiscollectable(nd)) { k = LS_RK_OBJ; p = keyval(nd).gc; }
    else continue;  /* a light userdata: no layout is written for its table */
    if (p == NULL) continue;
    if (n < cap) { nodes[n] = i; ptrs[n] = p; kinds[n] = k; }
    n++;
  }
  return n;
}

/* Pushes the key of node i of the table tp, a removed entry's of kind LS_RK_CFUNC
** (luasnap_table_removed_keys: a light C function, whose value is the function's address:
** nothing is read through it). The caller guarantees stack room. */
void luasnap_push_node_key(lua_State *L, const void *tp, uint32_t i) {
  const Table *t = (const Table *)tp;
  getnodekey(L, s2v(L->top.p), gnode(t, i));
  L->top.p++;
}
