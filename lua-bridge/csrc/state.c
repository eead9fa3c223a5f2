/*
** The collector and memory, as the serializer controls them: emergency collections stopped
** while it holds raw pointers, finalizers refused for foreign loads, stack room that reports a
** memory failure as one, the heap's size for a load's growth cap.
*/
#include "lsint.h"
#include "lmem.h"
#include "lauxlib.h"

/* Stops (on > 0) or allows (on == 0) emergency collections, or only asks (on < 0); returns
** whether they were stopped. While a load resolves prototypes through raw pointers, no
** collection may run behind its back; it re-allows them at the end, and stops them again after
** any Lua code it called (a collection there invalidates what it looked up, and resets the
** flag). A persist stops them too: it keeps objects' addresses (ids, scanned batches) that a
** collection clearing a weak table could free. */
int luasnap_gc_stopem(lua_State *L, int on) {
  int old = G(L)->gcstopem;
  if (on >= 0) G(L)->gcstopem = on ? 1 : 0;
  return old;
}

/* Marks (on != 0) or unmarks the state as one where no object may be marked for finalization,
** returning whether it was marked. A foreign load without finalizers marks it for the whole
** load: luaC_checkfinalizer marks nothing while GCSTPCLS is set (lgc.c: "no extra finalizers
** after here", as when a state closes), so a metatable with __gc that a registered
** constructor sets (setmetatable with a class from the file's upvalues) gives no finalizer
** either, not only those the loader sets and refuses. Invariant kept: nothing else runs with
** the bit: lua_gc ignores every call while it is set (the load has stopped the collector
** before, and restarts it after unmarking). */
int luasnap_gc_nofinal(lua_State *L, int on) {
  global_State *g = G(L);
  int was = (g->gcstp & GCSTPCLS) != 0;
  if (on) g->gcstp |= GCSTPCLS;
  else g->gcstp &= (lu_byte)~GCSTPCLS;
  return was;
}

/* Marks the table or full userdata on top for finalization if its metatable has __gc now,
** as setmetatable would have with that metatable (luaC_checkfinalizer: nothing for an object
** already marked, a metatable without __gc, or while GCSTPCLS is set, as in loads without
** finalizers). For the loader: an object whose metatable was still being built when it was
** set (a class that is its own metatable gets its __gc after). */
void luasnap_recheck_finalizer(lua_State *L) {
  const TValue *o = s2v(L->top.p - 1);
  Table *mt;
  if (ttistable(o)) mt = hvalue(o)->metatable;
  else if (ttisfulluserdata(o)) mt = uvalue(o)->metatable;
  else return;
  if (mt != NULL) luaC_checkfinalizer(L, gcvalue(o), mt);
}

/* luaL_checkstack for the serializer: room for n more values, else an error that says why.
** luaL_checkstack reports "stack overflow (msg)" whether the stack is at Lua's limit or its
** growth failed for want of memory; a load or save under a memory cap then reads as a stack
** overflow. Invariant used: below LUAI_MAXSTACK slots a failed growth is a memory failure
** (LS_MAXSTACK: luaD_growstack refuses only sizes over it, and fails otherwise only when the
** reallocation does). */
void luasnap_checkstack(lua_State *L, int n, const char *msg) {
  if (lua_checkstack(L, n)) return;
  if ((L->top.p - L->stack.p) + n + EXTRA_STACK <= LS_MAXSTACK) luaM_error(L);
  luaL_error(L, "stack overflow (%s)", msg);
}

/* Raises Lua's memory error, as an allocation failing would (for the loader, when restoring
** a coroutine's stack or frames ran out of memory). */
_Noreturn void luasnap_raise_memerr(lua_State *L) {
  luaM_error(L);
}

/* Bytes the VM has allocated (for a load's heap-growth cap). */
uint64_t luasnap_heap_bytes(lua_State *L) {
  return (uint64_t)gettotalbytes(G(L));
}
