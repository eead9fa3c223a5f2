/*
** tlayout.h: hash-part layouts, what the writer (tscan.c) and the loader (tbuild.c) share;
** tlayout.c defines the key order.
**
** Iteration order across save and load (docs/save-games.md, "Iteration order").
** `next` visits a table's array part, then its nodes by index. A hash part's layout (which
** node each key sits in, the collision chains, and where insertions look for free nodes next)
** depends on the table's history, not only on its keys, so a loader that inserts the keys
** anew may order them differently. For tables whose keys are numbers, booleans and strings
** (positions that depend on the key's contents and the VM's hash seed, not on addresses), and
** objects and library C functions (positions that depend on their identities, patch 4 and 5 of
** luasnap's Lua, which the save carries), the save records the layout and the loader puts
** every entry back in its node.
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

/* Whether node n's key, live, has a position independent of addresses that a load
** reproduces: a number, boolean or string (by content and the hash seed), an object (a table,
** closure, full userdata or thread: by its identity, which the save carries, or a permanent's,
** which its name gives), a light C function a library names (by that name). Not a light
** userdata, nor another light C function (their addresses). */
static inline int ls_layout_key(const Node *n) {
  switch (keytt(n)) {
    case LUA_VNUMINT: case LUA_VNUMFLT: case LUA_VFALSE: case LUA_VTRUE:
    case ctb(LUA_VSHRSTR): case ctb(LUA_VLNGSTR):
    case ctb(LUA_VTABLE): case ctb(LUA_VLCL): case ctb(LUA_VCCL):
    case ctb(LUA_VUSERDATA): case ctb(LUA_VTHREAD):
      return 1;
    case LUA_VLCF:
      return luasnap_cfunction_named(fvalueraw(keyval(n)));
    default:
      return 0;
  }
}

/* Whether node n's key, removed (its value empty), is written inline in a layout: a number,
** boolean or short string (a later t[k] = v reuses its node). A removed object key, and a
** long string, is written as code 1 and its key after the root, by reference: a long string
** is an object of its own (Lua interns short strings only), and once a collection marks the
** node dead `next(t, k)` finds it by k's address alone, so the loaded node must hold the very
** string the suspended loop holds, not a copy of its bytes. */
static inline int ls_inline_key(const Node *n) {
  switch (keytt(n)) {
    case LUA_VNUMINT: case LUA_VNUMFLT: case LUA_VFALSE: case LUA_VTRUE:
    case ctb(LUA_VSHRSTR):
      return 1;
    default:
      return 0;
  }
}

/* Whether node n's live key is an object or a light C function (see ls_layout_key). */
static inline int ls_identity_key(const Node *n) {
  switch (keytt(n)) {
    case ctb(LUA_VTABLE): case ctb(LUA_VLCL): case ctb(LUA_VCCL):
    case ctb(LUA_VUSERDATA): case ctb(LUA_VTHREAD): case LUA_VLCF:
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
** table are distinct; keys that are objects or light C functions compare by identity, which
** two keys can share (a name hash, a counter past 2^32): then the order is not a total one,
** and ls_ties says so (no layout is saved for such a table). */
void ls_sort_nodes(const Table *t, uint32_t *idx, unsigned int n);
/* Whether two of the n sorted keys compare equal (see ls_sort_nodes). */
int ls_ties(const Table *t, const uint32_t *idx, unsigned int n);

#endif
