/*
** Identities of light C functions as table keys (luasnap patch 4, LUASNAP-PATCHES.md in
** lua-5.5.1). Compiled into the Lua library: ltable.c calls luasnap_cfunction_id.
**
** A light C function is a bare pointer into the executable, which ASLR loads at another
** address in each process, so stock Lua puts `names[string.format]` in another node in each
** process and `pairs(names)` visits the keys in another order. Here a function the standard
** library names (`string.format`, `ipairs#aux`: the names the save-game permanents give
** them) hashes by its name instead, which is the same in every process of the same build and
** across builds. A function no library names (a C module's, a method in a C metatable) still
** hashes by its address, as in stock Lua.
**
** The names are per process, not per state: ltable.c hashes without a lua_State. So the map
** is shared by every VM of the process and filled as VMs open their libraries
** (persist::install calls luasnap_cfunction_name for each library function, choosing the
** least name when one function has several).
**
** Invariant: a function's identity never changes once it is in the map, and a function is
** entered before any VM could use it as a key. A VM names its functions while it opens its
** libraries, before any other code runs in it, and every VM names every function its
** profile reaches, so a function that one VM hashed by address is never named later by
** another (the deterministic profile reaches no function that the standard profile names
** differently, and the other way round). The first name entered wins; a later, different
** name for the same function is ignored (it cannot happen for the standard library).
**
** Concurrency: VMs in other threads read the map while one thread enters names. Entries are
** only ever added, in place: the identity is stored first, then the function pointer with
** release order; a reader loads the pointer with acquire order and only then the identity.
** A reader that misses an entry being added sees the address hash, which the invariant
** above says no VM needs for that function.
*/
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "lua.h"
#include "lobject.h"
#include "ltable.h"
#include "luasnap.h"

/* Slots of the map: room for 2048 named functions at half load (the standard library and
** luasnap's own have about 250). Names past that are not entered (the address hash stays). */
#define CF_SLOTS 4096u
#define CF_MAX (CF_SLOTS / 2u)

typedef struct {
  lua_CFunction f;  /* NULL: a free slot; written last, with release order */
  unsigned int id;
} CfEntry;

static CfEntry cf_map[CF_SLOTS];
static unsigned int cf_count;  /* entries; under cf_lock */
static pthread_mutex_t cf_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned int cf_slot(lua_CFunction f) {
  uint64_t x = (uint64_t)(uintptr_t)f;
  x ^= x >> 29;
  x *= 0x9e3779b97f4a7c15ULL;
  return (unsigned int)(x >> 40) & (CF_SLOTS - 1u);
}

/* FNV-1a over a name: a light C function's identity, the same in every process (and, with
** bit 31 set, a permanent object's: see luasnap_name_identity in csrc/ident.c). */
unsigned int luasnap_name_hash(const char *name, size_t len) {
  uint32_t h = 2166136261u;
  size_t i;
  for (i = 0; i < len; i++) { h ^= (unsigned char)name[i]; h *= 16777619u; }
  return (unsigned int)h;
}

unsigned int luasnap_cfunction_id(lua_CFunction f) {
  unsigned int i = cf_slot(f);
  for (;;) {
    lua_CFunction g = __atomic_load_n(&cf_map[i].f, __ATOMIC_ACQUIRE);
    if (g == f) return cf_map[i].id;
    if (g == NULL) return (unsigned int)((uintptr_t)f & UINT_MAX);  /* stock: the address */
    i = (i + 1u) & (CF_SLOTS - 1u);
  }
}

/* Whether a library name gives f its identity (else it hashes by its address). */
int luasnap_cfunction_named(lua_CFunction f) {
  unsigned int i = cf_slot(f);
  for (;;) {
    lua_CFunction g = __atomic_load_n(&cf_map[i].f, __ATOMIC_ACQUIRE);
    if (g == f) return 1;
    if (g == NULL) return 0;
    i = (i + 1u) & (CF_SLOTS - 1u);
  }
}

/* Enters `name` as the identity of `f` unless f has one already. Returns 1 if entered, 0 if
** f was named before (the name then stays the first one), -1 if the map is full. */
int luasnap_cfunction_name(lua_CFunction f, const char *name, size_t len) {
  unsigned int i;
  int r = 0;
  pthread_mutex_lock(&cf_lock);
  i = cf_slot(f);
  for (;;) {
    lua_CFunction g = cf_map[i].f;
    if (g == f) break;
    if (g == NULL) {
      if (cf_count >= CF_MAX) { r = -1; break; }
      cf_map[i].id = luasnap_name_hash(name, len);
      __atomic_store_n(&cf_map[i].f, f, __ATOMIC_RELEASE);
      cf_count++;
      r = 1;
      break;
    }
    i = (i + 1u) & (CF_SLOTS - 1u);
  }
  pthread_mutex_unlock(&cf_lock);
  return r;
}
