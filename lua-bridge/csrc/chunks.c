/*
** luasnap's chunk registry.
**
** Save-games name functions by their prototypes, and (later) carry each chunk's source text, so
** the VM keeps, per compiled chunk, a record: a full userdata with two user values, 1 = the source
** text (the exact bytes the compiler read) and 2 = the chunk's first main closure. A chunk a
** foreign save-game load compiled from the text the file carries has a third, true: it came
** from a save, not from the game (ls_proto_from_save).
**
** Lifetime. Every prototype of the chunk's tree holds its record as one extra trailing constant
** (see proto.h). A prototype is alive while any function of the chunk is, so the record, and
** through it the source text and the main closure (with its _ENV), live exactly as long as some
** function of the chunk does; then the collector frees the whole cycle. The registry table
** `registry["luasnap.chunks"]` (fingerprint -> record) has weak values: it finds records, it
** never keeps them.
**
** Deduplication. A chunk whose fingerprint names a live record with the same source text and
** chunk name (the compiler is deterministic, so those two decide the tree) anchors that record
** instead of a new one: its text is kept once. A different chunk with the same fingerprint
** gets its own record and stays out of the table (the save-game loader then finds its
** prototypes by walking every live prototype).
**
** Hiding. The extra constant is never an operand of an instruction, so the VM and the debug
** library never see it. lua_dump would write it: luasnap_dump hides it (string.dump and the
** save-game writer go through it).
**
** Entry points. `load`, `loadfile`, `dofile`, `string.dump` and the Lua searcher of `require`
** are replaced by C functions that behave as the stock ones (same arguments, results, errors
** and messages; C functions to hooks and tracebacks) and register what they compile: copies of
** Lua's own, in loaders.c, which compile through ls_load and luasnap_loadstring here.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lauxlib.h"
#include "lmem.h"
#include "lstring.h"

#include "proto.h"
#include "chunks.h"

#define CHUNKS_KEY "luasnap.chunks"
/* name -> the record of the chunk the host last kept under that name (see luasnap_chunk_keep). */
#define CURRENT_KEY "luasnap.current"

static Udata *anchor_of(const Proto *p) {
  return luasnap_has_anchor(p) ? uvalue(&p->k[p->sizek - 1]) : NULL;
}

/* Appends rec as the last constant of every prototype of the tree that has no anchor yet.
** May raise a memory error; every prototype is consistent at any point (sizek matches the
** array, which the collector and luaF_freeproto rely on). */
static void anchor_tree(lua_State *L, Proto *p, Udata *rec) {
  int i;
  if (!luasnap_has_anchor(p)) {
    p->k = luaM_reallocvector(L, p->k, p->sizek, p->sizek + 1, TValue);
    setuvalue(L, &p->k[p->sizek], rec);
    p->sizek++;
    luaC_objbarrier(L, p, rec);
  }
  for (i = 0; i < p->sizep; i++) anchor_tree(L, p->p[i], rec);
}

static int same_name(const TString *a, const TString *b) {
  if (a == b) return 1;
  if (a == NULL || b == NULL) return 0;
  return tsslen(a) == tsslen(b) && memcmp(getstr(a), getstr(b), tsslen(a)) == 0;
}

/* Records the chunk whose main closure is at fnidx and whose source text is the string at
** srcidx; from_save: compiled from a save-game's text by a foreign load, so it gets a record of
** its own, marked (never the game's record for the same text, which would mark the game's code).
** Leaves the stack as it was. May raise a memory error. */
static void chunk_register(lua_State *L, int fnidx, int srcidx, int from_save) {
  int top = lua_gettop(L);
  const TValue *fo;
  Proto *p;
  lua_Integer print;
  Udata *rec = NULL;
  fnidx = lua_absindex(L, fnidx);
  srcidx = lua_absindex(L, srcidx);
  fo = s2v(L->ci->func.p + fnidx);
  /* Invariant checked: only Lua closures have prototypes to anchor. */
  if (!ttisLclosure(fo)) return;
  p = clLvalue(fo)->p;
  if (luasnap_has_anchor(p)) return;  /* registered already */
  luaL_checkstack(L, 4, "too many nested functions");
  print = (lua_Integer)luasnap_proto_hash(p);
  if (luaL_getsubtable(L, LUA_REGISTRYINDEX, CHUNKS_KEY) == 0) {
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
  }
  if (lua_rawgeti(L, -1, print) == LUA_TUSERDATA && !from_save) {
    int same;
    lua_getiuservalue(L, -1, 1);
    same = lua_rawequal(L, -1, srcidx);
    lua_pop(L, 1);
    if (same && lua_getiuservalue(L, -1, 2) == LUA_TFUNCTION) {
      const TValue *o = s2v(L->top.p - 1);
      same = ttisLclosure(o) && same_name(clLvalue(o)->p->source, p->source);
    } else {
      same = 0;
      lua_pushnil(L);
    }
    lua_pop(L, 1);
    if (same) rec = uvalue(s2v(L->top.p - 1));
  } else {
    lua_pop(L, 1);
    lua_pushnil(L);
  }
  if (rec == NULL) {
    int fresh = lua_isnil(L, -1);  /* no live record under this fingerprint */
    lua_pop(L, 1);
    lua_newuserdatauv(L, 0, from_save ? 3 : 2);
    lua_pushvalue(L, srcidx);
    lua_setiuservalue(L, -2, 1);
    lua_pushvalue(L, fnidx);
    lua_setiuservalue(L, -2, 2);
    if (from_save) {
      lua_pushboolean(L, 1);
      lua_setiuservalue(L, -2, 3);
    }
    if (fresh) {
      lua_pushvalue(L, -1);
      lua_rawseti(L, -3, print);
    }
    rec = uvalue(s2v(L->top.p - 1));
  }
  /* rec stays on the stack (alive) while the tree is anchored. */
  anchor_tree(L, p, rec);
  lua_settop(L, top);
}

/* ---------- loading with the source text kept ---------- */

/* Collects what the compiler reads into a userdata buffer at stack slot `box` (a fresh, larger
** userdata replaces it as it grows; the old one is garbage). */
typedef struct Tee {
  lua_Reader reader;
  void *data;
  int box;
  char *buf;
  size_t len, cap;
} Tee;

static const char *tee_reader(lua_State *L, void *ud, size_t *size) {
  Tee *t = (Tee *)ud;
  const char *s = t->reader(L, t->data, size);
  if (s != NULL && *size > 0) {
    if (*size > t->cap - t->len) {
      size_t cap = t->cap ? t->cap : 256;
      char *nb;
      while (cap - t->len < *size) {
        if (cap > ((size_t)-1) / 2) luaL_error(L, "chunk too large");
        cap *= 2;
      }
      luaL_checkstack(L, 1, "too many nested functions");
      nb = (char *)lua_newuserdatauv(L, cap, 0);
      if (t->len) memcpy(nb, t->buf, t->len);
      lua_replace(L, t->box);
      t->buf = nb;
      t->cap = cap;
    }
    memcpy(t->buf + t->len, s, *size);
    t->len += *size;
  }
  return s;
}

/* lua_load, then registers the chunk with the bytes the reader gave. */
int ls_load(lua_State *L, lua_Reader reader, void *data, const char *chunkname,
                 const char *mode) {
  Tee t;
  int status;
  t.reader = reader;
  t.data = data;
  t.buf = NULL;
  t.len = t.cap = 0;
  lua_pushnil(L);
  t.box = lua_gettop(L);
  status = lua_load(L, tee_reader, &t, chunkname, mode);
  if (status == LUA_OK) {
    lua_pushlstring(L, t.buf ? t.buf : "", t.len);
    chunk_register(L, -2, -1, 0);
    lua_pop(L, 1);
  }
  lua_remove(L, t.box);
  return status;
}

typedef struct LoadS {
  const char *s;
  size_t size;
} LoadS;

static const char *getS(lua_State *L, void *ud, size_t *size) {
  LoadS *ls = (LoadS *)ud;
  (void)L;
  if (ls->size == 0) return NULL;
  *size = ls->size;
  ls->size = 0;
  return ls->s;
}

/* luaL_loadbufferx of the string at idx, which is kept as the chunk's source text. */
int luasnap_loadstring(lua_State *L, int idx, const char *chunkname, const char *mode) {
  LoadS ls;
  int status;
  idx = lua_absindex(L, idx);
  ls.s = lua_tolstring(L, idx, &ls.size);
  status = lua_load(L, getS, &ls, chunkname, mode);
  if (status == LUA_OK) chunk_register(L, -1, idx, 0);
  return status;
}

/* luasnap_loadstring in text mode for a foreign save-game load: the chunk's record is marked as
** one from a save (see chunk_register). */
int luasnap_loadstring_from_save(lua_State *L, int idx, const char *chunkname) {
  LoadS ls;
  int status;
  idx = lua_absindex(L, idx);
  ls.s = lua_tolstring(L, idx, &ls.size);
  status = lua_load(L, getS, &ls, chunkname, "t");
  if (status == LUA_OK) chunk_register(L, -1, idx, 1);
  return status;
}

/* Whether prototype p belongs to a chunk a foreign load compiled from a save's text. Reads
** only. */
int ls_proto_from_save(const void *p) {
  Udata *u = anchor_of((const Proto *)p);
  /* Invariant checked: only chunk_register's marked records have a third user value. */
  return u != NULL && u->nuvalue >= 3 && !l_isfalse(&u->uv[2].uv);
}

/* ---------- dumping without the anchors ---------- */

typedef struct Dump {
  lua_Writer w;
  void *data;
  int strip;
  int status;
} Dump;

static void run_dump(lua_State *L, void *ud) {
  Dump *d = (Dump *)ud;
  d->status = lua_dump(L, d->w, d->data, d->strip);
}

static int count_tree(const Proto *p) {
  int i, n = 1;
  for (i = 0; i < p->sizep; i++) n += count_tree(p->p[i]);
  return n;
}

/* Hides the anchor of every prototype of the tree, listing them in `hidden`. */
static void hide_tree(Proto *p, Proto **hidden, int *n) {
  int i;
  if (luasnap_has_anchor(p)) {
    p->sizek--;
    hidden[(*n)++] = p;
  }
  for (i = 0; i < p->sizep; i++) hide_tree(p->p[i], hidden, n);
}

/* lua_dump of the Lua function on top, written as if no anchor were there. */
int luasnap_dump(lua_State *L, lua_Writer writer, void *data, int strip) {
  const TValue *fo = s2v(L->top.p - 1);
  Proto *p;
  Proto **hidden;
  int fidx, n = 0, i, st;
  Dump d;
  /* Invariant checked: lua_dump needs a Lua function on top. */
  if (!ttisLclosure(fo)) return lua_dump(L, writer, data, strip);
  p = clLvalue(fo)->p;
  if (!luasnap_has_anchor(p)) return lua_dump(L, writer, data, strip);
  fidx = lua_gettop(L);
  luaL_checkstack(L, 3, "too many nested functions");
  /* The record stays reachable from the stack while the prototypes do not point to it. */
  setuvalue(L, s2v(L->top.p), anchor_of(p));
  L->top.p++;
  hidden = (Proto **)lua_newuserdatauv(L, sizeof(Proto *) * (size_t)count_tree(p), 0);
  lua_pushvalue(L, fidx);
  hide_tree(p, hidden, &n);
  d.w = writer;
  d.data = data;
  d.strip = strip;
  d.status = 0;
  st = luaD_rawrunprotected(L, run_dump, &d);
  for (i = 0; i < n; i++) hidden[i]->sizek++;
  if (st != LUA_OK) luaD_throw(L, st);
  lua_settop(L, fidx);
  return d.status;
}

/* ---------- the registry's prototypes ---------- */

/* Calls f(p, ud) for every prototype of every chunk in the registry table (not of chunks kept
** out of it by a fingerprint collision). Allocates nothing but, if the registry table was
** never made (its key string may then be gone), that key's string; the collector must be
** stopped. */
void luasnap_chunks_each_proto(lua_State *L, luasnap_proto_fn f, void *ud) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, CHUNKS_KEY) == LUA_TTABLE) {
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      if (lua_type(L, -1) == LUA_TUSERDATA) {
        if (lua_getiuservalue(L, -1, 2) == LUA_TFUNCTION) {
          const TValue *o = s2v(L->top.p - 1);
          if (ttisLclosure(o)) luasnap_proto_tree(clLvalue(o)->p, f, ud);
        }
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
}

/* Keeps the record of the chunk whose main closure is at fnidx alive for the VM's life, in
** registry["luasnap.host_chunks"] (the record's address as a light userdata -> the record).
** For the host's own code (Vm::exec): saves name its functions even after the game dropped
** them all, and the same code run every frame shares one record, so it is kept once. Keyed by
** a light userdata, not by the record: an object that becomes a key takes the next identity
** of the VM (lobject.h, gcoid), and the host's first run of some code (a check a loading
** process makes, not the process that saved) must not shift the identities the game's next
** keys get. This table is never traversed in order. May raise a memory error. */
void luasnap_chunk_keep(lua_State *L, int fnidx) {
  const TValue *fo;
  Proto *p;
  fnidx = lua_absindex(L, fnidx);
  fo = s2v(L->ci->func.p + fnidx);
  /* Invariant checked: only Lua closures have records. */
  if (!ttisLclosure(fo)) return;
  p = clLvalue(fo)->p;
  if (!luasnap_has_anchor(p)) return;
  luaL_checkstack(L, 3, "too many nested functions");
  luaL_getsubtable(L, LUA_REGISTRYINDEX, "luasnap.host_chunks");
  setuvalue(L, s2v(L->top.p), anchor_of(p));
  L->top.p++;
  lua_rawsetp(L, -2, anchor_of(p));
  lua_pop(L, 1);
  /* The latest of the host's chunks under its name is that name's current version. */
  if (p->source != NULL) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, CURRENT_KEY) != LUA_TTABLE) {
      /* Made with room for a game's chunks at the first keep (when the VM is built), so a
      ** later chunk name costs the arena nothing until there are more than 16. */
      lua_pop(L, 1);
      lua_createtable(L, 0, 16);
      lua_pushvalue(L, -1);
      lua_setfield(L, LUA_REGISTRYINDEX, CURRENT_KEY);
    }
    setsvalue2s(L, L->top.p, p->source);
    L->top.p++;
    setuvalue(L, s2v(L->top.p), anchor_of(p));
    L->top.p++;
    lua_rawset(L, -3);
    lua_pop(L, 1);
  }
}

/* The current version of the chunk named name[0..namelen): the main prototype of the chunk the
** host last kept under that name (luasnap_chunk_keep), whose main closure it pushes; NULL, with
** nothing pushed, if there is none. Raises a memory error (the registry key's string). */
const void *luasnap_chunk_current(lua_State *L, const char *name, size_t namelen) {
  const void *found = NULL;
  luaL_checkstack(L, 3, "too many nested functions");
  if (lua_getfield(L, LUA_REGISTRYINDEX, CURRENT_KEY) == LUA_TTABLE) {
    lua_pushlstring(L, name, namelen);
    if (lua_rawget(L, -2) == LUA_TUSERDATA) {
      Udata *u = uvalue(s2v(L->top.p - 1));
      /* Invariant checked: a record as chunk_register makes it. */
      if (u->nuvalue >= 2 && ttisLclosure(&u->uv[1].uv)) {
        found = clLvalue(&u->uv[1].uv)->p;
        setobj2s(L, L->top.p - 2, &u->uv[1].uv);
        lua_pop(L, 1);
        return found;
      }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return found;
}

/* ---------- save-games: a prototype's chunk, and finding a chunk again (persist/) ----------
** The save-game writer names each function by its chunk (source text and chunk name, written
** once per chunk) and its position in the chunk's prototype tree; the loader reuses a live
** chunk with the same text and name, or compiles the text. These helpers only read: none of
** them allocates or runs the collector. */

/* Describes the chunk of prototype p. Returns 0 if p has no record (compiled by other means
** than the registering loaders). */
int luasnap_chunk_describe(const void *p, luasnap_chunk_desc *out) {
  const Proto *q = (const Proto *)p;
  Udata *u = anchor_of(q);
  const Proto *m;
  /* Invariant checked: a record is a full userdata with the text at 1 and a Lua closure at
  ** 2 (chunk_register makes them so; nothing else can reach the hidden constant). */
  if (u == NULL || u->nuvalue < 2 || !ttisstring(&u->uv[0].uv) || !ttisLclosure(&u->uv[1].uv))
    return 0;
  m = clLvalue(&u->uv[1].uv)->p;
  out->rec = u;
  out->main = m;
  out->src = getstr(tsvalue(&u->uv[0].uv));
  out->srclen = tsslen(tsvalue(&u->uv[0].uv));
  out->name = m->source ? getstr(m->source) : NULL;
  out->namelen = m->source ? tsslen(m->source) : 0;
  return 1;
}

/* The main prototype of a live chunk whose fingerprint is `print`, whose source text is
** src[0..srclen) and whose chunk name is name[0..namelen), or NULL. Leaves the stack as it
** was. May raise a memory error (the registry key's string). */
const void *luasnap_chunk_find(lua_State *L, uint64_t print, const char *src, size_t srclen,
                               const char *name, size_t namelen) {
  const void *found = NULL;
  luaL_checkstack(L, 2, "too many nested functions");
  if (lua_getfield(L, LUA_REGISTRYINDEX, CHUNKS_KEY) == LUA_TTABLE) {
    if (lua_rawgeti(L, -1, (lua_Integer)print) == LUA_TUSERDATA) {
      Udata *u = uvalue(s2v(L->top.p - 1));
      /* Invariant checked: a record as chunk_register makes it. */
      if (u->nuvalue >= 2 && ttisstring(&u->uv[0].uv) && ttisLclosure(&u->uv[1].uv)) {
        TString *s = tsvalue(&u->uv[0].uv);
        const Proto *m = clLvalue(&u->uv[1].uv)->p;
        if (tsslen(s) == srclen && memcmp(getstr(s), src, srclen) == 0 && m->source != NULL &&
            tsslen(m->source) == namelen && memcmp(getstr(m->source), name, namelen) == 0)
          found = m;
      }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return found;
}
