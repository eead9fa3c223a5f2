/*
** The host's instruction budget (Vm::call_with_budget): the handler Lua's VM calls when the
** budget of the running OS thread is spent (lvm.h, LUASNAP-PATCHES.md patch 6), and the
** calls that start and end a budget.
**
** How Lua code pays, and why it always does: lvm.h. The budget lives in the OS thread (luaV_budget), not in any lua_State: every coroutine the
** budgeted call resumes and every pcall inside it pay into it, with nothing to pass on, and the
** arena holds no trace of it (two runs of the same calls under different budgets leave the same
** bytes). One budgeted call at a time per OS thread.
*/
#include "lsint.h"
#include "ldebug.h"
#include "lgc.h"
#include "lvm.h"

#include <stdio.h>

/* Whether the current budget was spent, and where Lua code was the first time ("chunk:line"). */
static __thread int ls_spent;
static __thread char ls_where[LUA_IDSIZE + 24];
/* What the error says stopped the code, and what to do: the budget's owner gives it (a call's,
** or a dropped VM's close budget), a string that outlives the budget. */
static __thread const char *ls_spent_message;

/* What Lua code may still run once the budget is spent, once per budgeted call: the message
** handler of the budget's error (xpcall's) runs with hooks allowed, so it pays too; this grace
** lets a handler that formats the error (a traceback, a table of fields) finish, and stops one
** that never ends. */
#define LS_HANDLER_GRACE 1000000

/* Called by the VM when Lua code on this thread has run more than the budget allows. The
** first time, it gives LS_HANDLER_GRACE more, then raises; after that the budget stays spent
** (0: every later charge comes back here), so a pcall that catches this error fails again
** within the grace, and then at its caller's next call or backward jump. A message handler
** that spends the grace raises inside itself: Lua calls it again for that error, it raises at
** its first charge, and so on until Lua ends the chain with "error in error handling"
** (LUA_ERRERR): it cannot run without end, as it could under the count hook this replaces.
**
** Nothing is raised while hooks are off (L->allowhook == 0): in a debug hook, or in a finalizer
** when a debug hook is set (patch 8: ls_finalizer_keeps_hook below). Without one, finalizers
** run with hooks allowed and are stopped here like any Lua code: GCTM's protected call turns
** the error into a warning. */
static void ls_budget_spent(lua_State *L) {
  static __thread int grace_given;
  luaV_budget = 0;
  if (!L->allowhook)
    return;
  if (!ls_spent) {
    lua_Debug ar;
    int level;
    ls_spent = 1;
    grace_given = 0;
    ls_where[0] = '\0';
    /* The innermost Lua function: at a backward jump, the loop; at a tail call, the call; at
    ** a call, the callee, whose 'savedpc' is at its start (currentline: the line it is
    ** defined on); at a return, where the caller goes on, or past the C function (pcall,
    ** table.sort...) the returning function was called from. "Sl" reads the prototype only,
    ** allocating nothing. */
    for (level = 0; lua_getstack(L, level, &ar); level++) {
      if (lua_getinfo(L, "Sl", &ar) && ar.currentline >= 0) {
        snprintf(ls_where, sizeof(ls_where), "%s:%d", ar.short_src, ar.currentline);
        break;
      }
    }
  }
  if (!grace_given) {
    grace_given = 1;
    luaV_budget = LS_HANDLER_GRACE;
  }
  luaG_runerror(L, "%s", ls_spent_message);
}

int luasnap_budget_begin(uint64_t budget, const char *spent_message) {
  if (luaV_budgethandler != NULL)
    return 0;  /* one budgeted call at a time on a thread */
  ls_spent_message = spent_message;
  ls_spent = 0;
  ls_where[0] = '\0';
  luaV_budget = (budget >= (uint64_t)LUAI_BUDGETOFF) ? LUAI_BUDGETOFF : (l_mem)budget;
  luaV_budgethandler = ls_budget_spent;
  return 1;
}

int luasnap_budget_end(uint64_t budget, uint64_t *used, char *where, size_t n) {
  l_mem left = luaV_budget;
  int spent = ls_spent;
  uint64_t start = (budget >= (uint64_t)LUAI_BUDGETOFF) ? (uint64_t)LUAI_BUDGETOFF : budget;
  /* Once spent, the call used its whole budget (what is left is the handlers' grace). */
  *used = (!spent && left >= 0 && (uint64_t)left <= start) ? start - (uint64_t)left : start;
  if (n > 0)
    snprintf(where, n, "%s", spent ? ls_where : "");
  luaV_budgethandler = NULL;
  luaV_budget = LUAI_BUDGETOFF;
  ls_spent = 0;
  return spent;
}

/* The save-game load's budget hook (persist/budget.rs), a count hook on the loading thread. */
static lua_Hook ls_load_hook = NULL;

void luasnap_register_load_hook(lua_Hook h) {
  __atomic_store_n(&ls_load_hook, h, __ATOMIC_RELAXED);
}

/* Whether a finalizer about to run on L runs with hooks allowed (Lua patch 8: lgc.c's GCTM
** asks, with hooks allowed on L before it). Lua runs finalizers with hooks off, which put them
** outside every instruction budget: a game function that a foreign save made a finalizer ran
** unbounded at any allocation. Hooks stay allowed when L has no hook (nothing but the
** budget's handler above reads allowhook then: the host's budget stops the finalizer once
** spent) or only a load's budget hook, which counts instructions only (so no call, return or
** line event reaches it; it raises once the load's budget is spent). Any other hook (a host's
** lua_sethook, debug.sethook outside the deterministic profile) stays off in finalizers, as
** in stock Lua, and with it the host's budget. */
int ls_finalizer_keeps_hook(lua_State *L) {
  lua_Hook h = L->hook;
  if (h == NULL) return 1;
  return L->hookmask == LUA_MASKCOUNT
      && h == __atomic_load_n(&ls_load_hook, __ATOMIC_RELAXED);
}
