/*
** Identities of keys (luasnap's Lua, patch 4: gcoid in lobject.h), for save-games and the
** runtime. A table, closure, full userdata or thread that is a key has a nonzero identity,
** which decides its position in every table that holds it; a save-game carries each object's,
** a load gives them back, so tables keyed by objects keep their layout and order.
**
** Two ranges: identities the state's counter gives (the next number each time an object
** first becomes a key: 1, 2, ... up to 2^31 - 1, then from 1 again: ltable.c, luaH_keyid;
** the state also counts how many it gave, which a whole-game save carries), and name
** identities, bit 31
** set, that a permanent gets from its name when it is registered (luasnap_name_identity): the
** same in every VM whatever it registered before, so a loaded table keyed by `string` or by a
** native finds it where the saving VM put it. Invariant kept by every setter here: an
** identity never changes once nonzero (tables holding the object as a key would lose it).
*/
#include "lsint.h"
#include "ltable.h"

/* Bit 31: a name identity (see the top). */
#define LS_NAMED 0x80000000u

/* Whether o (a value) is an object with an identity field: a table, closure, full userdata or
** thread. Strings hash by content; light values have no object. */
static int has_identity(const TValue *o) {
  return iscollectable(o) && !ttisstring(o);
}

uint32_t luasnap_identity_at(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  return has_identity(o) ? gcoid(gcvalue(o)) : 0;
}

uint32_t luasnap_identity(const void *o) {
  return gcoid(cast(GCObject *, cast(void *, o)));
}

int luasnap_set_identity(lua_State *L, int idx, uint32_t id) {
  const TValue *o = ls_index2value(L, idx);
  if (!has_identity(o) || gcoid(gcvalue(o)) != 0 || id == 0) return 0;
  gcoid(gcvalue(o)) = id;
  return 1;
}

void luasnap_name_identity(lua_State *L, int idx, const char *name, size_t len) {
  const TValue *o = ls_index2value(L, idx);
  if (has_identity(o) && gcoid(gcvalue(o)) == 0)
    gcoid(gcvalue(o)) = LS_NAMED | luasnap_name_hash(name, len);
}

uint64_t luasnap_key_counter(lua_State *L) {
  return G(L)->keycount;
}

void luasnap_set_key_counter(lua_State *L, uint64_t n) {
  /* The invariant at luaH_keyid (ltable.c): lastid follows from keycount. */
  G(L)->keycount = n;
  G(L)->lastid = n == 0 ? 0 : (unsigned int)(1 + (n - 1) % LUASNAP_ID_MAX);
}
