/*
** The collector and memory, as the serializer controls them: emergency collections stopped
** while it holds raw pointers, finalizers refused for foreign loads, stack room that reports a
** memory failure as one, the heap's size for a load's growth cap.
*/
#include "lsint.h"
#include "lgc.h"
#include "lmem.h"
#include "ltable.h"
#include "ltm.h"
#include "lauxlib.h"

#include "chunks.h"
#include "luasnap.h"

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

/* Makes (on > 0) the state's collections quiet or (on == 0) stock, or only asks (on < 0);
** returns whether they were quiet. A quiet collection clears no weak entry and calls no
** finalizer (Lua patch 10, 'gcisquiet' in lgc.h): the deterministic profile's, so that what a
** game observes of the collector happens only at full collections it or the runtime asks for
** (lua_gc LUA_GCCOLLECT), never at the moments the heap's history picks. Invariant kept:
** the flag is never changed while a collection runs (the host calls this only when idle, and
** a finalizer cannot reach it). */
int luasnap_gc_quiet(lua_State *L, int on) {
  int old = G(L)->gcquiet;
  if (on >= 0) G(L)->gcquiet = on ? 1 : 0;
  return old;
}

/* Makes (on > 0) a removed key (not a number or boolean) that is set again take a new node (Lua patch 11,
** 'luaH_finishset' in ltable.c) or reuse its old one as stock Lua does while the collector has
** not marked it dead (on == 0), or only asks (on < 0); returns whether it was on. The
** deterministic profile's, so that where an entry lands, and the order 'next' gives, does not
** depend on when the collector ran (a load's heap has another schedule). Invariant kept: the
** flag only changes how a set that is about to store into such a node proceeds, so changing it
** between two calls leaves every table valid. */
int luasnap_fresh_keys(lua_State *L, int on) {
  int old = G(L)->freshkeys;
  if (on >= 0) G(L)->freshkeys = on ? 1 : 0;
  return old;
}

/* The bytes of the arena the collector keeps outside Lua's count (LUA_GCCOUNT): the
** remembered set of minor mode (Lua patch 12), its fields in global_State and its buffer,
** which Lua leaves uncounted so that its collector's schedule is stock Lua's. Reads only. */
size_t luasnap_gc_uncounted(lua_State *L) {
  return luaC_remsetbytes(G(L));
}

/* Makes (on != 0) a full collection asked for (lua_gc LUA_GCCOLLECT: collectgarbage()) an
** error, or allows it again (0); returns whether it was an error. The runtime sets it while
** G.digest() runs: a digest reads the state, and a collection point there would clear weak
** entries and run finalizers at a frame only the peer that checksums has. Invariant kept:
** only the host changes it, between its calls into Lua (never while a collection runs). */
int luasnap_gc_nopoints(lua_State *L, int on) {
  int old = G(L)->nopoints;
  G(L)->nopoints = on ? 1 : 0;
  return old;
}

/* A host read's deferral of the collector's steps (Vm::reading): the step an allocation check
** would take while the host reads the state (lua_pushlstring of a path's key checks, and may
** find the debt spent) waits for the game's next check point instead. Begin sets a debt no read
** spends and returns the one it replaced; end gives back that debt, less what the read
** allocated (plus what it freed), as it would be had no step been due. A read that allocates
** nothing so leaves the global state's bytes as they were: the same GCtotalbytes and GCdebt,
** and the step at the same allocation of the next frame as in a run without the read.
** Invariant checked: no collection step ran in between (the deferral's debt is far above any
** read's allocations: LS_READ_DEBT); else the debt is left as the step set it. */
#define LS_READ_DEBT ((l_mem)1 << 50)

int64_t luasnap_gc_defer_begin(lua_State *L) {
  global_State *g = G(L);
  l_mem saved = g->GCdebt;
  luaE_setdebt(g, LS_READ_DEBT);
  return (int64_t)saved;
}

void luasnap_gc_defer_end(lua_State *L, int64_t saved) {
  global_State *g = G(L);
  l_mem spent = LS_READ_DEBT - g->GCdebt;  /* allocated less freed during the read */
  if (g->GCdebt > LS_READ_DEBT / 2)  /* no step (an emergency one) reset the debt */
    luaE_setdebt(g, (l_mem)saved - spent);
}

/* A full collection that is not a point: quiet if the state is (unlike lua_gc LUA_GCCOLLECT,
** which clears the flag while it runs). For the host's housekeeping (after a game's init, after
** a load), which a process that continues a game from a save does at other moments than the
** one that saved it. Call it from a protected body, as lua_gc (finalizers of a stock state run
** protected inside). */
void luasnap_gc_full_quiet(lua_State *L) {
  luaC_fullgc(L, 0);
}

/* Marks (on != 0) or unmarks the state as one where no object may be marked for finalization,
** returning whether it was marked. A foreign load marks it for the whole load (one that allows
** finalizers marks its objects when it ends, luasnap_finalizers_mark): luaC_checkfinalizer marks nothing while GCSTPCLS is set (lgc.c: "no extra finalizers
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

/* The objects a load made: those in 'allgc' before the one at stack index 'since' (the load's
** first table, anchored for the whole load: new objects go to the head of 'allgc', and leave
** it only when freed or marked for finalization). Whether one of them, alive, has a metatable
** whose __gc is present and not one of the game's Lua functions: 0 none, 1 a C function, 2
** anything else but a Lua function, 3 a Lua function compiled from a save-game's text (a chunk
** the game made with load, which a foreign load compiled: code from the file). Reads only. For
** foreign loads that allow finalizers: a file that made table.concat or table.sort a finalizer
** had it run outside every budget. */
int luasnap_finalizers_foreign(lua_State *L, int since) {
  global_State *g = G(L);
  GCObject *last = gcvalue(ls_index2value(L, since));
  GCObject *o;
  for (o = g->allgc; o != NULL && o != last; o = o->next) {
    Table *mt = (o->tt == LUA_VTABLE) ? gco2t(o)->metatable
              : (o->tt == LUA_VUSERDATA) ? gco2u(o)->metatable : NULL;
    const TValue *tm;
    if (mt == NULL || isdead(g, o)) continue;
    tm = luaH_Hgetshortstr(mt, g->tmname[TM_GC]);
    if (isabstkey(tm) || ttisnil(tm)) continue;
    if (ttisLclosure(tm)) {
      if (ls_proto_from_save(clLvalue(tm)->p)) return 3;
      continue;
    }
    return ttisfunction(tm) ? 1 : 2;
  }
  return 0;
}

/* Marks for finalization the objects a load made (see luasnap_finalizers_foreign) whose
** metatable has __gc, in one walk (Lua patch 8, luaC_checkfinalizers), with the state's
** "closing" bit (GCSTPCLS), which a foreign load sets for its whole run, cleared meanwhile if
** 'clear' (the load set it: nothing else runs). */
void luasnap_finalizers_mark(lua_State *L, int since, int clear) {
  global_State *g = G(L);
  GCObject *last = gcvalue(ls_index2value(L, since));
  lu_byte stp = g->gcstp;
  if (clear) g->gcstp &= (lu_byte)~GCSTPCLS;
  luaC_checkfinalizers(L, last);
  g->gcstp = stp;
}

/* Whether the metatable mt (or NULL) has a __gc field. Reads only (no cache of absent
** metamethods is written, unlike gfasttm). */
static int ls_has_gc(global_State *g, Table *mt) {
  const TValue *tm;
  if (mt == NULL) return 0;
  tm = luaH_Hgetshortstr(mt, g->tmname[TM_GC]);
  return !(isabstkey(tm) || ttisnil(tm));
}

/* For the save-game writer: the finalization state of the table or full userdata o (alive):
** LS_FINAL_MARKED if it is marked for finalization (FINALIZEDBIT: on 'finobj', or on
** 'tobefnz' waiting for its finalizer; Lua finalizes it once it is unreachable),
** LS_FINAL_UNMARKED if not though its metatable has __gc (never marked: the __gc came after
** setmetatable; or finalized already and still reachable), LS_FINAL_NONE otherwise. Reads
** only. */
int luasnap_final_state(lua_State *L, const void *o) {
  const GCObject *gco = (const GCObject *)o;
  Table *mt = (gco->tt == LUA_VTABLE) ? gco2t(gco)->metatable
            : (gco->tt == LUA_VUSERDATA) ? gco2u(gco)->metatable : NULL;
  if (tofinalize(gco)) return LS_FINAL_MARKED;
  return ls_has_gc(G(L), mt) ? LS_FINAL_UNMARKED : LS_FINAL_NONE;
}

/* luasnap_final_state of the table or full userdata at stack index idx, whose object (as
** luasnap_finalizer_list gives it: a userdata's header, not its block) goes to *gco. Reads
** only. */
int luasnap_final_state_at(lua_State *L, int idx, const void **gco) {
  const TValue *v = ls_index2value(L, idx);
  *gco = iscollectable(v) ? gcvalue(v) : NULL;
  return *gco ? luasnap_final_state(L, *gco) : LS_FINAL_NONE;
}

/* For the save-game writer: the objects marked for finalization, in the order Lua would
** finalize them were they all unreachable at once ('tobefnz', then 'finobj', each from its
** head: the object marked last comes first); the first 'cap' of them go to out[]. Returns how
** many there are. Reads only. In generational mode 'finobj' is one list whose parts
** ('finobjsur', 'finobjold1', 'finobjrold') only point into it, so the walk covers them. */
size_t luasnap_finalizer_list(lua_State *L, const void **out, size_t cap) {
  global_State *g = G(L);
  size_t n = 0;
  GCObject *o;
  for (o = g->tobefnz; o != NULL; o = o->next, n++)
    if (n < cap) out[n] = o;
  for (o = g->finobj; o != NULL; o = o->next, n++)
    if (n < cap) out[n] = o;
  return n;
}

/* At the start of a whole-game load: the head of 'finobj', the last object the state marked
** for finalization (NULL if none). Reads only. */
const void *luasnap_finalizers_head(lua_State *L) {
  return G(L)->finobj;
}

/* When a whole-game load replaced the state: 'head' is what luasnap_finalizers_head gave when
** it began. The replaced state's objects waiting for their finalizers are dropped, and those
** it had marked lose their marks at the next full collection if nothing reaches them then
** (Lua patch 14, luaC_dropreplaced): their finalizers would run the replaced state's code
** in the new one. The caller calls it with no collection run since luasnap_finalizers_head
** but quiet ones (which take nothing out of 'finobj'), so 'head' is still in 'finobj'. */
void luasnap_finalizers_replaced(lua_State *L, const void *head) {
  luaC_dropreplaced(L, (GCObject *)head);
}

/* For the save-game writer: pushes the object o, one luasnap_finalizer_list gave, as a value;
** returns 0, pushing nothing, if it is not a table or full userdata (the lists hold only those).
** The caller read the lists with the collector stopped and no Lua code run since, so o is an
** object of this state, alive (an object on 'finobj' or 'tobefnz' is freed only after its
** finalizer ran, and no collection step ran). */
int luasnap_push_finalizable(lua_State *L, const void *o) {
  GCObject *gco = (GCObject *)o;
  /* Invariant checked: only a table or full userdata goes on the stack (anything else on the
  ** lists would be a collector invariant broken: only these two kinds get a '__gc' mark). */
  if (gco->tt == LUA_VTABLE) {
    sethvalue2s(L, L->top.p, gco2t(gco));
  }
  else if (gco->tt == LUA_VUSERDATA) {
    setuvalue(L, s2v(L->top.p), gco2u(gco));
  }
  else
    return 0;
  L->top.p++;  /* the caller has room for one value */
  return 1;
}

/* Sets the metatable on top (a table, or nil) as the metatable of the table or full userdata
** at idx, and pops it, without marking the object for finalization: lua_setmetatable as
** the loader of a save of format 8 needs it, which restores the marks the file records when
** it ends (luasnap_finalizers_restore) instead of the ones setmetatable would make. Returns 0,
** setting nothing, if the values are not what they must be. */
int luasnap_setmetatable_unmarked(lua_State *L, int idx) {
  const TValue *obj = ls_index2value(L, idx);
  const TValue *mtv = s2v(L->top.p - 1);
  Table *mt;
  if (ttisnil(mtv)) mt = NULL;
  else if (ttistable(mtv)) mt = hvalue(mtv);
  else return 0;
  if (ttistable(obj)) {
    hvalue(obj)->metatable = mt;
    if (mt) luaC_objbarrier(L, gcvalue(obj), mt);
  }
  else if (ttisfulluserdata(obj)) {
    uvalue(obj)->metatable = mt;
    if (mt) luaC_objbarrier(L, uvalue(obj), mt);
  }
  else return 0;
  L->top.p--;
  return 1;
}

/* When a load of a save of format 8 ends: the objects it built that the file marks for
** finalization ('marked', n ids into the objs table at stack index 'objs', in the order the
** saving VM marked them) are marked, in that order (Lua patch 8, luaC_markfinalizers); then
** every other object the load made (since the one at stack index 'since', as in
** luasnap_finalizers_mark) whose metatable has __gc is marked as before format 8: those the
** game's own code built during the load (a __persist rebuild), whose marks no file records;
** except the 'unmarked' ones (m ids), which the file records as not marked (finalized already,
** or never marked). 'scratch' has room for max(n, m) pointers. The state's "closing" bit
** (GCSTPCLS) is cleared meanwhile if 'clear' (the load set it). Returns 1, or 0 if a marked
** object is not a table or userdata the load built, alive and not marked (nothing is then
** marked). */
int luasnap_finalizers_restore(lua_State *L, int since, int objs, const uint32_t *marked,
                               int n, const uint32_t *unmarked, int m, int clear,
                               void **scratch) {
  global_State *g = G(L);
  GCObject *last = gcvalue(ls_index2value(L, since));
  GCObject **os = (GCObject **)scratch;
  lu_byte stp = g->gcstp;
  int i, k = 0, ok;
  objs = lua_absindex(L, objs);
  for (i = 0; i < n; i++) {
    const TValue *v;
    lua_rawgeti(L, objs, (lua_Integer)marked[i]);
    v = s2v(L->top.p - 1);
    os[i] = iscollectable(v) ? gcvalue(v) : NULL;
    lua_pop(L, 1);
    /* Invariant checked: only a table or full userdata is marked (anything else is not
    ** in 'allgc' as one luaC_markfinalizers moves; it checks the rest). */
    if (os[i] == NULL || (os[i]->tt != LUA_VTABLE && os[i]->tt != LUA_VUSERDATA)) return 0;
  }
  if (clear) g->gcstp &= (lu_byte)~GCSTPCLS;
  ok = n == 0 || luaC_markfinalizers(L, last, os, n);
  if (ok) {
    /* Set aside (FINALIZEDBIT, which luaC_checkfinalizers skips) the objects the file says
    ** are not marked, for the walk only: nothing runs between (no allocation, no Lua code),
    ** so no part of the collector sees them so. Invariant: only bits set here are reset. */
    for (i = 0; i < m; i++) {
      const TValue *v;
      lua_rawgeti(L, objs, (lua_Integer)unmarked[i]);
      v = s2v(L->top.p - 1);
      if ((ttistable(v) || ttisfulluserdata(v)) && !tofinalize(gcvalue(v))) {
        os[k] = gcvalue(v);
        l_setbit(os[k]->marked, FINALIZEDBIT);
        k++;
      }
      lua_pop(L, 1);
    }
    luaC_checkfinalizers(L, last);
    for (i = 0; i < k; i++) resetbit(os[i]->marked, FINALIZEDBIT);
  }
  g->gcstp = stp;
  return ok;
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
