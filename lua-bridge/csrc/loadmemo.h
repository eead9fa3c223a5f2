/*
** loadmemo.h: a load's memo for the checks of its coroutines (loadmemo.c; used by framecheck.c
** and upvalcheck.c). Rust holds it as luasnap_upmemo_size() opaque bytes, zeroed when a load
** starts and given to luasnap_upmemo_free when it ends.
**
** The checks' answers, per load, keyed by the full question (kind, two prototypes, two ints):
** each distinct question is computed once per load, whatever order the file asks them in.
** Questions (every key is made of the game's code, never of the file's data):
**   LS_Q_CLOSES   (p)              proto_closes(p): one per prototype;
**   LS_Q_VAR      (p, pc, r)       active_var: at most sizecode * maxstacksize per prototype;
**   LS_Q_CAPTURES (fp, xp, n, r)   captures: xp nested in fp (else not cached: see captures),
**                                  n <= xp's upvalues (<= 255), r < fp's maxstacksize (<= 255);
**   LS_Q_CLOSURE  (p, k)           closure_pc: k < p's sizep;
**   LS_Q_VARTAB   (p)              p's locals index (locals_index; O(p's locvars) memory);
**   LS_Q_CLOSURES (p)              closure_pc's scans of p's code (-1: all its LS_Q_CLOSURE
**                                  answers are in, one per child);
**   LS_Q_PARENT   (x)              x's parent prototype (v) and x's index in its p (val);
**   LS_Q_MAPPED   (x)              the parents of x's whole subtree are in (map_tree);
**   LS_Q_WALKS    (fp)             captures' walks of fp's tree so far (LS_WALKS_BEFORE_MAP);
**   LS_Q_SITES    (p)              the index of p's frame-check registers in m->sites, or -1
**                                  (p's loops are not as the compiler makes them: scan).
** So the number of entries is bounded by the code of the prototypes the load's coroutines run
** (a few per instruction, local and nested prototype; the question kinds also by the calls);
** each prototype's code and locvars are scanned once and each frame function's tree walked
** once per load (the fallbacks for prototypes not as the compiler makes them: once per
** distinct question). The table is
** malloc'd (not the Lua arena: it is the loader's, gone when the load ends:
** luasnap_upmemo_free), open addressing with linear probing, at most half full. Invariant
** the keys rely on: every prototype in them is a loaded frame's function or nested in one,
** or a joined closure's, and the load's object table keeps those closures until the load
** ends, so no key's address is reused for another prototype while the table lives.
*/
#ifndef LUASNAP_LOADMEMO_H
#define LUASNAP_LOADMEMO_H

#include "lsint.h"

enum {
  LS_Q_NONE, LS_Q_CLOSES, LS_Q_VAR, LS_Q_CAPTURES, LS_Q_CLOSURE, LS_Q_VARTAB,
  LS_Q_CLOSURES, LS_Q_PARENT, LS_Q_MAPPED, LS_Q_WALKS, LS_Q_SITES
};

typedef struct ls_upent {
  const void *a, *b;
  int c, d;
  int kind;  /* LS_Q_NONE: empty slot */
  int val;
  const void *v;  /* LS_Q_PARENT's parent */
} ls_upent;

/* A prototype's locals by register (upvalcheck.c) and a prototype's frame-check index
** (framecheck.c): the memo owns them (malloc'd, freed with it). */
typedef struct ls_vartab ls_vartab;
typedef struct ls_siteidx ls_siteidx;

typedef struct ls_upmemo {
  ls_upent *ent;  /* NULL or mask + 1 entries */
  size_t mask, used;
  size_t walks;   /* prototype-tree walks (captures' misses), for tests */
  size_t reads;   /* instructions the frame checks read (index builds, scans), for tests */
  ls_vartab **tabs;  /* locals indexes (LS_Q_VARTAB answers index it), one per prototype */
  size_t ntabs, captabs;
  ls_siteidx **sites;  /* frame-check indexes (LS_Q_SITES answers index it), one per prototype */
  size_t nsites, capsites;
  int nomap;  /* a prototype tree is not a tree (map_tree): captures walks it each time */
} ls_upmemo;

static inline size_t ls_uphash(int kind, const void *a, const void *b, int c, int d) {
  uint64_t h = (uint64_t)(uintptr_t)a * 0x9E3779B97F4A7C15u;
  h ^= (uint64_t)(uintptr_t)b + 0x632BE59BD9B4E019u + (h << 6) + (h >> 2);
  h ^= ((uint64_t)(unsigned)c << 32 | (unsigned)d) + (uint64_t)kind * 0xBF58476D1CE4E5B9u;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBu;
  h ^= h >> 29;
  return (size_t)h;
}

/* The slot of the question (its entry, or the empty slot where it goes); m->ent non-NULL. */
static inline ls_upent *ls_upslot(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d) {
  size_t i = ls_uphash(kind, a, b, c, d) & m->mask;
  for (;; i = (i + 1) & m->mask) {
    ls_upent *e = &m->ent[i];
    if (e->kind == LS_Q_NONE
        || (e->kind == kind && e->a == a && e->b == b && e->c == c && e->d == d))
      return e;
  }
}

/* Whether the answer is known (then *val is it). */
static inline int ls_upget(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d,
                           int *val) {
  ls_upent *e;
  if (m->ent == NULL) return 0;
  e = ls_upslot(m, kind, a, b, c, d);
  if (e->kind == LS_Q_NONE) return 0;
  *val = e->val;
  return 1;
}

/* Records an answer not yet known; 0 if the table cannot grow (out of memory). */
int ls_upput(ls_upmemo *m, int kind, const void *a, const void *b, int c, int d, int val);

/* Counts n instructions read by the frame checks (a test's work counter). */
static inline void ls_count_reads(ls_upmemo *m, size_t n) { m->reads += n; }

#endif
