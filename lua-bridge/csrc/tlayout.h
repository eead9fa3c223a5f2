/*
** tlayout.h: hash-part layouts, what the writer (tscan.c) and the loader (tbuild.c) share;
** tlayout.c defines the key order.
**
** Iteration order across save and load (docs/save-games.md, "Iteration order").
** `next` visits a table's array part, then its nodes by index. A hash part's layout (which
** node each key sits in, the collision chains, and where insertions look for free nodes next)
** depends on the table's history, not only on its keys, so a loader that inserts the keys
** anew may order them differently. For tables whose keys are numbers, booleans and strings
** (positions that depend on the key's contents and the VM's hash seed, not on addresses) the
** save records the layout and the loader puts every entry back in its node.
**
** A live key's identity in the layout is its rank r among the table's live hash keys in
** `keycmp` order, which saver and loader compute alike: the loader needs no key twice.
*/
#ifndef LUASNAP_TLAYOUT_H
#define LUASNAP_TLAYOUT_H

#include "lsint.h"

/* Mirrors ltable.c (5.5.1), whose Limbox, LIMFORLAST, haslastfree and getlastfree are private
** to it: hash parts of 2^LIMFORLAST nodes or more keep 'lastfree' (where insertions look for a
** free node next, downwards) in a Limbox just before the node array; smaller ones search from
** the end. */
#define LS_LIMFORLAST 3
typedef struct { Node *dummy; Node follows_pNode; } ls_Limbox_aux;
typedef union {
  Node *lastfree;
  char padding[offsetof(ls_Limbox_aux, follows_pNode)];
} ls_Limbox;
#define ls_haslastfree(t) ((t)->lsizenode >= LS_LIMFORLAST)
#define ls_getlastfree(t) ((cast(ls_Limbox *, (t)->node) - 1)->lastfree)

/* Whether node n's key has a position independent of addresses. */
static inline int ls_layout_key(const Node *n) {
  switch (keytt(n)) {
    case LUA_VNUMINT: case LUA_VNUMFLT: case LUA_VFALSE: case LUA_VTRUE:
    case ctb(LUA_VSHRSTR): case ctb(LUA_VLNGSTR):
      return 1;
    default:
      return 0;
  }
}

/* A live key's value bits (every layout key but a boolean, whose tag says all). */
static inline uint64_t ls_keybits(const Node *n) {
  uint64_t b = 0;
  if (keytt(n) != LUA_VFALSE && keytt(n) != LUA_VTRUE) memcpy(&b, &keyval(n), sizeof b);
  return b;
}

/* Sorts idx[0..n) (node indices of t, live layout keys) by the key order. The live keys of a
** table are distinct, so every correct sort gives the same order. */
void ls_sort_nodes(const Table *t, uint32_t *idx, unsigned int n);

#endif
