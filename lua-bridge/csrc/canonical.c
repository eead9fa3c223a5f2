/*
** Canonical state: arena bytes that depend on the Lua state alone, not on the host.
**
** After Lua returns to the host, the bytes of the arena must depend on the Lua state alone. Two
** things in a thread's lua_State break that:
** - dead stack slots (at or above the top) keep the last values stored there, among them the
**   light userdata luaL_buffinit pushes as a placeholder: the address of a luaL_Buffer on the
**   *C stack*, which moves with the depth of the host's call chain (string.format, rep, gsub,
**   upper, table.concat, tostring... all use one);
** - a coroutine's nCcalls keeps the C-call depth of whoever resumed it last.
** luasnap_settle_thread resets both; the host calls it on the main thread after every call into
** Lua, and the coroutine library (corolib.c) calls it on a coroutine each time it stops
** running. The other helpers here clear what host calls leave behind: the API string cache,
** slots above the top, free CallInfo records, and light userdata in freed stacks.
*/
#include "lsint.h"

/* Zeroes every stack slot of th at or above its top that is not all-zero bytes already, and
** returns how many it wrote. Comparing first keeps pages whose dead slots are clean unwritten
** (no tracking fault, no dirty page for incremental snapshots).
** Invariant relied on: th is not running (idle main thread, or a coroutine that has just
** yielded, returned or failed; checked below for coroutines), so slots from th->top.p to stack_last + EXTRA_STACK are dead:
** Lua never reads a slot above the top before writing it, and its collector treats that slice
** as dead too (traversethread clears it). All-zero bytes are a nil (LUA_VNIL == 0). */
int luasnap_settle_thread(lua_State *th) {
  static const StackValue zero;
  StkId p = th->top.p, end = th->stack_last.p + EXTRA_STACK;
  int n = 0;
  lua_assert(LUA_VNIL == 0);
  /* Checked, not assumed: a coroutine that is running or normal (status LUA_OK with a call in
  ** progress: ci above base_ci) is left alone. coroutine.resume of such a coroutine fails
  ** ("cannot resume non-suspended coroutine") without running it, and resetting its nCcalls
  ** would erase its non-yieldable count and C-call depth while it is still active (a yield
  ** across table.sort's C frame, unbounded C recursion). It is settled when it stops. */
  if (th != mainthread(G(th)) && th->status == LUA_OK && th->ci != &th->base_ci) return 0;
  for (; p < end; p++) {
    if (memcmp(p, &zero, sizeof zero) != 0) {
      memset(p, 0, sizeof zero);
      n++;
    }
  }
  /* A thread that is not running has no C calls in progress; lua_resume and lua_closethread
  ** set nCcalls from the resumer before running it again, and lua_newthread starts at 0. */
  if (th != mainthread(G(th)) && th->nCcalls != 0) th->nCcalls = 0;
  return n;
}

/* Whether the value at idx is an object the collector can remove from a weak table: not a
** string (Lua keeps strings in weak tables), not a light C function, light userdata, number,
** boolean or nil. */
int luasnap_is_weak_removable(lua_State *L, int idx) {
  const TValue *o = s2v(L->ci->func.p + idx);
  lua_assert(idx > 0 && L->ci->func.p + idx < L->top.p);
  return iscollectable(o) && !ttisstring(o);
}

/* Freed stacks. A thread's stack is reallocated while it runs (growing for a deep call,
** shrinking in the collector's atomic phase or when coroutine.close resets it), and the old
** block goes back to the allocator with whatever its slots held, live or dead: a luaL_Buffer
** placeholder, or the light userdata a host call pushes, would stay in freed arena memory.
** The allocator layer in lua-bridge/src/bridge/canonical.rs (scrubbing_alloc) sits in front of the
** arena's: a block that may be a stack (at least the smallest stack Lua makes) is scrubbed of
** light userdata when it is freed, and is resized by allocate-copy-scrub-free so the old block
** is scrubbed too. The two helpers below are its C half. Scrubbing zeroes only slots
** tagged as light userdata, reading the rest (no page is written unless one is found); a
** freed block is dead, so changing its bytes changes no behaviour. */
#define LS_MIN_STACK_BYTES (((size_t)BASIC_STACK_SIZE + EXTRA_STACK) * sizeof(StackValue))

/* The smallest block that can be a stack (the allocator layer lives in canonical.rs). */
const size_t luasnap_min_stack_bytes = LS_MIN_STACK_BYTES;

/* Whether any stack-value-sized slot of the block is tagged as a light userdata (reads only). */
int luasnap_has_light(const void *p, size_t size) {
  const StackValue *s = (const StackValue *)p;
  size_t i, n = size / sizeof(StackValue);
  for (i = 0; i < n; i++)
    if (rawtt(s2v(s + i)) == LUA_VLIGHTUSERDATA) return 1;
  return 0;
}

/* Zeroes every StackValue-sized slot of the dead block [p, p + size) tagged as a light
** userdata; reads the rest. Invariant: the block is freed or about to be (nothing reads it). */
void luasnap_scrub_light(void *p, size_t size) {
  StackValue *s = (StackValue *)p;
  size_t i, n = size / sizeof(StackValue);
  for (i = 0; i < n; i++)
    if (rawtt(s2v(s + i)) == LUA_VLIGHTUSERDATA) memset(s + i, 0, sizeof(StackValue));
}

/* ----- idle-state scrubbing ----- */

static int luasnap_all_zero(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i;
  for (i = 0; i < n; i++)
    if (b[i] != 0) return 0;
  return 1;
}

/* After a host call, the main thread's dead stack slots and its free CallInfo records still
** hold what the last call left there (setnilvalue rewrites only the tag, and a free CallInfo
** keeps its old function, top and pc). They are arena bytes: a host read between two frames
** (a renderer calling G.digest) would leave the arena different from a run without the read,
** and byte-level checksums (GGRS SyncTest with the arena digest) would mismatch. Zero them:
** dead slots become nil with a zero payload, free CallInfo records all zero but their links.
** Invariant relied on: the thread is idle, so slots at or above L->top and the records after
** L->ci are unused (Lua initializes a record's fields when it takes it for a call). */
void luasnap_scrub_idle_state(lua_State *L) {
  CallInfo *ci;
  /* Dead slots: see luasnap_settle_thread (bytes already zero are not written again, so
  ** untouched pages stay clean for the page tracker). */
  luasnap_settle_thread(L);
  for (ci = L->ci->next; ci != NULL; ci = ci->next) {
    CallInfo *next = ci->next, *previous = ci->previous;
    ci->next = NULL;
    ci->previous = NULL;
    if (!luasnap_all_zero(ci, sizeof(*ci))) memset(ci, 0, sizeof(*ci));
    ci->next = next;
    ci->previous = previous;
  }
}

/* Sets every stack slot above the top to nil. Dead slots keep whatever was last pushed there
** (the library setup leaves a clock-derived seed in one), and they are arena bytes too. */
void luasnap_clear_dead_stack(lua_State *L) {
  StkId p;
  for (p = L->top.p; p < L->stack_last.p + EXTRA_STACK; p++) setnilvalue(s2v(p));
}

/* Refills the API string cache with the fixed string Lua starts it with. luaS_new (behind
** lua_pushstring, lua_getfield, lua_setfield, chunk names...) picks a cache slot from the
** *address* of the C string it is given, so a host string on the Rust heap lands in a slot
** that depends on malloc's history: the cache is arena bytes, and two runs with identical Lua
** state would differ in them. The cache only saves lookups, so resetting it between host calls
** changes no behaviour and makes the idle arena a function of Lua's state alone. */
void luasnap_reset_strcache(lua_State *L) {
  global_State *g = G(L);
  int i, j;
  for (i = 0; i < STRCACHE_N; i++)
    for (j = 0; j < STRCACHE_M; j++)
      if (g->strcache[i][j] != g->memerrmsg)  /* unchanged bytes: no page written */
        g->strcache[i][j] = g->memerrmsg;
}
