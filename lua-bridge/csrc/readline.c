/*
** The standalone interpreter's line editing, as stock lua does it: the readline library is
** loaded at run time (its name from LUA_READLINELIB, else "libreadline.so"), and when it cannot
** be, a warning says so and lines are read plainly.
*/
#include <dlfcn.h>
#include <stdlib.h>

#include "lua.h"

#include "luasnap.h"

typedef char *(*readline_fn)(const char *prompt);
typedef void (*add_history_fn)(const char *line);

/* Process-wide, like stock lua's: one interactive loop per process. */
static readline_fn l_readline = NULL;
static add_history_fn l_addhist = NULL;

/* Loads the library; on failure emits lua's warning through L (shown only under -W). */
int luasnap_readline_init(lua_State *L, const char *lib) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h != NULL) {
    const char **name = (const char **)dlsym(h, "rl_readline_name");
    if (name != NULL) *name = "lua";
    l_readline = (readline_fn)dlsym(h, "readline");
    l_addhist = (add_history_fn)dlsym(h, "add_history");
    if (l_readline != NULL) return 1;
  }
  lua_warning(L, "unable to load readline library '", 1);
  lua_warning(L, lib, 1);
  lua_warning(L, "'", 0);
  return 0;
}

/* 1 and *line = a malloc'd line (NULL at end of input) if readline is loaded; else 0. */
int luasnap_readline(const char *prompt, char **line) {
  if (l_readline == NULL) return 0;
  *line = l_readline(prompt);
  return 1;
}

void luasnap_readline_done(char *line) {
  if (line != NULL && line[0] != '\0' && l_addhist != NULL) l_addhist(line);
  free(line);
}

/* ---------- Ctrl-C, as stock lua handles it ---------- */
#include <signal.h>
#include "lauxlib.h"

/* The state running a command-line step; read by the signal handler. */
static lua_State *volatile interrupted_L = NULL;

static void lstop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

/* SIGINT while Lua runs: a hook (async-signal-safe to set) stops the code at its next step.
** A second SIGINT gets the default action. */
static void laction(int i) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  signal(i, SIG_DFL);
  if (interrupted_L != NULL) lua_sethook(interrupted_L, lstop, flag, 1);
}

/* A command-line program ends quietly when the reader of its output goes away (`| head`), as
** C programs and stock lua do; Rust's runtime ignores SIGPIPE, so a write would fail instead. */
void luasnap_default_sigpipe(void) {
  signal(SIGPIPE, SIG_DFL);
}

/* Around a step: on = 1 installs the handler for L, on = 0 restores the default. */
void luasnap_interruptible(lua_State *L, int on) {
  interrupted_L = on ? L : NULL;
  signal(SIGINT, on ? laction : SIG_DFL);
}
