/*
** A load's memo for the checks of its coroutines: the answers to their questions, each
** computed once per load (see loadmemo.h), in a hash table outside the Lua arena.
*/
#include "loadmemo.h"

/* Size of the memo luasnap_open_upval_check takes (zeroed by the caller). */
size_t luasnap_upmemo_size(void) { return sizeof(ls_upmemo); }

/* Frees the memo's table (memo zeroed or used by luasnap_open_upval_check) and zeroes it. */
void luasnap_upmemo_free(void *memo) {
  ls_upmemo *m = (ls_upmemo *)memo;
  size_t i;
  free(m->ent);
  for (i = 0; i < m->ntabs; i++) free(m->tabs[i]);
  free(m->tabs);
  for (i = 0; i < m->nsites; i++) free(m->sites[i]);
  free(m->sites);
  memset(m, 0, sizeof(*m));
}

/* Prototype-tree walks the memo's load made so far (a test's work counter). */
size_t luasnap_upmemo_walks(const void *memo) { return ((const ls_upmemo *)memo)->walks; }

/* Instructions the frame checks of the memo's load read so far (a test's work counter). */
size_t luasnap_upmemo_reads(const void *memo) { return ((const ls_upmemo *)memo)->reads; }

/* Records an answer not yet known; 0 if the table cannot grow (out of memory). Invariant
** kept: used <= (mask + 1) / 2, so probes end at an empty slot. */
int ls_upput(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d, int val) {
  ls_upent *e;
  if (m->ent == NULL || 2 * (m->used + 1) > m->mask + 1) {
    size_t n = (m->ent == NULL) ? 64 : 2 * (m->mask + 1), i;
    ls_upmemo g;
    if (n > SIZE_MAX / 2 / sizeof(ls_upent)) return 0;
    g.ent = (ls_upent *)calloc(n, sizeof(ls_upent));  /* kind 0: LS_Q_NONE */
    if (g.ent == NULL) return 0;
    g.mask = n - 1;
    g.used = m->used;
    g.walks = m->walks;
    g.reads = m->reads;
    g.tabs = m->tabs;
    g.ntabs = m->ntabs;
    g.captabs = m->captabs;
    g.sites = m->sites;
    g.nsites = m->nsites;
    g.capsites = m->capsites;
    g.nomap = m->nomap;
    for (i = 0; m->ent != NULL && i <= m->mask; i++) {
      ls_upent *o = &m->ent[i];
      if (o->kind != LS_Q_NONE) *ls_upslot(&g, o->kind, o->a, o->b, o->c, o->d) = *o;
    }
    free(m->ent);
    *m = g;
  }
  e = ls_upslot(m, kind, a, b, c, d);
  e->kind = kind; e->a = a; e->b = b; e->c = c; e->d = d; e->val = val; e->v = NULL;
  m->used++;
  return 1;
}
