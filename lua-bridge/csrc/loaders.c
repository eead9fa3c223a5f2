/*
** The loaders that register what they compile (chunks.c): copies of Lua 5.5.1's own, changed
** only to compile through the registry. LUASNAP-PATCHES.md (csrc/lua-5.5.1) lists each function
** here with the one it copies and what differs, for re-diffing on a Lua update.
**
** Each behaves as the stock one (same arguments, results, errors and messages; C functions to
** hooks and tracebacks): luaL_loadfilex (lauxlib.c), load, loadfile and dofile (lbaselib.c),
** require's Lua searcher (loadlib.c) and string.dump (lstrlib.c).
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "luasnap.h"
#include "chunks.h"

/* ---------- luaL_loadfilex (lauxlib.c), through ls_load ---------- */

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
  status = ls_load(L, getF, &lf, lua_tostring(L, -1), mode);
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
    status = ls_load(L, generic_reader, &firstcall, chunkname, mode);
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

/* ---------- require in the deterministic profile: the game's own modules only ----------
** The deterministic profile has no package library (no search paths, no C modules): its
** `require` (bridge/modules.rs) finds the modules the host gave the VM, by name, and these two
** steps do the rest as stock `require` does. Each module is loaded as a chunk of the host's
** (kept, so saves carry it and a newer version of it is found by name) named "@path". */

/* Step 1: checks the name (argument 1) and leaves [name, package.loaded] on the stack; if
** package.loaded[name] is true, pushes it and returns 1 (require returns it), else 0. */
int luasnap_require_loaded(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  lua_settop(L, 1);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE); /* 2 */
  if (lua_getfield(L, 2, name) != LUA_TNIL && lua_toboolean(L, -1)) return 1;
  lua_pop(L, 1);
  return 0;
}

/* Step 2, on [name, package.loaded]: loads the module's source src[0..srclen) as the chunk
** "@path", calls it with (name, path), remembers its result (or true) in package.loaded and
** returns 2 (that value and the path). path NULL: the VM has no such module; raises the error
** stock require gives, which pcall catches (libraries probe for optional modules that way);
** with src not NULL, the module is there but could not be read, and src[0..srclen) says why. */
int luasnap_require_load(lua_State *L, const char *path, size_t pathlen, const char *src,
                         size_t srclen) {
  const char *name = lua_tostring(L, 1);
  if (path == NULL && src != NULL) {
    lua_pushlstring(L, src, srclen);
    return luaL_error(L, "module '%s' could not be read: %s", name, lua_tostring(L, -1));
  }
  if (path == NULL) {
    const char *file = luaL_gsub(L, name, ".", "/");
    return luaL_error(L,
                      "module '%s' not found:\n\tno file '%s.lua' or '%s/init.lua' among the "
                      "game's modules (the deterministic profile's require loads only the game's "
                      "own Lua files: its folder, or VmBuilder::module)",
                      name, file, file);
  }
  lua_pushlstring(L, path, pathlen);       /* 3 */
  lua_pushfstring(L, "@%s", lua_tostring(L, 3)); /* 4: the chunk name */
  lua_pushlstring(L, src, srclen);         /* 5 */
  if (luasnap_loadstring(L, 5, lua_tostring(L, 4), "t") != LUA_OK) /* 6: loader or message */
    return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", name,
                      lua_tostring(L, 3), lua_tostring(L, 6));
  luasnap_chunk_keep(L, 6);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 3);
  lua_call(L, 2, 1); /* 6: the loader's result */
  if (!lua_isnil(L, -1)) lua_setfield(L, 2, name);
  else lua_pop(L, 1);
  if (lua_getfield(L, 2, name) == LUA_TNIL) {
    lua_pushboolean(L, 1);
    lua_copy(L, -1, -2);
    lua_setfield(L, 2, name);
  }
  lua_pushvalue(L, 3);
  return 2;
}

/* ---------- string.dump (lstrlib.c), without the anchors ---------- */

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
