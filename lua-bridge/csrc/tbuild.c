/*
** Tables and closures, built for the save-game loader: runs of build steps decoded from the
** file (luasnap_table_build: new tables presized, entries stored without a Lua API call each,
** closures of the VM's own prototypes, upvalues set and joined), and saved hash-part layouts
** applied (relayout: tlayout.h), every layout checked before it replaces a table's nodes.
** The load's collision-chain limit is charged here too (ls_chain_charge): keys a hostile file
** chose to collide cannot make the load walk chains without end.
*/
#include "proto.h"
#include "tlayout.h"
#include "lmem.h"
#include "lstring.h"
#include "lvm.h"

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
** count: integers outside the array part, floats, strings (by value), objects (by the identity
** the file gives them: patch 4 of luasnap's Lua); not booleans or light C functions (a fixed
** position). Invariant relied on: t's chains are Lua's (or checked by relayout) paths, so the
** walk ends; it is also bounded by the node count. */
/* (Out of line: the build steps call it only when a limit is set, foreign loads.) */
static LS_NOINLINE int ls_chain_charge(ls_rmemo *m, const Table *t, const TValue *k) {
  const Node *n;
  unsigned int count = 1, size;
  if (m == NULL || m->limit == 0 || isdummy(t)) return 0;
  if (ttisinteger(k)) {
    if (l_castS2U(ivalue(k)) - 1u < luaH_asize(t)) return 0;
  }
  else if (ttisfloat(k)) {
    if (luai_numisnan(fltvalue(k))) return 0;
  }
  else if (!iscollectable(k)) return 0;  /* booleans, light C functions, light userdata */
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

/* Bytes of a relayout memo (see ls_rmemo); zeroed bytes are an empty memo. */
size_t luasnap_relayout_memo_size(void) { return sizeof(ls_rmemo); }

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
      /* The values below the pointer, then the size and the length hint, then one tag per
      ** slot (luasnap's Lua, patch 4: see luaH_asize in ltable.h). */
      size_t bytes = luaH_arraybytes(na);
      Value *np = cast(Value *, luaM_newblock(L, bytes)) + na;
      lu_byte *tags = cast(lu_byte *, np) + 2 * sizeof(unsigned);
      unsigned int j;
      for (j = 0; j < na; j++) tags[j] = LUA_VEMPTY;
      cast(unsigned *, np)[0] = na;
      cast(unsigned *, np)[1] = na / 2u;  /* the initial length hint, as luaH_resize sets it */
      t->array = np;
      lua_assert(getArrTag(t, na - 1) == &tags[na - 1] && luaH_asize(t) == na
                 && lenhint(t) == cast(unsigned *, np) + 1);
    }
  }
  luaC_checkGC(L);
}

/* ----- building ----- */

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
  if (ttisinteger(k) && l_castS2U(ivalue(k)) - 1u < luaH_asize(t)) {
    luaH_setint(L, t, ivalue(k), (TValue *)v);
    return 0;
  }
  if (ttisnil(k) || (ttisfloat(k) && luai_numisnan(fltvalue(k)))) return -1;
  if (isextstr(k)) return -1;  /* the loader makes none: defensive */
  if (isdummy(t) || *cursor >= sizenode(t)) return -1;
  /* An object placed as a key has its identity from now on, as luaH_newkey gives it (the
  ** lookups that check the layout hash it; see gcoid in lobject.h, patch 4). */
  if (iscollectable(k) && !ttisstring(k)) luaH_keyid(L, gcvalue(k));
  n = gnode(t, (*cursor)++);
  setnodekey(n, k);
  setobj2t(L, gval(n), v);
  luaC_barrierback(L, obj2gco(t), k);
  return 0;
}

/* The VM's hash seed (a table layout applies only under the seed it was saved with). */
uint32_t luasnap_hash_seed(lua_State *L) {
  return G(L)->seed;
}

/* How deep tables nest in one luasnap_table_build program, counting the table it starts on
** (luasnap.h: Rust checks its batches nest less). */
#define LS_BUILD_DEPTH LUASNAP_BUILD_DEPTH

/* luaH_getint and luaH_setint with the array part's case inline, as theirs (the same
** results): the build helper looks up and stores every object and string by its id in the
** load's id tables, which the loader presizes, so nearly every id is in their array parts. */
static l_inline lu_byte ls_getint(Table *t, lua_Integer k, TValue *res) {
  lua_Unsigned i = l_castS2U(k) - 1u;
  if (i < luaH_asize(t)) {
    lu_byte tag = *getArrTag(t, i);
    if (!tagisempty(tag)) farr2val(t, i, tag, res);
    return tag;
  }
  return luaH_getint(t, k, res);
}

static l_inline void ls_setint(lua_State *L, Table *t, lua_Integer k, TValue *v) {
  lua_Unsigned i = l_castS2U(k) - 1u;
  if (i < luaH_asize(t)) obj2arr(t, i, v);
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
  else if (ttisinteger(k) && l_castS2U(ivalue(k)) - 1u < luaH_asize(t)) {
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

/* ----- layouts (tlayout.h) ----- */

/* Scratch bytes relayout needs for a hash part of `size` nodes (the loader provides them, so
** a load allocates no scratch per table). */
size_t luasnap_relayout_scratch(uint32_t size) {
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
  if (mm->size != size || mm->lastfree != lastfree || mm->asize != luaH_asize(t)) return 0;
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
                    void *scratch, ls_rmemo *memo) {
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
      if (!ls_layout_key(n)) return -1;
      if (memo != NULL) {
        if (keytt(n) == ctb(LUA_VLNGSTR) || ls_identity_key(n)) memo = NULL;
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
  ls_sort_nodes(t, live, m);
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
    memo->asize = luaH_asize(t);
    memcpy(memo->codes, codes, size * sizeof *codes);
    memcpy(memo->nexts, nexts, size * sizeof *nexts);
    memo->size = size;
  }
  return 0;
}

/* The node count of the table at idx (0 for the dummy node), for the loader to check a
** layout's declared size against before it reads the layout into host memory. Reads only. */
uint32_t luasnap_table_nodes(lua_State *L, int idx) {
  const Table *t = (const Table *)lua_topointer(L, idx);
  return isdummy(t) ? 0 : sizenode(t);
}

/* Whether node nd's key is k, live or dead (a dead key by address, as equalkey with deadok;
** a long string by its bytes, as equalkey does). */
static int ls_key_is(const Node *nd, const TValue *k) {
  if (keyisdead(nd)) return iscollectable(k) && keyval(nd).gc == gcvalue(k);
  if (keytt(nd) != rawtt(k)) return 0;
  if (ttislcf(k)) return fvalueraw(keyval(nd)) == fvalue(k);
  if (ttislngstring(k)) return luaS_eqstr(keystrval(nd), tsvalue(k));
  return iscollectable(k) && keyval(nd).gc == gcvalue(k);
}

/* Whether k, given to node n of t, is found there and only there: k is no live key of t, and
** the chain from k's main position reaches n before any node whose key is k (a lookup that
** allows dead keys, as `next` does, stops at n). Lua placed every removed key so; a file that
** names another node or a key the table holds live would make `next` loop or skip. */
static int ls_removed_key_fits(lua_State *L, Table *t, const Node *n, const TValue *k) {
  TValue res;
  const Node *nd;
  unsigned int steps = 0, size = sizenode(t);
  (void)L;
  if (!tagisempty(luaH_get(t, k, &res))) return 0;
  nd = luaH_mainposition(t, k);
  for (;;) {
    if (nd == n) return 1;
    if (ls_key_is(nd, k) || gnext(nd) == 0 || ++steps >= size) return 0;
    nd += gnext(nd);
  }
}

/* Whether the key at kidx is of a kind a code-1 node's key can be (see luasnap_table_layout
** and ls_inline_key): not dead, a long string, an object or a light C function (a removed
** number, boolean or short string is written inline, as code 2); dead, anything (a dead key
** that is no object matches nothing: the loader skips it). The loader refuses an entry of
** another kind before it changes any table (luasnap_table_removed_key also returns -1 for
** one). Reads only. */
int luasnap_removed_key_kind(lua_State *L, int kidx, int dead) {
  const TValue *k = ls_index2value(L, kidx);
  if (dead) return 1;
  switch (ttypetag(k)) {
    case LUA_VLNGSTR: case LUA_VTABLE: case LUA_VLCL: case LUA_VCCL: case LUA_VUSERDATA:
    case LUA_VTHREAD: case LUA_VLCF:
      return 1;
    default:
      return 0;
  }
}

/* For the loader (format 10): gives node `node` of the table at tidx, a removed entry that a
** layout placed as code 1, the key at kidx again, dead (an identity only: `next` from that key
** finds the node, as Lua's own dead keys do) or not (an object or light C function key whose
** entry was removed but not yet cleared by a collection: the node matches the key again, and
** `t[k] = v` reuses it). Returns 0 done; 1 when the node is no such entry (the layout did not
** apply to the table, or the file names another node), the dead key is no object (it
** matches nothing either way), or the key would not be found at that node alone
** (ls_removed_key_fits): nothing changes; -1 when a key that is not dead is of a kind no such
** entry has. Neither allocates nor raises. */
int luasnap_table_removed_key(lua_State *L, int tidx, uint32_t node, int kidx, int dead) {
  Table *t = ls_table_at(L, tidx);
  const TValue *k = ls_index2value(L, kidx);
  Node *n;
  if (t == NULL || isdummy(t) || node >= (uint32_t)sizenode(t)) return 1;
  n = gnode(t, node);
  /* Invariant checked: the node is what relayout makes of a code-1 node (a dead key with no
  ** identity and an empty value) and nothing has given it an identity yet. Only its key
  ** changes: its chain link, the table's other nodes and its lookups stay as relayout checked
  ** them (a dead key matches no lookup; a removed key sits in a chain its main position
  ** starts, as Lua left it, and matches only itself). */
  if (!isempty(gval(n)) || !keyisdead(n) || keyval(n).gc != NULL) return 1;
  if (dead) {
    /* Lua compares a dead key with a collectable key by address alone (equalkey, deadok),
    ** and with nothing else: a dead key whose bits were a light C function's (Lua patch 11
    ** marks those dead too) matches nothing, as the node left without an identity does. */
    if (!iscollectable(k)) return 1;
    if (!ls_removed_key_fits(L, t, n, k)) return 1;
    keyval(n).gc = gcvalue(k);
    return 0;
  }
  switch (ttypetag(k)) {
    case LUA_VLNGSTR:
      /* A long string matches a live key by its bytes: ls_removed_key_fits's lookup refuses
      ** one whose bytes a live key of t has, and a dead key by address only. */
      /* fall through */
    case LUA_VTABLE: case LUA_VLCL: case LUA_VCCL: case LUA_VUSERDATA: case LUA_VTHREAD:
      if (!ls_removed_key_fits(L, t, n, k)) return 1;
      setnodekey(n, k);
      /* The key is new to t: a table the collector traversed already in this cycle must be
      ** traversed again (which clears the key before the object can be swept). */
      luaC_barrierback(L, obj2gco(t), k);
      return 0;
    case LUA_VLCF:
      if (!ls_removed_key_fits(L, t, n, k)) return 1;
      setnodekey(n, k);
      return 0;
    default:
      return -1;
  }
}

/* ----- removed keys where a layout did not apply ----- */

/* The placeholders a removed key inserted by luasnap_table_add_removed holds as its value
** until luasnap_table_seal_removed empties it: a light userdata of these addresses, which no
** loaded value can be (a save holds no light userdata). */
static const char ls_removed_mark[2];
#define LS_MARK_REMOVED ((void *)&ls_removed_mark[0])
#define LS_MARK_DEAD ((void *)&ls_removed_mark[1])

/* Whether a dead node in the chain of k's main position holds k's identity (a lookup that
** allows dead keys, as `next` does, would stop there). Bounded by the node count. */
static int ls_dead_key_in_chain(const Table *t, const TValue *k) {
  const Node *nd = luaH_mainposition(t, k);
  unsigned int steps = 0, size = sizenode(t);
  for (;;) {
    if (keyisdead(nd) && keyval(nd).gc == gcvalue(k)) return 1;
    if (gnext(nd) == 0 || ++steps >= size) return 0;
    nd += gnext(nd);
  }
}

/* Whether Lua's insertkey (ltable.c) puts a new key whose main position is mp into t without
** a rehash: at mp when mp's value is empty, else at the free node getfreepos finds, which
** this looks for as it does (below 'lastfree' when the table keeps one, else anywhere) but
** without moving 'lastfree' (ltable.c's own is private). The next insertkey walks the same
** nodes, so a table's insertions walk each node at most twice. */
static int ls_insert_fits(const Table *t, const Node *mp) {
  unsigned int i;
  if (isdummy(t)) return 0;
  if (isempty(gval(mp))) return 1;
  if (ls_haslastfree(t)) {
    const Node *n = ls_getlastfree(t);
    while (n > t->node)
      if (keyisnil(--n)) return 1;
    return 0;
  }
  for (i = sizenode(t); i-- > 0;)
    if (keyisnil(gnode(t, i))) return 1;
  return 0;
}

/* The free node luasnap_table_add_removed has insertkey take for a key whose main position is
** mp: the lowest free node of t, where t keeps 'lastfree' and mp holds a key in its own main
** position (insertkey then puts the new key in the free node getfreepos returns and links it
** after mp); NULL otherwise: mp is free (the key goes there), or its key is out of its main
** position (insertkey moves that key to the free node and puts the new key at mp: the highest
** free node, Lua's choice, keeps the moved entry after it more often), or t searches its free
** nodes from the end (fewer than 2^LS_LIMFORLAST nodes). Reads only; bounded by the node
** count. */
static Node *ls_steered_free(lua_State *L, Table *t, Node *mp) {
  TValue mk;
  unsigned int i;
  if (isdummy(t) || !ls_haslastfree(t) || isempty(gval(mp))) return NULL;
  getnodekey(L, &mk, mp);
  if (luaH_mainposition(t, &mk) != mp) return NULL;
  for (i = 0; i < sizenode(t); i++)
    if (keyisnil(gnode(t, i))) return gnode(t, i);
  return NULL;
}

/* For the loader, where a table's saved layout did not apply (another hash seed or node
** count: the table holds its entries where inserting them put them): puts the key at kidx
** into the table at tidx as an entry that is being removed, so `next(t, k)` (a coroutine
** suspended in a `pairs()` loop that cleared k holds it) finds its node and goes on with the
** nodes after it. dead: the saving VM's collector had cleared the key (it becomes a dead key,
** an identity only; a dead key that is no object matches nothing, and is skipped).
** The entry holds a placeholder until luasnap_table_seal_removed empties it, so that
** inserting the next removed key cannot take its node (insertkey reuses a node whose value is
** empty, at its main position). Returns 0 inserted; 1 skipped, nothing changed.
** Neither allocates nor raises (the caller reserves two stack slots). */
int luasnap_table_add_removed(lua_State *L, int tidx, int kidx, int dead) {
  Table *t = ls_table_at(L, tidx);
  const TValue *k = ls_index2value(L, kidx);
  TValue res;
  Node *mp, *low, *oldlf = NULL;
  if (t == NULL) return 1;
  /* Keys Lua's own insertion takes as they are: no nil, NaN or float with an integer value
  ** (a table holds that as the integer; no saver writes one), no dead key that is no object.
  ** An integer key in the array part needs no node: `next` finds it by its index. */
  switch (ttypetag(k)) {
    case LUA_VNUMINT:
      if (l_castS2U(ivalue(k)) - 1u < luaH_asize(t)) return 1;
      break;
    case LUA_VNUMFLT: {
      lua_Integer i;
      if (luai_numisnan(fltvalue(k)) || luaV_flttointeger(fltvalue(k), &i, F2Ieq)) return 1;
      break;
    }
    case LUA_VNIL:
      return 1;
    default:
      break;
  }
  if (dead && !iscollectable(k)) return 1;
  /* Invariant checked: t holds k in no node, live, removed or dead (no lookup and no `next`
  ** can then stop at another node than the one inserted here, and no live key is shadowed:
  ** a removed key that a live key of t equals, or one a file names twice, is skipped). */
  if (luaH_get(t, k, &res) != LUA_VABSTKEY) return 1;
  if (!isdummy(t) && iscollectable(k) && ls_dead_key_in_chain(t, k)) return 1;
  /* Objects get their identity before their position is computed, as luaH_newkey does. */
  if (iscollectable(k) && !ttisstring(k) && !noids(t)) luaH_keyid(L, gcvalue(k));
  /* Invariant checked: the insertion finds a node without growing the table (a rehash would
  ** drop the entries removed so far, and a forged list could grow it without end): a table
  ** without room skips the key. */
  mp = luaH_mainposition(t, k);
  if (!ls_insert_fits(t, mp)) return 1;
  /* Where k goes into a free node of Lua's choosing (its main position holds a key in that
  ** key's own main position: insertkey links k after it, in the node getfreepos returns),
  ** that node is the lowest free one: `next` visits nodes by index, so a coroutine suspended
  ** at k visits every entry in a node after it, and the lowest free node leaves the most
  ** there (with Lua's own choice, the highest, a loop that clears each entry left out 47% of
  ** the entries it had not reached in tests/removed_keys_honest.rs, 30% with the lowest). */
  low = ls_steered_free(L, t, mp);
  if (low != NULL) {
    /* Invariant relied on: every node at or above 'lastfree' is in use (Lua's, and
    ** ls_insert_fits found a free node below it, so the lowest is below it too). getfreepos
    ** looks downward from 'lastfree', so it returns `low` first; 'lastfree' then goes back
    ** to where it was, above `low`, and every node at or above it is still in use. Only the
    ** free node chosen differs: insertkey links any free node alike. */
    oldlf = ls_getlastfree(t);
    ls_getlastfree(t) = low + 1;
  }
  /* Lua's own insertion (chains, moved colliding nodes, the collector's barrier), with the
  ** placeholder as the value. */
  setobj2s(L, L->top.p, k);
  setpvalue(s2v(L->top.p + 1), dead ? LS_MARK_DEAD : LS_MARK_REMOVED);
  L->top.p += 2;
  lua_rawset(L, tidx < 0 ? tidx - 2 : tidx);
  if (low != NULL) {
    lua_assert(!keyisnil(low) && low < oldlf);
    ls_getlastfree(t) = oldlf;
  }
  return 0;
}

/* Empties the entries luasnap_table_add_removed gave the table at tidx (their placeholder
** values), making the dead ones' keys dead: they stay in their chains and match only `next`
** (by identity), as Lua's own removed entries. Returns how many. Neither allocates nor
** raises. */
uint32_t luasnap_table_seal_removed(lua_State *L, int tidx) {
  Table *t = ls_table_at(L, tidx);
  uint32_t i, n = 0;
  if (t == NULL || isdummy(t)) return 0;
  for (i = 0; i < sizenode(t); i++) {
    Node *nd = gnode(t, i);
    void *mark;
    if (!ttislightuserdata(gval(nd))) continue;
    mark = pvalue(gval(nd));
    if (mark != LS_MARK_REMOVED && mark != LS_MARK_DEAD) continue;
    setempty(gval(nd));
    if (mark == LS_MARK_DEAD && keyiscollectable(nd)) setdeadkey(nd);
    n++;
  }
  invalidateTMcache(t);
  return n;
}

/* Resizes the hash part of the table at idx to `nodes` nodes (a power of two at least the
** count of its live entries: the caller's check), its entries reinserted; the array part
** keeps its size. Raises a memory error. */
void luasnap_table_resize_nodes(lua_State *L, int idx, uint32_t nodes) {
  Table *t = ls_table_at(L, idx);
  if (t == NULL) return;
  luaH_resize(L, t, luaH_asize(t), nodes);
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
                           uint32_t size, uint32_t lastfree, uint32_t seed, int keys,
                           void *scratch, void *memo) {
  Table *t = ls_table_at(L, idx), *kt = NULL;
  if (t == NULL) return -1;
  if (keys != 0) {
    kt = ls_table_at(L, keys);
    if (kt == NULL) return -1;
  }
  return relayout(L, t, codes, nexts, size, lastfree, seed, kt, scratch, (ls_rmemo *)memo);
}

/* ----- the build program ----- */

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
int luasnap_table_build(lua_State *L, int strs, int objs, const luasnap_val *ops, int n,
                        int finals, const uint32_t *lay, const int32_t *laynx, void *scratch,
                        void *memo) {
  Table *st = ls_table_at(L, strs);
  Table *ot = ls_table_at(L, objs);
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
          /* Invariant checked: with LS_BUILD_NOFINAL (foreign loads), no loaded object is
          ** marked for finalization. Lua marks an object only if its metatable has __gc when
          ** it is set (luaC_checkfinalizer), so refusing such a metatable here is exact. */
          if ((finals & LS_BUILD_NOFINAL) &&
              !isabstkey(luaH_Hgetshortstr(hvalue(mt), G(L)->tmname[TM_GC])))
            return -2 - i;
          t->metatable = hvalue(mt);
          luaC_objbarrier(L, t, hvalue(mt));
          /* A save of format 8 records the tables marked (LS_BUILD_UNMARKED: the loader marks
          ** them when it ends; a batch builds none of them) */
          if (!(finals & LS_BUILD_UNMARKED))
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
        ls_push_closure(L, (Proto *)(uintptr_t)x->bits);
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

