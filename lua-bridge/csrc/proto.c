/*
** Prototypes: naming them, fingerprinting them, making closures of them.
**
** The public C API cannot name a function's prototype, compare prototypes, or create a
** closure from a prototype without loading bytecode. These helpers do, so that loading a
** save-game in safe mode never runs bytecode taken from the file: closures are rebuilt from
** prototypes the VM compiled itself, matched by a structural fingerprint.
*/
#include <stdio.h>
#include <string.h>

#include "lopcodes.h"

#include "proto.h"

/* The prototype of the Lua closure at idx, or NULL if it is not a Lua closure. */
const void *luasnap_proto(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  if (!ttisLclosure(o)) return NULL;
  return clLvalue(o)->p;
}

/* The light C function at idx (a C function without upvalues, not a closure), or NULL. */
lua_CFunction luasnap_light_cfunction(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  return ttislcf(o) ? fvalue(o) : NULL;
}

int luasnap_proto_nupvalues(const void *p) {
  return ((const Proto *)p)->sizeupvalues;
}

const char *luasnap_proto_upvalue_name(const void *p, int i, size_t *len) {
  const Proto *q = (const Proto *)p;
  TString *name;
  if (i < 1 || i > q->sizeupvalues || (name = q->upvalues[i - 1].name) == NULL) return NULL;
  *len = tsslen(name);
  return getstr(name);
}

int luasnap_proto_nchildren(const void *p) {
  return ((const Proto *)p)->sizep;
}

/* Child i of p (0-based), or NULL when p has no such child. */
const void *luasnap_proto_child(const void *p, int i) {
  const Proto *q = (const Proto *)p;
  return (i >= 0 && i < q->sizep) ? q->p[i] : NULL;
}

/* 64-bit FNV-1a with a final avalanche, over everything that makes a prototype behave as it
** does: code, constants, upvalue descriptors, parameters, nested prototypes (recursively),
** and where it was defined. */
typedef struct { uint64_t h; } Hash;

static void hbytes(Hash *h, const void *data, size_t n) {
  const unsigned char *b = (const unsigned char *)data;
  size_t i;
  for (i = 0; i < n; i++) { h->h ^= b[i]; h->h *= 0x100000001b3ULL; }
}

static void hu64(Hash *h, uint64_t v) { hbytes(h, &v, sizeof v); }

static uint64_t finish(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Everything of p that its fingerprint covers but its nested prototypes, its lines moved by
** shift (0: as they are). */
static void proto_hash_fields_at(Hash *h, const Proto *p, lua_Integer shift) {
  int i;
  hu64(h, (uint64_t)p->numparams); hu64(h, (uint64_t)(p->flag & ~PF_LSDONE)); hu64(h, (uint64_t)p->maxstacksize);
  hu64(h, (uint64_t)(p->linedefined + shift)); hu64(h, (uint64_t)(p->lastlinedefined + shift));
  if (p->source) hbytes(h, getstr(p->source), tsslen(p->source));
  hu64(h, (uint64_t)p->sizecode);
  hbytes(h, p->code, sizeof(Instruction) * (size_t)p->sizecode);
  hu64(h, (uint64_t)luasnap_nconsts(p));  /* the chunk record's anchor is not code */
  for (i = 0; i < luasnap_nconsts(p); i++) {
    const TValue *k = &p->k[i];
    hu64(h, (uint64_t)ttypetag(k));
    if (ttisstring(k)) hbytes(h, getstr(tsvalue(k)), tsslen(tsvalue(k)));
    else if (ttisinteger(k)) hu64(h, (uint64_t)ivalue(k));
    else if (ttisfloat(k)) { lua_Number n = fltvalue(k); hbytes(h, &n, sizeof n); }
  }
  hu64(h, (uint64_t)p->sizeupvalues);
  for (i = 0; i < p->sizeupvalues; i++) {
    hu64(h, (uint64_t)p->upvalues[i].instack);
    hu64(h, (uint64_t)p->upvalues[i].idx);
    hu64(h, (uint64_t)p->upvalues[i].kind);
  }
  hu64(h, (uint64_t)p->sizep);
}

static void proto_hash_fields(Hash *h, const Proto *p) {
  proto_hash_fields_at(h, p, 0);
}

/* proto_hash with every line of the tree moved by shift (its functions' definitions; the
** per-instruction lines are not in a fingerprint). */
static uint64_t proto_hash_shifted(const Proto *p, int depth, lua_Integer shift) {
  Hash h = { 0xcbf29ce484222325ULL };
  int i;
  proto_hash_fields_at(&h, p, shift);
  for (i = 0; i < p->sizep; i++)
    hu64(&h, depth < 200 ? proto_hash_shifted(p->p[i], depth + 1, shift) : 0);
  return finish(h.h);
}

/* The fingerprint p would have with every line of its tree moved by shift: equal to a saved
** function's fingerprint when the saved function is p's code, only at other lines (a function
** an update moved). */
uint64_t luasnap_proto_hash_shifted(const void *p, int64_t shift) {
  return proto_hash_shifted((const Proto *)p, 0, (lua_Integer)shift);
}

/* Whether a and b are the same code, lines aside: what a frame suspended in a relies on to
** resume in b at the same pc with the same stack (an update that only moved the function, with
** lines added above it). Compared: parameters, vararg flags, stack size, every instruction,
** the constants by value (a float by its bits), the upvalue descriptors with their names (a
** load binds a saved closure's upvalues by name), and the number of nested functions
** (OP_CLOSURE indexes them; each one's own code is its own question). Not compared: the lines
** (of the definition and of each instruction), local names, the chunk name. */
int luasnap_proto_same_code(const void *pa, const void *pb) {
  const Proto *a = (const Proto *)pa, *b = (const Proto *)pb;
  int i, nk = luasnap_nconsts(a);
  if (a->numparams != b->numparams || a->maxstacksize != b->maxstacksize
      || (a->flag & ~(PF_LSDONE | PF_FIXED)) != (b->flag & ~(PF_LSDONE | PF_FIXED))
      || a->sizecode != b->sizecode || nk != luasnap_nconsts(b)
      || a->sizeupvalues != b->sizeupvalues || a->sizep != b->sizep)
    return 0;
  if (memcmp(a->code, b->code, sizeof(Instruction) * (size_t)a->sizecode) != 0) return 0;
  for (i = 0; i < nk; i++) {
    const TValue *x = &a->k[i], *y = &b->k[i];
    if (ttypetag(x) != ttypetag(y)) return 0;
    if (ttisstring(x)) {
      if (tsslen(tsvalue(x)) != tsslen(tsvalue(y))
          || memcmp(getstr(tsvalue(x)), getstr(tsvalue(y)), tsslen(tsvalue(x))) != 0)
        return 0;
    } else if (ttisinteger(x)) {
      if (ivalue(x) != ivalue(y)) return 0;
    } else if (ttisfloat(x)) {
      lua_Number m = fltvalue(x), n = fltvalue(y);
      if (memcmp(&m, &n, sizeof m) != 0) return 0;
    }
  }
  for (i = 0; i < a->sizeupvalues; i++) {
    const Upvaldesc *u = &a->upvalues[i], *v = &b->upvalues[i];
    const TString *m = u->name, *n = v->name;
    if (u->instack != v->instack || u->idx != v->idx || u->kind != v->kind) return 0;
    if (m != n && (m == NULL || n == NULL || tsslen(m) != tsslen(n)
                   || memcmp(getstr(m), getstr(n), tsslen(m)) != 0))
      return 0;
  }
  return 1;
}

/* Clears PF_LSDONE over p's tree: a tree compiled only to be compared with the game's code (a
** saved version of a chunk, from a save's text) is then never offered by luasnap_each_proto,
** so no load binds a saved function to it by fingerprint and no code of it runs. Nothing else
** reads the flag (the fingerprint leaves it out). */
void luasnap_proto_tree_retire(const void *p) {
  Proto *q = (Proto *)p;
  int i;
  q->flag &= (lu_byte)~PF_LSDONE;
  for (i = 0; i < q->sizep; i++) luasnap_proto_tree_retire(q->p[i]);
}

/* The line p was defined at. */
int luasnap_proto_line(const void *p) {
  return ((const Proto *)p)->linedefined;
}

static uint64_t proto_hash(const Proto *p, int depth) {
  Hash h = { 0xcbf29ce484222325ULL };
  int i;
  proto_hash_fields(&h, p);
  for (i = 0; i < p->sizep; i++)
    hu64(&h, depth < 200 ? proto_hash(p->p[i], depth + 1) : 0);
  return finish(h.h);
}

uint64_t luasnap_proto_hash(const void *p) {
  return proto_hash((const Proto *)p, 0);
}

/* Deepest nesting below a prototype for which luasnap_proto_tree_hashes answers (far inside
** proto_hash's cut at 200: a prototype's fingerprint then equals the contribution it makes
** to its parent's). */
#define LS_TREE_HASH_DEPTH 100

static uint64_t tree_hashes(const Proto *p, int depth, uint64_t *hs, int max, int *n, int *deep) {
  Hash h = { 0xcbf29ce484222325ULL };
  int i, at = (*n)++;
  if (depth > LS_TREE_HASH_DEPTH) { *deep = 1; return 0; }
  proto_hash_fields(&h, p);
  for (i = 0; i < p->sizep; i++) hu64(&h, tree_hashes(p->p[i], depth + 1, hs, max, n, deep));
  h.h = finish(h.h);
  if (at < max) hs[at] = h.h;
  return h.h;
}

/* The fingerprints (luasnap_proto_hash) of the prototype p and of every prototype nested in
** it, in pre-order (p, then each child's tree in turn) into hs[0..max), each prototype hashed
** once (where hashing each alone hashes a prototype again for every one it is nested in).
** Returns how many prototypes the tree has, or -1 if it nests deeper than
** LS_TREE_HASH_DEPTH (then hash each alone). */
int luasnap_proto_tree_hashes(const void *p, uint64_t *hs, int max) {
  int n = 0, deep = 0;
  tree_hashes((const Proto *)p, 0, hs, max, &n, &deep);
  return deep ? -1 : n;
}

void luasnap_push_closure(lua_State *L, const void *p) {
  ls_push_closure(L, (Proto *)p);
}

/* Calls f(p, ud) for every prototype alive in the VM (walks the collector's object lists).
** The collector must be stopped by the caller so the lists do not change meanwhile. */
void luasnap_each_proto(lua_State *L, luasnap_proto_fn f, void *ud) {
  global_State *g = G(L);
  GCObject *lists[4];
  int i;
  lists[0] = g->allgc; lists[1] = g->finobj; lists[2] = g->tobefnz; lists[3] = g->fixedgc;
  for (i = 0; i < 4; i++) {
    GCObject *o;
    for (o = lists[i]; o != NULL; o = o->next)
      /* A dead prototype (garbage the sweep has not freed yet) is about to be freed:
      ** anchoring it now would not save it. Invariant checked: only a finished prototype
      ** (PF_LSDONE, Lua patch 7) has every child slot filled and code that ends in a return;
      ** a compile or binary load that failed leaves half-built ones here until the
      ** collector frees them (hashing one read its NULL child slots; running one would run
      ** past its code). */
      if (o->tt == LUA_VPROTO && !isdead(g, o) && (gco2p(o)->flag & PF_LSDONE)) f(o, ud);
  }
}

/* Calls f(q, ud) for p and every prototype nested in it. */
void luasnap_proto_tree(const void *p, luasnap_proto_fn f, void *ud) {
  const Proto *proto = (const Proto *)p;
  int i;
  f(p, ud);
  for (i = 0; i < proto->sizep; i++) luasnap_proto_tree(proto->p[i], f, ud);
}

/* ---------- places: where a function is in its chunk, by name ----------
** A newer version of a chunk is another tree of prototypes: lines move, functions come and go,
** so neither positions nor fingerprints find "the same function" in it. Its name does: the
** name the parent gives the closure it makes (`function M.f`, `local function g`, `t.h =
** function`), read from the parent's code right after the OP_CLOSURE that makes it. Names
** come from the compiler's own output (constants, local and upvalue names of the debug
** information), never from line numbers, so they survive edits elsewhere in the chunk. */

/* Fills pcs[0..n) with the pc of the OP_CLOSURE that makes each child of p (n at most its
** child count; -1 for a child no instruction makes: a binary chunk's). */
void luasnap_proto_closure_pcs(const void *p, int *pcs, int n) {
  const Proto *f = (const Proto *)p;
  int pc, i;
  for (i = 0; i < n; i++) pcs[i] = -1;
  for (pc = 0; pc < f->sizecode; pc++) {
    Instruction in = f->code[pc];
    if (GET_OPCODE(in) == OP_CLOSURE) {
      int bx = GETARG_Bx(in);
      if (bx < n && pcs[bx] < 0) pcs[bx] = pc;
    }
  }
}

typedef struct NameBuf {
  char *buf;
  int cap, len;
} NameBuf;

static void nb_put(NameBuf *b, const char *s, size_t n) {
  while (n-- > 0 && b->len < b->cap) b->buf[b->len++] = *s++;
}

static void nb_str(NameBuf *b, const TString *s) {
  nb_put(b, getstr(s), tsslen(s));
}

/* Whether s is a Lua name (letters, digits, underscores, not starting with a digit): a key
** a source can write as `t.key`. */
static int is_name(const TString *s) {
  const char *c = getstr(s);
  size_t i, n = tsslen(s);
  if (n == 0 || (c[0] >= '0' && c[0] <= '9')) return 0;
  for (i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)c[i];
    if (!(ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
          (ch >= '0' && ch <= '9')))
      return 0;
  }
  return 1;
}

/* Writes key as a place writes it after a qualifier that is `qualified`: `.key` (`key`
** alone) for a name, else `["key"]` as Lua would quote it (`\"`, `\\`, and `\ddd` for
** bytes outside printable ASCII). A key that is no name is thereby never read as a path of
** names (`M["a.b"]` is not `M.a.b`), nor as a place's separators or `#k` numbering. */
static void nb_key(NameBuf *b, const TString *key, int qualified) {
  const char *c = getstr(key);
  size_t i, n = tsslen(key);
  if (is_name(key)) {
    if (qualified) nb_put(b, ".", 1);
    nb_str(b, key);
    return;
  }
  nb_put(b, "[\"", 2);
  for (i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)c[i];
    if (ch == '"' || ch == '\\') {
      nb_put(b, "\\", 1);
      nb_put(b, (const char *)&c[i], 1);
    } else if (ch < 0x20 || ch > 0x7e) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\%03u", (unsigned)ch);
      nb_put(b, esc, strlen(esc));
    } else {
      nb_put(b, (const char *)&c[i], 1);
    }
  }
  nb_put(b, "\"]", 2);
}

/* The short-string constant k[i] of f, or NULL. */
static const TString *kstring(const Proto *f, int i) {
  if (i < 0 || i >= luasnap_nconsts(f) || !ttisshrstring(&f->k[i])) return NULL;
  return tsvalue(&f->k[i]);
}

static const TString *upvalue_name(const Proto *f, int i) {
  return (i >= 0 && i < f->sizeupvalues) ? f->upvalues[i].name : NULL;
}

static int is_env(const TString *s) {
  return s != NULL && tsslen(s) == 4 && memcmp(getstr(s), "_ENV", 4) == 0;
}

/* Writes what register r holds at pc, as a dotted name (`Agent`, `M.sub`): an active local by
** its name, or what the last instruction before pc writing r loaded there (a global, a field
** of a named table, a copy of a named register). Returns 0, writing nothing, if it has none.
** The backward scan ignores jumps: a name needs to be stable and telling, not exact. */
static int reg_name(const Proto *f, int pc, int r, NameBuf *b, int depth) {
  const char *local = luaF_getlocalname(f, r + 1, pc);
  int at;
  if (local != NULL) {
    nb_put(b, local, strlen(local));
    return 1;
  }
  if (depth > 3) return 0;
  for (at = pc - 1; at >= 0; at--) {
    Instruction in = f->code[at];
    OpCode op = GET_OPCODE(in);
    if (!testAMode(op) || GETARG_A(in) != r) continue;
    if (op == OP_GETTABUP && is_env(upvalue_name(f, GETARG_B(in))) && kstring(f, GETARG_C(in))) {
      nb_key(b, kstring(f, GETARG_C(in)), 0);
      return 1;
    }
    if (op == OP_GETFIELD && kstring(f, GETARG_C(in))) {
      int mark = b->len;
      if (!reg_name(f, at, GETARG_B(in), b, depth + 1)) return 0;
      if (b->len == mark) return 0;
      nb_key(b, kstring(f, GETARG_C(in)), 1);
      return 1;
    }
    if (op == OP_MOVE) return reg_name(f, at, GETARG_B(in), b, depth + 1);
    return 0;
  }
  return 0;
}

/* Writes `qualifier.key` (or `key` when the table has no name; `qualifier["k.k"]` for a key
** that is no name). */
static void field_name(const Proto *f, int pc, int table, const TString *key, NameBuf *b) {
  int mark = b->len;
  int qualified = reg_name(f, pc, table, b, 0) && b->len > mark;
  if (!qualified) b->len = mark;
  nb_key(b, key, qualified);
}

/* The name the function made at pc (an OP_CLOSURE of p) gets where p stores it, into
** buf[0..cap): a field (`Agent.work`, `M.sub.f`, `handlers[2]`), a global (`update`), an
** upvalue or a local (`helper`). Returns its length, 0 for an anonymous function (an
** argument, a return value, a table constructor's positional item). */
int luasnap_proto_child_name(const void *p, int pc, char *buf, int cap) {
  const Proto *f = (const Proto *)p;
  NameBuf b = { buf, cap, 0 };
  int a;
  const char *local;
  if (pc < 0 || pc >= f->sizecode || GET_OPCODE(f->code[pc]) != OP_CLOSURE) return 0;
  a = GETARG_A(f->code[pc]);
  if (pc + 1 < f->sizecode) {
    Instruction in = f->code[pc + 1];
    switch (GET_OPCODE(in)) {
      case OP_SETFIELD:  /* t.name = function */
        if (!GETARG_k(in) && GETARG_C(in) == a && kstring(f, GETARG_B(in))) {
          field_name(f, pc + 1, GETARG_A(in), kstring(f, GETARG_B(in)), &b);
          return b.len;
        }
        break;
      case OP_SETTABUP:  /* name = function, a global (or a field of an upvalue table) */
        if (!GETARG_k(in) && GETARG_C(in) == a && kstring(f, GETARG_B(in))) {
          const TString *up = upvalue_name(f, GETARG_A(in));
          int qualified = up != NULL && !is_env(up);
          if (qualified) nb_str(&b, up);
          nb_key(&b, kstring(f, GETARG_B(in)), qualified);
          return b.len;
        }
        break;
      case OP_SETI:  /* t[n] = function */
        if (!GETARG_k(in) && GETARG_C(in) == a) {
          char num[24];
          int mark = b.len;
          if (!reg_name(f, pc + 1, GETARG_A(in), &b, 0)) b.len = mark;
          snprintf(num, sizeof num, "[%d]", GETARG_B(in));
          nb_put(&b, num, strlen(num));
          return b.len;
        }
        break;
      case OP_SETUPVAL:  /* an enclosing function's local = function */
        if (GETARG_A(in) == a && upvalue_name(f, GETARG_B(in)) != NULL) {
          nb_str(&b, upvalue_name(f, GETARG_B(in)));
          return b.len;
        }
        break;
      case OP_MOVE:  /* local = function, after other expressions */
        if (GETARG_B(in) == a) {
          local = luaF_getlocalname(f, GETARG_A(in) + 1, pc + 2);
          if (local != NULL) {
            nb_put(&b, local, strlen(local));
            return b.len;
          }
        }
        break;
      default:
        break;
    }
  }
  /* `local function name` (active from the closure on) or `local name = function` (from
  ** the next instruction). */
  local = luaF_getlocalname(f, a + 1, pc + 1);
  if (local != NULL) nb_put(&b, local, strlen(local));
  return b.len;
}

/* Where upvalue i of p comes from when a closure of p is made: the enclosing function's
** upvalue of that index (returns it, *local 0), or its register (returns it, *local 1); -1 for
** no such upvalue. */
int luasnap_proto_upvalue_desc(const void *p, int i, int *local) {
  const Proto *f = (const Proto *)p;
  if (i < 0 || i >= f->sizeupvalues) return -1;
  *local = f->upvalues[i].instack;
  return f->upvalues[i].idx;
}

/* ---------- closures bound to another version of their function ----------
** A save loaded into a newer version of the game binds its closures to the newer prototypes
** (the save-game loader's read/proto.rs and read/rebind.rs). Such a closure may hold more
** upvalue slots than its prototype has upvalues: the extra slots keep the upvalues of the
** saved version while the load still refers to them by their saved numbers. Lua reads a Lua
** closure's upvalues through its prototype's indices only (lapi.c, lvm.c); the collector,
** the closure's size and getupvalname (ldebug.c: every slot's UpVal is dereferenced) go over
** all slots, so every slot holds a valid UpVal at all times. */

/* Pushes a new closure of p with n upvalue slots (n at least its upvalue count, at most
** MAXUPVAL), all fresh closed upvalues holding nil. Returns 0 (nothing pushed) for a bad n. */
int luasnap_push_closure_n(lua_State *L, const void *p, int n) {
  const Proto *f = (const Proto *)p;
  LClosure *cl;
  if (n < f->sizeupvalues || n > MAXUPVAL) return 0;
  cl = luaF_newLclosure(L, n);
  setclLvalue2s(L, L->top.p, cl);
  L->top.p++;
  cl->p = (Proto *)f;
  luaC_objbarrier(L, cl, f);
  luaF_initupvals(L, cl);
  return 1;
}

/* The Lua closure at idx with a slot `slot` (0-based), or NULL. */
static LClosure *closure_with_slot(lua_State *L, int idx, int slot) {
  const TValue *o = ls_index2value(L, idx);
  if (!ttisLclosure(o)) return NULL;
  if (slot < 0 || slot >= clLvalue(o)->nupvalues) return NULL;
  return clLvalue(o);
}

/* Sets the upvalue in slot `slot` of the Lua closure at idx (not the top) to the value on
** top, which it pops. Returns 0, popping nothing, if there is no such slot. */
int luasnap_upval_set_slot(lua_State *L, int idx, int slot) {
  LClosure *cl = closure_with_slot(L, idx, slot);
  UpVal *uv;
  if (cl == NULL) return 0;
  uv = cl->upvals[slot];
  setobj(L, uv->v.p, s2v(L->top.p - 1));
  luaC_barrier(L, uv, s2v(L->top.p - 1));
  L->top.p--;
  return 1;
}

/* Slot aslot of the Lua closure at aidx shares the upvalue of slot bslot of the Lua closure at
** bidx (as lua_upvaluejoin, by slot). Returns 0 if either slot does not exist. */
int luasnap_upval_join_slot(lua_State *L, int aidx, int aslot, int bidx, int bslot) {
  LClosure *a = closure_with_slot(L, aidx, aslot);
  LClosure *b = closure_with_slot(L, bidx, bslot);
  if (a == NULL || b == NULL) return 0;
  a->upvals[aslot] = b->upvals[bslot];
  luaC_objbarrier(L, a, b->upvals[bslot]);
  return 1;
}

/* Whether slot `slot` of the Lua closure at idx holds a closed upvalue. */
int luasnap_upval_closed_slot(lua_State *L, int idx, int slot) {
  LClosure *cl = closure_with_slot(L, idx, slot);
  return cl != NULL && !upisopen(cl->upvals[slot]);
}

/* Binds the Lua closure at idx to prototype p, in place: upvalue j of p (j < p's upvalue
** count, at most the closure's slots) takes the upvalue of slot from[j] (-1: a fresh one
** holding nil); slots past p's count keep theirs. Returns 0, changing nothing, if the slots do
** not fit. Fresh upvalues are made before anything changes (a memory error leaves the
** closure as it was). */
int luasnap_closure_rebind(lua_State *L, int idx, const void *p, const int *from) {
  const TValue *o = ls_index2value(L, idx);
  const Proto *f = (const Proto *)p;
  UpVal *was[MAXUPVAL + 1];
  LClosure *cl, *fresh;
  int j, n, nfresh = 0;
  if (!ttisLclosure(o)) return 0;
  cl = clLvalue(o);
  n = f->sizeupvalues;
  if (n > cl->nupvalues) return 0;
  for (j = 0; j < n; j++) {
    if (from[j] >= cl->nupvalues) return 0;
    if (from[j] < 0) nfresh++;
  }
  /* The fresh upvalues, made and held by a closure of their own before anything changes. */
  fresh = luaF_newLclosure(L, nfresh);
  setclLvalue2s(L, L->top.p, fresh);
  L->top.p++;
  luaF_initupvals(L, fresh);
  for (j = 0; j < cl->nupvalues; j++) was[j] = cl->upvals[j];
  for (j = 0, nfresh = 0; j < n; j++)
    cl->upvals[j] = from[j] < 0 ? fresh->upvals[nfresh++] : was[from[j]];
  cl->p = (Proto *)f;
  /* The closure may be black already: it now points to other objects. */
  luaC_objbarrier(L, cl, f);
  for (j = 0; j < n; j++) luaC_objbarrier(L, cl, cl->upvals[j]);
  L->top.p--;
  return 1;
}

/* Releases what the slots of the Lua closure at idx past its prototype's upvalue count hold
** (the saved version's upvalues once a load is over): each shares the closure's first
** upvalue, or one fresh upvalue holding nil when its prototype has none. Returns 0 if idx is
** not a Lua closure. */
int luasnap_closure_trim(lua_State *L, int idx) {
  const TValue *o = ls_index2value(L, idx);
  LClosure *cl;
  UpVal *keep;
  int j, n;
  if (!ttisLclosure(o)) return 0;
  cl = clLvalue(o);
  n = cl->p->sizeupvalues;
  if (n >= cl->nupvalues) return 1;
  if (n > 0) {
    keep = cl->upvals[0];
  } else {
    /* A fresh one, made through a closure of its own before anything changes (cl is on the
    ** stack, alive, and collectable objects do not move). */
    LClosure *fresh = luaF_newLclosure(L, 1);
    setclLvalue2s(L, L->top.p, fresh);
    L->top.p++;
    luaF_initupvals(L, fresh);
    keep = fresh->upvals[0];
  }
  for (j = n; j < cl->nupvalues; j++) cl->upvals[j] = keep;
  luaC_objbarrier(L, cl, keep);
  if (n == 0) L->top.p--;
  return 1;
}

/* Calls f(closure, proto, ud) for every Lua closure alive in the VM (walks the collector's
** object lists, as luasnap_each_proto). The collector must be stopped by the caller. */
void luasnap_each_lclosure(lua_State *L, luasnap_closure_fn f, void *ud) {
  global_State *g = G(L);
  GCObject *lists[4];
  int i;
  lists[0] = g->allgc; lists[1] = g->finobj; lists[2] = g->tobefnz; lists[3] = g->fixedgc;
  for (i = 0; i < 4; i++) {
    GCObject *o;
    for (o = lists[i]; o != NULL; o = o->next)
      if (o->tt == LUA_VLCL && !isdead(g, o) && gco2lcl(o)->p != NULL) f(o, gco2lcl(o)->p, ud);
  }
}

/* Pushes the Lua closure cl (alive: from luasnap_each_lclosure, with no Lua code run since). */
void luasnap_push_lclosure(lua_State *L, const void *cl) {
  setclLvalue2s(L, L->top.p, (LClosure *)cl);
  L->top.p++;
}
