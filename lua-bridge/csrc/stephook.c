/*
** The host's instruction-budget hook (see stephook.h).
*/
#include "stephook.h"

lua_Hook ls_step_hook = NULL;

void luasnap_register_step_hook(lua_Hook h) {
  __atomic_store_n(&ls_step_hook, h, __ATOMIC_RELAXED);
}
