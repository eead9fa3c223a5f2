/*
** chunks.h: the chunk registry, as loaders.c and state.c use it (chunks.c defines it; see there).
*/
#ifndef LUASNAP_CHUNKS_H
#define LUASNAP_CHUNKS_H

#include "lua.h"

/* lua_load, then registers the chunk with the bytes the reader gave as its source text.
** Raises on L (memory). */
int ls_load(lua_State *L, lua_Reader reader, void *data, const char *chunkname,
            const char *mode);

/* Whether prototype p belongs to a chunk a foreign load compiled from a save-game's text
** (luasnap_loadstring_from_save). Reads only. */
int ls_proto_from_save(const void *p);

#endif
