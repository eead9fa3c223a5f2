/*
** luasnap's chunk registry.
**
** Save-games name functions by their prototypes, and (later) carry each chunk's source text, so
** the VM keeps, per compiled chunk, a record: a full userdata with two user values, 1 = the source
** text (the exact bytes the compiler read) and 2 = the chunk's first main closure.
**
** Lifetime. Every prototype of the chunk's tree holds its record as one extra trailing constant
** (see chunks.h). A prototype is alive while any function of the chunk is, so the record, and
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
** and messages; C functions to hooks and tracebacks) and register what they compile.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"
#include "lobject.h"
#include "lstate.h"
#include "lfunc.h"
#include "lgc.h"
#include "ldo.h"
#include "lmem.h"
#include "lstring.h"
#include "chunks.h"

#if LUA_VERSION_RELEASE_NUM != 50501
#error "luasnap's chunk registry is built for Lua 5.5.1 exactly"
#endif

#define CHUNKS_KEY "luasnap.chunks"

uint64_t luasnap_proto_hash(const void *p);

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
** srcidx. Leaves the stack as it was. May raise a memory error. */
void luasnap_chunk_register(lua_State *L, int fnidx, int srcidx) {
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
  if (lua_rawgeti(L, -1, print) == LUA_TUSERDATA) {
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
    lua_newuserdatauv(L, 0, 2);
    lua_pushvalue(L, srcidx);
    lua_setiuservalue(L, -2, 1);
    lua_pushvalue(L, fnidx);
    lua_setiuservalue(L, -2, 2);
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
int luasnap_load(lua_State *L, lua_Reader reader, void *data, const char *chunkname,
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
    luasnap_chunk_register(L, -2, -1);
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
  if (status == LUA_OK) luasnap_chunk_register(L, -1, idx);
  return status;
}

/* luaL_loadfilex (lauxlib.c), through luasnap_load. */
typedef struct LoadF {
  unsigned n;
  FILE *f;
  char buff[BUFSIZ];
} LoadF;

static const char *getF(lua_State *L, void *ud, size_t *size) {
  LoadF *lf = (LoadF *)ud;
  (void)L;
  if (lf->n > 0) {
    *size = lf->n;
    lf->n = 0;
  } else {
    if (feof(lf->f)) return NULL;
    *size = fread(lf->buff, 1, sizeof(lf->buff), lf->f);
  }
  return lf->buff;
}

static int errfile(lua_State *L, const char *what, int fnameindex) {
  int err = errno;
  const char *filename = lua_tostring(L, fnameindex) + 1;
  if (err != 0)
    lua_pushfstring(L, "cannot %s %s: %s", what, filename, strerror(err));
  else
    lua_pushfstring(L, "cannot %s %s", what, filename);
  lua_remove(L, fnameindex);
  return LUA_ERRFILE;
}

static int skipBOM(FILE *f) {
  int c = getc(f);
  if (c == 0xEF && getc(f) == 0xBB && getc(f) == 0xBF) return getc(f);
  return c;
}

static int skipcomment(FILE *f, int *cp) {
  int c = *cp = skipBOM(f);
  if (c == '#') {
    do {
      c = getc(f);
    } while (c != EOF && c != '\n');
    *cp = getc(f);
    return 1;
  }
  return 0;
}

int luasnap_loadfilex(lua_State *L, const char *filename, const char *mode) {
  LoadF lf;
  int status, readstatus;
  int c;
  int fnameindex = lua_gettop(L) + 1;
  if (filename == NULL) {
    lua_pushliteral(L, "=stdin");
    lf.f = stdin;
  } else {
    lua_pushfstring(L, "@%s", filename);
    errno = 0;
    lf.f = fopen(filename, "r");
    if (lf.f == NULL) return errfile(L, "open", fnameindex);
  }
  lf.n = 0;
  if (skipcomment(lf.f, &c)) lf.buff[lf.n++] = '\n';
  if (c == LUA_SIGNATURE[0]) {
    lf.n = 0;
    if (filename) {
      errno = 0;
      lf.f = freopen(filename, "rb", lf.f);
      if (lf.f == NULL) return errfile(L, "reopen", fnameindex);
      skipcomment(lf.f, &c);
    }
  }
  if (c != EOF) lf.buff[lf.n++] = (char)c;
  status = luasnap_load(L, getF, &lf, lua_tostring(L, -1), mode);
  readstatus = ferror(lf.f);
  errno = 0;
  if (filename) fclose(lf.f);
  if (readstatus) {
    lua_settop(L, fnameindex);
    return errfile(L, "read", fnameindex);
  }
  lua_remove(L, fnameindex);
  return status;
}

/* ---------- the base library's loaders (lbaselib.c), through the registry ---------- */

static int load_aux(lua_State *L, int status, int envidx) {
  if (status == LUA_OK) {
    if (envidx != 0) {
      lua_pushvalue(L, envidx);
      if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    }
    return 1;
  }
  luaL_pushfail(L);
  lua_insert(L, -2);
  return 2;
}

static const char *getMode(lua_State *L, int idx) {
  const char *mode = luaL_optstring(L, idx, NULL);
  if (mode != NULL && strchr(mode, 'B') != NULL) luaL_argerror(L, idx, "invalid mode");
  return mode;
}

static int chunks_loadfile(lua_State *L) {
  const char *fname = luaL_optstring(L, 1, NULL);
  const char *mode = getMode(L, 2);
  int env = (!lua_isnone(L, 3) ? 3 : 0);
  int status = luasnap_loadfilex(L, fname, mode);
  return load_aux(L, status, env);
}

static const char *generic_reader(lua_State *L, void *ud, size_t *size) {
  int *firstcall = (int *)ud;
  luaL_checkstack(L, 2, "too many nested functions");
  if (*firstcall)
    *firstcall = 0;
  else
    lua_pop(L, 1);
  lua_pushvalue(L, 1);
  lua_call(L, 0, 1);
  if (lua_isnil(L, -1)) {
    *size = 0;
    return NULL;
  } else if (!lua_isstring(L, -1))
    luaL_error(L, "reader function must return a string");
  return lua_tolstring(L, -1, size);
}

static int chunks_load(lua_State *L) {
  int status;
  size_t l;
  const char *s = lua_tolstring(L, 1, &l);
  const char *mode = getMode(L, 3);
  int env = (!lua_isnone(L, 4) ? 4 : 0);
  if (s != NULL) {
    const char *chunkname = luaL_optstring(L, 2, s);
    status = luasnap_loadstring(L, 1, chunkname, mode);
  } else {
    int firstcall = 1;
    const char *chunkname = luaL_optstring(L, 2, "=(load)");
    luaL_checktype(L, 1, LUA_TFUNCTION);
    status = luasnap_load(L, generic_reader, &firstcall, chunkname, mode);
  }
  return load_aux(L, status, env);
}

static int dofilecont(lua_State *L, int d1, lua_KContext d2) {
  (void)d1;
  (void)d2;
  return lua_gettop(L) - 1;
}

static int chunks_dofile(lua_State *L) {
  const char *fname = luaL_optstring(L, 1, NULL);
  lua_settop(L, 1);
  if (luasnap_loadfilex(L, fname, "bt") != LUA_OK) return lua_error(L);
  lua_callk(L, 0, LUA_MULTRET, 0, dofilecont);
  return dofilecont(L, 0, 0);
}

/* ---------- require's Lua searcher (loadlib.c), through the registry ---------- */

#if !defined(LUA_PATH_SEP)
#define LUA_PATH_SEP ";"
#endif
#if !defined(LUA_PATH_MARK)
#define LUA_PATH_MARK "?"
#endif
#if !defined(LUA_LSUBSEP)
#define LUA_LSUBSEP LUA_DIRSEP
#endif

static int readable(const char *filename) {
  FILE *f = fopen(filename, "r");
  if (f == NULL) return 0;
  fclose(f);
  return 1;
}

static const char *getnextfilename(char **path, char *end) {
  char *sep;
  char *name = *path;
  if (name == end) return NULL;
  if (*name == '\0') {
    *name = *LUA_PATH_SEP;
    name++;
  }
  sep = strchr(name, *LUA_PATH_SEP);
  if (sep == NULL) sep = end;
  *sep = '\0';
  *path = sep;
  return name;
}

static void pusherrornotfound(lua_State *L, const char *path) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "no file '");
  luaL_addgsub(&b, path, LUA_PATH_SEP, "'\n\tno file '");
  luaL_addstring(&b, "'");
  luaL_pushresult(&b);
}

static const char *searchpath(lua_State *L, const char *name, const char *path,
                              const char *sep, const char *dirsep) {
  luaL_Buffer buff;
  char *pathname;
  char *endpathname;
  const char *filename;
  if (*sep != '\0' && strchr(name, *sep) != NULL) name = luaL_gsub(L, name, sep, dirsep);
  luaL_buffinit(L, &buff);
  luaL_addgsub(&buff, path, LUA_PATH_MARK, name);
  luaL_addchar(&buff, '\0');
  pathname = luaL_buffaddr(&buff);
  endpathname = pathname + luaL_bufflen(&buff) - 1;
  while ((filename = getnextfilename(&pathname, endpathname)) != NULL) {
    if (readable(filename)) return lua_pushstring(L, filename);
  }
  luaL_pushresult(&buff);
  pusherrornotfound(L, lua_tostring(L, -1));
  return NULL;
}

static int chunks_searcher_Lua(lua_State *L) {
  const char *filename;
  const char *path;
  const char *name = luaL_checkstring(L, 1);
  lua_getfield(L, lua_upvalueindex(1), "path");
  path = lua_tostring(L, -1);
  if (path == NULL) luaL_error(L, "'package.%s' must be a string", "path");
  filename = searchpath(L, name, path, ".", LUA_LSUBSEP);
  if (filename == NULL) return 1;
  if (luasnap_loadfilex(L, filename, "bt") == LUA_OK) {
    lua_pushstring(L, filename);
    return 2;
  }
  return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", lua_tostring(L, 1),
                    filename, lua_tostring(L, -1));
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

struct str_Writer {
  int init;
  luaL_Buffer B;
};

static int writer(lua_State *L, const void *b, size_t size, void *ud) {
  struct str_Writer *state = (struct str_Writer *)ud;
  if (!state->init) {
    state->init = 1;
    luaL_buffinit(L, &state->B);
  }
  if (b == NULL) {
    luaL_pushresult(&state->B);
    lua_replace(L, 1);
  } else
    luaL_addlstring(&state->B, (const char *)b, size);
  return 0;
}

static int chunks_str_dump(lua_State *L) {
  struct str_Writer state;
  int strip = lua_toboolean(L, 2);
  luaL_argcheck(L, lua_type(L, 1) == LUA_TFUNCTION && !lua_iscfunction(L, 1), 1,
                "Lua function expected");
  lua_pushvalue(L, 1);
  state.init = 0;
  luasnap_dump(L, writer, &state, strip);
  lua_settop(L, 1);
  return 1;
}

/* ---------- installing ---------- */

/* Replaces the loaders of whichever libraries are open. Raises on memory errors. */
void luasnap_chunks_install(lua_State *L) {
  lua_pushglobaltable(L);
  if (lua_getfield(L, -1, "load") == LUA_TFUNCTION) {
    lua_pushcfunction(L, chunks_load);
    lua_setfield(L, -3, "load");
    lua_pushcfunction(L, chunks_loadfile);
    lua_setfield(L, -3, "loadfile");
    lua_pushcfunction(L, chunks_dofile);
    lua_setfield(L, -3, "dofile");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, -1, "string") == LUA_TTABLE) {
    lua_pushcfunction(L, chunks_str_dump);
    lua_setfield(L, -2, "dump");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, -1, "package") == LUA_TTABLE) {
    if (lua_getfield(L, -1, "searchers") == LUA_TTABLE) {
      lua_pushvalue(L, -2);
      lua_pushcclosure(L, chunks_searcher_Lua, 1);
      lua_rawseti(L, -2, 2);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
}

/* Calls f(p, ud) for every prototype of every chunk in the registry table (not of chunks kept
** out of it by a fingerprint collision). Does not allocate; the collector must be stopped. */
void luasnap_chunks_each_proto(lua_State *L, void (*f)(const void *, void *), void *ud) {
  void luasnap_proto_tree(const void *p, void (*f)(const void *, void *), void *ud);
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
** registry["luasnap.host_chunks"] (record -> true). For the host's own code (Vm::exec): saves
** name its functions even after the game dropped them all, and the same code run every frame
** shares one record, so it is kept once. May raise a memory error. */
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
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* ---------- save-games: a prototype's chunk, and finding a chunk again (persist/) ----------
** The save-game writer names each function by its chunk (source text and chunk name, written
** once per chunk) and its position in the chunk's prototype tree; the loader reuses a live
** chunk with the same text and name, or compiles the text. These helpers only read: none of
** them allocates or runs the collector. */

/* What the writer needs of a prototype's chunk (mirrors ChunkDesc in persist/write.rs). */
typedef struct luasnap_chunk_desc {
  const void *rec;   /* the record: identifies the chunk (its text) */
  const void *main;  /* the main prototype of the record's first tree */
  const char *src;   /* the source text (or binary chunk) the compiler read */
  size_t srclen;
  const char *name;  /* the chunk name (NULL if the tree has none) */
  size_t namelen;
} luasnap_chunk_desc;

/* Describes the chunk of prototype p. Returns 0 if p has no record (compiled by other means
** than the registering loaders). */
int luasnap_chunk_describe(const void *p, luasnap_chunk_desc *out) {
  const Proto *q = (const Proto *)p;
  Udata *u = anchor_of(q);
  const Proto *m;
  /* Invariant checked: a record is a full userdata with the text at 1 and a Lua closure at
  ** 2 (luasnap_chunk_register makes them so; nothing else can reach the hidden constant). */
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

int luasnap_proto_nchildren(const void *p) {
  return ((const Proto *)p)->sizep;
}

/* Child i of p (0-based), or NULL when p has no such child. */
const void *luasnap_proto_child(const void *p, int i) {
  const Proto *q = (const Proto *)p;
  return (i >= 0 && i < q->sizep) ? q->p[i] : NULL;
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
      /* Invariant checked: a record as luasnap_chunk_register makes it. */
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
